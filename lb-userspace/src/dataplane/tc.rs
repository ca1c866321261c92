//! The TC egress program of health probes through the tunnel (`lb_probe_encap`,
//! lb-ebpf/src/tunnel.rs): attached with TCX to each of lb's interfaces beside the XDP program,
//! pinned and adopted like it (`<pin dir>/tclink-<iface>`), so a restarted daemon replaces it in
//! place. Packets without a probe's mark pass it at once.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use aya::programs::{
    LinkOrder, ProgramError, SchedClassifier, TcAttach, TcAttachType,
    links::{FdLink, PinnedLink},
    tc::{SchedClassifierLink, SchedClassifierLinkId},
};
use lb_common::PROBE_ENCAP_PROGRAM_NAME;
use tracing::{info, warn};

use super::{Dataplane, pin};

/// The egress program on one interface.
pub(super) struct Egress {
    pub(super) iface: String,
    link: EgressLink,
}

enum EgressLink {
    /// Owned by the program: detached when it is dropped.
    Owned(SchedClassifierLinkId),
    /// Pinned at `path`: stays attached until the pin is removed.
    Pinned { link: FdLink, path: PathBuf },
}

impl Dataplane {
    fn classifier_mut(&mut self) -> anyhow::Result<&mut SchedClassifier> {
        let prog = self
            .ebpf
            .program_mut(PROBE_ENCAP_PROGRAM_NAME)
            .with_context(|| format!("program {PROBE_ENCAP_PROGRAM_NAME} missing"))?;
        Ok(prog.try_into()?)
    }

    /// Attaches the probes' egress program to `iface` (TCX, after whatever is there); when
    /// pinned, puts it on the pinned link of a previous run instead, or pins the new link.
    pub(super) fn attach_egress(&mut self, iface: &str) -> anyhow::Result<()> {
        if let Some(dir) = self.pin_dir() {
            let path = pin::tc_link_path(dir, iface);
            if path.exists() && self.replace_pinned_egress(iface, &path)? {
                return Ok(());
            }
        }
        let attach = TcAttach::Tcx {
            attach_type: TcAttachType::Egress,
            order: LinkOrder::default(),
        };
        let ifname = std::ffi::CString::new(iface).context("interface name")?;
        let id = self
            .classifier_mut()?
            .attach(ifname.as_c_str(), attach)
            .with_context(|| {
                format!(
                    "attaching the health probes' TC egress program to {iface} (TCX needs \
                     Linux 6.6)"
                )
            })?;
        let link = match self.pin_dir().map(Path::to_owned) {
            None => EgressLink::Owned(id),
            Some(dir) => {
                let path = pin::tc_link_path(&dir, iface);
                let link = FdLink::try_from(self.classifier_mut()?.take_link(id)?)
                    .context("a TCX link that is no bpf_link")?;
                // On error the link is dropped, which detaches it.
                let pinned = link.pin(&path).with_context(|| {
                    format!(
                        "pinning the TC egress link of {iface} at {}",
                        path.display()
                    )
                })?;
                EgressLink::Pinned {
                    link: pinned.into(),
                    path,
                }
            }
        };
        info!(%iface, pinned = self.pin.is_some(), "TC egress program attached (probes through the tunnel)");
        self.egress.push(Egress {
            iface: iface.to_owned(),
            link,
        });
        Ok(())
    }

    /// Puts this program on the pinned egress link at `path`. False when the link is defunct
    /// (its interface was removed since) and was unpinned, so that the caller attaches anew.
    fn replace_pinned_egress(&mut self, iface: &str, path: &Path) -> anyhow::Result<bool> {
        let link = PinnedLink::from_pin(path)
            .with_context(|| format!("opening the pinned TC link {}", path.display()))?;
        let link = SchedClassifierLink::try_from(FdLink::from(link))
            .with_context(|| format!("{} is not a TCX link", path.display()))?;
        let id = match self.classifier_mut()?.attach_to_link(link) {
            Ok(id) => id,
            Err(ProgramError::SyscallError(e))
                if e.io_error.raw_os_error() == Some(libc::ENOLINK) =>
            {
                warn!(%iface, path = %path.display(), "the pinned TC link is defunct (interface recreated?): attaching anew");
                pin::unpin(path, true)?;
                return Ok(false);
            }
            Err(e) => {
                return Err(anyhow::Error::new(e).context(format!(
                    "replacing the program on the pinned TC link of {iface} ({})",
                    path.display()
                )));
            }
        };
        let link = FdLink::try_from(self.classifier_mut()?.take_link(id)?)?;
        info!(%iface, path = %path.display(), "TC egress program replaced on the pinned link");
        self.egress.push(Egress {
            iface: iface.to_owned(),
            link: EgressLink::Pinned {
                link,
                path: path.to_owned(),
            },
        });
        Ok(true)
    }

    /// Detaches the egress program from every interface (pinned links are unpinned).
    pub(super) fn detach_egress(&mut self) {
        for Egress { iface, link } in std::mem::take(&mut self.egress) {
            let detached = match link {
                EgressLink::Owned(id) => self
                    .classifier_mut()
                    .and_then(|p| p.detach(id).map_err(anyhow::Error::new)),
                EgressLink::Pinned { link, path } => {
                    // Unpin first: closing our fd then drops the last reference and detaches.
                    let unpinned = std::fs::remove_file(&path)
                        .with_context(|| format!("removing {}", path.display()));
                    drop(link);
                    unpinned
                }
            };
            match detached {
                Ok(()) => info!(%iface, "TC egress program detached"),
                Err(e) => {
                    warn!(%iface, error = %format!("{e:#}"), "detaching the TC egress program failed")
                }
            }
        }
    }
}
