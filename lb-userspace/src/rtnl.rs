//! A minimal rtnetlink client: one request and its one answer (the XDP mode of an interface,
//! the route and neighbour towards a probe target), the change notifications the half-open
//! prober watches, and the routes of one table that route health injection adds, removes and
//! lists. Messages are built and parsed by hand: the few fields used do not justify a netlink
//! crate.

use std::{
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

pub const NLMSG_HDRLEN: usize = 16;
const NLA_TYPE_MASK: u16 = 0x3fff;

/// A netlink message: its type and its body (after the header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message<'a> {
    pub kind: u16,
    pub body: &'a [u8],
}

/// A route netlink socket of this thread's network namespace, subscribed to the legacy
/// multicast `groups` (`RTMGRP_*`; 0 for requests only). Non-blocking if `nonblocking`.
pub fn open(groups: u32, nonblocking: bool) -> io::Result<OwnedFd> {
    let mut flags = libc::SOCK_RAW | libc::SOCK_CLOEXEC;
    if nonblocking {
        flags |= libc::SOCK_NONBLOCK;
    }
    // SAFETY: plain socket(2).
    let raw = unsafe { libc::socket(libc::AF_NETLINK, flags, libc::NETLINK_ROUTE) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    if groups != 0 {
        // SAFETY: all-zero is a valid sockaddr_nl.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        addr.nl_groups = groups;
        let len = size_of::<libc::sockaddr_nl>() as libc::socklen_t;
        // SAFETY: valid fd, address and length.
        if unsafe { libc::bind(fd.as_raw_fd(), (&raw const addr).cast(), len) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(fd)
}

/// Builds a request: header, `fixed` (the family-specific struct), then `attrs`.
pub fn build(kind: u16, fixed: &[u8], attrs: &[(u16, &[u8])], seq: u32) -> Vec<u8> {
    build_with_flags(kind, 0, fixed, attrs, seq)
}

/// [`build`] with netlink `flags` besides NLM_F_REQUEST (NLM_F_ACK, NLM_F_DUMP, ...).
pub fn build_with_flags(
    kind: u16,
    flags: u16,
    fixed: &[u8],
    attrs: &[(u16, &[u8])],
    seq: u32,
) -> Vec<u8> {
    let mut msg = vec![0u8; NLMSG_HDRLEN];
    msg.extend_from_slice(fixed);
    for (ty, value) in attrs {
        let len = 4 + value.len();
        msg.extend_from_slice(&(len as u16).to_ne_bytes());
        msg.extend_from_slice(&ty.to_ne_bytes());
        msg.extend_from_slice(value);
        msg.resize(msg.len().next_multiple_of(4), 0);
    }
    let total = msg.len() as u32;
    msg[0..4].copy_from_slice(&total.to_ne_bytes());
    msg[4..6].copy_from_slice(&kind.to_ne_bytes());
    msg[6..8].copy_from_slice(&(libc::NLM_F_REQUEST as u16 | flags).to_ne_bytes());
    msg[8..12].copy_from_slice(&seq.to_ne_bytes());
    msg
}

/// Sends a request built from `kind`, `fixed` and `attrs` on `fd` (blocking) and returns the
/// body of its answer, which must be of type `answer`; an `NLMSG_ERROR` answer is its error.
pub fn request(
    fd: BorrowedFd<'_>,
    kind: u16,
    fixed: &[u8],
    attrs: &[(u16, &[u8])],
    answer: u16,
) -> io::Result<Vec<u8>> {
    let seq = send(fd, kind, 0, fixed, attrs)?;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = receive(fd, &mut buf)?;
        for (msg_seq, msg) in messages(&buf[..n]) {
            // A stale answer (of a request whose caller gave up) is skipped.
            if msg_seq != seq {
                continue;
            }
            if msg.kind == libc::NLMSG_ERROR as u16 {
                let code = error_code(msg.body)?;
                return Err(io::Error::from_raw_os_error(-code));
            }
            if msg.kind != answer {
                return Err(malformed());
            }
            return Ok(msg.body.to_vec());
        }
    }
}

/// Sends a request with `flags` and returns its sequence number.
fn send(
    fd: BorrowedFd<'_>,
    kind: u16,
    flags: u16,
    fixed: &[u8],
    attrs: &[(u16, &[u8])],
) -> io::Result<u32> {
    static SEQ: AtomicU32 = AtomicU32::new(1);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let req = build_with_flags(kind, flags, fixed, attrs, seq);
    // SAFETY: valid buffer; an unbound netlink socket sends to the kernel.
    if unsafe { libc::send(fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(seq)
}

/// Receives one datagram into `buf` (blocking); its length.
fn receive(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: valid buffer of that length.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// The error code of an `NLMSG_ERROR` (or `NLMSG_DONE`) body: 0 is an acknowledgement.
fn error_code(body: &[u8]) -> io::Result<i32> {
    body.get(0..4)
        .map(|s| i32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or_else(malformed)
}

/// Sends a request that changes something (`flags` besides NLM_F_REQUEST and NLM_F_ACK, e.g.
/// NLM_F_CREATE) and waits for the kernel's acknowledgement: Ok, or the error it answered.
pub fn change(
    fd: BorrowedFd<'_>,
    kind: u16,
    flags: u16,
    fixed: &[u8],
    attrs: &[(u16, &[u8])],
) -> io::Result<()> {
    let seq = send(fd, kind, flags | libc::NLM_F_ACK as u16, fixed, attrs)?;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = receive(fd, &mut buf)?;
        for (msg_seq, msg) in messages(&buf[..n]) {
            if msg_seq == seq && msg.kind == libc::NLMSG_ERROR as u16 {
                return match error_code(msg.body)? {
                    0 => Ok(()),
                    code => Err(io::Error::from_raw_os_error(-code)),
                };
            }
        }
    }
}

/// Sends a dump request and returns the bodies of its answers of type `answer`, up to the
/// kernel's NLMSG_DONE.
pub fn dump(
    fd: BorrowedFd<'_>,
    kind: u16,
    fixed: &[u8],
    attrs: &[(u16, &[u8])],
    answer: u16,
) -> io::Result<Vec<Vec<u8>>> {
    let seq = send(fd, kind, libc::NLM_F_DUMP as u16, fixed, attrs)?;
    // The kernel fills dump datagrams up to 32 KiB.
    let mut buf = vec![0u8; 64 * 1024];
    let mut out = Vec::new();
    loop {
        let n = receive(fd, &mut buf)?;
        for (msg_seq, msg) in messages(&buf[..n]) {
            if msg_seq != seq {
                continue;
            }
            match msg.kind {
                k if k == libc::NLMSG_DONE as u16 => {
                    // With extended acks the kernel puts an error code in NLMSG_DONE.
                    return match msg.body.get(0..4).map(error_code).transpose()? {
                        Some(code) if code < 0 => Err(io::Error::from_raw_os_error(-code)),
                        _ => Ok(out),
                    };
                }
                k if k == libc::NLMSG_ERROR as u16 => {
                    return match error_code(msg.body)? {
                        0 => Ok(out),
                        code => Err(io::Error::from_raw_os_error(-code)),
                    };
                }
                k if k == answer => out.push(msg.body.to_vec()),
                _ => {}
            }
        }
    }
}

/// Bounds every blocking receive on `fd`: a kernel that never answered would otherwise hold
/// the caller (the health writer) for good.
pub fn set_receive_timeout(fd: BorrowedFd<'_>, timeout: Duration) -> io::Result<()> {
    let tv = libc::timeval {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_usec: timeout.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: valid fd and option of the right size.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const tv).cast(),
            size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Asks the kernel to filter dumps by the request's fields (table, protocol: 4.20+); without
/// it (older kernels) dumps hold everything and the caller filters.
pub fn set_strict_dumps(fd: BorrowedFd<'_>) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: valid fd and option of the right size.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_NETLINK,
            libc::NETLINK_GET_STRICT_CHK,
            (&raw const on).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Length of `struct rtmsg`.
pub const RTMSG_LEN: usize = 12;

/// A route to one destination prefix in one table, with the fields route health injection
/// uses (`ip route add blackhole 10.100.0.1/32 table 200 proto 250`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub dst: IpAddr,
    pub prefix_len: u8,
    pub table: u32,
    /// The route's protocol (who made it: `rtm_protocol`).
    pub protocol: u8,
    /// Its type (`RTN_UNICAST`, `RTN_BLACKHOLE`, ...).
    pub kind: u8,
}

impl Route {
    /// A blackhole host route (/32 or /128) of `ip` in `table`, made by `protocol`.
    pub fn blackhole(ip: IpAddr, table: u32, protocol: u8) -> Self {
        Self {
            dst: ip,
            prefix_len: if ip.is_ipv4() { 32 } else { 128 },
            table,
            protocol,
            kind: libc::RTN_BLACKHOLE,
        }
    }

    /// `struct rtmsg` of this route. A table beyond 255 goes in RTA_TABLE, with
    /// `RT_TABLE_UNSPEC` here (as iproute2 writes it).
    fn header(&self) -> [u8; RTMSG_LEN] {
        let mut h = [0u8; RTMSG_LEN];
        h[0] = family(self.dst);
        h[1] = self.prefix_len;
        h[4] = u8::try_from(self.table).unwrap_or(libc::RT_TABLE_UNSPEC);
        h[5] = self.protocol;
        h[6] = libc::RT_SCOPE_UNIVERSE;
        h[7] = self.kind;
        h
    }

    /// Parses an RTM_NEWROUTE body; None when it is not one.
    pub fn parse(body: &[u8]) -> Option<Self> {
        let header = body.get(..RTMSG_LEN)?;
        let attrs_bytes = &body[RTMSG_LEN..];
        let table = find_attr(attrs_bytes, libc::RTA_TABLE)
            .and_then(|t| u32_at(t, 0))
            .unwrap_or(u32::from(header[4]));
        let dst = match (header[0] as i32, find_attr(attrs_bytes, libc::RTA_DST)) {
            (libc::AF_INET, Some(a)) => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(a).ok()?)),
            (libc::AF_INET6, Some(a)) => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(a).ok()?)),
            (libc::AF_INET, None) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            (libc::AF_INET6, None) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            _ => return None,
        };
        Some(Self {
            dst,
            prefix_len: header[1],
            table,
            protocol: header[5],
            kind: header[7],
        })
    }

    fn dst_bytes(&self) -> Vec<u8> {
        match self.dst {
            IpAddr::V4(a) => a.octets().to_vec(),
            IpAddr::V6(a) => a.octets().to_vec(),
        }
    }
}

fn family(ip: IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => libc::AF_INET as u8,
        IpAddr::V6(_) => libc::AF_INET6 as u8,
    }
}

/// Adds `route`, or replaces the route of the same destination in its table.
pub fn add_route(fd: BorrowedFd<'_>, route: &Route) -> io::Result<()> {
    let dst = route.dst_bytes();
    let table = route.table.to_ne_bytes();
    change(
        fd,
        libc::RTM_NEWROUTE,
        (libc::NLM_F_CREATE | libc::NLM_F_REPLACE) as u16,
        &route.header(),
        &[(libc::RTA_DST, &dst), (libc::RTA_TABLE, &table)],
    )
}

/// Deletes `route` (matched by destination, table, protocol and type). ESRCH: there was none.
pub fn delete_route(fd: BorrowedFd<'_>, route: &Route) -> io::Result<()> {
    let dst = route.dst_bytes();
    let table = route.table.to_ne_bytes();
    change(
        fd,
        libc::RTM_DELROUTE,
        0,
        &route.header(),
        &[(libc::RTA_DST, &dst), (libc::RTA_TABLE, &table)],
    )
}

/// The routes of both families in `table` made by `protocol`. The kernel filters them with
/// [`set_strict_dumps`] on; they are filtered here again for kernels that do not.
pub fn routes(fd: BorrowedFd<'_>, table: u32, protocol: u8) -> io::Result<Vec<Route>> {
    let mut header = [0u8; RTMSG_LEN];
    // AF_UNSPEC: both families; a table with no route of a family is then no error.
    header[0] = libc::AF_UNSPEC as u8;
    header[5] = protocol;
    let table_attr = table.to_ne_bytes();
    let bodies = match dump(
        fd,
        libc::RTM_GETROUTE,
        &header,
        &[(libc::RTA_TABLE, &table_attr)],
        libc::RTM_NEWROUTE,
    ) {
        Ok(bodies) => bodies,
        // A table that does not exist (yet) holds nothing.
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Vec::new(),
        Err(e) => return Err(e),
    };
    Ok(bodies
        .iter()
        .filter_map(|b| Route::parse(b))
        .filter(|r| r.table == table && r.protocol == protocol)
        .collect())
}

pub fn malformed() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "malformed rtnetlink message")
}

/// The messages of a datagram with their sequence numbers; stops at the first malformed one.
pub fn messages(mut b: &[u8]) -> impl Iterator<Item = (u32, Message<'_>)> {
    std::iter::from_fn(move || {
        let len = u32_at(b, 0)? as usize;
        if len < NLMSG_HDRLEN || len > b.len() {
            return None;
        }
        let msg = Message {
            kind: u16_at(b, 4)?,
            body: &b[NLMSG_HDRLEN..len],
        };
        let seq = u32_at(b, 8)?;
        b = b.get(len.next_multiple_of(4)..).unwrap_or_default();
        Some((seq, msg))
    })
}

/// The attributes in `b`: `(type, payload)`; stops at the first malformed one.
pub fn attrs(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        let len = u16_at(b, 0)? as usize;
        let ty = u16_at(b, 2)?;
        if len < 4 || len > b.len() {
            return None;
        }
        let value = &b[4..len];
        b = b.get(len.next_multiple_of(4)..).unwrap_or_default();
        Some((ty & NLA_TYPE_MASK, value))
    })
}

/// The payload of the first attribute of type `ty` in `b`.
pub fn find_attr(b: &[u8], ty: u16) -> Option<&[u8]> {
    attrs(b).find(|&(t, _)| t == ty).map(|(_, v)| v)
}

pub fn u16_at(b: &[u8], i: usize) -> Option<u16> {
    b.get(i..i + 2).map(|s| u16::from_ne_bytes([s[0], s[1]]))
}

pub fn u32_at(b: &[u8], i: usize) -> Option<u32> {
    b.get(i..i + 4)
        .map(|s| u32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_messages_parse_back() {
        let a = build(24, &[1, 2, 3, 4], &[(1, &[10, 0, 0, 1]), (7, &[9])], 5);
        assert_eq!(a.len() % 4, 0);
        let b = build(26, &[], &[], 6);
        let both = [a.clone(), b].concat();
        let got: Vec<(u32, Message<'_>)> = messages(&both).collect();
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].0, got[0].1.kind), (5, 24));
        assert_eq!((got[1].0, got[1].1.kind), (6, 26));
        let body = got[0].1.body;
        assert_eq!(&body[..4], &[1, 2, 3, 4]);
        let found: Vec<(u16, &[u8])> = attrs(&body[4..]).collect();
        assert_eq!(found, vec![(1, &[10, 0, 0, 1][..]), (7, &[9][..])]);
        assert_eq!(find_attr(&body[4..], 7), Some(&[9][..]));
        assert_eq!(find_attr(&body[4..], 8), None);
    }

    /// A route request as the kernel would read it, and a route answer parsed back: the table
    /// beyond 255 travels in RTA_TABLE.
    #[test]
    fn routes_build_and_parse() {
        for (ip, table) in [
            ("10.100.0.1", 200u32),
            ("2001:db8:100::1", 200),
            ("10.100.0.2", 4_000_000_000),
        ] {
            let route = Route::blackhole(ip.parse().unwrap(), table, 250);
            let header = route.header();
            assert_eq!(header[1], if route.dst.is_ipv4() { 32 } else { 128 });
            assert_eq!(header[4], if table < 256 { table as u8 } else { 0 });
            assert_eq!((header[5], header[7]), (250, libc::RTN_BLACKHOLE));
            let dst = route.dst_bytes();
            let attrs: [(u16, &[u8]); 2] = [
                (libc::RTA_DST, &dst),
                (libc::RTA_TABLE, &table.to_ne_bytes()),
            ];
            let msg = build_with_flags(libc::RTM_NEWROUTE, 0x500, &header, &attrs, 9);
            assert_eq!(
                u16_at(&msg, 6),
                Some(0x501),
                "NLM_F_REQUEST | CREATE | REPLACE"
            );
            let (_, parsed) = messages(&msg).next().unwrap();
            assert_eq!(Route::parse(parsed.body), Some(route));
        }
        // Without RTA_TABLE the header's table counts; without RTA_DST it is a default route.
        let mut header = Route::blackhole("10.0.0.0".parse().unwrap(), 7, 4).header();
        header[1] = 0;
        let parsed = Route::parse(&header).unwrap();
        assert_eq!((parsed.table, parsed.prefix_len), (7, 0));
        assert_eq!(parsed.dst, IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        // Short or foreign bodies are not routes.
        assert_eq!(Route::parse(&header[..11]), None);
        let mut bad = header;
        bad[0] = 99;
        assert_eq!(Route::parse(&bad), None);
        let mut v4_with_v6_dst = header.to_vec();
        v4_with_v6_dst.extend_from_slice(&build(0, &[], &[(libc::RTA_DST, &[0; 16])], 0)[16..]);
        assert_eq!(Route::parse(&v4_with_v6_dst), None);
    }

    #[test]
    fn truncated_input_ends_the_iterators() {
        let a = build(24, &[0; 12], &[(1, &[10, 0, 0, 1])], 1);
        for cut in 0..a.len() {
            // A cut message is not returned; nothing panics.
            assert_eq!(messages(&a[..cut]).count(), 0, "cut at {cut}");
        }
        let attrs_bytes = &a[NLMSG_HDRLEN + 12..];
        for cut in 0..attrs_bytes.len() {
            assert_eq!(attrs(&attrs_bytes[..cut]).count(), 0, "cut at {cut}");
        }
        // A length below the header's own is malformed, not a loop.
        assert_eq!(attrs(&[2, 0, 1, 0, 0, 0]).count(), 0);
    }
}
