//! Installs what the project needs and skips what is present, printing each step:
//! the eBPF nightly with rust-src, bpf-linker built against that nightly's own LLVM (into the
//! git-ignored `.tools/`), the Debian packages the tests and the demo use, and a Python
//! virtual environment with aioquic (`.tools/venv`) for the QUIC tests' real servers and clients.
//! The host toolchain is pinned by rust-toolchain.toml (`rustup toolchain install` installs it).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, anyhow, bail};

use crate::{output, run, step};

/// Debian packages (command they provide) the build needs: etcd-client's gRPC code is
/// generated from etcd's protocol files at build time.
const BUILD_PACKAGES: &[(&str, &str)] = &[("protobuf-compiler", "protoc")];

/// Debian packages (command they provide): the netns test kit and the demo.
const PACKAGES: &[(&str, &str)] = &[
    ("iproute2", "ip"),
    ("ethtool", "ethtool"),
    ("iputils-ping", "ping"),
    ("curl", "curl"),
    ("nftables", "nft"),
    // The SYN flood of the flood test (bounded, inside its namespaces).
    ("hping3", "hping3"),
    // The DNS backend of the binary-payload check test (the binary alone, no service).
    ("dnsmasq-base", "dnsmasq"),
    ("chromium", "chromium"),
    ("prometheus", "promtool"),
    // `cargo xtask dist` strips the packaged binary.
    ("binutils", "strip"),
    // The routing daemon of the route health injection tests: each test runs its own BIRD
    // instances inside its namespaces, never the package's service (see ensure_packages).
    ("bird2", "bird"),
    // The shared configuration store of the several-hosts tests: each test runs its own etcd
    // inside its namespaces, never the package's service.
    ("etcd-server", "etcd"),
    // `python3 -m venv` (with ensurepip) for the QUIC tests' aioquic (see ensure_quic_venv).
    ("python3-venv", "python3"),
];

/// The QUIC tests' servers and clients (tests/quic/*.py) run on aioquic, pinned: they reach
/// into how it issues connection IDs.
const AIOQUIC: &str = "aioquic";
const AIOQUIC_VERSION: &str = "1.2.0";

/// Debian's interpreter (python3-venv makes venvs of it); the venv is tied to it.
const SYSTEM_PYTHON: &str = "/usr/bin/python3";

/// Services of those packages that must not run on the host (the tests start their own).
const SERVICES: &[&str] = &["bird", "prometheus", "etcd"];

const POLICY_RC_D: &str = "/usr/sbin/policy-rc.d";

/// A `policy-rc.d` that forbids starting services while packages install; removed on drop (only
/// if we wrote it).
pub(crate) struct NoServiceStarts(bool);

impl NoServiceStarts {
    pub(crate) fn new() -> anyhow::Result<Self> {
        if Path::new(POLICY_RC_D).exists() {
            return Ok(Self(false)); // the host's own policy stays in charge
        }
        use std::os::unix::fs::PermissionsExt as _;
        let guard = Self(true);
        std::fs::write(
            POLICY_RC_D,
            "#!/bin/sh\n# written by cargo xtask during apt-get install\nexit 101\n",
        )?;
        std::fs::set_permissions(POLICY_RC_D, std::fs::Permissions::from_mode(0o755))?;
        Ok(guard)
    }
}

impl Drop for NoServiceStarts {
    fn drop(&mut self) {
        if self.0 {
            let _ = std::fs::remove_file(POLICY_RC_D); // best effort; reported by apt next time
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Toolchains and bpf-linker.
    Build,
    /// Also the packages the tests and the demo run.
    Everything,
}

struct Pins {
    toolchain: String,
    linker_version: String,
    llvm_feature: String,
}

pub fn ensure(root: &Path, need: Need) -> anyhow::Result<()> {
    let pins = read_pins(root)?;
    ensure_nightly(&pins.toolchain)?;
    ensure_bpf_linker(root, &pins)?;
    ensure_packages(BUILD_PACKAGES)?;
    if need == Need::Everything {
        ensure_packages(PACKAGES)?;
        ensure_quic_venv(root)?;
    }
    Ok(())
}

fn read_pins(root: &Path) -> anyhow::Result<Pins> {
    let meta = cargo_metadata::MetadataCommand::new()
        .manifest_path(root.join("Cargo.toml"))
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let lb = &meta.workspace_metadata["lb"];
    let get = |key: &str| {
        lb[key]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| anyhow!("[workspace.metadata.lb] {key} missing in Cargo.toml"))
    };
    Ok(Pins {
        toolchain: get("ebpf-toolchain")?,
        linker_version: get("bpf-linker")?,
        llvm_feature: get("bpf-linker-llvm-feature")?,
    })
}

fn rustup() -> Command {
    let mut cmd = Command::new("rustup");
    // Do not let the host pin (rust-toolchain.toml / RUSTUP_TOOLCHAIN) leak into nightly calls.
    cmd.env_remove("RUSTUP_TOOLCHAIN");
    cmd
}

fn ensure_nightly(toolchain: &str) -> anyhow::Result<()> {
    let installed = output(rustup().args(["toolchain", "list"]))
        .context("rustup is required (https://rustup.rs) and was not found")?;
    if installed.lines().any(|l| l.starts_with(toolchain)) {
        let components =
            output(rustup().args(["component", "list", "--installed", "--toolchain", toolchain]))?;
        if components.lines().any(|l| l.starts_with("rust-src")) {
            eprintln!("ok: {toolchain} with rust-src");
            return Ok(());
        }
        step(&format!("installing rust-src for {toolchain}"));
        return run(rustup().args(["component", "add", "rust-src", "--toolchain", toolchain]));
    }
    step(&format!(
        "installing {toolchain} (eBPF build) with rust-src"
    ));
    run(rustup().args([
        "toolchain",
        "install",
        toolchain,
        "--profile",
        "minimal",
        "--component",
        "rust-src",
    ]))
}

/// bpf-linker must be linked against the very libLLVM of the pinned nightly (a mismatch fails
/// with "Invalid record"); the stamp records which one it was built for.
fn ensure_bpf_linker(root: &Path, pins: &Pins) -> anyhow::Result<()> {
    let tools = root.join(".tools");
    let linker = tools.join("bin").join("bpf-linker");
    let sysroot_lib = PathBuf::from(
        output(rustup().args(["run", &pins.toolchain, "rustc", "--print", "sysroot"]))?.trim(),
    )
    .join("lib");
    let libllvm = fs::read_dir(&sysroot_lib)
        .with_context(|| format!("reading {}", sysroot_lib.display()))?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("libLLVM.so."))
        .ok_or_else(|| anyhow!("no libLLVM.so.* in {}", sysroot_lib.display()))?;
    let stamp_path = tools.join("bpf-linker.stamp");
    let stamp = format!(
        "bpf-linker {} {} {}\n",
        pins.linker_version,
        pins.llvm_feature,
        sysroot_lib.join(&libllvm).display()
    );
    if linker.exists() && fs::read_to_string(&stamp_path).is_ok_and(|s| s == stamp) {
        eprintln!("ok: bpf-linker {} ({libllvm})", pins.linker_version);
        return Ok(());
    }

    step(&format!(
        "building bpf-linker {} against {libllvm} into .tools/ (about 70 s)",
        pins.linker_version
    ));
    let llvm_lib = tools.join("llvm").join("lib");
    fs::create_dir_all(&llvm_lib)?;
    for name in ["libLLVM.so", libllvm.as_str()] {
        let link = llvm_lib.join(name);
        let _ = fs::remove_file(&link); // absent on a first install; replaced otherwise
        std::os::unix::fs::symlink(sysroot_lib.join(&libllvm), &link)
            .with_context(|| format!("linking {}", link.display()))?;
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    run(Command::new(cargo)
        .args([
            "install",
            &format!("bpf-linker@{}", pins.linker_version),
            "--locked",
            "--force",
            "--no-default-features",
            "--features",
            &pins.llvm_feature,
            "--root",
        ])
        .arg(&tools)
        .env("LLVM_PREFIX", tools.join("llvm")))?;
    fs::write(&stamp_path, stamp)?;
    Ok(())
}

/// A Python virtual environment at `.tools/venv` with the pinned aioquic, installed by the venv's
/// own pip (Debian's pip refuses system-wide installs). Skipped when the venv already has that
/// version; a venv that does not run (its interpreter gone) is made again.
fn ensure_quic_venv(root: &Path) -> anyhow::Result<()> {
    let venv = root.join(".tools").join("venv");
    let python = venv.join("bin").join("python");
    let installed = || {
        output(Command::new(&python).args([
            "-c",
            &format!("import importlib.metadata as m; print(m.version({AIOQUIC:?}))"),
        ]))
        .ok()
    };
    let runs = Command::new(&python)
        .args(["-c", ""])
        .output()
        .is_ok_and(|o| o.status.success());
    if runs && installed().as_deref() == Some(AIOQUIC_VERSION) {
        eprintln!("ok: {AIOQUIC} {AIOQUIC_VERSION} in .tools/venv");
        return Ok(());
    }
    if !runs {
        step("creating the Python virtual environment .tools/venv");
        fs::create_dir_all(root.join(".tools"))?;
        run(Command::new(SYSTEM_PYTHON)
            .args(["-m", "venv", "--clear"])
            .arg(&venv))
        .context("python3 -m venv (Debian's python3-venv)")?;
    }
    step(&format!(
        "installing {AIOQUIC}=={AIOQUIC_VERSION} into .tools/venv"
    ));
    run(Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .arg(format!("{AIOQUIC}=={AIOQUIC_VERSION}")))?;
    match installed() {
        Some(v) if v == AIOQUIC_VERSION => Ok(()),
        other => bail!("{AIOQUIC} in .tools/venv is {other:?} after installing {AIOQUIC_VERSION}"),
    }
}

fn ensure_packages(packages: &[(&str, &str)]) -> anyhow::Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .filter(|(pkg, _)| {
            !Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", pkg])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        })
        .map(|(pkg, _)| *pkg)
        .collect();
    if missing.is_empty() {
        eprintln!(
            "ok: packages {}",
            packages
                .iter()
                .map(|(p, _)| *p)
                .collect::<Vec<_>>()
                .join(" ")
        );
        return Ok(());
    }
    if !is_root() {
        bail!(
            "missing Debian packages: {0}\ninstall them as root: apt-get install -y {0}",
            missing.join(" ")
        );
    }
    step(&format!(
        "installing Debian packages: {}",
        missing.join(" ")
    ));
    // No service of these packages may run on the host (bird2's BIRD would take BGP's port,
    // prometheus lb's default API port :9090).
    install_without_services(&missing, SERVICES)
}

/// `apt-get install`s `packages` with no service starting while they install, then, under
/// systemd, disables (and stops) `services` so they do not start at boot either: the tests
/// and benchmarks start their own instances inside namespaces.
pub fn install_without_services(packages: &[&str], services: &[&str]) -> anyhow::Result<()> {
    {
        let _policy = NoServiceStarts::new()?;
        run(Command::new("apt-get").args(["update", "-q"]))?;
        run(Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
    }
    if Path::new("/run/systemd/system").exists() {
        let _ = Command::new("systemctl")
            .args(["disable", "--now"])
            .args(services)
            .stderr(std::process::Stdio::null())
            .status(); // a unit missing is fine
    }
    Ok(())
}

pub fn is_root() -> bool {
    unsafe extern "C" {
        fn geteuid() -> u32;
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { geteuid() == 0 }
}
