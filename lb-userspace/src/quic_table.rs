//! The QUIC routing's maps as the balancer writes them (lb_common's quic.rs): each QUIC
//! service's layout word, each backend's server ID, and (service, server ID) → backend. Planned
//! whole from the services, written by difference with what was written before.

use std::collections::HashMap;

use lb_common::QuicServerKey;

/// One QUIC service as the maps see it.
pub struct QuicService {
    pub id: u32,
    /// Its layout word (`lb_common::quic_layout_word`).
    pub word: u32,
    /// (backend id, server ID) of each backend that has one.
    pub backends: Vec<(u32, u64)>,
}

/// One write to the maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuicWrite {
    /// Service id → layout word; 0 clears it.
    Layout(u32, u32),
    /// Backend id → server ID; None clears it.
    Id(u32, Option<u64>),
    /// (service, server ID) → backend id; None removes it.
    Server(QuicServerKey, Option<u32>),
}

/// The maps' content.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QuicTable {
    layouts: HashMap<u32, u32>,
    ids: HashMap<u32, u64>,
    servers: HashMap<(u32, u64), u32>,
}

fn key(service_id: u32, server_id: u64) -> QuicServerKey {
    QuicServerKey {
        service_id,
        _pad: 0,
        server_id,
    }
}

impl QuicTable {
    /// What the maps hold for `services`.
    pub fn plan(services: impl IntoIterator<Item = QuicService>) -> Self {
        let mut t = Self::default();
        for s in services {
            t.layouts.insert(s.id, s.word);
            for (backend, server) in s.backends {
                t.ids.insert(backend, server);
                t.servers.insert((s.id, server), backend);
            }
        }
        t
    }

    /// The writes that turn `old` into this: new and changed entries first (a backend named
    /// before its old entry goes), then removals.
    pub fn changes_from(&self, old: &QuicTable) -> Vec<QuicWrite> {
        let mut out = Vec::new();
        for (&id, &word) in &self.layouts {
            if old.layouts.get(&id) != Some(&word) {
                out.push(QuicWrite::Layout(id, word));
            }
        }
        for (&id, &server) in &self.ids {
            if old.ids.get(&id) != Some(&server) {
                out.push(QuicWrite::Id(id, Some(server)));
            }
        }
        for (&(service, server), &backend) in &self.servers {
            if old.servers.get(&(service, server)) != Some(&backend) {
                out.push(QuicWrite::Server(key(service, server), Some(backend)));
            }
        }
        out.extend(
            old.servers
                .keys()
                .filter(|k| !self.servers.contains_key(k))
                .map(|&(service, server)| QuicWrite::Server(key(service, server), None)),
        );
        out.extend(
            old.ids
                .keys()
                .filter(|k| !self.ids.contains_key(k))
                .map(|&id| QuicWrite::Id(id, None)),
        );
        out.extend(
            old.layouts
                .keys()
                .filter(|k| !self.layouts.contains_key(k))
                .map(|&id| QuicWrite::Layout(id, 0)),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(id: u32, word: u32, backends: &[(u32, u64)]) -> QuicService {
        QuicService {
            id,
            word,
            backends: backends.to_vec(),
        }
    }

    #[test]
    fn writes_only_what_changed_and_removes_what_went() {
        let empty = QuicTable::default();
        let a = QuicTable::plan([svc(0, 0x102, &[(10, 1), (11, 2)])]);
        let mut first = a.changes_from(&empty);
        first.sort_by_key(|w| format!("{w:?}"));
        assert_eq!(first.len(), 5, "{first:?}");
        assert!(a.changes_from(&a).is_empty());

        // Backend 11 leaves, 12 comes with server ID 3, 10 changes its ID; another service.
        let b = QuicTable::plan([
            svc(0, 0x102, &[(10, 7), (12, 3)]),
            svc(1, 0x101, &[(20, 1)]),
        ]);
        let w = b.changes_from(&a);
        let has = |x: QuicWrite| w.contains(&x);
        assert!(has(QuicWrite::Id(10, Some(7))));
        assert!(has(QuicWrite::Id(12, Some(3))));
        assert!(has(QuicWrite::Id(11, None)));
        assert!(has(QuicWrite::Server(key(0, 7), Some(10))));
        assert!(has(QuicWrite::Server(key(0, 1), None)));
        assert!(has(QuicWrite::Server(key(0, 2), None)));
        assert!(has(QuicWrite::Layout(1, 0x101)));
        assert!(!has(QuicWrite::Layout(0, 0x102)), "unchanged: not written");
        // Removals after every new entry.
        let first_removal = w
            .iter()
            .position(|x| matches!(x, QuicWrite::Server(_, None) | QuicWrite::Id(_, None)));
        let last_add = w
            .iter()
            .rposition(|x| matches!(x, QuicWrite::Server(_, Some(_)) | QuicWrite::Id(_, Some(_))));
        assert!(first_removal > last_add);

        // A service that stops being QUIC is cleared whole.
        let c = QuicTable::plan([svc(1, 0x101, &[(20, 1)])]);
        let w = c.changes_from(&b);
        assert!(w.contains(&QuicWrite::Layout(0, 0)));
        assert!(w.contains(&QuicWrite::Id(10, None)));
        assert!(w.contains(&QuicWrite::Server(key(0, 3), None)));
    }
}
