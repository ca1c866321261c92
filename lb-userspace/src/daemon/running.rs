//! The configuration running: where it is kept, the version applied and its text, the last
//! change made through the API and how many were made; what `daemon::config` moves forward and
//! the status shows.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{SystemTime, UNIX_EPOCH},
};

use crate::{
    model::{ConfigStatus, ConfigWrites, LastChange},
    source::{FileStore, Snapshot, Version},
};

/// Where the configuration lives and what of it runs.
pub struct ConfigState {
    pub(super) store: FileStore,
    /// Held by a reload or a change from reading the file to applying it.
    pub(super) writing: Mutex<()>,
    /// The version running, and the last change made through the API.
    applied: Mutex<Applied>,
    pub(super) writes: Writes,
    /// Each DNS-discovered service's name and answer, by service name.
    pub(super) dns: Mutex<BTreeMap<String, super::dns::DnsState>>,
    /// Wakes the resolver when the names may have changed (a reload, a change).
    pub(super) dns_wake: Arc<tokio::sync::Notify>,
}

struct Applied {
    version: Version,
    /// The file's text at that version.
    text: std::sync::Arc<str>,
    /// Unix time it was applied.
    since: f64,
    last_change: Option<LastChange>,
}

/// Changes through the API, by outcome.
#[derive(Default)]
pub(super) struct Writes {
    pub(super) applied: AtomicU64,
    pub(super) refused: AtomicU64,
    pub(super) failed: AtomicU64,
}

pub(super) fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl ConfigState {
    /// The file `store`, running at `snapshot`, its DNS names resolved as `dns`.
    pub fn new(
        store: FileStore,
        snapshot: Snapshot,
        dns: BTreeMap<String, super::dns::DnsState>,
    ) -> Self {
        Self {
            dns: Mutex::new(dns),
            dns_wake: Arc::default(),
            store,
            writing: Mutex::default(),
            applied: Mutex::new(Applied {
                version: snapshot.version,
                text: snapshot.text.into(),
                since: now(),
                last_change: None,
            }),
            writes: Writes::default(),
        }
    }

    pub fn path(&self) -> &std::path::Path {
        self.store.path()
    }

    /// The running version.
    pub fn version(&self) -> Version {
        crate::lock(&self.applied).version.clone()
    }

    /// The version running and the file's text at that version.
    pub fn running(&self) -> (Version, std::sync::Arc<str>) {
        let applied = crate::lock(&self.applied);
        (applied.version.clone(), applied.text.clone())
    }

    pub(super) fn set_applied(&self, snapshot: Snapshot, change: Option<LastChange>) {
        let mut applied = crate::lock(&self.applied);
        applied.version = snapshot.version;
        applied.text = snapshot.text.into();
        applied.since = now();
        if change.is_some() {
            applied.last_change = change;
        }
    }

    pub fn status(&self) -> ConfigStatus {
        let applied = crate::lock(&self.applied);
        ConfigStatus {
            source: "file".to_owned(),
            path: self.store.path().display().to_string(),
            version: applied.version.0.clone(),
            applied_at: applied.since,
            last_change: applied.last_change.clone(),
            writes: ConfigWrites {
                applied: self.writes.applied.load(Ordering::Relaxed),
                refused: self.writes.refused.load(Ordering::Relaxed),
                failed: self.writes.failed.load(Ordering::Relaxed),
            },
        }
    }
}
