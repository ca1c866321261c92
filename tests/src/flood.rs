//! A SYN flood from spoofed sources, for the tests' own namespaces only: frames built beforehand
//! (each a different source address inside the range the test names, and port) sent from a
//! packet socket on one interface, in a thread, until a count or a deadline, whichever comes
//! first. Stopped and joined when dropped.

use std::{
    net::Ipv4Addr,
    os::fd::AsRawFd as _,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crate::{
    netns::Netns,
    packet::{Packet, TCP_SYN},
};

/// Where the flood goes and how much of it.
pub struct FloodSpec {
    pub ifname: String,
    /// The frames' MAC addresses: the interface's own, and the next hop's (lb's).
    pub smac: [u8; 6],
    pub dmac: [u8; 6],
    /// Sources are `prefix.x.y` (a /16 of the test's own), ports 1024 and up.
    pub prefix: [u8; 2],
    pub to: (Ipv4Addr, u16),
    /// Distinct flows built; sent in turn, again from the first after the last.
    pub flows: u32,
    pub max_frames: u64,
    pub max_time: Duration,
    /// Frames a second at most (bursts of 256); `None`: as fast as the socket takes them.
    pub rate: Option<u64>,
}

/// The running flood.
pub struct Flood {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    thread: Option<JoinHandle<anyhow::Result<()>>>,
}

impl Flood {
    pub fn start(ns: &Netns, spec: FloodSpec) -> anyhow::Result<Self> {
        let fd = ns.enter(|| crate::relay::packet_socket(&spec.ifname))?;
        let (vip, port) = spec.to;
        let frames: Vec<Vec<u8>> = (0..spec.flows)
            .map(|i| {
                let src = Ipv4Addr::new(spec.prefix[0], spec.prefix[1], (i >> 8) as u8, i as u8);
                let sport = 1024 + (i % 60000) as u16;
                Packet::tcp(&format!("{src}:{sport}"), &format!("{vip}:{port}"), TCP_SYN)
                    .macs(spec.smac, spec.dmac)
                    .build()
            })
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let thread = {
            let (stop, sent) = (stop.clone(), sent.clone());
            std::thread::spawn(move || -> anyhow::Result<()> {
                let started = Instant::now();
                let mut n = 0u64;
                for frame in frames.iter().cycle() {
                    if n >= spec.max_frames {
                        break;
                    }
                    if n.is_multiple_of(256) {
                        if stop.load(Ordering::Relaxed) || started.elapsed() > spec.max_time {
                            break;
                        }
                        // Paced: the n-th frame is due at n / rate seconds.
                        if let Some(rate) = spec.rate {
                            let due = Duration::from_secs_f64(n as f64 / rate as f64);
                            if let Some(early) = due.checked_sub(started.elapsed()) {
                                std::thread::sleep(early);
                            }
                        }
                    }
                    // SAFETY: a valid descriptor and buffer; the socket is bound to the interface.
                    let rc = unsafe {
                        libc::send(fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0)
                    };
                    if rc >= 0 {
                        n += 1;
                        sent.store(n, Ordering::Relaxed);
                    }
                }
                Ok(())
            })
        };
        Ok(Self {
            stop,
            sent,
            thread: Some(thread),
        })
    }

    /// Whether it is still sending (neither bound reached, not stopped).
    pub fn running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Runs `request` again and again while the flood lasts: how many succeeded and failed
    /// (each failure printed).
    pub fn meanwhile<E: std::fmt::Display>(
        &self,
        mut request: impl FnMut() -> Result<(), E>,
    ) -> (u64, u64) {
        let (mut ok, mut failed) = (0u64, 0u64);
        while self.running() {
            match request() {
                Ok(()) => ok += 1,
                Err(e) => {
                    eprintln!("request failed: {e}");
                    failed += 1;
                }
            }
        }
        (ok, failed)
    }

    /// Frames sent so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Waits for the flood to end by its bounds; the frames it sent.
    pub fn finish(mut self) -> u64 {
        self.join();
        self.sent()
    }

    fn join(&mut self) {
        if let Some(thread) = self.thread.take() {
            match thread.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => eprintln!("warning: flood: {e:#}"),
                Err(_) => eprintln!("warning: the flood thread panicked"),
            }
        }
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.join();
    }
}

impl crate::topology::Sandbox {
    /// A flood of SYNs from spoofed sources (10.99.0.0/16, 60,000 flows) from the client
    /// through lb's first port to `to`: `max_frames` frames in `max_time` at most, `rate` a
    /// second.
    pub fn syn_flood(
        &self,
        to: (Ipv4Addr, u16),
        max_frames: u64,
        max_time: Duration,
        rate: u64,
    ) -> anyhow::Result<Flood> {
        let client = &self.client;
        Flood::start(
            &client.ns,
            FloodSpec {
                ifname: client.ifname.clone(),
                smac: client.ns.mac(&client.ifname)?,
                dmac: self.lb.mac(&self.lb_ports[0].ifname)?,
                prefix: [10, 99],
                to,
                flows: 60_000,
                max_frames,
                max_time,
                rate: Some(rate),
            },
        )
    }
}
