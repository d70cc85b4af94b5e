//! `blipless-ctl`: the operator's tool. `status` asks the ingress over its
//! control socket; `client add|list|remove` manage clients in the store,
//! which every device plane follows within a second.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use blipless_config::{Config, EXIT_CONFIG_ERROR};
use blipless_device::credentials;
use blipless_device::store::{self, ClientRecord, Store, StoreError};
use blipless_protocol::control::{ControlRequest, ControlResponse, StatusReport};
use clap::{Parser, Subcommand};
use serde_json::json;

/// Operate a blipless node: its status and its proxy clients.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// The TOML configuration file the node's daemons use.
    #[arg(long, short, env = "BLIPLESS_CONFIG", global = true)]
    config: Option<PathBuf>,
    /// Override one key, for example `--set node.runtime_dir=/tmp/blip` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE", global = true)]
    sets: Vec<String>,
    /// Print JSON for machines instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The node's readiness, listeners and device planes (asks the ingress).
    Status,
    /// Manage proxy clients (in the store; device planes follow within a second).
    Client {
        #[command(subcommand)]
        command: ClientCommand,
    },
}

#[derive(Debug, Subcommand)]
enum ClientCommand {
    /// Create a client with a new random secret and print its proxy URLs.
    Add {
        /// The client's name, also its proxy username ([A-Za-z0-9._-], up to 64).
        name: String,
    },
    /// List clients and their usage.
    List,
    /// Remove a client; its open connections close within seconds.
    Remove {
        /// The client's name.
        name: String,
    },
}

fn main() -> ExitCode {
    let args = Args::parse();
    let config = match Config::load(args.config.as_deref(), std::env::vars(), &args.sets) {
        Ok(config) => config,
        Err(errors) => {
            eprintln!("blipless-ctl: {errors}");
            return ExitCode::from(EXIT_CONFIG_ERROR as u8);
        }
    };
    match run(&args, &config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            if args.json {
                println!("{}", json!({ "error": format!("{error:#}") }));
            } else {
                eprintln!("blipless-ctl: {error:#}");
            }
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args, config: &Config) -> anyhow::Result<()> {
    match &args.command {
        Command::Status => status(config, args.json),
        Command::Client { command } => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            runtime.block_on(async {
                let store = store::open(&config.store.url).await.with_context(|| {
                    format!(
                        "opening the store {} (is store.url the same as the device plane's?)",
                        config.store.url
                    )
                })?;
                match command {
                    ClientCommand::Add { name } => add(&*store, config, name, args.json).await,
                    ClientCommand::List => list(&*store, args.json).await,
                    ClientCommand::Remove { name } => remove(&*store, name, args.json).await,
                }
            })
        }
    }
}

fn status(config: &Config, as_json: bool) -> anyhow::Result<()> {
    let path = config.control_socket();
    let stream = UnixStream::connect(&path).with_context(|| {
        format!(
            "cannot reach the ingress at {} (is blipless-ingress running, with the same node.runtime_dir?)",
            path.display()
        )
    })?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut request = serde_json::to_string(&ControlRequest::Status)?;
    request.push('\n');
    (&stream).write_all(request.as_bytes())?;
    let mut line = String::new();
    BufReader::new(&stream)
        .read_line(&mut line)
        .context("reading the ingress's answer")?;
    let response: ControlResponse = serde_json::from_str(&line)
        .context("the ingress answered something that is not a status")?;
    let report = match response {
        ControlResponse::Status(report) => report,
        ControlResponse::Error { message } => anyhow::bail!("the ingress says: {message}"),
    };
    if as_json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_status(&report);
    }
    Ok(())
}

fn print_status(report: &StatusReport) {
    println!(
        "node: {} (ingress pid {}, up {}s, {} connections accepted)",
        report.state, report.ingress_pid, report.uptime_seconds, report.connections_accepted
    );
    for listener in &report.listeners {
        println!("  {:<7} {}", listener.name, listener.address);
    }
    if report.device_planes.is_empty() {
        println!("device planes: none attached (new connections wait in the listen backlog)");
        return;
    }
    println!("device planes:");
    println!(
        "  {:<4} {:<8} {:<9} {:>8} {:>6} {:>8}  version",
        "gen", "pid", "state", "handed", "open", "clients"
    );
    for plane in &report.device_planes {
        println!(
            "  {:<4} {:<8} {:<9} {:>8} {:>6} {:>8}  {}",
            plane.generation,
            plane.pid,
            plane.state,
            plane.connections_handed,
            plane.connections_open,
            plane.clients,
            plane.software
        );
    }
}

/// Where customers dial a listener: a wildcard listen address is shown as the node's host.
fn dial_address(listen: SocketAddr, config: &Config) -> String {
    if listen.ip().is_unspecified() {
        format!("{}:{}", config.node.host, listen.port())
    } else {
        listen.to_string()
    }
}

async fn add(store: &dyn Store, config: &Config, name: &str, as_json: bool) -> anyhow::Result<()> {
    let secret =
        credentials::try_new_secret().context("the system random number generator failed")?;
    let record = ClientRecord {
        name: name.to_string(),
        secret_hash: credentials::hash_secret(&secret),
        created_at: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0),
        wg_public_key: None,
        wg_address: None,
    };
    match store.add_client(record).await {
        Ok(()) => {}
        Err(StoreError::AlreadyExists(_)) => {
            anyhow::bail!(
                "a client named {name} exists already (remove it first, or pick another name)"
            )
        }
        Err(StoreError::InvalidName(_)) => {
            anyhow::bail!("{name:?} is not a valid client name: use 1 to 64 of A-Z a-z 0-9 . _ -")
        }
        Err(error) => return Err(error.into()),
    }
    let socks = format!(
        "socks5h://{name}:{secret}@{}",
        dial_address(config.listen.socks, config)
    );
    let http = format!(
        "http://{name}:{secret}@{}",
        dial_address(config.listen.http, config)
    );
    if as_json {
        println!(
            "{}",
            json!({ "name": name, "secret": secret, "socks5_url": socks, "http_url": http })
        );
    } else {
        println!("client {name} added. Its secret is shown only now; keep it.");
        println!("  SOCKS5: {socks}");
        println!("  HTTP:   {http}");
        println!("try:");
        println!("  curl --proxy '{socks}' https://example.com/");
        println!("  curl --proxy '{http}' https://example.com/");
    }
    Ok(())
}

async fn list(store: &dyn Store, as_json: bool) -> anyhow::Result<()> {
    let clients = store.list_clients().await?;
    let mut rows = Vec::new();
    for client in clients {
        let usage = store.usage(&client.name).await.unwrap_or_default();
        rows.push((client, usage));
    }
    if as_json {
        let items: Vec<_> = rows
            .iter()
            .map(|(c, u)| json!({ "name": c.name, "created_at": c.created_at, "usage": u }))
            .collect();
        println!("{}", serde_json::to_string_pretty(&items)?);
        return Ok(());
    }
    if rows.is_empty() {
        println!("no clients yet: add one with `blipless-ctl client add NAME`");
        return Ok(());
    }
    println!(
        "{:<24} {:>14} {:>14} {:>12}",
        "name", "bytes up", "bytes down", "connections"
    );
    for (client, usage) in rows {
        println!(
            "{:<24} {:>14} {:>14} {:>12}",
            client.name, usage.bytes_up, usage.bytes_down, usage.connections
        );
    }
    Ok(())
}

async fn remove(store: &dyn Store, name: &str, as_json: bool) -> anyhow::Result<()> {
    if !store.remove_client(name).await? {
        anyhow::bail!("no client named {name} (see `blipless-ctl client list`)");
    }
    if as_json {
        println!("{}", json!({ "removed": name }));
    } else {
        println!("client {name} removed; its open connections close within seconds");
    }
    Ok(())
}
