//! Where the configuration is kept, and how a change goes back there: the file, read with its
//! version (a digest of its bytes) and replaced atomically, so that a change made through the
//! API is the file's from then on, and a restart, a reload or an editor see it; or, for several
//! hosts, etcd: the services' document in a key (its revision the version), the per-host
//! `[lb]` in a local file.

pub mod etcd;
mod file;

pub use etcd::{EtcdSource, EtcdTls};
pub use file::FileStore;

use anyhow::anyhow;

use crate::config::{ConfigErrors, Problem};

/// The configuration's home.
pub enum Store {
    File(FileStore),
    Etcd(Box<EtcdStore>),
}

/// The services in etcd, `[lb]` in the local file.
pub struct EtcdStore {
    pub source: EtcdSource,
    pub local: FileStore,
    /// The runtime the daemon's blocking threads run etcd's requests on.
    runtime: tokio::runtime::Handle,
    client: tokio::sync::Mutex<Option<etcd_client::Client>>,
    /// The last revision applied, kept on disk so that a restart while etcd is down starts
    /// with it.
    pub cache: std::path::PathBuf,
}

fn problem(message: String) -> ConfigErrors {
    ConfigErrors(vec![Problem {
        path: String::new(),
        message,
    }])
}

/// Why [`open_etcd`] could not start.
#[derive(Debug)]
pub enum OpenError {
    /// The configuration is invalid (exit 64).
    Config(ConfigErrors),
    Other(anyhow::Error),
}

/// The etcd store of `source` with the local file `local`: its current revision (or, etcd out
/// of reach, the last one this host applied, kept beside the local file), composed with the
/// local `[lb]` and validated for this host.
pub async fn open_etcd(
    source: EtcdSource,
    local: &std::path::Path,
    runtime: tokio::runtime::Handle,
) -> Result<(Store, Snapshot, crate::config::Config), OpenError> {
    let cache = {
        let mut name = local.as_os_str().to_owned();
        name.push(".etcd-cache");
        std::path::PathBuf::from(name)
    };
    let store = EtcdStore::new(source, FileStore::new(local), runtime, cache);
    let read = async {
        let mut client = store.source.connect().await?;
        store.source.read(&mut client).await
    }
    .await;
    let snapshot = match read {
        Ok(Some(s)) => s,
        Ok(None) => Snapshot {
            text: String::new(),
            version: etcd::revision(0),
        },
        Err(e) => match store.read_cache() {
            Some(s) => {
                tracing::warn!(error = %format!("{e:#}"), revision = %s.version, cache = %store.cache.display(), "etcd out of reach: starting with the last revision applied here");
                s
            }
            None => {
                return Err(OpenError::Other(e.context(format!(
                    "and no revision kept at {} from an earlier run",
                    store.cache.display()
                ))));
            }
        },
    };
    let config = store
        .compose(&snapshot.text)
        .and_then(|text| crate::config::parse_for_host(&text))
        .map_err(OpenError::Config)?;
    Ok((Store::Etcd(Box::new(store)), snapshot, config))
}

impl Store {
    /// What it is, for the status: (kind, where).
    pub fn describe(&self) -> (&'static str, String) {
        match self {
            Store::File(f) => ("file", f.path().display().to_string()),
            Store::Etcd(e) => ("etcd", e.source.describe()),
        }
    }

    /// The document changes are made to, and its version: the file, or etcd's document (an
    /// absent key is an empty one at revision 0).
    pub fn read(&self) -> Result<Snapshot, ConfigErrors> {
        match self {
            Store::File(f) => f.read(),
            Store::Etcd(e) => e
                .block_on(async |source, client| source.read(client).await)
                .map(|s| {
                    s.unwrap_or(Snapshot {
                        text: String::new(),
                        version: etcd::revision(0),
                    })
                })
                .map_err(|e| problem(format!("{e:#}"))),
        }
    }

    /// Replaces the document with `text` if it is still version `expected`.
    pub fn replace(&self, expected: &Version, text: &str) -> Result<Version, WriteError> {
        match self {
            Store::File(f) => f.replace(expected, text),
            Store::Etcd(e) => e
                .block_on(async |source, client| Ok(source.replace(client, expected, text).await))
                .map_err(WriteError::Failed)?,
        }
    }

    /// Keeps `snapshot` where a restart finds it if the store is out of reach then (etcd's
    /// cache; the file needs none).
    pub fn remember(&self, snapshot: &Snapshot) {
        if let Store::Etcd(e) = self
            && let Err(err) = e.write_cache(snapshot)
        {
            tracing::warn!(cache = %e.cache.display(), error = %format!("{err:#}"), "keeping the etcd revision on disk failed: a restart while etcd is down could not start with it");
        }
    }

    /// The whole configuration's text for `document`: itself, or the local `[lb]` with it.
    pub fn compose(&self, document: &str) -> Result<String, ConfigErrors> {
        match self {
            Store::File(_) => Ok(document.to_owned()),
            Store::Etcd(e) => e.compose(document),
        }
    }
}

impl EtcdStore {
    pub fn new(
        source: EtcdSource,
        local: FileStore,
        runtime: tokio::runtime::Handle,
        cache: std::path::PathBuf,
    ) -> Self {
        Self {
            source,
            local,
            runtime,
            client: Default::default(),
            cache,
        }
    }

    /// Runs a request with the (re)connected client on the daemon's runtime, from a thread
    /// that is not one of its workers. A failed request drops the client: the next connects
    /// anew.
    /// (Never from one of the runtime's workers: `block_on` would panic there.)
    fn block_on<T>(
        &self,
        f: impl AsyncFnOnce(&EtcdSource, &mut etcd_client::Client) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        self.runtime.block_on(async {
            let mut slot = self.client.lock().await;
            if slot.is_none() {
                *slot = Some(self.source.connect().await?);
            }
            let client = slot.as_mut().ok_or_else(|| anyhow!("no etcd client"))?;
            let result = f(&self.source, client).await;
            if result.is_err() {
                *slot = None;
            }
            result
        })
    }

    /// Writes the cache: a first line naming the revision and the key, then the document.
    fn write_cache(&self, snapshot: &Snapshot) -> anyhow::Result<()> {
        use anyhow::Context as _;
        if let Some(dir) = self.cache.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let tmp = self.cache.with_extension("tmp");
        let text = format!(
            "# lb: etcd revision {} of {}\n{}",
            snapshot.version,
            self.source.describe(),
            snapshot.text
        );
        std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &self.cache)
            .with_context(|| format!("renaming {} to {}", tmp.display(), self.cache.display()))
    }

    /// The revision [`EtcdStore::write_cache`] kept, if any.
    pub fn read_cache(&self) -> Option<Snapshot> {
        let text = std::fs::read_to_string(&self.cache).ok()?;
        let (first, document) = text.split_once('\n')?;
        let rest = first.strip_prefix("# lb: etcd revision ")?;
        let (rev, key) = rest.split_once(" of ")?;
        (key == self.source.describe()).then(|| Snapshot {
            text: document.to_owned(),
            version: Version(rev.to_owned()),
        })
    }

    /// The local file's `[lb]` and etcd's `document` as one configuration. The local file holds
    /// no service, etcd's document no `[lb]`.
    pub fn compose(&self, document: &str) -> Result<String, ConfigErrors> {
        let local = self.local.read()?.text;
        let local_table: toml::Table = toml::from_str(&local).map_err(|e| {
            problem(format!(
                "{}: invalid TOML: {e}",
                self.local.path().display()
            ))
        })?;
        if local_table.contains_key("service") {
            return Err(problem(format!(
                "{}: with --config-source etcd the services are etcd's ({}): the local file holds \
                 [lb] only",
                self.local.path().display(),
                self.source.describe()
            )));
        }
        let doc_table: toml::Table = toml::from_str(document)
            .map_err(|e| problem(format!("{}: invalid TOML: {e}", self.source.describe())))?;
        if let Some(key) = doc_table.keys().find(|k| *k != "service") {
            return Err(problem(format!(
                "{}: {key}: etcd's document holds the [[service]] tables only ([lb] is per host, \
                 in the local file)",
                self.source.describe()
            )));
        }
        Ok(format!("{local}\n{document}"))
    }
}

use serde::{Deserialize, Serialize};

/// A version of the configuration: a digest of the file. Compared, never ordered.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Version(pub String);

impl Version {
    /// The version of a file holding `bytes`: the first 64 bits of their SHA-256, in hex.
    pub fn of(bytes: &[u8]) -> Self {
        let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
        Self(
            digest.as_ref()[..8]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
        )
    }

    /// As an HTTP entity tag (quoted).
    pub fn etag(&self) -> String {
        format!("\"{}\"", self.0)
    }

    /// Whether an `If-Match` header's value names this version (quoted or not, weak or not;
    /// `*` names any).
    pub fn matches(&self, if_match: &str) -> bool {
        if_match.split(',').any(|tag| {
            let tag = tag.trim();
            let tag = tag.strip_prefix("W/").unwrap_or(tag);
            tag == "*" || tag.trim_matches('"') == self.0
        })
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The configuration as kept, and its version.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub text: String,
    pub version: Version,
}

/// Why a change could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The configuration is no longer the version the change was made to (edited by hand, or
    /// by another writer): nothing was written.
    #[error(
        "the configuration changed since version {expected} (it is now {found}); nothing was \
         written"
    )]
    Conflict { expected: Version, found: Version },
    /// It could not be written (read-only, disk full, ...): nothing was written.
    #[error("{0:#}")]
    Failed(anyhow::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_digests_matched_as_entity_tags() {
        let v = Version::of(b"[lb]\n");
        assert_eq!(v.0.len(), 16);
        assert_eq!(v, Version::of(b"[lb]\n"));
        assert_ne!(v, Version::of(b"[lb]\n\n"));
        assert!(v.matches(&v.etag()));
        assert!(v.matches(&v.0));
        assert!(v.matches(&format!("W/{}", v.etag())));
        assert!(v.matches(&format!("\"0000\", {}", v.etag())));
        assert!(v.matches("*"));
        assert!(!v.matches("\"0000000000000000\""));
    }
}
