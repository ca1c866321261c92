//! The daemon as the control API sees it ([`api::Control`]): its requests answered from the
//! shared state, in the API's wire model.

use crate::{
    api::{self, RequestError},
    events::EventLog,
    model::{Admin, AdminReply, HostReply, ReloadReply, Status, StopReply},
    resources::Resources,
};

use super::{Shared, Stop};

impl api::Control for Shared {
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
}
