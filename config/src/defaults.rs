//! Defaults that are not plain text in the key table, and
//! [`documented_defaults`], the key table rendered as a commented TOML file.

use std::path::{Path, PathBuf};

use crate::keys::{find, DefaultValue, KEYS};
use crate::kinds::Shape;
use crate::{Config, LogFormat};

/// The machine's hostname made into a valid node name: characters outside
/// `A-Za-z0-9.-` become `-`, at most 63 characters, `localhost` when unknown.
pub(crate) fn hostname() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let name: String = raw
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-') {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    if name.is_empty() {
        "localhost".to_owned()
    } else {
        name
    }
}

/// The derived store URL for a state directory.
pub(crate) fn store_in(state_dir: &Path) -> String {
    format!("sqlite://{}", state_dir.join("state.db").display())
}

/// A placeholder that the key defaults are applied over when loading starts;
/// every field has a key, so none of these values survives.
pub(crate) fn placeholder() -> Config {
    use std::net::{Ipv4Addr, SocketAddr};
    use std::time::Duration;
    let nowhere = SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0));
    Config {
        node: crate::NodeConfig {
            host: String::new(),
            block: String::new(),
            runtime_dir: PathBuf::new(),
            state_dir: PathBuf::new(),
        },
        listen: crate::ListenConfig {
            socks: nowhere,
            http: nowhere,
            wg: nowhere,
            status: nowhere,
            https: None,
        },
        tls: crate::TlsConfig {
            certificate: None,
            key: None,
        },
        store: crate::StoreConfig {
            url: String::new(),
            usage_flush: Duration::ZERO,
        },
        egress: crate::EgressConfig {
            allow: Vec::new(),
            sources: Vec::new(),
            tun: crate::TunConfig {
                name: String::new(),
                out_interface: String::new(),
                manage: false,
                offload: false,
                queues: 0,
                user: None,
                group: None,
            },
            upstreams: Vec::new(),
            window: crate::WindowConfig { size: 0 },
            probe: crate::ProbeConfig {
                interval: Duration::ZERO,
                timeout: Duration::ZERO,
                failures: 0,
            },
        },
        wireguard: crate::WireguardConfig {
            endpoint: None,
            pool: ipnet::IpNet::from(std::net::IpAddr::from(Ipv4Addr::UNSPECIFIED)),
            pool6: None,
            dns: false,
            dns_upstreams: Vec::new(),
            client_dns: Vec::new(),
            private_key_file: None,
            handshake_limit: 0,
            queue: 0,
            workers: 0,
            interface: String::new(),
            uapi: false,
            uapi_dir: PathBuf::new(),
        },
        drain: crate::DrainConfig {
            grace: Duration::ZERO,
            lame_duck: Duration::ZERO,
        },
        proxy: crate::ProxyConfig {
            connect_timeout: Duration::ZERO,
            handshake_timeout: Duration::ZERO,
            idle_timeout: Duration::ZERO,
            udp_idle_timeout: Duration::ZERO,
            udp_public_address: None,
        },
        timeouts: crate::TimeoutsConfig {
            response: Duration::ZERO,
            body_idle: Duration::ZERO,
        },
        limits: crate::LimitsConfig {
            header_bytes: 0,
            connections: 0,
            tunnels_per_client: 0,
            udp_associations_per_client: 0,
            tls_handshakes: 0,
            client_defaults: crate::client_limits::ClientLimits::default(),
        },
        deploy: crate::DeployConfig {
            ready_budget: Duration::ZERO,
        },
        prewarm: crate::PrewarmConfig {
            window: Duration::ZERO,
            concurrency: 0,
            device_timeout: Duration::ZERO,
            budget: Duration::ZERO,
        },
        log: crate::LogConfig {
            format: LogFormat::Human,
            level: String::new(),
        },
    }
}

/// A TOML document listing every key with its default value and a comment
/// saying what it is for and what a valid value looks like.
///
/// It is rendered from the same key table that drives parsing, so it cannot
/// drift. Keys without a fixed default (`node.host`: this machine's hostname,
/// `store.url`: derived from `node.state_dir`, `wireguard.endpoint`: unset) are
/// shown commented out. Parsing the document back gives the defaults.
pub fn documented_defaults() -> String {
    let mut out = String::from(
        "# blipless configuration: every key with its default value.\n\
         # One file serves blipless-ingress and blipless-device (--config FILE).\n\
         # Precedence: built-in defaults < this file < BLIPLESS_* environment\n\
         # variables < --set key=value flags.\n\
         # The variable for a key is BLIPLESS_ + the key in upper case with dots as\n\
         # underscores (egress.tun.name: BLIPLESS_EGRESS_TUN_NAME); lists are\n\
         # comma-separated there. Other BLIPLESS_* variables (BLIPLESS_CONFIG,\n\
         # BLIPLESS_LOG, BLIPLESS_SUPERVISE) belong to the binaries and are\n\
         # ignored here.\n",
    );
    let mut table = None;
    for key in KEYS.iter() {
        if table != Some(key.table()) {
            table = Some(key.table());
            out.push_str(&format!("\n[{}]\n", key.table()));
        }
        out.push_str(&format!("# {}\n# Value: {}.\n", key.doc, key.expected));
        // Defaults that depend on the machine or on another key are shown
        // commented out, so that a copy of this file used elsewhere, or with
        // another state_dir, still gets them right.
        let (text, commented) = match key.default {
            DefaultValue::Text(text) => (text.to_owned(), false),
            DefaultValue::Hostname => (hostname(), true),
            DefaultValue::StoreInStateDir => (store_in(&default_state_dir()), true),
            DefaultValue::Unset { example } => (example.to_owned(), true),
        };
        let value = toml_value(&text, key.shape);
        let prefix = if commented { "# " } else { "" };
        out.push_str(&format!("{prefix}{} = {value}\n", key.leaf()));
    }
    out.push_str(UPSTREAM_EXAMPLE);
    out
}

/// `[[egress.upstream]]` has no default (none): an example, commented out.
const UPSTREAM_EXAMPLE: &str = "
# Upstream providers to egress through, one [[egress.upstream]] table each
# (none by default: direct egress only). Read from the file only.
# name: unique, letters, digits, - _ . (not \"direct\"); tags: labels
# client policies select by; kind: \"socks5\" or \"wireguard\".
# socks5: address (host:port); username and password_file (its first line
# is the password): both or neither, the username may carry {client} and
# {session} (a provider's sticky session).
# wireguard: config, a wg-quick file (a VPN provider's, or what another
# node's `blipless-ctl client add --wg` prints); tun, its TUN device
# (default blx<N>). See docs/EGRESS.md.
# [[egress.upstream]]
# name = \"dc-1\"
# kind = \"socks5\"
# address = \"proxy.example.net:1080\"
# username = \"user-session-{session}\"
# password_file = \"/etc/blipless/dc-1.password\"
# tags = [\"eu\", \"datacenter\"]
#
# [[egress.upstream]]
# name = \"wg-nl\"
# kind = \"wireguard\"
# config = \"/etc/blipless/exits/nl.conf\"
# tags = [\"nl\"]
";

/// The default `node.state_dir`, which the default `store.url` is made from.
fn default_state_dir() -> PathBuf {
    match find("node.state_dir").map(|key| key.default) {
        Some(DefaultValue::Text(dir)) => PathBuf::from(dir),
        _ => PathBuf::from("/var/lib/blipless"),
    }
}

/// Default text (as an environment variable would give it) in TOML syntax.
fn toml_value(text: &str, shape: Shape) -> toml::Value {
    match shape {
        Shape::Text => toml::Value::String(text.to_owned()),
        Shape::Bool => toml::Value::Boolean(text == "true"),
        Shape::Integer => toml::Value::Integer(text.parse().unwrap_or_default()),
        Shape::List => toml::Value::Array(
            text.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| toml::Value::String(s.to_owned()))
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::{Input, Kind, Name};

    #[test]
    fn hostname_is_a_valid_name() {
        let host = hostname();
        assert!(!host.is_empty() && host.len() <= 63);
        let input = Input::Text(&host);
        assert!(Name::parse(&input).is_some(), "{host}");
    }
}
