//! Loading: defaults, then the file, then the environment, then `--set` flags,
//! collecting every problem on the way, then the checks across keys.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use crate::defaults;
use crate::error::{redact_store_url, redact_urls, ConfigError, ConfigErrors};
use crate::keys::{self, DefaultValue, Key, KEYS};
use crate::kinds::{Input, Raw};
use crate::Config;

impl Config {
    /// Loads the configuration: the defaults, overlaid by the TOML `file` (if
    /// any), then by every variable in `env` named `BLIPLESS_<KEY>` for a known
    /// key (others are ignored), then by each `sets` entry `dotted.key=value` in
    /// order.
    ///
    /// Returns every problem found (unreadable file, TOML syntax, unknown keys,
    /// bad values, conflicts), not just the first.
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        sets: &[String],
    ) -> Result<Config, ConfigErrors> {
        let sets: Vec<std::ffi::OsString> = sets.iter().map(Into::into).collect();
        Self::load_sets(file, env, &[], &sets)
    }

    /// [`Config::load`] with our variables whose value is not UTF-8
    /// (`unreadable_env`: each one's key, name and value as shown) and the
    /// `--set` entries as the command line had them.
    fn load_sets(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        unreadable_env: &[(&'static Key, String, String)],
        sets: &[std::ffi::OsString],
    ) -> Result<Config, ConfigErrors> {
        let mut loader = Loader::new();
        if let Some(path) = file {
            match crate::files::read_text(path) {
                Ok(text) => loader.file(&text, &path.display().to_string()),
                Err(source) => loader.errors.push(ConfigError::Read {
                    path: path.to_owned(),
                    source,
                }),
            }
        }
        loader.env(env);
        for (key, name, value) in unreadable_env {
            loader.unreadable(key, &format!("environment variable {name}"), value.clone());
        }
        loader.sets(sets);
        loader.finish()
    }

    /// [`Config::load`] with the environment as the process has it
    /// (`std::env::vars_os()`): a variable whose name or value is not UTF-8
    /// is skipped, unless it is a `BLIPLESS_<KEY>` of a known key, whose
    /// value is then reported as a problem like any other bad value; and the
    /// `--set` flags as the command line had them, one that is not UTF-8
    /// being a problem too.
    pub fn load_os(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
        sets: &[std::ffi::OsString],
    ) -> Result<Config, ConfigErrors> {
        let mut readable = Vec::new();
        let mut unreadable = Vec::new();
        for (name, value) in env {
            let Ok(name) = name.into_string() else {
                continue;
            };
            match value.into_string() {
                Ok(value) => readable.push((name, value)),
                Err(value) => {
                    if let Some(key) = keys::find_env(&name) {
                        let shown = shown(key, Raw::Text(&value.to_string_lossy()));
                        unreadable.push((key, name, shown));
                    }
                }
            }
        }
        Config::load_sets(file, readable, &unreadable, sets)
    }

    /// Like [`Config::load`] with the file's text given directly; `origin` names
    /// it in messages.
    pub fn from_toml_str(
        text: &str,
        origin: &str,
        env: impl IntoIterator<Item = (String, String)>,
        sets: &[String],
    ) -> Result<Config, ConfigErrors> {
        let sets: Vec<std::ffi::OsString> = sets.iter().map(Into::into).collect();
        let mut loader = Loader::new();
        loader.file(text, origin);
        loader.env(env);
        loader.sets(&sets);
        loader.finish()
    }
}

/// The configuration being built, where each key's value came from, and the
/// problems so far.
struct Loader {
    config: Config,
    /// The origin of each key set by a layer above the defaults.
    origins: HashMap<&'static str, String>,
    /// Keys whose last value was invalid: left out of the checks across keys.
    invalid: HashSet<&'static str>,
    errors: Vec<ConfigError>,
}

impl Loader {
    /// Starts from every key's default.
    fn new() -> Loader {
        let mut loader = Loader {
            config: defaults::placeholder(),
            origins: HashMap::new(),
            invalid: HashSet::new(),
            errors: Vec::new(),
        };
        for key in KEYS.iter() {
            let text = match key.default {
                DefaultValue::Text(text) => text.to_owned(),
                DefaultValue::Hostname => defaults::hostname(),
                DefaultValue::Unset { .. } => String::new(),
                // Derived in `finish`, from the final state_dir.
                DefaultValue::StoreInStateDir => continue,
            };
            loader.set(key, Raw::Text(&text), "the built-in default");
        }
        loader.origins.clear();
        loader
    }

    /// A value for `key` that is not UTF-8 (`shown` as it may be shown): a
    /// problem of that key, which is left out of the checks across keys, as
    /// a bad value is (the value it would have replaced is not judged).
    fn unreadable(&mut self, key: &'static Key, origin: &str, shown: String) {
        self.invalid.insert(key.path);
        self.errors.push(ConfigError::InvalidValue {
            origin: origin.to_owned(),
            key: key.path.to_owned(),
            value: shown,
            expected: "UTF-8 text".to_owned(),
        });
    }

    /// A `--set` entry that is not UTF-8: a problem of its key, or an
    /// unknown key. Its value is not shown: it may hold a password, and the
    /// replacement characters could make it read as a value it is not.
    fn unreadable_set(&mut self, entry: &std::ffi::OsStr) {
        use std::os::unix::ffi::OsStrExt;
        let bytes = entry.as_bytes();
        let Some(at) = bytes.iter().position(|&byte| byte == b'=') else {
            self.errors.push(ConfigError::InvalidValue {
                origin: "--set".to_owned(),
                key: "(not shown)".to_owned(),
                value: "(not UTF-8, no `=`)".to_owned(),
                expected: "key=value, like --set listen.socks=127.0.0.1:1080".to_owned(),
            });
            return;
        };
        let name = String::from_utf8_lossy(&bytes[..at]);
        let name = name.trim();
        // Not a key's name: perhaps a URL whose key was forgotten.
        let shown = redact_urls(name);
        let origin = format!("--set {shown}=…");
        match keys::find(name) {
            Some(key) => self.unreadable(key, &origin, "(not shown)".to_owned()),
            None => self.errors.push(ConfigError::UnknownKey {
                origin,
                key: shown,
                suggestion: keys::suggest(name),
            }),
        }
    }

    /// Sets `key` from `raw`, or records why it cannot.
    fn set(&mut self, key: &'static Key, raw: Raw<'_>, origin: &str) {
        let input = Input::new(raw, key.shape);
        let applied = input
            .as_ref()
            .is_some_and(|input| key.apply(&mut self.config, input));
        if applied {
            self.origins.insert(key.path, origin.to_owned());
            self.invalid.remove(key.path);
        } else {
            self.invalid.insert(key.path);
            let expected = match input.as_ref().and_then(|input| (key.why)(input)) {
                Some(why) => format!("{}; this one: {why}", key.expected),
                None => key.expected.to_owned(),
            };
            self.errors.push(ConfigError::InvalidValue {
                origin: origin.to_owned(),
                key: key.path.to_owned(),
                value: shown(key, raw),
                expected,
            });
        }
    }

    /// Overlays a TOML document.
    fn file(&mut self, text: &str, origin: &str) {
        match text.parse::<toml::Table>() {
            Ok(table) => self.table("", &table, origin),
            // The parser quotes the offending line, which may hold a URL.
            Err(error) => self.errors.push(ConfigError::Syntax {
                origin: origin.to_owned(),
                message: redact_urls(error.to_string().trim_end()),
            }),
        }
    }

    /// Overlays one TOML table, whose dotted path is `prefix`.
    fn table(&mut self, prefix: &str, table: &toml::Table, origin: &str) {
        for (name, value) in table {
            let path = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}.{name}")
            };
            if path == "egress.upstream" {
                self.config.egress.upstreams =
                    crate::upstreams::parse(value, origin, &mut self.errors);
            } else if let Some(key) = keys::find(&path) {
                self.set(key, Raw::Toml(value), origin);
            } else if keys::is_table(&path) {
                match value {
                    toml::Value::Table(inner) => self.table(&path, inner, origin),
                    other => self.errors.push(ConfigError::InvalidValue {
                        origin: origin.to_owned(),
                        key: path.clone(),
                        value: redact_urls(&other.to_string()),
                        expected: format!("a table [{path}]"),
                    }),
                }
            } else {
                self.errors.push(ConfigError::UnknownKey {
                    origin: origin.to_owned(),
                    suggestion: keys::suggest(&path),
                    key: path,
                });
            }
        }
    }

    /// Overlays the `BLIPLESS_<KEY>` variables; other variables are ignored.
    fn env(&mut self, env: impl IntoIterator<Item = (String, String)>) {
        for (name, value) in env {
            if let Some(key) = keys::find_env(&name) {
                self.set(
                    key,
                    Raw::Text(&value),
                    &format!("environment variable {name}"),
                );
            }
        }
    }

    /// Overlays `dotted.key=value` entries, in order.
    fn sets(&mut self, sets: &[std::ffi::OsString]) {
        for entry in sets {
            let Some(entry) = entry.to_str() else {
                self.unreadable_set(entry);
                continue;
            };
            let origin = match entry.split_once('=') {
                Some((name, value)) if name.trim() == SECRET_KEY => {
                    format!("--set {name}={}", redact_store_url(value))
                }
                _ => format!("--set {}", redact_urls(entry)),
            };
            let Some((name, value)) = entry.split_once('=') else {
                self.errors.push(ConfigError::InvalidValue {
                    origin,
                    key: redact_urls(entry.trim()),
                    value: "(no `=`)".to_owned(),
                    expected: "key=value, like --set listen.socks=127.0.0.1:1080".to_owned(),
                });
                continue;
            };
            let name = name.trim();
            match keys::find(name) {
                Some(key) => self.set(key, Raw::Text(value), &origin),
                None => self.errors.push(ConfigError::UnknownKey {
                    origin,
                    key: redact_urls(name),
                    suggestion: keys::suggest(name),
                }),
            }
        }
    }

    /// Derives what was not given, checks across keys, and returns the
    /// configuration or every problem found.
    fn finish(mut self) -> Result<Config, ConfigErrors> {
        if !self.origins.contains_key("store.url") && !self.invalid.contains("store.url") {
            self.config.store.url = defaults::store_in(&self.config.node.state_dir);
        }
        self.check_listeners();
        self.check_tls();
        self.check_pool6();
        self.check_exits();
        self.check_uapi_socket();
        if self.errors.is_empty() {
            Ok(self.config)
        } else {
            Err(ConfigErrors(self.errors))
        }
    }

    /// The TCP listeners need addresses that do not overlap. (The WireGuard
    /// listener is UDP and may share a port with any of them.)
    fn check_listeners(&mut self) {
        let listen = &self.config.listen;
        let mut tcp = vec![
            ("listen.socks", listen.socks),
            ("listen.http", listen.http),
            ("listen.status", listen.status),
        ];
        tcp.extend(listen.https.map(|https| ("listen.https", https)));
        for (i, &(a, addr_a)) in tcp.iter().enumerate() {
            for &(b, addr_b) in &tcp[i + 1..] {
                if self.invalid.contains(a) || self.invalid.contains(b) {
                    continue;
                }
                if overlap(addr_a, addr_b) {
                    let message = format!(
                        "{a} = \"{addr_a}\" ({}) and {b} = \"{addr_b}\" ({}) overlap: \
                         the TCP listeners need distinct addresses",
                        self.origin(a),
                        self.origin(b),
                    );
                    self.errors.push(ConfigError::Conflict { message });
                }
            }
        }
    }

    /// An HTTPS listener needs a certificate and its key. (Whether the files
    /// load is checked by the ingress at start-up: they may be written after
    /// the configuration is.)
    fn check_tls(&mut self) {
        if self.config.listen.https.is_none() || self.invalid.contains("listen.https") {
            return;
        }
        for (key, path) in [
            ("tls.certificate", &self.config.tls.certificate),
            ("tls.key", &self.config.tls.key),
        ] {
            if path.is_none() && !self.invalid.contains(key) {
                let message = format!(
                    "listen.https = \"{}\" ({}) needs {key}: the HTTPS proxy listener serves a certificate",
                    self.config.listen.https.map_or_else(String::new, |a| a.to_string()),
                    self.origin("listen.https"),
                );
                self.errors.push(ConfigError::Conflict { message });
            }
        }
    }

    /// `wireguard.pool6` must be IPv6 and have room for every address of an
    /// IPv4 `wireguard.pool` at the same place (crate::pool6).
    fn check_pool6(&mut self) {
        let wg = &self.config.wireguard;
        let Some(pool6) = wg.pool6 else { return };
        if self.invalid.contains("wireguard.pool6") || self.invalid.contains("wireguard.pool") {
            return;
        }
        if crate::pool6::TunnelPools::new(wg.pool, pool6).is_some() {
            return;
        }
        let why = match (wg.pool, pool6) {
            (_, ipnet::IpNet::V4(_)) => "it must be an IPv6 network".to_owned(),
            (ipnet::IpNet::V6(_), _) => "wireguard.pool must then be IPv4".to_owned(),
            (ipnet::IpNet::V4(pool), _) => format!(
                "it needs at least {} host bits (a /{} or larger) to give every address of wireguard.pool = \"{pool}\" its twin",
                32 - pool.prefix_len(),
                96 + pool.prefix_len()
            ),
        };
        let message = format!(
            "wireguard.pool6 = \"{pool6}\" ({}): {why}",
            self.origin("wireguard.pool6")
        );
        self.errors.push(ConfigError::Conflict { message });
    }

    /// A WireGuard exit's tunnel address must not be one the node gives its
    /// own WireGuard clients (the client given it would be routed into the
    /// exit, or the exit's streams to the client), and its TUN device must
    /// not be the one the device plane relays the clients' packets on.
    fn check_exits(&mut self) {
        let pool = (!self.invalid.contains("wireguard.pool")).then_some(self.config.wireguard.pool);
        let tun = (!self.invalid.contains("egress.tun.name"))
            .then(|| self.config.egress.tun.name.clone());
        let mut messages = Vec::new();
        for upstream in &self.config.egress.upstreams {
            let crate::upstreams::UpstreamKind::Wireguard(exit) = &upstream.kind else {
                continue;
            };
            if pool.is_some_and(|pool| pool.contains(&std::net::IpAddr::V4(exit.address))) {
                messages.push(format!(
                    "the WireGuard exit {:?} has the tunnel address {} ({}), inside wireguard.pool = \"{}\" ({}): \
                     a client of this node would be given it; use an exit address outside the pool, or move the pool",
                    upstream.name,
                    exit.address,
                    exit.path.display(),
                    self.config.wireguard.pool,
                    self.origin("wireguard.pool"),
                ));
            }
            if tun.as_deref() == Some(exit.tun.as_str()) {
                messages.push(format!(
                    "the WireGuard exit {:?} has the TUN device {:?}, which is egress.tun.name ({}): \
                     the exit needs a device of its own",
                    upstream.name,
                    exit.tun,
                    self.origin("egress.tun.name"),
                ));
            }
        }
        self.errors.extend(
            messages
                .into_iter()
                .map(|message| ConfigError::Conflict { message }),
        );
    }

    /// When served (`wireguard.uapi`), the UAPI socket
    /// `<wireguard.uapi_dir>/<wireguard.interface>.sock` must fit a Unix
    /// socket's path (107 bytes): the directory's own limit (94 bytes) is
    /// sized for `handoff.sock`, and an interface name is up to 15 bytes.
    fn check_uapi_socket(&mut self) {
        let wg = &self.config.wireguard;
        if !wg.uapi
            || self.invalid.contains("wireguard.uapi_dir")
            || self.invalid.contains("wireguard.interface")
        {
            return;
        }
        let Some(socket) = self.config.wireguard_uapi_socket() else {
            return;
        };
        let length = socket.as_os_str().len();
        if length > 107 {
            let message = format!(
                "wireguard.uapi_dir = {:?} ({}) and wireguard.interface = {:?} ({}) make a UAPI socket path of {length} bytes: \
                 Unix socket paths hold at most 107; shorten either",
                wg.uapi_dir.display().to_string(),
                self.origin("wireguard.uapi_dir"),
                wg.interface,
                self.origin("wireguard.interface"),
            );
            self.errors.push(ConfigError::Conflict { message });
        }
        // The UAPI server removes whatever is at its path before it binds,
        // and it starts after the ingress's own sockets: with the package's
        // uapi_dir (its runtime_dir), interface = "control" replaced
        // control.sock and blipless-ctl talked to the UAPI server.
        let own = [
            self.config.device_socket(),
            self.config.control_socket(),
            self.config.handoff_socket(),
        ];
        if let Some(taken) = own.iter().find(|path| path.as_path() == socket.as_path()) {
            let message = format!(
                "wireguard.uapi_dir = {:?} ({}) and wireguard.interface = {:?} ({}) make the UAPI socket {}, \
                 which is the ingress's own socket under node.runtime_dir = {:?} ({}); choose another interface name or directory",
                wg.uapi_dir.display().to_string(),
                self.origin("wireguard.uapi_dir"),
                wg.interface,
                self.origin("wireguard.interface"),
                taken.display(),
                self.config.node.runtime_dir.display().to_string(),
                self.origin("node.runtime_dir"),
            );
            self.errors.push(ConfigError::Conflict { message });
        }
    }

    fn origin(&self, key: &str) -> String {
        match self.origins.get(key) {
            Some(origin) => format!("from {origin}"),
            None => "the default".to_owned(),
        }
    }
}

/// The key whose value may carry a password (a Redis URL's).
const SECRET_KEY: &str = "store.url";

/// A value as an error shows it: a mistyped `store.url` may carry a
/// password, and any URL's password is replaced by `***`.
fn shown(key: &Key, raw: Raw<'_>) -> String {
    let text = match raw {
        Raw::Text(text) => Some(text),
        Raw::Toml(toml::Value::String(text)) => Some(text.as_str()),
        Raw::Toml(_) => None,
    };
    match text {
        Some(text) if key.path == SECRET_KEY => {
            toml::Value::String(redact_store_url(text)).to_string()
        }
        _ => redact_urls(&raw.show()),
    }
}

/// Whether two TCP listeners would take the same connections: same port (not
/// 0, which the kernel picks) and the same address, or one of them a wildcard
/// that covers the other (`::` also covers IPv4, as Linux binds it dual-stack).
fn overlap(a: SocketAddr, b: SocketAddr) -> bool {
    let covers = |wide: IpAddr, narrow: IpAddr| {
        wide.is_unspecified() && (wide.is_ipv6() || narrow.is_ipv4())
    };
    let (ip_a, ip_b) = (a.ip().to_canonical(), b.ip().to_canonical());
    a.port() == b.port()
        && a.port() != 0
        && (ip_a == ip_b || covers(ip_a, ip_b) || covers(ip_b, ip_a))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("test address")
    }

    #[test]
    fn overlapping_listeners() {
        assert!(overlap(addr("127.0.0.1:80"), addr("127.0.0.1:80")));
        assert!(overlap(addr("0.0.0.0:80"), addr("127.0.0.1:80")));
        assert!(overlap(addr("[::]:80"), addr("127.0.0.1:80")));
        assert!(overlap(addr("[::ffff:127.0.0.1]:80"), addr("127.0.0.1:80")));
        assert!(!overlap(addr("0.0.0.0:80"), addr("[::1]:80")));
        assert!(!overlap(addr("127.0.0.1:80"), addr("127.0.0.2:80")));
        assert!(!overlap(addr("127.0.0.1:80"), addr("127.0.0.1:81")));
        assert!(!overlap(addr("127.0.0.1:0"), addr("127.0.0.1:0")));
    }

    #[test]
    fn a_password_in_a_mistyped_store_url_never_shows_in_errors() {
        let env = [(
            "BLIPLESS_STORE_URL".to_owned(),
            "postgres://user:hunter2@db:5432/x".to_owned(),
        )];
        let sets = ["store.url=redis:/:hunter2@r:6379/0".to_owned()];
        let errors = Config::load(None, env, &sets).expect_err("invalid store URLs");
        let text = errors.to_string();
        assert_eq!(errors.0.len(), 2, "{text}");
        assert!(!text.contains("hunter2"), "{text}");
        assert!(text.contains("postgres:***@db:5432/x"), "{text}");
        assert!(
            text.contains("--set store.url=redis:***@r:6379/0"),
            "{text}"
        );
        // A file whose syntax is broken on the line with the URL.
        let file = "[store]\nurl = \"redis://:hunter2@r:6379/0\" x\n";
        let errors = Config::from_toml_str(file, "blipless.toml", Vec::new(), &[])
            .expect_err("a syntax error");
        let text = errors.to_string();
        assert!(!text.contains("hunter2"), "{text}");
        let file = "[store]\nurl = [\"redis://:hunter2@r:6379/0\"]\n";
        let text = Config::from_toml_str(file, "blipless.toml", Vec::new(), &[])
            .expect_err("a list is not a URL")
            .to_string();
        assert!(!text.contains("hunter2"), "{text}");
    }

    #[test]
    fn a_bad_fleet_store_url_is_reported_with_the_others() {
        let sets = [
            "store.url=redis+sentinel://:hunter2@s1:x,s2/blipless/0".to_owned(),
            "listen.socks=nowhere".to_owned(),
        ];
        let errors = Config::load(None, Vec::new(), &sets).expect_err("two problems");
        let text = errors.to_string();
        assert_eq!(errors.0.len(), 2, "{text}");
        assert!(!text.contains("hunter2"), "{text}");
        assert!(text.contains("redis+sentinel"), "{text}");
        assert!(
            text.contains("this one: port \"x\" is not a number from 1 to 65535"),
            "{text}"
        );
        for good in [
            "redis+sentinel://:pw@s1:26379,s2:26379/blipless/0",
            "rediss+cluster://a:7000,b:7001",
        ] {
            let sets = [format!("store.url={good}")];
            let config = Config::load(None, Vec::new(), &sets).expect(good);
            assert_eq!(config.store.url, good);
        }
    }

    #[test]
    fn an_https_listener_needs_a_certificate_and_key_and_its_own_address() {
        let sets = [
            "listen.https=127.0.0.1:8080".to_owned(),
            "tls.key=/etc/blipless/proxy.key".to_owned(),
        ];
        let errors = Config::load(None, Vec::new(), &sets).expect_err("two problems");
        let text = errors.to_string();
        assert_eq!(errors.0.len(), 2, "{text}");
        assert!(text.contains("listen.http = \"127.0.0.1:8080\""), "{text}");
        assert!(text.contains("needs tls.certificate"), "{text}");
        let sets = [
            "listen.https=127.0.0.1:8443".to_owned(),
            "tls.certificate=/c.pem".to_owned(),
            "tls.key=/k.pem".to_owned(),
        ];
        let config = Config::load(None, Vec::new(), &sets).expect("sound");
        assert_eq!(config.listen.https, Some(addr("127.0.0.1:8443")));
        // Off by default, and a certificate alone is no listener.
        let config = Config::load(None, Vec::new(), &sets[1..]).expect("sound");
        assert_eq!(config.listen.https, None);
    }

    #[test]
    fn every_default_applies() {
        let loader = Loader::new();
        assert!(loader.errors.is_empty(), "{:?}", loader.errors);
        assert!(loader.origins.is_empty());
    }
}
