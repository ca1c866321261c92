//! The command line. Client subcommands talk to the daemon's control API.

use std::{net::SocketAddr, path::PathBuf};

use anyhow::bail;
use clap::{Parser, Subcommand};
use lb_common::counter;

use crate::{api::StatsReply, client, config};

#[derive(Debug, Parser)]
#[command(name = "lb", version, about = "XDP L4 load balancer")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the balancer: attach the XDP program and serve the control API until SIGINT/SIGTERM.
    Run {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Validate a config file; prints every problem with its path and exits 64 if there are any.
    CheckConfig { file: PathBuf },
    /// Datapath counters of the running daemon.
    Stats {
        /// Control API address of the daemon.
        #[arg(long, default_value = config::DEFAULT_API)]
        api: SocketAddr,
        /// Print the JSON reply instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// `lb stats`.
pub async fn stats(api: SocketAddr, json: bool) -> anyhow::Result<()> {
    let (status, body) = client::get(api, "/v1/stats").await?;
    if status != 200 {
        bail!("control API answered {status}: {body}");
    }
    if json {
        println!("{body}");
        return Ok(());
    }
    let reply: StatsReply = serde_json::from_str(&body)?;
    println!("{:<20} {:>14}", "counter", "packets");
    for c in &reply.counters {
        let informational = counter::NAMES[counter::VERDICTS as usize..].contains(&c.name.as_str());
        let note = if informational {
            "  (informational)"
        } else {
            ""
        };
        println!("{:<20} {:>14}{note}", c.name, c.value);
    }
    println!();
    println!(
        "{:<24} {:<22} {:<5} {:>10} {:>12} {:>14}",
        "service / backend", "address", "proto", "new flows", "packets", "bytes"
    );
    for s in &reply.services {
        println!(
            "{:<24} {:<22} {:<5} {:>10} {:>12} {:>14}",
            s.name, s.vip, s.protocol, s.new_flows, s.packets, s.bytes
        );
        if let (Some(fail), Some(ok)) = (s.failure_window_s, s.success_window_s) {
            println!(
                "  {} check: failure window {fail}s, success window at most {ok}s",
                s.check
            );
        }
        for b in &s.backends {
            println!(
                "  {:<22} {:<22} {:<5} {:>10} {:>12} {:>14}",
                format!("{} w{}", b.state, b.weight),
                b.address,
                "",
                b.new_flows,
                b.packets,
                b.bytes
            );
        }
    }
    Ok(())
}
