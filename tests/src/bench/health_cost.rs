//! The checker's cost as lb-health-bench measured it, read back by peer_bench from the JSON that
//! lb-health-bench writes beside its markdown (`health.json` next to `health.md`): the goal row
//! of the report's goals table and the chart of CPU per probe by check kind and target count.

use std::path::Path;

use anyhow::Context as _;

use crate::bench::{chart, median, min_max};

/// One case: the daemon's checker in NAPI-thread mode, per round.
pub struct Row {
    pub kind: String,
    pub targets: usize,
    /// Process CPU in % of one core, per round.
    pub percent_core: Vec<f64>,
    /// Process CPU per probe in µs, per round.
    pub us_per_probe: Vec<f64>,
}

/// The goal: at most `percent_core` % of one core and `us_per_probe` µs per probe for
/// `targets` half-open targets.
pub struct Goal {
    pub targets: usize,
    pub percent_core: f64,
    pub us_per_probe: f64,
}

/// Issue 20's goal, which lb-health-bench measures against and writes into its JSON.
pub const GOAL: Goal = Goal {
    targets: 50_000,
    percent_core: 15.0,
    us_per_probe: 3.0,
};

impl Goal {
    /// Whether a median share of one core (%) and cost per probe (µs) meet it.
    pub fn met(&self, percent_core: f64, us_per_probe: f64) -> bool {
        percent_core <= self.percent_core && us_per_probe <= self.us_per_probe
    }
}

pub struct HealthCost {
    pub rows: Vec<Row>,
    pub goal: Goal,
}

/// Reads the JSON beside `markdown` (lb-health-bench's `--out`); None when there is none (the
/// cost part did not run).
pub fn read(markdown: &Path) -> anyhow::Result<Option<HealthCost>> {
    let path = markdown.with_extension("json");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let num = |v: &serde_json::Value, key: &str| {
        v[key]
            .as_f64()
            .with_context(|| format!("{}: no number {key}", path.display()))
    };
    let list = |v: &serde_json::Value, key: &str| -> Vec<f64> {
        v[key]
            .as_array()
            .map(|a| a.iter().filter_map(serde_json::Value::as_f64).collect())
            .unwrap_or_default()
    };
    let g = &v["goal"];
    let goal = Goal {
        targets: num(g, "targets")? as usize,
        percent_core: num(g, "percent_core")?,
        us_per_probe: num(g, "us_per_probe")?,
    };
    let rows = v["checker_threaded"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|r| {
            Ok(Row {
                kind: r["kind"].as_str().unwrap_or("?").to_owned(),
                targets: num(r, "targets")? as usize,
                percent_core: list(r, "percent_core"),
                us_per_probe: list(r, "us_per_probe"),
            })
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(Some(HealthCost { rows, goal }))
}

/// `12345` as `12,345`.
fn thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

impl HealthCost {
    /// The goal row: (goal, measured, met), from this run's medians; None if the goal's case
    /// did not run.
    pub fn goal(&self) -> Option<(String, String, bool)> {
        let g = &self.goal;
        let row = self
            .rows
            .iter()
            .find(|r| r.kind == "tcp" && r.targets == g.targets)?;
        let (pct, us) = (median(&row.percent_core), median(&row.us_per_probe));
        Some((
            format!(
                "health checks: {} half-open targets at 1 s ≤ {}% of one core and ≤ {} µs per probe",
                thousands(g.targets),
                g.percent_core,
                g.us_per_probe
            ),
            format!("{pct:.1}% and {us:.2} µs"),
            g.met(pct, us),
        ))
    }

    /// Bars of the checker's CPU per probe (median, min–max over the rounds), one per kind and
    /// target count.
    pub fn chart(&self, path: &Path) -> anyhow::Result<()> {
        let cats: Vec<String> = self
            .rows
            .iter()
            .map(|r| format!("{} × {}", r.kind, thousands(r.targets)))
            .collect();
        let values = self
            .rows
            .iter()
            .map(|r| {
                let (lo, hi) = min_max(&r.us_per_probe);
                (median(&r.us_per_probe), lo, hi)
            })
            .collect();
        chart::grouped_bars(
            path,
            "Health checks: the checker's CPU per probe (1 s interval, NAPI threads)",
            "µs of checker CPU per probe",
            &cats,
            &[chart::Series {
                name: "checker".into(),
                values,
            }],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rows_and_judges_the_goal() {
        let dir = crate::daemon::TempDir::new().unwrap();
        let md = dir.0.join("health.md");
        assert!(read(&md).unwrap().is_none());
        std::fs::write(
            md.with_extension("json"),
            r#"{"goal": {"targets": 50000, "percent_core": 15.0, "us_per_probe": 3.0},
                "checker_threaded": [
                  {"kind": "tcp", "targets": 50000, "percent_core": [14.0, 16.0, 15.5],
                   "us_per_probe": [2.8, 3.2, 3.1]},
                  {"kind": "udp", "targets": 1000, "percent_core": [2.0], "us_per_probe": [20.0]}]}"#,
        )
        .unwrap();
        let cost = read(&md).unwrap().unwrap();
        assert_eq!(cost.rows.len(), 2);
        let (goal, measured, met) = cost.goal().unwrap();
        assert_eq!(
            goal,
            "health checks: 50,000 half-open targets at 1 s ≤ 15% of one core and ≤ 3 µs per probe"
        );
        // Medians 15.5% and 3.1 µs: both over.
        assert_eq!(measured, "15.5% and 3.10 µs");
        assert!(!met);
    }
}
