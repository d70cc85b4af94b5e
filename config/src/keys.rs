//! The key table: every configuration key with its kind, default and description.
//!
//! Parsing, environment variable names, typo suggestions and
//! [`documented_defaults`](crate::documented_defaults) are all driven by
//! [`KEYS`]; adding a key is adding one entry here and one field to [`Config`].

use std::sync::LazyLock;

use crate::kinds::{
    Addr, Cap, Capacity, Cidr, Count, Dir, Dur, Filter, Flag, FlushInterval, Format, HeadBytes,
    Input, Interface, InterfaceOrFound, IpList, Kind, Name, NetList, OptionalAccount, OptionalAddr,
    OptionalCidr, OptionalHostPort, OptionalIp, OptionalPath, OptionalQuota, OptionalRate, Queues,
    ResolverList, Shape, SocketDir, StoreUrl, Workers,
};
use crate::Config;

/// Where a key's default comes from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum DefaultValue {
    /// This text, parsed like an environment variable's value.
    Text(&'static str),
    /// The machine's hostname.
    Hostname,
    /// `sqlite://<state_dir>/state.db`, from the final `node.state_dir`.
    StoreInStateDir,
    /// No value; the example shows what one looks like.
    Unset { example: &'static str },
}

type Apply = Box<dyn Fn(&mut Config, &Input<'_>) -> bool + Send + Sync>;

/// One configuration key.
pub(crate) struct Key {
    /// The dotted key, e.g. `egress.tun.name`.
    pub path: &'static str,
    /// One line for the documented defaults.
    pub doc: &'static str,
    pub default: DefaultValue,
    pub shape: Shape,
    /// What a valid value looks like.
    pub expected: &'static str,
    /// What is wrong with an invalid input, when the kind can say more than
    /// [`Key::expected`] ([`Kind::why`]).
    pub why: fn(&Input<'_>) -> Option<String>,
    /// Parses an input into the key's field; `false` when the input is invalid.
    apply: Apply,
}

impl Key {
    fn new<K: Kind + 'static>(
        path: &'static str,
        default: DefaultValue,
        doc: &'static str,
        field: fn(&mut Config) -> &mut K::Out,
    ) -> Key {
        Key {
            path,
            doc,
            default,
            shape: K::SHAPE,
            expected: K::EXPECTED,
            why: K::why,
            apply: Box::new(move |config, input| match K::parse(input) {
                Some(value) => {
                    *field(config) = value;
                    true
                }
                None => false,
            }),
        }
    }

    /// Sets the key in `config` from `input`; `false` (and `config` unchanged)
    /// when the input is not valid for this key.
    pub(crate) fn apply(&self, config: &mut Config, input: &Input<'_>) -> bool {
        (self.apply)(config, input)
    }

    /// `BLIPLESS_` + the key in upper case, dots as underscores.
    pub(crate) fn env_name(&self) -> String {
        format!("BLIPLESS_{}", self.path.to_uppercase().replace('.', "_"))
    }

    /// The table the key lives in (`egress.tun` for `egress.tun.name`).
    pub(crate) fn table(&self) -> &'static str {
        self.path.rsplit_once('.').map_or("", |(table, _)| table)
    }

    /// The key's name within its table.
    pub(crate) fn leaf(&self) -> &'static str {
        self.path
            .rsplit_once('.')
            .map_or(self.path, |(_, leaf)| leaf)
    }
}

use DefaultValue::{Hostname, StoreInStateDir, Text, Unset};

/// Every key, in the order they are documented.
pub(crate) static KEYS: LazyLock<Vec<Key>> = LazyLock::new(|| {
    vec![
        Key::new::<Name>(
            "node.host",
            Hostname,
            "This node's name in shared state keys (default: the hostname); unique per node.",
            |c| &mut c.node.host,
        ),
        Key::new::<Name>(
            "node.block",
            Text("0"),
            "The block (group of nodes) this node belongs to, also part of its state keys.",
            |c| &mut c.node.block,
        ),
        Key::new::<SocketDir>(
            "node.runtime_dir",
            Text("/run/blipless"),
            "Directory of device.sock, control.sock and handoff.sock.",
            |c| &mut c.node.runtime_dir,
        ),
        Key::new::<Dir>(
            "node.state_dir",
            Text("/var/lib/blipless"),
            "Directory of persistent state (the embedded store by default).",
            |c| &mut c.node.state_dir,
        ),
        Key::new::<Addr>(
            "listen.socks",
            Text("127.0.0.1:1080"),
            "SOCKS5 listener (TCP).",
            |c| &mut c.listen.socks,
        ),
        Key::new::<Addr>(
            "listen.http",
            Text("127.0.0.1:8080"),
            "HTTP proxy listener (TCP): CONNECT and absolute-form requests.",
            |c| &mut c.listen.http,
        ),
        Key::new::<Addr>(
            "listen.wg",
            Text("127.0.0.1:51820"),
            "WireGuard listener (UDP); may share its port with a TCP listener.",
            |c| &mut c.listen.wg,
        ),
        Key::new::<Addr>(
            "listen.status",
            Text("127.0.0.1:9180"),
            "HTTP listener for /status and /metrics (TCP).",
            |c| &mut c.listen.status,
        ),
        Key::new::<OptionalAddr>(
            "listen.https",
            Text(""),
            "HTTPS proxy listener (TCP; TLS 1.2 and 1.3 terminated by the ingress, needs tls.certificate and tls.key; empty: off).",
            |c| &mut c.listen.https,
        ),
        Key::new::<OptionalPath>(
            "tls.certificate",
            Unset {
                example: "/etc/blipless/proxy.crt",
            },
            "PEM certificate chain (leaf first) of the HTTPS proxy listener; re-read on SIGHUP and blipless-ctl tls reload.",
            |c| &mut c.tls.certificate,
        ),
        Key::new::<OptionalPath>(
            "tls.key",
            Unset {
                example: "/etc/blipless/proxy.key",
            },
            "PEM private key (PKCS#8, PKCS#1 or SEC1) of the HTTPS proxy listener; re-read with tls.certificate.",
            |c| &mut c.tls.key,
        ),
        Key::new::<StoreUrl>(
            "store.url",
            StoreInStateDir,
            "State store (default: sqlite://<node.state_dir>/state.db); Redis fleets: docs/FLEET.md.",
            |c| &mut c.store.url,
        ),
        Key::new::<FlushInterval>(
            "store.usage_flush",
            Text("10s"),
            "How often a device plane adds its clients' usage to the store (a crash loses at most this much).",
            |c| &mut c.store.usage_flush,
        ),
        Key::new::<NetList>(
            "egress.allow",
            Text(""),
            "Destinations allowed despite the default deny (private, loopback, metadata...).",
            |c| &mut c.egress.allow,
        ),
        Key::new::<IpList>(
            "egress.sources",
            Text(""),
            "Source addresses the direct egress binds clients to, one per client, sticky.",
            |c| &mut c.egress.sources,
        ),
        Key::new::<Interface>(
            "egress.tun.name",
            Text("blip0"),
            "TUN device for packet egress of WireGuard clients.",
            |c| &mut c.egress.tun.name,
        ),
        Key::new::<InterfaceOrFound>(
            "egress.tun.out_interface",
            Text(""),
            "Interface packet egress is masqueraded out of (empty: the IPv4 default route's, found at `net setup`).",
            |c| &mut c.egress.tun.out_interface,
        ),
        Key::new::<Flag>(
            "egress.tun.manage",
            Text("false"),
            "true: the device plane sets up the TUN device, routes and nftables rules.",
            |c| &mut c.egress.tun.manage,
        ),
        Key::new::<Queues>(
            "egress.tun.queues",
            Text("2"),
            "Queues the first device plane attaches to the multi-queue TUN device; a successor inherits them at a deploy.",
            |c| &mut c.egress.tun.queues,
        ),
        Key::new::<Flag>(
            "egress.tun.offload",
            Text("false"),
            "true: the first queue of the TUN device carries virtio-net headers, and TCP is read and written as super-packets (GSO/GRO). Takes effect when a device with no queue attached gets its first; a plane of a version without it must not inherit such queues (docs/WIREGUARD.md, \"TUN offload\").",
            |c| &mut c.egress.tun.offload,
        ),
        Key::new::<OptionalAccount>(
            "egress.tun.user",
            Unset { example: "blipless" },
            "User (name or uid) net setup makes the TUN device's owner: only it (or CAP_NET_ADMIN) may attach queues (default: whoever runs net setup).",
            |c| &mut c.egress.tun.user,
        ),
        Key::new::<OptionalAccount>(
            "egress.tun.group",
            Unset { example: "blipless" },
            "Group (name or gid) net setup gives the TUN device (default: egress.tun.user's primary group, or the group of whoever runs net setup).",
            |c| &mut c.egress.tun.group,
        ),
        Key::new::<Count>(
            "egress.window.size",
            Text("2"),
            "Routes in each client's egress window (direct or upstreams its policy allows), best first.",
            |c| &mut c.egress.window.size,
        ),
        Key::new::<Dur>(
            "egress.probe.interval",
            Text("5s"),
            "Time between two health probes of one upstream (connect and SOCKS5 greeting).",
            |c| &mut c.egress.probe.interval,
        ),
        Key::new::<Dur>(
            "egress.probe.timeout",
            Text("3s"),
            "A probe not answered within this failed.",
            |c| &mut c.egress.probe.timeout,
        ),
        Key::new::<Count>(
            "egress.probe.failures",
            Text("2"),
            "Consecutive failures (probes or customer connects) that mark an upstream down; one success marks it up.",
            |c| &mut c.egress.probe.failures,
        ),
        Key::new::<OptionalHostPort>(
            "wireguard.endpoint",
            Unset {
                example: "vpn.example.com:51820",
            },
            "What client WireGuard configs dial (default: unset).",
            |c| &mut c.wireguard.endpoint,
        ),
        Key::new::<Cidr>(
            "wireguard.pool",
            Text("10.64.0.0/16"),
            "Network client tunnel addresses are taken from; its first host address is the node's own.",
            |c| &mut c.wireguard.pool,
        ),
        Key::new::<OptionalCidr>(
            "wireguard.pool6",
            Text(""),
            "IPv6 network clients also get a tunnel address from, at their IPv4 address's place in wireguard.pool (empty: no IPv6 inside the tunnel; client configs still route ::/0 into it, so IPv6 never leaks around it).",
            |c| &mut c.wireguard.pool6,
        ),
        Key::new::<Flag>(
            "wireguard.dns",
            Text("true"),
            "The device plane answers WireGuard clients' DNS queries (UDP 53) to the node's tunnel address, and client configs name it in `DNS =`.",
            |c| &mut c.wireguard.dns,
        ),
        Key::new::<ResolverList>(
            "wireguard.dns_upstreams",
            Text(""),
            "DNS servers that gateway resolves through (empty: the host's, from /etc/resolv.conf).",
            |c| &mut c.wireguard.dns_upstreams,
        ),
        Key::new::<IpList>(
            "wireguard.client_dns",
            Text(""),
            "Resolvers client configs name in `DNS =` instead of the node's tunnel address (empty: the node's, when wireguard.dns is on).",
            |c| &mut c.wireguard.client_dns,
        ),
        Key::new::<OptionalPath>(
            "wireguard.private_key_file",
            Unset {
                example: "/var/lib/blipless/wireguard.key",
            },
            "The node's WireGuard private key, created on first use (default: <node.state_dir>/wireguard.key).",
            |c| &mut c.wireguard.private_key_file,
        ),
        Key::new::<Count>(
            "wireguard.handshake_limit",
            Text("100"),
            "Handshake initiations per second answered before the ingress asks for cookies.",
            |c| &mut c.wireguard.handshake_limit,
        ),
        Key::new::<Capacity>(
            "wireguard.queue",
            Text("4096"),
            "Inner packets held while no device plane is active (and at most 2 KiB each on average); more are dropped and counted.",
            |c| &mut c.wireguard.queue,
        ),
        Key::new::<Workers>(
            "wireguard.workers",
            Text("0"),
            "Tasks the ingress decrypts and encrypts WireGuard packets in, each peer's always in the same one (0: one per core).",
            |c| &mut c.wireguard.workers,
        ),
        Key::new::<Interface>(
            "wireguard.interface",
            Text("blipless"),
            "The name `wg show` knows the ingress's WireGuard device by (it is not a kernel interface).",
            |c| &mut c.wireguard.interface,
        ),
        Key::new::<Flag>(
            "wireguard.uapi",
            Text("true"),
            "Serve the read-only WireGuard UAPI socket <uapi_dir>/<interface>.sock that `wg show` reads.",
            |c| &mut c.wireguard.uapi,
        ),
        Key::new::<SocketDir>(
            "wireguard.uapi_dir",
            Text("/run/wireguard"),
            "Where the UAPI socket is made; stock `wg` looks in /run/wireguard.",
            |c| &mut c.wireguard.uapi_dir,
        ),
        Key::new::<Dur>(
            "drain.grace",
            Text("120s"),
            "How long a draining process may finish what it cannot hand over.",
            |c| &mut c.drain.grace,
        ),
        Key::new::<Dur>(
            "drain.lame_duck",
            Text("2s"),
            "How long /status reports draining before listeners are given up.",
            |c| &mut c.drain.lame_duck,
        ),
        Key::new::<Dur>(
            "proxy.connect_timeout",
            Text("10s"),
            "Limit on connecting to a destination.",
            |c| &mut c.proxy.connect_timeout,
        ),
        Key::new::<Dur>(
            "proxy.handshake_timeout",
            Text("10s"),
            "Limit on a client's SOCKS5 or HTTP handshake (and on the TLS handshake of the HTTPS listener).",
            |c| &mut c.proxy.handshake_timeout,
        ),
        Key::new::<Dur>(
            "proxy.idle_timeout",
            Text("15m"),
            "A tunnel, or an HTTP proxy connection (and the ingress's TLS relay of an HTTPS one), with no traffic either way for this long is closed.",
            |c| &mut c.proxy.idle_timeout,
        ),
        Key::new::<Dur>(
            "proxy.udp_idle_timeout",
            Text("2m"),
            "A SOCKS5 UDP association with no datagram either way for this long is closed, with its control connection.",
            |c| &mut c.proxy.udp_idle_timeout,
        ),
        Key::new::<OptionalIp>(
            "proxy.udp_public_address",
            Unset {
                example: "203.0.113.7",
            },
            "The address UDP ASSOCIATE replies name for the relay (with its port) when customers reach this host at an address it does not have, behind a 1:1 NAT; for customers of that address family only (default: unset, the address the customer reached).",
            |c| &mut c.proxy.udp_public_address,
        ),
        Key::new::<Dur>(
            "timeouts.response",
            Text("30s"),
            "Limit on an origin starting its answer to a forwarded HTTP request, once the request is sent; 504 after it.",
            |c| &mut c.timeouts.response,
        ),
        Key::new::<Dur>(
            "timeouts.body_idle",
            Text("30s"),
            "A forwarded HTTP request body moving under 1 KiB, or a response body moving nothing, for this long ends the exchange.",
            |c| &mut c.timeouts.body_idle,
        ),
        Key::new::<HeadBytes>(
            "limits.header_bytes",
            Text("32768"),
            "Largest HTTP proxy request head (request line and headers), in bytes; a larger one gets 431 and a close.",
            |c| &mut c.limits.header_bytes,
        ),
        Key::new::<Cap>(
            "limits.connections",
            Text("0"),
            "Customer connections one device plane serves at once (0: no cap but the open-file limit); over it a new one gets SOCKS5 \"no acceptable method\" or HTTP 503.",
            |c| &mut c.limits.connections,
        ),
        Key::new::<Cap>(
            "limits.tunnels_per_client",
            Text("0"),
            "Tunnels (SOCKS5 and HTTP CONNECT) one client may have open at once on a device plane (0: no cap); over it SOCKS5 reply 2, HTTP 429.",
            |c| &mut c.limits.tunnels_per_client,
        ),
        Key::new::<Cap>(
            "limits.udp_associations_per_client",
            Text("64"),
            "SOCKS5 UDP associations one client may have open at once on a device plane (0: no cap); each holds two of the host's UDP ports; over it SOCKS5 reply 2.",
            |c| &mut c.limits.udp_associations_per_client,
        ),
        Key::new::<Capacity>(
            "limits.tls_handshakes",
            Text("4096"),
            "TLS handshakes the ingress runs at once on the HTTPS listener; a connection over it is closed at once (counted).",
            |c| &mut c.limits.tls_handshakes,
        ),
        Key::new::<OptionalRate>(
            "limits.client_rate_up",
            Text(""),
            "Each client's rate from customer to destination when its own record sets none, e.g. 10Mbit (empty: no limit); see docs/LIMITS.md.",
            |c| &mut c.limits.client_defaults.rate_up,
        ),
        Key::new::<OptionalRate>(
            "limits.client_rate_down",
            Text(""),
            "Each client's rate from destination to customer when its own record sets none (empty: no limit).",
            |c| &mut c.limits.client_defaults.rate_down,
        ),
        Key::new::<OptionalQuota>(
            "limits.client_quota",
            Text(""),
            "Each client's byte quota when its own record sets none, e.g. 50GB/month (empty: no quota); counted fleet-wide through the store.",
            |c| &mut c.limits.client_defaults.quota,
        ),
        Key::new::<Dur>(
            "deploy.ready_budget",
            Text("60s"),
            "How long a new device plane has to pre-warm and report Ready.",
            |c| &mut c.deploy.ready_budget,
        ),
        Key::new::<Dur>(
            "prewarm.window",
            Text("10m"),
            "Clients that carried traffic on this node within this window are pre-warmed by a new device plane.",
            |c| &mut c.prewarm.window,
        ),
        Key::new::<Count>(
            "prewarm.concurrency",
            Text("8"),
            "Devices a new device plane opens at once while pre-warming.",
            |c| &mut c.prewarm.concurrency,
        ),
        Key::new::<Dur>(
            "prewarm.device_timeout",
            Text("5s"),
            "Limit on opening one device; a slower one is skipped (logged, never fatal).",
            |c| &mut c.prewarm.device_timeout,
        ),
        Key::new::<Dur>(
            "prewarm.budget",
            Text("2m"),
            "Limit on the whole pre-warm; Ready is said by deploy.ready_budget at the latest, the rest goes on after.",
            |c| &mut c.prewarm.budget,
        ),
        Key::new::<Format>(
            "log.format",
            Text("human"),
            "Log lines for people (human) or machines (json).",
            |c| &mut c.log.format,
        ),
        Key::new::<Filter>(
            "log.level",
            Text("info"),
            "A tracing filter; BLIPLESS_LOG, read by the binaries, overrides it.",
            |c| &mut c.log.level,
        ),
    ]
});

/// The key with this dotted path.
pub(crate) fn find(path: &str) -> Option<&'static Key> {
    KEYS.iter().find(|key| key.path == path)
}

/// The key whose environment variable is `name`.
pub(crate) fn find_env(name: &str) -> Option<&'static Key> {
    KEYS.iter().find(|key| key.env_name() == name)
}

/// Whether `path` is a table that holds keys (`node`, `egress.tun`, ...).
pub(crate) fn is_table(path: &str) -> bool {
    KEYS.iter().any(|key| {
        key.path
            .strip_prefix(path)
            .is_some_and(|rest| rest.starts_with('.'))
    })
}

/// The known key or table `unknown` was most likely meant to be: the nearest by
/// edit distance (at most 2), or else the only key with the same last component
/// (`node.grace` suggests `drain.grace`).
pub(crate) fn suggest(unknown: &str) -> Option<String> {
    let tables = KEYS.iter().flat_map(|key| {
        let mut prefixes = Vec::new();
        let mut rest = key.path;
        while let Some((table, _)) = rest.rsplit_once('.') {
            prefixes.push(table);
            rest = table;
        }
        prefixes
    });
    let nearest = KEYS
        .iter()
        .map(|key| key.path)
        .chain(tables)
        .map(|known| (edit_distance(unknown, known), known))
        .filter(|(distance, _)| *distance <= 2)
        .min_by_key(|(distance, _)| *distance);
    if let Some((_, known)) = nearest {
        return Some(known.to_owned());
    }
    let leaf = unknown.rsplit_once('.').map_or(unknown, |(_, leaf)| leaf);
    let mut same_leaf = KEYS.iter().filter(|key| key.leaf() == leaf);
    match (same_leaf.next(), same_leaf.next()) {
        (Some(key), None) => Some(key.path.to_owned()),
        _ => None,
    }
}

/// Levenshtein distance over characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != *cb);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        previous = current;
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn paths_and_env_names_are_unique() {
        let paths: HashSet<_> = KEYS.iter().map(|k| k.path).collect();
        let envs: HashSet<_> = KEYS.iter().map(Key::env_name).collect();
        assert_eq!(paths.len(), KEYS.len());
        assert_eq!(envs.len(), KEYS.len());
        assert_eq!(
            find("egress.tun.out_interface")
                .map(Key::env_name)
                .as_deref(),
            Some("BLIPLESS_EGRESS_TUN_OUT_INTERFACE")
        );
    }

    #[test]
    fn tables_are_known() {
        for table in ["node", "listen", "egress", "egress.tun", "log"] {
            assert!(is_table(table), "{table}");
        }
        for not in ["", "egress.tu", "node.host", "nodes"] {
            assert!(!is_table(not), "{not}");
        }
    }

    #[test]
    fn suggestions() {
        assert_eq!(suggest("listen.sock").as_deref(), Some("listen.socks"));
        assert_eq!(suggest("nod").as_deref(), Some("node"));
        assert_eq!(
            suggest("egress.tun.nmae").as_deref(),
            Some("egress.tun.name")
        );
        assert_eq!(suggest("node.grace").as_deref(), Some("drain.grace"));
        assert_eq!(suggest("completely.different"), None);
    }

    #[test]
    fn edit_distances() {
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("socks", "sokcs"), 2);
        assert_eq!(edit_distance("same", "same"), 0);
    }
}
