//! The probes waiting for an answer, by connection, and their deadlines.

use std::{
    collections::{BTreeMap, hash_map::Entry},
    hash::{Hash, Hasher},
    net::SocketAddr,
    os::fd::OwnedFd,
    time::{Duration, Instant},
};

use foldhash::HashMap;
use tokio::sync::oneshot;

use super::targets::Home;
use super::wire::Verdict;
use crate::health::probe::{ProbeResult, Via};

/// A probe's connection, seen from this host: both ends of one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Key {
    pub(super) local: SocketAddr,
    pub(super) remote: SocketAddr,
}

/// Each end as one or two words: the derived hash feeds the hasher every field of both
/// `SocketAddr`s (variant, octets, port, and for IPv6 flow and scope) one call at a time: 24 ns
/// a key against 10 (a loop of lookups in a map of 3,000 probes, this machine), and a probe
/// hashes its key about five times. Equal keys hash alike: this reads a subset of what `Eq`
/// compares.
impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        for end in [self.local, self.remote] {
            match end {
                SocketAddr::V4(a) => {
                    state.write_u64(u64::from(a.ip().to_bits()) << 16 | u64::from(a.port()));
                }
                SocketAddr::V6(a) => {
                    state.write_u128(a.ip().to_bits());
                    state.write_u16(a.port());
                }
            }
        }
    }
}

/// A probe waiting for its answer.
pub(super) struct Pending {
    /// Unique per prober: tells this probe from a later one on the same connection. Its
    /// resend keeps it.
    pub(super) id: u64,
    /// Sequence number of its SYN: the answer must acknowledge `seq + 1`.
    pub(super) seq: u32,
    pub(super) deadline: Instant,
    /// When its SYN went out (set by the sender just before the send).
    pub(super) sent: Option<Instant>,
    /// Its SYN was queued for the link-layer path.
    pub(super) via_link: bool,
    /// If its SYN cannot be sent, it may be sent once more (false for that resend).
    pub(super) resend: bool,
    /// Through the tunnel (see [`crate::health::probe::tunnel`]), or not.
    pub(super) via: Option<Via>,
    pub(super) waiter: Waiter,
    /// A port reserved for this probe alone, when the pool had none free towards the target;
    /// released when the probe leaves the map.
    pub(super) _own_port: Option<OwnedFd>,
}

impl Pending {
    /// The probe, gone from the registry, with its answer.
    pub(super) fn end(self, key: Key, answer: Answer) -> Ended {
        Ended {
            key,
            id: self.id,
            deadline: self.deadline,
            resend: self.resend,
            via: self.via,
            waiter: self.waiter,
            answer,
        }
    }
}

/// Who takes a probe's result.
pub(super) enum Waiter {
    /// A probe of `SynProber::start_many`: its result goes to the finished queue under this
    /// token.
    Token(u64),
    /// A `SynProber::probe` future, through its channel.
    Future(oneshot::Sender<ProbeResult>),
}

impl Waiter {
    /// Where the prober keeps the state of the probe's target.
    pub(super) fn home(&self) -> Home {
        match self {
            Waiter::Token(token) => Home::of_token(*token),
            Waiter::Future(_) => Home::Map,
        }
    }

    /// Nobody waits any more: the `probe` future was dropped.
    pub(super) fn abandoned(&self) -> bool {
        match self {
            Waiter::Token(_) => false,
            Waiter::Future(done) => done.is_closed(),
        }
    }

    /// Hands `result` to a `probe` future; a probe of `start_many` gives it back under its
    /// token, for the finished queue.
    pub(super) fn finish(self, result: ProbeResult) -> Option<(u64, ProbeResult)> {
        match self {
            Waiter::Token(token) => Some((token, result)),
            Waiter::Future(done) => {
                // The future may have been dropped meanwhile: then nobody is waiting.
                let _ = done.send(result);
                None
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Answer {
    /// A reply, read by the reader `latency` after the SYN was sent.
    Reply { verdict: Verdict, latency: Duration },
    /// The deadline passed without a reply.
    Expired,
    /// The SYN could not be sent (an OS error number).
    Unsent(i32),
}

/// A probe that has left the registry, and its answer: on its way to its waiter (delivered
/// after the state lock is released).
pub(super) struct Ended {
    pub(super) key: Key,
    pub(super) id: u64,
    pub(super) deadline: Instant,
    pub(super) resend: bool,
    pub(super) via: Option<Via>,
    pub(super) waiter: Waiter,
    pub(super) answer: Answer,
}

/// The probes due at one instant: a batch of `start_many` (one timeout) shares it, so a probe
/// costs a push and a count rather than an entry of its own in the ordered map.
#[derive(Default)]
struct Deadline {
    /// `(probe id, key)`: the probes listed here, also those that have left since.
    probes: Vec<(u64, Key)>,
    /// How many of them are still pending; the entry goes when none is.
    live: usize,
}

/// The pending probes by connection, and by deadline for the reader's one timer.
#[derive(Default)]
pub(super) struct Registry {
    /// Keyed by connections this prober chose (received packets only look them up), so a
    /// fast hasher will do.
    probes: HashMap<Key, Pending>,
    /// The pending probes by deadline, earliest first. Probes started together share one
    /// (see [`Deadline`]).
    deadlines: BTreeMap<Instant, Deadline>,
    /// The instant the reader's timer is set for; `None` while it sleeps without one. A probe
    /// with an earlier deadline moves it and wakes the reader.
    armed: Option<Instant>,
    next_id: u64,
}

impl Registry {
    /// An id no probe of this registry had.
    pub(super) fn new_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    pub(super) fn contains(&self, key: &Key) -> bool {
        self.probes.contains_key(key)
    }

    pub(super) fn get(&self, key: &Key) -> Option<&Pending> {
        self.probes.get(key)
    }

    /// The probe `id` at `key`, if it is still there (the key may belong to a later probe).
    pub(super) fn get_mut(&mut self, key: &Key, id: u64) -> Option<&mut Pending> {
        self.probes.get_mut(key).filter(|p| p.id == id)
    }

    /// Adds `probe` at `key` and lists it at its deadline. True if that deadline is earlier
    /// than the reader's timer, which is now set for it: then the reader must be woken.
    pub(super) fn insert(&mut self, key: Key, probe: Pending) -> bool {
        let (id, deadline) = (probe.id, probe.deadline);
        self.probes.insert(key, probe);
        let due = self.deadlines.entry(deadline).or_default();
        due.probes.push((id, key));
        due.live += 1;
        let earlier = self.armed.is_none_or(|armed| deadline < armed);
        if earlier {
            self.armed = Some(deadline);
        }
        earlier
    }

    /// Removes the probe `id` at `key` before its deadline (answered, unsent, dropped), if it
    /// is still there.
    pub(super) fn remove(&mut self, key: &Key, id: u64) -> Option<Pending> {
        let probe = self.take(key, id)?;
        self.unlist(probe.deadline);
        Some(probe)
    }

    /// Takes the probe `id` at `key` out of the map, if it is still there.
    fn take(&mut self, key: &Key, id: u64) -> Option<Pending> {
        match self.probes.entry(*key) {
            Entry::Occupied(entry) if entry.get().id == id => Some(entry.remove()),
            _ => None,
        }
    }

    /// A probe due at `deadline` has left the pending map (not by expiring): one fewer live
    /// there, and the entry goes with the last.
    fn unlist(&mut self, deadline: Instant) {
        if let Some(due) = self.deadlines.get_mut(&deadline) {
            due.live = due.live.saturating_sub(1);
            if due.live == 0 {
                self.deadlines.remove(&deadline);
            }
        }
    }

    /// Withdraws the probe `id` due at `deadline` (a dropped `probe` future's), if it is still
    /// pending. Its latest listing at the deadline is its current connection: a resend keeps
    /// the id and the deadline.
    pub(super) fn withdraw(&mut self, id: u64, deadline: Instant) {
        let listed = self.deadlines.get(&deadline).and_then(|due| {
            due.probes
                .iter()
                .rev()
                .find(|&&(listed, _)| listed == id)
                .map(|&(_, key)| key)
        });
        if let Some(key) = listed {
            self.remove(&key, id);
        }
    }

    /// Ends the probes whose deadline is not after `now` (into `out`, as [`Answer::Expired`]).
    /// When the reader's timer has run out, sets it for the earliest deadline left (only then:
    /// a timer set for a probe that was answered since just fires once for nothing, which is
    /// cheaper than moving it each time).
    pub(super) fn expire(&mut self, now: Instant, out: &mut Vec<Ended>) {
        while let Some(entry) = self.deadlines.first_entry() {
            if *entry.key() > now {
                break;
            }
            for (id, key) in entry.remove().probes {
                // Those that left already (answered, unsent, dropped) are skipped.
                if let Some(probe) = self.take(&key, id) {
                    out.push(probe.end(key, Answer::Expired));
                }
            }
        }
        if self.armed.is_some_and(|armed| armed <= now) {
            self.armed = self.deadlines.first_key_value().map(|(&d, _)| d);
        }
    }

    /// The instant the reader's timer is to be set for, if any.
    pub(super) fn armed(&self) -> Option<Instant> {
        self.armed
    }

    /// Empties the registry: the probes that were waiting.
    pub(super) fn drain(&mut self) -> impl Iterator<Item = Pending> + '_ {
        self.deadlines.clear();
        self.probes.drain().map(|(_, probe)| probe)
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.probes.len()
    }

    /// No probe pending, nor listed at a deadline.
    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.probes.is_empty() && self.deadlines.is_empty()
    }

    /// How many deadline entries there are.
    #[cfg(test)]
    pub(super) fn deadlines(&self) -> usize {
        self.deadlines.len()
    }

    /// How many probes due at `deadline` are still pending.
    #[cfg(test)]
    pub(super) fn live_at(&self, deadline: Instant) -> usize {
        self.deadlines.get(&deadline).map_or(0, |due| due.live)
    }
}

#[cfg(test)]
mod tests {
    use std::{
        collections::HashSet,
        hash::BuildHasher as _,
        net::{Ipv4Addr, Ipv6Addr},
    };

    use super::*;

    /// Every part of either end moves the hash: keys apart in one port, one octet of an IPv4
    /// address or one bit of an IPv6 one hash apart (a hash of a subset of them would put whole
    /// families of probes in one bucket).
    #[test]
    fn key_hash_covers_both_ends() {
        let hasher = foldhash::fast::FixedState::with_seed(1);
        let v4 = |a: u32, p: u16| SocketAddr::from((Ipv4Addr::from_bits(a), p));
        let v6 = |a: u128, p: u16| SocketAddr::from((Ipv6Addr::from_bits(a), p));
        let mut keys = Vec::new();
        for i in 0..200u32 {
            let local4 = v4(0x0a31_0001, 40000);
            let remote4 = v4(0x0a32_0000 + i, 8080);
            keys.push(Key {
                local: local4,
                remote: remote4,
            });
            keys.push(Key {
                local: v4(0x0a31_0001, 40000 + i as u16 + 1),
                remote: v4(0x0a32_0000, 8080),
            });
            keys.push(Key {
                local: local4,
                remote: v4(0x0a32_0000, 8081 + i as u16),
            });
            keys.push(Key {
                local: v4(0x0a31_0002 + (i << 24), 40000),
                remote: remote4,
            });
            let local6 = v6(0x2001_0db8 << 96 | 1, 40000);
            keys.push(Key {
                local: local6,
                remote: v6(0x2001_0db8 << 96 | 1 << (i % 96 + 16), 8080 + i as u16),
            });
            keys.push(Key {
                local: v6(0x2001_0db8 << 96 | u128::from(i) << 100 | 1, 40000),
                remote: v6(2, 8080),
            });
        }
        let distinct: HashSet<Key> = keys.iter().copied().collect();
        let hashes: HashSet<u64> = distinct.iter().map(|k| hasher.hash_one(k)).collect();
        assert_eq!(hashes.len(), distinct.len());
    }

    fn pending(id: u64, deadline: Instant) -> Pending {
        Pending {
            id,
            seq: id as u32,
            deadline,
            sent: None,
            via_link: false,
            resend: true,
            via: None,
            waiter: Waiter::Token(id),
            _own_port: None,
        }
    }

    /// Every probe stays found by its connection (its hash) while others come and go, until it
    /// leaves, under its own id only.
    #[test]
    fn probes_are_found_until_they_leave() {
        let key = |i: u16| Key {
            local: SocketAddr::from((Ipv4Addr::new(10, 0, 0, 1), 40000 + i)),
            remote: SocketAddr::from((Ipv4Addr::new(10, 0, 0, 2), 80)),
        };
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut r = Registry::default();
        for i in 0..1000u16 {
            r.insert(key(i), pending(u64::from(i), deadline));
        }
        // Every other one leaves; a wrong id takes nothing.
        assert!(r.remove(&key(1), 999).is_none());
        for i in (1..1000u16).step_by(2) {
            assert_eq!(
                r.remove(&key(i), u64::from(i)).map(|p| p.id),
                Some(u64::from(i))
            );
        }
        for i in 1000..1500u16 {
            r.insert(key(i), pending(u64::from(i), deadline));
        }
        assert_eq!(r.len(), 1000);
        for i in 0..1500u16 {
            let there = i >= 1000 || i % 2 == 0;
            assert_eq!(r.contains(&key(i)), there, "{i}");
            assert_eq!(r.get(&key(i)).map(|p| p.id), there.then_some(u64::from(i)));
        }
        // A probe in place of one at the same connection: the later one is found.
        r.insert(key(0), pending(5000, deadline));
        assert_eq!(r.get_mut(&key(0), 5000).map(|p| p.seq), Some(5000));
        assert!(r.get_mut(&key(0), 0).is_none());
        assert_eq!(r.len(), 1000);
        assert_eq!(r.drain().count(), 1000);
        assert!(r.is_empty() && !r.contains(&key(2)));
    }
}
