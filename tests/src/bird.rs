//! BIRD 2 inside a namespace: `bird -f -c CONF -s SOCKET -P PIDFILE` with its config, control
//! socket, pid file and log in a temporary directory of its own; ended by its pid (SIGTERM,
//! then SIGKILL) and the directory removed when dropped, also when a test fails. BIRD left by a
//! killed test run (its directory names a pid that is gone) is ended on first use.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    sync::Once,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{
    daemon::TempDir,
    netns::{Netns, Process, sh, stale_entries},
};

static SWEEP: Once = Once::new();

/// Ends the BIRD instances a killed run left (their pid file in a `lbt-<dead pid>-N`
/// directory), and removes those directories.
fn sweep_stale() {
    for (name, dir) in stale_entries(&std::env::temp_dir(), "lbt-") {
        let pid_file = dir.join("bird.pid");
        let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok())
        else {
            continue;
        };
        // Only a BIRD started on this very directory's config.
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        if cmdline.contains("bird") && cmdline.contains(&*dir.to_string_lossy()) {
            eprintln!("ending BIRD {pid} left by a killed run ({name})");
            // SAFETY: signalling a process by pid.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = std::fs::remove_dir_all(&dir); // a killed run's leftovers
    }
}

pub struct Bird {
    // Dropped in this order: the process (by its pid), then its directory.
    process: Process,
    pub ns: Netns,
    pub socket: PathBuf,
    log: PathBuf,
    _dir: TempDir,
}

impl Bird {
    /// Starts BIRD in `ns` on `config`; returns once its control socket answers.
    pub fn start(ns: &Netns, config: &str) -> anyhow::Result<Self> {
        SWEEP.call_once(sweep_stale);
        let dir = TempDir::new()?;
        let conf = dir.0.join("bird.conf");
        std::fs::write(&conf, config)?;
        // Refuse a config BIRD cannot parse with its own message, before starting it.
        sh(std::process::Command::new("bird")
            .arg("-p")
            .arg("-c")
            .arg(&conf))
        .context("BIRD refused the config")?;
        let socket = dir.0.join("bird.ctl");
        let log = dir.0.join("bird.log");
        let mut cmd = ns.command("bird");
        // -f: in the foreground, so the pid is the one started (ip netns exec execs it).
        cmd.arg("-f")
            .arg("-c")
            .arg(&conf)
            .arg("-s")
            .arg(&socket)
            .arg("-P")
            .arg(dir.0.join("bird.pid"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?);
        let process = ns.spawn(&mut cmd)?;
        let mut bird = Self {
            process,
            ns: ns.clone(),
            socket,
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while bird.birdc(&["show", "status"]).is_err() {
            if !bird.process.running() {
                bail!("BIRD exited early:\n{}", bird.log_text());
            }
            if Instant::now() > deadline {
                bail!(
                    "BIRD's control socket did not answer in 10 s:\n{}",
                    bird.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(bird)
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `birdc -s SOCKET ARGS`: its output.
    pub fn birdc(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = sh(std::process::Command::new("birdc")
            .arg("-s")
            .arg(&self.socket)
            .args(args))?;
        if out.contains("Unable to connect") {
            bail!("{out}");
        }
        Ok(out)
    }

    /// Waits until protocol `name` is up (a BGP session Established).
    pub fn wait_up(&self, name: &str, limit: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            let out = self.birdc(&["show", "protocols", name])?;
            if out
                .lines()
                .any(|l| l.starts_with(name) && l.contains(" up "))
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{name} not up after {limit:?}:\n{out}\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The lb host's config: docs/bird.conf with its example addresses replaced by `host` (this
/// host's address and router id) and `router`.
pub fn host_config(host: &str, router: &str) -> anyhow::Result<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/bird.conf");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    for example in ["192.0.2.11", "neighbor 192.0.2.1 "] {
        if !text.contains(example) {
            bail!("{} no longer holds {example:?}", path.display());
        }
    }
    // The host's address first: the router's is a prefix of it.
    Ok(text
        .replace("192.0.2.11", "\u{0}HOST\u{0}")
        .replace("192.0.2.1", router)
        .replace("\u{0}HOST\u{0}", host))
}

/// A router (AS 65000) peering with one lb host (AS 65011 at `host`), installing what it learns
/// into its kernel's main table, with BFD as docs/bird.conf asks.
pub fn router_config(router: &str, host: &str) -> String {
    format!(
        "router id {router};\n\
         protocol device {{ }}\n\
         protocol bfd {{ interface \"*\" {{ interval 100 ms; multiplier 3; }}; }}\n\
         protocol kernel {{ ipv4 {{ import none; export all; }}; }}\n\
         protocol kernel {{ ipv6 {{ import none; export all; }}; }}\n\
         protocol bgp lbhost {{\n\
           local {router} as 65000;\n\
           neighbor {host} as 65011;\n\
           hold time 3; keepalive time 1; connect delay time 1; connect retry time 1;\n\
           bfd on;\n\
           ipv4 {{ import all; export none; }};\n\
           ipv6 {{ import all; export none; }};\n\
         }}\n"
    )
}
