//! The decapsulator's pin directory: bpffs (mounted if absent, as `lb run` does), the
//! directory itself, a lock while a command works in it, and the rule that it holds nothing but
//! what `lb decap` pins (its maps and `link-<iface>` links), so that `--stop` can never remove
//! another program's pins (`lb run`'s, say).

use std::{
    fs::{File, TryLockError},
    io,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use aya::{EbpfError, maps::MapError};
use lb_common::DECAP_MAPS;

use crate::dataplane::pin::{self, BPFFS};

/// How long a command waits for another one working in the same directory.
const LOCK_WAIT: Duration = Duration::from_secs(10);

/// A pin directory of `lb decap`, locked while this lives.
pub struct PinDir {
    path: PathBuf,
    _lock: File,
}

impl PinDir {
    /// Makes `path` ready for a set-up: bpffs mounted at [`BPFFS`], the directory created.
    pub fn create(path: &Path) -> anyhow::Result<Self> {
        // `pin::prepare_dir` would refuse too, but in `lb run`'s words.
        if !pin::is_bpffs(Path::new(BPFFS))? && !pin::mount_namespace_shared()? {
            bail!(
                "no bpffs at {BPFFS} in this mount namespace, and no other process shares it: a \
                 bpffs mounted here would be gone when lb decap exits, and the decapsulator with \
                 it (`ip netns exec` gives its command a private mount namespace). Run \
                 `nsenter --net=/run/netns/NS lb decap ...` (the host's mount namespace), or \
                 mount bpffs where it outlives the command (`mount -t bpf bpf {BPFFS}`)"
            );
        }
        pin::prepare_dir(path)?;
        Self::lock(path)
    }

    /// `path` locked, if it exists.
    pub fn open(path: &Path) -> anyhow::Result<Option<Self>> {
        match Self::lock(path) {
            Ok(dir) => Ok(Some(dir)),
            Err(e)
                if e.downcast_ref::<io::Error>()
                    .is_some_and(|e| e.kind() == io::ErrorKind::NotFound) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    fn lock(path: &Path) -> anyhow::Result<Self> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let start = Instant::now();
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(TryLockError::WouldBlock) if start.elapsed() < LOCK_WAIT => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(TryLockError::WouldBlock) => bail!(
                    "{} is in use by another process (another lb decap, or an lb daemon if it \
                     is lb run's pin directory) for {}s: try again, or use another --pin-path",
                    path.display(),
                    LOCK_WAIT.as_secs()
                ),
                Err(TryLockError::Error(e)) => {
                    return Err(e).with_context(|| format!("locking {}", path.display()));
                }
            }
        }
        let dir = Self {
            path: path.to_owned(),
            _lock: file,
        };
        dir.check_owned()?;
        crate::dataplane::owner::refuse_foreign(
            path,
            "lb decap",
            &crate::netns::default_pin_path(super::DEFAULT_PIN_PATH),
        )?;
        Ok(dir)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether nothing is pinned here yet.
    pub fn is_empty(&self) -> anyhow::Result<bool> {
        Ok(std::fs::read_dir(&self.path)
            .with_context(|| format!("reading {}", self.path.display()))?
            .next()
            .is_none())
    }

    /// Unpins every link (detaching the program) and map, and removes the directory.
    pub fn remove(self) -> anyhow::Result<Vec<PathBuf>> {
        pin::remove_locked(&self.path)
    }

    /// Refuses a directory holding anything `lb decap` does not pin.
    fn check_owned(&self) -> anyhow::Result<()> {
        let entries = std::fs::read_dir(&self.path)
            .with_context(|| format!("reading {}", self.path.display()))?;
        for entry in entries {
            let name = entry?.file_name();
            let name = name.to_string_lossy();
            if !DECAP_MAPS.contains(&name.as_ref()) && !name.starts_with("link-") {
                bail!(
                    "{} holds {name}, which lb decap never pins: it is not lb decap's pin \
                     directory (lb run's is {}); use another --pin-path",
                    self.path.display(),
                    crate::config::DEFAULT_PIN_PATH
                );
            }
        }
        Ok(())
    }
}

/// Why nothing was found at `path`, for a message: in a mount namespace without bpffs (that of
/// `ip netns exec`), the pins made from the host's are out of sight.
pub fn absent(path: &Path) -> String {
    if pin::is_bpffs(Path::new(BPFFS)).unwrap_or(true) {
        format!("nothing is pinned at {}", path.display())
    } else {
        format!(
            "nothing is pinned at {}, and no bpffs is mounted at {BPFFS} in this mount              namespace: under `ip netns exec` the host's pins are out of sight (use              `nsenter --net=/run/netns/NS lb decap ...`)",
            path.display()
        )
    }
}

/// A load error; a pinned map that does not fit this object names the way out.
pub fn load_error(e: EbpfError, dir: Option<&Path>) -> anyhow::Error {
    if let (
        EbpfError::MapError(MapError::IncompatiblePinnedMap {
            name,
            property,
            expected,
            actual,
        }),
        Some(dir),
    ) = (&e, dir)
    {
        let msg = format!(
            "map {name} pinned in {} has {property} {actual} where this lb decap needs \
             {expected} (made by another version of lb?): run `lb decap --stop --pin-path {}` \
             first, then set it up again",
            dir.display(),
            dir.display()
        );
        return anyhow::Error::new(e).context(msg);
    }
    anyhow::Error::new(e).context("loading the decapsulator's XDP object")
}
