//! The announcer without a kernel: a table in memory that can be told to fail.

use std::{
    collections::{BTreeMap, BTreeSet},
    io,
    net::IpAddr,
};

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn healthy(min: u32) -> ServiceAnnounce {
    ServiceAnnounce {
        mode: AnnounceMode::Healthy,
        min_available: min,
    }
}

fn mode(mode: AnnounceMode) -> ServiceAnnounce {
    ServiceAnnounce {
        mode,
        min_available: 1,
    }
}

fn input<'a>(
    name: &'a str,
    vip: &str,
    setting: ServiceAnnounce,
    up: usize,
    of: usize,
) -> ServiceInput<'a> {
    ServiceInput {
        name,
        vip: ip(vip),
        setting,
        available: up,
        backends: of,
    }
}

/// A routing table in memory, with the writes it saw; `fail_add`/`fail_list` make it fail.
#[derive(Default)]
struct Table {
    routes: BTreeSet<IpAddr>,
    writes: Vec<(bool, IpAddr)>,
    fail_add: bool,
    fail_list: bool,
}

impl RouteTable for Table {
    fn list(&mut self) -> io::Result<BTreeSet<IpAddr>> {
        if self.fail_list {
            return Err(io::Error::from_raw_os_error(libc::EPERM));
        }
        Ok(self.routes.clone())
    }
    fn add(&mut self, vip: IpAddr) -> io::Result<()> {
        if self.fail_add {
            return Err(io::Error::from_raw_os_error(libc::ENOBUFS));
        }
        self.writes.push((true, vip));
        self.routes.insert(vip);
        Ok(())
    }
    fn remove(&mut self, vip: IpAddr) -> io::Result<()> {
        self.writes.push((false, vip));
        self.routes.remove(&vip);
        Ok(())
    }
}

#[test]
fn each_mode_wants_and_says_why() {
    let web = input("web", "10.100.0.1", healthy(1), 0, 3);
    assert!(!web.wants());
    assert_eq!(web.why(), "web: 0 of 3 backends available (needs 1)");
    let one = input("one", "10.100.0.1", healthy(1), 1, 1);
    assert!(one.wants());
    assert_eq!(one.why(), "one: 1 of 1 backend available (needs 1)");
    let two = input("api", "10.100.0.1", healthy(2), 1, 3);
    assert!(!two.wants(), "below announce_min_available");
    assert!(input("api", "10.100.0.1", healthy(2), 2, 3).wants());
    let always = input("dns", "10.100.0.1", mode(AnnounceMode::Always), 0, 2);
    assert!(always.wants());
    assert_eq!(always.why(), "dns: announce = always");
    let never = input("ntp", "10.100.0.1", mode(AnnounceMode::Never), 2, 2);
    assert!(!never.wants());
    assert_eq!(never.why(), "ntp: announce = never");
}

#[test]
fn a_vip_is_announced_while_one_of_its_services_wants_it() {
    let services = [
        input("web", "10.100.0.1", healthy(1), 0, 3),
        input("web-udp", "10.100.0.1", healthy(1), 2, 3),
        input("api", "10.100.0.2", healthy(1), 0, 2),
        input("dns", "2001:db8:100::1", mode(AnnounceMode::Always), 0, 1),
        input("ntp", "10.100.0.3", mode(AnnounceMode::Never), 1, 1),
    ];
    let w = wanted(HostMode::Announcing, &services);
    assert_eq!(w.len(), 4);
    let shared = &w[&ip("10.100.0.1")];
    assert!(shared.announce, "the healthy service keeps it");
    assert_eq!(
        shared.reason,
        "web-udp: 2 of 3 backends available (needs 1)"
    );
    assert_eq!(shared.services, ["web", "web-udp"]);
    let api = &w[&ip("10.100.0.2")];
    assert!(!api.announce);
    assert_eq!(api.reason, "api: 0 of 2 backends available (needs 1)");
    assert!(w[&ip("2001:db8:100::1")].announce);
    assert!(!w[&ip("10.100.0.3")].announce);
    // Both down: withdrawn, every service says why.
    let down = [
        input("web", "10.100.0.1", healthy(1), 0, 3),
        input("web-udp", "10.100.0.1", healthy(2), 1, 3),
    ];
    let w = wanted(HostMode::Announcing, &down);
    assert_eq!(
        w[&ip("10.100.0.1")],
        Want {
            announce: false,
            reason: "web: 0 of 3 backends available (needs 1); web-udp: 1 of 3 backends available (needs 2)".into(),
            services: vec!["web".into(), "web-udp".into()],
        }
    );
    // The host's mode overrides everything.
    for (host, why) in [
        (HostMode::Drained, "drain-host"),
        (HostMode::Stopping, "stop"),
    ] {
        let w = wanted(host, &services);
        assert!(
            w.values().all(|w| !w.announce && w.reason == why),
            "{host:?}"
        );
        assert_eq!(host.withdraws_all(), Some(why));
    }
    assert!(wanted(HostMode::Announcing, &[]).is_empty());
}

#[test]
fn diff_withdraws_first_then_announces() {
    let services = [
        input("a", "10.100.0.1", healthy(1), 1, 1),
        input("b", "10.100.0.2", healthy(1), 0, 1),
        input("c", "10.100.0.3", healthy(1), 1, 1),
    ];
    let w = wanted(HostMode::Announcing, &services);
    let announced: BTreeSet<IpAddr> = [ip("10.100.0.2"), ip("10.100.0.3"), ip("10.100.0.9")].into();
    let changes = diff(&w, &announced);
    assert_eq!(
        changes,
        [
            Change {
                vip: ip("10.100.0.2"),
                announce: false,
                reason: "b: 0 of 1 backend available (needs 1)".into()
            },
            Change {
                vip: ip("10.100.0.9"),
                announce: false,
                reason: NO_SERVICE.into()
            },
            Change {
                vip: ip("10.100.0.1"),
                announce: true,
                reason: "a: 1 of 1 backend available (needs 1)".into()
            },
        ]
    );
    let done: BTreeSet<IpAddr> = [ip("10.100.0.1"), ip("10.100.0.3")].into();
    assert!(diff(&w, &done).is_empty());
}

#[test]
fn a_restart_keeps_what_is_wanted_and_removes_the_rest() {
    // A previous run left two routes: one still wanted, one of a VIP no service has now.
    let mut table = Table {
        routes: [ip("10.100.0.1"), ip("10.100.0.7")].into(),
        ..Table::default()
    };
    let services = [
        input("web", "10.100.0.1", healthy(1), 3, 3),
        input("api", "10.100.0.2", mode(AnnounceMode::Always), 0, 1),
    ];
    let mut a = Announcer::new(200, HostMode::Announcing);
    assert!(!a.settled(), "not read yet");
    let applied = a
        .sync(
            wanted(HostMode::Announcing, &services),
            &mut table,
            10.0,
            false,
            Some("start"),
        )
        .unwrap();
    let shown: Vec<(IpAddr, bool, &str)> = applied
        .iter()
        .map(|x| (x.change.vip, x.change.announce, x.change.reason.as_str()))
        .collect();
    assert_eq!(
        shown,
        [
            (ip("10.100.0.7"), false, "start: no service has this VIP"),
            (ip("10.100.0.2"), true, "start: api: announce = always"),
        ]
    );
    assert!(applied.iter().all(|x| x.error.is_none()));
    // The kept route was never withdrawn: no write touched it.
    assert!(!table.writes.iter().any(|(_, vip)| *vip == ip("10.100.0.1")));
    assert_eq!(table.routes, [ip("10.100.0.1"), ip("10.100.0.2")].into());
    assert!(a.settled());
    assert!(a.is_announced(ip("10.100.0.1")));
    assert_eq!(a.announced_count(), 2);
    assert_eq!(a.last_change(), Some(10.0));
    let views = a.vips();
    assert_eq!(views.len(), 2, "the removed VIP is forgotten");
    assert_eq!(views[0].vip, ip("10.100.0.1"));
    assert_eq!((views[0].announced, views[0].wanted), (true, Some(true)));
    assert_eq!(
        views[0].since, None,
        "kept from before: not changed by this daemon"
    );
    assert_eq!(views[1].since, Some(10.0));
    assert_eq!(views[1].services, ["api"]);
    // Nothing changes: nothing is written.
    let writes = table.writes.len();
    let again = a
        .sync(
            wanted(HostMode::Announcing, &services),
            &mut table,
            11.0,
            false,
            None,
        )
        .unwrap();
    assert!(again.is_empty());
    assert_eq!(table.writes.len(), writes);
}

#[test]
fn health_drain_and_stop_move_the_routes() {
    let mut table = Table::default();
    let mut a = Announcer::new(200, HostMode::Announcing);
    let up = [input("web", "10.100.0.1", healthy(1), 1, 3)];
    let down = [input("web", "10.100.0.1", healthy(1), 0, 3)];
    a.sync(wanted(a.host(), &up), &mut table, 1.0, false, None)
        .unwrap();
    assert!(a.is_announced(ip("10.100.0.1")));
    let applied = a
        .sync(wanted(a.host(), &down), &mut table, 2.0, false, None)
        .unwrap();
    assert_eq!(applied.len(), 1);
    assert_eq!(
        applied[0].change.reason,
        "web: 0 of 3 backends available (needs 1)"
    );
    assert!(!applied[0].change.announce);
    assert!(table.routes.is_empty());
    // The VIP stays known (its service still has it), withdrawn.
    let views = a.vips();
    assert_eq!((views[0].announced, views[0].wanted), (false, Some(false)));
    a.sync(wanted(a.host(), &up), &mut table, 3.0, false, None)
        .unwrap();
    assert!(a.set_host(HostMode::Drained));
    assert!(!a.set_host(HostMode::Drained), "no change");
    let applied = a
        .sync(wanted(a.host(), &up), &mut table, 4.0, false, None)
        .unwrap();
    assert_eq!(applied[0].change.reason, "drain-host");
    assert!(table.routes.is_empty());
    assert!(a.set_host(HostMode::Announcing));
    a.sync(wanted(a.host(), &up), &mut table, 5.0, false, None)
        .unwrap();
    assert!(a.is_announced(ip("10.100.0.1")));
    a.set_host(HostMode::Stopping);
    let applied = a
        .sync(wanted(a.host(), &up), &mut table, 6.0, false, None)
        .unwrap();
    assert_eq!(applied[0].change.reason, "stop");
    assert_eq!(a.announced_count(), 0);
    assert!(a.settled());
    assert_eq!(a.last_change(), Some(6.0));
}

#[test]
fn failures_are_reported_and_tried_again() {
    let mut table = Table {
        fail_add: true,
        ..Table::default()
    };
    let mut a = Announcer::new(200, HostMode::Announcing);
    let up = [input("web", "10.100.0.1", healthy(1), 1, 1)];
    let applied = a
        .sync(wanted(a.host(), &up), &mut table, 1.0, false, None)
        .unwrap();
    assert_eq!(
        applied[0].error.as_deref(),
        Some("adding the route in table 200: No buffer space available (os error 105)")
    );
    assert!(!a.is_announced(ip("10.100.0.1")));
    assert!(!a.settled());
    assert_eq!(a.vips()[0].error, applied[0].error);
    table.fail_add = false;
    let applied = a
        .sync(wanted(a.host(), &up), &mut table, 2.0, false, None)
        .unwrap();
    assert_eq!(applied.len(), 1, "tried again");
    assert!(applied[0].error.is_none());
    assert!(a.is_announced(ip("10.100.0.1")));
    assert_eq!(a.vips()[0].error, None);
    // An unreadable table: nothing is written, and the caller hears of it.
    let mut broken = Table {
        fail_list: true,
        ..Table::default()
    };
    let mut fresh = Announcer::new(200, HostMode::Announcing);
    assert!(
        fresh
            .sync(wanted(fresh.host(), &up), &mut broken, 1.0, false, None)
            .is_err()
    );
    assert!(broken.writes.is_empty());
}

#[test]
fn a_route_removed_by_someone_else_comes_back_when_the_table_is_read_again() {
    let mut table = Table::default();
    let mut a = Announcer::new(200, HostMode::Announcing);
    let up = [input("web", "10.100.0.1", healthy(1), 1, 1)];
    a.sync(wanted(a.host(), &up), &mut table, 1.0, false, None)
        .unwrap();
    table.routes.clear(); // `ip route flush table 200`
    // Without a read lb does not know.
    assert!(
        a.sync(wanted(a.host(), &up), &mut table, 2.0, false, None)
            .unwrap()
            .is_empty()
    );
    let applied = a
        .sync(wanted(a.host(), &up), &mut table, 3.0, true, None)
        .unwrap();
    assert_eq!(applied.len(), 1);
    assert!(applied[0].change.announce);
    assert_eq!(
        applied[0].change.reason,
        "web: 1 of 1 backend available (needs 1) (its route had been removed from table 200 by another program)"
    );
    assert!(table.routes.contains(&ip("10.100.0.1")));
    // And a route of lb's protocol lb did not write goes.
    table.routes.insert(ip("10.100.0.5"));
    let applied = a
        .sync(wanted(a.host(), &up), &mut table, 4.0, true, None)
        .unwrap();
    assert_eq!(applied.len(), 1);
    assert_eq!(applied[0].change.reason, NO_SERVICE);
    let empty: BTreeMap<IpAddr, Want> = BTreeMap::new();
    a.sync(empty, &mut table, 5.0, false, None).unwrap();
    assert!(table.routes.is_empty());
    assert!(a.vips().is_empty());
}
