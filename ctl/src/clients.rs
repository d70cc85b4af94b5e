//! `blipless-ctl client add|show|list|remove`: proxy clients in the store, the
//! proxy URLs and (with `--wg`) the wg-quick config a new client gets; their
//! limits are in [`crate::limits`].

use std::io::IsTerminal;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use anyhow::Context;
use blipless_config::wireguard_key::WireguardKey;
use blipless_config::Config;
use blipless_ctl::wg_clients::{self, WgQuickConfig};
use blipless_store::{credentials, ClientRecord, EgressPolicy, Store, StoreError};
use serde_json::json;

use crate::control::{sync_clients, Confirmation};
use crate::{ConfigProblem, Unconfirmed};

/// What `client add --wg` needs from the node, checked before the store is opened.
pub(crate) struct WgNode {
    /// `wireguard.endpoint`.
    endpoint: String,
    /// `wireguard.pool`.
    pool: ipnet::IpNet,
    /// The node's key pair (its public half goes into client configs).
    key: WireguardKey,
    /// What client configs name in `DNS =`.
    dns: Vec<std::net::IpAddr>,
    /// `wireguard.pool` and `wireguard.pool6`, when IPv6 is on in the tunnel.
    pools6: Option<blipless_config::pool6::TunnelPools>,
}

impl WgNode {
    /// The IPv6 twin of a client's tunnel address, when the node has a pool6.
    fn address6(&self, address: std::net::IpAddr) -> Option<std::net::IpAddr> {
        let std::net::IpAddr::V4(v4) = address else {
            return None;
        };
        Some(self.pools6?.v6_of(v4)?.into())
    }
}

impl WgNode {
    /// Checks the WireGuard settings `client add --wg` needs, changing
    /// nothing (the node's key is not created).
    pub(crate) fn check(config: &Config) -> anyhow::Result<()> {
        if config.wireguard.endpoint.is_none() {
            return Err(no_endpoint());
        }
        if let Err(error) = wg_clients::node_address(&config.wireguard.pool) {
            return Err(ConfigProblem(error.to_string()).into());
        }
        Ok(())
    }

    /// Checks the WireGuard settings and loads (or creates) the node's key, from
    /// the file the ingress uses: checked first, so that an add refused for
    /// its settings creates no key (run as root, one the ingress's user
    /// could not read) and says what is wrong with them, not with the key's
    /// path.
    pub(crate) fn prepare(config: &Config) -> anyhow::Result<Self> {
        Self::check(config)?;
        let key = WireguardKey::load_or_create(&config.wireguard_key_file())
            .context("loading the node's WireGuard key (wireguard.private_key_file)")?;
        Self::with_key(config, key)
    }

    /// As [`Self::prepare`] for a command that only reads (`client show`):
    /// the key is not created (run as root, it would leave a key the
    /// ingress's user cannot read). Why there is none, when there is not.
    pub(crate) fn existing(config: &Config) -> anyhow::Result<Result<Self, String>> {
        if config.wireguard.endpoint.is_none() {
            return Ok(Err(
                "this node has no wireguard.endpoint, which the config names".into(),
            ));
        }
        let path = config.wireguard_key_file();
        let loaded = WireguardKey::load(&path)
            .context("loading the node's WireGuard key (wireguard.private_key_file)")?;
        let Some(key) = loaded else {
            return Ok(Err(format!(
                "this node has no WireGuard key yet ({} is made by the ingress at start, or by client add --wg)",
                path.display()
            )));
        };
        Self::with_key(config, key).map(Ok)
    }

    fn with_key(config: &Config, key: WireguardKey) -> anyhow::Result<Self> {
        let Some(endpoint) = config.wireguard.endpoint.clone() else {
            return Err(no_endpoint());
        };
        let pool = config.wireguard.pool;
        let node_address = match wg_clients::node_address(&pool) {
            Ok(address) => address,
            Err(error) => return Err(ConfigProblem(error.to_string()).into()),
        };
        let mut dns = wg_clients::client_dns(&config.wireguard, node_address);
        let pools6 = config
            .wireguard
            .pool6
            .and_then(|pool6| blipless_config::pool6::TunnelPools::new(pool, pool6));
        // The gateway answers at the node's IPv6 twin too.
        if dns == [node_address] {
            if let (Some(pools), std::net::IpAddr::V4(v4)) = (pools6, node_address) {
                dns.extend(pools.v6_of(v4).map(std::net::IpAddr::V6));
            }
        }
        Ok(Self {
            endpoint,
            pool,
            key,
            dns,
            pools6,
        })
    }
}

/// `client add --wg` on a node without `wireguard.endpoint`.
fn no_endpoint() -> anyhow::Error {
    ConfigProblem(
        "client add --wg needs wireguard.endpoint, the host:port WireGuard clients \
         dial (for example vpn.example.com:51820): set it under [wireguard] in the \
         config file, or with BLIPLESS_WIREGUARD_ENDPOINT or \
         --set wireguard.endpoint=HOST:PORT"
            .into(),
    )
    .into()
}

/// A client's proxy URLs, with its secret (or a placeholder) in them.
struct ProxyUrls {
    socks: String,
    http: String,
    /// When `listen.https` is on.
    https: Option<String>,
}

impl ProxyUrls {
    fn new(config: &Config, name: &str, secret: &str) -> Self {
        Self {
            socks: format!(
                "socks5h://{name}:{secret}@{}",
                dial_address(config.listen.socks, config)
            ),
            http: format!(
                "http://{name}:{secret}@{}",
                dial_address(config.listen.http, config)
            ),
            https: config
                .listen
                .https
                .map(|https| format!("https://{name}:{secret}@{}", dial_address(https, config))),
        }
    }

    /// Adds them to a JSON answer (`https_url` only when there is one).
    fn add_to(&self, answer: &mut serde_json::Value) {
        answer["socks5_url"] = json!(self.socks);
        answer["http_url"] = json!(self.http);
        if let Some(https) = &self.https {
            answer["https_url"] = json!(https);
        }
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

/// The `--egress` policy, checked against the upstreams in the config: an
/// unknown upstream or tag is a configuration problem (exit 64), since it
/// would leave the client with no route.
pub(crate) fn egress_policy(config: &Config, text: &str) -> anyhow::Result<EgressPolicy> {
    let policy: EgressPolicy = text.parse().map_err(|error: blipless_store::PolicyError| {
        ConfigProblem(format!("--egress: {error}"))
    })?;
    let upstreams = &config.egress.upstreams;
    match &policy {
        EgressPolicy::Upstream(name) if !upstreams.iter().any(|u| &u.name == name) => {
            let known: Vec<&str> = upstreams.iter().map(|u| u.name.as_str()).collect();
            Err(ConfigProblem(format!(
                "--egress {text}: no upstream {name:?} in the config (upstreams: {})",
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            ))
            .into())
        }
        EgressPolicy::Tags(tags) => {
            let unknown: Vec<&String> = tags
                .iter()
                .filter(|tag| !upstreams.iter().any(|u| u.tags.contains(tag)))
                .collect();
            if unknown.is_empty() {
                Ok(policy)
            } else {
                Err(ConfigProblem(format!(
                    "--egress {text}: no upstream in the config has the tag(s) {unknown:?}"
                ))
                .into())
            }
        }
        _ => Ok(policy),
    }
}

/// What `client add` stores besides the secret and the WireGuard side.
pub(crate) struct NewClient<'a> {
    /// Its name.
    pub name: &'a str,
    /// `--egress`.
    pub egress: EgressPolicy,
    /// `--rate-up`, `--rate-down`, `--quota`, `--max-connections`.
    pub limits: blipless_store::ClientLimits,
}

pub(crate) async fn add(
    store: &dyn Store,
    config: &Config,
    new: NewClient<'_>,
    wg: Option<&WgNode>,
    qr_png: Option<&Path>,
    as_json: bool,
) -> anyhow::Result<()> {
    let secret =
        credentials::try_new_secret().context("the system random number generator failed")?;
    let record = ClientRecord {
        name: new.name.to_string(),
        secret_hash: credentials::hash_secret(&secret),
        created_at: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0),
        wg_public_key: None,
        wg_address: None,
        egress: new.egress,
        limits: new.limits,
    };
    let name = new.name;
    let record_limits = record.limits;
    // An add no replica confirmed is stored: said below, with exit status 75.
    let (wireguard, unreplicated) = match wg {
        None => match blipless_ctl::patience::add_client(store, &record).await {
            Ok(()) => (None, None),
            Err(StoreError::Unconfirmed(detail)) => (None, Some(detail)),
            Err(error) => return Err(add_error(name, error)),
        },
        Some(node) => {
            let (client, unreplicated) = add_wg(store, record, node).await?;
            (Some(client), unreplicated)
        }
    };
    let confirmation = unreplicated_is_unconfirmed(
        confirm(store, config).await,
        unreplicated,
        &format!("client {name} is stored"),
    );
    let urls = ProxyUrls::new(config, name, &secret);
    // Written before anything is printed, reported after: a file that could
    // not be written must not cost the operator the secret printed below.
    let png = match (&wireguard, qr_png) {
        (Some(wg), Some(path)) => Some(
            wg_clients::write_qr_png(&wg.config, path)
                .with_context(|| format!("--qr-png {}", path.display())),
        ),
        _ => None,
    };
    let png_written = matches!(png, Some(Ok(())));
    if as_json {
        let mut answer = json!({ "name": name, "secret": secret });
        urls.add_to(&mut answer);
        if let (true, Some(path)) = (png_written, qr_png) {
            answer["qr_png"] = json!(path.display().to_string());
        }
        if let Some(wg) = &wireguard {
            answer["wireguard"] = json!({
                "address": wg.address,
                "public_key": wg.public_key,
                "config": wg.config,
            });
        }
        if !record_limits.is_empty() {
            answer["limits"] = crate::limits::limits_json(
                &record_limits,
                &crate::limits::node_defaults(config),
                None,
            );
        }
        answer["node"] = confirmation_json(&confirmation);
        // One answer: a PNG that could not be written is in it, not in a
        // second object after it.
        if let Some(Err(error)) = &png {
            answer["qr_png_error"] = json!(format!("{error:#}"));
        }
        say!("{answer}");
        if let Some(Err(error)) = png {
            return Err(crate::Answered(format!("{error:#}")).into());
        }
        return confirmation.map(|_| ());
    }
    say!("client {name} added. Its secret is shown only now; keep it.");
    if !record_limits.is_empty() {
        say!(
            "  limits: {}",
            crate::limits::limits_text(
                &record_limits.or(&crate::limits::node_defaults(config)),
                None
            )
        );
    }
    say!("  SOCKS5: {}", urls.socks);
    say!("  HTTP:   {}", urls.http);
    if let Some(https) = &urls.https {
        say!("  HTTPS:  {https}");
    }
    say!("try:");
    say!("  curl --proxy '{}' https://example.com/", urls.socks);
    say!("  curl --proxy '{}' https://example.com/", urls.http);
    if let Some(https) = &urls.https {
        say!("  curl --proxy '{https}' https://example.com/  (add --proxy-cacert FILE for a private CA)");
    }
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
    if let (true, Some(path)) = (png_written, qr_png) {
        say!("QR code of the config written to {}", path.display());
    }
    if let Ok(confirmation) = &confirmation {
        say!("{}", confirmation_text(confirmation, "can use it now"));
    }
    png.transpose()?;
    confirmation.map(|_| ())
}

/// `client show NAME`: what the store keeps of a client, and for a WireGuard
/// client its config again without the private key, which blipless never
/// stores (docs/DECISIONS.md, "Client private keys"): so no QR code either.
pub(crate) async fn show(
    store: &dyn Store,
    config: &Config,
    name: &str,
    qr_png: Option<&Path>,
    as_json: bool,
) -> anyhow::Result<()> {
    let Some(client) = store.get_client(name).await? else {
        anyhow::bail!("no client named {name} (see `blipless-ctl client list`)");
    };
    let why = "no QR code: a config a WireGuard app can import holds the client's private key, \
               and blipless keeps none (the config `client add --wg` printed is the only copy). \
               For a new config, remove the client and add it again with --wg";
    if qr_png.is_some() {
        anyhow::bail!("{why}");
    }
    // A store that fails here fails the command: zeros would pass for a
    // client that used nothing, to whoever bills from this.
    let usage = store
        .usage(name)
        .await
        .with_context(|| format!("reading the usage of client {name}"))?;
    let defaults = crate::limits::node_defaults(config);
    let effective = client.limits.or(&defaults);
    let quota = crate::limits::quota_use(store, name, effective.quota).await;
    // The config, or why this node cannot write it.
    let (wireguard, no_config) = match client.wg_address {
        Some(address) => match WgNode::existing(config)? {
            Ok(node) => {
                let public = node.key.public_base64();
                let config = WgQuickConfig {
                    client_private_key: "",
                    address,
                    address6: node.address6(address),
                    node_public_key: &public,
                    endpoint: &node.endpoint,
                    dns: &node.dns,
                };
                (Some(config.render_without_private_key()), None)
            }
            Err(why) => (None, Some(why)),
        },
        None => (None, None),
    };
    let urls = ProxyUrls::new(config, name, "<secret>");
    if as_json {
        let mut answer = json!({
            "name": client.name,
            "created_at": client.created_at,
            "egress": client.egress.to_string(),
            "secret_kept": false,
            "wg_address": client.wg_address,
            "wg_public_key": client.wg_public_key,
            "wireguard_config_without_private_key": wireguard,
            "wireguard_config_unavailable": no_config,
            "private_key_kept": false,
            "usage": usage,
            "limits": crate::limits::limits_json(&client.limits, &defaults, quota),
        });
        urls.add_to(&mut answer);
        say!("{}", serde_json::to_string_pretty(&answer)?);
    } else {
        say!("client {name}");
        say!("  created:   {}", created_text(client.created_at));
        say!("  egress:    {}", client.egress);
        say!(
            "  usage:     {} bytes up, {} bytes down, {} connections",
            usage.bytes_up,
            usage.bytes_down,
            usage.connections
        );
        say!(
            "  limits:    {}",
            crate::limits::limits_text(&effective, quota)
        );
        say!("  SOCKS5:    {}", urls.socks);
        say!("  HTTP:      {}", urls.http);
        if let Some(https) = &urls.https {
            say!("  HTTPS:     {https}");
        }
        say!("  The secret was shown once, by client add; the store keeps only its hash.");
        if let (Some(address), Some(text)) = (client.wg_address, &wireguard) {
            say!("");
            say!(
                "WireGuard address {address}, public key {}.",
                client.wg_public_key.as_deref().unwrap_or("(none)")
            );
            say!("Its config, without the private key, which blipless does not keep:");
            say!("");
            say!("{}", text.trim_end());
        }
        if let (Some(address), Some(why)) = (client.wg_address, &no_config) {
            say!("");
            say!(
                "WireGuard address {address}, public key {}; no config shown: {why}.",
                client.wg_public_key.as_deref().unwrap_or("(none)")
            );
        }
    }
    if wireguard.is_some() && !as_json {
        say!("");
        say!("{why}.");
    }
    Ok(())
}

/// A unix time as an RFC 3339 date (UTC), or the number when out of range
/// (before 1970, or past 9999, which RFC 3339 cannot write: humantime's
/// `Display` then fails, and `to_string` would panic on it).
fn created_text(unix_seconds: i64) -> String {
    use std::fmt::Write;
    let Some(time) = u64::try_from(unix_seconds)
        .ok()
        .and_then(|s| std::time::UNIX_EPOCH.checked_add(std::time::Duration::from_secs(s)))
    else {
        return unix_seconds.to_string();
    };
    let mut text = String::new();
    match write!(text, "{}", humantime::format_rfc3339_seconds(time)) {
        Ok(()) => text,
        Err(_) => unix_seconds.to_string(),
    }
}

/// Reads the feed position after this command's write and has the node's
/// device planes apply it. The error is [`Unconfirmed`].
pub(crate) async fn confirm(store: &dyn Store, config: &Config) -> anyhow::Result<Confirmation> {
    let through = store.feed_head().await.map_err(|error| {
        Unconfirmed(format!(
            "the change is stored, but reading the change feed failed: {error}"
        ))
    })?;
    let config = config.clone();
    let answer = tokio::task::spawn_blocking(move || sync_clients(&config, through))
        .await
        .map_err(|error| {
            Unconfirmed(format!(
                "the change is stored, but asking the node failed: {error}"
            ))
        })?;
    answer.map_err(|error| {
        Unconfirmed(format!(
            "the change is stored, but the node did not confirm it: {error:#}"
        ))
        .into()
    })
}

pub(crate) fn confirmation_json(confirmation: &anyhow::Result<Confirmation>) -> serde_json::Value {
    match confirmation {
        Ok(Confirmation::Applied(planes)) => json!({ "confirmed": true, "device_planes": planes }),
        Ok(Confirmation::NoNode) => json!({ "confirmed": false, "running": false }),
        Err(error) => json!({ "confirmed": false, "running": true, "error": error.to_string() }),
    }
}

pub(crate) fn confirmation_text(confirmation: &Confirmation, effect: &str) -> String {
    match confirmation {
        Confirmation::Applied(planes) => {
            format!("applied on this node ({planes} device plane(s)): it {effect}.")
        }
        Confirmation::NoNode => {
            "no node is running on this host: its device planes load the change when they start."
                .to_string()
        }
    }
}

/// Adds a WireGuard client: a new key pair, the lowest free address of the pool.
/// A change the node confirmed but no Redis replica did is [`Unconfirmed`] too
/// (exit 75): it stands unless the master fails before replicating it.
pub(crate) fn unreplicated_is_unconfirmed(
    confirmation: anyhow::Result<Confirmation>,
    unreplicated: Option<String>,
    done: &str,
) -> anyhow::Result<Confirmation> {
    match (confirmation, unreplicated) {
        (Ok(_), Some(detail)) => Err(Unconfirmed(format!("{done}, but {detail}")).into()),
        (confirmation, _) => confirmation,
    }
}

/// Adds a WireGuard client: its record with a key and an address, and the
/// config to hand out; with the store's word if no replica confirmed the add.
async fn add_wg(
    store: &dyn Store,
    mut record: ClientRecord,
    node: &WgNode,
) -> anyhow::Result<(WgClient, Option<String>)> {
    let key = WireguardKey::generate().context("making the client's WireGuard key")?;
    let public_key = key.public_base64();
    record.wg_public_key = Some(public_key.clone());
    let name = record.name.clone();
    let (address, unreplicated) =
        match wg_clients::add_with_address(store, record, &node.pool).await {
            Ok(added) => added,
            Err(wg_clients::AddError::Store(error)) => return Err(add_error(&name, error)),
            Err(error) => return Err(error.into()),
        };
    let private_key = key.private_base64();
    let node_public_key = node.key.public_base64();
    let config = WgQuickConfig {
        client_private_key: &private_key,
        address,
        address6: node.address6(address),
        node_public_key: &node_public_key,
        endpoint: &node.endpoint,
        dns: &node.dns,
    }
    .render();
    Ok((
        WgClient {
            address,
            public_key,
            config,
        },
        unreplicated,
    ))
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

pub(crate) async fn list(store: &dyn Store, config: &Config, as_json: bool) -> anyhow::Result<()> {
    let clients = store.list_clients().await?;
    let defaults = crate::limits::node_defaults(config);
    let mut rows = Vec::new();
    for client in clients {
        // A client removed since the list was read (its usage gone with it)
        // must not fail the whole list: it is listed as read, with none.
        let usage = match store.usage(&client.name).await {
            Ok(usage) => usage,
            Err(StoreError::NotFound(_)) => blipless_store::Usage::default(),
            Err(error) => {
                return Err(anyhow::Error::from(error)
                    .context(format!("reading the usage of client {}", client.name)))
            }
        };
        let quota =
            crate::limits::quota_use(store, &client.name, client.limits.or(&defaults).quota).await;
        rows.push((client, usage, quota));
    }
    if as_json {
        let items: Vec<_> = rows
            .iter()
            .map(|(c, u, quota)| {
                json!({
                    "name": c.name,
                    "created_at": c.created_at,
                    "wg_address": c.wg_address,
                    "wg_public_key": c.wg_public_key,
                    "egress": c.egress.to_string(),
                    "usage": u,
                    "limits": crate::limits::limits_json(&c.limits, &defaults, *quota),
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
        "{:<24} {:<15} {:>14} {:>14} {:>12}  {:<12} limits",
        "name",
        "wg address",
        "bytes up",
        "bytes down",
        "connections",
        "egress"
    );
    for (client, usage, quota) in rows {
        let address = client
            .wg_address
            .map_or_else(|| "-".to_string(), |a| a.to_string());
        say!(
            "{:<24} {:<15} {:>14} {:>14} {:>12}  {:<12} {}",
            client.name,
            address,
            usage.bytes_up,
            usage.bytes_down,
            usage.connections,
            client.egress.to_string(),
            crate::limits::limits_text(&client.limits.or(&defaults), quota)
        );
    }
    Ok(())
}

pub(crate) async fn remove(
    store: &dyn Store,
    config: &Config,
    name: &str,
    as_json: bool,
) -> anyhow::Result<()> {
    use blipless_ctl::patience::Removal;
    let unreplicated = match blipless_ctl::patience::remove_client(store, name).await {
        Ok(Removal::Removed) => None,
        Ok(Removal::Absent) => {
            anyhow::bail!("no client named {name} (see `blipless-ctl client list`)")
        }
        // A try made while the store failed over may have removed it: the
        // operator's aim stands, so this is not an error (docs/OPERATIONS.md).
        Ok(Removal::AbsentAfterRetry) => {
            eprintln!(
                "blipless-ctl: no client named {name} is stored now; the try made while \
                 the store was unavailable may have removed it"
            );
            None
        }
        // Removed on the master: said with exit status 75.
        Err(StoreError::Unconfirmed(detail)) => Some(detail),
        Err(error) => return Err(error.into()),
    };
    let confirmation = unreplicated_is_unconfirmed(
        confirm(store, config).await,
        unreplicated,
        &format!("client {name} is removed"),
    );
    if as_json {
        say!(
            "{}",
            json!({ "removed": name, "node": confirmation_json(&confirmation) })
        );
    } else if let Ok(confirmation) = &confirmation {
        say!(
            "client {name} removed; {}",
            confirmation_text(
                confirmation,
                "is refused and its open connections are closed"
            )
        );
    } else {
        say!("client {name} removed from the store");
    }
    confirmation.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::created_text;

    #[test]
    fn a_creation_time_rfc_3339_cannot_write_is_shown_as_its_number() {
        assert_eq!(created_text(0), "1970-01-01T00:00:00Z");
        assert_eq!(created_text(253_402_300_799), "9999-12-31T23:59:59Z");
        // Year 10000, from a store someone else wrote: no panic.
        assert_eq!(created_text(253_402_300_800), "253402300800");
        assert_eq!(created_text(-1), "-1");
    }
}
