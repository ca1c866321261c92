//! The event log (SPEC §4): every health transition and operator action, kept in a bounded
//! in-memory log for `GET /v1/events` and broadcast to followers (`lb events --follow`).

use std::{
    collections::VecDeque,
    sync::Mutex,
    time::{SystemTime, UNIX_EPOCH},
};

use tokio::sync::broadcast;

use crate::model::{Event, Events};

/// Events kept for `GET /v1/events`.
pub const CAPACITY: usize = 1024;

pub struct EventLog {
    inner: Mutex<Inner>,
    live: broadcast::Sender<Event>,
}

struct Inner {
    events: VecDeque<Event>,
    capacity: usize,
    next_seq: u64,
    dropped: u64,
}

impl EventLog {
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: Mutex::new(Inner {
                events: VecDeque::with_capacity(capacity),
                capacity: capacity.max(1),
                next_seq: 1,
                dropped: 0,
            }),
            // A follower that falls this far behind is told so (it sees a gap in `seq`).
            live: broadcast::channel(capacity.max(1)).0,
        }
    }

    /// Records `event` (its `seq` and `time` are set here) and returns it.
    pub fn push(&self, mut event: Event) -> Event {
        let mut inner = crate::lock(&self.inner);
        event.seq = inner.next_seq;
        inner.next_seq += 1;
        event.time = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        if inner.events.len() == inner.capacity {
            inner.events.pop_front();
            inner.dropped += 1;
        }
        inner.events.push_back(event.clone());
        // Sent under the lock so followers see events in `seq` order; no receiver is fine.
        let _ = self.live.send(event.clone());
        event
    }

    /// Events with `seq > after`, at most `limit` of the most recent.
    pub fn after(&self, after: u64, limit: usize) -> Events {
        let inner = crate::lock(&self.inner);
        let matching: Vec<&Event> = inner.events.iter().filter(|e| e.seq > after).collect();
        let skip = matching.len().saturating_sub(limit);
        Events {
            events: matching[skip..].iter().map(|e| (*e).clone()).collect(),
            dropped: inner.dropped,
        }
    }

    /// The backlog after `after` and a receiver of everything later, without a gap between them.
    pub fn follow(&self, after: u64) -> (Vec<Event>, broadcast::Receiver<Event>) {
        let inner = crate::lock(&self.inner);
        let rx = self.live.subscribe();
        let backlog = inner
            .events
            .iter()
            .filter(|e| e.seq > after)
            .cloned()
            .collect();
        (backlog, rx)
    }

    /// Events recorded so far.
    pub fn total(&self) -> u64 {
        crate::lock(&self.inner).next_seq - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ProbeCounters;

    fn event(backend: &str) -> Event {
        Event {
            seq: 0,
            time: 0.0,
            service: "web".into(),
            backend: backend.into(),
            from: "healthy".into(),
            to: "unhealthy".into(),
            source: "tcp".into(),
            counters: ProbeCounters::default(),
            healthy_threshold: 3,
            unhealthy_threshold: 3,
            flag_write_us: None,
            reason: None,
            vip: None,
        }
    }

    #[test]
    fn bounded_in_order_and_followable() {
        let log = EventLog::new(3);
        let (backlog, mut rx) = log.follow(0);
        assert!(backlog.is_empty());
        for i in 0..5 {
            log.push(event(&format!("b{i}")));
        }
        let all = log.after(0, 100);
        assert_eq!(all.dropped, 2);
        let seqs: Vec<u64> = all.events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [3, 4, 5]);
        assert!(all.events[0].time > 0.0);
        assert_eq!(log.after(4, 100).events.len(), 1);
        assert_eq!(log.after(0, 2).events[0].seq, 4, "the most recent ones");
        assert_eq!(log.total(), 5);
        // The follower got the latest live, in order (its channel holds 4, rounded up from 3: it
        // lagged and lost the first).
        let mut got = Vec::new();
        loop {
            match rx.try_recv() {
                Ok(e) => got.push(e.seq),
                Err(broadcast::error::TryRecvError::Lagged(_)) => continue,
                Err(_) => break,
            }
        }
        assert_eq!(got, [2, 3, 4, 5]);
        let (backlog, _) = log.follow(3);
        assert_eq!(backlog.iter().map(|e| e.seq).collect::<Vec<_>>(), [4, 5]);
    }
}
