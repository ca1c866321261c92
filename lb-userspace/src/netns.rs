//! The network namespace this process runs in: its identity, its name, and the default pin
//! directories named after it. The bpffs at /sys/fs/bpf is the host's, shared by every network
//! namespace whose processes see the host's mount namespace (`nsenter --net`, containers given
//! the host's bpffs): two `lb decap` (or `lb run`) in two namespaces with one fixed default
//! directory would take over each other's pins. So outside the host's namespace the default
//! directory carries the namespace's inode number, which is what `lsns` and
//! `readlink /proc/PID/ns/net` show and what stays the same for the namespace's life.

use std::{
    io,
    os::{fd::AsRawFd as _, unix::fs::MetadataExt as _},
    path::{Path, PathBuf},
};

/// The inode number of the host's (initial) network namespace on kernels that give it a fixed
/// one (6.x: `PROC_NET_INIT_INO`); older kernels are recognised through PID 1's namespace.
const INIT_NET_INO: u64 = 0xEFFF_FFF9;

/// Where `ip netns` keeps its named namespaces (bind mounts of their nsfs files).
const NAMED: &str = "/run/netns";

/// A network namespace, by its nsfs device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NetNs {
    dev: u64,
    ino: u64,
}

impl NetNs {
    /// The calling thread's network namespace.
    pub fn current() -> io::Result<Self> {
        Self::of(Path::new("/proc/thread-self/ns/net"))
    }

    /// The namespace of an nsfs file (`/proc/PID/ns/net`, `/run/netns/NAME`).
    pub fn of(path: &Path) -> io::Result<Self> {
        let meta = std::fs::metadata(path)?;
        Ok(Self {
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }

    /// Its inode number (`net:[INO]`).
    pub fn ino(&self) -> u64 {
        self.ino
    }

    /// Whether this is the host's network namespace: the fixed inode number of newer kernels,
    /// or that of PID 1 (which a container may not let us read).
    pub fn is_initial(&self) -> bool {
        self.ino == INIT_NET_INO
            || Self::of(Path::new("/proc/1/ns/net")).is_ok_and(|init| init == *self)
    }

    /// Its `ip netns` name, if it has one.
    pub fn name(&self) -> Option<String> {
        let entries = std::fs::read_dir(NAMED).ok()?;
        entries.flatten().find_map(|entry| {
            (Self::of(&entry.path()).ok()? == *self)
                .then(|| entry.file_name().to_string_lossy().into_owned())
        })
    }

    /// For messages: `net:[INO]`, with its `ip netns` name or "the host's" when known.
    pub fn describe(&self) -> String {
        let id = format!("net:[{}]", self.ino);
        if let Some(name) = self.name() {
            format!("{id} (`ip netns` {name})")
        } else if self.is_initial() {
            format!("{id} (the host's)")
        } else {
            id
        }
    }

    /// How to run a command in this namespace, for messages.
    pub fn nsenter_hint(&self) -> String {
        match self.name() {
            Some(name) => format!("nsenter --net={NAMED}/{name}"),
            None if self.is_initial() => "(in the host's network namespace)".to_owned(),
            None => format!(
                "nsenter --net=/proc/PID/ns/net (a process of net:[{}])",
                self.ino
            ),
        }
    }

    /// Runs `f` on a thread of its own that has entered this namespace (the caller's thread
    /// stays where it is). None when the namespace cannot be entered.
    pub fn run_in<T: Send>(&self, path: &Path, f: impl FnOnce() -> T + Send) -> Option<T> {
        let file = std::fs::File::open(path).ok()?;
        std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: a valid descriptor of an nsfs file; only this thread moves.
                if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return None;
                }
                Some(f())
            })
            .join()
            .ok()
            .flatten()
        })
    }
}

/// The default pin directory `base` for the calling thread's network namespace: `base` itself
/// in the host's, `base-netns-INO` in any other (so that each namespace's `lb decap --stop` and
/// `--stats` find their own).
pub fn default_pin_path(base: &str) -> PathBuf {
    match NetNs::current() {
        Ok(ns) => pin_path_for(base, &ns),
        Err(_) => PathBuf::from(base),
    }
}

/// [`default_pin_path`] for namespace `ns`.
pub fn pin_path_for(base: &str, ns: &NetNs) -> PathBuf {
    if ns.is_initial() {
        PathBuf::from(base)
    } else {
        PathBuf::from(format!("{base}-netns-{}", ns.ino))
    }
}

/// Every network namespace that can be entered from here, each once, with a path to enter it
/// by: the named ones (`/run/netns/NAME`) first, then those of running processes
/// (`/proc/PID/ns/net`: containers, namespaces without a name).
pub fn all() -> Vec<(NetNs, PathBuf)> {
    let mut found: Vec<(NetNs, PathBuf)> = Vec::new();
    let mut add = |path: PathBuf| {
        if let Ok(ns) = NetNs::of(&path)
            && !found.iter().any(|(n, _)| *n == ns)
        {
            found.push((ns, path));
        }
    };
    if let Ok(entries) = std::fs::read_dir(NAMED) {
        for entry in entries.flatten() {
            add(entry.path());
        }
    }
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            if entry
                .file_name()
                .to_str()
                .is_some_and(|n| n.parse::<u32>().is_ok())
            {
                add(entry.path().join("ns/net"));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hosts_namespace_keeps_the_plain_path_others_name_theirs() {
        let here = NetNs::current().unwrap();
        let host = NetNs {
            dev: here.dev,
            ino: INIT_NET_INO,
        };
        assert!(host.is_initial());
        assert_eq!(
            pin_path_for("/sys/fs/bpf/lb-decap", &host),
            PathBuf::from("/sys/fs/bpf/lb-decap")
        );
        let other = NetNs {
            dev: here.dev,
            ino: 4026532384,
        };
        assert!(!other.is_initial());
        assert_eq!(
            pin_path_for("/sys/fs/bpf/lb-decap", &other),
            PathBuf::from("/sys/fs/bpf/lb-decap-netns-4026532384")
        );
    }
}
