//! `lb run`: load the config, load and fill the datapath, attach, serve the API, and on SIGINT or
//! SIGTERM detach and exit.

use std::{
    path::Path,
    sync::{Arc, Mutex},
};

use anyhow::Context as _;
use lb_common::counter;
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::watch,
};
use tracing::{Instrument as _, error, info, info_span};

use crate::{
    api::{self, ApiState},
    config::Config,
    dataplane::Dataplane,
};

pub async fn run(config_path: &Path, config: Config) -> anyhow::Result<()> {
    let mut dataplane = Dataplane::load()?;
    // Fill the maps before attaching: the program never sees a half-written service set.
    dataplane.set_services(&config.services)?;
    for iface in &config.lb.interfaces {
        dataplane.attach(iface, config.lb.xdp_mode)?;
    }
    info!(
        config = %config_path.display(),
        services = config.services.len(),
        interfaces = ?config.lb.interfaces,
        "lb running"
    );

    let dataplane = Arc::new(Mutex::new(dataplane));
    let (stop_tx, stop_rx) = watch::channel(false);
    let state = ApiState {
        config: Arc::new(config.clone()),
        dataplane: dataplane.clone(),
    };
    let mut api =
        tokio::spawn(api::serve(config.lb.api, state, stop_rx).instrument(info_span!("api")));

    let mut sigterm = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let result = tokio::select! {
        _ = sigterm.recv() => { info!("SIGTERM: shutting down"); Ok(()) }
        _ = sigint.recv() => { info!("SIGINT: shutting down"); Ok(()) }
        // The API only ends early on error (e.g. its address is taken): stop everything.
        res = &mut api => match res {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e),
            Err(e) => Err(anyhow::Error::new(e).context("control API task")),
        },
    };
    // Receivers may already be gone when the API task ended; nothing else listens.
    stop_tx.send_replace(true);
    if !api.is_finished() {
        match api.await {
            Ok(Err(e)) => error!(error = %format!("{e:#}"), "control API"),
            Err(e) => error!(error = %e, "control API task"),
            Ok(Ok(())) => {}
        }
    }

    let mut dataplane = dataplane.lock().expect("dataplane lock");
    if let Ok(stats) = dataplane.stats() {
        info!(
            vip_hit = stats.counter(counter::VIP_HIT),
            pass_not_vip = stats.counter(counter::PASS_NOT_VIP),
            "final counters"
        );
    }
    dataplane.detach_all();
    result
}
