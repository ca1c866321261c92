//! `cargo xtask fuzz --packets N [--seed S]`: the packet fuzzer of the test run
//! (`lb_tests::packet_fuzz`), as long as asked. Root (a namespace, BPF_PROG_TEST_RUN).

use clap::Parser;
use lb_tests::{packet_fuzz::Bed, rng::Rng};

#[derive(Parser)]
#[command(about = "Fuzz the XDP program with seeded random and mutated frames")]
struct Args {
    /// Frames to run.
    #[arg(long, default_value_t = 10_000_000)]
    packets: usize,
    /// Seed (default: LB_FUZZ_SEED, else the clock); printed, so a run can be repeated.
    #[arg(long)]
    seed: Option<u64>,
    /// Frames per round: each round reports and starts from a fresh datapath.
    #[arg(long, default_value_t = 1_000_000)]
    round: usize,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    lb_tests::require_root();
    let seed = match args.seed {
        Some(s) => s,
        None => Rng::from_env("packet fuzzer").1,
    };
    let mut rng = Rng::new(seed);
    let (mut done, mut round) = (0usize, 0u32);
    let started = std::time::Instant::now();
    while done < args.packets {
        let n = args.round.min(args.packets - done).max(1);
        // Each round its own seed, derived from the run's and printed with any failure.
        let round_seed = rng.next_u64();
        let bed = Bed::new()?;
        let report = bed.run(n, round_seed)?;
        done += report.packets;
        round += 1;
        eprintln!(
            "round {round} (seed {round_seed}): {} ({:?} in all)",
            report.summary(),
            started.elapsed()
        );
        if !report.failures.is_empty() {
            anyhow::bail!(
                "{} failures (run seed {seed}, round seed {round_seed}):\n{}",
                report.failures.len(),
                report.failures.join("\n\n")
            );
        }
    }
    eprintln!(
        "{done} packets, no failure (seed {seed}), {:?}",
        started.elapsed()
    );
    Ok(())
}
