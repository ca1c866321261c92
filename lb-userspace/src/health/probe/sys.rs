//! Small system helpers shared by the raw-socket probes (half-open TCP, ICMP), for both IPv4
//! and IPv6 sockets. Socket calls go through socket2; libc stays for what it lacks (options such
//! as SO_RCVBUFFORCE and socket filters, and the batched sendmmsg/recvmmsg with their control
//! messages).

use std::{
    io::{self, Read as _},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6},
    os::fd::{AsRawFd as _, BorrowedFd, OwnedFd},
};

use socket2::{Domain, Protocol, SockAddr, SockRef, Socket, Type};
use tokio::io::unix::AsyncFd;

/// Sum of the big-endian 16-bit words of `data` (an odd last byte padded with zero), unfolded.
pub fn ones_sum(data: &[u8]) -> u32 {
    data.chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])))
        .sum()
}

/// Folds the carries back in: the one's-complement sum (RFC 1071).
pub fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// An IPv4 header (20 bytes, no options) for `payload_len` bytes of `protocol` from `source` to
/// `destination`: DF set and ID 0, as Linux sends an unfragmentable datagram of an unconnected
/// socket (RFC 6864 lets an atomic datagram's ID be anything); checksum filled in.
pub fn ipv4_header(
    source: Ipv4Addr,
    destination: Ipv4Addr,
    protocol: u8,
    payload_len: usize,
    ttl: u8,
) -> [u8; 20] {
    let mut h = [0u8; 20];
    h[0] = 0x45; // version 4, 5 words
    h[2..4].copy_from_slice(&((20 + payload_len) as u16).to_be_bytes());
    h[6] = 0x40; // DF
    h[8] = ttl;
    h[9] = protocol;
    h[12..16].copy_from_slice(&source.octets());
    h[16..20].copy_from_slice(&destination.octets());
    let checksum = !fold(ones_sum(&h));
    h[10..12].copy_from_slice(&checksum.to_be_bytes());
    h
}

/// The namespace's `ip_default_ttl`: the TTL of the IPv4 headers built here. /proc/sys/net is
/// the namespace of the thread that reads it, as the sockets are.
pub fn default_ttl() -> u8 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_default_ttl")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(64)
}

pub fn setsockopt<T>(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> io::Result<()> {
    let len = size_of::<T>() as libc::socklen_t;
    // SAFETY: valid fd; `value` points to `len` readable bytes.
    if unsafe { libc::setsockopt(fd.as_raw_fd(), level, name, (value as *const T).cast(), len) }
        != 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A non-blocking raw socket of `domain` (IPv4 or IPv6) and `protocol`; without CAP_NET_RAW the
/// error says `needs` and what to do instead.
pub fn open_raw(domain: Domain, protocol: libc::c_int, needs: &str) -> io::Result<OwnedFd> {
    let kind = Type::RAW.nonblocking().cloexec();
    Socket::new(domain, kind, Some(Protocol::from(protocol)))
        .map(OwnedFd::from)
        .map_err(|e| needs_net_raw(e, needs))
}

/// `e`, a socket's creation failing; refused for want of a privilege, it says `needs`, that
/// CAP_NET_RAW is what is missing, and what to do instead.
pub fn needs_net_raw(e: io::Error, needs: &str) -> io::Error {
    if !matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES)) {
        return e;
    }
    io::Error::new(
        e.kind(),
        format!(
            "{needs}, which needs CAP_NET_RAW ({e}); \
             run with that capability or use tcp-connect probes"
        ),
    )
}

/// Many probes sent at once get their answers at once: a receive buffer of `bytes`. Forcing
/// past net.core.rmem_max needs CAP_NET_ADMIN (the daemon has it to load XDP); otherwise take
/// what rmem_max allows.
pub fn grow_receive_buffer(fd: BorrowedFd<'_>, bytes: libc::c_int) -> io::Result<()> {
    if setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &bytes).is_err() {
        SockRef::from(&fd).set_recv_buffer_size(bytes as usize)?;
    }
    Ok(())
}

/// One datagram into `buf` (truncated to it), without blocking.
pub fn recv(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // The probes' sockets are non-blocking: a read returns WouldBlock when nothing is queued.
    (&*SockRef::from(&fd)).read(buf)
}

/// One datagram into `buf` (truncated to it) and the address it came from, without blocking. An
/// IPv6 raw socket hands over the payload only, without the IP header: its source is here.
pub fn recv_from(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, Option<IpAddr>)> {
    // SAFETY: all-zero is a valid sockaddr_in6 (the larger of the two families read).
    let mut from: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::sockaddr_in6>() as libc::socklen_t;
    // SAFETY: valid fd, buffer and address storage of the lengths given.
    let n = unsafe {
        libc::recvfrom(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
            (&raw mut from).cast(),
            &raw mut len,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel wrote a sockaddr of the family it names, within `from`.
    let source = unsafe { ip_of(&raw const from) };
    Ok(((n as usize).min(buf.len()), source))
}

/// The address of a sockaddr the kernel filled in (`sockaddr_in` or `sockaddr_in6`).
///
/// # Safety
/// `addr` must point to a sockaddr storage as large as a `sockaddr_in6`, whose family field
/// tells what it holds.
unsafe fn ip_of(addr: *const libc::sockaddr_in6) -> Option<IpAddr> {
    // SAFETY: the caller vouches for the storage; the family says which struct it is.
    unsafe {
        match i32::from((*addr).sin6_family) {
            libc::AF_INET => {
                let v4 = addr.cast::<libc::sockaddr_in>();
                Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                    (*v4).sin_addr.s_addr,
                ))))
            }
            libc::AF_INET6 => Some(IpAddr::V6(Ipv6Addr::from((*addr).sin6_addr.s6_addr))),
            _ => None,
        }
    }
}

/// Hands `fd` to the tokio reactor of the current runtime.
pub fn register(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an OwnedFd is open and keeps its descriptor until the AsyncFd drops it.
    Ok(unsafe { AsyncFd::register(fd) }?)
}

pub fn sockaddr_in6(addr: SocketAddrV6) -> libc::sockaddr_in6 {
    libc::sockaddr_in6 {
        sin6_family: libc::AF_INET6 as libc::sa_family_t,
        sin6_port: addr.port().to_be(),
        sin6_flowinfo: addr.flowinfo().to_be(),
        sin6_addr: libc::in6_addr {
            s6_addr: addr.ip().octets(),
        },
        sin6_scope_id: addr.scope_id(),
    }
}

pub fn sockaddr_in(addr: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: addr.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*addr.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// Sends one raw datagram to `target` on a raw socket of its family (the kernel builds the IP
/// header; the port is 0: an IPv6 raw socket refuses one that is not its protocol), waiting for
/// the socket to be writable.
pub async fn send_to(socket: &AsyncFd<OwnedFd>, target: IpAddr, bytes: &[u8]) -> io::Result<()> {
    let to = SockAddr::from(SocketAddr::new(target, 0));
    socket
        .async_io(tokio::io::Interest::WRITABLE, |fd| {
            SockRef::from(fd).send_to(bytes, &to).map(drop)
        })
        .await
}

/// One datagram for [`send_many`].
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    /// The local address to send from.
    pub source: IpAddr,
    /// Where to: its address (and an IPv6 one's scope); the port is not used.
    pub target: SocketAddr,
    pub bytes: &'a [u8],
    /// The socket mark it leaves with (`SO_MARK` as a control message, which needs
    /// CAP_NET_ADMIN or CAP_NET_RAW); 0: none.
    pub mark: u32,
}

/// Room for a `cmsghdr` with an `in_pktinfo` or `in6_pktinfo`, and one with a mark, aligned
/// like a `cmsghdr`.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct PktinfoControl([u8; 64]);

/// Sends up to [`MAX_BATCH`] raw datagrams in one `sendmmsg`, without blocking, on a raw socket
/// of their family (every datagram's `source` and `target` of the socket's family). Each goes to
/// its `target` from its `source` (an `IP_PKTINFO` or `IPV6_PKTINFO` control message: the kernel
/// routes with that source and refuses one that is not local, so the IP header carries exactly
/// the address a checksum was computed with; the port is 0, the kernel builds the IP header),
/// with its `mark` if it has one (an `SO_MARK` control message).
/// Returns how many were sent, from the first; an error means the first could not be (as with
/// `sendmsg`; a later message's error shows when the next call starts with it).
pub fn send_many(fd: BorrowedFd<'_>, datagrams: &[Outgoing<'_>]) -> io::Result<usize> {
    let n = datagrams.len().min(MAX_BATCH);
    if n == 0 {
        return Ok(0);
    }
    // SAFETY: CMSG_SPACE and CMSG_LEN are arithmetic.
    let cmsg_sizes = |size: usize| unsafe {
        (
            libc::CMSG_SPACE(size as u32) as usize,
            libc::CMSG_LEN(size as u32) as usize,
        )
    };
    let v4_sizes = cmsg_sizes(size_of::<libc::in_pktinfo>());
    let v6_sizes = cmsg_sizes(size_of::<libc::in6_pktinfo>());
    let mark_sizes = cmsg_sizes(size_of::<u32>());
    debug_assert!(v4_sizes.0.max(v6_sizes.0) + mark_sizes.0 <= size_of::<PktinfoControl>());
    let mut to4 = [sockaddr_in(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)); MAX_BATCH];
    let mut to6 = [sockaddr_in6(SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, 0, 0, 0)); MAX_BATCH];
    let mut control = [PktinfoControl([0; 64]); MAX_BATCH];
    // SAFETY: all-zero iovecs and mmsghdrs are valid; the pointers set below outlive the call.
    let mut iov: [libc::iovec; MAX_BATCH] = unsafe { std::mem::zeroed() };
    let mut msgs: [libc::mmsghdr; MAX_BATCH] = unsafe { std::mem::zeroed() };
    for (i, d) in datagrams[..n].iter().enumerate() {
        iov[i] = libc::iovec {
            iov_base: d.bytes.as_ptr().cast_mut().cast(),
            iov_len: d.bytes.len(),
        };
        let hdr = &mut msgs[i].msg_hdr;
        hdr.msg_iov = &raw mut iov[i];
        hdr.msg_iovlen = 1;
        hdr.msg_control = control[i].0.as_mut_ptr().cast();
        let ((space, len), level, kind) = match d.target {
            SocketAddr::V4(target) => {
                to4[i] = sockaddr_in(SocketAddrV4::new(*target.ip(), 0));
                hdr.msg_name = (&raw mut to4[i]).cast();
                hdr.msg_namelen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
                (v4_sizes, libc::IPPROTO_IP, libc::IP_PKTINFO)
            }
            SocketAddr::V6(target) => {
                let plain = SocketAddrV6::new(*target.ip(), 0, 0, target.scope_id());
                to6[i] = sockaddr_in6(plain);
                hdr.msg_name = (&raw mut to6[i]).cast();
                hdr.msg_namelen = size_of::<libc::sockaddr_in6>() as libc::socklen_t;
                (v6_sizes, libc::IPPROTO_IPV6, libc::IPV6_PKTINFO)
            }
        };
        hdr.msg_controllen = space + if d.mark != 0 { mark_sizes.0 } else { 0 };
        // SAFETY: the control buffer holds CMSG_SPACE of the larger pktinfo and of a mark, so
        // both headers and their data fit (the second one `space` bytes after the first, where
        // CMSG_NXTHDR would put it); the data may be unaligned for its type, hence
        // write_unaligned.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(hdr);
            (*cmsg).cmsg_level = level;
            (*cmsg).cmsg_type = kind;
            (*cmsg).cmsg_len = len;
            match d.source {
                IpAddr::V4(source) => {
                    let info = libc::in_pktinfo {
                        ipi_ifindex: 0,
                        ipi_spec_dst: libc::in_addr {
                            s_addr: u32::from(source).to_be(),
                        },
                        ipi_addr: libc::in_addr { s_addr: 0 },
                    };
                    std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast(), info);
                }
                IpAddr::V6(source) => {
                    let info = libc::in6_pktinfo {
                        ipi6_addr: libc::in6_addr {
                            s6_addr: source.octets(),
                        },
                        ipi6_ifindex: 0,
                    };
                    std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast(), info);
                }
            }
            if d.mark != 0 {
                let cmsg = cmsg.cast::<u8>().add(space).cast::<libc::cmsghdr>();
                (*cmsg).cmsg_level = libc::SOL_SOCKET;
                (*cmsg).cmsg_type = libc::SO_MARK;
                (*cmsg).cmsg_len = mark_sizes.1;
                std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast(), d.mark);
            }
        }
    }
    // SAFETY: `n` headers whose buffers, addresses and control data are alive.
    unsafe { send_headers(fd, &mut msgs[..n]) }
}

/// One non-blocking `sendmmsg` of `msgs`; how many were sent.
///
/// # Safety
/// Every header's pointers (name, iovecs and their buffers, control data) must be valid for
/// the call.
pub unsafe fn send_headers(fd: BorrowedFd<'_>, msgs: &mut [libc::mmsghdr]) -> io::Result<usize> {
    // SAFETY: valid fd; the caller vouches for the headers.
    let sent = unsafe {
        libc::sendmmsg(
            fd.as_raw_fd(),
            msgs.as_mut_ptr(),
            msgs.len() as libc::c_uint,
            libc::MSG_DONTWAIT,
        )
    };
    if sent < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(sent as usize)
    }
}

/// Most datagrams [`send_many`] sends and [`recv_many6`] takes in one call.
pub const MAX_BATCH: usize = 64;

/// What [`recv_many6`] tells of each datagram besides its bytes: the address it came from and
/// the one it was sent to (an IPv6 raw socket hands over the payload only, without the IP
/// header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addresses6 {
    pub source: Ipv6Addr,
    /// `::` if the datagram came without an `IPV6_PKTINFO` (the socket must ask for them with
    /// `IPV6_RECVPKTINFO`).
    pub destination: Ipv6Addr,
}

/// Room for the `IPV6_PKTINFO` control message of one received datagram (and a little more, so a
/// second message the socket might add is cut rather than overrun).
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct RecvControl([u8; 64]);

/// Up to `bufs.len()` (at most [`MAX_BATCH`]) datagrams in one `recvmmsg` on an IPv6 raw socket
/// with `IPV6_RECVPKTINFO` set, without blocking: datagram `i` lands in `bufs[i]` (cut to its
/// length), its length in `lens[i]`, its source and destination address in `addrs[i]`. Returns
/// how many arrived; `WouldBlock` when none was queued.
pub fn recv_many6<const L: usize>(
    fd: BorrowedFd<'_>,
    bufs: &mut [[u8; L]],
    lens: &mut [usize],
    addrs: &mut [Addresses6],
) -> io::Result<usize> {
    let n = bufs.len().min(lens.len()).min(addrs.len()).min(MAX_BATCH);
    let mut from = [sockaddr_in6(SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, 0, 0, 0)); MAX_BATCH];
    let mut control = [RecvControl([0; 64]); MAX_BATCH];
    // SAFETY: all-zero iovecs and mmsghdrs are valid; the pointers set below outlive the call.
    let mut iov: [libc::iovec; MAX_BATCH] = unsafe { std::mem::zeroed() };
    let mut msgs: [libc::mmsghdr; MAX_BATCH] = unsafe { std::mem::zeroed() };
    for i in 0..n {
        iov[i] = libc::iovec {
            iov_base: bufs[i].as_mut_ptr().cast(),
            iov_len: L,
        };
        let hdr = &mut msgs[i].msg_hdr;
        hdr.msg_iov = &raw mut iov[i];
        hdr.msg_iovlen = 1;
        hdr.msg_name = (&raw mut from[i]).cast();
        hdr.msg_namelen = size_of::<libc::sockaddr_in6>() as libc::socklen_t;
        hdr.msg_control = control[i].0.as_mut_ptr().cast();
        hdr.msg_controllen = size_of::<RecvControl>();
    }
    // SAFETY: valid fd; `n` headers, each pointing to a writable buffer, address and control
    // storage of its length.
    let got = unsafe {
        libc::recvmmsg(
            fd.as_raw_fd(),
            msgs.as_mut_ptr(),
            n as libc::c_uint,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
        )
    };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    let got = got as usize;
    for i in 0..got {
        lens[i] = (msgs[i].msg_len as usize).min(L);
        let mut destination = Ipv6Addr::UNSPECIFIED;
        let hdr = &msgs[i].msg_hdr;
        // SAFETY: the kernel set msg_controllen to the control data it wrote into the buffer;
        // CMSG_FIRSTHDR and CMSG_NXTHDR stay within it, and an in6_pktinfo is read unaligned
        // from a message whose length says it holds one.
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(hdr);
            while !cmsg.is_null() {
                let info_len = libc::CMSG_LEN(size_of::<libc::in6_pktinfo>() as u32) as usize;
                if (*cmsg).cmsg_level == libc::IPPROTO_IPV6
                    && (*cmsg).cmsg_type == libc::IPV6_PKTINFO
                    && (*cmsg).cmsg_len as usize >= info_len
                {
                    let info: libc::in6_pktinfo =
                        std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast());
                    destination = Ipv6Addr::from(info.ipi6_addr.s6_addr);
                }
                cmsg = libc::CMSG_NXTHDR(hdr, cmsg);
            }
        }
        addrs[i] = Addresses6 {
            source: Ipv6Addr::from(from[i].sin6_addr.s6_addr),
            destination,
        };
    }
    Ok(got)
}

/// The reader loop of a raw-socket prober: whenever `socket` is readable, drains it, handing
/// each datagram (cut to `buf`) to `each` with the address it came from and its arrival time;
/// `woke` runs once per wake-up. Returns when the socket fails (logged with `what`).
pub async fn read_datagrams(
    socket: &AsyncFd<OwnedFd>,
    buf: &mut [u8],
    what: &str,
    mut woke: impl FnMut(),
    mut each: impl FnMut(&[u8], Option<IpAddr>, std::time::Instant),
) {
    use std::os::fd::AsFd as _;
    loop {
        let mut ready = match socket.readable().await {
            Ok(ready) => ready,
            Err(e) => {
                tracing::error!("{what} reader stopped: {e}");
                return;
            }
        };
        woke();
        loop {
            match ready.try_io(|fd| recv_from(fd.as_fd(), buf)) {
                Ok(Ok((n, from))) => each(&buf[..n], from, std::time::Instant::now()),
                // Not expected on an unconnected raw socket without IP_RECVERR (ICMP errors are
                // not reported to it). Readiness stays set, so the next turn reads again.
                Ok(Err(e)) => {
                    tracing::warn!("{what} socket: {e}");
                    break;
                }
                Err(_would_block) => break,
            }
        }
    }
}
