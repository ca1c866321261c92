//! Loading the `lb-decap` object: on the maps pinned in a directory (`lb decap`), or on maps of
//! its own ([`Unpinned`], what the fixture tests run through BPF_PROG_TEST_RUN).

use std::{net::IpAddr, path::Path};

use anyhow::{Context as _, bail};
use aya::{Ebpf, EbpfLoader, maps::PerCpuArray, programs::Xdp};
use lb_common::{DECAP_MAPS, DECAP_PROGRAM_NAME, DecapParams, decap_flags, decap_map_name};

use super::{
    Destinations,
    maps::{self, Maps},
    pins,
};

/// The decapsulator's XDP object built by build.rs (empty when built with LB_EBPF_STUB=1).
pub fn object() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/lb-decap"))
}

/// Fails for an lb built without the XDP objects.
pub fn check_built() -> anyhow::Result<()> {
    if object().is_empty() {
        bail!(
            "this lb was built with LB_EBPF_STUB=1 and has no XDP program: rebuild it with \
             `cargo xtask build`"
        );
    }
    Ok(())
}

/// Loads the object, its maps those pinned in `pin_dir` (created and pinned there when
/// absent), and verifies its program; attaches nothing.
pub fn load(pin_dir: Option<&Path>) -> anyhow::Result<Ebpf> {
    check_built()?;
    let mut loader = EbpfLoader::new();
    if let Some(dir) = pin_dir {
        for name in DECAP_MAPS {
            loader.map_pin_path(name, dir.join(name));
        }
    }
    let mut ebpf = loader
        .load(object())
        .map_err(|e| pins::load_error(e, pin_dir))?;
    program_mut(&mut ebpf)?
        .load()
        .with_context(|| format!("the kernel rejected XDP program {DECAP_PROGRAM_NAME}"))?;
    Ok(ebpf)
}

/// The object's program.
pub fn program_mut(ebpf: &mut Ebpf) -> anyhow::Result<&mut Xdp> {
    Ok(ebpf
        .program_mut(DECAP_PROGRAM_NAME)
        .with_context(|| format!("program {DECAP_PROGRAM_NAME} missing from the XDP object"))?
        .try_into()?)
}

/// The parameters of GUE port `gue_port` and `destinations`.
pub fn params(gue_port: u16, destinations: &Destinations) -> DecapParams {
    DecapParams {
        gue_port: gue_port.to_be(),
        flags: match destinations {
            Destinations::Any => decap_flags::ANY_DESTINATION,
            Destinations::Host | Destinations::Listed(_) => 0,
        },
        _pad: 0,
    }
}

/// The decapsulator loaded in this process with maps of its own: nothing pinned, nothing
/// attached; everything goes when it drops.
pub struct Unpinned {
    ebpf: Ebpf,
}

impl Unpinned {
    pub fn load() -> anyhow::Result<Self> {
        Ok(Self { ebpf: load(None)? })
    }

    /// Writes the parameters and addresses as `lb decap --gue-port gue_port` would, with the
    /// addresses listed (`Destinations::Listed`) or any (`Destinations::Any`).
    pub fn configure(&mut self, gue_port: u16, destinations: &Destinations) -> anyhow::Result<()> {
        let wanted: Vec<IpAddr> = match destinations {
            Destinations::Listed(list) => list.clone(),
            Destinations::Any => Vec::new(),
            Destinations::Host => bail!("Unpinned::configure takes the addresses listed"),
        };
        Maps::of(&mut self.ebpf)?.write(&params(gue_port, destinations), &wanted)?;
        Ok(())
    }

    pub fn program(&self) -> &Xdp {
        self.ebpf
            .program(DECAP_PROGRAM_NAME)
            .and_then(|p| p.try_into().ok())
            .expect("loaded in Unpinned::load")
    }

    /// Instructions the verifier processed for the program (its limit is 1,000,000).
    pub fn verified_instructions(&self) -> Option<u32> {
        self.program()
            .info()
            .ok()
            .and_then(|i| i.verified_instruction_count())
    }

    /// The counters summed over CPUs, indexed like `lb_common::decap_counter`.
    pub fn counters(&self) -> anyhow::Result<Vec<u64>> {
        let name = decap_map_name::STATS;
        let map = self
            .ebpf
            .map(name)
            .with_context(|| format!("map {name} missing"))?;
        maps::counters(&PerCpuArray::try_from(map)?)
    }
}
