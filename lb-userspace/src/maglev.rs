//! Maglev consistent hashing (Eisenbud et al., NSDI 2016) for a service's lookup table, the
//! "ring": `size` slots (a prime), each naming the backend that takes new flows hashing there.
//!
//! Every backend walks its own permutation of the slots, `(offset + j * skip) % size`, seeded
//! only by a fixed hash of its key; backends take turns claiming their next preferred empty slot
//! until the ring is full. That gives near-perfect balance and only small movement when the
//! backend set changes. Turns are handed out in proportion to weight.
//!
//! The ring must be identical on every host with the same config (flows may land on any of
//! them), so it depends only on keys, weights, member order and size: no random seeds, no
//! `HashMap` order, and a hash defined here rather than std's `DefaultHasher`, which may change
//! between Rust versions.
//!
//! Health is an overlay, not a rebuild: slots whose configured owner is available keep it, and
//! only the slots of unavailable backends are reassigned (to their owner in the ring of the
//! available backends). A failing backend thus moves only its own flows, and when it recovers
//! exactly those slots return; a plain rebuild would also shuffle some slots between healthy
//! backends and break their established flows.

/// Default ring size: a prime.
pub const DEFAULT_RING_SIZE: u32 = 65537;

/// Whether `n` is prime (trial division; ring sizes are small).
pub fn is_prime(n: u32) -> bool {
    if n < 2 {
        return false;
    }
    if n.is_multiple_of(2) {
        return n == 2;
    }
    let n = u64::from(n);
    let mut d = 3u64;
    while d * d <= n {
        if n.is_multiple_of(d) {
            return false;
        }
        d += 2;
    }
    true
}

/// One backend as Maglev sees it. `key` identifies the backend (e.g. its "ip:port" bytes) and
/// seeds its permutation; `weight` > 0 (weight-0 backends must simply be left out by callers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Member<'a> {
    pub key: &'a [u8],
    pub weight: u32,
}

/// Plain weighted Maglev population over `members`, ring of `size` slots. Returns for each slot
/// the index into `members`. Empty `members` (or none with weight > 0) -> empty Vec; a member
/// with weight 0 gets no slot.
///
/// # Panics
/// If `size` is not prime: a permutation then need not reach every slot and the fill could
/// never finish. Callers validate the size first.
pub fn populate(members: &[Member], size: u32) -> Vec<u32> {
    assert!(is_prime(size), "maglev ring size {size} is not prime");
    let max_weight = members.iter().map(|m| m.weight).max().unwrap_or(0);
    if max_weight == 0 {
        return Vec::new();
    }
    let size64 = u64::from(size);
    // Current position of each member's permutation; stepping by `skip` instead of computing
    // `offset + j * skip` each time gives the same sequence.
    let mut pos: Vec<u64> = Vec::with_capacity(members.len());
    let mut skip: Vec<u64> = Vec::with_capacity(members.len());
    for m in members {
        pos.push(hash(SEED_OFFSET, m.key) % size64);
        // size >= 2 (prime), so size - 1 >= 1; skip in 1..size is coprime with a prime size.
        skip.push(hash(SEED_SKIP, m.key) % (size64 - 1) + 1);
    }
    let mut credit = vec![0u64; members.len()];
    let mut ring = vec![u32::MAX; size as usize];
    let mut filled = 0u32;
    // Each round every member earns its weight in credit and takes one turn per `max_weight`
    // of credit, so turns (and slots) are proportional to weight; the heaviest member takes a
    // turn every round, so every round makes progress.
    'fill: loop {
        for (i, m) in members.iter().enumerate() {
            credit[i] += u64::from(m.weight);
            while credit[i] >= u64::from(max_weight) {
                credit[i] -= u64::from(max_weight);
                // An empty slot exists (ring not full) and a permutation over a prime size
                // visits every slot, so this ends.
                while ring[pos[i] as usize] != u32::MAX {
                    // pos and skip are below size, so one subtraction wraps (this step runs
                    // about size × ln(size) times; with a division here a 4-member ring took
                    // 3.5 ms against 3.0, release build).
                    pos[i] += skip[i];
                    if pos[i] >= size64 {
                        pos[i] -= size64;
                    }
                }
                ring[pos[i] as usize] = i as u32;
                filled += 1;
                if filled == size {
                    break 'fill;
                }
            }
        }
    }
    ring
}

/// [`populate`] of each member list, spread over the machine's cores: a start or a reload
/// populates every new or changed service's ring (3 ms each for 4 members in a release build),
/// each on its own and with the same result wherever it runs.
///
/// # Panics
/// If `size` is not prime.
pub fn populate_all(lists: &[Vec<Member>], size: u32) -> Vec<Vec<u32>> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(lists.len());
    if threads <= 1 {
        return lists.iter().map(|l| populate(l, size)).collect();
    }
    // Each thread takes the next list not taken: rings of very different sizes still spread.
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut rings = vec![Vec::new(); lists.len()];
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(list) = lists.get(i) else {
                            return done;
                        };
                        done.push((i, populate(list, size)));
                    }
                })
            })
            .collect();
        for worker in workers {
            match worker.join() {
                Ok(done) => {
                    for (i, ring) in done {
                        rings[i] = ring;
                    }
                }
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
    });
    rings
}

/// The ring lb programs: `populate(members)` with the slots of unavailable members handed to
/// their owner in the ring of the available members. `available[i]` says whether member `i` may
/// take new flows. None if no member (with weight > 0) is available.
///
/// # Panics
/// If `available.len() != members.len()` or `size` is not prime.
pub fn overlay(members: &[Member], available: &[bool], size: u32) -> Option<Vec<u32>> {
    overlay_with_base(&populate(members, size), members, available, size)
}

/// [`overlay`] with `base = populate(members, size)` already computed (it only changes with the
/// config, while availability changes with health checks).
///
/// # Panics
/// If `available.len() != members.len()`, `base` is not `size` long or `size` is not prime.
pub fn overlay_with_base(
    base: &[u32],
    members: &[Member],
    available: &[bool],
    size: u32,
) -> Option<Vec<u32>> {
    assert_eq!(
        available.len(),
        members.len(),
        "one availability per member"
    );
    // Indices (into `members`) of those that may take flows.
    let up: Vec<u32> = (0..members.len())
        .filter(|&i| available[i] && members[i].weight > 0)
        .map(|i| i as u32)
        .collect();
    if up.is_empty() {
        return None;
    }
    assert_eq!(base.len(), size as usize, "base ring of another size");
    if base.iter().all(|&o| available[o as usize]) {
        return Some(base.to_vec());
    }
    let up_members: Vec<Member> = up.iter().map(|&i| members[i as usize]).collect();
    let fallback = populate(&up_members, size);
    Some(
        base.iter()
            .zip(&fallback)
            .map(|(&owner, &f)| {
                if available[owner as usize] {
                    owner
                } else {
                    up[f as usize]
                }
            })
            .collect(),
    )
}

/// Slots that differ between two rings of equal length, as `(slot, new_owner)`; if the lengths
/// differ, every slot of `new`. Only these need writing to the BPF map.
pub fn changed_slots(old: &[u32], new: &[u32]) -> Vec<(u32, u32)> {
    let all = old.len() != new.len();
    new.iter()
        .enumerate()
        .filter(|&(s, &o)| all || old[s] != o)
        .map(|(s, &o)| (s as u32, o))
        .collect()
}

const SEED_OFFSET: u64 = 0;
const SEED_SKIP: u64 = 0x9e37_79b9_7f4a_7c15;

/// FNV-1a 64 (offset basis xor `seed`) finished with murmur3's fmix64, so that short keys
/// differing in one byte still give unrelated offsets and skips. Part of the ring's definition:
/// changing it changes every ring (the golden test pins it).
fn hash(seed: u64, key: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325 ^ seed;
    for &b in key {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    const M: u32 = DEFAULT_RING_SIZE;

    fn keys(n: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| format!("10.0.{}.{}:8080", i / 250, i % 250).into_bytes())
            .collect()
    }

    fn equal(keys: &[Vec<u8>]) -> Vec<Member<'_>> {
        keys.iter().map(|k| Member { key: k, weight: 1 }).collect()
    }

    fn counts(ring: &[u32], n: usize) -> Vec<u32> {
        let mut c = vec![0u32; n];
        for &o in ring {
            c[o as usize] += 1;
        }
        c
    }

    /// max/min slots over the members not in `skip`.
    fn ratio(ring: &[u32], n: usize, skip: Option<usize>) -> f64 {
        let c = counts(ring, n);
        let c: Vec<u32> = (0..n).filter(|&i| Some(i) != skip).map(|i| c[i]).collect();
        let max = *c.iter().max().unwrap();
        let min = *c.iter().min().unwrap();
        assert!(min > 0, "a member got no slot");
        f64::from(max) / f64::from(min)
    }

    #[test]
    fn primes() {
        let primes: Vec<u32> = (0..30).filter(|&n| is_prime(n)).collect();
        assert_eq!(primes, [2, 3, 5, 7, 11, 13, 17, 19, 23, 29]);
        assert!(is_prime(M));
        assert!(is_prime(65521) && !is_prime(65535) && !is_prime(65536));
        assert!(is_prime(4_294_967_291) && !is_prime(u32::MAX));
    }

    #[test]
    fn balance_equal_weights() {
        for n in [1, 2, 3, 10, 50, 100] {
            let k = keys(n);
            let start = Instant::now();
            let ring = populate(&equal(&k), M);
            let took = start.elapsed();
            assert_eq!(ring.len(), M as usize);
            assert!(ring.iter().all(|&o| (o as usize) < n));
            let r = ratio(&ring, n, None);
            println!("balance n={n}: max/min {r:.4}, built in {took:?}");
            assert!(r <= 1.02, "n={n}: max/min {r}");
        }
    }

    #[test]
    fn weights_are_proportional() {
        let k = keys(3);
        let members: Vec<Member> = k
            .iter()
            .zip([1, 2, 3])
            .map(|(k, weight)| Member { key: k, weight })
            .collect();
        let c = counts(&populate(&members, M), 3);
        for (i, want) in [1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0].into_iter().enumerate() {
            let share = f64::from(c[i]) / f64::from(M);
            println!("weight {}: share {share:.4} (want {want:.4})", i + 1);
            assert!(
                (share - want).abs() <= 0.01,
                "member {i}: {share} vs {want}"
            );
        }
    }

    #[test]
    fn populating_many_at_once_gives_each_its_own_ring() {
        let k = keys(12);
        let lists: Vec<Vec<Member>> = (0..9)
            .map(|i| {
                k[i..i + 1 + i % 4]
                    .iter()
                    .map(|key| Member {
                        key,
                        weight: 1 + (i % 3) as u32,
                    })
                    .collect()
            })
            .chain([Vec::new()])
            .collect();
        let rings = populate_all(&lists, 1009);
        let one_by_one: Vec<Vec<u32>> = lists.iter().map(|l| populate(l, 1009)).collect();
        assert_eq!(rings, one_by_one);
        assert!(rings[9].is_empty() && rings[0].len() == 1009);
        assert!(populate_all(&[], 1009).is_empty());
    }

    #[test]
    fn deterministic() {
        let k = keys(20);
        let a = populate(&equal(&k), M);
        // Same keys in fresh allocations, built again: only content matters.
        let k2: Vec<Vec<u8>> = k.iter().map(|k| k.to_vec()).collect();
        assert_eq!(a, populate(&equal(&k2), M));
        // Each input does matter.
        let mut heavier = equal(&k);
        heavier[3].weight = 2;
        assert_ne!(a, populate(&heavier, M));
        let mut reordered = equal(&k);
        reordered.swap(0, 1);
        assert_ne!(a, populate(&reordered, M));
        assert_ne!(a[..65521], populate(&equal(&k), 65521)[..]);
    }

    /// Pins the hash and the fill order: a change here changes every host's ring, so hosts on
    /// different lb versions would disagree.
    #[test]
    fn golden() {
        assert_eq!(hash(SEED_OFFSET, b""), 0xefd0_1f60_ba99_2926);
        assert_eq!(hash(SEED_OFFSET, b"10.0.0.1:8080"), 0xe8c7_2115_6ed5_2b14);
        assert_eq!(hash(SEED_SKIP, b"10.0.0.1:8080"), 0x212d_e274_9e59_f3d6);
        let k = keys(5);
        let ring = populate(&equal(&k), 13);
        assert_eq!(ring, [1, 2, 4, 1, 0, 0, 1, 3, 0, 3, 2, 2, 4]);
        let weighted: Vec<Member> = k
            .iter()
            .zip([1, 2, 3, 1, 2])
            .map(|(k, weight)| Member { key: k, weight })
            .collect();
        let ring = populate(&weighted, 13);
        assert_eq!(ring, [1, 2, 4, 1, 2, 0, 1, 4, 4, 3, 2, 2, 2]);
    }

    #[test]
    fn overlay_moves_only_the_unavailable() {
        let n = 100;
        let k = keys(n);
        let members = equal(&k);
        let base = populate(&members, M);
        let mut available = vec![true; n];
        assert_eq!(overlay(&members, &available, M).as_deref(), Some(&base[..]));

        available[37] = false;
        let start = Instant::now();
        let down = overlay_with_base(&base, &members, &available, M).unwrap();
        println!("overlay rebuilt in {:?}", start.elapsed());
        let changed = changed_slots(&base, &down);
        assert!(changed.iter().all(|&(s, _)| base[s as usize] == 37));
        assert!(down.iter().all(|&o| o != 37));
        let frac = changed.len() as f64 / f64::from(M);
        let r = ratio(&down, n, Some(37));
        println!("member 37 down: {frac:.4} of slots moved, others' max/min {r:.4}");
        assert!(frac <= 0.02, "moved {frac}");
        assert!(r <= 1.03, "max/min {r}");

        available[37] = true;
        assert_eq!(
            overlay_with_base(&base, &members, &available, M),
            Some(base)
        );
    }

    #[test]
    fn config_changes() {
        let k = keys(101);
        let before = populate(&equal(&k[..100]), M);

        // Add a 101st: slots going to it are expected, slots moving between the old ones are
        // Maglev's (small) disruption.
        let added = populate(&equal(&k), M);
        let between = before
            .iter()
            .zip(&added)
            .filter(|&(&b, &a)| a != 100 && a != b)
            .count();
        let frac = between as f64 / f64::from(M);
        println!("add 1 to 100: {frac:.4} of slots moved between existing members");
        assert!(frac <= 0.01, "moved {frac} (measured 0.0054)");

        // Remove member 37 (indices above it shift down by one).
        let mut rest = k[..100].to_vec();
        rest.remove(37);
        let removed = populate(&equal(&rest), M);
        let moved = before
            .iter()
            .zip(&removed)
            .filter(|&(&b, &a)| {
                let a = if a >= 37 { a + 1 } else { a };
                a != b
            })
            .count();
        let frac = moved as f64 / f64::from(M);
        println!("remove 1 of 100: {frac:.4} of slots moved in total");
        assert!(frac <= 0.02, "moved {frac}");
    }

    #[test]
    fn changed_slots_lists_differences() {
        assert_eq!(changed_slots(&[0, 1, 2], &[0, 1, 2]), []);
        assert_eq!(changed_slots(&[0, 1, 2], &[0, 2, 2]), [(1, 2)]);
        assert_eq!(changed_slots(&[0, 1, 2], &[1, 1, 0]), [(0, 1), (2, 0)]);
        assert_eq!(changed_slots(&[], &[4, 5]), [(0, 4), (1, 5)]);
        assert_eq!(changed_slots(&[4, 5, 6], &[4, 5]), [(0, 4), (1, 5)]);
        assert_eq!(changed_slots(&[4], &[]), []);
    }

    #[test]
    fn overlay_edges() {
        let k = keys(10);
        let members = equal(&k);
        assert_eq!(overlay(&members, &[false; 10], M), None);
        assert_eq!(overlay(&[], &[], M), None);
        let mut one = [false; 10];
        one[6] = true;
        let ring = overlay(&members, &one, M).unwrap();
        assert_eq!(ring.len(), M as usize);
        assert!(ring.iter().all(|&o| o == 6));
        assert_eq!(populate(&[], M), Vec::<u32>::new());
    }
}
