//! `lb`: thin entry point. Parses arguments, sets up logging, runs, maps errors to exit codes.

use std::process::ExitCode;

use clap::Parser as _;
use lb::{
    cli::{self, Cli, Command, SourceArgs},
    client, config, daemon, exit, manual,
};
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colours only on a terminal: log files and journals get plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();

    let result = match cli.command {
        Command::CheckConfig { file } => {
            return match config::load_for_host(&file) {
                Ok(c) => {
                    println!("{}: ok ({} services)", file.display(), c.services.len());
                    if let Some(a) = &c.lb.announce {
                        println!("  announcing VIPs: {}", a.describe());
                    }
                    for s in &c.services {
                        match s.check.windows() {
                            Some((fail, ok)) => println!(
                                "  {}: {} check{}, failure window {fail}s, success window at most {ok}s",
                                s.name,
                                s.check.kind.as_str(),
                                if s.check.through_tunnel {
                                    " through the tunnel"
                                } else {
                                    ""
                                }
                            ),
                            None => println!("  {}: no check", s.name),
                        }
                        let w = &s.check.window;
                        let per_kind = lb::model::FailureThresholds::from(w)
                            .differ_from(w.unhealthy_threshold);
                        if let Some(per_kind) = per_kind {
                            println!(
                                "    unhealthy after {per_kind} failures in a row (failure window: the timeouts')"
                            );
                        }
                    }
                    ExitCode::SUCCESS
                }
                Err(errors) => config_failure(&file, &errors),
            };
        }
        Command::Run {
            config: file,
            no_pin,
            source:
                SourceArgs {
                    config_source: Some(url),
                    etcd_ca,
                    etcd_cert,
                    etcd_key,
                    etcd_user,
                },
        } => {
            let tls = etcd_ca.map(|ca| lb::source::EtcdTls {
                ca,
                identity: etcd_cert.zip(etcd_key),
            });
            let user =
                etcd_user.map(|u| (u, std::env::var("LB_ETCD_PASSWORD").unwrap_or_default()));
            let source = match lb::source::EtcdSource::parse(&url, tls, user) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("lb: --config-source: {e:#}");
                    return ExitCode::from(exit::USAGE as u8);
                }
            };
            let rt = match runtime() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("lb: {e:#}");
                    return ExitCode::FAILURE;
                }
            };
            let opened = rt.block_on(lb::source::open_etcd(source, &file, rt.handle().clone()));
            let (store, snapshot, config) = match opened {
                Ok(o) => o,
                Err(lb::source::OpenError::Config(errors)) => {
                    return config_failure(&file, &errors);
                }
                Err(lb::source::OpenError::Other(e)) => {
                    eprintln!("lb: {e:#}");
                    return ExitCode::FAILURE;
                }
            };
            rt.block_on(daemon::run(store, snapshot, config, !no_pin))
        }
        Command::Run {
            config: file,
            no_pin,
            source: _,
        } => {
            let store = lb::source::FileStore::new(&file);
            let read = store
                .read()
                .and_then(|s| Ok((config::parse_for_host(&s.text)?, s)));
            let (config, snapshot) = match read {
                Ok(read) => read,
                Err(errors) => return config_failure(&file, &errors),
            };
            runtime().and_then(|rt| {
                rt.block_on(daemon::run(
                    lb::source::Store::File(store),
                    snapshot,
                    config,
                    !no_pin,
                ))
            })
        }
        Command::Status { service, api } => block_on(cli::status(api, service)),
        Command::Events { follow, after, api } => block_on(cli::events(api, follow, after)),
        Command::Trace {
            service,
            client,
            duration,
            api,
        } => block_on(cli::trace(api, service, client, duration)),
        Command::Backend(cmd) => block_on(cli::changes::backend(cmd)),
        Command::Service(cmd) => block_on(cli::changes::service(cmd)),
        Command::Config(cmd) => block_on(cli::changes::config(cmd)),
        Command::DrainHost { api } => block_on(cli::host(api, true)),
        Command::UndrainHost { api } => block_on(cli::host(api, false)),
        Command::Reload { api } => block_on(cli::reload(api)),
        Command::Stop { pin_path, api } => block_on(cli::stop(api, pin_path)),
        Command::Stats { api } => block_on(cli::stats(api)),
        Command::Decap(args) => cli::decap(args),
        Command::Completions { shell } => {
            manual::completions(shell, &mut std::io::stdout().lock());
            Ok(())
        }
        Command::Man { out_dir } => match out_dir {
            Some(dir) => manual::man_pages(&dir),
            None => manual::man_page(&mut std::io::stdout().lock()),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lb: {e:#}");
            let code = if e.is::<client::Unreachable>() {
                exit::UNAVAILABLE
            } else if let Some(r) = e.downcast_ref::<cli::Refused>() {
                r.code
            } else if e.is::<lb::decap::Usage>() {
                exit::USAGE
            } else {
                exit::FAILURE
            };
            ExitCode::from(code as u8)
        }
    }
}

fn config_failure(file: &std::path::Path, errors: &config::ConfigErrors) -> ExitCode {
    eprintln!("{}: invalid configuration", file.display());
    for problem in &errors.0 {
        eprintln!("  {problem}");
    }
    ExitCode::from(exit::CONFIG as u8)
}

fn block_on(f: impl std::future::Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f)
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}
