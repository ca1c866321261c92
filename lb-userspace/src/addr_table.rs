//! Placement of lb's addresses (VIPs, SNAT addresses) in the datapath's address tables, one per
//! family: an array of [`ADDR_SETS`] sets of [`ADDR_WAYS`] slots, an address living in any slot
//! of set [`addr_set`]`(address)` (see [`lb_common::AddrSet`] for why not a hash map). Pure, so
//! it is tested without a kernel.
//!
//! An address keeps its slot for as long as it is configured: a reload only clears the slots of
//! addresses that go and fills free slots with new ones, so no packet to a kept address ever
//! misses while sets are rewritten.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::{Debug, Display},
    net::{Ipv4Addr, Ipv6Addr},
};

use anyhow::bail;
use lb_common::{
    ADDR_SETS, ADDR_WAYS, Addr6, AddrSetOf, FlowAddr, MAX_ADDRS, addr_set, addr6, addr6_octets,
};

/// An address family's addresses as the table holds them (one table per family).
pub trait TableIp: Copy + Ord + Debug + Display {
    /// The map's form of the address.
    type A: FlowAddr + Ord;
    const UNSPECIFIED: Self;
    fn key(self) -> Self::A;
    fn from_key(a: Self::A) -> Self;
}

impl TableIp for Ipv4Addr {
    type A = u32;
    const UNSPECIFIED: Self = Ipv4Addr::UNSPECIFIED;
    fn key(self) -> u32 {
        u32::from_ne_bytes(self.octets())
    }
    fn from_key(a: u32) -> Self {
        Ipv4Addr::from(a.to_ne_bytes())
    }
}

impl TableIp for Ipv6Addr {
    type A = Addr6;
    const UNSPECIFIED: Self = Ipv6Addr::UNSPECIFIED;
    fn key(self) -> Addr6 {
        addr6(self.octets())
    }
    fn from_key(a: Addr6) -> Self {
        Ipv6Addr::from(addr6_octets(a))
    }
}

/// The table's content: the sets that hold an address, by index (absent sets are empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddrTable<Ip: TableIp = Ipv4Addr> {
    sets: BTreeMap<u32, AddrSetOf<Ip::A>>,
}

/// The IPv6 address table.
pub type AddrTable6 = AddrTable<Ipv6Addr>;

impl<Ip: TableIp> Default for AddrTable<Ip> {
    fn default() -> Self {
        Self {
            sets: BTreeMap::new(),
        }
    }
}

impl<Ip: TableIp> AddrTable<Ip> {
    /// A table read from the map: sets `(index, content)`, empty ones may be left out.
    pub fn from_sets(sets: impl IntoIterator<Item = (u32, AddrSetOf<Ip::A>)>) -> Self {
        Self {
            sets: sets
                .into_iter()
                .filter(|(_, s)| *s != AddrSetOf::default())
                .collect(),
        }
    }

    /// Every address in the table with its flags.
    pub fn addrs(&self) -> BTreeMap<Ip, u32> {
        self.sets
            .values()
            .flat_map(|s| s.addrs.iter().zip(&s.flags))
            .filter(|&(_, &f)| f != 0)
            .map(|(&a, &f)| (Ip::from_key(a), f))
            .collect()
    }

    /// The table holding exactly `wanted` (address → flags, non-zero): addresses already here
    /// keep their slot, the others take the first free slot of their set. Fails, changing
    /// nothing, when there are more than [`MAX_ADDRS`] addresses or more in one set than it has
    /// slots.
    pub fn plan(&self, wanted: &BTreeMap<Ip, u32>) -> anyhow::Result<Self> {
        if wanted.len() > MAX_ADDRS as usize {
            bail!(
                "{} distinct VIPs and SNAT addresses of one family, more than the {MAX_ADDRS} lb's address table takes",
                wanted.len()
            );
        }
        if wanted.contains_key(&Ip::UNSPECIFIED) {
            bail!("{} cannot be a VIP or SNAT address", Ip::UNSPECIFIED);
        }
        let mut next = self.retain(|a| wanted.contains_key(&a));
        let mut placed = BTreeSet::new();
        for set in next.sets.values_mut() {
            for (a, f) in set.addrs.iter().zip(set.flags.iter_mut()) {
                if *f != 0 {
                    *f = wanted[&Ip::from_key(*a)];
                    placed.insert(*a);
                }
            }
        }
        for (&addr, &flags) in wanted {
            let k = addr.key();
            if placed.contains(&k) {
                continue;
            }
            let index = addr_set(k);
            let set = next.sets.entry(index).or_default();
            let Some(free) = set.flags.iter().position(|&f| f == 0) else {
                let mut shared: Vec<Ip> = wanted
                    .keys()
                    .copied()
                    .filter(|&a| addr_set(a.key()) == index)
                    .collect();
                shared.sort();
                bail!(
                    "addresses {shared:?} all fall in one set of lb's address table, which holds \
                     {ADDR_WAYS} (a rare hash collision; use another VIP or SNAT address for one of them)"
                );
            };
            set.addrs[free] = k;
            set.flags[free] = flags;
            placed.insert(k);
        }
        Ok(next)
    }

    /// This table with only the addresses `keep` accepts (the others' slots freed), also
    /// dropping any slot that does not belong there (wrong set, duplicate, stray address bits
    /// in a free slot): what an adopted map from another run may hold.
    pub fn retain(&self, keep: impl Fn(Ip) -> bool) -> Self {
        let mut seen = BTreeSet::new();
        let mut sets = BTreeMap::new();
        for (&index, set) in &self.sets {
            let mut out = AddrSetOf::default();
            for i in 0..ADDR_WAYS {
                let (a, f) = (set.addrs[i], set.flags[i]);
                if f != 0 && addr_set(a) == index && keep(Ip::from_key(a)) && seen.insert(a) {
                    out.addrs[i] = a;
                    out.flags[i] = f;
                }
            }
            if out != AddrSetOf::default() {
                sets.insert(index, out);
            }
        }
        Self { sets }
    }

    /// The sets to write to turn a map holding `from` into this table: `(index, content)`.
    pub fn changes_from(&self, from: &Self) -> Vec<(u32, AddrSetOf<Ip::A>)> {
        let empty = AddrSetOf::default();
        let indices: BTreeSet<u32> = self.sets.keys().chain(from.sets.keys()).copied().collect();
        indices
            .into_iter()
            .filter(|i| *i < ADDR_SETS)
            .filter_map(|i| {
                let new = self.sets.get(&i).unwrap_or(&empty);
                (from.sets.get(&i).unwrap_or(&empty) != new).then_some((i, *new))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lb_common::addr_flags::{SNAT, VIP};

    fn key(a: Ipv4Addr) -> u32 {
        a.key()
    }

    fn ip(i: u32) -> Ipv4Addr {
        Ipv4Addr::from(0x0a00_0000 | i)
    }

    fn wanted(addrs: &[(Ipv4Addr, u32)]) -> BTreeMap<Ipv4Addr, u32> {
        addrs.iter().copied().collect()
    }

    /// `n` addresses that fall in one set.
    fn colliding(n: usize) -> Vec<Ipv4Addr> {
        let set = addr_set(key(ip(1)));
        (1..)
            .map(ip)
            .filter(|a| addr_set(key(*a)) == set)
            .take(n)
            .collect()
    }

    /// The datapath's lookup, on the table.
    fn lookup(t: &AddrTable, addr: Ipv4Addr) -> u32 {
        let k = key(addr);
        t.sets.get(&addr_set(k)).map_or(0, |s| {
            (0..ADDR_WAYS)
                .find(|&i| s.addrs[i] == k)
                .map_or(0, |i| s.flags[i])
        })
    }

    #[test]
    fn planned_addresses_are_found_and_others_miss() {
        let w = wanted(&[(ip(1), VIP), (ip(2), SNAT), (ip(3), VIP | SNAT)]);
        let t = AddrTable::default().plan(&w).unwrap();
        assert_eq!(t.addrs(), w);
        for (&a, &f) in &w {
            assert_eq!(lookup(&t, a), f);
        }
        assert_eq!(lookup(&t, ip(4)), 0);
        assert_eq!(lookup(&t, Ipv4Addr::UNSPECIFIED), 0);
    }

    #[test]
    fn kept_addresses_keep_their_slot_and_freed_slots_are_reused() {
        let c = colliding(ADDR_WAYS + 1);
        let first: BTreeMap<_, _> = c[..ADDR_WAYS].iter().map(|&a| (a, VIP)).collect();
        let t1 = AddrTable::default().plan(&first).unwrap();
        let slot = |t: &AddrTable, a: Ipv4Addr| {
            let s = &t.sets[&addr_set(key(a))];
            s.addrs.iter().position(|&x| x == key(a)).unwrap()
        };
        // A full set: one more does not fit, and nothing is planned.
        let mut too_many = first.clone();
        too_many.insert(c[ADDR_WAYS], VIP);
        let err = t1.plan(&too_many).unwrap_err().to_string();
        assert!(err.contains("holds 8"), "{err}");
        // Drop the second, change the third's flags, add the ninth: it takes the freed slot.
        let mut second = first.clone();
        second.remove(&c[1]);
        second.insert(c[2], VIP | SNAT);
        second.insert(c[ADDR_WAYS], SNAT);
        let t2 = t1.plan(&second).unwrap();
        assert_eq!(t2.addrs(), second);
        for a in second.keys().filter(|&&a| a != c[ADDR_WAYS]) {
            assert_eq!(slot(&t1, *a), slot(&t2, *a), "{a} moved");
        }
        assert_eq!(slot(&t2, c[ADDR_WAYS]), slot(&t1, c[1]));
        // One set changed, written once.
        let changes = t2.changes_from(&t1);
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].0, addr_set(key(c[0])));
        assert!(t2.changes_from(&t2).is_empty());
    }

    #[test]
    fn removals_first_then_additions() {
        // What Balancer::apply writes: the old table without the addresses that go, then the new.
        let t1 = AddrTable::default()
            .plan(&wanted(&[(ip(1), VIP), (ip(2), VIP)]))
            .unwrap();
        let w2 = wanted(&[(ip(2), VIP), (ip(3), SNAT)]);
        let t2 = t1.plan(&w2).unwrap();
        let cleared = t1.retain(|a| w2.contains_key(&a));
        assert_eq!(cleared.addrs(), wanted(&[(ip(2), VIP)]));
        let mut map = t1.clone();
        for (i, s) in cleared
            .changes_from(&t1)
            .into_iter()
            .chain(t2.changes_from(&cleared))
        {
            map.sets.insert(i, s);
        }
        assert_eq!(AddrTable::from_sets(map.sets), t2);
    }

    #[test]
    fn limits_are_refused_with_the_limit_named() {
        let many: BTreeMap<_, _> = (1..=MAX_ADDRS + 1).map(|i| (ip(i), VIP)).collect();
        let err = AddrTable::default().plan(&many).unwrap_err().to_string();
        assert!(err.contains("4097") && err.contains("4096"), "{err}");
        let zero = wanted(&[(Ipv4Addr::UNSPECIFIED, SNAT)]);
        assert!(AddrTable::default().plan(&zero).is_err());
    }

    #[test]
    fn a_full_table_of_a_subnet_fits() {
        let all: BTreeMap<_, _> = (1..=MAX_ADDRS).map(|i| (ip(i), VIP)).collect();
        let t = AddrTable::default().plan(&all).unwrap();
        assert_eq!(t.addrs(), all);
    }

    #[test]
    fn stray_slots_of_an_adopted_map_are_dropped() {
        let a = key(ip(1));
        let mut bad = lb_common::AddrSet::default();
        // Right address in a wrong set, a duplicate, address bits in a free slot.
        bad.addrs[0] = a;
        bad.flags[0] = VIP;
        let wrong = (addr_set(a) + 1) % ADDR_SETS;
        let mut good = lb_common::AddrSet::default();
        good.addrs[3] = a;
        good.flags[3] = VIP;
        good.addrs[4] = a;
        good.flags[4] = SNAT;
        good.addrs[5] = key(ip(9));
        let adopted = AddrTable::from_sets([(wrong, bad), (addr_set(a), good)]);
        let t = adopted.plan(&wanted(&[(ip(1), VIP)])).unwrap();
        assert_eq!(t.addrs(), wanted(&[(ip(1), VIP)]));
        assert_eq!(t.sets.len(), 1);
        assert_eq!(t.sets[&addr_set(a)].addrs[3], a, "kept in its slot");
        let changes = t.changes_from(&adopted);
        assert_eq!(
            changes.len(),
            2,
            "the wrong set cleared, the right one cleaned"
        );
    }

    #[test]
    fn ipv6_addresses_have_a_table_of_their_own() {
        let a: Ipv6Addr = "2001:db8::10".parse().unwrap();
        let b: Ipv6Addr = "2001:db8:2::1".parse().unwrap();
        let w: BTreeMap<Ipv6Addr, u32> = [(a, VIP), (b, SNAT)].into_iter().collect();
        let t = AddrTable6::default().plan(&w).unwrap();
        assert_eq!(t.addrs(), w);
        let found = |ip: Ipv6Addr| {
            let k = ip.key();
            t.sets.get(&addr_set(k)).map_or(0, |s| {
                (0..ADDR_WAYS)
                    .find(|&i| s.addrs[i] == k)
                    .map_or(0, |i| s.flags[i])
            })
        };
        assert_eq!(found(a), VIP);
        assert_eq!(found(b), SNAT);
        assert_eq!(found("2001:db8::11".parse().unwrap()), 0);
        let zero: BTreeMap<Ipv6Addr, u32> = [(Ipv6Addr::UNSPECIFIED, VIP)].into_iter().collect();
        let err = AddrTable6::default().plan(&zero).unwrap_err().to_string();
        assert!(err.contains(":: cannot be"), "{err}");
        // Written and read back, the table is the same.
        let back = AddrTable6::from_sets(t.changes_from(&AddrTable6::default()));
        assert_eq!(back, t);
    }
}
