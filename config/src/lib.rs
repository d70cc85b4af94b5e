//! The one TOML file that both `blipless-ingress` and `blipless-device` read.
//!
//! Every key has a built-in default, so an empty file (or no file at all) is a
//! working single-node setup. Values are layered, later layers winning:
//!
//! 1. built-in defaults,
//! 2. the TOML file (`--config FILE`),
//! 3. `BLIPLESS_*` environment variables,
//! 4. `--set dotted.key=value` flags, in the order given.
//!
//! The environment variable for a key is `BLIPLESS_` followed by the key in upper
//! case with dots turned into underscores: `egress.tun.name` is
//! `BLIPLESS_EGRESS_TUN_NAME`. Variables that start with `BLIPLESS_` but name no
//! key are ignored, because the binaries use a few of their own (`BLIPLESS_CONFIG`,
//! `BLIPLESS_LOG`).
//!
//! In the file, lists are arrays of strings, booleans are TOML booleans and every
//! other value is a string. In environment variables and `--set` flags every value
//! is text: lists are comma-separated (an empty value is an empty list), booleans
//! are `true` or `false`, durations are humantime (`120s`, `2m`, `1h 30m`).
//!
//! [`Config::load`] does not stop at the first mistake: it returns every problem it
//! found ([`ConfigErrors`]), each naming where the bad value came from. A binary
//! prints them and exits with [`EXIT_CONFIG_ERROR`].
//!
//! One table of key descriptors drives parsing, the environment variable
//! names and [`documented_defaults`], so the documentation cannot drift from the
//! parser.

pub mod build;
pub mod client_limits;
pub mod daemon;
mod defaults;
mod error;
pub mod files;
mod keys;
mod kinds;
mod load;
pub mod pool6;
pub mod store_url;
pub mod tls_certificate;
pub mod upstreams;
pub mod wg_quick;
pub mod wireguard_key;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

pub use defaults::documented_defaults;
pub use error::{ConfigError, ConfigErrors};

/// The exit status of a binary whose configuration is unusable (`EX_USAGE`).
pub const EXIT_CONFIG_ERROR: i32 = 64;

/// The resolved configuration of one node: every key has a value.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Who this node is and where it keeps its files.
    pub node: NodeConfig,
    /// The customer-facing and status listeners.
    pub listen: ListenConfig,
    /// The HTTPS proxy listener's certificate (ingress only).
    pub tls: TlsConfig,
    /// The state store (device plane only).
    pub store: StoreConfig,
    /// Where proxied traffic may go and how it leaves the node.
    pub egress: EgressConfig,
    /// WireGuard client settings.
    pub wireguard: WireguardConfig,
    /// How long draining may take.
    pub drain: DrainConfig,
    /// Proxy protocol timeouts.
    pub proxy: ProxyConfig,
    /// Timeouts of forwarded HTTP requests.
    pub timeouts: TimeoutsConfig,
    /// Size limits on what customers send.
    pub limits: LimitsConfig,
    /// Device-plane rolling deploy.
    pub deploy: DeployConfig,
    /// `[prewarm]`.
    pub prewarm: PrewarmConfig,
    /// Logging.
    pub log: LogConfig,
}

/// `[node]`: this node's identity and directories.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeConfig {
    /// The node's name in shared state keys (default: the hostname).
    pub host: String,
    /// The block (group of nodes) this node belongs to.
    pub block: String,
    /// Directory of the Unix sockets (device, control, handoff).
    pub runtime_dir: PathBuf,
    /// Directory of persistent state (the embedded store by default).
    pub state_dir: PathBuf,
}

/// `[listen]`: the addresses the ingress binds.
#[derive(Debug, Clone, PartialEq)]
pub struct ListenConfig {
    /// SOCKS5 (TCP).
    pub socks: SocketAddr,
    /// HTTP proxy (TCP).
    pub http: SocketAddr,
    /// WireGuard (UDP).
    pub wg: SocketAddr,
    /// `/status` and `/metrics` (TCP, HTTP).
    pub status: SocketAddr,
    /// HTTPS proxy (TCP, TLS terminated by the ingress); `None`: off.
    pub https: Option<SocketAddr>,
}

/// `[tls]`: the HTTPS proxy listener's certificate.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsConfig {
    /// PEM file with the certificate chain, leaf first.
    pub certificate: Option<PathBuf>,
    /// PEM file with the private key (PKCS#8, PKCS#1 or SEC1).
    pub key: Option<PathBuf>,
}

/// `[store]`: the state store.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreConfig {
    /// `sqlite://<path>`, `redis://...`, `redis+sentinel://...` or `redis+cluster://...`
    /// (`rediss` for TLS): the grammar is [`store_url`].
    pub url: String,
    /// How often a device plane adds its clients' usage to the store.
    pub usage_flush: Duration,
}

/// `[egress]`: destinations and source addresses.
#[derive(Debug, Clone, PartialEq)]
pub struct EgressConfig {
    /// Networks allowed despite the default deny of private, loopback and similar
    /// ranges.
    pub allow: Vec<ipnet::IpNet>,
    /// Source addresses the direct egress binds clients to (one per client, sticky).
    pub sources: Vec<IpAddr>,
    /// Packet egress for WireGuard clients.
    pub tun: TunConfig,
    /// `[[egress.upstream]]`: providers to egress through (file only).
    pub upstreams: Vec<upstreams::Upstream>,
    /// `[egress.window]`: each client's ranked set of routes.
    pub window: WindowConfig,
    /// `[egress.probe]`: upstream health checks.
    pub probe: ProbeConfig,
}

/// `[egress.window]`: a client's egress window (docs/EGRESS.md).
#[derive(Debug, Clone, PartialEq)]
pub struct WindowConfig {
    /// Routes in each client's window, best first.
    pub size: usize,
}

/// `[egress.probe]`: how upstreams are checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeConfig {
    /// Time between two probes of one upstream.
    pub interval: Duration,
    /// A probe (connect and SOCKS5 greeting) not done within this failed.
    pub timeout: Duration,
    /// Consecutive failed probes, or failed customer connections, that mark
    /// an upstream down. One success marks it up again.
    pub failures: usize,
}

/// `[egress.tun]`: the TUN device used for packet egress.
#[derive(Debug, Clone, PartialEq)]
pub struct TunConfig {
    /// The TUN interface name.
    pub name: String,
    /// The interface traffic is masqueraded out of.
    pub out_interface: String,
    /// Whether the device plane creates the TUN device, routes and nftables rules.
    pub manage: bool,
    /// Queues each device plane attaches to the multi-queue TUN device.
    pub queues: usize,
    /// Whether the first queue asks for virtio-net headers and TCP offload
    /// (TCP super-packets read and written whole; docs/WIREGUARD.md).
    pub offload: bool,
    /// The TUN device's owner (a user name or uid) that `net setup` sets;
    /// `None`: whoever runs `net setup`.
    pub user: Option<String>,
    /// The TUN device's group (a group name or gid); `None`: `user`'s primary
    /// group, or the group of whoever runs `net setup`.
    pub group: Option<String>,
}

/// `[wireguard]`: what WireGuard clients are told.
#[derive(Debug, Clone, PartialEq)]
pub struct WireguardConfig {
    /// The `host:port` client configs dial; `None` when not set.
    pub endpoint: Option<String>,
    /// The network client tunnel addresses are taken from; its first host address
    /// is the node's own (on the TUN device).
    pub pool: ipnet::IpNet,
    /// The IPv6 network clients also get an address from (the twin of their
    /// IPv4 one, [`pool6::TunnelPools`]); `None`: no IPv6 inside the tunnel.
    pub pool6: Option<ipnet::IpNet>,
    /// Whether the device plane answers clients' DNS queries to the node's
    /// tunnel address (and client configs name it in `DNS =`).
    pub dns: bool,
    /// The DNS servers that gateway resolves through; empty: the host's.
    pub dns_upstreams: Vec<std::net::SocketAddr>,
    /// Resolvers client configs name instead of the node's address.
    pub client_dns: Vec<std::net::IpAddr>,
    /// The node's WireGuard private key file; `None`: `<state_dir>/wireguard.key`.
    pub private_key_file: Option<PathBuf>,
    /// Handshake initiations per second the ingress answers before it asks for
    /// cookies (WireGuard's load defence).
    pub handshake_limit: usize,
    /// Inner packets held while no device plane is active; more are dropped.
    pub queue: usize,
    /// Tasks the ingress decrypts and encrypts WireGuard packets in; 0: one
    /// per core ([`WireguardConfig::worker_count`]).
    pub workers: usize,
    /// The name `wg show` knows the ingress's WireGuard device by.
    pub interface: String,
    /// Whether the ingress serves the read-only UAPI socket `wg show` reads.
    pub uapi: bool,
    /// Where that socket is made (`<uapi_dir>/<interface>.sock`); `wg` looks
    /// in /run/wireguard.
    pub uapi_dir: PathBuf,
}

/// `[drain]`: draining a process that is being replaced or stopped.
#[derive(Debug, Clone, PartialEq)]
pub struct DrainConfig {
    /// How long a draining process may finish what cannot be handed over.
    pub grace: Duration,
    /// How long `/status` reports draining before listeners are given up.
    pub lame_duck: Duration,
}

/// `[proxy]`: proxy protocol timeouts.
#[derive(Debug, Clone, PartialEq)]
pub struct ProxyConfig {
    /// Limit on connecting to a destination.
    pub connect_timeout: Duration,
    /// Limit on a client's SOCKS5 or HTTP handshake.
    pub handshake_timeout: Duration,
    /// A tunnel with no traffic either way for this long is closed.
    pub idle_timeout: Duration,
    /// A SOCKS5 UDP association with no datagram either way for this long
    /// is closed (its control connection too).
    pub udp_idle_timeout: Duration,
    /// The address a UDP ASSOCIATE reply names for the relay when customers
    /// reach this host at one it does not have (a 1:1 NAT); `None`: the
    /// address the customer reached.
    pub udp_public_address: Option<std::net::IpAddr>,
}

/// `[timeouts]`: forwarded HTTP requests (absolute-form, not CONNECT).
#[derive(Debug, Clone, PartialEq)]
pub struct TimeoutsConfig {
    /// Limit on the origin starting its answer (the response head), counted
    /// from the end of the request body; 504 after it.
    pub response: Duration,
    /// A request body moving less than 1 KiB, or a response body moving no
    /// byte, for this long ends the exchange (408 if nothing was answered yet).
    pub body_idle: Duration,
}

/// `[limits]`: size limits on what customers send, caps, and the node's
/// default per-client limits.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitsConfig {
    /// Largest HTTP proxy request head (request line and headers) in bytes;
    /// a larger one gets 431 and the connection is closed.
    pub header_bytes: usize,
    /// Customer connections one device plane serves at once; 0: no cap but
    /// the open-file limit. Over it, a new connection gets the protocol's
    /// refusal (SOCKS5: no acceptable method; HTTP: 503).
    pub connections: u64,
    /// Tunnels (SOCKS5 CONNECT, HTTP CONNECT) one client has open at once on
    /// a device plane; 0: no cap. Over it: SOCKS5 reply 2, HTTP 429. A
    /// client's own `max_connections` (docs/LIMITS.md) wins over it.
    pub tunnels_per_client: u64,
    /// SOCKS5 UDP associations one client has open at once on a device
    /// plane; 0: no cap. Each holds two UDP ports of the host, so without a
    /// cap one client could take every ephemeral port. Over it: SOCKS5
    /// reply 2. They count as tunnels too.
    pub udp_associations_per_client: u64,
    /// TLS handshakes the ingress runs at once on the HTTPS listener, each
    /// holding a descriptor until it completes or times out; a connection
    /// over it is closed at once.
    pub tls_handshakes: usize,
    /// Rates and quota for clients whose own record sets none
    /// (`limits.client_rate_up`, `limits.client_rate_down`,
    /// `limits.client_quota`; `max_connections` is `tunnels_per_client`).
    pub client_defaults: client_limits::ClientLimits,
}

/// `[deploy]`: device-plane rolling deploys.
#[derive(Debug, Clone, PartialEq)]
pub struct DeployConfig {
    /// How long a new device plane has to pre-warm and report Ready.
    pub ready_budget: Duration,
}

/// `[prewarm]`: what a new device plane opens before it says Ready.
#[derive(Debug, Clone, PartialEq)]
pub struct PrewarmConfig {
    /// Clients active within this window are pre-warmed.
    pub window: Duration,
    /// Devices opened at once.
    pub concurrency: usize,
    /// Limit on opening one device.
    pub device_timeout: Duration,
    /// Limit on the whole pre-warm.
    pub budget: Duration,
}

/// `[log]`: logging.
#[derive(Debug, Clone, PartialEq)]
pub struct LogConfig {
    /// Human-readable or JSON lines.
    pub format: LogFormat,
    /// A `tracing` filter, e.g. `info` or `info,blipless_ingress=debug`.
    pub level: String,
}

/// The log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines (the default).
    Human,
    /// One JSON object per line.
    Json,
}

impl Config {
    /// Path of the device-plane channel socket: `<runtime_dir>/device.sock`.
    pub fn device_socket(&self) -> PathBuf {
        self.node.runtime_dir.join("device.sock")
    }

    /// Path of the operator control socket: `<runtime_dir>/control.sock`.
    pub fn control_socket(&self) -> PathBuf {
        self.node.runtime_dir.join("control.sock")
    }

    /// Path of the ingress handoff socket: `<runtime_dir>/handoff.sock`.
    pub fn handoff_socket(&self) -> PathBuf {
        self.node.runtime_dir.join("handoff.sock")
    }

    /// The read-only WireGuard UAPI socket, `<wireguard.uapi_dir>/<wireguard.interface>.sock`,
    /// or `None` with `wireguard.uapi = false`.
    pub fn wireguard_uapi_socket(&self) -> Option<PathBuf> {
        self.wireguard.uapi.then(|| {
            self.wireguard
                .uapi_dir
                .join(format!("{}.sock", self.wireguard.interface))
        })
    }

    /// The node's WireGuard private key file: `wireguard.private_key_file`, or
    /// `<state_dir>/wireguard.key` when unset.
    pub fn wireguard_key_file(&self) -> PathBuf {
        self.wireguard
            .private_key_file
            .clone()
            .unwrap_or_else(|| self.node.state_dir.join("wireguard.key"))
    }
}

impl WireguardConfig {
    /// The crypto workers the ingress runs: `wireguard.workers`, or one per
    /// core the process may run on when that is 0.
    pub fn worker_count(&self) -> usize {
        match self.workers {
            0 => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
            count => count,
        }
    }
}
