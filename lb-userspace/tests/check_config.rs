//! `lb check-config` as a script sees it: exit codes and messages.

use std::process::Command;

fn check(text: &str) -> (Option<i32>, String, String) {
    let dir = std::env::temp_dir().join(format!("lb-check-{}-{}", std::process::id(), text.len()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("lb.toml");
    std::fs::write(&file, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_lb"))
        .arg("check-config")
        .arg(&file)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_valid_file_exits_0() {
    let (code, stdout, _) = check(
        "[lb]\ninterfaces = [\"eth1\"]\n[[service]]\nname = \"web\"\nvip = \"10.100.0.1:80\"\nbackends = [{ address = \"10.0.2.2:8080\" }]\n",
    );
    assert_eq!(code, Some(0));
    assert!(stdout.contains("ok (1 services)"), "{stdout}");
    // Defaults: timeout 2 s, interval 2 s, thresholds 3: 2×3 + 2×2 = 10 s both ways (at most).
    assert!(
        stdout.contains("web: tcp check, failure window 10s, success window at most 10s"),
        "{stdout}"
    );
}

#[test]
fn an_invalid_file_lists_every_problem_and_exits_64() {
    let (code, _, stderr) = check(
        "[lb]\ninterfaces = [\"eth1\"]\nxdp_mode = \"fast\"\n[[service]]\nname = \"web\"\nvip = \"10.100.0.1:80\"\nbackends = [{ address = \"10.0.2.2:8080\" }, { address = \"10.0.3.2:70000\" }]\n",
    );
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr.contains("  lb.xdp_mode: expected one of auto, native, skb, got \"fast\""),
        "{stderr}"
    );
    assert!(
        stderr.contains("  service[0].backends[1].address: invalid port 70000"),
        "{stderr}"
    );
}

#[test]
fn a_missing_file_exits_64() {
    let out = Command::new(env!("CARGO_BIN_EXE_lb"))
        .args(["check-config", "/nonexistent/lb.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read /nonexistent/lb.toml"));
}

#[test]
fn stats_without_a_daemon_says_so_and_exits_69() {
    // Port 9 on loopback: nothing listens there in the test environment.
    let out = Command::new(env!("CARGO_BIN_EXE_lb"))
        .args(["stats", "--api", "127.0.0.1:9"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{stderr}");
    assert!(stderr.contains("is `lb run` running"), "{stderr}");
}
