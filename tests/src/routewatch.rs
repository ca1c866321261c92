//! The host routes of one protocol in one table of a namespace, as they come and go: each
//! addition and removal stamped (Unix time) when the kernel told of it (rtnetlink
//! notifications, no polling), so a test can say when a router installed or dropped a route.

use std::{
    net::IpAddr,
    os::fd::AsFd as _,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::Context as _;
use lb::rtnl::{self, Route};

use crate::netns::Netns;

/// IPv4 and IPv6 route notifications (`RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_ROUTE`).
const ROUTE_GROUPS: u32 = 0x40 | 0x400;

/// A route seen coming (`present`) or going.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Change {
    pub time: f64,
    pub dst: IpAddr,
    pub present: bool,
}

/// Watches until dropped.
pub struct RouteWatch {
    changes: Arc<Mutex<Vec<Change>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn host_route(r: &Route, table: u32, protocol: u8) -> bool {
    r.table == table
        && r.protocol == protocol
        && r.prefix_len == if r.dst.is_ipv4() { 32 } else { 128 }
}

impl RouteWatch {
    /// Watches the host routes (/32, /128) of `protocol` in `table` of `ns`: those there now
    /// (as changes at the start), then every change.
    pub fn start(ns: &Netns, table: u32, protocol: u8) -> anyhow::Result<Self> {
        let changes = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let ns = ns.clone();
        let thread = {
            let (changes, stop) = (changes.clone(), stop.clone());
            std::thread::spawn(move || {
                ns.enter(|| {
                    // Subscribed before the dump: nothing falls between the two.
                    let setup = || -> anyhow::Result<_> {
                        let events = rtnl::open(ROUTE_GROUPS, false)?;
                        rtnl::set_receive_timeout(events.as_fd(), Duration::from_millis(50))?;
                        let requests = rtnl::open(0, false)?;
                        let now = rtnl::routes(requests.as_fd(), table, protocol)?;
                        Ok((events, now))
                    };
                    let events = match setup() {
                        Ok((events, now)) => {
                            let t = unix_now();
                            let mut c = changes.lock().unwrap();
                            for r in now.iter().filter(|r| host_route(r, table, protocol)) {
                                c.push(Change {
                                    time: t,
                                    dst: r.dst,
                                    present: true,
                                });
                            }
                            drop(c);
                            let _ = ready_tx.send(Ok(()));
                            events
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    let mut buf = vec![0u8; 64 * 1024];
                    while !stop.load(Ordering::Relaxed) {
                        // SAFETY: valid buffer of that length.
                        let n = unsafe {
                            libc::recv(
                                std::os::fd::AsRawFd::as_raw_fd(&events),
                                buf.as_mut_ptr().cast(),
                                buf.len(),
                                0,
                            )
                        };
                        let time = unix_now();
                        if n <= 0 {
                            continue; // the timeout: look at `stop`
                        }
                        for (_, msg) in rtnl::messages(&buf[..n as usize]) {
                            let present = match msg.kind {
                                libc::RTM_NEWROUTE => true,
                                libc::RTM_DELROUTE => false,
                                _ => continue,
                            };
                            if let Some(r) =
                                Route::parse(msg.body).filter(|r| host_route(r, table, protocol))
                            {
                                changes.lock().unwrap().push(Change {
                                    time,
                                    dst: r.dst,
                                    present,
                                });
                            }
                        }
                    }
                });
            })
        };
        ready_rx
            .recv()
            .context("the route watcher ended before it started")??;
        Ok(Self {
            changes,
            stop,
            thread: Some(thread),
        })
    }

    /// Every change of `dst` so far.
    pub fn changes_of(&self, dst: IpAddr) -> Vec<Change> {
        self.changes
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.dst == dst)
            .copied()
            .collect()
    }

    /// Whether `dst` is routed now.
    pub fn present(&self, dst: IpAddr) -> bool {
        self.changes_of(dst).last().is_some_and(|c| c.present)
    }

    /// Waits until `dst` is routed (`present`) or not; when that change came (None: not
    /// within `limit`).
    pub fn wait(&self, dst: IpAddr, present: bool, limit: Duration) -> Option<f64> {
        let deadline = Instant::now() + limit;
        loop {
            let last = self.changes_of(dst).last().copied();
            match last {
                Some(c) if c.present == present => return Some(c.time),
                None if !present => return Some(0.0),
                _ => {}
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for RouteWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join(); // a panicked watcher already failed its test
        }
    }
}
