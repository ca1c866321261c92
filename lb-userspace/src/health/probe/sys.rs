//! Small system helpers shared by the raw-socket probes (half-open TCP, ICMP).

use std::{
    io,
    net::SocketAddrV4,
    os::fd::{AsRawFd as _, BorrowedFd, OwnedFd},
};

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

/// One datagram into `buf` (truncated to it), without blocking.
pub fn recv(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: valid fd; `buf` is writable for its length.
    let n = unsafe {
        libc::recv(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Hands `fd` to the tokio reactor of the current runtime.
pub fn register(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an OwnedFd is open and keeps its descriptor until the AsyncFd drops it.
    Ok(unsafe { AsyncFd::register(fd) }?)
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

/// Sends one raw datagram to `target` (raw sockets ignore the port; the kernel builds the IP
/// header), waiting for the socket to be writable.
pub async fn send_to(
    socket: &AsyncFd<OwnedFd>,
    target: std::net::Ipv4Addr,
    bytes: &[u8],
) -> io::Result<()> {
    let to = sockaddr_in(SocketAddrV4::new(target, 0));
    socket
        .async_io(tokio::io::Interest::WRITABLE, |fd| {
            // SAFETY: valid fd, buffer and address with their lengths.
            let n = unsafe {
                libc::sendto(
                    fd.as_raw_fd(),
                    bytes.as_ptr().cast(),
                    bytes.len(),
                    0,
                    (&raw const to).cast(),
                    size_of::<libc::sockaddr_in>() as libc::socklen_t,
                )
            };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(())
            }
        })
        .await
}

/// The reader loop of a raw-socket prober: whenever `socket` is readable, drains it, handing
/// each datagram (cut to `buf`) to `each` with its arrival time; `woke` runs once per wake-up.
/// Returns when the socket fails (logged with `what`).
pub async fn read_datagrams(
    socket: &AsyncFd<OwnedFd>,
    buf: &mut [u8],
    what: &str,
    mut woke: impl FnMut(),
    mut each: impl FnMut(&[u8], std::time::Instant),
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
            match ready.try_io(|fd| recv(fd.as_fd(), buf)) {
                Ok(Ok(n)) => each(&buf[..n], std::time::Instant::now()),
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
