//! lb: an XDP L4 load balancer. The library holds the daemon, the CLI and the parts the
//! integration tests drive directly (config, dataplane).

pub mod api;
pub mod balancer;
pub mod cli;
pub mod client;
pub mod config;
pub mod daemon;
pub mod dataplane;
pub mod health;
pub mod maglev;

/// Exit codes scripts can rely on.
pub mod exit {
    /// Runtime failure.
    pub const FAILURE: i32 = 1;
    /// The configuration (or command line) is invalid: nothing was changed.
    pub const CONFIG: i32 = 64;
    /// The daemon's control API could not be reached.
    pub const UNAVAILABLE: i32 = 69;
}
