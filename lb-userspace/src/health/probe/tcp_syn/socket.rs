//! Socket plumbing: the raw socket, reserving source ports, and looking up the source address
//! the kernel would use towards a target.

use std::{
    io,
    mem::size_of,
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket},
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, OwnedFd},
    sync::{Mutex, PoisonError},
};

use super::filter::attach_filter;
use socket2::{Domain, Socket, Type};

use crate::health::probe::sys::{self, recv, setsockopt};

/// Receive buffer asked for: room for the replies of a few hundred probes sent at once.
const RCVBUF: libc::c_int = 4 << 20;

/// Looks up source addresses: one UDP socket, connected to each target in turn.
pub(super) struct Routes(Mutex<UdpSocket>);

impl Routes {
    pub(super) fn new() -> io::Result<Self> {
        Ok(Self(Mutex::new(UdpSocket::bind((
            Ipv4Addr::UNSPECIFIED,
            0,
        ))?)))
    }

    /// The address the kernel would send from towards `target`: the local address of a UDP
    /// socket connected to it (connecting sends nothing, it only picks the route and the
    /// source). One socket serves every lookup: it is disconnected first, since a connected
    /// socket keeps the source it got the first time.
    pub(super) fn source_towards(&self, target: SocketAddrV4) -> io::Result<Ipv4Addr> {
        let socket = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        disconnect(socket.as_fd())?;
        socket.connect(target)?;
        match socket.local_addr()? {
            SocketAddr::V4(local) => Ok(*local.ip()),
            SocketAddr::V6(local) => Err(io::Error::other(format!(
                "IPv6 source {local} for an IPv4 target"
            ))),
        }
    }
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

/// Reserves a free TCP port on `ip` (`0.0.0.0` for every address): a TCP socket bound to
/// `(ip, 0)` that never listens nor connects. While it is open no other local socket can use
/// the port; the kernel still resets the backend's SYN+ACK, since a socket that does not listen
/// accepts nothing. `std::net::TcpListener` would listen and `TcpStream` cannot bind without
/// connecting, hence socket2.
pub(super) fn reserve_port(ip: Ipv4Addr) -> io::Result<(OwnedFd, SocketAddrV4)> {
    let socket = Socket::new(Domain::IPV4, Type::STREAM.cloexec(), None)?;
    socket.bind(&SocketAddrV4::new(ip, 0).into())?;
    let port = socket
        .local_addr()?
        .as_socket_ipv4()
        .ok_or_else(|| io::Error::other("an IPv4 socket bound to a non-IPv4 address"))?
        .port();
    Ok((socket.into(), SocketAddrV4::new(ip, port)))
}

/// The raw socket: non-blocking, filtered, with a larger receive buffer.
pub(super) fn open_raw_socket() -> io::Result<OwnedFd> {
    let fd = sys::open_raw(
        Domain::IPV4,
        libc::IPPROTO_TCP,
        "half-open TCP probes need a raw socket",
    )?;
    attach_filter(fd.as_fd())?;
    sys::grow_receive_buffer(fd.as_fd(), RCVBUF)?;
    // DF, as a TCP SYN from Linux: also spares the kernel a hashed IP ID per datagram (with DF
    // an unconnected socket's datagrams get ID 0).
    setsockopt(
        fd.as_fd(),
        libc::IPPROTO_IP,
        libc::IP_MTU_DISCOVER,
        &libc::IP_PMTUDISC_DO,
    )?;
    // Segments that arrived between socket() and the filter were queued unfiltered: drop them.
    let mut buf = [0u8; 1];
    while recv(fd.as_fd(), &mut buf).is_ok() {}
    Ok(fd)
}
