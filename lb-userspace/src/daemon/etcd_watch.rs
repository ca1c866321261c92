//! One configuration for several hosts: each host watches etcd's key and applies every new
//! revision (or refuses an invalid one, as every host does, and keeps what runs). etcd out of
//! reach never stops anything: the host runs on the revision it has and keeps trying, with a
//! backoff, and catches up when etcd answers again.

use std::{sync::Arc, time::Duration};

use anyhow::bail;
use etcd_client::EventType;
use tokio::sync::watch;
use tracing::warn;

use super::state::Shared;
use crate::source::{EtcdSource, Snapshot, etcd::revision};

/// Longest wait between attempts to reach etcd.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

pub async fn run(shared: Arc<Shared>, source: EtcdSource, mut stop: watch::Receiver<bool>) {
    let mut backoff = Duration::from_millis(200);
    loop {
        let followed = tokio::select! {
            r = follow(&shared, &source) => r,
            _ = stop.wait_for(|s| *s) => return,
        };
        if let Err(e) = followed {
            let why = format!("{e:#}");
            warn!(error = %why, retry_in = ?backoff, "etcd: running on the revision applied, retrying");
            shared.etcd_unreachable(why);
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Connects, catches up with the key as it is, then applies each revision as it comes, until
/// the connection fails.
async fn follow(shared: &Arc<Shared>, source: &EtcdSource) -> anyhow::Result<()> {
    let mut client = source.connect().await?;
    let now = source.read(&mut client).await?.unwrap_or(Snapshot {
        text: String::new(),
        version: revision(0),
    });
    shared.etcd_reachable();
    apply(shared, now).await;
    let applied = shared.config.version();
    let mut stream = source.watch(&mut client, &applied).await?;
    while let Some(answer) = stream.message().await? {
        if answer.canceled() {
            bail!("etcd canceled the watch: {}", answer.cancel_reason());
        }
        for event in answer.events() {
            let Some(kv) = event.kv() else { continue };
            let snapshot = match event.event_type() {
                EventType::Put => Snapshot {
                    text: kv.value_str().unwrap_or_default().to_owned(),
                    version: revision(kv.mod_revision()),
                },
                // The key deleted: no services.
                EventType::Delete => Snapshot {
                    text: String::new(),
                    version: revision(kv.mod_revision()),
                },
            };
            apply(shared, snapshot).await;
        }
    }
    bail!("the watch ended")
}

async fn apply(shared: &Arc<Shared>, snapshot: Snapshot) {
    let shared = shared.clone();
    if let Err(e) = tokio::task::spawn_blocking(move || shared.apply_revision(snapshot)).await {
        tracing::error!(error = %e, "applying an etcd revision");
    }
}
