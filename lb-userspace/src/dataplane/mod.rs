//! The XDP program and its maps: load, attach, fill, read counters. Everything that touches the
//! kernel's BPF objects lives here.

mod services;
mod stats;

use std::{ffi::CString, io};

use anyhow::{Context as _, anyhow, bail};
use aya::{
    Ebpf, EbpfLoader,
    programs::{Xdp, XdpMode, xdp::XdpLinkId},
};
use lb_common::{PASS_PROGRAM_NAME, PROGRAM_NAME};
use tracing::{info, warn};

use crate::config::{self, Service};
pub use services::{ServiceEntries, service_entries};
pub use stats::{ServiceCounters, Stats};

/// The XDP object built by build.rs (empty when built with LB_EBPF_STUB=1).
pub fn object() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/lb-xdp"))
}

/// The loaded program and maps, and the interfaces it is attached to. Dropping it detaches the
/// program from every interface and frees the maps.
pub struct Dataplane {
    ebpf: Ebpf,
    attached: Vec<(String, XdpLinkId)>,
    services: u32,
}

impl Dataplane {
    /// Loads the object and verifies both programs; attaches nothing.
    pub fn load() -> anyhow::Result<Self> {
        let object = object();
        if object.is_empty() {
            bail!(
                "this lb was built with LB_EBPF_STUB=1 and has no XDP program: rebuild it with `cargo xtask build`"
            );
        }
        raise_memlock_limit();
        let mut ebpf = EbpfLoader::new()
            .load(object)
            .context("loading the XDP object")?;
        for name in [PROGRAM_NAME, PASS_PROGRAM_NAME] {
            let prog: &mut Xdp = ebpf
                .program_mut(name)
                .ok_or_else(|| anyhow!("program {name} missing from the XDP object"))?
                .try_into()?;
            prog.load()
                .with_context(|| format!("the kernel rejected XDP program {name}"))?;
        }
        Ok(Self {
            ebpf,
            attached: Vec::new(),
            services: 0,
        })
    }

    pub fn program(&self) -> &Xdp {
        self.named_program(PROGRAM_NAME)
    }

    /// The program that only passes: benchmark baseline and veth peer program.
    pub fn pass_program(&self) -> &Xdp {
        self.named_program(PASS_PROGRAM_NAME)
    }

    fn named_program(&self, name: &str) -> &Xdp {
        self.ebpf
            .program(name)
            .and_then(|p| p.try_into().ok())
            .expect("verified in load()")
    }

    /// Makes the service maps hold exactly `services` (ids are their positions).
    pub fn set_services(&mut self, services: &[Service]) -> anyhow::Result<()> {
        services::sync(&mut self.ebpf, &service_entries(services))?;
        self.services = services.len() as u32;
        Ok(())
    }

    /// Attaches the balancer to `iface` and returns the mode it runs in.
    pub fn attach(&mut self, iface: &str, mode: config::XdpMode) -> anyhow::Result<XdpMode> {
        let ifname = CString::new(iface).context("interface name")?;
        // SAFETY: `ifname` is a valid NUL-terminated string.
        let index = unsafe { libc::if_nametoindex(ifname.as_ptr()) };
        if index == 0 {
            bail!("interface {iface:?} does not exist (in this network namespace)");
        }
        let prog: &mut Xdp = self
            .ebpf
            .program_mut(PROGRAM_NAME)
            .expect("verified in load()")
            .try_into()?;
        let (id, used) = match mode {
            config::XdpMode::Skb => (attach_mode(prog, iface, index, XdpMode::Skb)?, XdpMode::Skb),
            config::XdpMode::Native => {
                let id = attach_mode(prog, iface, index, XdpMode::Driver).map_err(|e| {
                    anyhow!(
                        "{e:#}\nhint: the driver of {iface} may not support native XDP; \
                         set xdp_mode = \"skb\" (or \"auto\") in [lb]"
                    )
                })?;
                (id, XdpMode::Driver)
            }
            config::XdpMode::Auto => match attach_mode(prog, iface, index, XdpMode::Driver) {
                Ok(id) => (id, XdpMode::Driver),
                Err(e) => {
                    warn!(%iface, error = %format!("{e:#}"), "native XDP attach failed, using skb mode");
                    (attach_mode(prog, iface, index, XdpMode::Skb)?, XdpMode::Skb)
                }
            },
        };
        info!(%iface, mode = ?used, "XDP program attached");
        self.attached.push((iface.to_owned(), id));
        Ok(used)
    }

    /// Detaches from every interface (also done on drop).
    pub fn detach_all(&mut self) {
        let prog: &mut Xdp = self
            .ebpf
            .program_mut(PROGRAM_NAME)
            .expect("verified in load()")
            .try_into()
            .expect("verified in load()");
        for (iface, id) in self.attached.drain(..) {
            match prog.detach(id) {
                Ok(()) => info!(%iface, "XDP program detached"),
                Err(e) => warn!(%iface, error = %e, "detaching the XDP program failed"),
            }
        }
    }

    /// Counters summed over CPUs.
    pub fn stats(&self) -> anyhow::Result<Stats> {
        stats::read(&self.ebpf, self.services)
    }
}

fn attach_mode(
    prog: &mut Xdp,
    iface: &str,
    index: u32,
    mode: XdpMode,
) -> anyhow::Result<XdpLinkId> {
    prog.attach(index, mode).map_err(|e| {
        let busy = std::error::Error::source(&e)
            .and_then(|s| s.downcast_ref::<io::Error>())
            .is_some_and(|io| io.raw_os_error() == Some(libc::EBUSY));
        let err = anyhow::Error::new(e).context(format!("attaching XDP ({mode:?} mode) to {iface}"));
        if busy {
            err.context(format!(
                "another XDP program is already attached to {iface} (see `ip link show dev {iface}`)"
            ))
        } else {
            err
        }
    })
}

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK; lift it so large maps load there too.
fn raise_memlock_limit() {
    let rlim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: plain syscall with a valid pointer.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &rlim) } != 0 {
        warn!(error = %io::Error::last_os_error(), "could not raise RLIMIT_MEMLOCK");
    }
}
