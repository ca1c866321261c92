//! ICMP echo probes (SPEC §2 `icmp`): an echo request to the target; an echo reply carrying this
//! prober's identifier and the probe's sequence number within the timeout is a success, an ICMP
//! destination unreachable quoting the probe's echo request is a `TcpFailure`, silence is a
//! `Timeout`. An IPv6 target gets the same over ICMPv6 (echo request 128, echo reply 129,
//! destination unreachable 1, RFC 4443); its unreachable codes keep their own meaning
//! ([`Reason::Unreachable6`]).
//!
//! One raw `IPPROTO_ICMP` socket serves every IPv4 probe of the daemon, and one raw
//! `IPPROTO_ICMPV6` socket every IPv6 probe, in the manner of [`super::tcp_syn`]: probes send
//! their echo request on the socket of their family and park a oneshot sender in a map keyed by
//! (target, sequence); a reader task per socket receives the replies and completes the matching
//! probe. A raw ICMP socket receives a copy of every ICMP message that reaches this host; the
//! kernel's `ICMP_FILTER` socket option (a bitmask of types to drop, kept by raw ICMP sockets)
//! lets only echo replies and destination-unreachable messages through, and `ICMP6_FILTER` does
//! the same for ICMPv6 (neighbour discovery, router advertisements and the rest stay out).
//!
//! The two families differ in what the sockets do: on the IPv4 socket the message is read with
//! its IP header and the prober computes the echo request's checksum; an ICMPv6 raw socket
//! delivers the message without its IPv6 header (the sender's address comes with `recvfrom`),
//! and the kernel computes ICMPv6 checksums itself (they cover a pseudo-header with both
//! addresses, which the kernel picks).
//!
//! The identifier is per prober: a process-wide random base xor a counter, so two probers of the
//! same process never share one, and other processes' pings (and forged replies) are unlikely to
//! match. The sequence number is per probe, a wrapping counter skipping values still in use for
//! the same target. Received checksums are not verified: matching needs the source address,
//! identifier and sequence, and a corrupted reply that still matches them is vanishingly rare.
//!
//! A target whose link-layer address cannot be resolved (no host on the link) is reported by the
//! local kernel with a host unreachable (ICMPv6: address unreachable), but only once ARP or
//! neighbour discovery gives up (about 3 s on Linux): with a shorter timeout such a target times
//! out, which is a failure all the same.
//!
//! Sockets are created in the network namespace of the calling thread: [`IcmpProber::new`] must
//! run in the namespace of the targets (the daemon runs in a single namespace). A host without
//! IPv6 (no `AF_INET6` sockets) gets a prober for IPv4 only; its IPv6 probes are local failures
//! ([`Reason::NoProber`]).

use std::{
    collections::{HashMap, hash_map::Entry},
    hash::{BuildHasher as _, RandomState},
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::{AsFd, OwnedFd},
    sync::{
        Arc, Mutex, MutexGuard, OnceLock, PoisonError,
        atomic::{AtomicU16, Ordering},
    },
    time::{Duration, Instant},
};

use socket2::Domain;
use tokio::{io::unix::AsyncFd, sync::oneshot, task::JoinHandle};

use super::ProbeResult;
use super::sys::{fold, ones_sum, read_datagrams, register, send_to, setsockopt};
use crate::health::outcome::{Reason, from_io};

const ECHO_REPLY: u8 = 0;
const DEST_UNREACHABLE: u8 = 3;
const ECHO_REQUEST: u8 = 8;

/// ICMPv6 types (RFC 4443).
const DEST_UNREACHABLE6: u8 = 1;
const ECHO_REQUEST6: u8 = 128;
const ECHO_REPLY6: u8 = 129;

/// The echo request's payload: lets a capture tell the probes apart from other pings.
const PAYLOAD: &[u8; 8] = b"lb-probe";
/// ICMP header (8 bytes) plus the payload.
const ECHO_LEN: usize = 8 + PAYLOAD.len();

/// `ICMP_FILTER` (linux/icmp.h), a `SOL_RAW` option of raw ICMP sockets: ICMP types (below 32)
/// whose bit is set are not delivered to the socket.
const ICMP_FILTER: libc::c_int = 1;

/// `ICMP6_FILTER` (linux/icmpv6.h), an `IPPROTO_ICMPV6` option of raw ICMPv6 sockets: a
/// `struct icmp6_filter` of 256 bits, one per type; a set bit drops the type.
const ICMP6_FILTER: libc::c_int = 1;

/// Receive buffer asked for: room for the replies of a few hundred probes sent at once.
const RCVBUF: libc::c_int = 1 << 20;

/// The raw sockets (one per family) serving every ICMP echo probe of the daemon.
pub struct IcmpProber {
    shared: Arc<Shared>,
    readers: Vec<JoinHandle<()>>,
}

/// What the probes and the reader tasks share.
struct Shared {
    /// The raw ICMP socket (IPv4 targets).
    socket: AsyncFd<OwnedFd>,
    /// The raw ICMPv6 socket (IPv6 targets); None on a host without IPv6.
    socket6: Option<AsyncFd<OwnedFd>>,
    identifier: u16,
    next_sequence: AtomicU16,
    pending: Mutex<HashMap<Key, oneshot::Sender<Answer>>>,
}

/// A probe in flight: its target and its echo's sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    target: IpAddr,
    sequence: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Echo reply: the host is up.
    Alive,
    /// Destination unreachable (its code), quoting our echo request.
    Unreachable(u8),
    /// ICMPv6 destination unreachable (its code), quoting our echo request.
    Unreachable6(u8),
}

#[derive(Debug)]
struct Answer {
    verdict: Verdict,
    /// When the reader received it: the latency does not include the reader's scheduling delay
    /// towards the probe task.
    at: Instant,
}

impl IcmpProber {
    /// Opens the raw sockets (needs CAP_NET_RAW; the error says so) and starts their reader
    /// tasks on the current tokio runtime (which must have IO and time enabled). The ICMPv6
    /// socket is left out, with a warning, where the host has no IPv6.
    pub fn new() -> io::Result<Self> {
        let runtime = tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
        let socket6 = match open_raw_socket6() {
            Ok(fd) => Some(register(fd)?),
            Err(e) if e.raw_os_error() == Some(libc::EAFNOSUPPORT) => {
                tracing::warn!("icmp probes: no IPv6 on this host ({e}); IPv4 targets only");
                None
            }
            Err(e) => return Err(e),
        };
        let shared = Arc::new(Shared {
            socket: register(open_raw_socket()?)?,
            socket6,
            identifier: new_identifier(),
            next_sequence: AtomicU16::new(0),
            pending: Mutex::new(HashMap::new()),
        });
        let mut readers = vec![runtime.spawn(read_replies(Arc::clone(&shared), false))];
        if shared.socket6.is_some() {
            readers.push(runtime.spawn(read_replies(Arc::clone(&shared), true)));
        }
        Ok(Self { shared, readers })
    }

    /// Sends an echo request to `target` (ICMPv6 for an IPv6 one) and waits up to `timeout`: an
    /// echo reply with this prober's identifier and this probe's sequence is a success; a
    /// destination unreachable quoting the request is a `TcpFailure`; nothing is a `Timeout`.
    ///
    /// Local errors (no route to the target, the send refused by a local firewall) are logged and
    /// count as `TcpFailure`: the target cannot be reached either way. An IPv6 target on a host
    /// without IPv6 sockets is a `Local` failure.
    pub async fn probe(&self, target: IpAddr, timeout: Duration) -> ProbeResult {
        if target.is_ipv6() && self.shared.socket6.is_none() {
            return ProbeResult::Local(Reason::NoProber);
        }
        match tokio::time::timeout(timeout, self.exchange(target)).await {
            Ok(Ok(result)) => result,
            Ok(Err(e)) => {
                tracing::warn!(%target, "icmp probe failed locally: {e}");
                from_io(&e)
            }
            Err(_elapsed) => ProbeResult::Timeout,
        }
    }

    /// One echo request and its answer. Cancelled by the timeout in [`IcmpProber::probe`]; the
    /// guard then unregisters the probe.
    async fn exchange(&self, target: IpAddr) -> io::Result<ProbeResult> {
        let (registered, answer) = Registered::new(&self.shared, target)?;
        let (identifier, sequence) = (self.shared.identifier, registered.key.sequence);
        let echo = match target {
            IpAddr::V4(_) => echo_request(identifier, sequence),
            IpAddr::V6(_) => echo_request6(identifier, sequence),
        };
        let sent_at = Instant::now();
        self.send(target, &echo).await?;
        let answer = answer
            .await
            .map_err(|_| io::Error::other("the reply reader has stopped"))?;
        Ok(match answer.verdict {
            Verdict::Alive => ProbeResult::Success {
                latency: answer.at.saturating_duration_since(sent_at),
            },
            Verdict::Unreachable(code) => ProbeResult::TcpFailure(Reason::Unreachable(code)),
            Verdict::Unreachable6(code) => ProbeResult::TcpFailure(Reason::Unreachable6(code)),
        })
    }

    async fn send(&self, target: IpAddr, message: &[u8]) -> io::Result<()> {
        let socket = match target {
            IpAddr::V4(_) => &self.shared.socket,
            IpAddr::V6(_) => self.shared.socket6.as_ref().ok_or_else(|| {
                io::Error::from_raw_os_error(libc::EAFNOSUPPORT) // checked in `probe`
            })?,
        };
        send_to(socket, target, message).await
    }
}

impl Drop for IcmpProber {
    fn drop(&mut self) {
        // The tasks hold the other references to the sockets: they close when the tasks end.
        for reader in &self.readers {
            reader.abort();
        }
    }
}

impl Shared {
    fn pending(&self) -> MutexGuard<'_, HashMap<Key, oneshot::Sender<Answer>>> {
        // The map stays consistent whatever panicked while holding it.
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Completes the probe an IPv4 `packet` answers, if any.
    #[cfg(test)]
    fn dispatch(&self, packet: &[u8], at: Instant) {
        self.complete(Reply::parse(packet), at);
    }

    /// Completes the probe `reply` answers, if any.
    fn complete(&self, reply: Option<Reply>, at: Instant) {
        let Some(Reply {
            target,
            identifier,
            sequence,
            verdict,
        }) = reply
        else {
            return;
        };
        if identifier != self.identifier {
            return;
        }
        let done = self.pending().remove(&Key { target, sequence });
        if let Some(done) = done {
            // The probe may have timed out in the meantime: then nobody is waiting.
            let _ = done.send(Answer { verdict, at });
        }
    }
}

/// Keeps a probe in the pending map while it waits, also when its future is dropped.
struct Registered<'a> {
    shared: &'a Shared,
    key: Key,
}

impl<'a> Registered<'a> {
    /// Registers a probe of `target` under the next sequence number not in use towards it.
    fn new(shared: &'a Shared, target: IpAddr) -> io::Result<(Self, oneshot::Receiver<Answer>)> {
        let (done, answer) = oneshot::channel();
        let mut pending = shared.pending();
        for _ in 0..=u16::MAX {
            let sequence = shared.next_sequence.fetch_add(1, Ordering::Relaxed);
            let key = Key { target, sequence };
            if let Entry::Vacant(entry) = pending.entry(key) {
                entry.insert(done);
                return Ok((Self { shared, key }, answer));
            }
        }
        Err(io::Error::other(format!(
            "every ICMP sequence number towards {target} is in use"
        )))
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.shared.pending().remove(&self.key);
    }
}

/// A reader task (of the ICMPv6 socket if `v6`): wakes when the filtered socket has messages,
/// drains it, completes probes.
async fn read_replies(shared: Arc<Shared>, v6: bool) {
    // An IP header with options (60 bytes), an ICMP header (8) and, for an error, the quoted IP
    // header with options (60) and the quoted echo header (8): all a reply needs; the rest of a
    // longer datagram is discarded by recv. (ICMPv6: 8, then a quoted IPv6 header of 40 and 8.)
    let mut buf = [0u8; 256];
    let (socket, what) = match &shared.socket6 {
        Some(socket6) if v6 => (socket6, "icmpv6 probe"),
        _ => (&shared.socket, "icmp probe"),
    };
    read_datagrams(
        socket,
        &mut buf,
        what,
        || {},
        |message, from, at| {
            let reply = match from {
                Some(IpAddr::V6(source)) if v6 => Reply::parse6(source, message),
                _ if v6 => None,
                _ => Reply::parse(message),
            };
            shared.complete(reply, at);
        },
    )
    .await;
}

/// What a received ICMP message says about which echo request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reply {
    /// The address the echo request went to.
    target: IpAddr,
    identifier: u16,
    sequence: u16,
    verdict: Verdict,
}

impl Reply {
    /// Parses an IPv4 packet as raw sockets deliver it (IP header first): an echo reply, or a
    /// destination unreachable quoting an echo request. None for anything else.
    fn parse(packet: &[u8]) -> Option<Self> {
        let (source, icmp) = ipv4_icmp(packet)?;
        let id_seq = |h: &[u8]| {
            (
                u16::from_be_bytes([h[4], h[5]]),
                u16::from_be_bytes([h[6], h[7]]),
            )
        };
        match *icmp.first()? {
            ECHO_REPLY if icmp.len() >= 8 && icmp[1] == 0 => {
                let (identifier, sequence) = id_seq(icmp);
                Some(Self {
                    target: IpAddr::V4(source),
                    identifier,
                    sequence,
                    verdict: Verdict::Alive,
                })
            }
            DEST_UNREACHABLE => {
                // The quoted datagram starts after the 8-byte ICMP header: its IP header, then
                // at least 8 bytes of its payload (our echo header). Whoever sent the error
                // (the target or a router), the quoted destination is the target.
                let quoted = icmp.get(8..)?;
                let (_, echo) = ipv4_icmp(quoted)?;
                if echo.len() < 8 || echo[0] != ECHO_REQUEST {
                    return None;
                }
                let target = ipv4_at(quoted, 16);
                let (identifier, sequence) = id_seq(echo);
                Some(Self {
                    target: IpAddr::V4(target),
                    identifier,
                    sequence,
                    verdict: Verdict::Unreachable(icmp[1]),
                })
            }
            _ => None,
        }
    }

    /// Parses an ICMPv6 message as raw ICMPv6 sockets deliver it (no IPv6 header; `source` is
    /// the sender's address): an echo reply, or a destination unreachable quoting an echo
    /// request. None for anything else.
    fn parse6(source: Ipv6Addr, icmp: &[u8]) -> Option<Self> {
        let id_seq = |h: &[u8]| {
            (
                u16::from_be_bytes([h[4], h[5]]),
                u16::from_be_bytes([h[6], h[7]]),
            )
        };
        match *icmp.first()? {
            ECHO_REPLY6 if icmp.len() >= 8 && icmp[1] == 0 => {
                let (identifier, sequence) = id_seq(icmp);
                Some(Self {
                    target: IpAddr::V6(source),
                    identifier,
                    sequence,
                    verdict: Verdict::Alive,
                })
            }
            DEST_UNREACHABLE6 => {
                // After the 8-byte ICMPv6 header, as much of the offending packet as fits: its
                // IPv6 header (40 bytes; our echo requests carry no extension header), then our
                // echo header. Whoever sent the error, the quoted destination is the target.
                let quoted = icmp.get(8..)?;
                let header = quoted.get(..40)?;
                if header[0] >> 4 != 6 || header[6] != libc::IPPROTO_ICMPV6 as u8 {
                    return None;
                }
                let echo = quoted.get(40..48)?;
                if echo[0] != ECHO_REQUEST6 {
                    return None;
                }
                let target: [u8; 16] = header[24..40].try_into().ok()?;
                let (identifier, sequence) = id_seq(echo);
                Some(Self {
                    target: IpAddr::V6(Ipv6Addr::from(target)),
                    identifier,
                    sequence,
                    verdict: Verdict::Unreachable6(icmp[1]),
                })
            }
            _ => None,
        }
    }
}

/// The source address and ICMP part (possibly truncated) of an IPv4 packet carrying ICMP.
fn ipv4_icmp(packet: &[u8]) -> Option<(Ipv4Addr, &[u8])> {
    let ihl = usize::from(*packet.first()? & 0x0f) * 4;
    if packet[0] >> 4 != 4 || ihl < 20 || packet.get(9) != Some(&(libc::IPPROTO_ICMP as u8)) {
        return None;
    }
    let icmp = packet.get(ihl..)?;
    Some((ipv4_at(packet, 12), icmp))
}

/// The address at `at` in `packet` (which holds at least 20 bytes of IP header).
fn ipv4_at(packet: &[u8], at: usize) -> Ipv4Addr {
    Ipv4Addr::new(packet[at], packet[at + 1], packet[at + 2], packet[at + 3])
}

/// An echo request with its checksum (the kernel adds the IP header).
fn echo_request(identifier: u16, sequence: u16) -> [u8; ECHO_LEN] {
    let mut m = [0u8; ECHO_LEN];
    m[0] = ECHO_REQUEST;
    // code (1) and checksum (2..4) stay 0 until the checksum is computed
    m[4..6].copy_from_slice(&identifier.to_be_bytes());
    m[6..8].copy_from_slice(&sequence.to_be_bytes());
    m[8..].copy_from_slice(PAYLOAD);
    let checksum = !fold(ones_sum(&m));
    m[2..4].copy_from_slice(&checksum.to_be_bytes());
    m
}

/// An ICMPv6 echo request; its checksum stays zero, for the kernel to fill in (raw ICMPv6
/// sockets always compute it, over the pseudo-header of the addresses they send with).
fn echo_request6(identifier: u16, sequence: u16) -> [u8; ECHO_LEN] {
    let mut m = [0u8; ECHO_LEN];
    m[0] = ECHO_REQUEST6;
    m[4..6].copy_from_slice(&identifier.to_be_bytes());
    m[6..8].copy_from_slice(&sequence.to_be_bytes());
    m[8..].copy_from_slice(PAYLOAD);
    m
}

/// A new prober's identifier: a random base drawn once per process (SipHash under a key std
/// seeds from the OS RNG) xor a counter, so probers of one process all differ.
fn new_identifier() -> u16 {
    static BASE: OnceLock<u16> = OnceLock::new();
    static COUNTER: AtomicU16 = AtomicU16::new(0);
    let base = *BASE.get_or_init(|| RandomState::new().hash_one(std::process::id()) as u16);
    base ^ COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// The raw socket: non-blocking, passing only echo replies and destination unreachables, with a
/// larger receive buffer.
fn open_raw_socket() -> io::Result<OwnedFd> {
    let fd = super::sys::open_raw(
        Domain::IPV4,
        libc::IPPROTO_ICMP,
        "icmp and udp probes need a raw ICMP socket",
    )?;
    let wanted: u32 = (1 << ECHO_REPLY) | (1 << DEST_UNREACHABLE);
    setsockopt(fd.as_fd(), libc::SOL_RAW, ICMP_FILTER, &!wanted)?;
    super::sys::grow_receive_buffer(fd.as_fd(), RCVBUF)?;
    Ok(fd)
}

/// The ICMPv6 filter's bits: every type dropped but echo replies and destination unreachables.
fn icmp6_filter() -> [u32; 8] {
    let mut drop = [u32::MAX; 8];
    for kind in [ECHO_REPLY6, DEST_UNREACHABLE6] {
        drop[usize::from(kind >> 5)] &= !(1 << (kind & 31));
    }
    drop
}

/// The raw ICMPv6 socket: non-blocking, passing only echo replies and destination
/// unreachables, with a larger receive buffer.
fn open_raw_socket6() -> io::Result<OwnedFd> {
    let fd = super::sys::open_raw(
        Domain::IPV6,
        libc::IPPROTO_ICMPV6,
        "icmp and udp probes need a raw ICMPv6 socket",
    )?;
    setsockopt(
        fd.as_fd(),
        libc::IPPROTO_ICMPV6,
        ICMP6_FILTER,
        &icmp6_filter(),
    )?;
    super::sys::grow_receive_buffer(fd.as_fd(), RCVBUF)?;
    // Messages that arrived between socket() and the filter were queued unfiltered: drop them.
    let mut buf = [0u8; 1];
    while super::sys::recv(fd.as_fd(), &mut buf).is_ok() {}
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 0, 9, 1);
    const TARGET: Ipv4Addr = Ipv4Addr::new(10, 0, 9, 2);
    const ROUTER: Ipv4Addr = Ipv4Addr::new(10, 0, 9, 254);

    /// An IPv4 packet from `source` to `destination` with `options` bytes of IP options (a
    /// multiple of 4) carrying `icmp`.
    fn ipv4(source: Ipv4Addr, destination: Ipv4Addr, options: usize, icmp: &[u8]) -> Vec<u8> {
        let ihl = 20 + options;
        let mut p = vec![0u8; ihl];
        p[0] = 0x40 | (ihl / 4) as u8;
        p[2..4].copy_from_slice(&((ihl + icmp.len()) as u16).to_be_bytes());
        p[8] = 64;
        p[9] = 1;
        p[12..16].copy_from_slice(&source.octets());
        p[16..20].copy_from_slice(&destination.octets());
        p.extend_from_slice(icmp);
        p
    }

    fn echo_reply(identifier: u16, sequence: u16) -> Vec<u8> {
        let mut m = echo_request(identifier, sequence).to_vec();
        m[0] = ECHO_REPLY;
        m
    }

    /// A destination unreachable from `from` quoting our echo request to TARGET.
    fn unreachable(from: Ipv4Addr, code: u8, identifier: u16, sequence: u16) -> Vec<u8> {
        let quoted = ipv4(LOCAL, TARGET, 4, &echo_request(identifier, sequence)[..8]);
        let mut icmp = vec![DEST_UNREACHABLE, code, 0, 0, 0, 0, 0, 0];
        icmp.extend_from_slice(&quoted);
        ipv4(from, LOCAL, 0, &icmp)
    }

    #[test]
    fn echo_request_layout_and_checksum() {
        let m = echo_request(0x1234, 0xabcd);
        assert_eq!(m[0], ECHO_REQUEST);
        assert_eq!(m[1], 0);
        assert_eq!(&m[4..8], &[0x12, 0x34, 0xab, 0xcd]);
        assert_eq!(&m[8..], PAYLOAD);
        // A receiver sums the message, checksum included, and must get 0xffff.
        assert_eq!(fold(ones_sum(&m)), 0xffff);
        assert_ne!(m[2..4], echo_request(0x1234, 0xabce)[2..4]);
    }

    #[test]
    fn parses_echo_reply_past_ip_options() {
        for options in [0, 4, 40] {
            let reply = Reply::parse(&ipv4(TARGET, LOCAL, options, &echo_reply(7, 9))).unwrap();
            assert_eq!(
                reply,
                Reply {
                    target: IpAddr::V4(TARGET),
                    identifier: 7,
                    sequence: 9,
                    verdict: Verdict::Alive
                }
            );
        }
    }

    #[test]
    fn parses_unreachable_quoting_an_echo() {
        // From a router, or from the local kernel (ARP failed): the quoted destination counts.
        for (from, code) in [(ROUTER, 1), (LOCAL, 1), (TARGET, 3)] {
            let reply = Reply::parse(&unreachable(from, code, 7, 9)).unwrap();
            assert_eq!(
                reply,
                Reply {
                    target: IpAddr::V4(TARGET),
                    identifier: 7,
                    sequence: 9,
                    verdict: Verdict::Unreachable(code)
                }
            );
        }
    }

    #[test]
    fn ignores_other_messages() {
        // Our own echo request (a ping to a local address loops back to the raw socket).
        assert_eq!(
            Reply::parse(&ipv4(LOCAL, TARGET, 0, &echo_request(7, 9))),
            None
        );
        // An unreachable quoting a UDP datagram, not an echo.
        let mut udp = unreachable(ROUTER, 3, 7, 9);
        udp[20 + 8 + 9] = 17;
        assert_eq!(Reply::parse(&udp), None);
        // Truncated: the quoted echo header is cut.
        let full = unreachable(ROUTER, 1, 7, 9);
        assert_eq!(Reply::parse(&full[..full.len() - 1]), None);
        assert!(Reply::parse(&full).is_some());
        // Not ICMP, not IPv4.
        let mut tcp = ipv4(TARGET, LOCAL, 0, &echo_reply(7, 9));
        tcp[9] = 6;
        assert_eq!(Reply::parse(&tcp), None);
        let mut v6 = ipv4(TARGET, LOCAL, 0, &echo_reply(7, 9));
        v6[0] = 0x65;
        assert_eq!(Reply::parse(&v6), None);
        assert_eq!(Reply::parse(&[]), None);
    }

    const LOCAL6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 9, 0, 0, 0, 0, 1);
    const TARGET6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 9, 0, 0, 0, 0, 2);
    const ROUTER6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 9, 0, 0, 0, 0, 0xfe);

    fn echo_reply6(identifier: u16, sequence: u16) -> Vec<u8> {
        let mut m = echo_request6(identifier, sequence).to_vec();
        m[0] = ECHO_REPLY6;
        m
    }

    /// An ICMPv6 destination unreachable quoting our echo request from LOCAL6 to TARGET6 (the
    /// message as a raw ICMPv6 socket delivers it: no IPv6 header of its own).
    fn unreachable6(code: u8, identifier: u16, sequence: u16) -> Vec<u8> {
        let echo = echo_request6(identifier, sequence);
        let mut quoted = vec![0u8; 40];
        quoted[0] = 0x60;
        quoted[4..6].copy_from_slice(&(echo.len() as u16).to_be_bytes());
        quoted[6] = 58;
        quoted[7] = 64;
        quoted[8..24].copy_from_slice(&LOCAL6.octets());
        quoted[24..40].copy_from_slice(&TARGET6.octets());
        quoted.extend_from_slice(&echo);
        let mut icmp = vec![DEST_UNREACHABLE6, code, 0, 0, 0, 0, 0, 0];
        icmp.extend_from_slice(&quoted);
        icmp
    }

    #[test]
    fn echo_request6_layout() {
        let m = echo_request6(0x1234, 0xabcd);
        assert_eq!(m[0], 128);
        assert_eq!(m[1], 0);
        assert_eq!(&m[2..4], &[0, 0], "the kernel fills the checksum in");
        assert_eq!(&m[4..8], &[0x12, 0x34, 0xab, 0xcd]);
        assert_eq!(&m[8..], PAYLOAD);
    }

    #[test]
    fn parses_icmpv6_echo_reply_and_unreachable() {
        assert_eq!(
            Reply::parse6(TARGET6, &echo_reply6(7, 9)),
            Some(Reply {
                target: IpAddr::V6(TARGET6),
                identifier: 7,
                sequence: 9,
                verdict: Verdict::Alive
            })
        );
        // From a router, from the local kernel (neighbour discovery failed) or from the target
        // (port unreachable): the quoted destination counts.
        for (from, code) in [(ROUTER6, 0), (LOCAL6, 3), (TARGET6, 4)] {
            assert_eq!(
                Reply::parse6(from, &unreachable6(code, 7, 9)),
                Some(Reply {
                    target: IpAddr::V6(TARGET6),
                    identifier: 7,
                    sequence: 9,
                    verdict: Verdict::Unreachable6(code)
                })
            );
        }
    }

    #[test]
    fn ignores_other_icmpv6_messages() {
        // Our own echo request, a neighbour solicitation (135), a truncated quote, a quote of
        // something other than ICMPv6, an unreachable quoting an echo reply.
        assert_eq!(Reply::parse6(LOCAL6, &echo_request6(7, 9)), None);
        let mut ns = echo_reply6(7, 9);
        ns[0] = 135;
        assert_eq!(Reply::parse6(TARGET6, &ns), None);
        let full = unreachable6(4, 7, 9);
        assert_eq!(Reply::parse6(TARGET6, &full[..full.len() - 9]), None);
        let mut udp = full.clone();
        udp[8 + 6] = 17;
        assert_eq!(Reply::parse6(TARGET6, &udp), None);
        let mut reply = full.clone();
        reply[8 + 40] = ECHO_REPLY6;
        assert_eq!(Reply::parse6(TARGET6, &reply), None);
        assert_eq!(Reply::parse6(TARGET6, &[]), None);
        // An IPv4 echo reply's type (0) means nothing in ICMPv6.
        assert_eq!(Reply::parse6(TARGET6, &echo_reply(7, 9)), None);
    }

    #[test]
    fn icmp6_filter_passes_replies_and_unreachables_only() {
        let f = icmp6_filter();
        let passes = |kind: u8| f[usize::from(kind >> 5)] & (1 << (kind & 31)) == 0;
        assert!(passes(129) && passes(1));
        for kind in [0, 2, 3, 4, 128, 130, 133, 134, 135, 136, 137, 143, 255] {
            assert!(!passes(kind), "type {kind}");
        }
    }

    #[tokio::test]
    async fn replies_of_both_families_complete_their_own_probes() {
        let udp = std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        udp.set_nonblocking(true).unwrap();
        let shared = Shared {
            socket: register(OwnedFd::from(udp)).unwrap(),
            socket6: None,
            identifier: 7,
            next_sequence: AtomicU16::new(5),
            pending: Mutex::new(HashMap::new()),
        };
        let (v4, mut v4_answer) = Registered::new(&shared, IpAddr::V4(TARGET)).unwrap();
        let (v6, mut v6_answer) = Registered::new(&shared, IpAddr::V6(TARGET6)).unwrap();
        let now = Instant::now();
        // A reply from another address with the right sequence completes nothing.
        shared.complete(Reply::parse6(ROUTER6, &echo_reply6(7, 6)), now);
        assert!(v6_answer.try_recv().is_err());
        shared.complete(Reply::parse6(LOCAL6, &unreachable6(3, 7, 6)), now);
        assert_eq!(
            v6_answer.try_recv().unwrap().verdict,
            Verdict::Unreachable6(3)
        );
        assert!(v4_answer.try_recv().is_err());
        shared.dispatch(&ipv4(TARGET, LOCAL, 0, &echo_reply(7, 5)), now);
        assert_eq!(v4_answer.try_recv().unwrap().verdict, Verdict::Alive);
        assert!(shared.pending().is_empty());
        drop((v4, v6));
    }

    #[test]
    fn identifiers_differ_between_probers() {
        let (a, b) = (new_identifier(), new_identifier());
        assert_ne!(a, b);
    }

    #[tokio::test]
    async fn dispatch_completes_only_the_matching_probe() {
        // Needs no privilege: the map logic only (a UDP socket stands in for the raw one).
        let udp = std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        udp.set_nonblocking(true).unwrap();
        let shared = Shared {
            socket: register(OwnedFd::from(udp)).unwrap(),
            socket6: None,
            identifier: 7,
            next_sequence: AtomicU16::new(u16::MAX),
            pending: Mutex::new(HashMap::new()),
        };
        let (first, mut first_answer) = Registered::new(&shared, IpAddr::V4(TARGET)).unwrap();
        let (second, mut second_answer) = Registered::new(&shared, IpAddr::V4(TARGET)).unwrap();
        assert_eq!(first.key.sequence, u16::MAX);
        assert_eq!(second.key.sequence, 0, "wraps");
        let now = Instant::now();
        // Another prober's identifier, another target, another sequence: ignored.
        shared.dispatch(&ipv4(TARGET, LOCAL, 0, &echo_reply(8, 0)), now);
        shared.dispatch(&ipv4(ROUTER, LOCAL, 0, &echo_reply(7, 0)), now);
        shared.dispatch(&ipv4(TARGET, LOCAL, 0, &echo_reply(7, 1)), now);
        assert!(first_answer.try_recv().is_err());
        assert!(second_answer.try_recv().is_err());
        shared.dispatch(&unreachable(ROUTER, 1, 7, 0), now);
        assert_eq!(
            second_answer.try_recv().unwrap().verdict,
            Verdict::Unreachable(1)
        );
        shared.dispatch(&ipv4(TARGET, LOCAL, 0, &echo_reply(7, u16::MAX)), now);
        assert_eq!(first_answer.try_recv().unwrap().verdict, Verdict::Alive);
        assert!(shared.pending().is_empty());
        // A probe dropped while waiting leaves nothing behind.
        let (third, _answer) = Registered::new(&shared, IpAddr::V4(TARGET)).unwrap();
        assert_eq!(shared.pending().len(), 1);
        drop(third);
        assert!(shared.pending().is_empty());
        drop((first, second));
    }
}
