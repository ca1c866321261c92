//! Half-open TCP probes (SPEC §2 `tcp`): send a SYN to `ip:port`; a SYN+ACK within the timeout
//! is a success, a RST is a `TcpFailure`, silence is a `Timeout`. The connection is never
//! completed: the local kernel answers the backend's SYN+ACK with a RST by itself, because no
//! local socket owns the connection, so the backend does not keep a half-open entry.
//!
//! One raw `IPPROTO_TCP` socket serves every probe of the daemon. Probes send their SYN on it and
//! park a oneshot sender in a map keyed by the connection; a single reader task receives the
//! replies and completes the matching probe. A raw TCP socket receives a copy of *every* TCP
//! segment that reaches this host, so a classic BPF filter in the kernel passes only segments
//! with SYN+ACK or RST set: the reader does not wake for the host's ordinary TCP traffic.
//!
//! Source address and port:
//! - the address is the kernel's own choice towards the target (a connected UDP socket's local
//!   address), looked up on every probe so it follows route changes; the checksum covers it, so
//!   it must be the address the kernel will put in the IP header;
//! - the port is reserved for the probe's lifetime by a TCP socket bound to it that never listens
//!   nor connects: no other local socket can take the port meanwhile (an ephemeral `connect`
//!   skips it), and since that socket is not listening the kernel still resets the backend's
//!   SYN+ACK.
//!
//! ICMP errors (e.g. a firewall's port-unreachable) are not matched to probes: an unconnected
//! raw socket only hears of them with IP_RECVERR, through its error queue, which this prober does
//! not read. Such a target times out, which is a failure all the same.
//!
//! Sockets are created in the network namespace of the calling thread: [`SynProber::new`] and
//! [`SynProber::probe`] must run in the same one (the daemon runs in a single namespace).

use std::{
    collections::{HashMap, hash_map::Entry},
    hash::{BuildHasher as _, RandomState},
    io,
    mem::size_of,
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket},
    os::fd::{AsFd, AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::{io::unix::AsyncFd, sync::oneshot, task::JoinHandle};

use super::ProbeResult;
use super::sys::{
    fold, ones_sum, read_datagrams, recv, register, send_to, setsockopt, sockaddr_in,
};

const SYN: u8 = 0x02;
const RST: u8 = 0x04;
const ACK: u8 = 0x10;

/// The SYN's receive window and MSS option: what a Linux client announces on Ethernet.
const WINDOW: u16 = 64240;
const MSS: u16 = 1460;
/// TCP header (20 bytes) plus the MSS option (4 bytes).
const SYN_LEN: usize = 24;

/// Receive buffer asked for: room for the replies of a few hundred probes sent at once.
const RCVBUF: libc::c_int = 4 << 20;

/// One raw socket serving every half-open probe of the daemon.
pub struct SynProber {
    shared: Arc<Shared>,
    reader: JoinHandle<()>,
}

/// What the probes and the reader task share.
struct Shared {
    socket: AsyncFd<OwnedFd>,
    pending: Mutex<HashMap<Key, Pending>>,
    wakeups: AtomicU64,
}

/// A probe's connection, seen from this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    local: SocketAddrV4,
    remote: SocketAddrV4,
}

/// A probe waiting for its answer.
struct Pending {
    /// Sequence number of its SYN: the answer must acknowledge `seq + 1`.
    seq: u32,
    done: oneshot::Sender<Answer>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// SYN+ACK: something listens.
    Accepted,
    /// RST: nothing listens (or a firewall resets).
    Refused,
}

#[derive(Debug)]
struct Answer {
    verdict: Verdict,
    /// When the reader received it: the latency does not include the reader's scheduling delay
    /// towards the probe task.
    at: Instant,
}

impl SynProber {
    /// Opens the raw socket (needs CAP_NET_RAW; the error says so) and starts the reader task
    /// on the current tokio runtime (which must have IO and time enabled).
    pub fn new() -> io::Result<Self> {
        let runtime = tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
        let shared = Arc::new(Shared {
            socket: register(open_raw_socket()?)?,
            pending: Mutex::new(HashMap::new()),
            wakeups: AtomicU64::new(0),
        });
        let reader = runtime.spawn(read_replies(Arc::clone(&shared)));
        Ok(Self { shared, reader })
    }

    /// Sends a SYN to `target` and waits up to `timeout`.
    ///
    /// Local errors (no route to the target, no port left, the send refused by a local firewall)
    /// are logged and count as `TcpFailure`: the target cannot be reached either way.
    pub async fn probe(&self, target: SocketAddrV4, timeout: Duration) -> ProbeResult {
        match tokio::time::timeout(timeout, self.exchange(target)).await {
            Ok(Ok(result)) => result,
            Ok(Err(e)) => {
                tracing::warn!(%target, "half-open probe failed locally: {e}");
                ProbeResult::TcpFailure
            }
            Err(_elapsed) => ProbeResult::Timeout,
        }
    }

    /// Diagnostic: how many times the reader task has woken up to read the socket. With the
    /// kernel filter in place this follows the probe replies, not the host's TCP traffic.
    pub fn wakeups(&self) -> u64 {
        self.shared.wakeups.load(Ordering::Relaxed)
    }

    /// One SYN and its answer. Cancelled by the timeout in [`SynProber::probe`]; the guards
    /// then unregister the probe and release its port.
    async fn exchange(&self, target: SocketAddrV4) -> io::Result<ProbeResult> {
        let source_ip = source_ip_towards(target)?;
        let (_reservation, local) = reserve_port(source_ip)?;
        let seq = initial_sequence();
        let (done, answer) = oneshot::channel();
        let key = Key {
            local,
            remote: target,
        };
        let _registered = Registered::new(&self.shared, key, Pending { seq, done });

        let syn = syn_segment(local, target, seq);
        let sent_at = Instant::now();
        self.send(target, &syn).await?;
        let answer = answer
            .await
            .map_err(|_| io::Error::other("the reply reader has stopped"))?;
        Ok(match answer.verdict {
            Verdict::Accepted => ProbeResult::Success {
                latency: answer.at.saturating_duration_since(sent_at),
            },
            Verdict::Refused => ProbeResult::TcpFailure,
        })
    }

    async fn send(&self, target: SocketAddrV4, segment: &[u8]) -> io::Result<()> {
        send_to(&self.shared.socket, *target.ip(), segment).await
    }
}

impl Drop for SynProber {
    fn drop(&mut self) {
        // The task holds the other reference to the socket: it closes when the task ends.
        self.reader.abort();
    }
}

impl Shared {
    fn pending(&self) -> MutexGuard<'_, HashMap<Key, Pending>> {
        // The map stays consistent whatever panicked while holding it.
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Completes the probe `packet` answers, if any.
    fn dispatch(&self, packet: &[u8], at: Instant) {
        let Some(segment) = Segment::parse(packet) else {
            return;
        };
        let key = Key {
            local: segment.destination,
            remote: segment.source,
        };
        let mut pending = self.pending();
        let Entry::Occupied(entry) = pending.entry(key) else {
            return;
        };
        let Some(verdict) = segment.verdict(entry.get().seq) else {
            return;
        };
        let probe = entry.remove();
        drop(pending);
        // The probe may have timed out in the meantime: then nobody is waiting.
        let _ = probe.done.send(Answer { verdict, at });
    }
}

/// Keeps a probe in the pending map while it waits, also when its future is dropped.
struct Registered<'a> {
    shared: &'a Shared,
    key: Key,
}

impl<'a> Registered<'a> {
    fn new(shared: &'a Shared, key: Key, pending: Pending) -> Self {
        // The reserved port makes the key unique among this prober's probes.
        shared.pending().insert(key, pending);
        Self { shared, key }
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.shared.pending().remove(&self.key);
    }
}

/// The reader task: wakes when the filtered socket has replies, drains it, completes probes.
async fn read_replies(shared: Arc<Shared>) {
    // An IP header with options (60 bytes) and a TCP header (20): all a reply needs; the rest of
    // a longer datagram is discarded by recv.
    let mut buf = [0u8; 128];
    read_datagrams(
        &shared.socket,
        &mut buf,
        "half-open probe",
        || {
            shared.wakeups.fetch_add(1, Ordering::Relaxed);
        },
        |packet, at| shared.dispatch(packet, at),
    )
    .await;
}

/// The TCP fields of a received IPv4 segment that matter for matching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Segment {
    source: SocketAddrV4,
    destination: SocketAddrV4,
    ack: u32,
    flags: u8,
}

impl Segment {
    /// Parses an IPv4 packet as raw sockets deliver it (IP header first); None unless it holds
    /// a whole TCP header.
    fn parse(packet: &[u8]) -> Option<Self> {
        let ihl = usize::from(*packet.first()? & 0x0f) * 4;
        if packet[0] >> 4 != 4 || ihl < 20 || packet.get(9) != Some(&(libc::IPPROTO_TCP as u8)) {
            return None;
        }
        let tcp = packet.get(ihl..ihl + 20)?;
        let ip =
            |at: usize| Ipv4Addr::new(packet[at], packet[at + 1], packet[at + 2], packet[at + 3]);
        let port = |at: usize| u16::from_be_bytes([tcp[at], tcp[at + 1]]);
        Some(Self {
            source: SocketAddrV4::new(ip(12), port(0)),
            destination: SocketAddrV4::new(ip(16), port(2)),
            ack: u32::from_be_bytes([tcp[8], tcp[9], tcp[10], tcp[11]]),
            flags: tcp[13],
        })
    }

    /// What this segment says about a SYN sent with `seq`; None if it is not an answer to it.
    /// Like a connecting socket in SYN-SENT (RFC 793, and Linux), it only takes segments that
    /// acknowledge the SYN: a RST without ACK is ignored, so a blind reset cannot fail a probe.
    fn verdict(&self, seq: u32) -> Option<Verdict> {
        if self.flags & ACK == 0 || self.ack != seq.wrapping_add(1) {
            return None;
        }
        if self.flags & RST != 0 {
            Some(Verdict::Refused)
        } else if self.flags & SYN != 0 {
            Some(Verdict::Accepted)
        } else {
            None
        }
    }
}

/// The SYN from `local` to `remote`, checksum included (the kernel adds only the IP header).
fn syn_segment(local: SocketAddrV4, remote: SocketAddrV4, seq: u32) -> [u8; SYN_LEN] {
    let mut s = [0u8; SYN_LEN];
    s[0..2].copy_from_slice(&local.port().to_be_bytes());
    s[2..4].copy_from_slice(&remote.port().to_be_bytes());
    s[4..8].copy_from_slice(&seq.to_be_bytes());
    // ack (8..12) stays 0
    s[12] = ((SYN_LEN / 4) as u8) << 4; // data offset in 32-bit words
    s[13] = SYN;
    s[14..16].copy_from_slice(&WINDOW.to_be_bytes());
    // checksum (16..18) computed below, urgent pointer (18..20) stays 0
    s[20] = 2; // option kind: MSS
    s[21] = 4; // option length
    s[22..24].copy_from_slice(&MSS.to_be_bytes());
    let checksum = tcp_checksum(*local.ip(), *remote.ip(), &s);
    s[16..18].copy_from_slice(&checksum.to_be_bytes());
    s
}

/// The TCP checksum of `segment` (its checksum field zero) with the IPv4 pseudo-header.
fn tcp_checksum(source: Ipv4Addr, destination: Ipv4Addr, segment: &[u8]) -> u16 {
    let mut pseudo = [0u8; 12];
    pseudo[0..4].copy_from_slice(&source.octets());
    pseudo[4..8].copy_from_slice(&destination.octets());
    pseudo[9] = libc::IPPROTO_TCP as u8;
    pseudo[10..12].copy_from_slice(&(segment.len() as u16).to_be_bytes());
    !fold(ones_sum(&pseudo) + ones_sum(segment))
}

/// A fresh initial sequence number: SipHash under a key std seeds from the OS RNG, over a
/// counter. Unpredictable enough that an off-path host cannot forge an answer, without pulling
/// in a random-number crate.
fn initial_sequence() -> u32 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    RandomState::new().hash_one(COUNTER.fetch_add(1, Ordering::Relaxed)) as u32
}

/// The address the kernel would send from towards `target` (connecting a UDP socket sends
/// nothing, it only picks the route and the source).
fn source_ip_towards(target: SocketAddrV4) -> io::Result<Ipv4Addr> {
    let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
    socket.connect(target)?;
    match socket.local_addr()? {
        SocketAddr::V4(local) => Ok(*local.ip()),
        SocketAddr::V6(local) => Err(io::Error::other(format!(
            "IPv6 source {local} for an IPv4 target"
        ))),
    }
}

/// Reserves a free TCP port on `ip` for one probe: a TCP socket bound to `(ip, 0)` that never
/// listens nor connects. While it is open no other local socket can use the port; the kernel
/// still resets the backend's SYN+ACK, since a socket that does not listen accepts nothing.
/// `std::net::TcpListener` would listen and `TcpStream` cannot bind without connecting, hence
/// libc.
fn reserve_port(ip: Ipv4Addr) -> io::Result<(OwnedFd, SocketAddrV4)> {
    // SAFETY: plain socket(2) call.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let addr = sockaddr_in(SocketAddrV4::new(ip, 0));
    let len = size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: valid fd, address and length.
    if unsafe { libc::bind(fd.as_raw_fd(), (&raw const addr).cast(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: all-zero is a valid sockaddr_in.
    let mut bound: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: valid fd; the buffer and its length match.
    if unsafe { libc::getsockname(fd.as_raw_fd(), (&raw mut bound).cast(), &mut len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((fd, SocketAddrV4::new(ip, u16::from_be(bound.sin_port))))
}

/// The raw socket: non-blocking, filtered, with a larger receive buffer.
fn open_raw_socket() -> io::Result<OwnedFd> {
    let flags = libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
    // SAFETY: plain socket(2) call.
    let fd = unsafe { libc::socket(libc::AF_INET, flags, libc::IPPROTO_TCP) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES)) {
            return Err(io::Error::new(
                e.kind(),
                format!(
                    "half-open TCP probes need a raw socket, which needs CAP_NET_RAW ({e}); \
                     run with that capability or use tcp-connect probes"
                ),
            ));
        }
        return Err(e);
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    attach_filter(fd.as_fd())?;
    // Many probes sent at once get their answers at once. Forcing past net.core.rmem_max needs
    // CAP_NET_ADMIN (the daemon has it to load XDP); otherwise take what rmem_max allows.
    if setsockopt(fd.as_fd(), libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &RCVBUF).is_err() {
        setsockopt(fd.as_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, &RCVBUF)?;
    }
    // Segments that arrived between socket() and the filter were queued unfiltered: drop them.
    let mut buf = [0u8; 1];
    while recv(fd.as_fd(), &mut buf).is_ok() {}
    Ok(fd)
}

/// The classic BPF program on the raw socket: it passes IPv4 TCP segments with RST set, or with
/// both SYN and ACK set, and drops everything else in the kernel. A raw socket hands the filter
/// the packet from its IP header; the TCP header starts `4 × IHL` bytes in. A load past the end
/// of a short packet ends the program with "drop".
///
/// ```text
///  0  ldb  [0]                 A = version/IHL byte
///  1  rsh  #4                  A = version
///  2  jeq  #4, 0, 8            not IPv4 -> 11
///  3  ldb  [9]                 A = protocol
///  4  jeq  #6, 0, 6            not TCP -> 11
///  5  ldxb 4*([0]&0xf)         X = IP header length
///  6  ldb  [x+13]              A = TCP flags
///  7  jset #0x04, 2, 0         RST -> 10
///  8  and  #0x12               A = SYN and ACK bits
///  9  jeq  #0x12, 0, 1         both -> 10, else -> 11
/// 10  ret  #0xffffffff         accept, whole packet
/// 11  ret  #0                  drop
/// ```
/// (The socket is AF_INET / IPPROTO_TCP, so the first checks always hold today; they keep the
/// program correct on its own and cost two instructions.)
fn reply_filter() -> [libc::sock_filter; 12] {
    use libc::{
        BPF_ABS, BPF_ALU, BPF_AND, BPF_B, BPF_IND, BPF_JEQ, BPF_JMP, BPF_JSET, BPF_K, BPF_LD,
        BPF_LDX, BPF_MSH, BPF_RET, BPF_RSH,
    };
    let op = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |code: u32, k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let tcp = libc::IPPROTO_TCP as u32;
    let syn_ack = u32::from(SYN | ACK);
    [
        op(BPF_LD | BPF_B | BPF_ABS, 0),
        op(BPF_ALU | BPF_RSH | BPF_K, 4),
        jump(BPF_JMP | BPF_JEQ | BPF_K, 4, 0, 8),
        op(BPF_LD | BPF_B | BPF_ABS, 9),
        jump(BPF_JMP | BPF_JEQ | BPF_K, tcp, 0, 6),
        op(BPF_LDX | BPF_B | BPF_MSH, 0),
        op(BPF_LD | BPF_B | BPF_IND, 13),
        jump(BPF_JMP | BPF_JSET | BPF_K, u32::from(RST), 2, 0),
        op(BPF_ALU | BPF_AND | BPF_K, syn_ack),
        jump(BPF_JMP | BPF_JEQ | BPF_K, syn_ack, 0, 1),
        op(BPF_RET | BPF_K, u32::MAX),
        op(BPF_RET | BPF_K, 0),
    ]
}

/// Attaches [`reply_filter`] to `fd` (SO_ATTACH_FILTER; the kernel copies the program).
fn attach_filter(fd: BorrowedFd<'_>) -> io::Result<()> {
    let mut program = reply_filter();
    let fprog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_mut_ptr(),
    };
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &fprog)
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixDatagram;

    use super::*;

    const LOCAL: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 0, 9, 1), 40000);
    const REMOTE: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 0, 9, 2), 80);

    /// An IPv4 packet from REMOTE to LOCAL holding a 20-byte TCP header, with `options` bytes of
    /// IP options (a multiple of 4).
    fn reply(flags: u8, ack: u32, options: usize) -> Vec<u8> {
        let ihl = 20 + options;
        let mut p = vec![0u8; ihl + 20];
        p[0] = 0x40 | (ihl / 4) as u8;
        p[2..4].copy_from_slice(&((ihl + 20) as u16).to_be_bytes());
        p[8] = 64;
        p[9] = 6;
        p[12..16].copy_from_slice(&REMOTE.ip().octets());
        p[16..20].copy_from_slice(&LOCAL.ip().octets());
        let t = &mut p[ihl..];
        t[0..2].copy_from_slice(&REMOTE.port().to_be_bytes());
        t[2..4].copy_from_slice(&LOCAL.port().to_be_bytes());
        t[8..12].copy_from_slice(&ack.to_be_bytes());
        t[12] = 5 << 4;
        t[13] = flags;
        p
    }

    #[test]
    fn checksum_matches_rfc1071_example() {
        // RFC 1071 §3: the words 0001 f203 f4f5 f6f7 sum to ddf2.
        assert_eq!(
            fold(ones_sum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7])),
            0xddf2
        );
        // An odd trailing byte is padded with a zero byte.
        assert_eq!(ones_sum(&[0x12, 0x34, 0x56]), 0x1234 + 0x5600);
    }

    #[test]
    fn syn_segment_layout_and_checksum() {
        let s = syn_segment(LOCAL, REMOTE, 0xdead_beef);
        assert_eq!(u16::from_be_bytes([s[0], s[1]]), 40000);
        assert_eq!(u16::from_be_bytes([s[2], s[3]]), 80);
        assert_eq!(u32::from_be_bytes([s[4], s[5], s[6], s[7]]), 0xdead_beef);
        assert_eq!(&s[8..12], &[0; 4]);
        assert_eq!(s[12] >> 4, 6, "data offset: 24 bytes");
        assert_eq!(s[13], SYN);
        assert_eq!(u16::from_be_bytes([s[14], s[15]]), 64240);
        assert_eq!(&s[20..24], &[2, 4, 0x05, 0xb4], "MSS 1460");
        // A receiver sums pseudo-header and segment, checksum included, and must get 0xffff.
        let mut pseudo = [0u8; 12];
        pseudo[0..4].copy_from_slice(&LOCAL.ip().octets());
        pseudo[4..8].copy_from_slice(&REMOTE.ip().octets());
        pseudo[9] = 6;
        pseudo[11] = SYN_LEN as u8;
        assert_eq!(fold(ones_sum(&pseudo) + ones_sum(&s)), 0xffff);
        // The pseudo-header counts: another source address gives another checksum.
        let other = syn_segment(
            SocketAddrV4::new(Ipv4Addr::new(10, 0, 9, 3), 40000),
            REMOTE,
            0xdead_beef,
        );
        assert_ne!(s[16..18], other[16..18]);
    }

    #[test]
    fn parse_reads_addresses_ports_and_flags_past_ip_options() {
        for options in [0, 4, 40] {
            let seg = Segment::parse(&reply(SYN | ACK, 7, options)).unwrap();
            assert_eq!(
                seg,
                Segment {
                    source: REMOTE,
                    destination: LOCAL,
                    ack: 7,
                    flags: SYN | ACK
                }
            );
        }
        let full = reply(SYN | ACK, 7, 0);
        assert_eq!(Segment::parse(&full[..39]), None, "truncated TCP header");
        let mut udp = full.clone();
        udp[9] = 17;
        assert_eq!(Segment::parse(&udp), None);
        assert_eq!(Segment::parse(&[]), None);
    }

    #[test]
    fn verdict_needs_the_ack_of_our_syn() {
        let seg = |flags, ack| Segment::parse(&reply(flags, ack, 0)).unwrap();
        let seq = u32::MAX; // the ack wraps to 0
        assert_eq!(seg(SYN | ACK, 0).verdict(seq), Some(Verdict::Accepted));
        assert_eq!(seg(RST | ACK, 0).verdict(seq), Some(Verdict::Refused));
        assert_eq!(seg(SYN | ACK, 1).verdict(seq), None, "wrong ack");
        assert_eq!(seg(RST | ACK, 5).verdict(seq), None, "wrong ack");
        assert_eq!(seg(RST, 0).verdict(seq), None, "RST without ACK");
        assert_eq!(seg(ACK, 0).verdict(seq), None, "plain ACK");
        assert_eq!(seg(SYN, 0).verdict(seq), None, "SYN without ACK");
    }

    #[test]
    fn dispatch_completes_only_the_matching_probe() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _rt = rt.enter();
        let (a, b) = UnixDatagram::pair().unwrap();
        drop(b);
        let shared = Shared {
            socket: register(OwnedFd::from(a)).unwrap(),
            pending: Mutex::new(HashMap::new()),
            wakeups: AtomicU64::new(0),
        };
        let key = Key {
            local: LOCAL,
            remote: REMOTE,
        };
        let (done, mut answer) = oneshot::channel();
        let registered = Registered::new(&shared, key, Pending { seq: 99, done });
        let now = Instant::now();
        shared.dispatch(&reply(SYN | ACK, 99, 0), now); // wrong ack
        let mut other_port = reply(SYN | ACK, 100, 0);
        other_port[22..24].copy_from_slice(&40001u16.to_be_bytes());
        shared.dispatch(&other_port, now);
        assert!(answer.try_recv().is_err(), "nothing matched yet");
        shared.dispatch(&reply(RST | ACK, 100, 0), now);
        assert_eq!(answer.try_recv().unwrap().verdict, Verdict::Refused);
        assert!(shared.pending().is_empty(), "answered probes leave the map");
        drop(registered);
        let (done, _answer) = oneshot::channel();
        drop(Registered::new(&shared, key, Pending { seq: 1, done }));
        assert!(
            shared.pending().is_empty(),
            "a dropped probe leaves the map"
        );
    }

    /// Runs the filter in the kernel: an AF_UNIX datagram socket applies its socket filter to
    /// each datagram it receives, and the datagram's bytes start where a raw socket's packet does.
    /// No privileges needed.
    #[test]
    fn filter_passes_only_syn_ack_and_rst() {
        let (tx, rx) = UnixDatagram::pair().unwrap();
        rx.set_nonblocking(true).unwrap();
        attach_filter(rx.as_fd()).unwrap();
        let passes = |packet: &[u8]| {
            tx.send(packet).unwrap();
            let mut buf = [0u8; 128];
            match rx.recv(&mut buf) {
                Ok(n) => {
                    assert_eq!(n, packet.len(), "accepted whole");
                    true
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => false,
                Err(e) => panic!("{e}"),
            }
        };
        const FIN: u8 = 0x01;
        const PSH: u8 = 0x08;
        for options in [0, 4, 40] {
            assert!(
                passes(&reply(SYN | ACK, 1, options)),
                "SYN+ACK, {options} option bytes"
            );
            assert!(passes(&reply(RST | ACK, 1, options)), "RST+ACK");
            assert!(passes(&reply(RST, 1, options)), "RST");
            assert!(!passes(&reply(SYN, 1, options)), "SYN");
            assert!(!passes(&reply(ACK, 1, options)), "ACK");
            assert!(!passes(&reply(PSH | ACK, 1, options)), "PSH+ACK");
            assert!(!passes(&reply(FIN | ACK, 1, options)), "FIN+ACK");
        }
        // The flags are read behind the IP options, not at a fixed offset: with 4 option bytes,
        // offset 33 (where flags sit without options) holds SYN+ACK but the real flags are ACK.
        let mut shifted = reply(ACK, 1, 4);
        shifted[33] = SYN | ACK;
        assert!(!passes(&shifted));
        let mut udp = reply(SYN | ACK, 1, 0);
        udp[9] = 17;
        assert!(!passes(&udp), "not TCP");
        let mut v6 = reply(SYN | ACK, 1, 0);
        v6[0] = 0x65;
        assert!(!passes(&v6), "not IPv4");
        let full = reply(SYN | ACK, 1, 0);
        assert!(!passes(&full[..33]), "too short to hold the flags");
        assert!(passes(&full[..34]), "just long enough");
    }
}
