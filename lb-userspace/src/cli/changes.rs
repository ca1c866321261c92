//! The configuration verbs: `lb service add|set|rm`, `lb backend add|set|rm` (changes written
//! into the daemon's config file through its API, then applied), `lb config show|diff`.
//! `set` changes only what its flags name: it reads the service (or backend) and the version
//! it is at, and writes it back against that version, so that a change made meanwhile by
//! someone else is never lost (the daemon refuses the write; run the command again).

use std::{net::SocketAddr, path::PathBuf};

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use serde_json::{Map, Value as Json, json};

use super::{ApiArgs, BackendAction, Refused, encode, get_json, refused};
use crate::{
    client::{self, Extra},
    config::{self, Diff},
    exit,
    model::{ChangeReply, ConfigReply},
};

#[derive(Debug, Subcommand)]
pub enum ServiceCommand {
    /// Add a service (refused if one of that name exists).
    Add(ServiceArgs),
    /// Change a service: the settings given replace those it has, the others stay (with
    /// --file, the file's service replaces it whole, then the flags apply).
    Set(ServiceArgs),
    /// Remove a service: its flows drain as a reload's do.
    Rm {
        /// The service's name.
        name: String,
        #[command(flatten)]
        write: WriteArgs,
        #[command(flatten)]
        api: ApiArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum BackendCommand {
    /// Add a backend to a service (refused if the service has it).
    Add(BackendArgs),
    /// Change a backend of a service (its weight).
    Set(BackendArgs),
    /// Remove a backend from a service: its flows drain as a reload's do.
    Rm {
        /// The service's name.
        service: String,
        /// The backend's IP:PORT.
        address: SocketAddr,
        #[command(flatten)]
        write: WriteArgs,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// No new flows to the backend; established flows continue (a runtime setting of the
    /// daemon, kept across reloads and hitless restarts, not written into the file).
    Drain(AdminArgs),
    /// Back to normal (health decides).
    Enable(AdminArgs),
    /// Out: no new flows, established flows handled as for a dead backend.
    Disable(AdminArgs),
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print the configuration running: the file as the daemon applied it (TOML, comments
    /// and all), or with --json its JSON form and version. `lb.api_token` is never shown.
    Show {
        #[command(flatten)]
        api: ApiArgs,
    },
    /// What a reload of FILE would change in the running configuration (FILE is validated
    /// first; nothing is applied).
    Diff {
        /// The config file.
        file: PathBuf,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Print the configuration's JSON Schema (docs/config.schema.json), for editors that
    /// validate TOML with one (taplo, Even Better TOML).
    Schema,
}

#[derive(Debug, Clone, Args)]
pub struct WriteArgs {
    /// Validate and show what would change; apply nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Clone, Args)]
pub struct AdminArgs {
    /// The service's name.
    pub service: String,
    /// The backend's IP:PORT as in the config.
    pub address: SocketAddr,
    #[command(flatten)]
    pub api: ApiArgs,
}

#[derive(Debug, Clone, Args)]
pub struct ServiceArgs {
    /// The service's name.
    pub name: String,
    /// The virtual IP and port.
    #[arg(long, value_name = "IP:PORT")]
    pub vip: Option<SocketAddr>,
    /// tcp or udp.
    #[arg(long, value_parser = ["tcp", "udp"])]
    pub protocol: Option<String>,
    /// nat (full NAT), ipip or gue (direct server return).
    #[arg(long, value_parser = ["nat", "ipip", "gue"])]
    pub forwarding: Option<String>,
    /// A backend, IP:PORT or IP:PORT=WEIGHT; repeat for several. Given, they are the
    /// service's backends.
    #[arg(long = "backend", value_name = "IP:PORT[=WEIGHT]", value_parser = backend_arg)]
    pub backends: Vec<(SocketAddr, Option<u32>)>,
    /// The active check's kind (tcp, tcp-connect, udp, quic, icmp, http, https, none).
    #[arg(long, value_name = "KIND")]
    pub check: Option<String>,
    /// The service as a JSON object or a TOML table (the keys of its `[[service]]` table),
    /// before the flags apply.
    #[arg(long, value_name = "FILE")]
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub write: WriteArgs,
    #[command(flatten)]
    pub api: ApiArgs,
}

#[derive(Debug, Clone, Args)]
pub struct BackendArgs {
    /// The service's name.
    pub service: String,
    /// The backend's IP:PORT.
    pub address: SocketAddr,
    /// Its share of new flows (0 drains it).
    #[arg(long)]
    pub weight: Option<u32>,
    #[command(flatten)]
    pub write: WriteArgs,
    #[command(flatten)]
    pub api: ApiArgs,
}

fn backend_arg(text: &str) -> Result<(SocketAddr, Option<u32>), String> {
    let (addr, weight) = match text.rsplit_once('=') {
        Some((a, w)) => (a, Some(w.parse::<u32>().map_err(|_| "WEIGHT: a number")?)),
        None => (text, None),
    };
    let addr = addr
        .parse()
        .map_err(|_| format!("{addr:?}: expected IPv4:PORT or [IPv6]:PORT"))?;
    Ok((addr, weight))
}

/// `lb service ...`.
pub async fn service(cmd: ServiceCommand) -> anyhow::Result<()> {
    match cmd {
        ServiceCommand::Add(args) => {
            let mut body = file_body(args.file.as_deref())?;
            apply_service_flags(&mut body, &args);
            let path = format!("/v1/services/{}", encode(&args.name));
            let create = [("if-none-match", "*".to_owned())];
            change(&args.api, "PUT", &path, &create, Some(body), &args.write).await
        }
        ServiceCommand::Set(args) => {
            let (config, version) = running(&args.api).await?;
            let mut body = match &args.file {
                Some(file) => file_body(Some(file))?,
                None => find_service(&config, &args.name)?.clone(),
            };
            if args.file.is_some() {
                find_service(&config, &args.name)?;
            }
            if let Json::Object(map) = &mut body {
                map.remove("name");
            }
            apply_service_flags(&mut body, &args);
            let path = format!("/v1/services/{}", encode(&args.name));
            let at = [("if-match", format!("\"{version}\""))];
            change(&args.api, "PUT", &path, &at, Some(body), &args.write).await
        }
        ServiceCommand::Rm { name, write, api } => {
            let path = format!("/v1/services/{}", encode(&name));
            change(&api, "DELETE", &path, &[], None, &write).await
        }
    }
}

/// `lb backend ...`.
pub async fn backend(cmd: BackendCommand) -> anyhow::Result<()> {
    let path = |service: &str, address: &SocketAddr| {
        format!(
            "/v1/services/{}/backends/{}",
            encode(service),
            encode(&address.to_string())
        )
    };
    match cmd {
        BackendCommand::Add(args) => {
            let body = match args.weight {
                Some(w) => json!({ "weight": w }),
                None => json!({}),
            };
            let create = [("if-none-match", "*".to_owned())];
            let path = path(&args.service, &args.address);
            change(&args.api, "PUT", &path, &create, Some(body), &args.write).await
        }
        BackendCommand::Set(args) => {
            let (config, version) = running(&args.api).await?;
            let service = find_service(&config, &args.service)?;
            let mut body = service
                .get("backends")
                .and_then(Json::as_array)
                .into_iter()
                .flatten()
                .find(|b| {
                    b.get("address")
                        .and_then(Json::as_str)
                        .and_then(|a| a.parse::<SocketAddr>().ok())
                        == Some(args.address)
                })
                .cloned()
                .ok_or_else(|| Refused {
                    message: format!(
                        "not found: service {:?} has no backend {}",
                        args.service, args.address
                    ),
                    code: exit::NOT_FOUND,
                })?;
            if let (Some(w), Json::Object(map)) = (args.weight, &mut body) {
                map.insert("weight".to_owned(), json!(w));
            }
            let at = [("if-match", format!("\"{version}\""))];
            let path = path(&args.service, &args.address);
            change(&args.api, "PUT", &path, &at, Some(body), &args.write).await
        }
        BackendCommand::Rm {
            service,
            address,
            write,
            api,
        } => change(&api, "DELETE", &path(&service, &address), &[], None, &write).await,
        BackendCommand::Drain(a) => {
            super::backend(a.api, BackendAction::Drain, a.service, a.address).await
        }
        BackendCommand::Enable(a) => {
            super::backend(a.api, BackendAction::Enable, a.service, a.address).await
        }
        BackendCommand::Disable(a) => {
            super::backend(a.api, BackendAction::Disable, a.service, a.address).await
        }
    }
}

/// `lb config ...`.
pub async fn config(cmd: ConfigCommand) -> anyhow::Result<()> {
    match cmd {
        ConfigCommand::Show { api } => {
            if api.json {
                let (_, body): (ConfigReply, String) = get_json(&api, "/v1/config").await?;
                println!("{body}");
                return Ok(());
            }
            print!("{}", running_text(&api).await?);
            Ok(())
        }
        ConfigCommand::Diff { file, api } => {
            let new = config::load(&file).map_err(|e| Refused {
                message: format!("{}: invalid configuration:\n  {}", file.display(), {
                    let lines: Vec<String> = e.0.iter().map(ToString::to_string).collect();
                    lines.join("\n  ")
                }),
                code: exit::CONFIG,
            })?;
            let text = running_text(&api).await?;
            let mut old = config::parse(&text)
                .map_err(|e| anyhow::anyhow!("the running configuration: {e}"))?;
            // The daemon never shows its token: only whether there is one can be compared.
            if old.lb.api_token.is_some() && new.lb.api_token.is_some() {
                old.lb.api_token.clone_from(&new.lb.api_token);
            }
            let diff = Diff::between(&old, &new);
            if api.json {
                println!("{}", serde_json::to_string_pretty(&diff)?);
            } else {
                print!("{diff}");
            }
            Ok(())
        }
        ConfigCommand::Schema => {
            print!("{}", config::reference::schema());
            Ok(())
        }
    }
}

/// The configuration running (JSON) and its version.
async fn running(api: &ApiArgs) -> anyhow::Result<(Json, String)> {
    let (reply, _): (ConfigReply, String) = get_json(api, "/v1/config").await?;
    Ok((reply.config, reply.version))
}

/// The file as the daemon applied it.
async fn running_text(api: &ApiArgs) -> anyhow::Result<String> {
    let extra = Extra {
        headers: vec![("accept", "application/toml".to_owned())],
        json: None,
    };
    let (status, body) =
        client::request_with(api.api, "GET", "/v1/config", api.token.as_deref(), &extra).await?;
    if status != 200 {
        return Err(refused(status, &body));
    }
    Ok(body)
}

fn find_service<'a>(config: &'a Json, name: &str) -> anyhow::Result<&'a Json> {
    config
        .get("service")
        .and_then(Json::as_array)
        .into_iter()
        .flatten()
        .find(|s| s.get("name").and_then(Json::as_str) == Some(name))
        .ok_or_else(|| {
            Refused {
                message: format!("not found: no service {name:?}"),
                code: exit::NOT_FOUND,
            }
            .into()
        })
}

/// A service body from `file` (JSON, or a TOML table), or an empty one.
fn file_body(file: Option<&std::path::Path>) -> anyhow::Result<Json> {
    let Some(file) = file else {
        return Ok(Json::Object(Map::new()));
    };
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let body: Json = match serde_json::from_str(&text) {
        Ok(json) => json,
        Err(_) => {
            let table: toml::Table = toml::from_str(&text).map_err(|e| Refused {
                message: format!("{}: neither JSON nor TOML: {e}", file.display()),
                code: exit::CONFIG,
            })?;
            serde_json::to_value(table)?
        }
    };
    if !body.is_object() {
        bail!("{}: expected a JSON object or a TOML table", file.display());
    }
    Ok(body)
}

fn apply_service_flags(body: &mut Json, args: &ServiceArgs) {
    let Json::Object(map) = body else { return };
    if let Some(vip) = args.vip {
        map.insert("vip".into(), json!(vip.to_string()));
    }
    if let Some(p) = &args.protocol {
        map.insert("protocol".into(), json!(p));
    }
    if let Some(f) = &args.forwarding {
        map.insert("forwarding".into(), json!(f));
    }
    if !args.backends.is_empty() {
        let list: Vec<Json> = args
            .backends
            .iter()
            .map(|(address, weight)| match weight {
                Some(w) => json!({ "address": address.to_string(), "weight": w }),
                None => json!({ "address": address.to_string() }),
            })
            .collect();
        map.insert("backends".into(), Json::Array(list));
    }
    if let Some(kind) = &args.check {
        let check = map
            .entry("check")
            .or_insert_with(|| Json::Object(Map::new()));
        if let Json::Object(check) = check {
            check.insert("kind".into(), json!(kind));
        }
    }
}

/// Sends one change and prints what it did.
async fn change(
    api: &ApiArgs,
    method: &str,
    path: &str,
    headers: &[(&'static str, String)],
    body: Option<Json>,
    write: &WriteArgs,
) -> anyhow::Result<()> {
    let path = if write.dry_run {
        format!("{path}?dry_run=true")
    } else {
        path.to_owned()
    };
    let extra = Extra {
        headers: headers.to_vec(),
        json: body.map(|b| serde_json::to_vec(&b)).transpose()?,
    };
    let (status, text) =
        client::request_with(api.api, method, &path, api.token.as_deref(), &extra).await?;
    if status != 200 {
        return Err(refused(status, &text));
    }
    if api.json {
        println!("{text}");
        return Ok(());
    }
    let reply: ChangeReply = serde_json::from_str(&text)?;
    if reply.dry_run {
        println!(
            "dry run, nothing applied (version {} would become {}):",
            reply.previous_version, reply.version
        );
    } else if reply.applied {
        println!(
            "applied: version {} (was {}), written to {}",
            reply.version, reply.previous_version, reply.written_to
        );
    } else {
        println!("no change (version {})", reply.version);
        return Ok(());
    }
    print!("{}", reply.diff);
    Ok(())
}
