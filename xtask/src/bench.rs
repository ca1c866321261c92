//! `cargo xtask bench`: installs the peers the benchmark compares lb with (only it needs them),
//! builds the release binaries, then runs lb-bench (datapath cost), lb-health-bench (checking
//! cost) and peer_bench (packet rate, end to end against direct/nft/HAProxy/nginx, detection
//! beside HAProxy, Maglev), which writes target/bench/report.md and its charts; a full run also
//! publishes them as BENCHMARKS.md and docs/bench/.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::Context as _;

use crate::{build, cargo, run, step};

/// Debian packages (a file they install) used only by the benchmark: installed here rather than
/// by `cargo xtask setup`, so the tests and the demo do not pull in servers.
const PACKAGES: &[(&str, &str)] = &[
    ("haproxy", "/usr/sbin/haproxy"),
    ("nginx", "/usr/sbin/nginx"),
    (
        "libnginx-mod-stream",
        "/usr/lib/nginx/modules/ngx_stream_module.so",
    ),
    ("iperf3", "/usr/bin/iperf3"),
    ("wrk", "/usr/bin/wrk"),
    // The charts' text (read by ab_glyph; no fontconfig/freetype).
    (
        "fonts-dejavu-core",
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    ),
];

/// What building Katran's balancer (`--katran`) needs: clang, llc, the kernel's UAPI headers.
const KATRAN_PACKAGES: &[(&str, &str)] = &[
    ("clang", "/usr/bin/clang"),
    ("llvm", "/usr/bin/llc"),
    ("linux-libc-dev", "/usr/include/linux/in.h"),
];

/// Services of those packages that must not run on the host: the benchmark starts its own
/// instances inside namespaces.
const SERVICES: &[&str] = &["haproxy", "nginx", "iperf3"];

fn ensure_packages(packages: &[(&str, &str)]) -> anyhow::Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .filter(|(_, file)| !Path::new(file).exists())
        .map(|(pkg, _)| *pkg)
        .collect();
    if missing.is_empty() {
        eprintln!(
            "ok: benchmark packages {}",
            packages.iter().map(|p| p.0).collect::<Vec<_>>().join(" ")
        );
        return Ok(());
    }
    step(&format!(
        "installing benchmark packages: {} (their services are not started)",
        missing.join(" ")
    ));
    crate::setup::install_without_services(&missing, SERVICES)
}

fn shown(root: &Path, p: &Path) -> String {
    p.strip_prefix(root).unwrap_or(p).display().to_string()
}

/// Runs one benchmark binary from the workspace root and records its command line.
fn run_bin(
    root: &Path,
    bin: &Path,
    args: &[String],
    lb: &Path,
    ran: &mut Vec<String>,
) -> anyhow::Result<()> {
    let line = std::iter::once(shown(root, bin))
        .chain(args.iter().map(|a| {
            if a.contains(' ') {
                format!("'{a}'")
            } else {
                a.clone()
            }
        }))
        .collect::<Vec<_>>()
        .join(" ");
    step(&line);
    run(Command::new(bin)
        .args(args)
        .current_dir(root)
        .env("LB_BIN", lb))?;
    ran.push(line);
    Ok(())
}

pub fn bench(
    root: &Path,
    quick: bool,
    rounds: Option<u32>,
    katran: Option<&Path>,
    datapath_args: &[String],
) -> anyhow::Result<()> {
    ensure_packages(PACKAGES)?;
    // Absolute: lb-bench runs from the workspace root, the path was given from anywhere.
    let katran = match katran {
        Some(dir) => {
            ensure_packages(KATRAN_PACKAGES)?;
            Some(
                std::fs::canonicalize(dir)
                    .with_context(|| format!("--katran {}: no such directory", dir.display()))?,
            )
        }
        None => None,
    };
    let lb = build(root, true)?;
    step("cargo build --release --package lb-tests --bins");
    run(cargo(root).args(["build", "--release", "--package", "lb-tests", "--bins"]))?;
    let bin = root.join("target").join("release");
    let out = root.join("target").join("bench");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let started = Instant::now();
    let mut ran = Vec::new();
    let path = |p: PathBuf| shown(root, &p);

    let mut args = vec!["--out".to_owned(), path(out.join("datapath.md"))];
    if quick && datapath_args.is_empty() {
        // A tenth of the many-flows rows' live flows (a million took 8 to 11 s to make here).
        args.extend(["--iterations", "2000", "--live-flows", "100000"].map(String::from));
    }
    if let Some(dir) = &katran {
        args.extend(["--katran".to_owned(), dir.display().to_string()]);
    }
    args.extend_from_slice(datapath_args);
    run_bin(root, &bin.join("lb-bench"), &args, &lb, &mut ran)?;

    let mut args = vec!["--out".to_owned(), path(out.join("health.md"))];
    if quick {
        args.extend(["--seconds", "3", "--rounds", "1"].map(String::from));
    }
    run_bin(root, &bin.join("lb-health-bench"), &args, &lb, &mut ran)?;

    let mut args = vec![
        "--out-dir".to_owned(),
        path(out.clone()),
        "--datapath".into(),
        path(out.join("datapath.md")),
        "--health".into(),
        path(out.join("health.md")),
    ];
    if quick {
        args.push("--quick".into());
    } else {
        args.extend(["--publish".into(), "BENCHMARKS.md".into()]);
    }
    if let Some(n) = rounds {
        args.extend(["--rounds".into(), n.to_string()]);
    }
    for r in &ran {
        args.extend(["--ran".into(), r.clone()]);
    }
    args.extend([
        "--before-s".into(),
        format!("{:.1}", started.elapsed().as_secs_f64()),
    ]);
    run(Command::new(bin.join("peer_bench"))
        .args(&args)
        .current_dir(root)
        .env("LB_BIN", &lb))?;
    eprintln!(
        "benchmarks done in {:.1} min (builds excluded): {}{}",
        started.elapsed().as_secs_f64() / 60.0,
        shown(root, &out.join("report.md")),
        if quick {
            ""
        } else {
            ", BENCHMARKS.md, docs/bench/"
        }
    );
    Ok(())
}
