//! `cargo xtask`: orchestration only. Every command first makes sure the toolchain and the
//! packages it needs are there, installing what is missing.

mod bench;
mod cycles;
mod dist;
mod setup;

use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "lb project tasks")]
struct Args {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what is missing: pinned toolchains, rust-src, bpf-linker, Debian packages.
    Setup,
    /// Build the XDP object and the `lb` binary.
    Build {
        #[arg(long)]
        release: bool,
    },
    /// Run `lb run --config FILE` (as root) with a freshly built binary.
    Run {
        #[arg(long)]
        release: bool,
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Build a sandbox in network namespaces, run lb on it and show what it does.
    Demo {
        /// No pauses; for CI and scripts.
        #[arg(long)]
        unattended: bool,
        /// Three lb hosts behind an ECMP router running BIRD: route health injection, a host
        /// dying with streams going on, a VIP withdrawn.
        #[arg(long)]
        cluster: bool,
    },
    /// Benchmarks (root): datapath cost per packet, packet rate against an XDP bounce, end to end
    /// against direct routing, nftables DNAT, HAProxy and nginx, health checking (cost; detection
    /// beside HAProxy), Maglev. Report and charts in target/bench/; a full run also writes
    /// BENCHMARKS.md and docs/bench/.
    Bench {
        /// One round and short runs, for development; writes only target/bench/.
        #[arg(long)]
        quick: bool,
        /// End-to-end rounds (default 5; 1 with --quick).
        #[arg(long)]
        rounds: Option<u32>,
        /// A Katran source checkout: lb-bench builds its XDP balancer (installing clang and llvm)
        /// and times it beside lb in the same loop (established flow, the same SYN created anew,
        /// a new flow into cold tables).
        #[arg(long, value_name = "DIR")]
        katran: Option<PathBuf>,
        /// Extra arguments for lb-bench (e.g. --iterations 50000), after `--`.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// The packet fuzzer (root): seeded random and mutated frames through the XDP program,
    /// each judged (verdict, counters, unchanged frames, checksums, destinations).
    Fuzz {
        /// Frames to run.
        #[arg(long, default_value_t = 10_000_000)]
        packets: usize,
        /// Seed of the run (printed; repeat a failing run with it).
        #[arg(long)]
        seed: Option<u64>,
    },
    /// Build the Debian package (target/dist/lb_VERSION_ARCH.deb): the release binary, the
    /// systemd unit, an example /etc/lb/lb.toml, completions and man pages.
    Dist {
        /// Package this lb binary instead of building a release one.
        #[arg(long)]
        binary: Option<PathBuf>,
        /// Where the .deb goes (default target/dist).
        #[arg(long)]
        out_dir: Option<PathBuf>,
    },
    /// Fail on a module import cycle in lb-userspace, lb-ebpf or lb-common: `crate::` and
    /// `super::` paths between sibling modules, at every folder level.
    Cycles,
    /// Write the docs generated from the code: docs/configuration.md, docs/config.schema.json
    /// and docs/metrics.md (the test command fails while a checked-in one is stale).
    Docs,
    /// Formatting and lint checks, the import-cycle check, unit tests and the root integration
    /// tests.
    Test {
        /// Extra arguments for `cargo test` (e.g. a test name filter), after `--`.
        #[arg(last = true)]
        cargo_args: Vec<String>,
    },
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let root = workspace_root()?;
    match args.task {
        Task::Setup => setup::ensure(&root, setup::Need::Everything),
        Task::Build { release } => {
            setup::ensure(&root, setup::Need::Build)?;
            build(&root, release).map(drop)
        }
        Task::Run { release, config } => {
            setup::ensure(&root, setup::Need::Build)?;
            require_root("lb run")?;
            let lb = build(&root, release)?;
            run(Command::new(lb).arg("run").arg("--config").arg(config))
        }
        Task::Demo {
            unattended,
            cluster,
        } => {
            setup::ensure(&root, setup::Need::Everything)?;
            require_root("the demo (network namespaces, XDP)")?;
            let lb = build(&root, false)?;
            let mut cmd = cargo(&root);
            cmd.args([
                "run",
                "--quiet",
                "--package",
                "lb-tests",
                "--bin",
                "lb-demo",
                "--",
            ]);
            if unattended {
                cmd.arg("--unattended");
            }
            if cluster {
                cmd.arg("--cluster");
            }
            run(cmd.env("LB_BIN", lb))
        }
        Task::Bench {
            quick,
            rounds,
            katran,
            args,
        } => {
            setup::ensure(&root, setup::Need::Everything)?;
            require_root("the benchmarks (network namespaces, XDP, servers in namespaces)")?;
            bench::bench(&root, quick, rounds, katran.as_deref(), &args)
        }
        Task::Fuzz { packets, seed } => {
            setup::ensure(&root, setup::Need::Build)?;
            require_root("the fuzzer (a network namespace, BPF_PROG_TEST_RUN)")?;
            let mut cmd = cargo(&root);
            cmd.args([
                "run",
                "--quiet",
                "--release",
                "--package",
                "lb-tests",
                "--bin",
                "lb-fuzz",
                "--",
                "--packets",
                &packets.to_string(),
            ]);
            if let Some(seed) = seed {
                cmd.args(["--seed", &seed.to_string()]);
            }
            run(&mut cmd)
        }
        Task::Dist { binary, out_dir } => {
            let lb = match binary {
                Some(lb) => lb,
                None => {
                    setup::ensure(&root, setup::Need::Build)?;
                    build(&root, true)?
                }
            };
            let out_dir = out_dir.unwrap_or_else(|| root.join("target").join("dist"));
            std::fs::create_dir_all(&out_dir)
                .with_context(|| format!("creating {}", out_dir.display()))?;
            dist::package(&root, &lb, &out_dir).map(drop)
        }
        Task::Cycles => cycles::check(&root),
        // The tests that compare each generated file with the checked-in one write it instead
        // under LB_WRITE_DOCS: one generator, no second code path.
        Task::Docs => {
            setup::ensure(&root, setup::Need::Build)?;
            run(cargo(&root)
                .args([
                    "test",
                    "--quiet",
                    "--package",
                    "lb-userspace",
                    "--lib",
                    "--",
                ])
                .arg("generated_doc_")
                .env("LB_WRITE_DOCS", "1"))
        }
        Task::Test { cargo_args } => {
            setup::ensure(&root, setup::Need::Everything)?;
            require_root("the integration tests (network namespaces, XDP)")?;
            test(&root, &cargo_args)
        }
    }
}

fn test(root: &Path, cargo_args: &[String]) -> anyhow::Result<()> {
    step("cargo fmt --check");
    run(cargo(root).args(["fmt", "--all", "--", "--check"]))?;
    step("cargo clippy -D warnings");
    run(cargo(root).args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    step("import cycles");
    cycles::check(root)?;
    let lb = build(root, false)?;
    step("cargo test");
    let mut child = cargo(root)
        .args(["test", "--workspace", "--no-fail-fast", "--"])
        .args(cargo_args)
        .env("LB_BIN", lb)
        // The package test builds the .deb through this very binary.
        .env(
            "LB_XTASK",
            std::env::current_exe().context("xtask's own path")?,
        )
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start cargo test")?;
    // Echo the output and add up every binary's "test result:" line, so the run ends with one
    // total (cargo's own last line is often a doc-test binary with 0 tests).
    let mut total = Totals::default();
    for line in BufReader::new(child.stdout.take().context("cargo test stdout")?).lines() {
        let line = line?;
        println!("{line}");
        total.add(&line);
    }
    let status = child.wait()?;
    println!(
        "total: {} passed, {} failed, {} skipped",
        total.passed, total.failed, total.ignored
    );
    if !status.success() {
        bail!("cargo test failed: {status}");
    }
    if total.passed == 0 {
        bail!("no test ran");
    }
    Ok(())
}

#[derive(Default)]
struct Totals {
    passed: u64,
    failed: u64,
    ignored: u64,
}

impl Totals {
    /// Adds `test result: ok. 3 passed; 0 failed; 1 ignored; ...`.
    fn add(&mut self, line: &str) {
        let Some(rest) = line.strip_prefix("test result: ") else {
            return;
        };
        for part in rest.split(['.', ';']) {
            let mut words = part.split_whitespace();
            let (Some(n), Some(what)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(n) = n.parse::<u64>() else { continue };
            match what {
                "passed" => self.passed += n,
                "failed" => self.failed += n,
                "ignored" => self.ignored += n,
                _ => {}
            }
        }
    }
}

/// Builds lb (and with it the XDP object) and returns the binary's path.
fn build(root: &Path, release: bool) -> anyhow::Result<PathBuf> {
    step(if release {
        "cargo build --release"
    } else {
        "cargo build"
    });
    let mut cmd = cargo(root);
    cmd.args(["build", "--package", "lb-userspace", "--bin", "lb"]);
    if release {
        cmd.arg("--release");
    }
    run(&mut cmd)?;
    let lb = root
        .join("target")
        .join(if release { "release" } else { "debug" })
        .join("lb");
    Ok(lb)
}

fn cargo(root: &Path) -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(root);
    cmd
}

fn workspace_root() -> anyhow::Result<PathBuf> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    Ok(manifest
        .parent()
        .context("xtask has no parent directory")?
        .to_path_buf())
}

fn require_root(what: &str) -> anyhow::Result<()> {
    if !setup::is_root() {
        bail!("{what} needs root: run it as root (e.g. `sudo -E cargo xtask ...`)");
    }
    Ok(())
}

pub(crate) fn step(what: &str) {
    eprintln!("\x1b[1m==> {what}\x1b[0m");
}

/// Runs `cmd` and returns its standard output, trailing whitespace trimmed.
pub(crate) fn output(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_owned())
}

pub(crate) fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}
