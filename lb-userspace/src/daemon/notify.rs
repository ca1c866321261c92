//! systemd's notification protocol (sd_notify(3)), for `Type=notify` units: READY=1 once lb
//! forwards and its API listens, STATUS= with a one-line summary when it changes, WATCHDOG=1
//! while health keeps reaching the datapath, STOPPING=1 on the way out. Nothing at all without
//! `$NOTIFY_SOCKET` (not started by systemd).

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use sd_notify::NotifyState;

/// What the health writer tells systemd as it goes.
pub struct Notifier {
    enabled: bool,
    /// `$WATCHDOG_USEC` (for this process): systemd restarts lb when a ping is this late.
    watchdog: Option<Duration>,
    status: String,
}

impl Notifier {
    pub fn from_env() -> Self {
        Self {
            enabled: std::env::var_os("NOTIFY_SOCKET").is_some(),
            watchdog: sd_notify::watchdog_enabled(),
            status: String::new(),
        }
    }

    /// How often the writer must show it is alive: half the watchdog interval, as sd_notify(3)
    /// advises, so one late tick is not yet a restart.
    pub fn ping_every(&self) -> Option<Duration> {
        self.watchdog.map(|w| w / 2)
    }

    /// READY=1 with the first status line.
    pub fn ready(&mut self, status: String) {
        if self.enabled {
            send(&[NotifyState::Ready, NotifyState::Status(&status)]);
            self.status = status;
        }
    }

    /// Called from the loop that applies verdicts, at least every [`Notifier::ping_every`]:
    /// WATCHDOG=1, and the status when it changed (`status` is only called when enabled).
    pub fn alive(&mut self, status: impl FnOnce() -> String) {
        if !self.enabled {
            return;
        }
        let status = status();
        let changed = status != self.status;
        match (self.watchdog.is_some(), changed) {
            (true, true) => send(&[NotifyState::Watchdog, NotifyState::Status(&status)]),
            (true, false) => send(&[NotifyState::Watchdog]),
            (false, true) => send(&[NotifyState::Status(&status)]),
            (false, false) => {}
        }
        self.status = status;
    }
}

/// STOPPING=1: systemd shows the unit deactivating rather than failed meanwhile.
pub fn stopping() {
    if std::env::var_os("NOTIFY_SOCKET").is_some() {
        send(&[NotifyState::Stopping]);
    }
}

fn send(states: &[NotifyState<'_>]) {
    // Once: a socket that is gone stays gone, and the pings come every few seconds.
    static WARNED: AtomicBool = AtomicBool::new(false);
    if let Err(e) = sd_notify::notify(states)
        && !WARNED.swap(true, Ordering::Relaxed)
    {
        tracing::warn!(error = %e, "cannot notify systemd through $NOTIFY_SOCKET");
    }
}
