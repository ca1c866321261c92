//! The daemon as the control API sees it ([`api::Control`]): its requests answered from the
//! shared state, in the API's wire model.

use crate::{
    api::{self, RequestError},
    events::EventLog,
    model::{Admin, AdminReply, HostReply, ReloadReply, Status, StopReply, TraceState},
    resources::Resources,
    trace,
};

use super::{Shared, Stop};

impl api::Control for Shared {
    fn config(
        &self,
    ) -> Result<(crate::source::Version, String, std::sync::Arc<str>), RequestError> {
        let (version, text) = self.config.running();
        Ok((version, self.config.place(), text))
    }

    fn change(&self, req: api::ChangeRequest) -> Result<crate::model::ChangeReply, RequestError> {
        self.change_config(req)
    }

    fn status(&self, only: Option<&str>) -> Result<Status, RequestError> {
        Shared::status(self, only)
    }

    fn events(&self) -> &EventLog {
        &self.events
    }

    fn set_admin(
        &self,
        service: &str,
        backend: &str,
        admin: Admin,
    ) -> Result<AdminReply, RequestError> {
        let view = Shared::set_admin(self, service, backend, admin)?;
        // Named as the status names it: canonical, whatever spelling the request used (it
        // parsed, or set_admin had refused it).
        let backend = backend
            .parse::<std::net::SocketAddr>()
            .map_or_else(|_| backend.to_owned(), |a| a.to_string());
        Ok(AdminReply {
            service: service.to_owned(),
            backend,
            admin: view.admin,
            state: view.state,
        })
    }

    fn reload(&self, via: &str) -> Result<ReloadReply, RequestError> {
        let (changes, probes) = Shared::reload(self, via)?;
        let named = |list: Vec<(String, std::net::SocketAddr)>| {
            list.into_iter().map(|(s, b)| format!("{s} {b}")).collect()
        };
        Ok(ReloadReply {
            services_added: changes.services_added,
            services_removed: changes.services_removed,
            services_changed: changes.services_changed,
            backends_added: named(changes.backends_added),
            backends_removed: named(changes.backends_removed),
            probes_started: probes.started,
            probes_stopped: probes.stopped,
        })
    }

    fn stop(&self) -> StopReply {
        self.request_stop(Stop::Remove);
        StopReply {
            stopping: true,
            grace_s: self.stop_grace().map(|g| g.as_secs_f64()),
        }
    }

    fn host(&self, drain: bool) -> Result<HostReply, RequestError> {
        self.set_host_drained(drain)
    }

    fn resources(&self) -> &Resources {
        &self.resources
    }

    fn local_shortage(&self, place: &'static str, what: &str) {
        Shared::local_shortage(self, place, what);
    }

    fn trace(
        &self,
        service: Option<&str>,
        client: Option<&str>,
        duration: std::time::Duration,
    ) -> Result<trace::Session, RequestError> {
        let service_id = match service {
            None => None,
            Some(name) => {
                let inner = self.lock();
                let id = inner
                    .balancer
                    .service_index(name)
                    .and_then(|i| inner.balancer.service_id(i));
                Some(id.ok_or_else(|| RequestError::NotFound(format!("no service {name:?}")))?)
            }
        };
        let client = client
            .map(trace::record::parse_client)
            .transpose()
            .map_err(|e| RequestError::Invalid(vec![e]))?;
        let what = match (service, client) {
            (None, None) => "every packet".to_owned(),
            (Some(s), None) => format!("service {s}"),
            (None, Some((ip, len))) => format!("client {ip}/{len}"),
            (Some(s), Some((ip, len))) => format!("service {s}, client {ip}/{len}"),
        };
        let filter = trace::Filter {
            service: service_id,
            client,
        };
        self.trace
            .open(filter, duration, &what)
            .map_err(RequestError::Failed)
    }

    fn trace_state(&self) -> Result<TraceState, RequestError> {
        self.trace.status().map_err(RequestError::Failed)
    }
}
