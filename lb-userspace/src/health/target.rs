//! What the checker, its scheduler and the daemon share about a probe target: its key (address
//! and check), its latest status, its verdicts. A module of its own so the checker and the
//! scheduler both import it and neither imports the other.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex, atomic::AtomicBool},
    time::{Duration, Instant},
};

use super::{
    probe::ProbeResult,
    window::{Counters, HealthState, Transition},
};
use crate::{
    config::{Check, CheckKind, Lb, Service},
    tunnels::Tunnel,
};

/// What a probe task stands for: its address (IPv4 or IPv6), its check and, through the
/// tunnel, the tunnel. Services whose backends share all three share the probe; a probe of the
/// same backend through the tunnel and one to its own address are two.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProbeKey {
    pub target: SocketAddr,
    pub check: Check,
    /// `check.through_tunnel` of a direct-server-return service: the probe goes to the VIP on
    /// the backend, encapsulated as the service's traffic (`target` stays the backend's address:
    /// the probe's socket connects there).
    pub tunnel: Option<Tunnel>,
}

impl ProbeKey {
    /// The probe of a service's backend; None when the service's checks are off.
    pub fn of(lb: &Lb, service: &Service, backend: SocketAddr) -> Option<Self> {
        (service.check.kind != CheckKind::None).then(|| Self {
            target: SocketAddr::new(backend.ip(), service.check.port.unwrap_or(backend.port())),
            check: service.check.clone(),
            tunnel: Tunnel::of(lb, service),
        })
    }
}

/// A probe result: every state change, and every result of the probes asked to report all
/// (those passive checks follow, see [`Checker::set_reporting`]).
#[derive(Debug, Clone)]
pub struct Verdict {
    pub probe: Arc<ProbeKey>,
    pub result: ProbeResult,
    pub transition: Option<Transition>,
}

/// The latest of one probe target, for status pages.
#[derive(Debug, Clone, Copy)]
pub struct TargetStatus {
    pub state: HealthState,
    pub counters: Counters,
    pub last_latency: Option<Duration>,
    /// The last failed probe's result (its reason), local failures aside.
    pub last_failure: Option<ProbeResult>,
    /// When the current state was entered.
    pub since: Instant,
}

/// What the scheduler shares with the rest of the daemon about one target. Laid out from a
/// cache line's start, flags first: a probe's start reads the first line only, its result the
/// first two.
#[repr(C, align(64))]
pub(super) struct TargetShared {
    /// Probe at all (traffic-triggered probing pauses idle targets).
    pub(super) active: AtomicBool,
    /// Send every result, not only state changes.
    pub(super) report: AtomicBool,
    pub(super) status: Mutex<TargetStatus>,
}
