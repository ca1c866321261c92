//! lb: an XDP L4 load balancer. The library holds the daemon, the CLI and the parts the
//! integration tests drive directly (config, dataplane).

pub mod addr_table;
pub mod announce;
pub mod api;
pub mod balancer;
pub mod cli;
pub mod client;
pub mod config;
pub mod daemon;
pub mod dataplane;
pub mod decap;
#[cfg(test)]
mod docs_check;
pub mod entries;
pub mod events;
#[cfg(test)]
mod generated;
pub mod health;
pub mod maglev;
pub mod manual;
pub mod model;
pub mod netns;
pub mod quic_table;
pub mod resources;
pub mod rtnl;
pub mod source;
pub mod synproxy_auto;
pub mod trace;
pub mod tunnels;

/// Locks `m` even if a thread panicked while holding it. No request may take the daemon down:
/// a panic is caught where it happens (and reported), and what the lock guards stays usable
/// for every later request instead of failing each of them.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Exit codes scripts can rely on.
pub mod exit {
    /// Runtime failure.
    pub const FAILURE: i32 = 1;
    /// Command-line usage (clap's own code, and requests found impossible after parsing).
    pub const USAGE: i32 = 2;
    /// The configuration or request is invalid (also a rejected reload): nothing was changed.
    pub const CONFIG: i32 = 64;
    /// The daemon's control API could not be reached.
    pub const UNAVAILABLE: i32 = 69;
    /// The daemon does not know the service or backend named.
    pub const NOT_FOUND: i32 = 3;
    /// The daemon refused an admin request: token missing or wrong.
    pub const NOPERM: i32 = 77;
    /// A configuration change was made to another version than the one running (If-Match, a
    /// file edited by hand, or it exists already): read the configuration again and retry.
    pub const CONFLICT: i32 = 75;
}
