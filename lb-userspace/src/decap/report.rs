//! What `lb decap` says: the summary of a set-up, and `--stats` (text, or JSON of
//! [`DecapStatus`], which the test kit reads back). Pure renderers.

use std::{fmt, net::IpAddr, path::PathBuf};

use lb_common::{DecapParams, decap_counter, decap_flags};
use serde::{Deserialize, Serialize};

use super::maps::Changed;
use crate::model::NamedCounter;

/// The program put on one interface by a set-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Put {
    pub iface: String,
    /// XDP mode: native, skb, ...
    pub mode: String,
    /// On a previous set-up's pinned link (in place), rather than attached anew.
    pub replaced: bool,
}

/// What a set-up did.
#[derive(Debug, Clone)]
pub struct Done {
    pub pin_path: PathBuf,
    pub params: DecapParams,
    /// Addresses of strict destination now in the maps.
    pub addresses: usize,
    pub changed: Changed,
    pub attached: Vec<Put>,
    /// Interfaces of a previous set-up not listed this time.
    pub detached: Vec<String>,
}

impl fmt::Display for Done {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let on: Vec<String> = self
            .attached
            .iter()
            .map(|p| {
                let how = if p.replaced {
                    ", replaced in place"
                } else {
                    ""
                };
                format!("{} ({}{how})", p.iface, p.mode)
            })
            .collect();
        writeln!(f, "lb decap: attached to {}", on.join(", "))?;
        if !self.detached.is_empty() {
            writeln!(
                f,
                "  detached from {} (not listed)",
                self.detached.join(", ")
            )?;
        }
        writeln!(
            f,
            "  GUE port {}; IP in IP (protocols 4 and 41)",
            u16::from_be(self.params.gue_port)
        )?;
        if self.params.flags & decap_flags::ANY_DESTINATION != 0 {
            writeln!(f, "  any outer destination (strict destination off)")?;
        } else {
            let list = |a: &[IpAddr]| {
                a.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            let mut change = String::new();
            if !self.changed.added.is_empty() {
                change += &format!("; added {}", list(&self.changed.added));
            }
            if !self.changed.removed.is_empty() {
                change += &format!("; removed {}", list(&self.changed.removed));
            }
            writeln!(
                f,
                "  strict destination: {}{change}",
                addresses(self.addresses)
            )?;
        }
        writeln!(
            f,
            "  pinned at {}; stays attached after this command (`lb decap --stats`, \
             `lb decap --stop`)",
            self.pin_path.display()
        )
    }
}

/// One interface with a pinned link of the decapsulator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecapInterface {
    pub name: String,
    /// The XDP mode of the program attached to it (native, skb, ...); None when the interface
    /// is gone or nothing is attached (the link is defunct).
    pub mode: Option<String>,
    /// The pinned link's id and its program's id (the program changes with each `lb decap`,
    /// the link does not).
    pub link_id: Option<u32>,
    pub program_id: Option<u32>,
}

/// `lb decap --stats --json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecapStatus {
    pub pin_path: String,
    pub gue_port: u16,
    /// Strict destination: only packets to `addresses` are decapsulated.
    pub strict: bool,
    pub addresses: Vec<IpAddr>,
    pub interfaces: Vec<DecapInterface>,
    /// Summed over CPUs, in `decap_counter` order: the verdicts first, then the informational.
    pub counters: Vec<NamedCounter>,
}

impl DecapStatus {
    /// The counter named `name` (0 for a name it does not have).
    pub fn counter(&self, name: &str) -> u64 {
        self.counters
            .iter()
            .find(|c| c.name == name)
            .map_or(0, |c| c.value)
    }
}

fn addresses(n: usize) -> String {
    match n {
        1 => "1 address".to_owned(),
        n => format!("{n} addresses"),
    }
}

/// `lb decap --stats` as text.
pub fn text(s: &DecapStatus) -> String {
    let mut out = format!("lb decap at {}\n", s.pin_path);
    if s.interfaces.is_empty() {
        out += "  attached to no interface\n";
    }
    for i in &s.interfaces {
        let ids = match (i.link_id, i.program_id) {
            (Some(l), Some(p)) => format!(" (link {l}, program {p})"),
            _ => String::new(),
        };
        match &i.mode {
            Some(mode) => out += &format!("  attached to {} ({mode}){ids}\n", i.name),
            None => {
                out += &format!(
                    "  {}: pinned, but nothing attached (interface gone?)\n",
                    i.name
                )
            }
        }
    }
    out += &format!("  GUE port {}; IP in IP (protocols 4 and 41)\n", s.gue_port);
    if s.strict {
        let addrs: Vec<String> = s.addresses.iter().map(ToString::to_string).collect();
        out += &format!(
            "  strict destination, {}: {}\n",
            addresses(addrs.len()),
            addrs.join(" ")
        );
    } else {
        out += "  any outer destination (strict destination off)\n";
    }
    out += &format!("\n{:<20} {:>14}\n", "counter", "packets");
    for (i, c) in s.counters.iter().enumerate() {
        let note = if i >= decap_counter::VERDICTS as usize {
            "  (informational)"
        } else {
            ""
        };
        out += &format!("{:<20} {:>14}{note}\n", c.name, c.value);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status() -> DecapStatus {
        DecapStatus {
            pin_path: "/sys/fs/bpf/lb-decap".into(),
            gue_port: 6080,
            strict: true,
            addresses: vec!["10.0.1.2".parse().unwrap(), "fd00::2".parse().unwrap()],
            interfaces: vec![DecapInterface {
                name: "eth1".into(),
                mode: Some("native".into()),
                link_id: Some(7),
                program_id: Some(42),
            }],
            counters: decap_counter::NAMES
                .iter()
                .enumerate()
                .map(|(i, n)| NamedCounter {
                    name: (*n).to_owned(),
                    value: i as u64,
                })
                .collect(),
        }
    }

    #[test]
    fn stats_text_names_everything() {
        let t = text(&status());
        assert!(
            t.contains("attached to eth1 (native) (link 7, program 42)"),
            "{t}"
        );
        assert!(
            t.contains("strict destination, 2 addresses: 10.0.1.2 fd00::2"),
            "{t}"
        );
        let ecn = t.lines().find(|l| l.starts_with("ecn_ce ")).unwrap();
        assert!(ecn.ends_with(" 10  (informational)"), "{t}");
        let gue = t.lines().find(|l| l.starts_with("decap_gue ")).unwrap();
        assert!(gue.ends_with(" 2"), "{t}");
    }

    #[test]
    fn stats_json_round_trips() {
        let s = status();
        let back: DecapStatus = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.counter("decap_ipv6_in_ip"), 1);
        assert_eq!(back.counter("no such counter"), 0);
    }
}
