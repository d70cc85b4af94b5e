//! `blipless-ctl`: the operator's tool. `status` asks the ingress over its
//! control socket; `client add|list|remove` manage clients in the store,
//! which every device plane follows within a second (`client add --wg` also
//! gives the client a WireGuard address and key pair and prints its wg-quick
//! config: see [`blipless_device::wg_clients`]); `net setup|teardown`
//! prepare the host for WireGuard packet egress.

use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use blipless_config::wireguard_key::WireguardKey;
use blipless_config::{Config, EXIT_CONFIG_ERROR};
use blipless_device::store::{self, ClientRecord, Store, StoreError};
use blipless_device::wg_clients::{self, WgQuickConfig};
use blipless_device::{credentials, net};
use blipless_protocol::control::{ControlRequest, ControlResponse, DeployInfo, StatusReport};
use clap::{Parser, Subcommand};
use serde_json::json;

/// Operate a blipless node: its status and its proxy clients.
#[derive(Debug, Parser)]
#[command(name = "blipless-ctl", version)]
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
    /// Drain the node: /status 503, listeners close after the lame-duck
    /// period, device planes finish what they hold, the ingress exits.
    Drain {
        /// Show progress every half second until the ingress is gone.
        #[arg(long)]
        watch: bool,
    },
    /// The latest device-plane deploy (start a second blipless-device to deploy).
    Deploy {
        /// Show progress every half second until the deploy is over.
        #[arg(long)]
        watch: bool,
    },
    /// Manage proxy clients (in the store; device planes follow within a second).
    Client {
        #[command(subcommand)]
        command: ClientCommand,
    },
    /// The configuration file's keys.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Host network setup for WireGuard packet egress (needs CAP_NET_ADMIN).
    Net {
        #[command(subcommand)]
        command: NetCommand,
    },
}

#[derive(Debug, Subcommand)]
enum NetCommand {
    /// Create the persistent multi-queue TUN device (egress.tun.name) with
    /// the node's pool address, turn IPv4 forwarding on, and (re)load the
    /// nftables table `inet blipless` (masquerade out of
    /// egress.tun.out_interface; invalid TCP answered with a reset).
    /// Idempotent.
    Setup,
    /// Delete the nftables table `inet blipless` and the TUN device.
    /// Idempotent; leaves IPv4 forwarding as it is.
    Teardown,
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Print a TOML file with every key, its default and what it is for
    /// (under --json: {"toml": "..."}). Reads no configuration.
    Defaults,
}

#[derive(Debug, Subcommand)]
enum ClientCommand {
    /// Create a client with a new random secret and print its proxy URLs.
    Add {
        /// The client's name, also its proxy username ([A-Za-z0-9._-], up to 64).
        name: String,
        /// Also make it a WireGuard client: give it the lowest free address of
        /// wireguard.pool and a new key pair, and print its wg-quick config (and a
        /// QR code of it on a terminal). Needs wireguard.endpoint.
        #[arg(long)]
        wg: bool,
    },
    /// List clients, their WireGuard addresses and their usage.
    List,
    /// Remove a client; its open connections close within seconds.
    Remove {
        /// The client's name.
        name: String,
    },
}

/// A configuration that cannot serve the command: exits with [`EXIT_CONFIG_ERROR`],
/// like a configuration that does not load.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct ConfigProblem(String);

/// What `client add --wg` needs from the node, checked before the store is opened.
struct WgNode {
    /// `wireguard.endpoint`.
    endpoint: String,
    /// `wireguard.pool`.
    pool: ipnet::IpNet,
    /// The node's key pair (its public half goes into client configs).
    key: WireguardKey,
}

impl WgNode {
    /// Checks the WireGuard settings and loads (or creates) the node's key, from
    /// the file the ingress uses.
    fn prepare(config: &Config) -> anyhow::Result<Self> {
        let Some(endpoint) = config.wireguard.endpoint.clone() else {
            return Err(ConfigProblem(
                "client add --wg needs wireguard.endpoint, the host:port WireGuard clients \
                 dial (for example vpn.example.com:51820): set it under [wireguard] in the \
                 config file, or with BLIPLESS_WIREGUARD_ENDPOINT or \
                 --set wireguard.endpoint=HOST:PORT"
                    .into(),
            )
            .into());
        };
        let pool = config.wireguard.pool;
        if let Err(error) = wg_clients::node_address(&pool) {
            return Err(ConfigProblem(error.to_string()).into());
        }
        let key = WireguardKey::load_or_create(&config.wireguard_key_file())
            .context("loading the node's WireGuard key (wireguard.private_key_file)")?;
        Ok(Self {
            endpoint,
            pool,
            key,
        })
    }
}

/// Prints a line; a reader that went away (`| head`) ends the program quietly.
macro_rules! say {
    ($($arg:tt)*) => {
        print_line(format_args!($($arg)*))
    };
}

fn print_line(line: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if let Err(error) = writeln!(out, "{line}") {
        if error.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("blipless-ctl: writing the output failed: {error}");
        std::process::exit(1);
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Command::Config {
        command: ConfigCommand::Defaults,
    } = &args.command
    {
        // Needs no configuration: it prints what one looks like.
        let defaults = blipless_config::documented_defaults();
        if args.json {
            say!("{}", json!({ "toml": defaults }));
        } else {
            say!("{}", defaults.trim_end());
        }
        return ExitCode::SUCCESS;
    }
    let config = match Config::load(args.config.as_deref(), std::env::vars(), &args.sets) {
        Ok(config) => config,
        Err(errors) => {
            if args.json {
                let problems: Vec<String> = errors.0.iter().map(|e| e.to_string()).collect();
                say!(
                    "{}",
                    json!({ "error": "configuration", "problems": problems })
                );
            } else {
                eprintln!("blipless-ctl: {errors}");
            }
            return ExitCode::from(EXIT_CONFIG_ERROR as u8);
        }
    };
    match run(&args, &config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) if error.is::<ConfigProblem>() => {
            if args.json {
                say!(
                    "{}",
                    json!({ "error": "configuration", "problems": [error.to_string()] })
                );
            } else {
                eprintln!("blipless-ctl: {error}");
            }
            ExitCode::from(EXIT_CONFIG_ERROR as u8)
        }
        Err(error) => {
            if args.json {
                say!("{}", json!({ "error": format!("{error:#}") }));
            } else {
                eprintln!("blipless-ctl: {error:#}");
            }
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args, config: &Config) -> anyhow::Result<()> {
    match &args.command {
        Command::Status => {
            let report = status_report(config)?;
            if args.json {
                say!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print_status(&report);
            }
            Ok(())
        }
        Command::Drain { watch } => drain(config, *watch, args.json),
        // Answered in main before any configuration is read.
        Command::Config { .. } => Ok(()),
        Command::Deploy { watch } => deploy(config, *watch, args.json),
        Command::Net { command } => net(config, command, args.json),
        Command::Client { command } => {
            // Before the store is opened: a missing setting changes nothing.
            let wg = match command {
                ClientCommand::Add { wg: true, .. } => Some(WgNode::prepare(config)?),
                _ => None,
            };
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            runtime.block_on(async {
                let store = store::open(&config.store.url).await.with_context(|| {
                    format!(
                        "opening the store {} (is store.url the same as the device plane's?)",
                        store::display_url(&config.store.url)
                    )
                })?;
                match command {
                    ClientCommand::Add { name, .. } => {
                        add(&*store, config, name, wg.as_ref(), args.json).await
                    }
                    ClientCommand::List => list(&*store, args.json).await,
                    ClientCommand::Remove { name } => remove(&*store, name, args.json).await,
                }
            })
        }
    }
}

/// `net setup` and `net teardown`.
fn net(config: &Config, command: &NetCommand, as_json: bool) -> anyhow::Result<()> {
    // Checks the configuration (IPv4 pool, interface names) before any change.
    let plan = net::Plan::from_config(config)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    match command {
        NetCommand::Setup => {
            runtime.block_on(net::setup(config))?;
            if as_json {
                say!(
                    "{}",
                    json!({
                        "net": "setup",
                        "tun": plan.tun,
                        "address": plan.address.to_string(),
                        "pool": plan.pool.to_string(),
                        "out_interface": plan.out_interface,
                        "nft_table": net::NFT_TABLE,
                    })
                );
            } else {
                say!(
                    "host set up: TUN device {} (persistent, multi-queue) has {}, IPv4 forwarding is on,",
                    plan.tun,
                    plan.address
                );
                say!(
                    "  nftables table {} masquerades {} out of {} and resets invalid TCP",
                    net::NFT_TABLE,
                    plan.pool,
                    plan.out_interface
                );
            }
        }
        NetCommand::Teardown => {
            runtime.block_on(net::teardown(config))?;
            if as_json {
                say!(
                    "{}",
                    json!({ "net": "teardown", "tun": plan.tun, "nft_table": net::NFT_TABLE })
                );
            } else {
                say!(
                    "host setup removed: no TUN device {} and no nftables table {} (IPv4 forwarding left as it was)",
                    plan.tun,
                    net::NFT_TABLE
                );
            }
        }
    }
    Ok(())
}

/// Sends one request to the ingress's control socket and reads the answer.
fn request(config: &Config, request: &ControlRequest) -> anyhow::Result<ControlResponse> {
    let path = config.control_socket();
    let stream = UnixStream::connect(&path).with_context(|| {
        format!(
            "cannot reach the ingress at {} (is blipless-ingress running, with the same node.runtime_dir?)",
            path.display()
        )
    })?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut line = serde_json::to_string(request)?;
    line.push('\n');
    (&stream).write_all(line.as_bytes())?;
    let mut answer = String::new();
    BufReader::new(&stream)
        .read_line(&mut answer)
        .context("reading the ingress's answer")?;
    serde_json::from_str(&answer)
        .context("the ingress answered something this blipless-ctl cannot read")
}

fn status_report(config: &Config) -> anyhow::Result<StatusReport> {
    match request(config, &ControlRequest::Status)? {
        ControlResponse::Status(report) => Ok(report),
        ControlResponse::Error { message } => anyhow::bail!("the ingress says: {message}"),
        ControlResponse::Ok { message } => anyhow::bail!("unexpected answer: {message}"),
    }
}

fn drain(config: &Config, watch: bool, as_json: bool) -> anyhow::Result<()> {
    match request(config, &ControlRequest::Drain)? {
        ControlResponse::Ok { message } if as_json => {
            say!("{}", json!({ "draining": true, "message": message }))
        }
        ControlResponse::Ok { message } => say!("{message}"),
        ControlResponse::Error { message } => anyhow::bail!("the ingress says: {message}"),
        ControlResponse::Status(_) => anyhow::bail!("unexpected answer to drain"),
    }
    if !watch {
        return Ok(());
    }
    // Until the control socket stops answering: the ingress has exited.
    while let Ok(report) = status_report(config) {
        let held: u64 = report
            .device_planes
            .iter()
            .map(|p| p.connections_open)
            .sum();
        if as_json {
            say!(
                "{}",
                json!({ "state": report.state, "planes": report.device_planes.len(), "connections_remaining": held })
            );
        } else {
            say!(
                "{}: {} device plane(s), {held} connection(s) remaining",
                report.state,
                report.device_planes.len()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    if as_json {
        say!("{}", json!({ "state": "stopped" }));
    } else {
        say!("ingress stopped");
    }
    Ok(())
}

fn deploy(config: &Config, watch: bool, as_json: bool) -> anyhow::Result<()> {
    loop {
        let report = status_report(config)?;
        let in_progress = report
            .last_deploy
            .as_ref()
            .is_some_and(|d| d.outcome == "in progress");
        if as_json {
            say!(
                "{}",
                json!({ "last_deploy": report.last_deploy, "device_planes": report.device_planes })
            );
        } else {
            match &report.last_deploy {
                None => say!(
                    "no deploy yet: start a second blipless-device with the same config to deploy"
                ),
                Some(deploy) => print_deploy(deploy),
            }
            for plane in &report.device_planes {
                say!(
                    "  g{} {:<9} open {:>6}  migrated {:>6}",
                    plane.generation,
                    plane.state,
                    plane.connections_open,
                    plane.migrated
                );
            }
        }
        if !watch || !in_progress {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn print_deploy(deploy: &DeployInfo) {
    let from = deploy
        .from
        .map(|g| format!("g{g}"))
        .unwrap_or_else(|| "none".into());
    let took = deploy
        .seconds
        .map(|s| format!(" in {s:.3}s"))
        .unwrap_or_default();
    say!(
        "deploy {from} -> g{}: {}{took} ({})",
        deploy.to,
        deploy.outcome,
        deploy.detail
    );
}

fn print_status(report: &StatusReport) {
    say!(
        "node: {} (ingress pid {}, up {}s, {} connections accepted)",
        report.state,
        report.ingress_pid,
        report.uptime_seconds,
        report.connections_accepted
    );
    for listener in &report.listeners {
        say!("  {:<7} {}", listener.name, listener.address);
    }
    if report.device_planes.is_empty() {
        say!("device planes: none attached (new connections wait in the listen backlog)");
        return;
    }
    say!("device planes:");
    say!(
        "  {:<4} {:<8} {:<9} {:>8} {:>6} {:>8}  version",
        "gen",
        "pid",
        "state",
        "handed",
        "open",
        "clients"
    );
    for plane in &report.device_planes {
        say!(
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

/// A new client's WireGuard side, as printed once.
struct WgClient {
    address: IpAddr,
    public_key: String,
    /// The wg-quick config, with the client's private key: never stored.
    config: String,
}

async fn add(
    store: &dyn Store,
    config: &Config,
    name: &str,
    wg: Option<&WgNode>,
    as_json: bool,
) -> anyhow::Result<()> {
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
    let wireguard = match wg {
        None => {
            store
                .add_client(record)
                .await
                .map_err(|error| add_error(name, error))?;
            None
        }
        Some(node) => Some(add_wg(store, record, node).await?),
    };
    let socks = format!(
        "socks5h://{name}:{secret}@{}",
        dial_address(config.listen.socks, config)
    );
    let http = format!(
        "http://{name}:{secret}@{}",
        dial_address(config.listen.http, config)
    );
    if as_json {
        let mut answer =
            json!({ "name": name, "secret": secret, "socks5_url": socks, "http_url": http });
        if let Some(wg) = &wireguard {
            answer["wireguard"] = json!({
                "address": wg.address,
                "public_key": wg.public_key,
                "config": wg.config,
            });
        }
        say!("{answer}");
        return Ok(());
    }
    say!("client {name} added. Its secret is shown only now; keep it.");
    say!("  SOCKS5: {socks}");
    say!("  HTTP:   {http}");
    say!("try:");
    say!("  curl --proxy '{socks}' https://example.com/");
    say!("  curl --proxy '{http}' https://example.com/");
    if let Some(wg) = &wireguard {
        say!("");
        say!(
            "WireGuard address {}. Its config holds the client's private key, shown only now:",
            wg.address
        );
        say!("save it as {name}.conf for wg-quick, or import it into a WireGuard app.");
        say!("");
        say!("{}", wg.config.trim_end());
        if std::io::stdout().is_terminal() {
            if let Some(code) = wg_clients::qr_code(&wg.config) {
                say!("");
                say!("Or scan it with the WireGuard app:");
                say!("{code}");
            }
        }
    }
    Ok(())
}

/// Adds a WireGuard client: a new key pair, the lowest free address of the pool.
async fn add_wg(
    store: &dyn Store,
    mut record: ClientRecord,
    node: &WgNode,
) -> anyhow::Result<WgClient> {
    let key = WireguardKey::generate().context("making the client's WireGuard key")?;
    let public_key = key.public_base64();
    record.wg_public_key = Some(public_key.clone());
    let name = record.name.clone();
    let address = match wg_clients::add_with_address(store, record, &node.pool).await {
        Ok(address) => address,
        Err(wg_clients::AddError::Store(error)) => return Err(add_error(&name, error)),
        Err(error) => return Err(error.into()),
    };
    let private_key = key.private_base64();
    let node_public_key = node.key.public_base64();
    let config = WgQuickConfig {
        client_private_key: &private_key,
        address,
        node_public_key: &node_public_key,
        endpoint: &node.endpoint,
    }
    .render();
    Ok(WgClient {
        address,
        public_key,
        config,
    })
}

/// What an operator reads when the store refuses a new client.
fn add_error(name: &str, error: StoreError) -> anyhow::Error {
    match error {
        StoreError::AlreadyExists(_) => anyhow::anyhow!(
            "a client named {name} exists already (remove it first, or pick another name)"
        ),
        StoreError::InvalidName(_) => {
            anyhow::anyhow!("{name:?} is not a valid client name: use 1 to 64 of A-Z a-z 0-9 . _ -")
        }
        error => error.into(),
    }
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
            .map(|(c, u)| {
                json!({
                    "name": c.name,
                    "created_at": c.created_at,
                    "wg_address": c.wg_address,
                    "wg_public_key": c.wg_public_key,
                    "usage": u,
                })
            })
            .collect();
        say!("{}", serde_json::to_string_pretty(&items)?);
        return Ok(());
    }
    if rows.is_empty() {
        say!("no clients yet: add one with `blipless-ctl client add NAME`");
        return Ok(());
    }
    say!(
        "{:<24} {:<15} {:>14} {:>14} {:>12}",
        "name",
        "wg address",
        "bytes up",
        "bytes down",
        "connections"
    );
    for (client, usage) in rows {
        let address = client
            .wg_address
            .map_or_else(|| "-".to_string(), |a| a.to_string());
        say!(
            "{:<24} {:<15} {:>14} {:>14} {:>12}",
            client.name,
            address,
            usage.bytes_up,
            usage.bytes_down,
            usage.connections
        );
    }
    Ok(())
}

async fn remove(store: &dyn Store, name: &str, as_json: bool) -> anyhow::Result<()> {
    if !store.remove_client(name).await? {
        anyhow::bail!("no client named {name} (see `blipless-ctl client list`)");
    }
    if as_json {
        say!("{}", json!({ "removed": name }));
    } else {
        say!("client {name} removed; its open connections close within seconds");
    }
    Ok(())
}
