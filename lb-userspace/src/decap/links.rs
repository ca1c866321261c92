//! The decapsulator's XDP links, one per interface, pinned as `link-<iface>` in its pin
//! directory (the layout `lb run` uses): they keep the program attached after `lb decap` exits,
//! and a later `lb decap` replaces the program on them in one step.

use std::{ffi::CString, io, path::Path};

use anyhow::{Context as _, anyhow, bail};
use aya::programs::{
    ProgramError, Xdp, XdpMode,
    links::{FdLink, PinnedLink},
    xdp::{XdpLink, XdpLinkId},
};
use tracing::{info, warn};

use super::report::{DecapInterface, Put};
use crate::{config, dataplane::pin};

/// An interface to attach to, by name and index (in this network namespace).
#[derive(Debug, Clone)]
pub struct Target {
    pub iface: String,
    pub index: u32,
}

/// Each interface's index; an interface that does not exist is an error naming it.
pub fn resolve(ifaces: &[String]) -> anyhow::Result<Vec<Target>> {
    ifaces
        .iter()
        .map(|iface| {
            let index = ifindex(iface).ok_or_else(|| {
                anyhow!(
                    "interface {iface:?} does not exist in this network namespace (`ip link` \
                     lists those that do; in a namespace, run lb with \
                     `nsenter --net=/run/netns/NS`)"
                )
            })?;
            Ok(Target {
                iface: iface.clone(),
                index,
            })
        })
        .collect()
}

fn ifindex(iface: &str) -> Option<u32> {
    let name = CString::new(iface).ok()?;
    // SAFETY: a valid NUL-terminated string.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    (index != 0).then_some(index)
}

/// Puts `prog` on `target`: in place of the program on its pinned link when there is one (a
/// previous `lb decap`'s; atomic, the link keeps its mode), else attached in `mode` and the
/// link pinned in `dir`.
pub fn attach(
    prog: &mut Xdp,
    dir: &Path,
    target: &Target,
    mode: config::XdpMode,
) -> anyhow::Result<Put> {
    let iface = target.iface.as_str();
    let path = pin::link_path(dir, iface);
    if path.exists()
        && let Some(used) = replace(prog, target, &path, mode)?
    {
        return Ok(Put {
            iface: iface.to_owned(),
            mode: mode_name(used),
            replaced: true,
        });
    }
    let (id, used) = match mode {
        config::XdpMode::Skb => (attach_mode(prog, target, XdpMode::Skb)?, XdpMode::Skb),
        config::XdpMode::Native => {
            let id = attach_mode(prog, target, XdpMode::Driver).map_err(|e| {
                if busy(&e) {
                    return e;
                }
                anyhow!(
                    "{e:#}\nhint: the driver of {iface} may not support native XDP; use \
                     --xdp-mode skb (or auto)"
                )
            })?;
            (id, XdpMode::Driver)
        }
        config::XdpMode::Auto => match attach_mode(prog, target, XdpMode::Driver) {
            Ok(id) => (id, XdpMode::Driver),
            Err(e) if busy(&e) => return Err(e),
            Err(e) => {
                warn!(%iface, error = %format!("{e:#}"), "native XDP attach failed, using skb mode");
                (attach_mode(prog, target, XdpMode::Skb)?, XdpMode::Skb)
            }
        },
    };
    let link = FdLink::try_from(prog.take_link(id)?).with_context(|| {
        format!(
            "XDP on {iface} was attached through netlink, not as a bpf_link (Linux < 5.9?), and \
             cannot be pinned"
        )
    })?;
    // On error the link is dropped, which detaches it.
    link.pin(&path)
        .with_context(|| format!("pinning the XDP link of {iface} at {}", path.display()))?;
    info!(%iface, mode = ?used, path = %path.display(), "decapsulator attached");
    Ok(Put {
        iface: iface.to_owned(),
        mode: mode_name(used),
        replaced: false,
    })
}

/// The program on the pinned link at `path` replaced by `prog`; its mode. None when the link
/// is defunct (its interface was removed since) and was unpinned, to be attached anew.
fn replace(
    prog: &mut Xdp,
    target: &Target,
    path: &Path,
    mode: config::XdpMode,
) -> anyhow::Result<Option<XdpMode>> {
    let iface = target.iface.as_str();
    let link = PinnedLink::from_pin(path)
        .with_context(|| format!("opening the pinned XDP link {}", path.display()))?;
    let link = XdpLink::try_from(FdLink::from(link))
        .with_context(|| format!("{} is not an XDP link", path.display()))?;
    let id = match prog.attach_to_link(link) {
        Ok(id) => id,
        Err(ProgramError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOLINK) => {
            warn!(%iface, path = %path.display(), "the pinned XDP link is defunct (interface recreated?): attaching anew");
            pin::unpin(path, true)?;
            return Ok(None);
        }
        Err(e) => {
            return Err(anyhow::Error::new(e).context(format!(
                "replacing the program on the pinned XDP link of {iface} ({})",
                path.display()
            )));
        }
    };
    // Our descriptor of the link goes; the pin keeps it, with the new program.
    drop(prog.take_link(id)?);
    let used = match pin::attached_xdp_mode(target.index) {
        Ok(Some(used)) => used,
        Ok(None) => bail!("XDP link of {iface} replaced, but no XDP program is attached to it"),
        Err(e) => {
            warn!(%iface, error = %e, "could not read the XDP mode of the pinned link");
            XdpMode::Default
        }
    };
    let wanted = match mode {
        config::XdpMode::Native => Some(XdpMode::Driver),
        config::XdpMode::Skb => Some(XdpMode::Skb),
        config::XdpMode::Auto => None,
    };
    if wanted.is_some_and(|w| w != used && used != XdpMode::Default) {
        warn!(%iface, mode = ?used, wanted = ?mode, "the pinned link keeps its XDP mode; run `lb decap --stop` first to change it");
    }
    info!(%iface, mode = ?used, "decapsulator replaced on the pinned link");
    Ok(Some(used))
}

fn attach_mode(prog: &mut Xdp, target: &Target, mode: XdpMode) -> anyhow::Result<XdpLinkId> {
    let iface = &target.iface;
    prog.attach(target.index, mode).map_err(|e| {
        let is_busy = std::error::Error::source(&e)
            .and_then(|s| s.downcast_ref::<io::Error>())
            .is_some_and(|io| io.raw_os_error() == Some(libc::EBUSY));
        let err =
            anyhow::Error::new(e).context(format!("attaching XDP ({mode:?} mode) to {iface}"));
        if is_busy {
            err.context(Busy(format!(
                "another XDP program is already attached to {iface} (`ip link show dev {iface}` \
                 shows it): lb decap does not replace it. Remove it first \
                 (`ip link set dev {iface} xdp off`, or `lb decap --stop --pin-path DIR` if it \
                 is another lb decap's)"
            )))
        } else {
            err
        }
    })
}

/// The message of an attach refused because the interface has an XDP program already.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Busy(String);

fn busy(e: &anyhow::Error) -> bool {
    e.is::<Busy>()
}

/// Unpins (detaches) the links in `dir` of interfaces not in `listed`: the interfaces a
/// previous `lb decap` was given and this one is not. Returns them.
pub fn detach_unlisted(dir: &Path, listed: &[String]) -> anyhow::Result<Vec<String>> {
    let mut detached = Vec::new();
    for iface in pin::pinned_links(dir)? {
        if !listed.contains(&iface) {
            pin::unpin(&pin::link_path(dir, &iface), true)?;
            info!(%iface, "decapsulator detached (interface no longer listed)");
            detached.push(iface);
        }
    }
    Ok(detached)
}

/// The interfaces with a pinned link in `dir`, with their XDP mode and the link's ids.
pub fn list(dir: &Path) -> anyhow::Result<Vec<DecapInterface>> {
    pin::pinned_links(dir)?
        .into_iter()
        .map(|name| {
            let path = pin::link_path(dir, &name);
            let info = PinnedLink::from_pin(&path)
                .map(FdLink::from)
                .ok()
                .and_then(|l| l.info().ok());
            let mode = match ifindex(&name).map(pin::attached_xdp_mode) {
                Some(Ok(Some(mode))) => Some(mode_name(mode)),
                _ => None,
            };
            Ok(DecapInterface {
                name,
                mode,
                link_id: info.as_ref().map(|i| i.id()),
                program_id: info.as_ref().map(|i| i.program_id()),
            })
        })
        .collect()
}

fn mode_name(mode: XdpMode) -> String {
    match mode {
        XdpMode::Driver => "native",
        XdpMode::Skb => "skb",
        XdpMode::Hardware => "hardware",
        XdpMode::Default => "unknown",
    }
    .to_owned()
}
