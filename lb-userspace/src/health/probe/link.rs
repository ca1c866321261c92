//! The link-layer path for half-open SYNs: a packet socket that hands each SYN, IP header
//! included, straight to the device towards its target, addressed to the next hop's MAC. The
//! kernel's IP output path (route lookup, `ip_append_data`, netfilter OUTPUT and POSTROUTING,
//! IPsec policies) costs more than half of a probe at 10,000 targets a second (issue 4:
//! ≈ 1 µs of ≈ 6 µs per probe, measured); this path skips it.
//!
//! The half-open prober uses it only for a target whose last probe was answered through the
//! kernel's path, so that the kernel has resolved the next hop and a failure is always confirmed
//! the ordinary way: after a timeout, probes go through the kernel again until an answer comes.
//!
//! IPv4 only: the lookups, the next hops and the headers built here are IPv4's. IPv6 targets
//! always take the kernel's path (the prober's IPv6 raw socket), whatever their history.
//!
//! What a target's [`Link`] holds (device, next hop's MAC, source address) comes from the
//! kernel itself (`RTM_GETROUTE`, as `ip route get`, and `RTM_GETNEIGH`) and stays in use only
//! while nothing it depends on changed: a route or rule change, a removed address or a change
//! to a device in use makes every link stale; a neighbour notification that changes or removes
//! a next hop's MAC makes the links through that next hop stale. Notifications are read before
//! each batch of SYNs is sent. (Changes to other devices, such as container veths coming and
//! going, and added addresses, which come with their own route notification, retire nothing.)
//! Only Ethernet-like next hops (a 6-byte MAC in a usable neighbour state) qualify; anything
//! else (local targets, devices without link-layer addresses, next hops of another family)
//! stays on the kernel's path.

use std::{
    collections::HashMap,
    io,
    net::Ipv4Addr,
    os::fd::{AsFd as _, AsRawFd as _, OwnedFd},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use socket2::SockRef;

use crate::rtnl::{self, Message};

use super::sys::{MAX_BATCH, default_ttl, ipv4_header, send_headers};

// rtnetlink constants not in the libc crate (linux/rtnetlink.h, neighbour.h).
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_PREFSRC: u16 = 7;
const RTA_VIA: u16 = 18;
const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;
const RTMGRP_LINK: u32 = 0x1;
const RTMGRP_NEIGH: u32 = 0x4;
const RTMGRP_IPV4_IFADDR: u32 = 0x10;
const RTMGRP_IPV4_ROUTE: u32 = 0x40;
const RTMGRP_IPV4_RULE: u32 = 0x80;
/// `struct rtmsg` and `struct ndmsg`.
const RTMSG_LEN: usize = 12;
const NDMSG_LEN: usize = 12;

/// Neighbour states whose MAC the kernel itself would send to (NUD_REACHABLE, NUD_STALE,
/// NUD_DELAY, NUD_PROBE, NUD_PERMANENT).
const NUD_USABLE: u16 = 0x02 | 0x04 | 0x08 | 0x10 | 0x80;

/// Send buffer of the packet socket: a few batches of SYNs in flight on a slow device.
const SNDBUF: usize = 1 << 20;

/// A next hop's MAC, shared by the links through it; `valid` turns false when a neighbour
/// notification changes or removes it.
#[derive(Debug)]
struct NextHop {
    mac: [u8; 6],
    valid: AtomicBool,
}

/// How to reach one target on the link layer.
#[derive(Debug, Clone)]
pub struct Link {
    pub ifindex: u32,
    /// The source address the kernel would use towards the target.
    pub source: Ipv4Addr,
    next_hop: Arc<NextHop>,
    /// [`Links`]'s generation when this was looked up.
    generation: u64,
}

/// One IPv4 datagram for [`Links::send_many`]: `payload` (of `protocol`) from `source` to
/// `destination`, on `link`. The IP header is built on sending.
pub struct Frame<'a> {
    pub link: &'a Link,
    pub source: Ipv4Addr,
    pub destination: Ipv4Addr,
    pub protocol: u8,
    pub payload: &'a [u8],
}

/// The packet socket, the lookups and the change notifications of the calling thread's network
/// namespace.
pub struct Links {
    /// One request and its answer at a time: answers are read from the same socket.
    requests: Mutex<OwnedFd>,
    events: OwnedFd,
    packet: OwnedFd,
    generation: AtomicU64,
    /// Next hops in use, by (device, address): what neighbour notifications are checked against.
    /// Held across a neighbour lookup and its insertion, so a notification read meanwhile is
    /// checked against the entry it concerns.
    next_hops: Mutex<HashMap<(u32, Ipv4Addr), Arc<NextHop>>>,
    /// TTL of the packets built (the namespace's `ip_default_ttl`).
    ttl: u8,
}

impl Links {
    /// Opens the sockets (a packet socket needs CAP_NET_RAW, as the raw socket does).
    pub fn open() -> io::Result<Self> {
        let groups =
            RTMGRP_LINK | RTMGRP_NEIGH | RTMGRP_IPV4_IFADDR | RTMGRP_IPV4_ROUTE | RTMGRP_IPV4_RULE;
        let events = rtnl::open(groups, true)?;
        super::sys::grow_receive_buffer(events.as_fd(), 1 << 20)?;
        let requests = rtnl::open(0, false)?;
        // The kernel answers at once; a lookup must never hang the prober.
        SockRef::from(&requests).set_read_timeout(Some(std::time::Duration::from_secs(1)))?;
        // Protocol 0: the socket sends only, it receives nothing.
        let kind = socket2::Type::DGRAM.nonblocking().cloexec();
        let packet = socket2::Socket::new(socket2::Domain::PACKET, kind, None)?;
        packet.set_send_buffer_size(SNDBUF)?;
        let packet = OwnedFd::from(packet);
        let ttl = default_ttl();
        Ok(Self {
            requests: Mutex::new(requests),
            events,
            packet,
            generation: AtomicU64::new(0),
            next_hops: Mutex::new(HashMap::new()),
            ttl,
        })
    }

    /// Whether `link` still holds: nothing it depends on changed since it was looked up (as far
    /// as the notifications read so far tell).
    pub fn current(&self, link: &Link) -> bool {
        link.generation == self.generation.load(Ordering::Acquire)
            && link.next_hop.valid.load(Ordering::Acquire)
    }

    /// How the kernel would reach `target` now, if it is over an Ethernet-like next hop whose
    /// MAC the kernel knows; None otherwise (the kernel's path must be used).
    pub fn lookup(&self, target: Ipv4Addr) -> io::Result<Option<Link>> {
        // Read first: a change notified during the lookup makes the result stale at once.
        let generation = self.generation.load(Ordering::Acquire);
        let mut rtm = [0u8; RTMSG_LEN];
        rtm[0] = libc::AF_INET as u8;
        rtm[1] = 32; // dst_len
        let body = match rtnl::request(
            self.requests().as_fd(),
            libc::RTM_GETROUTE,
            &rtm,
            &[(RTA_DST, &target.octets())],
            libc::RTM_NEWROUTE,
        ) {
            Ok(body) => body,
            // No route: the kernel's path reports it.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENETUNREACH | libc::EHOSTUNREACH)
                ) =>
            {
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let Some(hop) = Route::parse(&body).and_then(|r| r.next_hop(target)) else {
            return Ok(None);
        };
        let mut next_hops = self
            .next_hops
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let key = (hop.ifindex, hop.address);
        let next_hop = match next_hops.get(&key) {
            Some(known) if known.valid.load(Ordering::Acquire) => Arc::clone(known),
            _ => {
                let Some(mac) = self.neighbour(hop.ifindex, hop.address)? else {
                    return Ok(None);
                };
                let fresh = Arc::new(NextHop {
                    mac,
                    valid: AtomicBool::new(true),
                });
                next_hops.insert(key, Arc::clone(&fresh));
                fresh
            }
        };
        Ok(Some(Link {
            ifindex: hop.ifindex,
            source: hop.source,
            next_hop,
            generation,
        }))
    }

    fn requests(&self) -> std::sync::MutexGuard<'_, OwnedFd> {
        self.requests.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The MAC of neighbour `address` on device `ifindex`, if the kernel has a usable one.
    fn neighbour(&self, ifindex: u32, address: Ipv4Addr) -> io::Result<Option<[u8; 6]>> {
        let mut ndm = [0u8; NDMSG_LEN];
        ndm[0] = libc::AF_INET as u8;
        ndm[4..8].copy_from_slice(&ifindex.to_ne_bytes());
        match rtnl::request(
            self.requests().as_fd(),
            libc::RTM_GETNEIGH,
            &ndm,
            &[(NDA_DST, &address.octets())],
            libc::RTM_NEWNEIGH,
        ) {
            Ok(body) => Ok(Neighbour::parse(&body).and_then(|n| n.usable_mac())),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Reads the change notifications queued since the last call and retires the links they
    /// concern. Never blocks.
    pub fn watch(&self) {
        let mut buf = [0u8; 16 * 1024];
        loop {
            // SAFETY: valid fd and buffer.
            let n = unsafe {
                libc::recv(
                    self.events.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                match io::Error::last_os_error().raw_os_error() {
                    Some(libc::EAGAIN) => return,
                    Some(libc::EINTR) => continue,
                    // ENOBUFS: notifications were lost. Anything may have changed.
                    _ => {
                        self.retire_all();
                        continue;
                    }
                }
            }
            for (_, message) in rtnl::messages(&buf[..n as usize]) {
                match Change::of(message) {
                    Change::Everything => self.retire_all(),
                    Change::Device(ifindex) => self.device_changed(ifindex),
                    Change::Neighbour(neighbour, removed) => {
                        self.neighbour_changed(&neighbour, removed)
                    }
                    Change::Nothing => {}
                }
            }
        }
    }

    fn retire_all(&self) {
        let mut next_hops = self
            .next_hops
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.generation.fetch_add(1, Ordering::AcqRel);
        for hop in next_hops.values() {
            hop.valid.store(false, Ordering::Release);
        }
        next_hops.clear();
    }

    fn device_changed(&self, ifindex: u32) {
        let next_hops = self
            .next_hops
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let in_use = next_hops.keys().any(|&(i, _)| i == ifindex);
        drop(next_hops);
        if in_use {
            self.retire_all();
        }
    }

    fn neighbour_changed(&self, neighbour: &Neighbour, removed: bool) {
        let mut next_hops = self
            .next_hops
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let key = (neighbour.ifindex, neighbour.address);
        if let Some(hop) = next_hops.get(&key)
            && neighbour.retires(hop.mac, removed)
        {
            hop.valid.store(false, Ordering::Release);
            next_hops.remove(&key);
        }
    }

    /// Sends up to [`MAX_BATCH`] frames in one `sendmmsg`, without blocking: each with its IPv4
    /// header, on its link's device, to its next hop's MAC (the kernel writes the Ethernet
    /// header). Returns how many were sent, from the first; an error means the first could not
    /// be.
    pub fn send_many(&self, frames: &[Frame<'_>]) -> io::Result<usize> {
        let n = frames.len().min(MAX_BATCH);
        if n == 0 {
            return Ok(0);
        }
        // SAFETY: all-zero sockaddr_lls, iovecs and mmsghdrs are valid; the pointers set below
        // outlive the call.
        let mut to: [libc::sockaddr_ll; MAX_BATCH] = unsafe { std::mem::zeroed() };
        let mut headers = [[0u8; 20]; MAX_BATCH];
        // Two per datagram: its IP header, its payload.
        let mut iov: [[libc::iovec; 2]; MAX_BATCH] = unsafe { std::mem::zeroed() };
        let mut msgs: [libc::mmsghdr; MAX_BATCH] = unsafe { std::mem::zeroed() };
        for (i, frame) in frames[..n].iter().enumerate() {
            let ll = &mut to[i];
            ll.sll_family = libc::AF_PACKET as u16;
            ll.sll_protocol = (libc::ETH_P_IP as u16).to_be();
            ll.sll_ifindex = frame.link.ifindex as i32;
            ll.sll_halen = 6;
            ll.sll_addr[..6].copy_from_slice(&frame.link.next_hop.mac);
            headers[i] = ipv4_header(
                frame.source,
                frame.destination,
                frame.protocol,
                frame.payload.len(),
                self.ttl,
            );
            iov[i] = [
                libc::iovec {
                    iov_base: headers[i].as_mut_ptr().cast(),
                    iov_len: 20,
                },
                libc::iovec {
                    iov_base: frame.payload.as_ptr().cast_mut().cast(),
                    iov_len: frame.payload.len(),
                },
            ];
            let hdr = &mut msgs[i].msg_hdr;
            hdr.msg_name = (&raw mut to[i]).cast();
            hdr.msg_namelen = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            hdr.msg_iov = iov[i].as_mut_ptr();
            hdr.msg_iovlen = 2;
        }
        // SAFETY: `n` headers whose buffers (IP headers, payloads) and addresses are alive.
        unsafe { send_headers(self.packet.as_fd(), &mut msgs[..n]) }
    }
}

/// The fields of an `RTM_NEWROUTE` answer that matter here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Route {
    kind: u8,
    oif: Option<u32>,
    gateway: Option<Ipv4Addr>,
    source: Option<Ipv4Addr>,
    /// A next hop of another family (RTA_VIA).
    via: bool,
}

/// Where a target's packets go on the link layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hop {
    ifindex: u32,
    /// The gateway, or the target itself on a directly connected network.
    address: Ipv4Addr,
    source: Ipv4Addr,
}

impl Route {
    fn parse(body: &[u8]) -> Option<Self> {
        if *body.first()? != libc::AF_INET as u8 {
            return None;
        }
        let mut route = Route {
            kind: *body.get(7)?,
            ..Route::default()
        };
        let ipv4 = |v: &[u8]| <[u8; 4]>::try_from(v).ok().map(Ipv4Addr::from);
        for (ty, value) in rtnl::attrs(body.get(RTMSG_LEN..)?) {
            match ty {
                RTA_OIF => route.oif = rtnl::u32_at(value, 0),
                RTA_GATEWAY => route.gateway = ipv4(value),
                RTA_PREFSRC => route.source = ipv4(value),
                RTA_VIA => route.via = true,
                _ => {}
            }
        }
        Some(route)
    }

    /// The next hop towards `target`, for a unicast route through a device with a source
    /// address; None for anything else (local, blackhole, unreachable, prohibit...).
    fn next_hop(&self, target: Ipv4Addr) -> Option<Hop> {
        if self.kind != libc::RTN_UNICAST || self.via {
            return None;
        }
        Some(Hop {
            ifindex: self.oif.filter(|&i| i != 0)?,
            address: self.gateway.unwrap_or(target),
            source: self.source?,
        })
    }
}

/// The fields of an `RTM_NEWNEIGH` / `RTM_DELNEIGH` message that matter here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Neighbour {
    ifindex: u32,
    address: Ipv4Addr,
    state: u16,
    mac: Option<[u8; 6]>,
}

impl Neighbour {
    fn parse(body: &[u8]) -> Option<Self> {
        if *body.first()? != libc::AF_INET as u8 {
            return None;
        }
        let ifindex = rtnl::u32_at(body, 4)?;
        let state = rtnl::u16_at(body, 8)?;
        let attrs = body.get(NDMSG_LEN..)?;
        let address = <[u8; 4]>::try_from(rtnl::find_attr(attrs, NDA_DST)?).ok()?;
        let mac = rtnl::find_attr(attrs, NDA_LLADDR).and_then(|m| <[u8; 6]>::try_from(m).ok());
        Some(Self {
            ifindex,
            address: Ipv4Addr::from(address),
            state,
            mac,
        })
    }

    /// The MAC the kernel would send to, if any.
    fn usable_mac(&self) -> Option<[u8; 6]> {
        self.mac
            .filter(|m| *m != [0; 6] && self.state & NUD_USABLE != 0)
    }

    /// Whether this notification retires a next hop known with `mac`: it was removed, is no
    /// longer usable, or has another MAC. (Reachable → stale, with the same MAC, is not a
    /// change: the kernel would still send there.)
    fn retires(&self, mac: [u8; 6], removed: bool) -> bool {
        removed || self.usable_mac() != Some(mac)
    }
}

/// What a notification means for the links in use.
#[derive(Debug, PartialEq, Eq)]
enum Change {
    /// A route or rule changed, or an address was removed: every link may be wrong.
    Everything,
    /// Device `ifindex` changed (state, address, or it went): the links through it may be wrong.
    Device(u32),
    /// A neighbour entry changed (true: it was removed).
    Neighbour(Neighbour, bool),
    Nothing,
}

impl Change {
    fn of(message: Message<'_>) -> Self {
        match message.kind {
            libc::RTM_NEWNEIGH | libc::RTM_DELNEIGH => match Neighbour::parse(message.body) {
                Some(n) => Change::Neighbour(n, message.kind == libc::RTM_DELNEIGH),
                None => Change::Nothing, // another family
            },
            libc::RTM_NEWLINK | libc::RTM_DELLINK => match rtnl::u32_at(message.body, 4) {
                Some(ifindex) => Change::Device(ifindex),
                None => Change::Everything,
            },
            libc::RTM_DELADDR
            | libc::RTM_NEWROUTE
            | libc::RTM_DELROUTE
            | libc::RTM_NEWRULE
            | libc::RTM_DELRULE => Change::Everything,
            _ => Change::Nothing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route_body(kind: u8, attrs: &[(u16, &[u8])]) -> Vec<u8> {
        let mut rtm = [0u8; RTMSG_LEN];
        rtm[0] = libc::AF_INET as u8;
        rtm[7] = kind;
        let msg = rtnl::build(libc::RTM_NEWROUTE, &rtm, attrs, 1);
        msg[rtnl::NLMSG_HDRLEN..].to_vec()
    }

    fn neighbour_body(ifindex: u32, address: [u8; 4], state: u16, mac: Option<[u8; 6]>) -> Vec<u8> {
        let mut ndm = [0u8; NDMSG_LEN];
        ndm[0] = libc::AF_INET as u8;
        ndm[4..8].copy_from_slice(&ifindex.to_ne_bytes());
        ndm[8..10].copy_from_slice(&state.to_ne_bytes());
        let mut attrs: Vec<(u16, &[u8])> = vec![(NDA_DST, &address)];
        if let Some(mac) = &mac {
            attrs.push((NDA_LLADDR, mac));
        }
        let msg = rtnl::build(libc::RTM_NEWNEIGH, &ndm, &attrs, 1);
        msg[rtnl::NLMSG_HDRLEN..].to_vec()
    }

    const TARGET: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 7);

    #[test]
    fn a_gateway_route_goes_to_the_gateway_from_its_source() {
        let body = route_body(
            libc::RTN_UNICAST,
            &[
                (RTA_DST, &[10, 0, 2, 7]),
                (RTA_OIF, &3u32.to_ne_bytes()),
                (RTA_GATEWAY, &[10, 0, 1, 1]),
                (RTA_PREFSRC, &[10, 0, 1, 5]),
            ],
        );
        let hop = Route::parse(&body).unwrap().next_hop(TARGET).unwrap();
        assert_eq!(
            hop,
            Hop {
                ifindex: 3,
                address: Ipv4Addr::new(10, 0, 1, 1),
                source: Ipv4Addr::new(10, 0, 1, 5),
            }
        );
    }

    #[test]
    fn a_connected_route_goes_to_the_target_itself() {
        let body = route_body(
            libc::RTN_UNICAST,
            &[
                (RTA_OIF, &3u32.to_ne_bytes()),
                (RTA_PREFSRC, &[10, 0, 2, 1]),
            ],
        );
        let hop = Route::parse(&body).unwrap().next_hop(TARGET).unwrap();
        assert_eq!(hop.address, TARGET);
    }

    #[test]
    fn other_routes_stay_on_the_kernels_path() {
        let oif = 3u32.to_ne_bytes();
        let full: [(u16, &[u8]); 2] = [(RTA_OIF, &oif), (RTA_PREFSRC, &[10, 0, 2, 1])];
        for kind in [libc::RTN_LOCAL, libc::RTN_BLACKHOLE, libc::RTN_UNREACHABLE] {
            let route = Route::parse(&route_body(kind, &full)).unwrap();
            assert_eq!(route.next_hop(TARGET), None, "type {kind}");
        }
        // No device, no source, or an IPv6 next hop.
        let no_oif = route_body(libc::RTN_UNICAST, &full[1..]);
        let no_src = route_body(libc::RTN_UNICAST, &full[..1]);
        let via = route_body(libc::RTN_UNICAST, &[full[0], full[1], (RTA_VIA, &[0; 18])]);
        for body in [no_oif, no_src, via] {
            assert_eq!(Route::parse(&body).unwrap().next_hop(TARGET), None);
        }
        // Not IPv4, or cut short.
        let mut v6 = route_body(libc::RTN_UNICAST, &full);
        v6[0] = libc::AF_INET6 as u8;
        assert_eq!(Route::parse(&v6), None);
        assert_eq!(Route::parse(&v6[..4]), None);
    }

    #[test]
    fn only_usable_neighbours_give_a_mac() {
        let mac = [2, 0, 0, 0, 0, 9];
        let usable = [0x02, 0x04, 0x08, 0x10, 0x80]; // reachable stale delay probe permanent
        for state in usable {
            let n = Neighbour::parse(&neighbour_body(3, [10, 0, 1, 1], state, Some(mac))).unwrap();
            assert_eq!(n.usable_mac(), Some(mac), "state {state:#x}");
            assert_eq!((n.ifindex, n.address), (3, Ipv4Addr::new(10, 0, 1, 1)));
        }
        // incomplete, failed, noarp, none; a zero MAC; no MAC.
        for state in [0x01, 0x20, 0x40, 0x00] {
            let n = Neighbour::parse(&neighbour_body(3, [10, 0, 1, 1], state, Some(mac))).unwrap();
            assert_eq!(n.usable_mac(), None, "state {state:#x}");
        }
        let zero = Neighbour::parse(&neighbour_body(3, [10, 0, 1, 1], 0x02, Some([0; 6])));
        assert_eq!(zero.unwrap().usable_mac(), None);
        let none = Neighbour::parse(&neighbour_body(3, [10, 0, 1, 1], 0x02, None));
        assert_eq!(none.unwrap().usable_mac(), None);
    }

    #[test]
    fn a_neighbour_notification_retires_only_a_changed_mac() {
        let mac = [2, 0, 0, 0, 0, 9];
        let parse = |state, m| Neighbour::parse(&neighbour_body(3, [10, 0, 1, 1], state, m));
        // reachable -> stale, same MAC: still where the kernel sends.
        assert!(!parse(0x04, Some(mac)).unwrap().retires(mac, false));
        // Another MAC, a failed entry, a removal.
        assert!(
            parse(0x02, Some([2, 0, 0, 0, 0, 8]))
                .unwrap()
                .retires(mac, false)
        );
        assert!(parse(0x20, Some(mac)).unwrap().retires(mac, false));
        assert!(parse(0x04, Some(mac)).unwrap().retires(mac, true));
    }

    #[test]
    fn notifications_are_sorted_by_what_they_retire() {
        let neighbour = neighbour_body(3, [10, 0, 1, 1], 0x02, Some([2, 0, 0, 0, 0, 9]));
        let deleted = Change::of(Message {
            kind: libc::RTM_DELNEIGH,
            body: &neighbour,
        });
        assert!(matches!(deleted, Change::Neighbour(n, true) if n.ifindex == 3));
        for kind in [libc::RTM_NEWROUTE, libc::RTM_DELADDR, libc::RTM_DELRULE] {
            let change = Change::of(Message { kind, body: &[] });
            assert_eq!(change, Change::Everything, "type {kind}");
        }
        // ifinfomsg: family, pad, type, then the index.
        let mut link = [0u8; 16];
        link[4..8].copy_from_slice(&7i32.to_ne_bytes());
        for kind in [libc::RTM_NEWLINK, libc::RTM_DELLINK] {
            let change = Change::of(Message { kind, body: &link });
            assert_eq!(change, Change::Device(7), "type {kind}");
        }
        // An added address retires nothing (its route comes with a notification of its own).
        let added = Change::of(Message {
            kind: libc::RTM_NEWADDR,
            body: &[0; 8],
        });
        assert_eq!(added, Change::Nothing);
        let mut v6 = neighbour.clone();
        v6[0] = libc::AF_INET6 as u8;
        let other = Change::of(Message {
            kind: libc::RTM_NEWNEIGH,
            body: &v6,
        });
        assert_eq!(other, Change::Nothing);
    }

    #[test]
    fn the_ip_header_checksums_to_zero() {
        use crate::health::probe::sys::{fold, ones_sum};
        let h = ipv4_header(
            Ipv4Addr::new(10, 0, 1, 5),
            Ipv4Addr::new(10, 0, 2, 7),
            libc::IPPROTO_TCP as u8,
            24,
            64,
        );
        assert_eq!(fold(ones_sum(&h)), 0xffff);
        assert_eq!(u16::from_be_bytes([h[2], h[3]]), 44);
        assert_eq!((h[0], h[6], h[8], h[9]), (0x45, 0x40, 64, 6));
    }
}
