//! Route health injection in the daemon: what the state wants announced, the route writes on
//! the health writer thread (right after the verdicts, admin actions and reloads that change
//! availability), the host's drain and stop, and the state kept next to a pinned datapath.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use tracing::{error, info, warn};

use super::state::{Inner, Shared};
use crate::{
    announce::{self, HostMode, RouteTable, ServiceInput, Want},
    api::RequestError,
    model::{Event, HostReply},
};

/// How long a requester (drain-host, stop) waits for the writer to write the routes.
pub const WRITE_WAIT: Duration = Duration::from_secs(5);
/// How often the writer reads the table again (a route someone else removed comes back).
pub const REREAD_EVERY: Duration = Duration::from_secs(10);

impl Inner {
    /// Each VIP and whether it is to be announced now, from its services' settings and their
    /// backends taking new flows; None when lb announces nothing.
    fn announce_wanted(&self) -> Option<BTreeMap<IpAddr, Want>> {
        let announcer = self.announcer.as_ref()?;
        let inputs: Vec<ServiceInput<'_>> = self
            .config
            .services
            .iter()
            .enumerate()
            .filter_map(|(sid, s)| {
                let available = (0..s.backends.len())
                    .filter(|&bid| self.balancer.takes_new_flows(sid, bid).unwrap_or(false))
                    .count();
                Some(ServiceInput {
                    name: &s.name,
                    vip: s.vip.ip(),
                    setting: s.announce?,
                    available,
                    backends: s.backends.len(),
                })
            })
            .collect();
        Some(announce::wanted(announcer.host(), &inputs))
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl Shared {
    /// On the health writer thread: brings `table` to what the state wants (reading it first
    /// when `reread`), logs and records each announce and withdraw. `cause` prefixes their
    /// reasons ("start").
    pub(super) fn announce_sync(
        &self,
        table: &mut dyn RouteTable,
        reread: bool,
        cause: Option<&str>,
    ) {
        let generation = self.announce.current();
        let mut guard = self.lock();
        let inner = &mut *guard;
        let Some(wanted) = inner.announce_wanted() else {
            drop(guard);
            self.announce.served(generation);
            return;
        };
        let Some(announcer) = inner.announcer.as_mut() else {
            drop(guard);
            self.announce.served(generation);
            return;
        };
        let table_id = announcer.table();
        let started = Instant::now();
        let result = announcer.sync(wanted, table, unix_now(), reread, cause);
        let write_us = started.elapsed().as_micros() as u64;
        let host = announcer.host();
        drop(guard);
        match result {
            Ok(applied) => {
                for a in applied {
                    let vip = a.change.vip;
                    match a.error {
                        None => {
                            let what = if a.change.announce {
                                "VIP announced"
                            } else {
                                "VIP withdrawn"
                            };
                            info!(
                                %vip,
                                table = table_id,
                                host = host.as_str(),
                                reason = %a.change.reason,
                                route_write_us = write_us,
                                "{what}"
                            );
                            self.events
                                .push(Event::vip(vip, a.change.announce, a.change.reason));
                        }
                        Some(e) => {
                            if self.resources.should_report("announce", Instant::now()) {
                                error!(%vip, table = table_id, error = %e, "writing a VIP's route failed: tried again with the next change or within a second");
                                self.events.push(Event::daemon(
                                    "announce failed".to_owned(),
                                    format!("{vip}: {e}"),
                                ));
                            }
                        }
                    }
                }
            }
            Err(e) => {
                if self.resources.should_report("announce", Instant::now()) {
                    error!(table = table_id, error = %e, "reading the announce table failed: nothing written; tried again within a second");
                    self.events.push(Event::daemon(
                        "announce failed".to_owned(),
                        format!("reading table {table_id}: {e}"),
                    ));
                }
            }
        }
        self.announce.served(generation);
    }

    /// `lb drain-host` (`drain`) and `lb undrain-host`: sets the host's mode, waits for the
    /// writer to write the routes, and says what is announced.
    pub fn set_host_drained(&self, drain: bool) -> Result<HostReply, RequestError> {
        let mut guard = self.lock();
        let Some(announcer) = guard.announcer.as_mut() else {
            return Ok(HostReply {
                state: None,
                announced: Vec::new(),
                message: format!(
                    "lb announces nothing (no [lb.announce] in its config): nothing to {}",
                    if drain { "withdraw" } else { "announce" }
                ),
            });
        };
        if announcer.host() == HostMode::Stopping {
            return Err(RequestError::Invalid(vec![
                "lb is stopping: its VIPs stay withdrawn".to_owned(),
            ]));
        }
        let mode = if drain {
            HostMode::Drained
        } else {
            HostMode::Announcing
        };
        let changed = announcer.set_host(mode);
        let table = announcer.table();
        drop(guard);
        let action = if drain { "drain-host" } else { "undrain-host" };
        if changed {
            info!(action, table, "host {}", mode.as_str());
            let what = if drain {
                "every VIP withdrawn; forwarding goes on"
            } else {
                "VIPs announced again as their services want"
            };
            self.events
                .push(Event::daemon(format!("admin: {action}"), what.to_owned()));
            self.save_host_state();
        }
        let written = self.announce.wait(self.announce.request(), WRITE_WAIT);
        let guard = self.lock();
        let Some(announcer) = guard.announcer.as_ref() else {
            return Err(RequestError::Failed(anyhow::anyhow!("announcer gone")));
        };
        let vips = announcer.vips();
        let announced: Vec<String> = vips
            .iter()
            .filter(|v| v.announced)
            .map(|v| v.vip.to_string())
            .collect();
        let settled = announcer.settled();
        drop(guard);
        let mut message = if drain {
            format!(
                "host drained: every VIP withdrawn from table {table} ({} still announced); lb \
                 keeps forwarding; `lb undrain-host` announces them again",
                announced.len()
            )
        } else {
            format!(
                "host announcing: {} of {} VIPs announced in table {table}, as their services want",
                announced.len(),
                vips.len()
            )
        };
        if !written || !settled {
            message.push_str(" (not every route could be written yet: see the log and the status)");
        }
        Ok(HostReply {
            state: Some(mode.as_str().to_owned()),
            announced,
            message,
        })
    }

    /// Before `lb stop` removes the datapath: every VIP withdrawn. Returns the generation to
    /// wait for and the grace period to forward for afterwards; None when lb announces nothing.
    pub(super) fn stop_announcing(&self) -> Option<(u64, Duration)> {
        let mut guard = self.lock();
        let grace = guard.config.lb.announce.as_ref()?.grace;
        guard.announcer.as_mut()?.set_host(HostMode::Stopping);
        drop(guard);
        info!("stopping: withdrawing every VIP first");
        Some((self.announce.request(), grace))
    }

    /// The grace period `lb stop` would forward for after withdrawing (None: it stops at once).
    pub fn stop_grace(&self) -> Option<Duration> {
        self.lock().config.lb.announce.as_ref().map(|a| a.grace)
    }

    /// Keeps the host's announcing state next to a pinned datapath (the table, and whether it
    /// is drained), so a restart stays drained and `lb stop` without a daemon can withdraw.
    pub(super) fn save_host_state(&self) {
        let Some(path) = &self.host_file else { return };
        let state = {
            let inner = self.lock();
            inner.announcer.as_ref().map(|a| HostState {
                table: a.table(),
                drained: a.host() == HostMode::Drained,
            })
        };
        let Some(state) = state else { return };
        if let Err(e) = write_host_state(path, &state) {
            warn!(path = %path.display(), error = %format!("{e:#}"), "saving the host's announcing state failed: a restart would announce again");
        }
    }
}

/// What is kept of the host's announcing across restarts of a pinned datapath.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostState {
    pub table: u32,
    pub drained: bool,
}

/// Where the announcing state of the datapath pinned at `pin_path` is kept: next to its ids.
pub fn host_file(pin_path: &Path) -> PathBuf {
    super::state::ids_file(pin_path).with_extension("announce.json")
}

pub fn read_host_state(path: &Path) -> anyhow::Result<Option<HostState>> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .with_context(|| format!("parsing {}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

fn write_host_state(path: &Path, state: &HostState) -> anyhow::Result<()> {
    let dir = path.parent().context("no directory")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(state)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
}

/// Removes the routes a run that announced left in its table (`lb stop` of a datapath whose
/// daemon is gone, or whose config no longer announces) and its state file; what it removed.
pub fn withdraw_left_over(host_file: &Path) -> anyhow::Result<Vec<IpAddr>> {
    let Some(state) = read_host_state(host_file)? else {
        return Ok(Vec::new());
    };
    let removed = announce::flush(state.table)
        .with_context(|| format!("removing lb's routes from table {}", state.table))?;
    let _ = std::fs::remove_file(host_file); // gone already is fine
    Ok(removed)
}
