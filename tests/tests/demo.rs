//! The demo is README's first command: it must run through, unattended, on the lb under test
//! (it builds its own namespaces and removes them).

use lb_tests::{lb_bin, require_root};

#[test]
fn the_demo_runs_through() {
    require_root();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_lb-demo"))
        .arg("--unattended")
        .env("LB_BIN", lb_bin())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    // The IPv6 service too: answered, and its backend's verdicts shown.
    for step in [
        "-> unhealthy",
        "-> healthy",
        "cleaning up",
        "web6 backend-1 unhealthy",
        "[2001:db8:100::1]:80",
        // Direct server return: answered, its verdicts, the decapsulators at work.
        "web-dsr backend-1 unhealthy",
        "web-dsr backend-1 healthy",
        "lb decap took",
        // Issue 19: the reason and the timeline.
        "health timeline",
        "its last failure, as the status and the page show it: ",
    ] {
        assert!(text.contains(step), "{step}:\n{text}");
    }
}

#[test]
fn the_cluster_demo_runs_through() {
    require_root();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_lb-demo"))
        .args(["--cluster", "--unattended"])
        .env("LB_BIN", lb_bin())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    for step in [
        "announced by all three hosts",
        "nexthop via 10.2.1.2",
        "the router dropped host 1 from the route",
        "30 of 30 streams intact",
        "10.100.0.3 gone from the router's table",
        "announced -> withdrawn: api: 0 of 3 backends available",
        "cleaning up",
    ] {
        assert!(text.contains(step), "{step}:\n{text}");
    }
}
