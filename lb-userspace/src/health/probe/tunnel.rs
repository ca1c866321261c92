//! What a probe through the tunnel (`check.through_tunnel`) does differently from others: its
//! socket carries a mark lb's TC egress program encapsulates by, and leaves from the address
//! the service's encapsulated traffic comes from, where lb's XDP program expects the replies
//! (see lb-common's `tunnel` module). The kernel's routing and neighbours stay the backend's
//! own: the TC program only changes the packet on its way out.

use std::{
    io,
    net::{IpAddr, SocketAddr},
};

use socket2::{Domain, Socket, Type};
use tokio::net::{TcpSocket, TcpStream};

/// How a probe's packets leave through the tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Via {
    /// The socket mark of the probe's tunnel slot ([`lb_common::tunnel_mark`]).
    pub mark: u32,
    /// The source address: the service's configured SNAT address, the outer source of its
    /// traffic, which the XDP program knows as lb's. None: the kernel's choice towards the
    /// backend, which is then the outer source too.
    pub source: Option<IpAddr>,
}

/// A TCP connection to `target`, through the tunnel when `via` says so (marked, from its
/// source). Setting a mark needs CAP_NET_ADMIN, which lb has to load its programs.
pub async fn connect(target: SocketAddr, via: Option<Via>) -> io::Result<TcpStream> {
    let Some(via) = via else {
        return TcpStream::connect(target).await;
    };
    let socket = Socket::new(
        Domain::for_address(target),
        Type::STREAM.nonblocking().cloexec(),
        None,
    )?;
    socket.set_mark(via.mark)?;
    if let Some(source) = via.source {
        socket.bind(&SocketAddr::new(source, 0).into())?;
    }
    let stream: std::net::TcpStream = socket.into();
    TcpSocket::from_std_stream(stream).connect(target).await
}
