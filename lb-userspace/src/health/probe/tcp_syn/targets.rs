//! What the prober keeps per target (its cached source address and link-layer path, its place in
//! the port pool), and the pool of source ports.

use std::{
    net::{IpAddr, SocketAddr},
    os::fd::OwnedFd,
    time::{Duration, Instant},
};

use foldhash::HashMap;

use super::socket::reserve_pooled_port;
use crate::health::probe::link::{Link, Links};

/// Source ports reserved once per prober. A target reuses a port every `POOL_PORTS` probes:
/// at one probe a second that is longer than a backend keeps a half-open connection whose RST
/// was lost (about 63 s with Linux's 5 SYN+ACK retries). One descriptor each.
pub const POOL_PORTS: usize = 64;

/// How long a target's source address is used before it is looked up again.
pub const ROUTE_TTL: Duration = Duration::from_secs(60);

/// How often a target looks its link-layer path up at most, when changes keep retiring it.
const RELOOKUP: Duration = Duration::from_secs(5);

/// A target not probed for this long is forgotten (its cached source and place in the pool).
const FORGET_AFTER: Duration = Duration::from_secs(60);

/// Where the prober keeps a target's state: probes of `SynProber::start_many` in a table under
/// their caller's place for the target (the high half of the token), which the caller keeps
/// dense and stable; `probe` futures in a map by address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Home {
    Place(usize),
    Map,
}

impl Home {
    pub(super) fn of_token(token: u64) -> Self {
        Home::Place((token >> 32) as usize)
    }
}

/// The prober's per-target state, by [`Home`].
pub(super) struct Targets {
    /// By place: the target's address and state (a place taken over by another address
    /// starts afresh).
    places: Vec<Option<(SocketAddr, Target)>>,
    map: HashMap<SocketAddr, Target>,
    /// When the targets of `probe` futures were last swept of those no longer probed.
    swept: Instant,
}

impl Default for Targets {
    fn default() -> Self {
        Self {
            places: Vec::new(),
            map: HashMap::default(),
            swept: Instant::now(),
        }
    }
}

impl Targets {
    /// The state of `addr` at `home`, created with `fresh` if there is none.
    pub(super) fn entry(
        &mut self,
        home: Home,
        addr: SocketAddr,
        fresh: impl FnOnce() -> Target,
    ) -> &mut Target {
        match home {
            Home::Map => self.map.entry(addr).or_insert_with(fresh),
            Home::Place(place) => {
                if place >= self.places.len() {
                    self.places.resize_with(place + 1, || None);
                }
                let slot = &mut self.places[place];
                if slot.as_ref().is_none_or(|(a, _)| *a != addr) {
                    *slot = Some((addr, fresh()));
                }
                &mut slot.as_mut().expect("just filled").1
            }
        }
    }

    pub(super) fn get_mut(&mut self, home: Home, addr: SocketAddr) -> Option<&mut Target> {
        match home {
            Home::Map => self.map.get_mut(&addr),
            Home::Place(place) => match self.places.get_mut(place) {
                Some(Some((a, target))) if *a == addr => Some(target),
                _ => None,
            },
        }
    }

    /// Asks the CPU to load the state at `place` ahead of its use (see `start_many`): all of
    /// it, since a probe reads the address and most fields (the link it copies lies past the
    /// second cache line), with one line more, as it need not start at a line.
    pub(super) fn prefetch(&self, place: usize) {
        if let Some(slot) = self.places.get(place) {
            crate::health::prefetch(
                slot,
                size_of::<Option<(SocketAddr, Target)>>().div_ceil(64) + 1,
            );
        }
    }

    /// Forgets, once per [`FORGET_AFTER`], the targets of `probe` futures not probed for that
    /// long. (A place is the caller's: a new target there replaces the old one.)
    pub(super) fn sweep(&mut self, now: Instant) {
        if now.saturating_duration_since(self.swept) >= FORGET_AFTER {
            self.map
                .retain(|_, t| now.saturating_duration_since(t.used) < FORGET_AFTER);
            self.swept = now;
        }
    }
}

/// What the prober keeps per target.
pub(super) struct Target {
    /// The cached source address (of the target's family) and when it was looked up.
    pub(super) source: Option<(IpAddr, Instant)>,
    /// Its last probe was answered through the kernel's path (so the kernel knows the next
    /// hop): its SYNs may take the link-layer path (IPv4 targets only: the shared state never
    /// asks for an IPv6 target's path). Cleared by a timeout or a local failure.
    pub(super) answered: bool,
    /// The link-layer path, if the last lookup found one, and when that lookup was.
    pub(super) link: Option<Link>,
    pub(super) link_at: Option<Instant>,
    /// Index in the pool of the next port to try.
    pub(super) next_port: usize,
    /// When it was last probed.
    pub(super) used: Instant,
}

/// How a target's next SYN leaves, by what its state says.
pub(super) enum Path {
    /// On this link-layer path, current and looked up less than [`ROUTE_TTL`] ago.
    Link(Link),
    /// Through the kernel's path (the raw socket).
    Kernel,
    /// Look the link-layer path up first.
    LookUp,
}

impl Target {
    /// A target first probed at `now`.
    pub(super) fn new(addr: SocketAddr, pool: &Pool, now: Instant) -> Self {
        Self {
            source: None,
            answered: false,
            link: None,
            link_at: None,
            next_port: pool.first_for(addr),
            used: now,
        }
    }

    /// The link-layer path when the target's last probe was answered and a current link to it
    /// is known; else the kernel's, or a lookup (at most once per [`ROUTE_TTL`] when there is
    /// none).
    pub(super) fn path(&self, links: &Links, now: Instant) -> Path {
        if !self.answered {
            return Path::Kernel;
        }
        let age = self.link_at.map(|at| now.saturating_duration_since(at));
        match (&self.link, age) {
            (Some(known), Some(age)) if age < ROUTE_TTL && links.current(known) => {
                Path::Link(known.clone())
            }
            // Looked up lately (perhaps just now, for this very probe): a link retired since by
            // a change is looked up again at most every RELOOKUP, so a network that keeps
            // changing cannot make lookups cost more than the path saves; none found, every
            // ROUTE_TTL. The kernel's path meanwhile.
            (Some(_), Some(age)) if age < RELOOKUP => Path::Kernel,
            (None, Some(age)) if age < ROUTE_TTL => Path::Kernel,
            _ => Path::LookUp,
        }
    }

    /// What a lookup of the link-layer path at `at` found (its source is the route's too).
    pub(super) fn learn_link(&mut self, found: Option<Link>, at: Instant) {
        if let Some(found) = &found {
            self.source = Some((IpAddr::V4(found.source), at));
        }
        self.link = found;
        self.link_at = Some(at);
    }

    /// The cached source address, if looked up less than [`ROUTE_TTL`] ago.
    pub(super) fn source(&self, now: Instant) -> Option<IpAddr> {
        self.source
            .filter(|&(_, at)| now.saturating_duration_since(at) < ROUTE_TTL)
            .map(|(source, _)| source)
    }

    /// Drops the cached source and link: the next probe looks the route up again and takes
    /// the kernel's path until it is answered.
    pub(super) fn forget_route(&mut self) {
        self.source = None;
        self.answered = false;
        self.link = None;
        self.link_at = None;
    }
}

/// The pooled source ports, shared by both families: each is reserved on every address of
/// both (see [`reserve_pooled_port`]), so a port serves IPv4 and IPv6 targets alike. The
/// sockets that reserve them live as long as this.
pub(super) struct Pool {
    ports: Vec<u16>,
    _reservations: Vec<OwnedFd>,
}

impl Pool {
    pub(super) fn new(ports: Vec<u16>, reservations: Vec<OwnedFd>) -> Self {
        Self {
            ports,
            _reservations: reservations,
        }
    }

    /// Reserves up to [`POOL_PORTS`] ports. A smaller pool (even none, if no port or
    /// descriptor is left) still works: probes that find no pooled port free reserve their own.
    pub(super) fn reserve() -> Self {
        let (mut reservations, mut ports) = (Vec::new(), Vec::new());
        for _ in 0..POOL_PORTS {
            match reserve_pooled_port() {
                Ok((fd, port)) => {
                    reservations.push(fd);
                    ports.push(port);
                }
                Err(e) => {
                    tracing::warn!(
                        "half-open probes: {} source ports pooled of {POOL_PORTS}: {e}",
                        ports.len()
                    );
                    break;
                }
            }
        }
        Self::new(ports, reservations)
    }

    /// Where a new target starts in the pool: targets start at different places.
    fn first_for(&self, addr: SocketAddr) -> usize {
        lb_common::fmix64(crate::health::address_key(addr)) as usize % self.ports.len().max(1)
    }

    /// The first pooled port from `source` that is not `busy`, walking from `*next`, which
    /// moves past the port taken; None if every one is busy.
    pub(super) fn take(
        &self,
        next: &mut usize,
        source: IpAddr,
        busy: impl Fn(SocketAddr) -> bool,
    ) -> Option<SocketAddr> {
        let n = self.ports.len();
        (0..n)
            .map(|i| (*next + i) % n)
            .find(|&i| !busy(SocketAddr::new(source, self.ports[i])))
            .map(|i| {
                *next = (i + 1) % n;
                SocketAddr::new(source, self.ports[i])
            })
    }
}

#[cfg(test)]
mod tests {
    use super::super::wire::sample::REMOTE;
    use super::*;

    #[test]
    fn a_place_holds_one_target_at_a_time() {
        let fresh = || Target {
            source: None,
            answered: false,
            link: None,
            link_at: None,
            next_port: 0,
            used: Instant::now(),
        };
        let mut targets = Targets::default();
        targets.entry(Home::Place(3), REMOTE, fresh).answered = true;
        assert!(targets.get_mut(Home::Place(3), REMOTE).unwrap().answered);
        // Not under another place, nor in the map of `probe` futures.
        assert!(targets.get_mut(Home::Place(2), REMOTE).is_none());
        assert!(targets.get_mut(Home::Map, REMOTE).is_none());
        // Another target at the place starts afresh; the first one is gone from it.
        let other = SocketAddr::new(REMOTE.ip(), 81);
        assert!(!targets.entry(Home::Place(3), other, fresh).answered);
        assert!(targets.get_mut(Home::Place(3), REMOTE).is_none());
        assert!(targets.get_mut(Home::Place(9), other).is_none());
    }
}
