//! The configuration file: read whole with its version; replaced by writing a temporary file
//! beside it (same owner and mode), syncing it, keeping the previous version as `FILE.bak`,
//! renaming the new one over the old and syncing the directory. A reader sees the old file or
//! the new one, never a part; a crash leaves one of the two; a failure leaves the old one.

use std::{
    fs::{self, File, OpenOptions},
    io::Write as _,
    os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, anyhow};

use super::{Snapshot, Version, WriteError};
use crate::config::{self, ConfigErrors};

/// A configuration file.
#[derive(Debug)]
pub struct FileStore {
    path: PathBuf,
    /// Held from the version check to the rename: two writers of this process cannot both
    /// pass the check (a hand edit can still land between the two; it is then overwritten
    /// only if it came within that moment).
    replacing: std::sync::Mutex<()>,
}

impl FileStore {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            replacing: Default::default(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's text and version; a file that cannot be read, is too large or is not
    /// UTF-8 is a problem of the configuration.
    pub fn read(&self) -> Result<Snapshot, ConfigErrors> {
        let bytes = config::read_bytes(&self.path)?;
        let version = Version::of(&bytes);
        let text = config::text(&bytes)?.to_owned();
        Ok(Snapshot { text, version })
    }

    /// Replaces the file with `text` if it still is version `expected`; returns the new
    /// version. On any failure the file is as it was.
    pub fn replace(&self, expected: &Version, text: &str) -> Result<Version, WriteError> {
        let failed = |e: anyhow::Error| WriteError::Failed(e);
        let _one = crate::lock(&self.replacing);
        // Through a symbolic link, the file it names is replaced (not the link).
        let target = fs::canonicalize(&self.path)
            .with_context(|| format!("reading {}", self.path.display()))
            .map_err(failed)?;
        let old = config::read_bytes(&target).map_err(|e| failed(anyhow!("{e}")))?;
        let found = Version::of(&old);
        if found != *expected {
            return Err(WriteError::Conflict {
                expected: expected.clone(),
                found,
            });
        }
        let meta = fs::metadata(&target)
            .with_context(|| format!("reading {}", target.display()))
            .map_err(failed)?;
        if meta.permissions().mode() & 0o222 == 0 {
            return Err(failed(anyhow!(
                "{} is read-only (mode {:o}): lb writes the changes made through its API into \
                 the file, so that they outlive a restart. Make it writable (`chmod u+w`), or \
                 change it by hand and `lb reload`",
                target.display(),
                meta.permissions().mode() & 0o7777
            )));
        }
        let name = target
            .file_name()
            .ok_or_else(|| failed(anyhow!("{} names no file", target.display())))?
            .to_string_lossy()
            .into_owned();
        let dir = target.parent().unwrap_or(Path::new("/"));
        // The previous version first: a failure here changes nothing.
        let backup = dir.join(format!("{name}.bak"));
        write_new(dir, &name, &backup, &old, &meta).map_err(failed)?;
        let new = text.as_bytes();
        write_new(dir, &name, &target, new, &meta).map_err(failed)?;
        sync_dir(dir).map_err(failed)?;
        Ok(Version::of(new))
    }
}

/// Writes `bytes` to `to` through a temporary file in `dir` renamed over it, with `like`'s
/// owner and mode.
fn write_new(
    dir: &Path,
    name: &str,
    to: &Path,
    bytes: &[u8],
    like: &fs::Metadata,
) -> anyhow::Result<()> {
    let tmp = dir.join(format!(".{name}.lb-{}.tmp", std::process::id()));
    let result = (|| -> anyhow::Result<()> {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(like.permissions().mode() & 0o7777)
            .open(&tmp)
            .with_context(|| {
                format!("creating {} (beside the configuration file)", tmp.display())
            })?;
        // The mode again (umask), and the owner when we may set it.
        file.set_permissions(like.permissions())
            .with_context(|| format!("setting the mode of {}", tmp.display()))?;
        let _ = std::os::unix::fs::fchown(&file, Some(like.uid()), Some(like.gid()));
        file.write_all(bytes)
            .and_then(|()| file.sync_all())
            .with_context(|| format!("writing {}", tmp.display()))?;
        fs::rename(&tmp, to)
            .with_context(|| format!("renaming {} to {}", tmp.display(), to.display()))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Makes the renames in `dir` durable.
fn sync_dir(dir: &Path) -> anyhow::Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn dir(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("lb-store-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        Dir(d)
    }

    #[test]
    fn a_replace_keeps_mode_and_a_backup_and_refuses_another_version() {
        let d = dir("replace");
        let path = d.0.join("lb.toml");
        fs::write(&path, "# one\n").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        let store = FileStore::new(&path);
        let one = store.read().unwrap();
        let two = store.replace(&one.version, "# two\n").unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "# two\n");
        assert_eq!(
            fs::read_to_string(d.0.join("lb.toml.bak")).unwrap(),
            "# one\n"
        );
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o640
        );
        assert_eq!(store.read().unwrap().version, two);
        // A writer still holding version one is refused, and nothing changes.
        match store.replace(&one.version, "# three\n") {
            Err(WriteError::Conflict { expected, found }) => {
                assert_eq!((expected, found), (one.version, two));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(fs::read_to_string(&path).unwrap(), "# two\n");
        // No temporary file stays.
        let names: Vec<_> = fs::read_dir(&d.0)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    #[test]
    fn a_read_only_file_is_left_alone() {
        let d = dir("ro");
        let path = d.0.join("lb.toml");
        fs::write(&path, "# one\n").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o444)).unwrap();
        let store = FileStore::new(&path);
        let one = store.read().unwrap();
        let err = store.replace(&one.version, "# two\n").unwrap_err();
        assert!(err.to_string().contains("read-only"), "{err}");
        assert_eq!(fs::read_to_string(&path).unwrap(), "# one\n");
    }

    #[test]
    fn a_symbolic_link_keeps_pointing_at_the_file() {
        let d = dir("link");
        let real = d.0.join("real.toml");
        let link = d.0.join("lb.toml");
        fs::write(&real, "# one\n").unwrap();
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let store = FileStore::new(&link);
        let one = store.read().unwrap();
        store.replace(&one.version, "# two\n").unwrap();
        assert!(
            fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(fs::read_to_string(&real).unwrap(), "# two\n");
    }

    #[test]
    fn concurrent_writers_never_lose_an_update() {
        // Each writer reads, adds its line and writes back against the version it read,
        // retrying on a conflict: every line must be there in the end.
        let d = dir("race");
        let path = d.0.join("lb.toml");
        fs::write(&path, "").unwrap();
        let store = FileStore::new(&path);
        std::thread::scope(|s| {
            for w in 0..2 {
                let store = &store;
                s.spawn(move || {
                    for i in 0..50 {
                        loop {
                            let snap = store.read().unwrap();
                            let text = format!("{}# writer {w} line {i}\n", snap.text);
                            match store.replace(&snap.version, &text) {
                                Ok(_) => break,
                                Err(WriteError::Conflict { .. }) => continue,
                                Err(e) => panic!("{e}"),
                            }
                        }
                    }
                });
            }
        });
        let text = fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 100, "{text}");
    }
}
