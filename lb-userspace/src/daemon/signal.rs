//! Requests for the health writer to write the VIPs' routes (route health injection), from
//! wherever the state changes (an admin action, a reload, drain-host, stop), and its answers.

use std::{
    sync::{
        Condvar, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

/// Requests for the writer thread to bring the table up to date, and its answers: a requester
/// takes a generation, the writer serves every generation requested before it read the state.
#[derive(Default)]
pub struct AnnounceSignal {
    kick: tokio::sync::Notify,
    requested: AtomicU64,
    applied: Mutex<u64>,
    done: Condvar,
}

impl AnnounceSignal {
    /// Asks for a sync; its generation, for [`AnnounceSignal::wait`].
    pub fn request(&self) -> u64 {
        let generation = self.requested.fetch_add(1, Ordering::AcqRel) + 1;
        self.kick.notify_one();
        generation
    }

    /// Until a sync is asked for (the feeder turns it into the writer's work).
    pub async fn requested(&self) {
        self.kick.notified().await;
    }

    /// Waits until generation `generation` was served, at most `limit`; whether it was.
    pub fn wait(&self, generation: u64, limit: Duration) -> bool {
        let applied = crate::lock(&self.applied);
        let (applied, _) = self
            .done
            .wait_timeout_while(applied, limit, |a| *a < generation)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *applied >= generation
    }

    pub fn current(&self) -> u64 {
        self.requested.load(Ordering::Acquire)
    }

    pub fn served(&self, generation: u64) {
        let mut applied = crate::lock(&self.applied);
        *applied = (*applied).max(generation);
        self.done.notify_all();
    }
}
