//! What moving from one configuration to another changes: services added, removed and changed
//! (which settings), backends added, removed and changed (weights, admin). What a dry run
//! answers, `lb config diff` prints and a change's event says.

use std::{collections::HashMap, fmt, net::SocketAddr};

use serde::{Deserialize, Serialize};

use super::{Backend, Config, Service};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diff {
    /// `[lb]` keys that differ.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lb: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services_added: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services_removed: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services_changed: Vec<ServiceDiff>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceDiff {
    pub name: String,
    /// Its settings that differ (`vip`, `check`, ...), backends aside.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub settings: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backends_added: Vec<BackendChange>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backends_removed: Vec<SocketAddr>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backends_changed: Vec<BackendChange>,
}

/// A backend as it is after the change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendChange {
    pub address: SocketAddr,
    pub weight: u32,
    /// Its weight before (changed backends only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub was_weight: Option<u32>,
}

impl Diff {
    /// From `old` to `new`. Services are matched by name, backends by address.
    pub fn between(old: &Config, new: &Config) -> Self {
        let mut diff = Diff {
            lb: old
                .lb
                .changed_keys(&new.lb)
                .into_iter()
                .map(str::to_owned)
                .collect(),
            ..Diff::default()
        };
        let olds: HashMap<&str, &Service> =
            old.services.iter().map(|s| (s.name.as_str(), s)).collect();
        let news: HashMap<&str, &Service> =
            new.services.iter().map(|s| (s.name.as_str(), s)).collect();
        for s in &new.services {
            match olds.get(s.name.as_str()) {
                None => diff.services_added.push(s.name.clone()),
                Some(o) if *o != s => diff.services_changed.push(service_diff(o, s)),
                Some(_) => {}
            }
        }
        diff.services_removed = old
            .services
            .iter()
            .filter(|s| !news.contains_key(s.name.as_str()))
            .map(|s| s.name.clone())
            .collect();
        diff
    }

    pub fn is_empty(&self) -> bool {
        *self == Diff::default()
    }
}

fn service_diff(old: &Service, new: &Service) -> ServiceDiff {
    let mut settings = Vec::new();
    let mut check = |name: &str, same: bool| {
        if !same {
            settings.push(name.to_owned());
        }
    };
    check("vip", old.vip == new.vip);
    check("protocol", old.protocol == new.protocol);
    check("forwarding", old.forwarding == new.forwarding);
    check("snat_address", old.snat_address == new.snat_address);
    check("existing_flows", old.existing_flows == new.existing_flows);
    check("syn_proxy", old.syn_proxy == new.syn_proxy);
    check(
        "on_all_unhealthy",
        old.on_all_unhealthy == new.on_all_unhealthy,
    );
    check("answer_ping", old.answer_ping == new.answer_ping);
    check("check", old.check == new.check);
    check("passive", old.passive == new.passive);
    check("announce", old.announce == new.announce);
    check("backends_from", old.discovery == new.discovery);
    check("quic", old.quic == new.quic);
    let olds: HashMap<SocketAddr, &Backend> = old.backends.iter().map(|b| (b.address, b)).collect();
    let news: HashMap<SocketAddr, &Backend> = new.backends.iter().map(|b| (b.address, b)).collect();
    let mut diff = ServiceDiff {
        name: new.name.clone(),
        settings,
        ..ServiceDiff::default()
    };
    for b in &new.backends {
        match olds.get(&b.address) {
            None => diff.backends_added.push(BackendChange {
                address: b.address,
                weight: b.weight,
                was_weight: None,
            }),
            Some(o) if o.weight != b.weight || o.server_id != b.server_id => {
                diff.backends_changed.push(BackendChange {
                    address: b.address,
                    weight: b.weight,
                    was_weight: Some(o.weight),
                })
            }
            Some(_) => {}
        }
    }
    diff.backends_removed = old
        .backends
        .iter()
        .filter(|b| !news.contains_key(&b.address))
        .map(|b| b.address)
        .collect();
    if diff.settings.is_empty()
        && diff.backends_added.is_empty()
        && diff.backends_removed.is_empty()
        && diff.backends_changed.is_empty()
    {
        // Only the order of the backends moved: that is a change of the ring too.
        diff.settings.push("backends (order)".to_owned());
    }
    diff
}

impl fmt::Display for Diff {
    /// One line per change (`+ service web`, `~ web: backend 10.0.2.10:80 weight 1 -> 2`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return writeln!(f, "no change");
        }
        for key in &self.lb {
            writeln!(f, "~ lb.{key}")?;
        }
        for s in &self.services_added {
            writeln!(f, "+ service {s}")?;
        }
        for s in &self.services_removed {
            writeln!(f, "- service {s}")?;
        }
        for s in &self.services_changed {
            for setting in &s.settings {
                writeln!(f, "~ {}: {setting}", s.name)?;
            }
            for b in &s.backends_added {
                writeln!(f, "+ {}: backend {} weight {}", s.name, b.address, b.weight)?;
            }
            for b in &s.backends_removed {
                writeln!(f, "- {}: backend {b}", s.name)?;
            }
            for b in &s.backends_changed {
                let was = b.was_weight.unwrap_or_default();
                writeln!(
                    f,
                    "~ {}: backend {} weight {was} -> {}",
                    s.name, b.address, b.weight
                )?;
            }
        }
        Ok(())
    }
}

impl Diff {
    /// One line for an event: its first change, and how many more.
    pub fn summary(&self) -> String {
        let text = self.to_string();
        let mut lines = text.lines();
        let first = lines.next().unwrap_or("no change").to_owned();
        match lines.count() {
            0 => first,
            more => format!("{first} (and {more} more)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(services: &str) -> Config {
        crate::config::parse(&format!("[lb]\ninterfaces = [\"eth0\"]\n{services}")).unwrap()
    }

    const WEB: &str = "[[service]]\nname = \"web\"\nvip = \"10.100.0.1:80\"\nbackends = [\
                       { address = \"10.0.2.1:80\" }, { address = \"10.0.2.2:80\" }]\n";

    #[test]
    fn every_kind_of_change_is_named() {
        let old = config(WEB);
        assert!(Diff::between(&old, &old).is_empty());
        let new = config(&format!(
            "{}\n[[service]]\nname = \"dns\"\nvip = \"10.100.0.1:53\"\nprotocol = \"udp\"\n\
             backends = [{{ address = \"10.0.2.1:53\" }}]\n",
            WEB.replace("\"10.0.2.1:80\" }", "\"10.0.2.1:80\", weight = 3 }")
                .replace("\"10.0.2.2:80\"", "\"10.0.2.3:80\"")
                .replace("backends", "on_all_unhealthy = \"drop\"\nbackends")
        ));
        let diff = Diff::between(&old, &new);
        assert_eq!(diff.services_added, ["dns"]);
        assert_eq!(
            diff.to_string(),
            "+ service dns\n~ web: on_all_unhealthy\n+ web: backend 10.0.2.3:80 weight 1\n\
             - web: backend 10.0.2.2:80\n~ web: backend 10.0.2.1:80 weight 1 -> 3\n"
        );
        assert_eq!(diff.summary(), "+ service dns (and 4 more)");
        let back = Diff::between(&new, &old);
        assert_eq!(back.services_removed, ["dns"]);
        let json = serde_json::to_string(&diff).unwrap();
        assert_eq!(serde_json::from_str::<Diff>(&json).unwrap(), diff);
    }
}
