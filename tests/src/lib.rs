//! The test kit: RAII network namespaces and veth pairs that always clean up, a packet builder,
//! and a fixture runner over BPF_PROG_TEST_RUN. Used by the root integration tests and the demo.

pub mod bench;
pub mod bird;
pub mod cluster;
pub mod config_mutations;
pub mod daemon;
pub mod decap;
pub mod dns;
pub mod etcd;
pub mod fixture;
pub mod flood;
pub mod inproc;
pub mod live;
pub mod netns;
pub mod packet;
pub mod packet_fuzz;
pub mod quic;
pub mod relay;
pub mod rng;
pub mod routewatch;
pub mod servers;
pub mod testnet;
pub mod topology;
pub mod traffic;
pub mod webcheck;

use std::path::PathBuf;

/// The `lb` binary under test: `$LB_BIN` (set by `cargo xtask test`), else the one next to the
/// test executable's directory (target/debug/lb).
pub fn lb_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("LB_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().expect("exe dir");
    let dir = if dir.ends_with("deps") {
        dir.parent().expect("target dir")
    } else {
        dir
    };
    let lb = dir.join("lb");
    assert!(
        lb.exists(),
        "{} not found: build it (`cargo xtask build`) or set LB_BIN",
        lb.display()
    );
    lb
}

/// Held by a test whose assertions are timing bounds (detection within a failure window,
/// ejections that last a given time): such tests of one binary run one at a time, so that on a
/// 2-CPU machine one's probes and daemons do not delay another's. (Test binaries already run
/// one after the other.)
pub fn timing_sensitive() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // A test that failed while holding it must not fail the others.
    ONE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Panics with a clear message unless running as root: these tests create namespaces and load
/// XDP programs, and a silent skip would hide that they did not run.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        panic!("this test needs root (network namespaces, XDP): run `cargo xtask test` as root");
    }
}
