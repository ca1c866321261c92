//! Builds the XDP objects (lb-ebpf's binaries: the balancer `lb-xdp`, the decapsulator
//! `lb-decap`) with the pinned nightly and the project-local bpf-linker, into OUT_DIR, where
//! `dataplane::object()` and `decap::object()` include them.
//!
//! `LB_EBPF_STUB=1` writes empty objects instead, so that `cargo check` / `clippy` work without
//! the eBPF toolchain; loading such a build fails with a message saying so.

use std::{env, fs, path::PathBuf};

use anyhow::{Context as _, anyhow, bail};

fn main() -> anyhow::Result<()> {
    println!("cargo::rerun-if-env-changed=LB_EBPF_STUB");
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    if env::var_os("LB_EBPF_STUB").is_some_and(|v| v == "1") {
        fs::write(out_dir.join("lb-xdp"), b"")?;
        fs::write(out_dir.join("lb-decap"), b"")?;
        return Ok(());
    }

    let metadata = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let toolchain = metadata.workspace_metadata["lb"]["ebpf-toolchain"]
        .as_str()
        .ok_or_else(|| anyhow!("[workspace.metadata.lb] ebpf-toolchain missing in Cargo.toml"))?
        .to_owned();
    let tools_bin = metadata.workspace_root.join(".tools").join("bin");
    if !tools_bin.join("bpf-linker").exists() {
        bail!(
            "bpf-linker is not installed in {tools_bin}: run `cargo xtask setup` \
             (or set LB_EBPF_STUB=1 to build without the XDP program, e.g. for clippy)"
        );
    }
    // The nightly's rustc finds bpf-linker on PATH; put the project's own first.
    let path = env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![tools_bin.into_std_path_buf()];
    paths.extend(env::split_paths(&path));
    // SAFETY: build scripts are single-threaded here; the variable is read by the child cargo.
    unsafe { env::set_var("PATH", env::join_paths(paths)?) };
    println!(
        "cargo::rerun-if-changed={}",
        metadata.workspace_root.join(".tools/bin/bpf-linker")
    );

    let ebpf = metadata
        .packages
        .iter()
        .find(|p| p.name.as_str() == "lb-ebpf")
        .ok_or_else(|| anyhow!("lb-ebpf package not found"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("no parent for {}", ebpf.manifest_path))?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "lb-ebpf",
            root_dir: root_dir.as_str(),
            ..Default::default()
        }],
        aya_build::Toolchain::Custom(&toolchain),
    )
}
