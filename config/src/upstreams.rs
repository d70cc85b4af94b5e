//! `[[egress.upstream]]`: the upstream providers a node can egress through
//! (docs/EGRESS.md).
//!
//! Each entry is a table:
//!
//! ```toml
//! [[egress.upstream]]
//! name = "dc-1"                  # unique; letters, digits, - _ .; not "direct"
//! kind = "socks5"
//! address = "proxy.example.net:1080"
//! username = "user-session-{session}"   # optional; may carry {client} and {session}
//! password_file = "/etc/blipless/dc-1.password"   # with username: both or neither
//! tags = ["eu", "datacenter"]    # optional
//! ```
//!
//! Upstreams are only read from the file (a list of tables has no sensible
//! `BLIPLESS_*` or `--set` form). Every problem of every entry is reported,
//! with the others, at load. The password file is read at load, its first
//! line without the line break, so a missing or unreadable one is a
//! configuration error, not a failure at the first connection; the password
//! is never printed ([`Secret`]).
//!
//! A WireGuard exit is a wg-quick file, as a VPN provider hands it out (or
//! as `blipless-ctl client add --wg` prints it on another blipless node):
//!
//! ```toml
//! [[egress.upstream]]
//! name = "wg-nl"
//! kind = "wireguard"
//! config = "/etc/blipless/exits/nl.conf"
//! tun = "blx0"                   # optional: the exit's TUN device (default blx<N>)
//! ```
//!
//! The file is read and checked at load ([`crate::wg_quick`]); its secrets
//! are never printed. Exits are numbered in configuration order from 0:
//! the N-th gets the firewall mark and routing table `FIRST_MARK + N`.

use std::collections::HashSet;
use std::fmt;
use std::path::PathBuf;

use crate::error::ConfigError;

/// The longest upstream username or password RFC 1929 can carry.
pub const MAX_CREDENTIAL: usize = 255;

/// A password: compared and cloned like a string, never shown.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// A password read from elsewhere than a `password_file` (tests).
    pub fn new(password: String) -> Self {
        Self(password)
    }

    /// The password itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// One upstream route.
#[derive(Debug, Clone, PartialEq)]
pub struct Upstream {
    /// Unique among upstreams; what policies, windows and `blipless-ctl
    /// egress` call it.
    pub name: String,
    /// Labels a client's policy can select by (`tags:eu,residential`).
    pub tags: Vec<String>,
    /// How to reach it.
    pub kind: UpstreamKind,
}

/// The kinds of upstream this build speaks.
#[derive(Debug, Clone, PartialEq)]
pub enum UpstreamKind {
    /// A SOCKS5 proxy (RFC 1928), with RFC 1929 credentials if set.
    Socks5(Socks5Upstream),
    /// A WireGuard exit, from a wg-quick file.
    Wireguard(WireguardExit),
}

/// A WireGuard exit: the peer, this end's key and tunnel address, and the
/// kernel state that steers traffic to it (docs/EGRESS.md, "WireGuard exits").
#[derive(Debug, Clone, PartialEq)]
pub struct WireguardExit {
    /// The wg-quick file it was read from.
    pub path: PathBuf,
    /// What the file says.
    pub file: crate::wg_quick::WgQuick,
    /// This end's IPv4 tunnel address (the file's first): what the exit
    /// knows this node as, and what traffic through it is masqueraded to.
    pub address: std::net::Ipv4Addr,
    /// The exit's TUN device (`blx<N>` unless `tun` is set).
    pub tun: String,
    /// The firewall mark and routing table that steer to it: `FIRST_MARK + N`.
    pub mark: u32,
}

/// The mark (and routing table number) of the first WireGuard exit; the
/// N-th (from 0, in configuration order) has `FIRST_MARK + N`.
pub const FIRST_MARK: u32 = 0x0b1e_5500;

/// A SOCKS5 provider.
#[derive(Debug, Clone, PartialEq)]
pub struct Socks5Upstream {
    /// `host:port`, resolved at each connect (providers rotate addresses).
    pub address: String,
    /// The username template: `{client}` becomes the client's name and
    /// `{session}` its sticky session on this node.
    pub username: Option<String>,
    /// The password, read from `password_file`.
    pub password: Option<Secret>,
}

/// Whether `name` is a valid upstream name or tag: 1–64 of letters, digits,
/// `-`, `_`, `.` (the same rule as the store's egress policies).
pub fn is_route_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The placeholders a username template may hold.
pub const PLACEHOLDERS: [&str; 2] = ["{client}", "{session}"];

/// Parses the `egress.upstream` value (an array of tables), pushing every
/// problem found to `errors`. Entries with problems are left out.
pub(crate) fn parse(
    value: &toml::Value,
    origin: &str,
    errors: &mut Vec<ConfigError>,
) -> Vec<Upstream> {
    let mut problem = |key: String, value: String, expected: &str| {
        errors.push(ConfigError::InvalidValue {
            origin: origin.to_owned(),
            key,
            value,
            expected: expected.to_owned(),
        })
    };
    let Some(entries) = value.as_array() else {
        problem(
            "egress.upstream".into(),
            value.to_string(),
            "a list of tables, written [[egress.upstream]]",
        );
        return Vec::new();
    };
    let mut upstreams = Vec::new();
    let mut names = HashSet::new();
    let mut tuns = HashSet::new();
    let mut exit_addresses = HashSet::new();
    let mut wireguard_exits: u32 = 0;
    for (index, entry) in entries.iter().enumerate() {
        let at = |field: &str| format!("egress.upstream[{index}].{field}");
        let Some(table) = entry.as_table() else {
            problem(
                format!("egress.upstream[{index}]"),
                entry.to_string(),
                "a table",
            );
            continue;
        };
        let mut ok = true;
        for key in table.keys() {
            if ![
                "name",
                "kind",
                "tags",
                "address",
                "username",
                "password_file",
                "config",
                "tun",
            ]
            .contains(&key.as_str())
            {
                // Not its value: a mistyped `password = "..."` is a secret.
                problem(
                    at(key),
                    "(value not shown)".into(),
                    "no such key (an upstream has name, kind and tags; socks5 address, username, password_file; wireguard config, tun)",
                );
                ok = false;
            }
        }
        let text = |field: &str| table.get(field).map(|v| v.as_str().ok_or(v));
        let name = match text("name") {
            Some(Ok(name)) if is_route_name(name) && name != "direct" => {
                if !names.insert(name.to_owned()) {
                    problem(
                        at("name"),
                        format!("{name:?}"),
                        "a name no other upstream has",
                    );
                    ok = false;
                }
                name.to_owned()
            }
            Some(Ok(name)) => {
                problem(
                    at("name"),
                    format!("{name:?}"),
                    "1-64 letters, digits, - _ or ., and not \"direct\" (the direct route's name)",
                );
                ok = false;
                String::new()
            }
            Some(Err(v)) => {
                problem(at("name"), v.to_string(), "a string");
                ok = false;
                String::new()
            }
            None => {
                problem(at("name"), "(missing)".into(), "a name for the upstream");
                ok = false;
                String::new()
            }
        };
        let mut tags = Vec::new();
        match table.get("tags") {
            None => {}
            Some(toml::Value::Array(list)) => {
                for tag in list {
                    match tag.as_str() {
                        Some(tag) if is_route_name(tag) => tags.push(tag.to_owned()),
                        _ => {
                            problem(
                                at("tags"),
                                tag.to_string(),
                                "tags of 1-64 letters, digits, - _ or .",
                            );
                            ok = false;
                        }
                    }
                }
            }
            Some(other) => {
                problem(
                    at("tags"),
                    other.to_string(),
                    "a list of tags, like [\"eu\"]",
                );
                ok = false;
            }
        }
        tags.sort();
        tags.dedup();
        let kind = match text("kind") {
            Some(Ok("socks5")) => socks5(table, &at, &mut problem),
            Some(Ok("wireguard")) => {
                let index = wireguard_exits;
                wireguard_exits += 1;
                wireguard(table, index, &at, &mut problem)
            }
            Some(Ok(other)) => {
                problem(at("kind"), format!("{other:?}"), KINDS);
                None
            }
            Some(Err(v)) => {
                problem(at("kind"), v.to_string(), KINDS);
                None
            }
            None => {
                problem(at("kind"), "(missing)".into(), KINDS);
                None
            }
        };
        if let Some(UpstreamKind::Wireguard(exit)) = &kind {
            if !tuns.insert(exit.tun.clone()) {
                problem(
                    at("tun"),
                    format!("{:?}", exit.tun),
                    "a TUN name no other exit has",
                );
                ok = false;
            }
            // Streams leave by their source address (docs/EGRESS.md): two
            // exits with one address would both send through the first.
            if !exit_addresses.insert(exit.address) {
                problem(
                    at("config"),
                    format!("{:?}", exit.path.display().to_string()),
                    &format!(
                        "a wg-quick file whose Address no other exit has ({} is another exit's; \
                         two exits of one VPN account share it: use one, or a device key per exit)",
                        exit.address
                    ),
                );
                ok = false;
            }
        }
        if let (true, Some(kind)) = (ok, kind) {
            upstreams.push(Upstream { name, tags, kind });
        }
    }
    upstreams
}

const KINDS: &str = "\"socks5\" or \"wireguard\"";

/// The WireGuard fields of one entry (the `index`-th exit), or `None` after
/// reporting what is wrong.
fn wireguard(
    table: &toml::Table,
    index: u32,
    at: &dyn Fn(&str) -> String,
    problem: &mut dyn FnMut(String, String, &str),
) -> Option<UpstreamKind> {
    let mut ok = true;
    for key in ["address", "username", "password_file"] {
        if let Some(value) = table.get(key) {
            problem(
                at(key),
                value.to_string(),
                "nothing: a wireguard exit takes config (its wg-quick file) and tun",
            );
            ok = false;
        }
    }
    let tun = match table.get("tun").map(|v| v.as_str().ok_or(v)) {
        None => format!("blx{index}"),
        Some(Ok(name)) if is_interface_name(name) => name.to_owned(),
        Some(Ok(name)) => {
            problem(
                at("tun"),
                format!("{name:?}"),
                "an interface name of 1-15 letters, digits, - _ .",
            );
            ok = false;
            String::new()
        }
        Some(Err(v)) => {
            problem(at("tun"), v.to_string(), "an interface name");
            ok = false;
            String::new()
        }
    };
    let path = match table.get("config").map(|v| v.as_str().ok_or(v)) {
        // Absolute: a relative path would mean one file to the daemons
        // (which run in `/`) and another to `blipless-ctl`.
        Some(Ok(path)) if path.starts_with('/') => PathBuf::from(path),
        Some(Ok(path)) => {
            problem(
                at("config"),
                format!("{path:?}"),
                "the absolute path of a wg-quick file",
            );
            return None;
        }
        Some(Err(v)) => {
            problem(
                at("config"),
                v.to_string(),
                "the absolute path of a wg-quick file",
            );
            return None;
        }
        None => {
            problem(
                at("config"),
                "(missing)".into(),
                "the absolute path of the exit's wg-quick file",
            );
            return None;
        }
    };
    let shown = format!("{:?}", path.display().to_string());
    let text = match crate::files::read_text(&path) {
        Ok(text) => text,
        Err(err) => {
            problem(
                at("config"),
                shown,
                &format!("a readable wg-quick file ({err})"),
            );
            return None;
        }
    };
    let file = match crate::wg_quick::parse(&text) {
        Ok(file) => file,
        Err(problems) => {
            for error in problems {
                problem(
                    at("config"),
                    shown.clone(),
                    &format!("a valid wg-quick file ({error})"),
                );
            }
            return None;
        }
    };
    let address = file.addresses.iter().find_map(|net| match net.addr() {
        std::net::IpAddr::V4(v4) => Some(v4),
        std::net::IpAddr::V6(_) => None,
    });
    let Some(address) = address else {
        problem(
            at("config"),
            shown,
            "a wg-quick file whose Address has an IPv4 address (exits are IPv4 only for now)",
        );
        return None;
    };
    ok.then_some(UpstreamKind::Wireguard(WireguardExit {
        path,
        file,
        address,
        tun,
        mark: FIRST_MARK + index,
    }))
}

/// A Linux interface name: 1–15 of letters, digits, `-`, `_`, `.`.
fn is_interface_name(name: &str) -> bool {
    (1..=15).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The SOCKS5 fields of one entry, or `None` after reporting what is wrong.
fn socks5(
    table: &toml::Table,
    at: &dyn Fn(&str) -> String,
    problem: &mut dyn FnMut(String, String, &str),
) -> Option<UpstreamKind> {
    let mut ok = true;
    if let Some(tun) = table.get("tun") {
        problem(
            at("tun"),
            tun.to_string(),
            "no tun for a socks5 upstream (tun is a wireguard exit's device)",
        );
        ok = false;
    }
    if table.contains_key("config") {
        problem(
            at("config"),
            table["config"].to_string(),
            "no config for a socks5 upstream (config is a wireguard exit's wg-quick file)",
        );
        ok = false;
    }
    let address = match table.get("address").map(|v| v.as_str().ok_or(v)) {
        Some(Ok(address)) if is_host_port(address) => Some(address.to_owned()),
        Some(Ok(address)) => {
            problem(
                at("address"),
                crate::error::redact_urls(&format!("{address:?}")),
                "host:port, like \"proxy.example.net:1080\" or \"[2001:db8::1]:1080\"",
            );
            None
        }
        Some(Err(v)) => {
            problem(at("address"), v.to_string(), "a string host:port");
            None
        }
        None => {
            problem(
                at("address"),
                "(missing)".into(),
                "the upstream's host:port",
            );
            None
        }
    };
    let username = match table.get("username").map(|v| v.as_str().ok_or(v)) {
        None => None,
        Some(Ok(username)) => match check_template(username) {
            Ok(()) => Some(username.to_owned()),
            Err(why) => {
                problem(at("username"), format!("{username:?}"), &why);
                ok = false;
                None
            }
        },
        Some(Err(v)) => {
            problem(at("username"), v.to_string(), "a string");
            ok = false;
            None
        }
    };
    let password = match table.get("password_file").map(|v| v.as_str().ok_or(v)) {
        None => None,
        Some(Err(v)) => {
            problem(at("password_file"), v.to_string(), "an absolute file path");
            ok = false;
            None
        }
        Some(Ok(path)) if !path.starts_with('/') => {
            problem(
                at("password_file"),
                format!("{path:?}"),
                "an absolute file path",
            );
            ok = false;
            None
        }
        Some(Ok(path)) => match read_password(&PathBuf::from(path)) {
            Ok(password) => Some(password),
            Err(why) => {
                problem(at("password_file"), format!("{path:?}"), &why);
                ok = false;
                None
            }
        },
    };
    // RFC 1929 sends a username and a password of 1-255 bytes each.
    match (
        table.contains_key("username"),
        table.contains_key("password_file"),
    ) {
        (false, true) => {
            problem(
                at("password_file"),
                "(set)".into(),
                "a username beside it (RFC 1929 sends both)",
            );
            ok = false;
        }
        (true, false) => {
            problem(
                at("username"),
                "(set)".into(),
                "a password_file beside it (RFC 1929 sends both)",
            );
            ok = false;
        }
        _ => {}
    }
    let address = address?;
    ok.then_some(UpstreamKind::Socks5(Socks5Upstream {
        address,
        username,
        password,
    }))
}

/// `host:port` with a port from 1 and a host without spaces (a name, an
/// IPv4 address or a bracketed IPv6 one).
fn is_host_port(text: &str) -> bool {
    let Some((host, port)) = text.rsplit_once(':') else {
        return false;
    };
    let port_ok = port.parse::<u16>().is_ok_and(|p| p > 0);
    let host_ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => {
            !host.is_empty()
                && host.len() <= 253
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
        }
    };
    port_ok && host_ok
}

/// A username template: 1–255 bytes once filled, only the known placeholders.
fn check_template(template: &str) -> Result<(), String> {
    if template.is_empty() {
        return Err("a non-empty username".into());
    }
    let mut rest = template.to_owned();
    for placeholder in PLACEHOLDERS {
        rest = rest.replace(placeholder, "");
    }
    if rest.contains('{') || rest.contains('}') {
        return Err("a username whose only placeholders are {client} and {session}".into());
    }
    // A client name is at most 64 bytes, a session 16: the filled username
    // must still fit RFC 1929's 255.
    let longest = template.len()
        + template.matches("{client}").count() * 64
        + template.matches("{session}").count() * 16;
    if longest > MAX_CREDENTIAL {
        return Err(format!(
            "a username of at most {MAX_CREDENTIAL} bytes with its placeholders filled"
        ));
    }
    Ok(())
}

/// The first line of the password file.
fn read_password(path: &std::path::Path) -> Result<Secret, String> {
    let text =
        crate::files::read_text(path).map_err(|err| format!("a readable password file ({err})"))?;
    let password = text.lines().next().unwrap_or("");
    if password.is_empty() || password.len() > MAX_CREDENTIAL {
        return Err(format!(
            "a file whose first line is the password (1-{MAX_CREDENTIAL} bytes)"
        ));
    }
    Ok(Secret(password.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_text(text: &str) -> (Vec<Upstream>, Vec<String>) {
        let value: toml::Table = text.parse().expect("toml");
        let mut errors = Vec::new();
        let upstreams = parse(&value["upstream"], "test.toml", &mut errors);
        (upstreams, errors.iter().map(|e| e.to_string()).collect())
    }

    /// The files an upstream names are absolute paths, as every path key's.
    #[test]
    fn relative_upstream_files_are_refused() {
        let (upstreams, errors) = parse_text(
            "[[upstream]]\nname = \"a\"\nkind = \"socks5\"\naddress = \"127.0.0.1:1080\"\n\
             username = \"u\"\npassword_file = \"pw\"\n\
             [[upstream]]\nname = \"b\"\nkind = \"wireguard\"\nconfig = \"b.conf\"\n",
        );
        assert!(upstreams.is_empty(), "{upstreams:?}");
        assert_eq!(errors.len(), 2, "{errors:#?}");
        assert!(
            errors[0].contains("password_file") && errors[0].contains("absolute"),
            "{errors:#?}"
        );
        assert!(
            errors[1].contains("config") && errors[1].contains("absolute"),
            "{errors:#?}"
        );
    }

    #[test]
    fn a_socks5_upstream_with_credentials_and_tags() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("pw");
        std::fs::write(&file, "s3cret\nignored\n").expect("write");
        let (upstreams, errors) = parse_text(&format!(
            "[[upstream]]\nname = \"dc-1\"\nkind = \"socks5\"\naddress = \"127.0.0.1:1080\"\n\
             username = \"u-{{client}}-session-{{session}}\"\npassword_file = {file:?}\n\
             tags = [\"eu\", \"dc\", \"eu\"]\n"
        ));
        assert!(errors.is_empty(), "{errors:?}");
        let UpstreamKind::Socks5(socks) = &upstreams[0].kind else {
            panic!("not socks5")
        };
        assert_eq!(socks.password.as_ref().map(Secret::expose), Some("s3cret"));
        assert_eq!(upstreams[0].tags, ["dc", "eu"]);
        assert!(
            !format!("{upstreams:?}").contains("s3cret"),
            "Debug hides it"
        );
    }

    #[test]
    fn every_problem_of_every_entry_is_reported() {
        let (upstreams, errors) = parse_text(
            "[[upstream]]\nname = \"direct\"\nkind = \"socks5\"\naddress = \"nohost\"\n\
             [[upstream]]\nname = \"a\"\nkind = \"ftp\"\ncolour = \"red\"\n\
             [[upstream]]\nname = \"b\"\nkind = \"socks5\"\naddress = \"h:1\"\nusername = \"{x}\"\n\
             password_file = \"/nonexistent/pw\"\n\
             [[upstream]]\nname = \"a\"\nkind = \"wireguard\"\nconfig = \"/nonexistent/wg.conf\"\n",
        );
        assert!(upstreams.is_empty(), "{upstreams:?}");
        let all = errors.join("\n");
        for expected in [
            "egress.upstream[0].name",
            "egress.upstream[0].address",
            "egress.upstream[1].kind",
            "egress.upstream[1].colour",
            "egress.upstream[2].username",
            "egress.upstream[2].password_file",
            "egress.upstream[3].name",
            "a readable wg-quick file",
        ] {
            assert!(all.contains(expected), "{expected} missing from:\n{all}");
        }
    }

    #[test]
    fn a_wireguard_exit_from_a_wg_quick_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("exit.conf");
        let key = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=";
        let peer = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=";
        std::fs::write(
            &file,
            format!(
                "[Interface]\nPrivateKey = {key}\nAddress = 10.2.0.2/32, fd00::2/128\nDNS = 10.2.0.1\n\n\
                 [Peer]\nPublicKey = {peer}\nEndpoint = 127.0.0.1:51820\nAllowedIPs = 0.0.0.0/0\n"
            ),
        )
        .expect("write");
        let other = dir.path().join("other.conf");
        std::fs::write(
            &other,
            std::fs::read_to_string(&file)
                .expect("read")
                .replace("10.2.0.2/32", "10.2.0.3/32"),
        )
        .expect("write");
        let (upstreams, errors) = parse_text(&format!(
            "[[upstream]]\nname = \"wg-a\"\nkind = \"wireguard\"\nconfig = {file:?}\n\
             [[upstream]]\nname = \"wg-b\"\nkind = \"wireguard\"\nconfig = {other:?}\ntun = \"exitb\"\n"
        ));
        assert!(errors.is_empty(), "{errors:?}");
        // Two exits with one tunnel address (one VPN account's two servers)
        // would both send their streams through the first.
        let (_, errors) = parse_text(&format!(
            "[[upstream]]\nname = \"wg-a\"\nkind = \"wireguard\"\nconfig = {file:?}\n\
             [[upstream]]\nname = \"wg-b\"\nkind = \"wireguard\"\nconfig = {file:?}\ntun = \"exitb\"\n"
        ));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].contains("egress.upstream[1].config")
                && errors[0].contains("10.2.0.2 is another exit's"),
            "{errors:?}"
        );
        let exits: Vec<&WireguardExit> = upstreams
            .iter()
            .map(|u| match &u.kind {
                UpstreamKind::Wireguard(exit) => exit,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(exits[0].address, std::net::Ipv4Addr::new(10, 2, 0, 2));
        assert_eq!((exits[0].tun.as_str(), exits[0].mark), ("blx0", FIRST_MARK));
        assert_eq!(
            (exits[1].tun.as_str(), exits[1].mark),
            ("exitb", FIRST_MARK + 1)
        );
        assert!(
            !format!("{upstreams:?}").contains(key),
            "no private key in Debug"
        );
        // Problems in the file are reported, and a socks5 key on an exit.
        std::fs::write(&file, "[Interface]\nAddress = nope\n").expect("write");
        let (_, errors) = parse_text(&format!(
            "[[upstream]]\nname = \"wg\"\nkind = \"wireguard\"\nconfig = {file:?}\naddress = \"h:1\"\n"
        ));
        let all = errors.join("\n");
        assert!(all.contains("egress.upstream[0].address"), "{all}");
        assert!(all.contains("a valid wg-quick file"), "{all}");
    }

    #[test]
    fn host_ports_and_templates() {
        for good in ["a.example:1", "127.0.0.1:1080", "[::1]:1080"] {
            assert!(is_host_port(good), "{good}");
        }
        for bad in [
            "", "a", "a:0", "a:70000", ":80", "a b:80", "[::1:80", "[x]:80",
        ] {
            assert!(!is_host_port(bad), "{bad}");
        }
        assert!(check_template("user-{client}-{session}").is_ok());
        assert!(check_template("{sess}").is_err());
        assert!(check_template(&"x".repeat(256)).is_err());
    }
}
