"""A real QUIC server (aioquic) for lb's QUIC tests: a backend that embeds its server ID in every
connection ID it issues, as the QUIC-LB draft's plaintext layout has it, so that lb can route
short-header packets (and migrated connections) by it.

    quic_server.py --listen ADDR:PORT --name NAME --server-id N --server-id-bytes B
                   --cid-offset O --config-id C [--cid-length 8]

Connection IDs are `cid-length` bytes: byte 0 = (C << 5) | 5 random bits; bytes [O, O+B) = N
big-endian; every other byte random. aioquic has no hook for this, so `LayoutConnection` (a
subclass of its `QuicConnection`) rewrites the IDs where aioquic makes them: the first one in
`__init__` (before anything used it) and each one `_replenish_connection_ids` adds (before it is
sent in a NEW_CONNECTION_ID frame); the other random values (reset tokens, keys, challenges) stay
aioquic's. aioquic's asyncio server builds its connections by the name `QuicConnection` of its
own module, which is pointed at the subclass (nothing else changes there).

Each bidirectional stream: the client sends "GET <n>\\n"; the server answers "<NAME>\\n", then n
bytes of `pattern` and ends the stream. Prints "ready" once listening; logs the network path
changes aioquic sees (migrations) to stderr; ends on SIGTERM or SIGINT with status 0. The
certificate is self-signed, made at start, held in memory only. Written against aioquic 1.2.0
(`cargo xtask setup` pins it in .tools/venv): the CID hook reaches into its internals.
"""

import argparse
import asyncio
import datetime
import functools
import ipaddress
import logging
import os
import random
import signal
import sys
from dataclasses import dataclass
from typing import Dict, Optional

ALPN = "lbtest"

# The payload: a pseudo-random block of a prime length, repeated. A chunk at the wrong offset
# (lost, doubled or reordered data) does not match.
_BLOCK_LEN = 65521
_BLOCK = random.Random(0x1B7E57).randbytes(_BLOCK_LEN)
_BLOCK2 = _BLOCK + _BLOCK


def pattern(offset: int, length: int) -> bytes:
    """The `length` payload bytes that start at `offset` (the client checks with the same)."""
    out = bytearray()
    while length > 0:
        start = offset % _BLOCK_LEN
        take = min(length, _BLOCK_LEN)
        out += _BLOCK2[start : start + take]
        offset += take
        length -= take
    return bytes(out)


def split_addr(text: str) -> "tuple[str, int]":
    """ADDR:PORT, with an IPv6 ADDR bare or in brackets."""
    host, sep, port = text.rpartition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"{text!r} is not ADDR:PORT")
    host = host.strip("[]")
    try:
        ipaddress.ip_address(host)
        return host, int(port)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e}") from e


@dataclass(frozen=True)
class CidLayout:
    """Where the server ID goes in a connection ID (QUIC-LB plaintext)."""

    server_id: int
    server_id_bytes: int
    offset: int
    config_id: int
    length: int

    def check(self) -> None:
        if not 1 <= self.length <= 20:
            raise ValueError("--cid-length must be 1..20")
        if not 0 <= self.config_id <= 7:
            raise ValueError("--config-id must be 0..7 (three bits)")
        if self.server_id_bytes < 1:
            raise ValueError("--server-id-bytes must be at least 1")
        if self.offset < 1 or self.offset + self.server_id_bytes > self.length:
            raise ValueError("need 1 <= --cid-offset and offset + server-id-bytes <= cid-length")
        if not 0 <= self.server_id < 1 << (8 * self.server_id_bytes):
            raise ValueError("--server-id does not fit in --server-id-bytes")

    def make(self) -> bytes:
        cid = bytearray(os.urandom(self.length))
        cid[0] = (self.config_id << 5) | (cid[0] & 0x1F)
        cid[self.offset : self.offset + self.server_id_bytes] = self.server_id.to_bytes(
            self.server_id_bytes, "big"
        )
        return bytes(cid)


def layout_connection_class(layout: CidLayout):
    """The subclass of aioquic's QuicConnection whose host connection IDs follow `layout`."""
    from aioquic.quic.connection import QuicConnection

    class LayoutConnection(QuicConnection):
        def __init__(self, **kwargs) -> None:
            super().__init__(**kwargs)
            # aioquic's __init__ made host CID 0 at random and copied it into host_cid and the
            # initial_source_connection_id transport parameter; nothing was sent yet.
            first = self._host_cids[0]
            first.cid = layout.make()
            self.host_cid = first.cid
            self._local_initial_source_connection_id = first.cid

        def _replenish_connection_ids(self) -> None:
            known = len(self._host_cids)
            super()._replenish_connection_ids()
            # The new ones are neither sent nor announced (ConnectionIdIssued) yet.
            taken = {c.cid for c in self._host_cids[:known]}
            for entry in self._host_cids[known:]:
                cid = layout.make()
                while cid in taken:
                    cid = layout.make()
                entry.cid = cid
                taken.add(cid)

    return LayoutConnection


def self_signed(host: str):
    """A fresh EC key and a self-signed certificate for `host` (in memory)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "lbtest")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    return cert, key


class PathLog(logging.Filter):
    """Passes aioquic's records about network paths and peer CID switches (migrations)."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return "Network path" in msg or "Peer switching to CID" in msg


def make_protocol_class(name: str):
    from aioquic.asyncio import QuicConnectionProtocol
    from aioquic.quic import events

    header = f"{name}\n".encode()

    class Handler(QuicConnectionProtocol):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            # Per stream: the request so far; None once answered.
            self._requests: Dict[int, Optional[bytearray]] = {}

        def quic_event_received(self, event) -> None:
            if not isinstance(event, events.StreamDataReceived):
                return
            buf = self._requests.get(event.stream_id)
            if buf is None:
                if event.stream_id in self._requests:
                    return
                buf = self._requests[event.stream_id] = bytearray()
            buf += event.data
            if b"\n" not in buf and not event.end_stream:
                return
            line = bytes(buf).split(b"\n", 1)[0].decode("ascii", "replace").strip()
            self._requests[event.stream_id] = None  # answered; the rest is ignored
            parts = line.split()
            if len(parts) == 2 and parts[0] == "GET" and parts[1].isdigit():
                body = header + pattern(0, int(parts[1]))
            else:
                body = b"ERR bad request\n"
            # Sent by the protocol's transmit() after the events (and as flow control allows).
            self._quic.send_stream_data(event.stream_id, body, end_stream=True)

    return Handler


async def serve(args, layout: CidLayout) -> None:
    from aioquic.asyncio import server as aioquic_server
    from aioquic.quic.configuration import QuicConfiguration

    host, port = args.listen
    # The one place aioquic's server makes its connections (see the module's docstring).
    aioquic_server.QuicConnection = layout_connection_class(layout)

    cert, key = self_signed(host)
    configuration = QuicConfiguration(
        is_client=False,
        alpn_protocols=[ALPN],
        connection_id_length=layout.length,
        max_datagram_size=1200,
    )
    configuration.certificate = cert
    configuration.private_key = key

    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(PathLog())
    handler.setFormatter(logging.Formatter(f"{args.name}: %(message)s"))
    quic_log = logging.getLogger("quic")
    quic_log.addHandler(handler)
    quic_log.setLevel(logging.DEBUG)
    quic_log.propagate = False

    server = await aioquic_server.serve(
        host,
        port,
        configuration=configuration,
        create_protocol=make_protocol_class(args.name),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print("ready", flush=True)
    await stop.wait()
    server.close()


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--listen", type=split_addr, required=True, help="ADDR:PORT")
    p.add_argument("--name", required=True, help="first line of every answer")
    p.add_argument("--server-id", type=lambda s: int(s, 0), required=True, help="decimal or 0x...")
    p.add_argument("--server-id-bytes", type=int, required=True)
    p.add_argument("--cid-offset", type=int, required=True)
    p.add_argument("--config-id", type=int, required=True)
    p.add_argument("--cid-length", type=int, default=8)
    args = p.parse_args(argv)
    layout = CidLayout(
        server_id=args.server_id,
        server_id_bytes=args.server_id_bytes,
        offset=args.cid_offset,
        config_id=args.config_id,
        length=args.cid_length,
    )
    try:
        layout.check()
    except ValueError as e:
        p.error(str(e))
    asyncio.run(serve(args, layout))
    return 0


if __name__ == "__main__":
    sys.exit(main())
