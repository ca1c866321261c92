//! Whose pins a directory holds. A pinned XDP link is attached to one interface, and an
//! interface lives in one network namespace: a pin directory whose live links are on another
//! namespace's interfaces is that namespace's. `lb run` and `lb decap` neither adopt, replace nor
//! remove such a directory (the pins of the host's bpffs are shared by every namespace that sees
//! it), and say whose it is. Derived from the kernel's own record each time, so it holds for
//! directories pinned by any version of lb.

use std::{
    ffi::CString,
    io,
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::{Path, PathBuf},
};

use anyhow::bail;

use super::pin;
use crate::netns::{self, NetNs};

/// Whose the pins of a directory are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// No live link (none pinned, or every one's interface is gone): anyone's to take.
    Nobody,
    /// This thread's network namespace.
    Here,
    /// Another namespace's: a link on its interface `iface` (index `ifindex` there).
    Elsewhere {
        iface: String,
        ifindex: u32,
        program: u32,
        /// The namespace and a path to enter it, when it could be found.
        ns: Option<(NetNs, PathBuf)>,
    },
}

/// Whose the XDP links pinned in `dir` (as `link-<iface>`) are.
pub fn owner(dir: &Path) -> anyhow::Result<Owner> {
    let mut here = false;
    for iface in pin::pinned_links(dir)? {
        let Ok(link) = xdp_link(&pin::link_path(dir, &iface)) else {
            continue; // not an XDP link, or gone meanwhile: says nothing of an owner
        };
        if link.ifindex == 0 {
            continue; // defunct: its interface (and maybe its namespace) is gone
        }
        if pin::attached_xdp_program(link.ifindex).ok().flatten() == Some(link.program) {
            here = true;
            continue;
        }
        let ns = netns::all().into_iter().find(|(ns, path)| {
            ns.run_in(path, || pin::attached_xdp_program(link.ifindex))
                .and_then(Result::ok)
                .flatten()
                == Some(link.program)
        });
        return Ok(Owner::Elsewhere {
            iface,
            ifindex: link.ifindex,
            program: link.program,
            ns,
        });
    }
    Ok(if here { Owner::Here } else { Owner::Nobody })
}

/// Fails when `dir` holds another network namespace's pins, saying whose, that `what` (e.g.
/// "lb decap") leaves them alone, and what to do: run from that namespace, or use this one's
/// own directory (`default` for this namespace, as [`netns::default_pin_path`] gives it).
pub fn refuse_foreign(dir: &Path, what: &str, default: &Path) -> anyhow::Result<()> {
    let Owner::Elsewhere {
        iface,
        ifindex,
        program,
        ns,
    } = owner(dir)?
    else {
        return Ok(());
    };
    let (whose, hint) = match &ns {
        Some((ns, _)) => (ns.describe(), format!("`{} {what} ...`", ns.nsenter_hint())),
        None => (
            "another network namespace (not found from here)".to_owned(),
            "the command from that namespace".to_owned(),
        ),
    };
    let here = NetNs::current()
        .map(|ns| ns.describe())
        .unwrap_or_else(|_| "this one".to_owned());
    let own = if default == dir {
        "give this one a directory of its own with --pin-path (or the config's pin_path)".to_owned()
    } else {
        format!("this namespace's own default is {}", default.display())
    };
    bail!(
        "{} holds the pins of network namespace {whose}: its XDP link on {iface} (index \
         {ifindex} there, program id {program}), not of this namespace {here}. {what} never \
         adopts, replaces or removes another namespace's pins. To act on those, run {hint}; \
         {own}",
        dir.display()
    )
}

/// What the kernel says of a pinned XDP link.
struct XdpLink {
    program: u32,
    /// 0 once the link is defunct (its interface removed).
    ifindex: u32,
}

/// The pinned link at `path`, if it is an XDP link: BPF_OBJ_GET, then BPF_OBJ_GET_INFO_BY_FD
/// (aya's `LinkInfo` does not give the interface).
fn xdp_link(path: &Path) -> io::Result<XdpLink> {
    const BPF_OBJ_GET: libc::c_long = 7;
    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    const BPF_LINK_TYPE_XDP: u32 = 6;
    // union bpf_attr as BPF_OBJ_GET reads it (the rest zero).
    #[repr(C)]
    struct ObjGet {
        pathname: u64,
        bpf_fd: u32,
        file_flags: u32,
        path_fd: i32,
        _pad: u32,
    }
    // union bpf_attr as BPF_OBJ_GET_INFO_BY_FD reads it.
    #[repr(C)]
    struct GetInfo {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    let cpath = CString::new(path.as_os_str().as_bytes())?;
    let get = ObjGet {
        pathname: cpath.as_ptr() as u64,
        bpf_fd: 0,
        file_flags: 0,
        path_fd: 0,
        _pad: 0,
    };
    // SAFETY: a bpf_attr of the size given, pointing at a NUL-terminated path that outlives it.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET,
            &raw const get,
            std::mem::size_of::<ObjGet>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just opened for us.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // struct bpf_link_info: type, id, prog_id, then (8-aligned) xdp.ifindex at byte 16.
    let mut info = [0u32; 16];
    let req = GetInfo {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: std::mem::size_of_val(&info) as u32,
        info: info.as_mut_ptr() as u64,
    };
    // SAFETY: a bpf_attr of the size given, pointing at a buffer of the length it states.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET_INFO_BY_FD,
            &raw const req,
            std::mem::size_of::<GetInfo>(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    if info[0] != BPF_LINK_TYPE_XDP {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not an XDP link",
        ));
    }
    Ok(XdpLink {
        program: info[2],
        ifindex: info[4],
    })
}
