"""A real QUIC client (aioquic, sans-IO) for lb's QUIC tests: downloads N bytes from
quic_server.py on one stream and can migrate on the way, as a client behind a NAT that rebinds,
or one that changes networks, does; lb must keep the connection on its backend.

    quic_client.py --connect ADDR:PORT --bytes N [--bind ADDR] [--rebind-port-at FRACTION]
                   [--new-address ADDR --new-address-at FRACTION] [--change-cid]
                   [--timeout SECONDS] [--stall SECONDS]

The connection runs over UDP sockets of our own (connected to the server), so the client decides
which one sends: when FRACTION of the bytes has arrived, --rebind-port-at moves to a new socket on
the same local address (a new source port), --new-address to one bound to that address; the old
socket is closed (what still comes to it is lost, as after a NAT rebinding), and a PING on the new
one shows the server the new path. With --change-cid the client also switches, at each
migration, to another connection ID the server issued.

Prints one JSON line: {"completed", "bytes", "server", "migrations", "error", "elapsed_ms",
"dcids", "issued_cids", "paths"}: dcids are the destination CIDs of the packets it sent (in the
order first used; the client's own initial random one left out), issued_cids every CID the server
gave it, paths the local ADDR:PORTs it sent from. Exits 0 if exactly N bytes of the pattern came
and the stream ended, 1 otherwise; a transfer without progress for --stall seconds ends early.
Written against aioquic 1.2.0 (pinned by `cargo xtask setup`).
"""

import argparse
import ipaddress
import json
import os
import select
import socket
import ssl
import sys
import time
from typing import List, Optional, Tuple

# quic_server.py is imported from its directory: no __pycache__ left in the source tree.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quic_server import ALPN, pattern, split_addr  # noqa: E402 (the payload both sides know)

from aioquic.quic import events  # noqa: E402
from aioquic.quic.configuration import QuicConfiguration  # noqa: E402
from aioquic.quic.connection import QuicConnection  # noqa: E402


class Failed(Exception):
    """The transfer cannot complete; the message goes into the JSON's error."""


def fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError("a fraction is 0..1")
    return value


def ip(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text.strip("[]")))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def fmt_addr(addr) -> str:
    host, port = addr[0], addr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Client:
    def __init__(self, args, result: dict) -> None:
        self.args = args
        self.result = result
        host, port = args.connect
        self.family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.target = (host, port)
        # Migrations still to do: (payload bytes received that trigger it, local address or None
        # for the same one).
        plan: List[Tuple[int, Optional[str]]] = []
        if args.rebind_port_at is not None:
            plan.append((int(args.rebind_port_at * args.bytes), None))
        if args.new_address is not None:
            plan.append((int(args.new_address_at * args.bytes), args.new_address))
        self.plan = sorted(plan, key=lambda p: p[0])

        configuration = QuicConfiguration(
            is_client=True,
            alpn_protocols=[ALPN],
            verify_mode=ssl.CERT_NONE,
            max_datagram_size=1200,
        )
        self.conn = QuicConnection(configuration=configuration)
        self.odcid = self.conn.original_destination_connection_id
        self.sock = self.open_socket(args.bind)
        self.stream_id: Optional[int] = None
        self.header = bytearray()  # the server's first line, until its newline
        self.received = 0  # payload bytes, checked against the pattern
        self.ended = False
        self.server_cid_len: Optional[int] = None

    def open_socket(self, local: Optional[str]) -> socket.socket:
        sock = socket.socket(self.family, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        except OSError:
            pass  # the kernel's cap applies
        sock.bind((local or ("::" if self.family == socket.AF_INET6 else "0.0.0.0"), 0))
        # Connected: only the server's datagrams come in, from the address we talk to.
        sock.connect(self.target)
        sock.setblocking(False)
        self.result["paths"].append(fmt_addr(sock.getsockname()))
        return sock

    # The wire, seen by the client: which CIDs it uses.

    def note_received(self, data: bytes) -> None:
        if self.server_cid_len is None and len(data) > 6 and data[0] & 0x80:
            dlen = data[5]
            if len(data) > 6 + dlen:
                slen = data[6 + dlen]
                scid = data[7 + dlen : 7 + dlen + slen]
                if len(scid) == slen and scid != self.odcid:
                    self.server_cid_len = slen

    def note_sent(self, data: bytes) -> None:
        if data[0] & 0x80:
            dcid = data[6 : 6 + data[5]]
        elif self.server_cid_len is not None:
            dcid = data[1 : 1 + self.server_cid_len]
        else:
            return
        hexed = dcid.hex()
        if dcid != self.odcid and hexed not in self.result["dcids"]:
            self.result["dcids"].append(hexed)

    def note_issued(self) -> None:
        # aioquic 1.2.0's internals: the CID in use and the spares NEW_CONNECTION_ID brought.
        issued = self.result["issued_cids"]
        for entry in [self.conn._peer_cid, *self.conn._peer_cid_available]:
            if entry.cid != self.odcid and entry.cid.hex() not in issued:
                issued.append(entry.cid.hex())

    def flush(self) -> None:
        for data, _ in self.conn.datagrams_to_send(now=time.monotonic()):
            self.note_sent(data)
            try:
                self.sock.send(data)
            except (BlockingIOError, ConnectionRefusedError):
                pass  # lost, as on a real network; QUIC recovers

    def feed(self, data: bytes, end: bool) -> None:
        if self.result["server"] is None:
            self.header += data
            if b"\n" not in self.header:
                if len(self.header) > 256:
                    raise Failed("no server name line in the first 256 bytes")
                return
            line, data = bytes(self.header).split(b"\n", 1)
            self.result["server"] = line.decode("utf-8", "replace")
        if data:
            if self.received + len(data) > self.args.bytes:
                raise Failed(f"more than {self.args.bytes} bytes")
            if data != pattern(self.received, len(data)):
                raise Failed(f"the payload differs from the pattern at byte {self.received}")
            self.received += len(data)
            self.result["bytes"] = self.received
        if end:
            self.ended = True

    def migrate(self, local: Optional[str]) -> None:
        old = self.sock
        self.sock = self.open_socket(local or old.getsockname()[0])
        old.close()
        if self.args.change_cid:
            if not self.conn._peer_cid_available:
                raise Failed("no spare connection ID from the server to change to")
            self.conn.change_connection_id()
        # Something to send on the new path at once: the server learns of it from this.
        self.conn.send_ping(self.result["migrations"])
        self.result["migrations"] += 1
        print(
            f"migrated to {self.result['paths'][-1]} at {self.received} bytes",
            file=sys.stderr,
        )

    def handle_events(self) -> None:
        while True:
            event = self.conn.next_event()
            if event is None:
                return
            if isinstance(event, events.HandshakeCompleted):
                self.stream_id = self.conn.get_next_available_stream_id()
                request = f"GET {self.args.bytes}\n".encode()
                self.conn.send_stream_data(self.stream_id, request, end_stream=True)
            elif isinstance(event, events.StreamDataReceived):
                if event.stream_id == self.stream_id:
                    self.feed(event.data, event.end_stream)
            elif isinstance(event, events.StreamReset):
                raise Failed(f"the server reset the stream ({event.error_code})")
            elif isinstance(event, events.ConnectionTerminated):
                raise Failed(
                    f"connection closed: error {event.error_code} {event.reason_phrase!r}"
                )

    def run(self, start: float) -> None:
        args = self.args
        deadline = start + args.timeout
        self.conn.connect(self.target, now=time.monotonic())
        self.flush()
        progress, last_progress = -1, start
        while not self.ended:
            now = time.monotonic()
            seen = len(self.header) + self.received
            if seen != progress:
                progress, last_progress = seen, now
            if now >= deadline:
                raise Failed(f"timed out after {args.timeout} s at {self.received} bytes")
            if now - last_progress >= args.stall:
                raise Failed(f"stalled: nothing for {args.stall} s at {self.received} bytes")
            wait = min(deadline, last_progress + args.stall) - now
            timer = self.conn.get_timer()
            if timer is not None:
                wait = min(wait, max(0.0, timer - now))
            readable, _, _ = select.select([self.sock], [], [], wait)
            if readable:
                while True:
                    try:
                        data = self.sock.recv(65536)
                    except BlockingIOError:
                        break
                    except ConnectionRefusedError:
                        continue  # an ICMP error for an earlier send: drop it
                    self.note_received(data)
                    self.conn.receive_datagram(data, self.target, now=time.monotonic())
                    self.handle_events()
                    if self.plan and self.received >= self.plan[0][0]:
                        # Move now, not after draining the socket: on a fast link the rest of
                        # the stream may already be queued here, and the move would come
                        # after its end. What is left in the old socket is lost with it, as
                        # with a real rebinding, and comes again over the new path.
                        break
            timer = self.conn.get_timer()
            if timer is not None and time.monotonic() >= timer:
                self.conn.handle_timer(now=time.monotonic())
            self.handle_events()
            self.note_issued()
            while self.plan and self.received >= self.plan[0][0] and not self.ended:
                _, local = self.plan.pop(0)
                self.migrate(local)
            self.flush()
        if self.received != args.bytes:
            raise Failed(f"the stream ended after {self.received} of {args.bytes} bytes")
        self.result["completed"] = True
        self.conn.close()
        self.flush()
        self.sock.close()


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--connect", type=split_addr, required=True, help="ADDR:PORT")
    p.add_argument("--bytes", type=int, required=True, help="payload bytes to download")
    p.add_argument("--bind", type=ip, help="local address of the first socket")
    p.add_argument("--rebind-port-at", type=fraction, metavar="FRACTION")
    p.add_argument("--new-address", type=ip, metavar="ADDR")
    p.add_argument("--new-address-at", type=fraction, metavar="FRACTION")
    p.add_argument("--change-cid", action="store_true")
    p.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS")
    p.add_argument(
        "--stall", type=float, metavar="SECONDS", help="default: 5, at most half of --timeout"
    )
    args = p.parse_args(argv)
    if (args.new_address is None) != (args.new_address_at is None):
        p.error("--new-address and --new-address-at go together")
    if args.bytes < 0:
        p.error("--bytes must be >= 0")
    if args.stall is None:
        args.stall = min(5.0, args.timeout / 2)

    start = time.monotonic()
    result = {
        "completed": False,
        "bytes": 0,
        "server": None,
        "migrations": 0,
        "error": None,
        "elapsed_ms": 0,
        "dcids": [],
        "issued_cids": [],
        "paths": [],
    }
    try:
        Client(args, result).run(start)
    except Failed as e:
        result["error"] = str(e)
    except Exception as e:  # reported in the JSON line, which the caller reads
        result["error"] = f"{type(e).__name__}: {e}"
    result["elapsed_ms"] = round((time.monotonic() - start) * 1000)
    print(json.dumps(result), flush=True)
    return 0 if result["completed"] else 1


if __name__ == "__main__":
    sys.exit(main())
