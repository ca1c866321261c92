//! The datapath trace in the daemon (`POST /v1/trace`, `lb trace`): sessions switch the
//! datapath's trace on while one at least is open, the records the datapath writes (aya-log,
//! read through an `EbpfLogger` on the loaded object) are fanned out to them, each filtered
//! and named.
//!
//! A session is one streaming request: the trace is on exactly while someone reads it. It ends
//! when its time is up (at most [`MAX_DURATION`]), when its client goes (the response body is
//! dropped, and the session with it) or when the daemon stops; the last one to end closes the
//! datapath's gate. The datapath's own filter is what every open session lets through
//! ([`Filter::union`]); each stream then applies its own. The deadline is written into the
//! datapath too, so a gate left open by a daemon that died closes on time.

pub mod record;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use aya_log::EbpfLogger;
use lb_common::{Params, TRACE_NONE, TraceFilter};
use tokio::{
    io::unix::AsyncFd,
    sync::{broadcast, watch},
    time::Instant,
};
use tracing::{debug, info, warn};

pub use record::{Filter, Names, Record};

use crate::{
    dataplane::{TraceMaps, monotonic_coarse_ns},
    model::TraceLine,
};

/// The longest a trace runs: a forgotten `lb trace` does not keep the datapath tracing.
pub const MAX_DURATION: Duration = Duration::from_secs(600);
/// Records a second per CPU the datapath writes at most; beyond it they are counted (a SYN
/// flood under trace must not become a flood of records).
pub const RATE: u32 = 1000;
/// Records queued for the streams; a stream that falls further behind is told how many it
/// missed.
const QUEUE: usize = 4096;
/// How much longer than its sessions the datapath's own deadline is (the daemon closes the
/// gate itself; this is for a daemon that cannot).
const DEADLINE_SLACK: Duration = Duration::from_secs(5);

/// What the reader hands the streams.
#[derive(Debug)]
enum Entry {
    Record(f64, Record),
    Notice(f64, String),
}

/// The trace's state, shared by the reader, the sessions and the API.
pub struct Hub {
    state: Mutex<State>,
    entries: broadcast::Sender<Arc<Entry>>,
    names: Mutex<Arc<Names>>,
}

struct State {
    /// None: a daemon without a datapath (tests).
    maps: Option<TraceMaps>,
    sessions: HashMap<u64, (Filter, Instant)>,
    next: u64,
    /// Losses already told (rate limit, full ring).
    told: (u64, u64),
}

impl Hub {
    /// A hub without a datapath (until [`Hub::set_maps`]): its sessions see what its
    /// [`Hub::sink`] is given.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                maps: None,
                sessions: HashMap::new(),
                next: 0,
                told: (0, 0),
            }),
            entries: broadcast::channel(QUEUE).0,
            names: Mutex::default(),
        })
    }

    /// The datapath's switches ([`Dataplane::take_trace`](crate::dataplane::Dataplane::take_trace)).
    pub fn set_maps(&self, maps: TraceMaps) {
        self.state().maps = Some(maps);
    }

    /// What the datapath's records go to ([`Dataplane::take_trace`](crate::dataplane::Dataplane::take_trace)).
    pub fn sink(&self) -> Sink {
        Sink {
            entries: self.entries.clone(),
        }
    }

    /// Names the ids from now on (after a start or a reload); ids no longer named keep their
    /// names (see [`Names::merged`]).
    pub fn set_names(&self, names: Names) {
        let mut held = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        *held = Arc::new(held.merged(names));
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens a session showing what `filter` lets through for `duration` (at most
    /// [`MAX_DURATION`]); the datapath traces from now until the last session ends. `what`
    /// says in words what it shows, for its first line.
    pub fn open(
        self: &Arc<Self>,
        filter: Filter,
        duration: Duration,
        what: &str,
    ) -> anyhow::Result<Session> {
        let duration = duration.min(MAX_DURATION);
        let deadline = Instant::now() + duration;
        // Subscribed before the gate opens: the first record is this session's too.
        let entries = self.entries.subscribe();
        let id = {
            let mut state = self.state();
            let id = state.next;
            state.next += 1;
            state.sessions.insert(id, (filter, deadline));
            if let Err(e) = state.apply() {
                state.sessions.remove(&id);
                let _ = state.apply();
                return Err(e);
            }
            id
        };
        info!(session = id, %what, duration_s = duration.as_secs_f64(), "datapath trace session opened");
        Ok(Session {
            hub: self.clone(),
            id,
            filter,
            entries,
            deadline,
            started: Some(format!(
                "tracing {what} for {}",
                crate::config::show_duration(duration)
            )),
            ended: false,
        })
    }

    fn close(&self, id: u64) {
        let mut state = self.state();
        if state.sessions.remove(&id).is_some()
            && let Err(e) = state.apply()
        {
            warn!(error = %format!("{e:#}"), "switching the datapath trace");
        }
        info!(
            session = id,
            open = state.sessions.len(),
            "datapath trace session closed"
        );
    }

    /// Whether the datapath traces now, the sessions open, and what it could not show.
    pub fn status(&self) -> anyhow::Result<crate::model::TraceState> {
        let state = self.state();
        let (on, (limited, lost)) = match &state.maps {
            Some(m) => (m.is_on()?, m.losses()?),
            None => (false, (0, 0)),
        };
        Ok(crate::model::TraceState {
            on,
            sessions: state.sessions.len(),
            limited,
            lost,
        })
    }

    /// Tells the streams of records the datapath could not write since the last call.
    fn tell_losses(&self) {
        let mut state = self.state();
        if state.sessions.is_empty() {
            return;
        }
        let Some(Ok((limited, lost))) = state.maps.as_ref().map(TraceMaps::losses) else {
            return;
        };
        let (was_limited, was_lost) = std::mem::replace(&mut state.told, (limited, lost));
        let (limited, lost) = (
            limited.saturating_sub(was_limited),
            lost.saturating_sub(was_lost),
        );
        if limited + lost > 0 {
            let text = format!(
                "not shown: {limited} records beyond the datapath's rate ({RATE}/s per CPU), {lost} lost to its full ring"
            );
            let _ = self.entries.send(Arc::new(Entry::Notice(unix_now(), text)));
        }
    }
}

impl State {
    /// The datapath's trace as the open sessions want it: off without any.
    fn apply(&mut self) -> anyhow::Result<()> {
        let Some(maps) = self.maps.as_mut() else {
            return Ok(());
        };
        if self.sessions.is_empty() {
            return maps.stop();
        }
        let filter = Filter::union(self.sessions.values().map(|(f, _)| f));
        let last = self.sessions.values().map(|(_, d)| *d).max();
        let left = last.map_or(Duration::ZERO, |d| {
            d.saturating_duration_since(Instant::now())
        });
        let (client, client_prefix) = match filter.client {
            None => ([0; 4], 0),
            Some((std::net::IpAddr::V4(ip), len)) => (
                lb_common::mapped(u32::from_ne_bytes(ip.octets())),
                96 + u32::from(len),
            ),
            Some((std::net::IpAddr::V6(ip), len)) => {
                (lb_common::addr6(ip.octets()), u32::from(len))
            }
        };
        maps.start(&TraceFilter {
            service_id: filter.service.unwrap_or(TRACE_NONE),
            rate: RATE,
            rate_scaled: Params::per_2_32_ns(RATE),
            client_prefix,
            client,
            until_ns: monotonic_coarse_ns() + (left + DEADLINE_SLACK).as_nanos() as u64,
        })
    }
}

/// One reader of the trace: its filter, its deadline.
pub struct Session {
    hub: Arc<Hub>,
    id: u64,
    filter: Filter,
    entries: broadcast::Receiver<Arc<Entry>>,
    deadline: Instant,
    /// The first line, until given.
    started: Option<String>,
    ended: bool,
}

impl Session {
    /// The next line: a record this session's filter lets through, or a notice; None once its
    /// time is up (after a last notice saying so) or the trace's reader ended.
    pub async fn next(&mut self) -> Option<TraceLine> {
        if let Some(text) = self.started.take() {
            return Some(record::notice(text, unix_now()));
        }
        if self.ended {
            return None;
        }
        loop {
            let received = tokio::select! {
                r = self.entries.recv() => r,
                () = tokio::time::sleep_until(self.deadline) => {
                    self.ended = true;
                    return Some(record::notice("trace ended: its time is up".to_owned(), unix_now()));
                }
            };
            match received {
                Ok(entry) => match &*entry {
                    Entry::Record(time, r) if self.filter.matches(r) => {
                        let names = self
                            .hub
                            .names
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .clone();
                        return Some(record::line(r, &names, *time));
                    }
                    Entry::Record(..) => {}
                    Entry::Notice(time, text) => {
                        return Some(record::notice(text.clone(), *time));
                    }
                },
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    return Some(record::notice(
                        format!("not shown: {n} records this stream fell behind on"),
                        unix_now(),
                    ));
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.hub.close(self.id);
    }
}

/// The datapath's records, as aya-log hands them over, parsed and queued for the sessions.
pub struct Sink {
    entries: broadcast::Sender<Arc<Entry>>,
}

impl log::Log for Sink {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let text = record.args().to_string();
        match Record::parse(&text) {
            // No session, no receiver: nothing to do.
            Some(r) => drop(self.entries.send(Arc::new(Entry::Record(unix_now(), r)))),
            None => debug!(%text, "a datapath log record that is not the trace's"),
        }
    }

    fn flush(&self) {}
}

/// Reads the datapath's records as they come (the ring's descriptor turns readable; no
/// polling), and tells the sessions once a second of records the datapath could not write;
/// until `stop`.
pub async fn read(hub: Arc<Hub>, logger: EbpfLogger<Sink>, mut stop: watch::Receiver<bool>) {
    // SAFETY: the logger owns the ring's descriptor, and flushing neither closes nor replaces
    // it (aya-log's own advice).
    let registered =
        unsafe { AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE) };
    let mut logger = match registered {
        Ok(l) => l,
        Err(e) => {
            warn!(error = %e, "the datapath trace cannot be read: `lb trace` shows nothing");
            return;
        }
    };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            guard = logger.readable_mut() => match guard {
                Ok(mut guard) => {
                    guard.get_inner_mut().flush();
                    guard.clear_ready();
                }
                Err(e) => {
                    warn!(error = %e, "reading the datapath trace");
                    return;
                }
            },
            _ = tick.tick() => hub.tell_losses(),
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(service: u32, client: &str) -> Record {
        Record::parse(&format!(
            "lbtrace1 kind=1 reason=7 service={service} backend=1 prev=4294967295 snat=1 proto=6 client=::ffff:{client} cport=1 vip=::ffff:10.100.0.1 vport=80"
        ))
        .unwrap()
    }

    /// Sessions see what their filters let through, in order, after a first line saying what
    /// they show; a session's end ends its stream after a last line.
    #[tokio::test]
    async fn sessions_fan_out_by_their_filters() {
        let hub = Hub::new();
        hub.set_names(Names {
            services: [(0, "web".to_owned()), (1, "dns".to_owned())].into(),
            ..Names::default()
        });
        let sink = hub.sink();
        let mut web = hub
            .open(
                Filter {
                    service: Some(0),
                    client: None,
                },
                Duration::from_secs(60),
                "service web",
            )
            .unwrap();
        let mut all = hub
            .open(Filter::default(), Duration::from_millis(300), "everything")
            .unwrap();
        assert_eq!(hub.status().unwrap().sessions, 2);
        for (s, c) in [(1, "10.0.1.2"), (0, "10.0.1.3"), (0, "10.0.1.4")] {
            let r = record(s, c);
            drop(sink.entries.send(Arc::new(Entry::Record(1.0, r))));
        }
        let first = web.next().await.unwrap();
        assert_eq!(first.kind, "notice");
        assert!(first.text.contains("service web for 1m"), "{}", first.text);
        let clients: Vec<_> = [web.next().await.unwrap(), web.next().await.unwrap()]
            .into_iter()
            .map(|l| l.client.unwrap())
            .collect();
        assert_eq!(clients, ["10.0.1.3:1", "10.0.1.4:1"]);
        assert_eq!(all.next().await.unwrap().kind, "notice");
        for want in ["dns", "web", "web"] {
            assert_eq!(all.next().await.unwrap().service.as_deref(), Some(want));
        }
        let last = all.next().await.unwrap();
        assert_eq!(last.text, "trace ended: its time is up");
        assert!(all.next().await.is_none());
        drop(all);
        assert_eq!(hub.status().unwrap().sessions, 1);
        drop(web);
        assert_eq!(hub.status().unwrap().sessions, 0);
    }

    #[tokio::test]
    async fn a_session_that_falls_behind_is_told() {
        let hub = Hub::new();
        let sink = hub.sink();
        let mut s = hub
            .open(Filter::default(), Duration::from_secs(60), "everything")
            .unwrap();
        for _ in 0..QUEUE + 10 {
            drop(
                sink.entries
                    .send(Arc::new(Entry::Record(1.0, record(0, "10.0.1.2")))),
            );
        }
        s.next().await.unwrap();
        let told = s.next().await.unwrap();
        assert_eq!(told.kind, "notice");
        assert!(told.text.contains("10 records"), "{}", told.text);
    }
}
