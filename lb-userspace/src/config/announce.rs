//! Route health injection's settings (docs/operating.md, "Running several lb hosts"): `[lb.announce]`, and
//! each service's `announce` and `announce_min_available`. lb does not speak BGP: it keeps the
//! VIPs it announces as routes in a kernel routing table of its own, which BIRD's (or FRR's)
//! kernel protocol learns and its BGP sessions export.

use std::time::Duration;

use super::fields::{Fields, show};

/// `[lb.announce]`: present, lb announces the VIPs; absent, it announces nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announce {
    /// The kernel routing table lb keeps the announced VIPs in (lb owns it: routes of lb's
    /// protocol there that it does not want are removed).
    pub table: u32,
    /// After withdrawing every VIP (`lb stop`), how long lb keeps forwarding before it stops:
    /// the routers' time to move the flows away.
    pub grace: Duration,
}

/// The table when `[lb.announce]` names none (the one docs/bird.conf learns).
pub const DEFAULT_TABLE: u32 = 200;
pub const DEFAULT_GRACE: Duration = Duration::from_secs(5);
pub const MAX_GRACE: Duration = Duration::from_secs(600);

/// When a service wants its VIP announced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnnounceMode {
    /// While at least `min_available` of its backends take new flows.
    Healthy,
    /// Whatever its backends' health (while the host is not drained or stopping).
    Always,
    /// Never: another service on the VIP, or something else, announces it.
    Never,
}

impl AnnounceMode {
    /// As written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Always => "always",
            Self::Never => "never",
        }
    }
}

/// A service's say on its VIP (with `[lb.announce]` only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceAnnounce {
    pub mode: AnnounceMode,
    /// `healthy`: the backends that must take new flows for the VIP to be announced.
    pub min_available: u32,
}

/// `[lb.announce]`.
pub(super) fn read_lb_announce(f: &Fields) -> Option<Announce> {
    let table = f
        .int_in("table", 1..=i64::from(u32::MAX), i64::from(DEFAULT_TABLE))
        .and_then(|n| {
            let n = n as u32;
            let reserved = match n {
                253 => Some("default"),
                254 => Some("main"),
                255 => Some("local"),
                _ => None,
            };
            if let Some(name) = reserved {
                f.problem(
                    "table",
                    format!(
                        "{n} is the kernel's {name} table: lb removes the routes of its protocol \
                         there that it does not want, so it needs a table of its own (e.g. \
                         {DEFAULT_TABLE})"
                    ),
                );
                return None;
            }
            Some(n)
        });
    let grace = f.duration("grace", Duration::ZERO..=MAX_GRACE, DEFAULT_GRACE);
    f.finish();
    Some(Announce {
        table: table?,
        grace: grace?,
    })
}

/// A service's `announce` and `announce_min_available`. `on`: the file has `[lb.announce]`;
/// `backends`: how many backends the service lists (None when they could not be read).
/// `Some(None)`: no announcing (no `[lb.announce]`).
pub(super) fn read_service_announce(
    f: &Fields,
    on: bool,
    backends: Option<usize>,
) -> Option<Option<ServiceAnnounce>> {
    const MIN: &str = "announce_min_available";
    if !on {
        for key in ["announce", MIN] {
            if f.has(key) {
                f.problem(
                    key,
                    "lb announces nothing without [lb.announce]: add it to announce the VIPs",
                );
            }
        }
        return Some(None);
    }
    let mode = f.choice(
        "announce",
        &[
            ("healthy", AnnounceMode::Healthy),
            ("always", AnnounceMode::Always),
            ("never", AnnounceMode::Never),
        ],
        AnnounceMode::Healthy,
    );
    let min_given = f.has(MIN);
    let min = match f.int(MIN) {
        None if min_given => None,
        None => Some(1),
        Some(n) => {
            let most = backends.unwrap_or(usize::MAX).max(1) as i64;
            if n < 1 {
                f.problem(MIN, format!("{n} is out of range 1-{most}"));
                None
            } else if n > most {
                f.problem(
                    MIN,
                    format!(
                        "{n} is more than the service's {most} backend{}: its VIP would never \
                         be announced",
                        if most == 1 { "" } else { "s" }
                    ),
                );
                None
            } else {
                u32::try_from(n)
                    .map_err(|_| f.problem(MIN, format!("{n} is out of range 1-{most}")))
                    .ok()
            }
        }
    };
    let mode = mode?;
    if min_given && mode != AnnounceMode::Healthy {
        f.problem(
            MIN,
            format!(
                "only with announce = \"healthy\" (announce = \"{}\" does not count backends)",
                mode.as_str()
            ),
        );
        return None;
    }
    Some(Some(ServiceAnnounce {
        mode,
        min_available: min?,
    }))
}

impl Announce {
    /// "table 200, grace 5s".
    pub fn describe(&self) -> String {
        format!("table {}, grace {}", self.table, show(self.grace))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;

    const BASE: &str = r#"
[lb]
interfaces = ["eth1"]

[lb.announce]
table = 200
grace = "5s"

[[service]]
name = "web"
vip = "10.100.0.1:80"
backends = [ { address = "10.0.2.2:8080" }, { address = "10.0.3.2:8080" } ]
"#;

    fn problems(text: &str) -> Vec<String> {
        match parse(text) {
            Ok(c) => panic!("accepted: {c:?}"),
            Err(e) => e.0.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn defaults_and_values() {
        let c = parse(BASE).unwrap();
        assert_eq!(
            c.lb.announce,
            Some(Announce {
                table: 200,
                grace: Duration::from_secs(5)
            })
        );
        assert_eq!(
            c.services[0].announce,
            Some(ServiceAnnounce {
                mode: AnnounceMode::Healthy,
                min_available: 1
            })
        );
        // An empty table: the defaults.
        let empty = parse(&BASE.replace("table = 200\ngrace = \"5s\"\n", "")).unwrap();
        assert_eq!(
            empty.lb.announce,
            Some(Announce {
                table: DEFAULT_TABLE,
                grace: DEFAULT_GRACE
            })
        );
        let tuned = parse(
            &BASE
                .replace("table = 200", "table = 4000000000")
                .replace("grace = \"5s\"", "grace = \"0s\"")
                .replace(
                    "name = \"web\"",
                    "name = \"web\"\nannounce = \"healthy\"\nannounce_min_available = 2",
                ),
        )
        .unwrap();
        let a = tuned.lb.announce.unwrap();
        assert_eq!((a.table, a.grace), (4_000_000_000, Duration::ZERO));
        assert_eq!(tuned.services[0].announce.unwrap().min_available, 2);
        for (mode, want) in [
            ("always", AnnounceMode::Always),
            ("never", AnnounceMode::Never),
        ] {
            let c = parse(&BASE.replace(
                "name = \"web\"",
                &format!("name = \"web\"\nannounce = \"{mode}\""),
            ))
            .unwrap();
            assert_eq!(c.services[0].announce.unwrap().mode, want);
            assert_eq!(want.as_str(), mode);
        }
        // Without [lb.announce] nothing is announced.
        let off = parse(&BASE.replace("[lb.announce]\ntable = 200\ngrace = \"5s\"\n", "")).unwrap();
        assert_eq!(off.lb.announce, None);
        assert_eq!(off.services[0].announce, None);
    }

    #[test]
    fn each_bad_setting_is_reported_at_its_path() {
        let cases: &[(&str, &str, &str)] = &[
            (
                "table = 200",
                "table = 254",
                "lb.announce.table: 254 is the kernel's main table: lb removes the routes of its protocol there that it does not want, so it needs a table of its own (e.g. 200)",
            ),
            (
                "table = 200",
                "table = 255",
                "lb.announce.table: 255 is the kernel's local table",
            ),
            (
                "table = 200",
                "table = 253",
                "lb.announce.table: 253 is the kernel's default table",
            ),
            (
                "table = 200",
                "table = 0",
                "lb.announce.table: 0 is out of range 1-4294967295",
            ),
            (
                "table = 200",
                "table = 4294967296",
                "lb.announce.table: 4294967296 is out of range 1-4294967295",
            ),
            (
                "table = 200",
                "table = \"200\"",
                "lb.announce.table: expected an integer, got string",
            ),
            (
                "grace = \"5s\"",
                "grace = \"11m\"",
                "lb.announce.grace: 11m is out of range 0s-10m",
            ),
            (
                "grace = \"5s\"",
                "grace = \"soon\"",
                "lb.announce.grace: expected a duration like \"500ms\", \"2s\", \"15m\", got \"soon\"",
            ),
            (
                "grace = \"5s\"",
                "grace = \"5s\"\nbgp = true",
                "lb.announce.bgp: unknown key",
            ),
            (
                "[lb.announce]\ntable = 200\ngrace = \"5s\"",
                "announce = true",
                "lb.announce: expected a table, got boolean",
            ),
            (
                "name = \"web\"",
                "name = \"web\"\nannounce = \"sometimes\"",
                "service[0].announce: expected one of healthy, always, never, got \"sometimes\"",
            ),
            (
                "name = \"web\"",
                "name = \"web\"\nannounce_min_available = 3",
                "service[0].announce_min_available: 3 is more than the service's 2 backends: its VIP would never be announced",
            ),
            (
                "name = \"web\"",
                "name = \"web\"\nannounce_min_available = 0",
                "service[0].announce_min_available: 0 is out of range 1-2",
            ),
            (
                "name = \"web\"",
                "name = \"web\"\nannounce_min_available = \"1\"",
                "service[0].announce_min_available: expected an integer, got string",
            ),
            (
                "name = \"web\"",
                "name = \"web\"\nannounce = \"always\"\nannounce_min_available = 1",
                "service[0].announce_min_available: only with announce = \"healthy\" (announce = \"always\" does not count backends)",
            ),
        ];
        for (from, to, want) in cases {
            assert!(BASE.contains(from), "{from}");
            let got = problems(&BASE.replace(from, to));
            assert!(
                got.iter().any(|p| p.starts_with(want)),
                "{to}: want {want:?}, got {got:#?}"
            );
        }
    }

    #[test]
    fn service_settings_need_lb_announce() {
        let off = BASE.replace("[lb.announce]\ntable = 200\ngrace = \"5s\"\n", "");
        let got = problems(&off.replace(
            "name = \"web\"",
            "name = \"web\"\nannounce = \"always\"\nannounce_min_available = 1",
        ));
        assert_eq!(
            got,
            [
                "service[0].announce: lb announces nothing without [lb.announce]: add it to announce the VIPs",
                "service[0].announce_min_available: lb announces nothing without [lb.announce]: add it to announce the VIPs",
            ]
        );
    }

    #[test]
    fn a_reload_may_change_grace_and_the_services_not_the_table() {
        let a = parse(BASE).unwrap();
        let grace = parse(&BASE.replace("grace = \"5s\"", "grace = \"30s\"")).unwrap();
        assert!(a.lb.fixed_differences(&grace.lb).is_empty());
        let table = parse(&BASE.replace("table = 200", "table = 201")).unwrap();
        assert_eq!(a.lb.fixed_differences(&table.lb), ["announce.table"]);
        let off = parse(&BASE.replace("[lb.announce]\ntable = 200\ngrace = \"5s\"\n", "")).unwrap();
        assert_eq!(a.lb.fixed_differences(&off.lb), ["announce"]);
        assert_eq!(off.lb.fixed_differences(&a.lb), ["announce"]);
        assert_eq!(a.lb.announce.unwrap().describe(), "table 200, grace 5s");
    }
}
