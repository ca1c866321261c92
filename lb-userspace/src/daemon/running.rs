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
    source::{Snapshot, Store, Version},
};

/// Where the configuration lives and what of it runs.
pub struct ConfigState {
    pub(super) store: Store,
    /// Held by a reload or a change from reading the file to applying it.
    pub(super) writing: Mutex<()>,
    /// The version running, and the last change made through the API.
    applied: Mutex<Applied>,
    pub(super) writes: Writes,
    /// Each DNS-discovered service's name and answer, by service name.
    pub(super) dns: Mutex<BTreeMap<String, super::dns::DnsState>>,
    /// Wakes the resolver when the names may have changed (a reload, a change).
    pub(super) dns_wake: Arc<tokio::sync::Notify>,
    /// Why the store cannot be reached now (etcd down), if it cannot.
    pub(super) store_error: Mutex<Option<String>>,
    /// The last revision refused (a bad document in etcd: every host refuses it), and why.
    pub(super) refused: Mutex<Option<(String, String)>>,
    pub(super) refused_total: AtomicU64,
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
        store: Store,
        snapshot: Snapshot,
        dns: BTreeMap<String, super::dns::DnsState>,
    ) -> Self {
        Self {
            dns: Mutex::new(dns),
            store_error: Mutex::default(),
            refused: Mutex::default(),
            refused_total: AtomicU64::new(0),
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

    /// Where the configuration is: the file, or `etcd://.../KEY`.
    pub fn place(&self) -> String {
        self.store.describe().1
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
        let (source, path) = self.store.describe();
        let refused = crate::lock(&self.refused).clone();
        ConfigStatus {
            source: source.to_owned(),
            path,
            error: crate::lock(&self.store_error).clone(),
            refused_version: refused.as_ref().map(|r| r.0.clone()),
            refused_reason: refused.map(|r| r.1),
            refused_total: self.refused_total.load(Ordering::Relaxed),
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
