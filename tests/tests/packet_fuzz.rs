//! The packet fuzzer in every test run (issue 13; see `lb_tests::packet_fuzz` for the properties
//! judged). Seeded: a failure prints its seed, and `LB_FUZZ_SEED=<seed>` repeats it; `cargo
//! xtask fuzz --packets N` runs longer.

use lb_tests::{packet_fuzz::Bed, require_root, rng::Rng};

/// Packets per test run: the 200,000 (a few tens of seconds here).
const PACKETS: usize = 200_000;

#[test]
fn no_packet_crashes_or_corrupts_the_datapath() {
    require_root();
    let (_, seed) = Rng::from_env("packet fuzzer");
    let bed = Bed::new().unwrap();
    let started = std::time::Instant::now();
    let report = bed.run(PACKETS, seed).unwrap();
    eprintln!("{} in {:?}", report.summary(), started.elapsed());
    assert!(
        report.failures.is_empty(),
        "{} failures (seed {seed}):\n{}",
        report.failures.len(),
        report.failures.join("\n\n")
    );
    assert_eq!(report.packets, PACKETS);
    // Every class of verdict was reached: the fuzzer went through lb's paths, not around them.
    assert!(
        report.verdicts[1..].iter().all(|&n| n > 100),
        "{}",
        report.summary()
    );
    // IPv6's own paths too (extension headers, UDP without checksum), and direct server
    // return's (packets too big for the encapsulation, errors encapsulated to a backend).
    let moved = |name: &str| report.counters.iter().any(|(n, v)| n == name && *v > 0);
    for name in [
        "ipv6_ext_headers",
        "drop_ext_headers",
        "pass_ext_headers",
        "drop_udp_no_checksum",
        "icmp_too_big",
        "drop_too_big",
        "icmp_encapsulated",
        // The SYN proxy's: cookies answered and returned, flows opened and translated, and
        // damaged segments it would answer dropped.
        "syn_proxy_synack",
        "syn_proxy_ack_valid",
        "syn_proxy_opened",
        "syn_proxy_translated",
        "drop_syn_proxy_checksum",
    ] {
        assert!(moved(name), "{name}: {}", report.summary());
    }
}
