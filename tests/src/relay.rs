//! A userspace stand-in for the balancer's encapsulation, for testing a backend's
//! decapsulation with real clients: in a namespace between client and backend, every frame to a
//! VIP arriving on one interface is read from a packet socket, encapsulated with the test kit's
//! [`encapsulate`] (as lb's datapath would: IP in IP, or GUE) and sent to the backend from
//! another interface. Replies do not come back through it: the backend sends them from the VIP
//! straight to the client (the namespace routes them as any router would).

use std::{
    net::IpAddr,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
};

use anyhow::{Context as _, bail};

use crate::{
    netns::Netns,
    packet::{Encap, encapsulate},
};

/// Where the relay takes frames from and sends them to.
#[derive(Clone, Debug)]
pub struct RelaySpec {
    /// The interface clients' frames arrive on, and the one towards the backend.
    pub from_if: String,
    pub to_if: String,
    /// Frames to these addresses are encapsulated; others are left to the kernel.
    pub vips: Vec<IpAddr>,
    /// `None`: IP in IP; `Some(port)`: GUE to that port.
    pub gue_port: Option<u16>,
    /// Outer source and destination of each family (the relay's and the backend's addresses).
    pub src4: IpAddr,
    pub dst4: IpAddr,
    pub src6: IpAddr,
    pub dst6: IpAddr,
    /// Outer MAC addresses: the relay's own on `to_if`, the backend's.
    pub smac: [u8; 6],
    pub dmac: [u8; 6],
}

/// The running relay; stopped when dropped.
pub struct Relay {
    stop: Arc<AtomicBool>,
    relayed: Arc<AtomicU64>,
    thread: Option<JoinHandle<anyhow::Result<()>>>,
}

impl Relay {
    /// Starts relaying in `ns` as `spec` says.
    pub fn start(ns: &Netns, spec: RelaySpec) -> anyhow::Result<Self> {
        let (rx, tx) = ns.enter(|| -> anyhow::Result<_> {
            Ok((packet_socket(&spec.from_if)?, packet_socket(&spec.to_if)?))
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        let relayed = Arc::new(AtomicU64::new(0));
        let thread = {
            let (stop, relayed) = (stop.clone(), relayed.clone());
            std::thread::spawn(move || relay(&rx, &tx, &spec, &stop, &relayed))
        };
        Ok(Self {
            stop,
            relayed,
            thread: Some(thread),
        })
    }

    /// Frames encapsulated and sent so far.
    pub fn relayed(&self) -> u64 {
        self.relayed.load(Ordering::Relaxed)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            match thread.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => eprintln!("warning: relay: {e:#}"),
                Err(_) => eprintln!("warning: the relay thread panicked"),
            }
        }
    }
}

/// A packet socket bound to `ifname` of the calling thread's namespace, every protocol, with a
/// receive timeout (so the relay sees its stop flag). Also the flood's, and tests' that send
/// frames of their own.
pub fn packet_socket(ifname: &str) -> anyhow::Result<OwnedFd> {
    let proto = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: plain socket(2).
    let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(proto)) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error()).context("AF_PACKET socket");
    }
    // SAFETY: a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let name = std::ffi::CString::new(ifname)?;
    // SAFETY: a valid NUL-terminated string.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        bail!("no interface {ifname}");
    }
    // SAFETY: all-zero is a valid sockaddr_ll.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_protocol = proto;
    addr.sll_ifindex = index as i32;
    let len = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
    // SAFETY: a valid descriptor, address and length.
    if unsafe { libc::bind(fd.as_raw_fd(), (&raw const addr).cast(), len) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("binding to {ifname}"));
    }
    let timeout = libc::timeval {
        tv_sec: 0,
        tv_usec: 100_000,
    };
    // SAFETY: a valid descriptor and option value.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const timeout).cast(),
            size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("SO_RCVTIMEO");
    }
    Ok(fd)
}

fn relay(
    rx: &OwnedFd,
    tx: &OwnedFd,
    spec: &RelaySpec,
    stop: &AtomicBool,
    relayed: &AtomicU64,
) -> anyhow::Result<()> {
    let mut buf = vec![0u8; 65536];
    while !stop.load(Ordering::Relaxed) {
        // SAFETY: all-zero is a valid sockaddr_ll.
        let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        let mut len = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        // SAFETY: a valid descriptor, buffer and address of those lengths.
        let n = unsafe {
            libc::recvfrom(
                rx.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                0,
                (&raw mut from).cast(),
                &mut len,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
            ) {
                continue;
            }
            return Err(e).context("relay: recvfrom");
        }
        // Our own namespace's frames leaving by that interface are seen too.
        if from.sll_pkttype == libc::PACKET_OUTGOING {
            continue;
        }
        let frame = &buf[..n as usize];
        let Some(dst) = destination(frame) else {
            continue;
        };
        if !spec.vips.contains(&dst) {
            continue;
        }
        let (src, outer_dst) = if dst.is_ipv4() {
            (spec.src4, spec.dst4)
        } else {
            (spec.src6, spec.dst6)
        };
        let out = encapsulate(
            frame,
            &Encap {
                gue_port: spec.gue_port,
                src,
                dst: outer_dst,
                hash: hash(frame),
                smac: spec.smac,
                dmac: spec.dmac,
            },
        );
        // SAFETY: a valid descriptor bound to its interface, and a buffer of that length.
        let sent = unsafe { libc::send(tx.as_raw_fd(), out.as_ptr().cast(), out.len(), 0) };
        if sent < 0 {
            return Err(std::io::Error::last_os_error()).context("relay: send");
        }
        relayed.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// The destination address of an untagged IPv4 or IPv6 frame.
fn destination(frame: &[u8]) -> Option<IpAddr> {
    match frame.get(12..14)? {
        [0x08, 0x00] => {
            let a: [u8; 4] = frame.get(30..34)?.try_into().ok()?;
            Some(IpAddr::from(a))
        }
        [0x86, 0xdd] => {
            let a: [u8; 16] = frame.get(38..54)?.try_into().ok()?;
            Some(IpAddr::from(a))
        }
        _ => None,
    }
}

/// A hash of the frame's IP addresses and ports, as the flow hash GUE's source port and the
/// flow label come from (FNV-1a: any stable hash will do here).
fn hash(frame: &[u8]) -> u64 {
    let fields = match frame.get(12..14) {
        Some([0x08, 0x00]) => frame.get(26..38),
        _ => frame.get(22..58),
    };
    fields
        .unwrap_or_default()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        })
}
