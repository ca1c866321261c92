//! A minimal rtnetlink client: one request and its one answer (the XDP mode of an interface,
//! the route and neighbour towards a probe target), and the change notifications the
//! half-open prober watches. Messages are built and parsed by hand: the few fields used do not
//! justify a netlink crate.

use std::{
    io,
    os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
    sync::atomic::{AtomicU32, Ordering},
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
    msg[6..8].copy_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
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
    static SEQ: AtomicU32 = AtomicU32::new(1);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let req = build(kind, fixed, attrs, seq);
    // SAFETY: valid buffer; an unbound netlink socket sends to the kernel.
    if unsafe { libc::send(fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        // SAFETY: valid buffer of that length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        for (msg_seq, msg) in messages(&buf[..n as usize]) {
            // A stale answer (of a request whose caller gave up) is skipped.
            if msg_seq != seq {
                continue;
            }
            if msg.kind == libc::NLMSG_ERROR as u16 {
                let code = msg
                    .body
                    .get(0..4)
                    .map(|s| i32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
                    .ok_or_else(malformed)?;
                return Err(io::Error::from_raw_os_error(-code));
            }
            if msg.kind != answer {
                return Err(malformed());
            }
            return Ok(msg.body.to_vec());
        }
    }
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
