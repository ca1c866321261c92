//! Route health injection (docs/operating.md, "Running several lb hosts"): which VIPs this host announces,
//! and the changes that bring a routing table there. lb does not speak BGP: each announced VIP
//! is a route (/32 or /128) in a kernel table of lb's own, which BIRD's `protocol kernel`
//! learns and its BGP sessions export.
//!
//! Pure: the table is behind [`RouteTable`] (the kernel's in `kernel.rs`, a map in the tests),
//! and the daemon hands in each service's settings and its count of backends taking new flows.
//!
//! A VIP is one route shared by every service on it, announced while at least one of them
//! wants it: withdrawing it because one service lost its backends would take the VIP's traffic
//! off this host for the healthy services on it too.

mod kernel;

pub use kernel::{KernelTable, flush};

use std::{
    collections::{BTreeMap, BTreeSet},
    io,
    net::IpAddr,
};

use crate::config::{AnnounceMode, ServiceAnnounce};

/// lb's route protocol number (`ip route ... proto 250`): free in iproute2's `rt_protos`
/// (0-4 are the kernel's, 8-192 name routing daemons: BIRD 12, zebra 11, bgp 186 ...), so lb's
/// routes are told apart from everyone else's, by lb (it removes only its own) and by BIRD.
pub const ROUTE_PROTOCOL: u8 = 250;

/// What the host as a whole does with its VIPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostMode {
    /// Each VIP announced as its services want.
    Announcing,
    /// `lb drain-host`: every VIP withdrawn, forwarding goes on (maintenance).
    Drained,
    /// `lb stop`: every VIP withdrawn, forwarding goes on for the grace period, then lb stops.
    Stopping,
}

impl HostMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Announcing => "announcing",
            Self::Drained => "drained",
            Self::Stopping => "stopping",
        }
    }

    /// Why every VIP is withdrawn in this mode (None: they are not).
    fn withdraws_all(self) -> Option<&'static str> {
        match self {
            Self::Announcing => None,
            Self::Drained => Some("drain-host"),
            Self::Stopping => Some("stop"),
        }
    }
}

/// One service's say on its VIP.
#[derive(Debug, Clone, Copy)]
pub struct ServiceInput<'a> {
    pub name: &'a str,
    pub vip: IpAddr,
    pub setting: ServiceAnnounce,
    /// Its backends taking new flows now (health, ejections, admin and weight together).
    pub available: usize,
    pub backends: usize,
}

impl ServiceInput<'_> {
    /// Whether this service wants its VIP announced.
    pub fn wants(&self) -> bool {
        match self.setting.mode {
            AnnounceMode::Healthy => self.available >= self.setting.min_available as usize,
            AnnounceMode::Always => true,
            AnnounceMode::Never => false,
        }
    }

    /// Why: "web: 0 of 3 backends available (needs 1)", "web: announce = always".
    pub fn why(&self) -> String {
        match self.setting.mode {
            AnnounceMode::Healthy => format!(
                "{}: {} of {} backend{} available (needs {})",
                self.name,
                self.available,
                self.backends,
                if self.backends == 1 { "" } else { "s" },
                self.setting.min_available
            ),
            mode => format!("{}: announce = {}", self.name, mode.as_str()),
        }
    }
}

/// What the host wants for one VIP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Want {
    pub announce: bool,
    /// The services that decide it, with their numbers, or the host's mode.
    pub reason: String,
    /// Every service on the VIP.
    pub services: Vec<String>,
}

/// Every VIP of `services` and whether it is to be announced: while the host announces, a VIP
/// is announced when at least one of its services wants it.
pub fn wanted(host: HostMode, services: &[ServiceInput<'_>]) -> BTreeMap<IpAddr, Want> {
    let mut by_vip: BTreeMap<IpAddr, Vec<&ServiceInput<'_>>> = BTreeMap::new();
    for s in services {
        by_vip.entry(s.vip).or_default().push(s);
    }
    by_vip
        .into_iter()
        .map(|(vip, list)| {
            let wanting: Vec<String> = list.iter().filter(|s| s.wants()).map(|s| s.why()).collect();
            let announce = host.withdraws_all().is_none() && !wanting.is_empty();
            let reason = match host.withdraws_all() {
                Some(why) => why.to_owned(),
                None if announce => wanting.join("; "),
                None => list.iter().map(|s| s.why()).collect::<Vec<_>>().join("; "),
            };
            let services = list.iter().map(|s| s.name.to_owned()).collect();
            (
                vip,
                Want {
                    announce,
                    reason,
                    services,
                },
            )
        })
        .collect()
}

/// One route to add (`announce`) or remove.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub vip: IpAddr,
    pub announce: bool,
    pub reason: String,
}

/// Why a route of lb's in the table goes when no service has its VIP (a reload removed it, or
/// a previous run left it).
pub const NO_SERVICE: &str = "no service has this VIP";

/// The changes from `announced` (what the table holds) to `wanted`: withdrawals first, then
/// announcements, each in address order.
pub fn diff(wanted: &BTreeMap<IpAddr, Want>, announced: &BTreeSet<IpAddr>) -> Vec<Change> {
    let withdraw = announced.iter().filter_map(|vip| match wanted.get(vip) {
        Some(w) if w.announce => None,
        Some(w) => Some(Change {
            vip: *vip,
            announce: false,
            reason: w.reason.clone(),
        }),
        None => Some(Change {
            vip: *vip,
            announce: false,
            reason: NO_SERVICE.to_owned(),
        }),
    });
    let announce = wanted
        .iter()
        .filter(|(vip, w)| w.announce && !announced.contains(vip))
        .map(|(vip, w)| Change {
            vip: *vip,
            announce: true,
            reason: w.reason.clone(),
        });
    withdraw.chain(announce).collect()
}

/// The routing table lb announces through: the VIPs routed there by lb's protocol.
pub trait RouteTable {
    /// The VIPs lb's protocol routes in the table.
    fn list(&mut self) -> io::Result<BTreeSet<IpAddr>>;
    /// Routes `vip` (/32 or /128) in the table; already routed is fine.
    fn add(&mut self, vip: IpAddr) -> io::Result<()>;
    /// Removes lb's route of `vip`; already gone is fine.
    fn remove(&mut self, vip: IpAddr) -> io::Result<()>;
}

/// A change made (or tried): `error` says why it failed; a failed change is tried again at the
/// next sync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub change: Change,
    pub error: Option<String>,
}

/// One VIP as the status shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct VipView {
    pub vip: IpAddr,
    pub announced: bool,
    /// Whether it should be (None: no service has it, it is being removed).
    pub wanted: Option<bool>,
    pub reason: String,
    pub services: Vec<String>,
    /// Unix time of its last announce or withdraw by this daemon.
    pub since: Option<f64>,
    /// The last failed write of its route, until one succeeds.
    pub error: Option<String>,
}

/// The announcer's state: the host's mode, what the table holds as far as lb knows, and when
/// each VIP last changed. Kept with the daemon's state; changed only by [`Announcer::sync`].
#[derive(Debug, Clone)]
pub struct Announcer {
    table: u32,
    host: HostMode,
    /// The VIPs lb's protocol routes in the table, as last read and written.
    announced: BTreeSet<IpAddr>,
    /// Whether the table was read (the first sync reads it: what a previous run left).
    read: bool,
    /// The last wanted set.
    wanted: BTreeMap<IpAddr, Want>,
    /// Per VIP: Unix time of its last change by this daemon.
    changed: BTreeMap<IpAddr, f64>,
    failed: BTreeMap<IpAddr, String>,
}

impl Announcer {
    pub fn new(table: u32, host: HostMode) -> Self {
        Self {
            table,
            host,
            announced: BTreeSet::new(),
            read: false,
            wanted: BTreeMap::new(),
            changed: BTreeMap::new(),
            failed: BTreeMap::new(),
        }
    }

    pub fn table(&self) -> u32 {
        self.table
    }

    pub fn host(&self) -> HostMode {
        self.host
    }

    /// Sets the host's mode (the next sync acts on it); whether it changed.
    pub fn set_host(&mut self, host: HostMode) -> bool {
        std::mem::replace(&mut self.host, host) != host
    }

    pub fn is_announced(&self, vip: IpAddr) -> bool {
        self.announced.contains(&vip)
    }

    /// How many VIPs the table holds.
    pub fn announced_count(&self) -> usize {
        self.announced.len()
    }

    /// Whether every wanted VIP is in the table and nothing else is.
    pub fn settled(&self) -> bool {
        self.read && diff(&self.wanted, &self.announced).is_empty()
    }

    /// Unix time of the last announce or withdraw.
    pub fn last_change(&self) -> Option<f64> {
        self.changed.values().copied().reduce(f64::max)
    }

    /// Brings the table to `wanted` (from [`wanted`]). The first time, and whenever `reread`,
    /// the table is read first: lb's routes a previous run left are kept while wanted (a
    /// restart withdraws nothing) and removed otherwise, and a route someone else removed is
    /// added again. Returns the changes made or tried; `cause` prefixes their reasons
    /// ("start"). Err: the table could not be read; nothing was written.
    pub fn sync(
        &mut self,
        wanted: BTreeMap<IpAddr, Want>,
        table: &mut dyn RouteTable,
        now: f64,
        reread: bool,
        cause: Option<&str>,
    ) -> io::Result<Vec<Applied>> {
        let mut lost = BTreeSet::new();
        if reread || !self.read {
            let listed = table.list()?;
            if self.read {
                lost = self.announced.difference(&listed).copied().collect();
            }
            self.announced = listed;
            self.read = true;
        }
        let changes = diff(&wanted, &self.announced);
        self.wanted = wanted;
        let mut applied = Vec::with_capacity(changes.len());
        for mut change in changes {
            let result = if change.announce {
                table.add(change.vip)
            } else {
                table.remove(change.vip)
            };
            if lost.contains(&change.vip) {
                change.reason = format!(
                    "{} (its route had been removed from table {} by another program)",
                    change.reason, self.table
                );
            }
            if let Some(cause) = cause {
                change.reason = format!("{cause}: {}", change.reason);
            }
            let error = match result {
                Ok(()) => {
                    if change.announce {
                        self.announced.insert(change.vip);
                    } else {
                        self.announced.remove(&change.vip);
                    }
                    self.changed.insert(change.vip, now);
                    self.failed.remove(&change.vip);
                    None
                }
                Err(e) => {
                    let what = if change.announce {
                        "adding"
                    } else {
                        "removing"
                    };
                    let text = format!("{what} the route in table {}: {e}", self.table);
                    self.failed.insert(change.vip, text.clone());
                    Some(text)
                }
            };
            applied.push(Applied { change, error });
        }
        // What no service has and is gone from the table is forgotten.
        let (wanted, announced) = (&self.wanted, &self.announced);
        self.changed
            .retain(|vip, _| wanted.contains_key(vip) || announced.contains(vip));
        self.failed
            .retain(|vip, _| wanted.contains_key(vip) || announced.contains(vip));
        Ok(applied)
    }

    /// Every VIP wanted or in the table, in address order.
    pub fn vips(&self) -> Vec<VipView> {
        let all: BTreeSet<IpAddr> = self
            .wanted
            .keys()
            .chain(self.announced.iter())
            .copied()
            .collect();
        all.into_iter()
            .map(|vip| {
                let want = self.wanted.get(&vip);
                VipView {
                    vip,
                    announced: self.announced.contains(&vip),
                    wanted: want.map(|w| w.announce),
                    reason: want.map_or_else(|| NO_SERVICE.to_owned(), |w| w.reason.clone()),
                    services: want.map(|w| w.services.clone()).unwrap_or_default(),
                    since: self.changed.get(&vip).copied(),
                    error: self.failed.get(&vip).cloned(),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
