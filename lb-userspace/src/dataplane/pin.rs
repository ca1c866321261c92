//! Pinning the datapath in bpffs, so that a new `lb run` adopts a running one (hitless restart).
//!
//! One directory holds everything: every map by its name (`<dir>/LB_CONNTRACK`, ...), each
//! interface's XDP link as `<dir>/link-<iface>` and its TC egress link (health probes through the
//! tunnel) as `<dir>/tclink-<iface>`. The programs are not pinned by themselves: the links hold
//! them, and a new load replaces them on them. The `.rodata` map holding [`lb_common::Params`]
//! is not pinned either: every load sets new parameters.

use std::{
    ffi::CString,
    fs::{File, TryLockError},
    io,
    mem::MaybeUninit,
    os::{fd::AsFd as _, unix::ffi::OsStrExt as _},
    path::{Path, PathBuf},
    sync::Mutex,
};

use anyhow::{Context as _, bail};
use aya::programs::{XdpMode, links::PinnedLink};
use lb_common::map_name;

/// Where bpffs is mounted (mounted there by [`prepare_dir`] when it is not).
pub const BPFFS: &str = "/sys/fs/bpf";

/// Every map of the XDP object that holds state, pinned under these names. `Dataplane::load`
/// checks that the object has no other map besides [`SCRATCH`] and the `.rodata`/`.bss`
/// sections of globals.
pub const MAPS: [&str; 23] = [
    map_name::ADDRS,
    map_name::SERVICES,
    map_name::BACKENDS,
    map_name::RINGS,
    map_name::CONNTRACK,
    map_name::NAT,
    map_name::TX_PORTS,
    map_name::STATS,
    map_name::SERVICE_STATS,
    map_name::BACKEND_STATS,
    map_name::NEXTHOPS,
    map_name::SIGNALS,
    map_name::ICMP_RATE,
    map_name::PROGS,
    map_name::SYN_RATE,
    map_name::ADDRS6,
    map_name::SERVICES6,
    map_name::BACKENDS6,
    map_name::CONNTRACK6,
    map_name::NAT6,
    map_name::PROXY,
    map_name::PROXY6,
    map_name::SERVICES_GEN,
];

/// Maps that hold nothing from one packet to the next: never pinned.
pub const SCRATCH: [&str; 10] = [
    map_name::SNAT_SEARCH,
    map_name::SNAT_SEARCH6,
    map_name::ICMP6_WORK,
    map_name::PARSE_SCRATCH,
    map_name::TOO_BIG,
    map_name::SERVICE_HINT,
    map_name::QUIC_KEY,
    map_name::PROXY_WORK,
    map_name::PROXY_FLOW,
    map_name::PROXY_FLOW6,
];

/// Maps the daemon fills anew at every start (the health probes through the tunnel, which it
/// starts again): never pinned, each load has its own, written before its probes start.
///
/// The datapath trace's too: a new daemon starts with it off, and its program array empties
/// when the daemon that filled it dies (see lb_common's trace.rs).
///
/// The QUIC routing's too: written in full by every load's first apply, before its programs
/// are attached.
///
/// And direct server return's flood windows: a new load counts from nothing, at worst letting a
/// flood's first second of SYNs into the table again. The SYN sketch's too: a new load's first
/// second lets each source at most the sketch's quiet share (an eighth of its rate) more.
///
/// And the SYN proxy's cookie keys (each daemon writes them before attaching; a new random key
/// fails only the handshakes in flight across the restart, whose clients send their SYN again)
/// and program array (like the trace's), and its cache of open flows' offsets (the proxy's
/// programs fill it again from the pinned flows).
pub const PER_RUN: [&str; 17] = [
    map_name::FLOOD,
    map_name::SYN_SKETCH,
    map_name::QUIC_LAYOUTS,
    map_name::QUIC_IDS,
    map_name::QUIC_SERVERS,
    map_name::TUNNEL_PROBES,
    map_name::TUNNEL_PROBES6,
    map_name::PROBE_REPLIES,
    map_name::PROBE_REPLIES6,
    map_name::TRACE,
    map_name::TRACE_CPU,
    map_name::TRACE_PROG,
    map_name::COOKIE_KEYS,
    map_name::PROXY_PROGS,
    map_name::PROXY_FAST,
    map_name::PROXY_FAST6,
    map_name::AYA_LOGS,
];

const LINK_PREFIX: &str = "link-";
const TC_LINK_PREFIX: &str = "tclink-";

/// The pin of `iface`'s XDP link.
pub fn link_path(dir: &Path, iface: &str) -> PathBuf {
    dir.join(format!("{LINK_PREFIX}{iface}"))
}

/// The pin of `iface`'s TC egress link.
pub fn tc_link_path(dir: &Path, iface: &str) -> PathBuf {
    dir.join(format!("{TC_LINK_PREFIX}{iface}"))
}

/// The interfaces that have a pinned TC egress link in `dir`.
pub fn pinned_tc_links(dir: &Path) -> anyhow::Result<Vec<String>> {
    let mut ifaces = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let name = entry?.file_name();
        if let Some(iface) = name.to_str().and_then(|n| n.strip_prefix(TC_LINK_PREFIX)) {
            ifaces.push(iface.to_owned());
        }
    }
    ifaces.sort();
    Ok(ifaces)
}

/// The interfaces that have a pinned link in `dir`.
pub fn pinned_links(dir: &Path) -> anyhow::Result<Vec<String>> {
    let mut ifaces = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let name = entry?.file_name();
        if let Some(iface) = name.to_str().and_then(|n| n.strip_prefix(LINK_PREFIX)) {
            ifaces.push(iface.to_owned());
        }
    }
    ifaces.sort();
    Ok(ifaces)
}

/// The maps already pinned in `dir` (a previous run's).
pub fn pinned_maps(dir: &Path) -> Vec<&'static str> {
    MAPS.into_iter()
        .filter(|name| dir.join(name).exists())
        .collect()
}

/// Mounts bpffs at [`BPFFS`] if nothing is mounted there, and creates `dir`, which must be a
/// directory inside a bpffs (not its root: [`remove_pinned`] removes `dir` with everything in it).
pub fn prepare_dir(dir: &Path) -> anyhow::Result<()> {
    {
        // Two loads of this process must not both mount (a second bpffs would hide the first).
        static MOUNTING: Mutex<()> = Mutex::new(());
        let _one = MOUNTING.lock().unwrap_or_else(|e| e.into_inner());
        let root = Path::new(BPFFS);
        if !is_bpffs(root)? {
            if !mount_namespace_shared()? {
                bail!(
                    "no bpffs at {BPFFS} in this mount namespace, and no other process shares it:                      a bpffs lb mounted here would die with lb, and the pinned datapath with it                      (`ip netns exec` gives its command a private mount namespace). Run lb with                      `nsenter --net=/run/netns/NS lb run ...` (the host's mount namespace), mount                      bpffs where it outlives lb (`mount -t bpf bpf {BPFFS}`), or use --no-pin"
                );
            }
            mount_bpffs(root)?;
            tracing::info!(path = BPFFS, "mounted bpffs");
        }
    }
    let existing = parent_of(dir)
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"));
    if !is_bpffs(existing)? {
        bail!(
            "pin directory {}: {} is not on a BPF filesystem; use a directory inside {BPFFS} \
             (e.g. {BPFFS}/lb), or mount one with `mount -t bpf bpf DIR`",
            dir.display(),
            existing.display()
        );
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

/// Whether another process shares this one's mount namespace, so that a mount made here outlives
/// this process. A command of `ip netns exec` runs alone in a mount namespace of its own, which
/// ends with it: whatever was mounted in it, and pinned there, goes too.
pub fn mount_namespace_shared() -> anyhow::Result<bool> {
    let ours = std::fs::read_link("/proc/self/ns/mnt").context("reading /proc/self/ns/mnt")?;
    let me = std::process::id();
    for entry in std::fs::read_dir("/proc").context("reading /proc")? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // Processes we may not inspect (or that ended meanwhile) tell nothing.
        if pid != me && std::fs::read_link(entry.path().join("ns/mnt")).is_ok_and(|l| l == ours) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// An exclusive lock (flock) on a pin directory, held by the `Dataplane` that uses it. The
/// kernel drops it when that process ends, also on kill -9: a second lb can neither adopt nor
/// remove a pinned datapath that a running one is using.
#[derive(Debug)]
pub struct DirLock(#[expect(dead_code, reason = "held for its lock")] File);

/// How long a held lock is waited for before it counts as in use: a lock outlives its owner for
/// a moment while that process exits, or while a child another thread forks has not yet reached
/// exec (the child holds a copy of every descriptor until then, close-on-exec or not).
pub const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_millis(200);

/// Tries `try_lock` until it succeeds, fails otherwise than by being held, or
/// [`LOCK_PATIENCE`] has passed.
pub fn patiently(
    mut try_lock: impl FnMut() -> Result<(), TryLockError>,
) -> Result<(), TryLockError> {
    let start = std::time::Instant::now();
    loop {
        match try_lock() {
            Err(TryLockError::WouldBlock) if start.elapsed() < LOCK_PATIENCE => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

/// Takes the lock of `dir`, which must exist.
pub fn lock(dir: &Path) -> anyhow::Result<DirLock> {
    let file = File::open(dir).with_context(|| format!("opening {}", dir.display()))?;
    match patiently(|| file.try_lock()) {
        Ok(()) => Ok(DirLock(file)),
        Err(TryLockError::WouldBlock) => bail!(
            "the datapath pinned in {} is in use by a running lb: stop that one first \
             (`lb stop`)",
            dir.display()
        ),
        Err(TryLockError::Error(e)) => Err(e).with_context(|| format!("locking {}", dir.display())),
    }
}

/// Unpins every link (which detaches its program from the interface) and every map in `dir`,
/// then removes `dir`. Returns what was removed; a missing `dir` is not an error. Refused while
/// a running lb uses `dir`.
pub fn remove_pinned(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let _lock = match lock(dir) {
        Err(e)
            if e.downcast_ref::<io::Error>()
                .is_some_and(|e| e.kind() == io::ErrorKind::NotFound) =>
        {
            return Ok(Vec::new());
        }
        lock => lock?,
    };
    remove_locked(dir)
}

/// [`remove_pinned`] for the holder of `dir`'s lock.
pub fn remove_locked(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
    };
    // Never empty a directory that is not lb's: it must be inside a bpffs, and not its root.
    if !is_bpffs(dir)? || !is_bpffs(parent_of(dir))? {
        bail!(
            "{} is not a directory inside a BPF filesystem: not removing anything there",
            dir.display()
        );
    }
    let mut paths = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
        if entry.file_type()?.is_dir() {
            bail!(
                "{} holds a directory ({}), which lb never pins: not removing anything",
                dir.display(),
                entry.path().display()
            );
        }
        paths.push(entry.path());
    }
    // Links first: the program stops running before its maps go.
    let is_link = |p: &PathBuf| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(LINK_PREFIX) || n.starts_with(TC_LINK_PREFIX))
    };
    paths.sort_by_key(|p| (!is_link(p), p.clone()));
    for path in &paths {
        unpin(path, is_link(path))?;
    }
    std::fs::remove_dir(dir).with_context(|| format!("removing {}", dir.display()))?;
    Ok(paths)
}

/// Removes one pin. For a link, through an fd held until the pin is gone, so that closing it
/// drops the last reference and detaches the program before this returns (unlinking alone
/// detaches it a little later, from a kernel work queue).
pub fn unpin(path: &Path, link: bool) -> anyhow::Result<()> {
    if link && let Ok(pinned) = PinnedLink::from_pin(path) {
        let fd_link = pinned
            .unpin()
            .with_context(|| format!("unpinning {}", path.display()))?;
        drop(fd_link);
        return Ok(());
    }
    std::fs::remove_file(path).with_context(|| format!("removing {}", path.display()))
}

fn parent_of(dir: &Path) -> &Path {
    match dir.parent() {
        Some(p) if p.as_os_str().is_empty() => Path::new("."),
        Some(p) => p,
        None => Path::new("/"),
    }
}

pub fn is_bpffs(path: &Path) -> anyhow::Result<bool> {
    let cpath = CString::new(path.as_os_str().as_bytes()).context("path with a NUL byte")?;
    let mut st = MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: valid NUL-terminated path and a buffer of the right type.
    if unsafe { libc::statfs(cpath.as_ptr(), st.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error())
            .with_context(|| format!("statfs {}", path.display()));
    }
    // SAFETY: statfs succeeded, so it filled the buffer.
    let st = unsafe { st.assume_init() };
    Ok(st.f_type as u32 == libc::BPF_FS_MAGIC as u32)
}

fn mount_bpffs(at: &Path) -> anyhow::Result<()> {
    let target = CString::new(at.as_os_str().as_bytes()).context("path with a NUL byte")?;
    // SAFETY: valid NUL-terminated strings; no data argument.
    let rc = unsafe {
        libc::mount(
            c"bpf".as_ptr(),
            target.as_ptr(),
            c"bpf".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error()).with_context(|| {
            format!(
                "bpffs is not mounted at {} and mounting it failed (try `mount -t bpf bpf {}`)",
                at.display(),
                at.display()
            )
        });
    }
    Ok(())
}

// rtnetlink, for the XDP mode of an interface (a bpf_link's info does not say).
const IFLA_XDP: u16 = 43;
const IFLA_XDP_ATTACHED: u16 = 2;
const IFLA_XDP_PROG_ID: u16 = 4;
const XDP_ATTACHED_DRV: u8 = 1;
const XDP_ATTACHED_SKB: u8 = 2;
const XDP_ATTACHED_HW: u8 = 3;
const IFINFOMSG_LEN: usize = 16;

/// The mode in which an XDP program is attached to interface `ifindex` of this thread's network
/// namespace (IFLA_XDP_ATTACHED of RTM_GETLINK): None when none is, `Default` when several are.
pub fn attached_xdp_mode(ifindex: u32) -> io::Result<Option<XdpMode>> {
    let attached = xdp_attr(ifindex, IFLA_XDP_ATTACHED)?
        .and_then(|v| v.first().copied())
        .unwrap_or(0);
    Ok(match attached {
        0 => None,
        XDP_ATTACHED_DRV => Some(XdpMode::Driver),
        XDP_ATTACHED_SKB => Some(XdpMode::Skb),
        XDP_ATTACHED_HW => Some(XdpMode::Hardware),
        _ => Some(XdpMode::Default),
    })
}

/// The id of the XDP program attached to interface `ifindex` of this thread's network
/// namespace (IFLA_XDP_PROG_ID), if any.
pub fn attached_xdp_program(ifindex: u32) -> io::Result<Option<u32>> {
    Ok(xdp_attr(ifindex, IFLA_XDP_PROG_ID)?
        .and_then(|v| crate::rtnl::u32_at(&v, 0))
        .filter(|id| *id != 0))
}

/// One attribute of interface `ifindex`'s IFLA_XDP nest (RTM_GETLINK).
fn xdp_attr(ifindex: u32, ty: u16) -> io::Result<Option<Vec<u8>>> {
    use crate::rtnl;
    let fd = rtnl::open(0, false)?;
    // ifinfomsg: family AF_UNSPEC, type 0, then the index.
    let mut info = [0u8; IFINFOMSG_LEN];
    info[4..8].copy_from_slice(&(ifindex as i32).to_ne_bytes());
    let body = rtnl::request(fd.as_fd(), libc::RTM_GETLINK, &info, &[], libc::RTM_NEWLINK)?;
    let attrs = body.get(IFINFOMSG_LEN..).ok_or_else(rtnl::malformed)?;
    Ok(rtnl::find_attr(attrs, IFLA_XDP)
        .and_then(|xdp| rtnl::find_attr(xdp, ty))
        .map(<[u8]>::to_vec))
}
