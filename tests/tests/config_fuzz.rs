//! No config text can panic or hang the reader (issue 14). Seeded mutations of a valid config
//! ([`lb_tests::config_mutations`]): in process, every one must give a config or problems that
//! each name where (a key path, or a line and column); through `lb check-config`, every one must
//! exit 0 or 64 with those problems on stderr, never 101 (a panic) and never hang. A failure
//! prints the seed (`LB_FUZZ_SEED` repeats the run) and the file.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use lb_tests::{config_mutations::mutated, daemon::TempDir, lb_bin, rng::Rng};

/// In-process cases per run (a few seconds).
const IN_PROCESS: usize = 5_000;
/// Cases through the binary per run.
const THROUGH_THE_BINARY: usize = 1_000;
/// Longest any one case may take: far beyond a normal parse, short of a hang.
const NO_HANG: Duration = Duration::from_secs(10);

/// The case for a failure message: its start, and the whole file kept under target/ to feed to
/// `lb check-config` by hand.
fn shown(bytes: &[u8]) -> String {
    let kept = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "config-fuzz-{}-{}.toml",
        std::process::id(),
        std::thread::current()
            .name()
            .unwrap_or("case")
            .replace("::", "-")
    ));
    let _ = std::fs::write(&kept, bytes);
    let text = String::from_utf8_lossy(bytes);
    let cut: String = text.chars().take(1500).collect();
    let more = if cut.len() < text.len() {
        format!("... ({} bytes)", bytes.len())
    } else {
        String::new()
    };
    format!("{cut}{more}\n(the whole case: {})", kept.display())
}

/// What is wrong with a reader's problems, if anything: each names where, says what, briefly.
fn bad_problem(p: &lb::config::Problem) -> Option<String> {
    if p.path.is_empty() {
        return Some(format!("no path: {p}"));
    }
    if p.message.is_empty() {
        return Some(format!("no message: {p}"));
    }
    if p.to_string().len() > 2000 {
        return Some(format!("{} bytes of problem", p.to_string().len()));
    }
    None
}

#[test]
fn no_mutation_panics_the_reader() {
    let (mut rng, seed) = Rng::from_env("config reader");
    let (mut accepted, mut rejected, mut slowest) = (0, 0, Duration::ZERO);
    let start = Instant::now();
    for case in 0..IN_PROCESS {
        let bytes = mutated(&mut rng);
        let began = Instant::now();
        let result =
            std::panic::catch_unwind(|| lb::config::text(&bytes).and_then(lb::config::parse));
        let took = began.elapsed();
        slowest = slowest.max(took);
        let context = || format!("seed {seed}, case {case}:\n{}", shown(&bytes));
        assert!(took < NO_HANG, "took {took:?}: {}", context());
        match result {
            Err(_) => panic!("the reader panicked on {}", context()),
            Ok(Ok(_)) => accepted += 1,
            Ok(Err(errors)) => {
                assert!(
                    !errors.0.is_empty(),
                    "rejected without a problem: {}",
                    context()
                );
                for p in &errors.0 {
                    if let Some(why) = bad_problem(p) {
                        panic!("{why} for {}", context());
                    }
                }
                rejected += 1;
            }
        }
    }
    eprintln!(
        "{IN_PROCESS} mutations in {:?}: {accepted} accepted, {rejected} rejected, slowest {slowest:?}",
        start.elapsed()
    );
    // The mutations must mostly break the file, and some must keep it valid.
    assert!(
        rejected > IN_PROCESS / 2 && accepted > 0,
        "{accepted} / {rejected}"
    );
}

/// `lb check-config FILE` within [`NO_HANG`]: (exit code, stdout, stderr); None when it hung.
fn check_config(file: &std::path::Path) -> Option<(i32, String, String)> {
    let mut child = Command::new(lb_bin())
        .arg("check-config")
        .arg(file)
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting lb");
    // Drained while it runs: a long list of problems must not fill the pipe and stall it.
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_string(&mut text);
            }
            text
        })
    };
    let out = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let err = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let deadline = Instant::now() + NO_HANG;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for lb") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let (out, err) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    Some((status.code().unwrap_or(-1), out, err))
}

#[test]
fn check_config_answers_every_mutation_with_0_or_64() {
    let (rng, seed) = Rng::from_env("lb check-config");
    let dir = TempDir::new().unwrap();
    let start = Instant::now();
    // Two workers (two cores), each with its own stream of cases.
    let counts: Vec<(usize, usize)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2u64)
            .map(|w| {
                let mut rng = Rng::new(rng.clone().next_u64() ^ w);
                let dir = &dir.0;
                s.spawn(move || {
                    let (mut ok, mut invalid) = (0, 0);
                    for case in 0..THROUGH_THE_BINARY / 2 {
                        let bytes = mutated(&mut rng);
                        let file = dir.join(format!("w{w}-c{case}.toml"));
                        std::fs::write(&file, &bytes).unwrap();
                        let context =
                            || format!("seed {seed}, worker {w}, case {case}:\n{}", shown(&bytes));
                        let Some((code, out, err)) = check_config(&file) else {
                            panic!("lb check-config hung on {}", context());
                        };
                        assert!(!err.contains("panicked"), "{err}\n{}", context());
                        // The binary says what the reader says, each problem on a line.
                        let in_process = lb::config::text(&bytes).and_then(lb::config::parse);
                        match code {
                            0 => {
                                assert!(out.contains(": ok ("), "{out}\n{}", context());
                                assert!(in_process.is_ok(), "accepted by lb only: {}", context());
                                ok += 1;
                            }
                            64 => {
                                let mut lines = err.lines();
                                assert_eq!(
                                    lines.next(),
                                    Some(
                                        format!("{}: invalid configuration", file.display())
                                            .as_str()
                                    ),
                                    "{}",
                                    context()
                                );
                                let shown: Vec<String> = lines.map(str::to_owned).collect();
                                let want: Vec<String> = match &in_process {
                                    Err(errors) => {
                                        errors.0.iter().map(|p| format!("  {p}")).collect()
                                    }
                                    Ok(_) => panic!("rejected by lb only: {err}\n{}", context()),
                                };
                                assert_eq!(shown, want, "{}", context());
                                invalid += 1;
                            }
                            other => panic!("exit {other}:\n{err}\n{}", context()),
                        }
                        let _ = std::fs::remove_file(&file);
                    }
                    (ok, invalid)
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let (ok, invalid): (usize, usize) = counts.iter().fold((0, 0), |(a, b), (x, y)| (a + x, b + y));
    eprintln!(
        "{THROUGH_THE_BINARY} files through lb check-config in {:?}: {ok} valid (exit 0), {invalid} invalid (exit 64)",
        start.elapsed()
    );
    assert_eq!(ok + invalid, THROUGH_THE_BINARY);
}

/// The panic issue 14 found: any of the 11 duration keys with a value no `Duration` holds made
/// `lb check-config` exit 101 with a backtrace. Now each is out of range, exit 64.
#[test]
fn a_huge_duration_is_out_of_range_in_every_duration_key() {
    let dir = TempDir::new().unwrap();
    let huge = "\"99999999999999999999s\"";
    let keys = [
        ("conntrack", "tcp_syn_timeout"),
        ("conntrack", "tcp_established_timeout"),
        ("conntrack", "tcp_closing_timeout"),
        ("conntrack", "tcp_closed_timeout"),
        ("conntrack", "udp_timeout"),
        ("check", "timeout"),
        ("check", "interval"),
        ("check", "unhealthy_interval"),
        ("passive", "window"),
        ("passive", "ejection"),
        ("passive", "traffic_idle"),
    ];
    for (table, key) in keys {
        let text = match table {
            "conntrack" => {
                format!("[lb]\ninterfaces = [\"eth1\"]\nconntrack = {{ {key} = {huge} }}\n")
            }
            _ => format!(
                "[lb]\ninterfaces = [\"eth1\"]\n[[service]]\nname = \"web\"\nvip = \"10.100.0.1:80\"\n\
                 backends = [{{ address = \"10.0.2.2:80\" }}]\n[service.{table}]\n{key} = {huge}\n"
            ),
        };
        let file = dir.0.join(format!("{key}.toml"));
        std::fs::write(&file, text).unwrap();
        let (code, _, err) = check_config(&file).expect("no hang");
        assert_eq!(code, 64, "{table}.{key}: {err}");
        let path = match table {
            "conntrack" => format!("lb.conntrack.{key}"),
            t => format!("service[0].{t}.{key}"),
        };
        assert!(
            err.contains(&format!("  {path}: 99999999999999999999s is out of range")),
            "{err}"
        );
    }
}
