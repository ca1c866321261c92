//! The control API. For now it serves the datapath counters; status, events and admin endpoints
//! are added with the health checker and daemon issues.

pub mod html;
pub mod metrics;
pub mod model;

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use anyhow::Context as _;
use axum::{
    Json, Router,
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::get,
};
use lb_common::counter;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::{
    balancer::Balancer,
    config::Config,
    dataplane::{Dataplane, TrafficCounters},
};

/// What the API reads from.
#[derive(Clone)]
pub struct ApiState {
    pub config: Arc<Config>,
    pub dataplane: Arc<Mutex<Dataplane>>,
    pub balancer: Arc<Mutex<Balancer>>,
    pub health: Arc<Mutex<crate::daemon::HealthStates>>,
}

/// `GET /v1/stats`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StatsReply {
    /// Datapath counters by name (see README, "Counters").
    pub counters: Vec<NamedCounter>,
    pub services: Vec<ServiceStatsReply>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NamedCounter {
    pub name: String,
    pub value: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ServiceStatsReply {
    pub name: String,
    pub vip: String,
    pub protocol: String,
    /// Check kind, and SPEC's failure and success windows in seconds (worst-case response time).
    pub check: String,
    pub failure_window_s: Option<f64>,
    pub success_window_s: Option<f64>,
    pub packets: u64,
    pub bytes: u64,
    pub new_flows: u64,
    pub backends: Vec<BackendStatsReply>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct BackendStatsReply {
    pub address: String,
    pub weight: u32,
    /// Health state (`initializing`, `healthy`, ... see README).
    pub state: String,
    pub packets: u64,
    pub bytes: u64,
    pub new_flows: u64,
}

impl StatsReply {
    pub fn counter(&self, name: &str) -> Option<u64> {
        self.counters
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.value)
    }
}

pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/v1/stats", get(stats))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "no such endpoint") })
        .with_state(state)
}

/// Serves until `shutdown` turns true.
pub async fn serve(
    addr: SocketAddr,
    state: ApiState,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the control API to {addr}"))?;
    tracing::info!(%addr, "control API listening");
    axum::serve(listener, router(state))
        .with_graceful_shutdown(async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        })
        .await
        .context("control API")
}

async fn stats(State(state): State<ApiState>) -> Response {
    let stats = match state.dataplane.lock().expect("dataplane lock").stats() {
        Ok(s) => s,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, &format!("{e:#}")),
    };
    let counters = counter::NAMES
        .iter()
        .zip(&stats.counters)
        .map(|(name, value)| NamedCounter {
            name: (*name).to_owned(),
            value: *value,
        })
        .collect();
    let balancer = state.balancer.lock().expect("balancer lock");
    let health = state.health.lock().expect("health lock");
    let services = state
        .config
        .services
        .iter()
        .enumerate()
        .map(|(sid, s)| {
            let c = stats.services.get(sid).copied().unwrap_or_default();
            let backends = s
                .backends
                .iter()
                .enumerate()
                .map(|(bi, b)| {
                    let t: TrafficCounters = balancer
                        .backend_id(sid, bi)
                        .and_then(|id| stats.backends.get(id as usize).copied())
                        .unwrap_or_default();
                    BackendStatsReply {
                        address: b.address.to_string(),
                        weight: b.weight,
                        state: health[sid][bi].as_str().to_owned(),
                        packets: t.packets,
                        bytes: t.bytes,
                        new_flows: t.new_flows,
                    }
                })
                .collect();
            let windows = s.check.windows();
            ServiceStatsReply {
                name: s.name.clone(),
                vip: s.vip.to_string(),
                protocol: s.protocol.as_str().to_owned(),
                check: s.check.kind.as_str().to_owned(),
                failure_window_s: windows.map(|w| w.0),
                success_window_s: windows.map(|w| w.1),
                packets: c.packets,
                bytes: c.bytes,
                new_flows: c.new_flows,
                backends,
            }
        })
        .collect();
    Json(StatsReply { counters, services }).into_response()
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(serde_json::json!({ "error": message }))).into_response()
}
