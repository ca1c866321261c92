//! The daemon's own resources: the open-file limit it raises at start, and what ran short at run
//! time (API connections over the cap, accept and probe failures for lack of descriptors or
//! buffers). A local shortage is never a verdict against a backend; it is counted here, shown in
//! the status and the metrics, and logged and evented (at most once per [`REPORT_EVERY`] per
//! place, so a storm of them does not flood the log).

use std::{
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use crate::model::ResourceStatus;

/// Connections the control API serves at once. Beyond it, a new connection closes the oldest
/// idle one (no request in progress), or is closed itself when none is idle.
pub const MAX_API_CONNECTIONS: usize = 256;

/// Probes in flight at most (each may hold a socket); a probe due beyond waits in the
/// scheduler's queue for a free place (its window sees a later result, never a wrong one).
pub const MAX_PROBES_IN_FLIGHT: usize = 4096;

/// Descriptors the daemon wants: one per probe in flight (tcp-connect, http, udp sockets), the
/// API's connections, and room for the datapath's maps, raw sockets and the rest.
pub const WANTED_FILES: u64 = MAX_PROBES_IN_FLIGHT as u64 + MAX_API_CONNECTIONS as u64 + 1024;

/// Least time between two reports (log line and event) of the same shortage.
pub const REPORT_EVERY: Duration = Duration::from_secs(10);

#[derive(Debug, Default)]
pub struct Resources {
    /// The open-file limit in force after start.
    pub fd_limit: AtomicU64,
    pub api_connections: AtomicU64,
    /// Idle connections closed to admit a new one.
    pub api_evicted: AtomicU64,
    /// New connections closed at once: the cap was reached with no idle one to close.
    pub api_refused: AtomicU64,
    /// accept() failures (out of descriptors, buffers).
    pub accept_errors: AtomicU64,
    /// Probes that failed here rather than at the target: not counted against the backend.
    pub probe_local_failures: AtomicU64,
    /// When each place last reported.
    reported: Mutex<Vec<(&'static str, Instant)>>,
}

impl Resources {
    pub fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether a shortage at `place` should be logged and evented now (once per REPORT_EVERY).
    pub fn should_report(&self, place: &'static str, now: Instant) -> bool {
        let mut reported = crate::lock(&self.reported);
        match reported.iter_mut().find(|(p, _)| *p == place) {
            Some((_, last)) if now.saturating_duration_since(*last) < REPORT_EVERY => false,
            Some((_, last)) => {
                *last = now;
                true
            }
            None => {
                reported.push((place, now));
                true
            }
        }
    }

    pub fn status(&self) -> ResourceStatus {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ResourceStatus {
            fd_limit: get(&self.fd_limit),
            api_connections: get(&self.api_connections),
            api_connections_max: MAX_API_CONNECTIONS as u64,
            api_evicted_total: get(&self.api_evicted),
            api_refused_total: get(&self.api_refused),
            accept_errors_total: get(&self.accept_errors),
            probe_local_failures_total: get(&self.probe_local_failures),
        }
    }
}

/// Whether `e` is this host running short (descriptors, buffers, memory, local ports) rather
/// than anything about the peer.
pub fn is_local_shortage(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM | libc::EADDRNOTAVAIL)
    )
}

/// Raises the open-file limit to [`WANTED_FILES`] (the soft limit up to the hard one, and the
/// hard one too where allowed: CAP_SYS_RESOURCE). Returns the limit in force and, when it is
/// short of the wanted one, a warning to log.
pub fn raise_fd_limit() -> (u64, Option<String>) {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid pointer to a rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        return (
            0,
            Some(format!("getrlimit: {}", std::io::Error::last_os_error())),
        );
    }
    if rl.rlim_cur >= WANTED_FILES {
        return (rl.rlim_cur, None);
    }
    for (cur, max) in [
        (WANTED_FILES, rl.rlim_max.max(WANTED_FILES)),
        (WANTED_FILES.min(rl.rlim_max), rl.rlim_max),
    ] {
        let new = libc::rlimit {
            rlim_cur: cur,
            rlim_max: max,
        };
        // SAFETY: a valid pointer to a rlimit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } == 0 {
            let short = (cur < WANTED_FILES).then(|| {
                format!(
                    "open-file limit {cur} is below the {WANTED_FILES} lb wants (probes in flight, \
                     API connections, maps): raise LimitNOFILE / ulimit -n, or grant CAP_SYS_RESOURCE"
                )
            });
            return (cur, short);
        }
    }
    (
        rl.rlim_cur,
        Some(format!(
            "cannot raise the open-file limit {} to {WANTED_FILES}: {}",
            rl.rlim_cur,
            std::io::Error::last_os_error()
        )),
    )
}

/// An OS error as words: "too many open files" rather than "Too many open files (os error 24)".
pub fn os_error_text(e: &std::io::Error) -> String {
    let text = e.to_string();
    let text = match text.rfind(" (os error ") {
        Some(i) => &text[..i],
        None => &text,
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shortage_is_reported_once_per_period_and_place() {
        let r = Resources::default();
        let t = Instant::now();
        assert!(r.should_report("api", t));
        assert!(!r.should_report("api", t + Duration::from_secs(1)));
        assert!(r.should_report("probe", t + Duration::from_secs(1)));
        assert!(r.should_report("api", t + REPORT_EVERY));
    }

    #[test]
    fn shortages_are_told_from_peer_errors() {
        let e = std::io::Error::from_raw_os_error;
        assert!(is_local_shortage(&e(libc::EMFILE)));
        assert!(is_local_shortage(&e(libc::ENOBUFS)));
        assert!(!is_local_shortage(&e(libc::ECONNREFUSED)));
        assert!(!is_local_shortage(&e(libc::EHOSTUNREACH)));
        assert!(!is_local_shortage(&std::io::ErrorKind::TimedOut.into()));
    }
}
