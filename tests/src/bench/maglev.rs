//! Maglev (part 5): ring build time at M = 65537 for 100 and 1,000 backends, and how much of the
//! ring (so of new flows' hash space) moves when one backend leaves, against the minimum (its own
//! share). Pure computation with lb's own functions.

use std::{fmt::Write as _, time::Instant};

use lb::maglev::{DEFAULT_RING_SIZE as M, Member, changed_slots, overlay_with_base, populate};

use crate::bench::{median, min_max};

pub struct Row {
    pub backends: usize,
    /// Build time of a full ring, milliseconds, per run.
    pub build_ms: Vec<f64>,
    /// One backend removed from the config (ring rebuilt without it): fraction of slots whose
    /// backend changed, mean over the removals tried.
    pub removed_moved: f64,
    /// Its own share of the ring (the minimum any scheme must move), mean over the same removals.
    pub removed_own: f64,
    /// One backend marked unavailable (lb's health overlay): fraction of slots changed.
    pub down_moved: f64,
    /// Time to compute that overlay, milliseconds (median).
    pub overlay_ms: f64,
}

fn keys(n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| format!("10.{}.{}.{}:8080", 1 + i / 62500, (i / 250) % 250, i % 250).into_bytes())
        .collect()
}

fn members(keys: &[Vec<u8>]) -> Vec<Member<'_>> {
    keys.iter().map(|k| Member { key: k, weight: 1 }).collect()
}

pub fn run(runs: usize, removals: usize) -> Vec<Row> {
    [100usize, 1000]
        .into_iter()
        .map(|n| {
            let k = keys(n);
            let all = members(&k);
            let mut build_ms = Vec::new();
            let mut base = Vec::new();
            for _ in 0..runs {
                let t = Instant::now();
                base = populate(&all, M);
                build_ms.push(t.elapsed().as_secs_f64() * 1e3);
            }
            let (mut moved, mut own, mut down, mut overlay_ms) = (0.0, 0.0, 0.0, Vec::new());
            for j in 0..removals {
                let gone = (j * n / removals + n / (2 * removals)) % n;
                let mut rest = all.clone();
                rest.remove(gone);
                let after = populate(&rest, M);
                // Indices above the removed one shift down by one in `rest`.
                let changed = base
                    .iter()
                    .zip(&after)
                    .filter(|&(&b, &a)| {
                        let a = if a as usize >= gone { a + 1 } else { a };
                        a != b
                    })
                    .count();
                moved += changed as f64 / f64::from(M);
                own += base.iter().filter(|&&b| b as usize == gone).count() as f64 / f64::from(M);
                let mut available = vec![true; n];
                available[gone] = false;
                let t = Instant::now();
                let over = overlay_with_base(&base, &all, &available, M).expect("others are up");
                overlay_ms.push(t.elapsed().as_secs_f64() * 1e3);
                down += changed_slots(&base, &over).len() as f64 / f64::from(M);
            }
            let r = removals as f64;
            Row {
                backends: n,
                build_ms,
                removed_moved: moved / r,
                removed_own: own / r,
                down_moved: down / r,
                overlay_ms: median(&overlay_ms),
            }
        })
        .collect()
}

pub fn markdown(rows: &[Row], runs: usize, removals: usize) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Ring of M = {M} slots, equal weights; build time is the median of {runs} runs of \
         `lb::maglev::populate`; movement is the mean over {removals} different backends leaving.\n\n\
         | backends | build (median) | min – max | one removed from the config: slots moved | its own share (minimum) | one marked down (health overlay): slots moved | overlay time |\n\
         |---:|---:|---:|---:|---:|---:|---:|"
    );
    for r in rows {
        let (lo, hi) = min_max(&r.build_ms);
        let _ = writeln!(
            s,
            "| {} | {:.1} ms | {lo:.1} – {hi:.1} ms | {:.3}% | {:.3}% | {:.3}% | {:.1} ms |",
            r.backends,
            median(&r.build_ms),
            100.0 * r.removed_moved,
            100.0 * r.removed_own,
            100.0 * r.down_moved,
            r.overlay_ms
        );
    }
    s
}
