//! Socket plumbing: the raw sockets (IPv4 and IPv6), reserving source ports, and looking up the
//! source address the kernel would use towards a target.

use std::{
    io,
    mem::size_of,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket},
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, OwnedFd},
    sync::{Mutex, PoisonError},
};

use super::filter::attach_filter6;
use socket2::{Domain, Socket, Type};

use crate::health::probe::sys::{self, recv, setsockopt};

/// Receive buffer asked for: room for the replies of a few hundred probes sent at once.
const RCVBUF: libc::c_int = 4 << 20;

/// Offset of the checksum in a TCP header: where the kernel puts the checksum it computes for
/// the IPv6 socket (`IPV6_CHECKSUM`).
const TCP_CHECKSUM_OFFSET: libc::c_int = 16;

/// Looks up source addresses: one UDP socket per family, connected to each target in turn.
pub(super) struct Routes {
    v4: Mutex<UdpSocket>,
    /// Opened at the first IPv6 lookup (a host without IPv6 never opens it).
    v6: Mutex<Option<UdpSocket>>,
}

impl Routes {
    pub(super) fn new() -> io::Result<Self> {
        Ok(Self {
            v4: Mutex::new(UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?),
            v6: Mutex::new(None),
        })
    }

    /// The address the kernel would send from towards `target`: the local address of a UDP
    /// socket of its family connected to it (connecting sends nothing, it only picks the route
    /// and the source). One socket per family serves every lookup: it is disconnected first,
    /// since a connected socket keeps the source it got the first time.
    pub(super) fn source_towards(&self, target: SocketAddr) -> io::Result<IpAddr> {
        let local = match target {
            SocketAddr::V4(_) => {
                let socket = self.v4.lock().unwrap_or_else(PoisonError::into_inner);
                connected_source(&socket, target)?
            }
            SocketAddr::V6(_) => {
                let mut socket = self.v6.lock().unwrap_or_else(PoisonError::into_inner);
                if socket.is_none() {
                    *socket = Some(UdpSocket::bind((Ipv6Addr::UNSPECIFIED, 0))?);
                }
                connected_source(socket.as_ref().expect("just opened"), target)?
            }
        };
        if local.is_ipv4() != target.is_ipv4() {
            return Err(io::Error::other(format!(
                "source {local} of another family than the target {target}"
            )));
        }
        Ok(local)
    }
}

/// `socket`'s local address once disconnected and connected to `target`.
fn connected_source(socket: &UdpSocket, target: SocketAddr) -> io::Result<IpAddr> {
    disconnect(socket.as_fd())?;
    socket.connect(target)?;
    Ok(socket.local_addr()?.ip())
}

/// Disconnects a UDP socket (`connect` to `AF_UNSPEC`): it forgets its peer and, unless bound
/// to one, its source address. Neither std nor socket2 offers an `AF_UNSPEC` address, hence
/// libc.
fn disconnect(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: all-zero is a valid sockaddr.
    let mut unspec: libc::sockaddr = unsafe { std::mem::zeroed() };
    unspec.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
    let len = size_of::<libc::sockaddr>() as libc::socklen_t;
    // SAFETY: valid fd, address and length.
    if unsafe { libc::connect(fd.as_raw_fd(), &raw const unspec, len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reserves a free TCP port on `ip` (a local address of either family, for one probe): a TCP
/// socket bound to `(ip, 0)` that never listens nor connects. While it is open no other local
/// socket can use the port on that address; the kernel still resets the backend's SYN+ACK,
/// since a socket that does not listen accepts nothing. `std::net::TcpListener` would listen and
/// `TcpStream` cannot bind without connecting, hence socket2.
pub(super) fn reserve_port(ip: IpAddr) -> io::Result<(OwnedFd, SocketAddr)> {
    let socket = Socket::new(Domain::for_address(SocketAddr::new(ip, 0)), stream(), None)?;
    bound(socket, SocketAddr::new(ip, 0))
}

/// Reserves a free TCP port for the pool, on every local address of both families: a
/// dual-stack TCP socket bound to `[::]:0` (`IPV6_V6ONLY` off), which no IPv4 nor IPv6 socket
/// can share the port with (bound to a wildcard or to one address, `IPV6_V6ONLY` or not), and
/// which ephemeral `connect`s of either family skip. On a host without IPv6 sockets, a socket
/// bound to `0.0.0.0:0`. Returns the port.
pub(super) fn reserve_pooled_port() -> io::Result<(OwnedFd, u16)> {
    let (fd, local) = match Socket::new(Domain::IPV6, stream(), None) {
        Ok(socket) => {
            socket.set_only_v6(false)?;
            bound(socket, SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)))?
        }
        Err(e) if e.raw_os_error() == Some(libc::EAFNOSUPPORT) => {
            reserve_port(IpAddr::V4(Ipv4Addr::UNSPECIFIED))?
        }
        Err(e) => return Err(e),
    };
    Ok((fd, local.port()))
}

fn stream() -> Type {
    Type::STREAM.cloexec()
}

/// `socket` bound to `at` (port 0: the kernel picks one), and the address it got.
fn bound(socket: Socket, at: SocketAddr) -> io::Result<(OwnedFd, SocketAddr)> {
    socket.bind(&at.into())?;
    let port = socket
        .local_addr()?
        .as_socket()
        .ok_or_else(|| io::Error::other("a TCP socket bound to a non-IP address"))?
        .port();
    Ok((socket.into(), SocketAddr::new(at.ip(), port)))
}

/// The IPv4 raw socket: non-blocking, for sending only. `IPPROTO_RAW` sends whole datagrams
/// (IP header included, as `IP_HDRINCL`) through the kernel's IP output path and receives
/// nothing: an `IPPROTO_TCP` raw socket would be handed a clone of every TCP segment the host
/// receives, which the replies' ring ([`super::ring`]) made needless.
pub(super) fn open_raw_socket() -> io::Result<OwnedFd> {
    sys::open_raw(
        Domain::IPV4,
        libc::IPPROTO_RAW,
        "half-open TCP probes need a raw socket",
    )
}

/// The IPv6 raw socket: non-blocking, filtered, with a larger receive buffer; the kernel fills
/// in the TCP checksum of what it sends (`IPV6_CHECKSUM`: the pseudo-header holds both 128-bit
/// addresses, and the kernel knows the source it puts in the header; it then also verifies the
/// checksum of the segments it hands to the socket) and tells the destination address of each
/// segment received (`IPV6_RECVPKTINFO`: the data starts at the TCP header, without the IPv6
/// header that holds it).
pub(super) fn open_raw_socket6() -> io::Result<OwnedFd> {
    let fd = sys::open_raw(
        Domain::IPV6,
        libc::IPPROTO_TCP,
        "half-open TCP probes need a raw socket",
    )?;
    attach_filter6(fd.as_fd())?;
    sys::grow_receive_buffer(fd.as_fd(), RCVBUF)?;
    setsockopt(
        fd.as_fd(),
        libc::IPPROTO_IPV6,
        libc::IPV6_CHECKSUM,
        &TCP_CHECKSUM_OFFSET,
    )?;
    setsockopt(
        fd.as_fd(),
        libc::IPPROTO_IPV6,
        libc::IPV6_RECVPKTINFO,
        &(1 as libc::c_int),
    )?;
    drain(fd.as_fd());
    Ok(fd)
}

/// Segments that arrived between socket() and the filter were queued unfiltered: drop them.
fn drain(fd: BorrowedFd<'_>) {
    let mut buf = [0u8; 1];
    while recv(fd, &mut buf).is_ok() {}
}
