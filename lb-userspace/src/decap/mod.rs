//! `lb decap`: the backend's side of direct server return on a host without tunnel devices. It
//! loads the `lb-decap` XDP object (its own maps only: none of the balancer's tables), writes
//! its parameters and this host's addresses, attaches it to the interfaces, pins the links and
//! maps, and exits: what it set up stays until `lb decap --stop`. Run again with the same pin
//! directory, it updates the parameters and addresses in place and replaces the program on the
//! pinned links atomically (no packet goes unprocessed); `--stats` reads the pinned counters.

mod addrs;
mod links;
mod maps;
mod object;
mod pins;
mod report;

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, bail};
use lb_common::{decap_counter, decap_flags};
use tracing::warn;

pub use addrs::Destinations;
pub use object::{Unpinned, object};
pub use report::{DecapInterface, DecapStatus};

use crate::{config::XdpMode, model::NamedCounter};

/// Where `lb decap` pins its links and maps unless told otherwise, in the host's network
/// namespace; in any other, `-netns-INODE` is appended (see [`crate::netns::default_pin_path`]).
pub const DEFAULT_PIN_PATH: &str = "/sys/fs/bpf/lb-decap";

/// A request that cannot be carried out as given (exit code 2, as clap's own usage errors).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Usage(pub String);

/// What `lb decap` is asked to set up.
#[derive(Debug, Clone)]
pub struct Setup {
    pub interfaces: Vec<String>,
    /// GUE's UDP port (1-65535).
    pub gue_port: u16,
    pub destinations: Destinations,
    pub xdp_mode: XdpMode,
    pub pin_path: PathBuf,
}

/// `lb decap --interface ...`: sets up or updates the decapsulator, prints what it did.
pub fn setup(req: &Setup) -> anyhow::Result<()> {
    check_interface_names(&req.interfaces)?;
    // Everything that can be refused is, before anything changes.
    let wanted = addrs::wanted(&req.destinations, || {
        crate::config::host::local_addresses().context("reading this host's addresses")
    })?;
    let targets = links::resolve(&req.interfaces)?;
    object::check_built()?;
    let dir = pins::PinDir::create(&req.pin_path)?;
    let fresh = dir.is_empty()?;
    let result = apply(req, &dir, &targets, &wanted);
    if result.is_err() && fresh {
        // Nothing of a set-up that failed stays behind.
        if let Err(e) = dir.remove() {
            warn!(dir = %req.pin_path.display(), error = %format!("{e:#}"), "removing the pins of a failed set-up");
        }
    } else if result.is_err() {
        eprintln!(
            "lb decap: the decapsulator already pinned at {} keeps running; the log lines \
             above say what this command changed before it failed",
            req.pin_path.display()
        );
    }
    out(&result?.to_string())
}

/// Writes `text` to stdout; a closed stdout (`| head`) is an error, not a panic.
fn out(text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .context("writing to stdout")
}

/// Loads the object on `dir`'s maps, writes them, puts the program on every target and takes
/// it off the interfaces no longer listed.
fn apply(
    req: &Setup,
    dir: &pins::PinDir,
    targets: &[links::Target],
    wanted: &[IpAddr],
) -> anyhow::Result<report::Done> {
    let mut ebpf = object::load(Some(dir.path()))?;
    let params = object::params(req.gue_port, &req.destinations);
    // The maps first: the program already on pinned links reads them too, so the new
    // parameters and addresses apply at once, and a program attached below finds them set.
    let changed = maps::Maps::of(&mut ebpf)?.write(&params, wanted)?;
    let prog = object::program_mut(&mut ebpf)?;
    let mut attached = Vec::new();
    for target in targets {
        attached.push(links::attach(prog, dir.path(), target, req.xdp_mode)?);
    }
    let detached = links::detach_unlisted(dir.path(), &req.interfaces)?;
    Ok(report::Done {
        pin_path: req.pin_path.clone(),
        params,
        addresses: wanted.len(),
        changed,
        attached,
        detached,
    })
}

/// `lb decap --stop`: detaches from every interface and removes every pin and the directory.
pub fn stop(pin_path: &Path) -> anyhow::Result<()> {
    let Some(dir) = pins::PinDir::open(pin_path)? else {
        return out(&format!("{}\n", pins::absent(pin_path)));
    };
    let interfaces = crate::dataplane::pin::pinned_links(pin_path)?;
    let removed = dir.remove()?;
    let detached = if interfaces.is_empty() {
        "no interface".to_owned()
    } else {
        interfaces.join(", ")
    };
    out(&format!(
        "lb decap stopped: detached from {detached}; removed {} ({} pins)\n",
        pin_path.display(),
        removed.len()
    ))
}

/// `lb decap --stats [--json]`.
pub fn stats(pin_path: &Path, json: bool) -> anyhow::Result<()> {
    let status = status(pin_path)?;
    if json {
        out(&format!("{}\n", serde_json::to_string_pretty(&status)?))
    } else {
        out(&report::text(&status))
    }
}

/// What is set up at `pin_path`: parameters, addresses, interfaces, counters.
pub fn status(pin_path: &Path) -> anyhow::Result<DecapStatus> {
    let Some(dir) = pins::PinDir::open(pin_path)? else {
        bail!(
            "{}: set it up with `lb decap --interface IF` first",
            pins::absent(pin_path)
        );
    };
    let pinned = maps::Maps::pinned(dir.path())?;
    let params = pinned.params()?;
    Ok(DecapStatus {
        pin_path: pin_path.display().to_string(),
        gue_port: u16::from_be(params.gue_port),
        strict: params.flags & decap_flags::ANY_DESTINATION == 0,
        addresses: pinned.addresses()?,
        interfaces: links::list(dir.path())?,
        counters: pinned
            .counters()?
            .into_iter()
            .zip(decap_counter::NAMES)
            .map(|(value, name)| NamedCounter {
                name: name.to_owned(),
                value,
            })
            .collect(),
    })
}

/// Interface names as the kernel takes them (1-15 bytes, no '/', ':' or whitespace), each once.
fn check_interface_names(names: &[String]) -> Result<(), Usage> {
    for (i, name) in names.iter().enumerate() {
        let bad = name.is_empty()
            || name.len() > 15
            || name == "."
            || name == ".."
            || name
                .chars()
                .any(|c| c == '/' || c == ':' || c.is_whitespace());
        if bad {
            return Err(Usage(format!(
                "--interface {name:?}: not an interface name (1-15 characters, no '/', ':' or \
                 whitespace)"
            )));
        }
        if names[..i].contains(name) {
            return Err(Usage(format!("--interface {name} is given twice")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_names_are_checked() {
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(check_interface_names(&names(&["eth0", "veth-a.1"])).is_ok());
        for bad in [
            &["eth0", "eth0"][..],
            &[""],
            &["sixteen-chars-xx"],
            &["a/b"],
            &["a b"],
        ] {
            assert!(check_interface_names(&names(bad)).is_err(), "{bad:?}");
        }
    }
}
