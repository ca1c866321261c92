//! `cargo xtask dist`: the Debian package, built with `dpkg-deb` (Debian's own tool, on every
//! Debian host: no cargo-deb to compile first). It holds the `lb` binary, the systemd unit and
//! an example `/etc/lb/lb.toml` from `xtask/dist/`, and the completions and man pages that the
//! binary itself prints (`lb completions`, `lb man`), so they match the CLI they describe.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Context as _;

use crate::{output, run, step};

/// Where each completion script goes, by shell (the paths Debian's shells read).
const COMPLETIONS: &[(&str, &str)] = &[
    ("bash", "usr/share/bash-completion/completions/lb"),
    ("zsh", "usr/share/zsh/vendor-completions/_lb"),
    ("fish", "usr/share/fish/vendor_completions.d/lb.fish"),
];

const UNIT: &str = "usr/lib/systemd/system/lb.service";
const CONFIG: &str = "etc/lb/lb.toml";

/// Builds `lb_VERSION_ARCH.deb` of `lb` (a built binary) into `out_dir`; returns its path.
pub(crate) fn package(root: &Path, lb: &Path, out_dir: &Path) -> anyhow::Result<PathBuf> {
    let version = env!("CARGO_PKG_VERSION");
    let arch = output(Command::new("dpkg").arg("--print-architecture"))?;
    let name = format!("lb_{version}_{arch}");
    let stage = out_dir.join(&name);
    if stage.exists() {
        fs::remove_dir_all(&stage).with_context(|| format!("removing {}", stage.display()))?;
    }
    step(&format!("staging {}", stage.display()));
    let dist = root.join("xtask").join("dist");
    install(&stage, lb, "usr/bin/lb", 0o755)?;
    // As Debian's dh_strip: no debug information in the package.
    run(Command::new("strip")
        .arg("--strip-debug")
        .arg(stage.join("usr/bin/lb")))?;
    install(&stage, &dist.join("lb.service"), UNIT, 0o644)?;
    install(&stage, &dist.join("lb.toml"), CONFIG, 0o644)?;
    install(
        &stage,
        &root.join("README.md"),
        "usr/share/doc/lb/README.md",
        0o644,
    )?;
    // The pages README.md links to, at the same relative paths, and the config's JSON Schema.
    let mut docs: Vec<PathBuf> = fs::read_dir(root.join("docs"))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    docs.retain(|p| p.extension().is_some_and(|e| e == "md" || e == "json"));
    docs.sort();
    for doc in docs {
        let name = doc
            .file_name()
            .context("a docs/ file name")?
            .to_string_lossy();
        install(
            &stage,
            &doc,
            &format!("usr/share/doc/lb/docs/{name}"),
            0o644,
        )?;
    }
    write(&stage, "usr/share/doc/lb/copyright", &copyright(), 0o644)?;
    for (shell, path) in COMPLETIONS {
        let script = output(Command::new(lb).args(["completions", shell]))?;
        write(&stage, path, &(script + "\n"), 0o644)?;
    }
    let man = stage.join("usr/share/man/man1");
    run(Command::new(lb).arg("man").arg("--out-dir").arg(&man))?;
    // Debian ships man pages compressed, reproducibly (-n: no name or time stamp).
    let mut gzip = Command::new("gzip");
    gzip.arg("-9nf");
    for page in fs::read_dir(&man)? {
        gzip.arg(page?.path());
    }
    run(&mut gzip)?;

    let installed_kib = du_kib(&stage)?;
    write(
        &stage,
        "DEBIAN/control",
        &control(version, &arch, installed_kib),
        0o644,
    )?;
    write(&stage, "DEBIAN/conffiles", &format!("/{CONFIG}\n"), 0o644)?;
    write(&stage, "DEBIAN/postinst", POSTINST, 0o755)?;
    write(&stage, "DEBIAN/prerm", PRERM, 0o755)?;
    write(&stage, "DEBIAN/postrm", POSTRM, 0o755)?;

    let deb = out_dir.join(format!("{name}.deb"));
    step(&format!("dpkg-deb --build {}", deb.display()));
    run(Command::new("dpkg-deb")
        .args(["--root-owner-group", "-Zxz", "--build"])
        .arg(&stage)
        .arg(&deb))?;
    fs::remove_dir_all(&stage)?;
    println!("{}", deb.display());
    Ok(deb)
}

fn control(version: &str, arch: &str, installed_kib: u64) -> String {
    format!(
        "Package: lb\n\
         Version: {version}\n\
         Architecture: {arch}\n\
         Maintainer: lb developers <lb@localhost>\n\
         Installed-Size: {installed_kib}\n\
         Depends: libc6, libgcc-s1, iproute2\n\
         Suggests: bird2\n\
         Section: net\n\
         Priority: optional\n\
         Description: XDP L4 load balancer with active and passive health checking\n \
         lb forwards TCP and UDP flows of virtual services to backends in an XDP program\n \
         (Maglev, a connection table, full NAT), runs half-open TCP, TCP connect, UDP,\n \
         ICMP and HTTP(S) checks and passive checks from real traffic, and serves a\n \
         control API, a status page and Prometheus metrics. Runs under systemd\n \
         (lb.service); bird2 announces VIPs in a multi-host set-up.\n"
    )
}

fn copyright() -> String {
    format!(
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\
         Upstream-Name: lb\n\n\
         Files: *\n\
         Copyright: the lb developers\n\
         License: {}\n",
        env!("CARGO_PKG_LICENSE")
    )
}

/// A new install only reloads systemd: the example config names interfaces to replace first,
/// so the unit is not started for the operator. An upgrade restarts a running lb, which
/// adopts the pinned datapath (no flow is lost).
const POSTINST: &str = "#!/bin/sh
set -e
if [ \"$1\" = configure ] && [ -d /run/systemd/system ]; then
    systemctl --system daemon-reload >/dev/null || true
    if [ -n \"$2\" ]; then
        systemctl try-restart lb.service >/dev/null || true
    fi
fi
";

/// Removing the package stops lb; an upgrade leaves it running until postinst restarts it.
const PRERM: &str = "#!/bin/sh
set -e
if [ \"$1\" = remove ] && [ -d /run/systemd/system ]; then
    systemctl stop lb.service >/dev/null || true
fi
";

const POSTRM: &str = "#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
    systemctl --system daemon-reload >/dev/null || true
fi
";

fn install(stage: &Path, from: &Path, to: &str, mode: u32) -> anyhow::Result<()> {
    let bytes = fs::read(from).with_context(|| format!("reading {}", from.display()))?;
    write_bytes(stage, to, &bytes, mode)
}

fn write(stage: &Path, to: &str, text: &str, mode: u32) -> anyhow::Result<()> {
    write_bytes(stage, to, text.as_bytes(), mode)
}

fn write_bytes(stage: &Path, to: &str, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let path = stage.join(to);
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
    fs::set_permissions(&path, fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// Installed size in KiB, as dpkg counts it (`du -sk` of the tree, DEBIAN/ not yet in it).
fn du_kib(dir: &Path) -> anyhow::Result<u64> {
    let out = output(Command::new("du").arg("-sk").arg(dir))?;
    out.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("du -sk printed {out:?}"))
}
