//! wg-quick configuration files: the `.conf` a VPN provider hands out (Mullvad,
//! Proton, AirVPN, IVPN, ...) and what `blipless-ctl client add --wg` prints,
//! parsed and checked as the description of a WireGuard *exit*: the one peer
//! this node egresses through.
//!
//! Sans-IO: [`parse`] takes the file's text, the caller reads the file. It does
//! not stop at the first mistake: it returns every problem it found
//! ([`WgQuickError`]), each with the 1-based line it is on.
//!
//! ```text
//! [Interface]
//! PrivateKey = yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=   # required, base64, 32 bytes
//! Address = 10.64.0.2/32, fc00:bbbb::2/128   # required; one or more, by commas or spaces
//! DNS = 10.64.0.1, example.lan                # optional; names (search domains) are dropped
//! MTU = 1420                                  # optional, 68 to 65535
//!
//! [Peer]                                      # exactly one
//! PublicKey = xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=   # required
//! PresharedKey = ...                          # optional
//! Endpoint = vpn.example.com:51820            # required; host:port, IPv6 as [addr]:port
//! AllowedIPs = 0.0.0.0/0, ::/0                # required; may be repeated
//! PersistentKeepalive = 25                    # optional, seconds; 0 or off: none
//! ```
//!
//! # What is tolerated
//! What real files have and `wg-quick` accepts: comments from `#` to the end of
//! the line (whole-line and trailing), blank lines, whitespace around `=` and
//! around values, CRLF line endings, a UTF-8 byte order mark, section headers
//! and keys in any letter case (`wg` compares them case-insensitively), list
//! items separated by commas and/or whitespace, empty list items, and several
//! `Address`, `DNS` and `AllowedIPs` lines (their items add up, as in
//! `wg-quick`). Two `[Interface]` headers are one interface, as for `wg`: a key
//! given under both is a duplicate.
//!
//! Keys `wg-quick` accepts under `[Interface]` that an exit has no use for are
//! accepted and ignored, value unchecked, duplicates allowed: [`IGNORED_KEYS`].
//! In particular `PreUp`/`PostUp`/`PreDown`/`PostDown` commands are never run.
//!
//! # What is refused
//! Anything else unknown (a key, a section, a line that is not `Key = value`),
//! a duplicate of a key that holds one value, a key that is not base64 or not
//! 32 bytes, an address or network that does not parse, an endpoint that is not
//! `host:port`, a number out of range, a missing `[Interface]`, `PrivateKey`,
//! `Address`, `[Peer]`, `PublicKey`, `Endpoint` or `AllowedIPs`, and a second
//! `[Peer]`: an exit has exactly one.
//!
//! # Secrets
//! No error message shows the value of a `PrivateKey` or `PresharedKey`, nor
//! any text that might be one: a line without `=`, or a key name or section
//! name that does not look like one (more than 24 characters, or characters
//! other than ASCII letters, digits, `-`, `_` and spaces: a base64 key pasted
//! on its own line) is reported without its text. [`WgQuick`]'s `Debug` shows
//! `***` for both keys. [`WgQuick::to_text`] does contain them: it is the file.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use base64::Engine;
use ipnet::IpNet;

use crate::wireguard_key::encode;

/// Keys `wg-quick` accepts under `[Interface]` that [`parse`] accepts and
/// ignores: the node picks its own port and firewall mark, manages its own
/// routes, and runs no hooks from a provider's file.
pub const IGNORED_KEYS: [&str; 8] = [
    "ListenPort",
    "FwMark",
    "Table",
    "PreUp",
    "PostUp",
    "PreDown",
    "PostDown",
    "SaveConfig",
];

/// The smallest `MTU` accepted: the least Linux allows an interface with IPv4.
pub const MIN_MTU: u16 = 68;

/// A parsed wg-quick file with one peer (the exit).
#[derive(Clone, PartialEq, Eq)]
pub struct WgQuick {
    /// `[Interface] PrivateKey`: this end's private key.
    pub private_key: [u8; 32],
    /// `[Interface] Address`: this end's tunnel addresses, IPv4 and/or IPv6; an
    /// address written without a prefix is a `/32` or `/128`. Never empty.
    pub addresses: Vec<IpNet>,
    /// `[Interface] DNS`: the resolvers to use through the tunnel; may be
    /// empty. Search domains on the `DNS` line are not in it.
    pub dns: Vec<IpAddr>,
    /// `[Interface] MTU`, when set.
    pub mtu: Option<u16>,
    /// The one `[Peer]`: the exit.
    pub peer: WgQuickPeer,
}

/// The exit: a wg-quick file's one `[Peer]`.
#[derive(Clone, PartialEq, Eq)]
pub struct WgQuickPeer {
    /// `PublicKey`: the exit's public key.
    pub public_key: [u8; 32],
    /// `PresharedKey`, when set.
    pub preshared_key: Option<[u8; 32]>,
    /// `Endpoint`: `host:port` where the host is a name as written, an IPv4
    /// address or a bracketed IPv6 address (addresses and the port in their
    /// canonical form: `[2001:db8::1]:51820`). Suits `ToSocketAddrs`.
    pub endpoint: String,
    /// `AllowedIPs`: the networks routed through the exit, as written (host
    /// bits are kept; an address without a prefix is a `/32` or `/128`). Never
    /// empty.
    pub allowed_ips: Vec<IpNet>,
    /// `PersistentKeepalive` in seconds; `None` when unset, `0` or `off`.
    pub persistent_keepalive: Option<u16>,
}

/// A section of a wg-quick file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    /// `[Interface]`: this end.
    Interface,
    /// `[Peer]`: the other end.
    Peer,
}

impl fmt::Display for Section {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Section::Interface => "[Interface]",
            Section::Peer => "[Peer]",
        })
    }
}

/// One problem in a wg-quick file. Every variant that can be placed has the
/// 1-based `line` it is on ([`WgQuickError::line`]); a missing key is placed
/// at its section's header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WgQuickError {
    /// A `[...]` header other than `[Interface]` and `[Peer]` (or a line that
    /// starts with `[` and is not a header). The lines under it are skipped
    /// until the next header. `name`: what is between the brackets, when it
    /// looks like a name (see the module's "Secrets").
    #[error(
        "line {line}: unknown section {}: a wg-quick file has [Interface] and [Peer]",
        shown_section(.name)
    )]
    UnknownSection {
        /// The header's line.
        line: usize,
        /// The section's name, when it is shown.
        name: Option<String>,
    },

    /// A `Key = value` line before the first section header.
    #[error(
        "line {line}: {} before any section: keys belong under [Interface] or [Peer]",
        shown_key(.key)
    )]
    KeyOutsideSection {
        /// The key's line.
        line: usize,
        /// The key, when it looks like a key name.
        key: Option<String>,
    },

    /// A line that is not blank, a comment, a section header or `Key = value`.
    /// Its text is not shown: it may be a key.
    #[error("line {line}: not a `Key = value` line or a section header (no `=` in it)")]
    MissingEquals {
        /// The line.
        line: usize,
    },

    /// A key the section does not have and that is not one of
    /// [`IGNORED_KEYS`] (those only under `[Interface]`).
    #[error("line {line}: unknown key {} in {section}{}", shown_key(.key), belongs_in(.key, *.section))]
    UnknownKey {
        /// The key's line.
        line: usize,
        /// The section it is in.
        section: Section,
        /// The key, when it looks like a key name.
        key: Option<String>,
    },

    /// A second `PrivateKey`, `MTU`, `PublicKey`, `PresharedKey`, `Endpoint` or
    /// `PersistentKeepalive` in one section; the first one counts.
    #[error("line {line}: a second {key} in {section} (the first is on line {first_line})")]
    DuplicateKey {
        /// The second one's line.
        line: usize,
        /// The first one's line.
        first_line: usize,
        /// The section.
        section: Section,
        /// The key, as wg-quick spells it.
        key: &'static str,
    },

    /// A `PrivateKey`, `PublicKey` or `PresharedKey` that is not standard
    /// base64 (as `wg genkey` writes). The value is never shown.
    #[error("line {line}: {key} is not base64 (a WireGuard key is 44 characters ending in `=`)")]
    BadBase64 {
        /// The key's line.
        line: usize,
        /// Which key, as wg-quick spells it.
        key: &'static str,
    },

    /// A `PrivateKey`, `PublicKey` or `PresharedKey` that is base64 but not
    /// of 32 bytes. The value is never shown.
    #[error("line {line}: {key} is {len} bytes, a WireGuard key is 32")]
    WrongKeyLength {
        /// The key's line.
        line: usize,
        /// Which key, as wg-quick spells it.
        key: &'static str,
        /// The decoded length.
        len: usize,
    },

    /// An `Address`, `AllowedIPs` or `DNS` item that is not an address or a
    /// network (`10.0.0.2`, `10.0.0.2/32`, `fd00::2/128`). For `DNS`, only an
    /// item that wg-quick would take for an address (digits and dots, or
    /// a `:`) is one; other items are search domains.
    #[error("line {line}: {key} item `{value}` is not an IP address or network")]
    BadAddress {
        /// The item's line.
        line: usize,
        /// `Address`, `AllowedIPs` or `DNS`.
        key: &'static str,
        /// The item as written.
        value: String,
    },

    /// An `Endpoint` that is not `host:port`.
    #[error("line {line}: Endpoint `{value}`: {reason}")]
    BadEndpoint {
        /// The endpoint's line.
        line: usize,
        /// The value as written.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// An `MTU` or `PersistentKeepalive` that is not a number in range.
    #[error("line {line}: {key} `{value}` is not {expected}")]
    BadNumber {
        /// The number's line.
        line: usize,
        /// `MTU` or `PersistentKeepalive`.
        key: &'static str,
        /// The value as written.
        value: String,
        /// What a valid value is.
        expected: &'static str,
    },

    /// The file has no `[Interface]` section.
    #[error("no [Interface] section")]
    MissingInterface,

    /// A required key is missing from its section: `PrivateKey` or `Address`
    /// from `[Interface]`, `PublicKey`, `Endpoint` or `AllowedIPs` from a
    /// `[Peer]`. `line` is the section's header. An `Address` or `AllowedIPs`
    /// line with no item in it counts as missing.
    #[error("line {line}: the {section} section has no {key}")]
    MissingKey {
        /// The section header's line.
        line: usize,
        /// The section.
        section: Section,
        /// The key, as wg-quick spells it.
        key: &'static str,
    },

    /// The file has no `[Peer]` section: nothing to egress through.
    #[error("no [Peer] section: an exit needs its one peer")]
    NoPeer,

    /// A second (third, ...) `[Peer]`: an exit has exactly one.
    #[error(
        "line {line}: a second [Peer] (the first is on line {first_line}): an exit has exactly one peer"
    )]
    TooManyPeers {
        /// The extra peer's header line.
        line: usize,
        /// The first peer's header line.
        first_line: usize,
    },
}

impl WgQuickError {
    /// The 1-based line the problem is on, `None` for [`Self::MissingInterface`]
    /// and [`Self::NoPeer`].
    pub fn line(&self) -> Option<usize> {
        match self {
            Self::UnknownSection { line, .. }
            | Self::KeyOutsideSection { line, .. }
            | Self::MissingEquals { line }
            | Self::UnknownKey { line, .. }
            | Self::DuplicateKey { line, .. }
            | Self::BadBase64 { line, .. }
            | Self::WrongKeyLength { line, .. }
            | Self::BadAddress { line, .. }
            | Self::BadEndpoint { line, .. }
            | Self::BadNumber { line, .. }
            | Self::MissingKey { line, .. }
            | Self::TooManyPeers { line, .. } => Some(*line),
            Self::MissingInterface | Self::NoPeer => None,
        }
    }
}

fn shown_section(name: &Option<String>) -> String {
    match name {
        Some(name) => format!("[{name}]"),
        None => "(name not shown)".to_owned(),
    }
}

fn shown_key(key: &Option<String>) -> String {
    match key {
        Some(key) => format!("`{key}`"),
        None => "(name not shown)".to_owned(),
    }
}

/// ": it belongs in [Peer]" for a key of the other section.
fn belongs_in(key: &Option<String>, section: Section) -> String {
    let Some(key) = key else {
        return String::new();
    };
    let other = match section {
        Section::Interface => Section::Peer,
        Section::Peer => Section::Interface,
    };
    let known = keys_of(other)
        .iter()
        .any(|def| def.name.eq_ignore_ascii_case(key))
        || (other == Section::Interface && is_ignored(key));
    if known {
        format!(": it belongs in {other}")
    } else {
        String::new()
    }
}

/// Whether `text` may be shown as a key or section name: it cannot be a key
/// (or a large part of one) pasted in the wrong place.
fn looks_like_name(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 24
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b' '))
}

fn shown_if_name(text: &str) -> Option<String> {
    looks_like_name(text).then(|| text.to_owned())
}

/// The public key of a private key (Curve25519, as `wg pubkey` computes it).
pub fn public_key_of(private: &[u8; 32]) -> [u8; 32] {
    let secret = x25519_dalek::StaticSecret::from(*private);
    x25519_dalek::PublicKey::from(&secret).to_bytes()
}

impl WgQuick {
    /// This end's public key, from [`Self::private_key`]: what the exit's
    /// operator (the provider) knows this end by.
    pub fn public_key(&self) -> [u8; 32] {
        public_key_of(&self.private_key)
    }

    /// The canonical wg-quick file of this configuration, ending in a
    /// newline: the keys in wg-quick's spelling and a fixed order, lists
    /// comma-separated, optional keys only when set. **It holds the private
    /// and preshared keys.** [`parse`] gives back an equal `WgQuick` from the
    /// text of a parsed one.
    pub fn to_text(&self) -> String {
        let mut out = String::from("[Interface]\n");
        out.push_str(&format!("PrivateKey = {}\n", encode(&self.private_key)));
        out.push_str(&format!("Address = {}\n", join(&self.addresses)));
        if !self.dns.is_empty() {
            out.push_str(&format!("DNS = {}\n", join(&self.dns)));
        }
        if let Some(mtu) = self.mtu {
            out.push_str(&format!("MTU = {mtu}\n"));
        }
        let peer = &self.peer;
        out.push_str("\n[Peer]\n");
        out.push_str(&format!("PublicKey = {}\n", encode(&peer.public_key)));
        if let Some(psk) = &peer.preshared_key {
            out.push_str(&format!("PresharedKey = {}\n", encode(psk)));
        }
        out.push_str(&format!("Endpoint = {}\n", peer.endpoint));
        out.push_str(&format!("AllowedIPs = {}\n", join(&peer.allowed_ips)));
        if let Some(seconds) = peer.persistent_keepalive {
            out.push_str(&format!("PersistentKeepalive = {seconds}\n"));
        }
        out
    }
}

fn join<T: fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Shows `***` in place of a secret.
struct Redacted;

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Shows a public key in base64.
struct PublicKey<'a>(&'a [u8; 32]);

impl fmt::Debug for PublicKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&encode(self.0))
    }
}

impl fmt::Debug for WgQuick {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WgQuick")
            .field("private_key", &Redacted)
            .field("addresses", &self.addresses)
            .field("dns", &self.dns)
            .field("mtu", &self.mtu)
            .field("peer", &self.peer)
            .finish()
    }
}

impl fmt::Debug for WgQuickPeer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WgQuickPeer")
            .field("public_key", &PublicKey(&self.public_key))
            .field("preshared_key", &self.preshared_key.map(|_| Redacted))
            .field("endpoint", &self.endpoint)
            .field("allowed_ips", &self.allowed_ips)
            .field("persistent_keepalive", &self.persistent_keepalive)
            .finish()
    }
}

/// What a key sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    PrivateKey,
    Address,
    Dns,
    Mtu,
    PublicKey,
    PresharedKey,
    Endpoint,
    AllowedIps,
    PersistentKeepalive,
}

/// A key a section has.
struct KeyDef {
    /// As wg-quick spells it (matched in any case).
    name: &'static str,
    field: Field,
    /// Whether it may be given more than once (lists add up).
    repeatable: bool,
}

const INTERFACE_KEYS: &[KeyDef] = &[
    KeyDef {
        name: "PrivateKey",
        field: Field::PrivateKey,
        repeatable: false,
    },
    KeyDef {
        name: "Address",
        field: Field::Address,
        repeatable: true,
    },
    KeyDef {
        name: "DNS",
        field: Field::Dns,
        repeatable: true,
    },
    KeyDef {
        name: "MTU",
        field: Field::Mtu,
        repeatable: false,
    },
];

const PEER_KEYS: &[KeyDef] = &[
    KeyDef {
        name: "PublicKey",
        field: Field::PublicKey,
        repeatable: false,
    },
    KeyDef {
        name: "PresharedKey",
        field: Field::PresharedKey,
        repeatable: false,
    },
    KeyDef {
        name: "Endpoint",
        field: Field::Endpoint,
        repeatable: false,
    },
    KeyDef {
        name: "AllowedIPs",
        field: Field::AllowedIps,
        repeatable: true,
    },
    KeyDef {
        name: "PersistentKeepalive",
        field: Field::PersistentKeepalive,
        repeatable: false,
    },
];

fn keys_of(section: Section) -> &'static [KeyDef] {
    match section {
        Section::Interface => INTERFACE_KEYS,
        Section::Peer => PEER_KEYS,
    }
}

fn is_ignored(key: &str) -> bool {
    IGNORED_KEYS
        .iter()
        .any(|ignored| ignored.eq_ignore_ascii_case(key))
}

/// What one section has given so far.
struct Acc {
    section: Section,
    /// The header's line.
    line: usize,
    /// Single-valued keys seen, with their first line.
    seen: Vec<(Field, usize)>,
    /// Keys given with a bad value (so not also missing).
    failed: Vec<Field>,
    key: Option<[u8; 32]>,
    preshared_key: Option<[u8; 32]>,
    nets: Vec<IpNet>,
    dns: Vec<IpAddr>,
    mtu: Option<u16>,
    endpoint: Option<String>,
    keepalive: Option<u16>,
}

impl Acc {
    fn new(section: Section, line: usize) -> Self {
        Self {
            section,
            line,
            seen: Vec::new(),
            failed: Vec::new(),
            key: None,
            preshared_key: None,
            nets: Vec::new(),
            dns: Vec::new(),
            mtu: None,
            endpoint: None,
            keepalive: None,
        }
    }

    /// Takes `value` for `def` (on `line`), or says what is wrong with it.
    fn set(&mut self, def: &KeyDef, value: &str, line: usize, errors: &mut Vec<WgQuickError>) {
        if !def.repeatable {
            if let Some(&(_, first_line)) = self.seen.iter().find(|(f, _)| *f == def.field) {
                errors.push(WgQuickError::DuplicateKey {
                    line,
                    first_line,
                    section: self.section,
                    key: def.name,
                });
                return;
            }
            self.seen.push((def.field, line));
        }
        let ok = match def.field {
            Field::PrivateKey | Field::PublicKey => {
                self.key = key(value, def.name, line, errors);
                self.key.is_some()
            }
            Field::PresharedKey => {
                self.preshared_key = key(value, def.name, line, errors);
                self.preshared_key.is_some()
            }
            Field::Address | Field::AllowedIps => {
                let mut ok = true;
                for item in items(value) {
                    match net(item) {
                        Some(net) => self.nets.push(net),
                        None => {
                            ok = false;
                            errors.push(WgQuickError::BadAddress {
                                line,
                                key: def.name,
                                value: item.to_owned(),
                            });
                        }
                    }
                }
                ok
            }
            Field::Dns => {
                for item in items(value) {
                    match item.parse::<IpAddr>() {
                        Ok(address) => self.dns.push(address),
                        // wg-quick's own test for a server rather than a search domain.
                        Err(_)
                            if item.bytes().all(|b| b.is_ascii_digit() || b == b'.')
                                || item.contains(':') =>
                        {
                            errors.push(WgQuickError::BadAddress {
                                line,
                                key: def.name,
                                value: item.to_owned(),
                            });
                        }
                        Err(_) => {} // a search domain
                    }
                }
                true
            }
            Field::Mtu => {
                self.mtu = number(value).filter(|mtu| *mtu >= MIN_MTU).or_else(|| {
                    errors.push(WgQuickError::BadNumber {
                        line,
                        key: def.name,
                        value: value.to_owned(),
                        expected: "a whole number from 68 to 65535",
                    });
                    None
                });
                self.mtu.is_some()
            }
            Field::PersistentKeepalive => {
                if value.eq_ignore_ascii_case("off") {
                    self.keepalive = None;
                    true
                } else if let Some(seconds) = number(value) {
                    self.keepalive = (seconds != 0).then_some(seconds);
                    true
                } else {
                    errors.push(WgQuickError::BadNumber {
                        line,
                        key: def.name,
                        value: value.to_owned(),
                        expected: "a whole number of seconds from 0 to 65535, or off",
                    });
                    false
                }
            }
            Field::Endpoint => match endpoint(value) {
                Ok(endpoint) => {
                    self.endpoint = Some(endpoint);
                    true
                }
                Err(reason) => {
                    errors.push(WgQuickError::BadEndpoint {
                        line,
                        value: value.to_owned(),
                        reason,
                    });
                    false
                }
            },
        };
        if !ok {
            self.failed.push(def.field);
        }
    }

    /// Records `key` as missing unless it was given with a bad value.
    fn missing(&self, field: Field, key: &'static str, errors: &mut Vec<WgQuickError>) {
        if !self.failed.contains(&field) {
            errors.push(WgQuickError::MissingKey {
                line: self.line,
                section: self.section,
                key,
            });
        }
    }

    fn interface(self, errors: &mut Vec<WgQuickError>) -> Option<Interface> {
        if self.key.is_none() {
            self.missing(Field::PrivateKey, "PrivateKey", errors);
        }
        if self.nets.is_empty() {
            self.missing(Field::Address, "Address", errors);
        }
        Some(Interface {
            private_key: self.key?,
            addresses: Some(self.nets).filter(|nets| !nets.is_empty())?,
            dns: self.dns,
            mtu: self.mtu,
        })
    }

    fn peer(self, errors: &mut Vec<WgQuickError>) -> Option<WgQuickPeer> {
        if self.key.is_none() {
            self.missing(Field::PublicKey, "PublicKey", errors);
        }
        if self.endpoint.is_none() {
            self.missing(Field::Endpoint, "Endpoint", errors);
        }
        if self.nets.is_empty() {
            self.missing(Field::AllowedIps, "AllowedIPs", errors);
        }
        Some(WgQuickPeer {
            public_key: self.key?,
            preshared_key: self.preshared_key,
            endpoint: self.endpoint?,
            allowed_ips: Some(self.nets).filter(|nets| !nets.is_empty())?,
            persistent_keepalive: self.keepalive,
        })
    }
}

struct Interface {
    private_key: [u8; 32],
    addresses: Vec<IpNet>,
    dns: Vec<IpAddr>,
    mtu: Option<u16>,
}

/// A 32-byte key in standard base64; the value never goes into an error.
fn key(
    value: &str,
    name: &'static str,
    line: usize,
    errors: &mut Vec<WgQuickError>,
) -> Option<[u8; 32]> {
    match base64::engine::general_purpose::STANDARD.decode(value) {
        Ok(bytes) => {
            let len = bytes.len();
            let key = <[u8; 32]>::try_from(bytes).ok();
            if key.is_none() {
                errors.push(WgQuickError::WrongKeyLength {
                    line,
                    key: name,
                    len,
                });
            }
            key
        }
        Err(_) => {
            errors.push(WgQuickError::BadBase64 { line, key: name });
            None
        }
    }
}

/// The items of a list value: split at commas and whitespace, empty ones skipped.
fn items(value: &str) -> impl Iterator<Item = &str> {
    value
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|item| !item.is_empty())
}

/// An address with a prefix, or without one (a host: `/32`, `/128`).
fn net(item: &str) -> Option<IpNet> {
    if item.contains('/') {
        item.parse().ok()
    } else {
        item.parse::<IpAddr>().ok().map(IpNet::from)
    }
}

/// A `u16` written in decimal digits only.
fn number(value: &str) -> Option<u16> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok()
}

/// `host:port` in canonical form, or why it is not one.
fn endpoint(value: &str) -> Result<String, &'static str> {
    if value.is_empty() {
        return Err("empty: expected host:port");
    }
    if let Some(rest) = value.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or("a `[` without its `]`: expected [IPv6 address]:port")?;
        let port = after
            .strip_prefix(':')
            .ok_or("no `:port` after the bracketed address")?;
        let address: Ipv6Addr = host
            .parse()
            .map_err(|_| "brackets hold an IPv6 address, and this is not one")?;
        return Ok(format!("[{address}]:{}", port_number(port)?));
    }
    let (host, port) = value
        .rsplit_once(':')
        .ok_or("no port: expected host:port")?;
    if host.contains(':') {
        return Err("an IPv6 address needs brackets, as in [2001:db8::1]:51820");
    }
    let port = port_number(port)?;
    if let Ok(address) = host.parse::<Ipv4Addr>() {
        return Ok(format!("{address}:{port}"));
    }
    if !is_host_name(host) {
        return Err("the host is not an IPv4 address or a host name");
    }
    Ok(format!("{host}:{port}"))
}

fn port_number(port: &str) -> Result<u16, &'static str> {
    number(port)
        .filter(|port| *port != 0)
        .ok_or("the port is not a number from 1 to 65535")
}

/// A DNS name: dot-separated labels of letters, digits, `-` and `_` (not
/// starting or ending with `-`), at most 63 characters each and 253 in all,
/// an optional final dot, and a last label that is not all digits (that
/// would be a mistyped IPv4 address).
fn is_host_name(host: &str) -> bool {
    let name = host.strip_suffix('.').unwrap_or(host);
    if name.is_empty() || name.len() > 253 {
        return false;
    }
    let labels_ok = name.split('.').all(|label| {
        !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
    });
    let last_numeric = name
        .rsplit('.')
        .next()
        .is_some_and(|last| last.bytes().all(|b| b.is_ascii_digit()));
    labels_ok && !last_numeric
}

/// Where a line's keys go.
enum Current {
    /// Before any header.
    Nowhere,
    /// Under an unknown header: skipped.
    Unknown,
    Interface,
    /// Under the n-th `[Peer]`.
    Peer(usize),
}

/// Parses and checks a wg-quick file with one peer (the exit). `Err` holds
/// every problem found, in line order (those with no line last); never empty.
pub fn parse(text: &str) -> Result<WgQuick, Vec<WgQuickError>> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut errors = Vec::new();
    let mut interface: Option<Acc> = None;
    let mut peers: Vec<Acc> = Vec::new();
    let mut current = Current::Nowhere;

    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let content = raw.split_once('#').map_or(raw, |(before, _)| before).trim();
        if content.is_empty() {
            continue;
        }
        if let Some(rest) = content.strip_prefix('[') {
            let name = rest.strip_suffix(']').map(str::trim);
            current = match name {
                Some(name) if name.eq_ignore_ascii_case("Interface") => {
                    interface.get_or_insert_with(|| Acc::new(Section::Interface, line));
                    Current::Interface
                }
                Some(name) if name.eq_ignore_ascii_case("Peer") => {
                    if let Some(first) = peers.first() {
                        errors.push(WgQuickError::TooManyPeers {
                            line,
                            first_line: first.line,
                        });
                    }
                    peers.push(Acc::new(Section::Peer, line));
                    Current::Peer(peers.len() - 1)
                }
                _ => {
                    errors.push(WgQuickError::UnknownSection {
                        line,
                        name: name.and_then(shown_if_name),
                    });
                    Current::Unknown
                }
            };
            continue;
        }
        let Some((key, value)) = content.split_once('=') else {
            errors.push(WgQuickError::MissingEquals { line });
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        let acc = match current {
            Current::Nowhere => {
                errors.push(WgQuickError::KeyOutsideSection {
                    line,
                    key: shown_if_name(key),
                });
                continue;
            }
            Current::Unknown => continue,
            Current::Interface => interface.as_mut(),
            Current::Peer(n) => peers.get_mut(n),
        };
        let Some(acc) = acc else {
            continue; // not reached: `current` names a section that exists
        };
        match keys_of(acc.section)
            .iter()
            .find(|def| def.name.eq_ignore_ascii_case(key))
        {
            Some(def) => acc.set(def, value, line, &mut errors),
            None if acc.section == Section::Interface && is_ignored(key) => {}
            None => errors.push(WgQuickError::UnknownKey {
                line,
                section: acc.section,
                key: shown_if_name(key),
            }),
        }
    }

    let interface = match interface {
        Some(acc) => acc.interface(&mut errors),
        None => {
            errors.push(WgQuickError::MissingInterface);
            None
        }
    };
    if peers.is_empty() {
        errors.push(WgQuickError::NoPeer);
    }
    let mut first_peer = None;
    for (n, acc) in peers.into_iter().enumerate() {
        let peer = acc.peer(&mut errors);
        if n == 0 {
            first_peer = peer;
        }
    }

    match (interface, first_peer) {
        (Some(interface), Some(peer)) if errors.is_empty() => Ok(WgQuick {
            private_key: interface.private_key,
            addresses: interface.addresses,
            dns: interface.dns,
            mtu: interface.mtu,
            peer,
        }),
        _ => {
            // Every missing piece has pushed its error; sort into file order.
            errors.sort_by_key(|error| error.line().unwrap_or(usize::MAX));
            Err(errors)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Keys from wg(8)'s examples: all valid base64 32-byte keys.
    const PRIV: &str = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=";
    const PUB: &str = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=";
    const PSK: &str = "gN65BkIKy1eCE9pP1wdc8ROUtkHLF2PfAqYdyYBz6EA=";

    fn bytes(b64: &str) -> [u8; 32] {
        crate::wireguard_key::decode(b64).expect("a test key")
    }

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|s| s.parse().expect("network")).collect()
    }

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|s| s.parse().expect("address")).collect()
    }

    fn ok(text: &str) -> WgQuick {
        match parse(text) {
            Ok(config) => config,
            Err(errors) => panic!("{errors:#?}\n{text}"),
        }
    }

    fn errors(text: &str) -> Vec<WgQuickError> {
        match parse(text) {
            Ok(config) => panic!("parsed: {config:?}\n{text}"),
            Err(errors) => {
                assert!(!errors.is_empty());
                errors
            }
        }
    }

    /// A valid file; `interface` lines go after its line 3 (so the first is
    /// line 4) and `peer` lines after the peer's three keys (so, with `n`
    /// interface lines, the header is line 4 + n and the first is line 8 + n).
    fn valid_with(interface: &[&str], peer: &[&str]) -> String {
        let mut text = format!("[Interface]\nPrivateKey = {PRIV}\nAddress = 10.0.0.2/32\n");
        for line in interface {
            text.push_str(line);
            text.push('\n');
        }
        text.push_str(&format!(
            "[Peer]\nPublicKey = {PUB}\nEndpoint = 192.0.2.1:51820\nAllowedIPs = 0.0.0.0/0\n"
        ));
        for line in peer {
            text.push_str(line);
            text.push('\n');
        }
        text
    }

    fn valid() -> String {
        valid_with(&[], &[])
    }

    /// The one error of `text`.
    fn one_error(text: &str) -> WgQuickError {
        let mut all = errors(text);
        assert_eq!(all.len(), 1, "{all:#?}\n{text}");
        all.remove(0)
    }

    fn round_trips(config: &WgQuick) {
        let text = config.to_text();
        assert_eq!(&ok(&text), config, "{text}");
        assert_eq!(ok(&text).to_text(), text);
    }

    #[test]
    fn a_mullvad_file() {
        let text = format!(
            "[Interface]\n\
             # Device: Happy Frog\n\
             PrivateKey = {PRIV}\n\
             Address = 10.68.23.101/32,fc00:bbbb:bbbb:bb01::5:1764/128\n\
             DNS = 10.64.0.1\n\
             \n\
             [Peer]\n\
             PublicKey = {PUB}\n\
             AllowedIPs = 0.0.0.0/0,::0/0\n\
             Endpoint = 185.213.154.68:51820\n"
        );
        let config = ok(&text);
        assert_eq!(
            config,
            WgQuick {
                private_key: bytes(PRIV),
                addresses: nets(&["10.68.23.101/32", "fc00:bbbb:bbbb:bb01::5:1764/128"]),
                dns: ips(&["10.64.0.1"]),
                mtu: None,
                peer: WgQuickPeer {
                    public_key: bytes(PUB),
                    preshared_key: None,
                    endpoint: "185.213.154.68:51820".to_owned(),
                    allowed_ips: nets(&["0.0.0.0/0", "::/0"]),
                    persistent_keepalive: None,
                },
            }
        );
        round_trips(&config);
    }

    #[test]
    fn a_proton_file_with_comments_dns_and_ipv6() {
        let text = format!(
            "[Interface]\n\
             # Key for laptop\n\
             # Bouncing = 5\n\
             # NetShield = 1\n\
             # Moderate NAT = off\n\
             # NAT-PMP (Port Forwarding) = off\n\
             # VPN Accelerator = on\n\
             PrivateKey = {PRIV}\n\
             Address = 10.2.0.2/32, 2a07:b944::2:2/128\n\
             DNS = 10.2.0.1, 2a07:b944::2:1\n\
             \n\
             [Peer]\n\
             # CH#12\n\
             PublicKey = {PUB}\n\
             AllowedIPs = 0.0.0.0/0, ::/0\n\
             Endpoint = [2a07:b944:0:0::1]:51820   # Zurich, over IPv6\n"
        );
        let config = ok(&text);
        assert_eq!(config.private_key, bytes(PRIV));
        assert_eq!(
            config.addresses,
            nets(&["10.2.0.2/32", "2a07:b944::2:2/128"])
        );
        assert_eq!(config.dns, ips(&["10.2.0.1", "2a07:b944::2:1"]));
        assert_eq!(config.peer.public_key, bytes(PUB));
        assert_eq!(config.peer.endpoint, "[2a07:b944::1]:51820", "canonical");
        assert_eq!(config.peer.allowed_ips, nets(&["0.0.0.0/0", "::/0"]));
        round_trips(&config);
    }

    #[test]
    fn an_airvpn_file_with_preshared_key_mtu_and_keepalive() {
        let text = format!(
            "[Interface]\n\
             Address = 10.128.42.7/32, fd7d:76ee:e68f:a993:1234:5678:9abc:def0/128\n\
             PrivateKey = {PRIV}\n\
             MTU = 1320\n\
             DNS = 10.128.0.1, fd7d:76ee:e68f:a993::1\n\
             \n\
             [Peer]\n\
             PublicKey = {PUB}\n\
             PresharedKey = {PSK}\n\
             Endpoint = europe3.vpn.airdns.org:1637\n\
             AllowedIPs = 0.0.0.0/0, ::/0\n\
             PersistentKeepalive = 15\n"
        );
        let config = ok(&text);
        assert_eq!(config.mtu, Some(1320));
        assert_eq!(config.peer.preshared_key, Some(bytes(PSK)));
        assert_eq!(config.peer.endpoint, "europe3.vpn.airdns.org:1637");
        assert_eq!(config.peer.persistent_keepalive, Some(15));
        round_trips(&config);
    }

    #[test]
    fn wg_quicks_own_keys_are_accepted_and_ignored() {
        let text = format!(
            "[Interface]\n\
             PrivateKey = {PRIV}\n\
             Address = 172.27.9.4\n\
             DNS = 172.16.0.1\n\
             ListenPort = 51820\n\
             FwMark = 0xca6c\n\
             Table = off\n\
             PreUp = echo up\n\
             PostUp = iptables -I OUTPUT ! -o %i -m mark ! --mark $(wg show %i fwmark) -j REJECT\n\
             PostUp = echo twice is fine\n\
             PreDown = true\n\
             PostDown = iptables -D OUTPUT ! -o %i -j REJECT\n\
             SaveConfig = true\n\
             postup = any case\n\
             \n\
             [Peer]\n\
             PublicKey = {PUB}\n\
             Endpoint = nl3.wg.ivpn.net:2049\n\
             AllowedIPs = 0.0.0.0/0\n"
        );
        let config = ok(&text);
        assert_eq!(config.addresses, nets(&["172.27.9.4/32"]));
        assert_eq!(config.peer.endpoint, "nl3.wg.ivpn.net:2049");
        // Only under [Interface], as for wg-quick.
        assert_eq!(
            one_error(&valid_with(&[], &["ListenPort = 51820"])),
            WgQuickError::UnknownKey {
                line: 8,
                section: Section::Peer,
                key: Some("ListenPort".to_owned()),
            }
        );
    }

    /// Exactly what `WgQuickConfig::render` in ctl/src/wg_clients.rs prints for
    /// `blipless-ctl client add --wg` (the ctl crate depends on this one, so
    /// the shape is copied here); `to_text` writes the same shape back.
    #[test]
    fn the_config_blipless_ctl_prints() {
        let text = format!(
            "[Interface]\n\
             PrivateKey = {PRIV}\n\
             Address = 10.64.0.2/32\n\
             \n\
             [Peer]\n\
             PublicKey = {PUB}\n\
             Endpoint = vpn.example.com:51820\n\
             AllowedIPs = 0.0.0.0/0\n\
             PersistentKeepalive = 25\n"
        );
        let config = ok(&text);
        assert_eq!(
            config,
            WgQuick {
                private_key: bytes(PRIV),
                addresses: nets(&["10.64.0.2/32"]),
                dns: vec![],
                mtu: None,
                peer: WgQuickPeer {
                    public_key: bytes(PUB),
                    preshared_key: None,
                    endpoint: "vpn.example.com:51820".to_owned(),
                    allowed_ips: nets(&["0.0.0.0/0"]),
                    persistent_keepalive: Some(25),
                },
            }
        );
        assert_eq!(config.to_text(), text);
        // With the DNS line an operator may add.
        let with_dns = text.replace("/32\n", "/32\nDNS = 9.9.9.9\n");
        assert_eq!(ok(&with_dns).dns, ips(&["9.9.9.9"]));
        assert_eq!(ok(&with_dns).to_text(), with_dns);
    }

    #[test]
    fn case_whitespace_and_list_forms() {
        let text = format!(
            "  [ interface ]  \n\
             privatekey={PRIV}\n\
             \tADDRESS   =  10.0.0.2 fd00::2 ,, \n\
             Address = 10.0.0.3/24\n\
             dns = 1.1.1.1 example.lan, corp.example,2606:4700:4700::1111\n\
             [PEER]\n\
             publickey\t=\t{PUB}\n\
             endPOINT=Host-1.Example.NET.:443\n\
             allowedips = 0.0.0.0/1\n\
             AllowedIPs = 128.0.0.0/1, ::/0,\n\
             persistentkeepalive = OFF\n"
        );
        let config = ok(&text);
        assert_eq!(
            config.addresses,
            nets(&["10.0.0.2/32", "fd00::2/128", "10.0.0.3/24"]),
            "default prefixes, host bits kept, lines add up"
        );
        assert_eq!(config.dns, ips(&["1.1.1.1", "2606:4700:4700::1111"]));
        assert_eq!(config.peer.endpoint, "Host-1.Example.NET.:443");
        assert_eq!(
            config.peer.allowed_ips,
            nets(&["0.0.0.0/1", "128.0.0.0/1", "::/0"])
        );
        assert_eq!(config.peer.persistent_keepalive, None);
        round_trips(&config);
    }

    #[test]
    fn two_interface_headers_are_one_interface() {
        let text = format!(
            "[Interface]\nPrivateKey = {PRIV}\n[Peer]\nPublicKey = {PUB}\n\
             Endpoint = h.example:1\nAllowedIPs = ::/0\n[Interface]\nAddress = fd00::2\n"
        );
        assert_eq!(ok(&text).addresses, nets(&["fd00::2/128"]));
        let twice = format!("{text}[interface]\nPrivateKey = {PRIV}\n");
        assert_eq!(
            one_error(&twice),
            WgQuickError::DuplicateKey {
                line: 10,
                first_line: 2,
                section: Section::Interface,
                key: "PrivateKey",
            }
        );
    }

    #[test]
    fn keepalive_zero_and_off_are_none() {
        for (value, expected) in [
            ("0", None),
            ("off", None),
            ("Off", None),
            ("25", Some(25)),
            ("65535", Some(65535)),
        ] {
            let text = valid_with(&[], &[&format!("PersistentKeepalive = {value}")]);
            assert_eq!(ok(&text).peer.persistent_keepalive, expected, "{value}");
        }
    }

    #[test]
    fn crlf_and_a_byte_order_mark() {
        let lf = valid_with(
            &["DNS = 10.0.0.1 # resolver"],
            &["PersistentKeepalive = 25"],
        );
        let crlf = format!("\u{feff}{}", lf.replace('\n', "\r\n"));
        assert_eq!(ok(&crlf), ok(&lf));
        // Without the final line break too.
        assert_eq!(ok(crlf.trim_end()), ok(&lf));
        // Line numbers are unchanged by CRLF and the BOM.
        let bad = format!(
            "\u{feff}{}",
            valid_with(&["MTU = 1"], &[]).replace('\n', "\r\n")
        );
        assert_eq!(
            one_error(&bad),
            WgQuickError::BadNumber {
                line: 4,
                key: "MTU",
                value: "1".to_owned(),
                expected: "a whole number from 68 to 65535",
            }
        );
    }

    #[test]
    fn endpoints() {
        for (value, expected) in [
            ("192.0.2.1:51820", "192.0.2.1:51820"),
            ("vpn.example.com:51820", "vpn.example.com:51820"),
            ("localhost:1", "localhost:1"),
            (
                "se-sto-wg-001.relays.mullvad.net:51820",
                "se-sto-wg-001.relays.mullvad.net:51820",
            ),
            ("[2001:DB8:0::1]:051820", "[2001:db8::1]:51820"),
            ("[::ffff:192.0.2.1]:65535", "[::ffff:192.0.2.1]:65535"),
        ] {
            let text = valid().replace("192.0.2.1:51820", value);
            assert_eq!(ok(&text).peer.endpoint, expected, "{value}");
        }
        for (value, reason) in [
            ("", "empty"),
            ("vpn.example.com", "no port"),
            ("vpn.example.com:", "port"),
            ("vpn.example.com:0", "port"),
            ("vpn.example.com:65536", "port"),
            ("vpn.example.com:+1", "port"),
            ("vpn.example.com:http", "port"),
            ("2001:db8::1:51820", "brackets"),
            ("[2001:db8::1:51820", "`]`"),
            ("[2001:db8::1]51820", "no `:port`"),
            ("[192.0.2.1]:51820", "IPv6"),
            ("192.0.2.300:51820", "host"),
            ("1.2.3:51820", "host"),
            ("-bad.example:1", "host"),
            ("bad..example:1", "host"),
            ("b\u{e4}d.example:1", "host"),
            (":51820", "host"),
        ] {
            let text = valid().replace("192.0.2.1:51820", value);
            match one_error(&text) {
                WgQuickError::BadEndpoint {
                    line: 6,
                    value: shown,
                    reason: why,
                } => {
                    assert_eq!(shown, value);
                    assert!(why.contains(reason), "{value}: {why}");
                }
                other => panic!("{value}: {other:?}"),
            }
        }
    }

    #[test]
    fn every_error_kind_with_its_line() {
        let cases: Vec<(String, WgQuickError)> = vec![
            (
                valid().replace("[Peer]", "[Peers]\nFoo = skipped\n[Peer]"),
                WgQuickError::UnknownSection {
                    line: 4,
                    name: Some("Peers".to_owned()),
                },
            ),
            (
                valid_with(&["[Interface"], &[]),
                WgQuickError::UnknownSection {
                    line: 4,
                    name: None,
                },
            ),
            (
                format!("# a comment\nMTU = 1420\n{}", valid()),
                WgQuickError::KeyOutsideSection {
                    line: 2,
                    key: Some("MTU".to_owned()),
                },
            ),
            (
                valid_with(&["Address 10.0.0.3"], &[]),
                WgQuickError::MissingEquals { line: 4 },
            ),
            (
                valid_with(&["Foo = 1"], &[]),
                WgQuickError::UnknownKey {
                    line: 4,
                    section: Section::Interface,
                    key: Some("Foo".to_owned()),
                },
            ),
            (
                valid_with(&[], &["Address = 10.0.0.3"]),
                WgQuickError::UnknownKey {
                    line: 8,
                    section: Section::Peer,
                    key: Some("Address".to_owned()),
                },
            ),
            (
                valid_with(&[&format!("privatekey = {PUB}")], &[]),
                WgQuickError::DuplicateKey {
                    line: 4,
                    first_line: 2,
                    section: Section::Interface,
                    key: "PrivateKey",
                },
            ),
            (
                valid_with(&[], &["Endpoint = 192.0.2.2:1"]),
                WgQuickError::DuplicateKey {
                    line: 8,
                    first_line: 6,
                    section: Section::Peer,
                    key: "Endpoint",
                },
            ),
            (
                valid_with(&["MTU = 1420", "MTU = 1280"], &[]),
                WgQuickError::DuplicateKey {
                    line: 5,
                    first_line: 4,
                    section: Section::Interface,
                    key: "MTU",
                },
            ),
            (
                valid().replace(PRIV, "not*base64"),
                WgQuickError::BadBase64 {
                    line: 2,
                    key: "PrivateKey",
                },
            ),
            (
                valid().replace(PUB, &PUB[..43]),
                WgQuickError::BadBase64 {
                    line: 5,
                    key: "PublicKey",
                },
            ),
            (
                valid().replace(PRIV, &encode31(PRIV)),
                WgQuickError::WrongKeyLength {
                    line: 2,
                    key: "PrivateKey",
                    len: 31,
                },
            ),
            (
                valid_with(&[], &["PresharedKey ="]),
                WgQuickError::WrongKeyLength {
                    line: 8,
                    key: "PresharedKey",
                    len: 0,
                },
            ),
            (
                valid_with(&["Address = 10.0.0.3/33"], &[]),
                WgQuickError::BadAddress {
                    line: 4,
                    key: "Address",
                    value: "10.0.0.3/33".to_owned(),
                },
            ),
            (
                valid_with(&["Address = fd00::1/129"], &[]),
                WgQuickError::BadAddress {
                    line: 4,
                    key: "Address",
                    value: "fd00::1/129".to_owned(),
                },
            ),
            (
                valid_with(&[], &["AllowedIPs = ::/0, 10.0.0.0/8/8"]),
                WgQuickError::BadAddress {
                    line: 8,
                    key: "AllowedIPs",
                    value: "10.0.0.0/8/8".to_owned(),
                },
            ),
            (
                valid_with(&["DNS = 10.0.0.1, 10.0.0.256, lan"], &[]),
                WgQuickError::BadAddress {
                    line: 4,
                    key: "DNS",
                    value: "10.0.0.256".to_owned(),
                },
            ),
            (
                valid_with(&["DNS = fe80::1%eth0"], &[]),
                WgQuickError::BadAddress {
                    line: 4,
                    key: "DNS",
                    value: "fe80::1%eth0".to_owned(),
                },
            ),
            (
                valid().replace("192.0.2.1:51820", "192.0.2.1"),
                WgQuickError::BadEndpoint {
                    line: 6,
                    value: "192.0.2.1".to_owned(),
                    reason: "no port: expected host:port",
                },
            ),
            (
                valid_with(&["MTU = 67"], &[]),
                WgQuickError::BadNumber {
                    line: 4,
                    key: "MTU",
                    value: "67".to_owned(),
                    expected: "a whole number from 68 to 65535",
                },
            ),
            (
                valid_with(&["MTU = 65536"], &[]),
                WgQuickError::BadNumber {
                    line: 4,
                    key: "MTU",
                    value: "65536".to_owned(),
                    expected: "a whole number from 68 to 65535",
                },
            ),
            (
                valid_with(&[], &["PersistentKeepalive = -1"]),
                WgQuickError::BadNumber {
                    line: 8,
                    key: "PersistentKeepalive",
                    value: "-1".to_owned(),
                    expected: "a whole number of seconds from 0 to 65535, or off",
                },
            ),
            (
                format!("[Peer]\nPublicKey = {PUB}\nEndpoint = h:1\nAllowedIPs = ::/0\n"),
                WgQuickError::MissingInterface,
            ),
            (
                valid().replace(&format!("PrivateKey = {PRIV}\n"), ""),
                WgQuickError::MissingKey {
                    line: 1,
                    section: Section::Interface,
                    key: "PrivateKey",
                },
            ),
            (
                valid().replace("Address = 10.0.0.2/32", "Address = , "),
                WgQuickError::MissingKey {
                    line: 1,
                    section: Section::Interface,
                    key: "Address",
                },
            ),
            (
                format!("[Interface]\nPrivateKey = {PRIV}\nAddress = 10.0.0.2\n"),
                WgQuickError::NoPeer,
            ),
            (
                valid().replace(&format!("PublicKey = {PUB}\n"), ""),
                WgQuickError::MissingKey {
                    line: 4,
                    section: Section::Peer,
                    key: "PublicKey",
                },
            ),
            (
                valid().replace("Endpoint = 192.0.2.1:51820\n", ""),
                WgQuickError::MissingKey {
                    line: 4,
                    section: Section::Peer,
                    key: "Endpoint",
                },
            ),
            (
                valid().replace("AllowedIPs = 0.0.0.0/0\n", "AllowedIPs =\n"),
                WgQuickError::MissingKey {
                    line: 4,
                    section: Section::Peer,
                    key: "AllowedIPs",
                },
            ),
            (
                format!(
                    "{}\n[Peer]\nPublicKey = {PSK}\nEndpoint = 192.0.2.9:1\nAllowedIPs = ::/0\n",
                    valid()
                ),
                WgQuickError::TooManyPeers {
                    line: 9,
                    first_line: 4,
                },
            ),
        ];
        for (text, expected) in cases {
            let error = one_error(&text);
            assert_eq!(error, expected, "{text}");
            let shown = error.to_string();
            match error.line() {
                Some(line) => assert!(shown.starts_with(&format!("line {line}: ")), "{shown}"),
                None => assert!(!shown.starts_with("line"), "{shown}"),
            }
        }
    }

    /// `key` decoded, cut to 31 bytes and encoded again.
    fn encode31(key: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(&bytes(key)[..31])
    }

    #[test]
    fn messages_explain_themselves() {
        let shown = |text: &str| one_error(text).to_string();
        assert_eq!(
            shown(&valid_with(&["PublicKey = x"], &[])),
            "line 4: unknown key `PublicKey` in [Interface]: it belongs in [Peer]"
        );
        assert_eq!(
            shown(&valid_with(&[], &["MTU = 1420"])),
            "line 8: unknown key `MTU` in [Peer]: it belongs in [Interface]"
        );
        assert_eq!(
            shown(&valid_with(&[], &["FwMark = 1"])),
            "line 8: unknown key `FwMark` in [Peer]: it belongs in [Interface]"
        );
        assert_eq!(
            shown(&valid().replace("Endpoint = 192.0.2.1:51820\n", "")),
            "line 4: the [Peer] section has no Endpoint"
        );
        assert_eq!(
            shown(&valid().replace("[Peer]", "[Wireguard]\n[Peer]")),
            "line 4: unknown section [Wireguard]: a wg-quick file has [Interface] and [Peer]"
        );
        assert_eq!(
            errors("")
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            [
                "no [Interface] section",
                "no [Peer] section: an exit needs its one peer"
            ]
        );
    }

    #[test]
    fn every_problem_is_reported_in_line_order() {
        let text = format!(
            "Table = off\n\
             [Interface]\n\
             Address = 10.0.0.2/32, 10.0.0.x\n\
             DNS = 1.1.1.1\n\
             MTU = big\n\
             Colour = blue\n\
             \n\
             [Peer]\n\
             PublicKey = {PUB}\n\
             PublicKey = {PUB}\n\
             Endpoint = [fd00::1]\n\
             PersistentKeepalive = 25 seconds\n\
             \n\
             [Peer]\n\
             PresharedKey = AAAA\n\
             just some words\n"
        );
        assert_eq!(
            errors(&text),
            vec![
                WgQuickError::KeyOutsideSection {
                    line: 1,
                    key: Some("Table".to_owned()),
                },
                WgQuickError::MissingKey {
                    line: 2,
                    section: Section::Interface,
                    key: "PrivateKey",
                },
                WgQuickError::BadAddress {
                    line: 3,
                    key: "Address",
                    value: "10.0.0.x".to_owned(),
                },
                WgQuickError::BadNumber {
                    line: 5,
                    key: "MTU",
                    value: "big".to_owned(),
                    expected: "a whole number from 68 to 65535",
                },
                WgQuickError::UnknownKey {
                    line: 6,
                    section: Section::Interface,
                    key: Some("Colour".to_owned()),
                },
                WgQuickError::MissingKey {
                    line: 8,
                    section: Section::Peer,
                    key: "AllowedIPs",
                },
                WgQuickError::DuplicateKey {
                    line: 10,
                    first_line: 9,
                    section: Section::Peer,
                    key: "PublicKey",
                },
                WgQuickError::BadEndpoint {
                    line: 11,
                    value: "[fd00::1]".to_owned(),
                    reason: "no `:port` after the bracketed address",
                },
                WgQuickError::BadNumber {
                    line: 12,
                    key: "PersistentKeepalive",
                    value: "25 seconds".to_owned(),
                    expected: "a whole number of seconds from 0 to 65535, or off",
                },
                WgQuickError::TooManyPeers {
                    line: 14,
                    first_line: 8,
                },
                WgQuickError::MissingKey {
                    line: 14,
                    section: Section::Peer,
                    key: "PublicKey",
                },
                WgQuickError::MissingKey {
                    line: 14,
                    section: Section::Peer,
                    key: "Endpoint",
                },
                WgQuickError::MissingKey {
                    line: 14,
                    section: Section::Peer,
                    key: "AllowedIPs",
                },
                WgQuickError::WrongKeyLength {
                    line: 15,
                    key: "PresharedKey",
                    len: 3,
                },
                WgQuickError::MissingEquals { line: 16 },
            ]
        );
    }

    /// Whether `shown` contains 8 or more characters in a row of `secret`.
    fn leaks(shown: &str, secret: &str) -> bool {
        let secret: Vec<char> = secret.chars().collect();
        secret
            .windows(8)
            .any(|window| shown.contains(&window.iter().collect::<String>()))
    }

    #[test]
    fn secrets_are_never_shown() {
        let secret = encode31(PRIV); // a near-miss private key
        let texts = [
            valid().replace(PRIV, &secret),
            valid().replace(PRIV, &format!("{PRIV}AAAA")),
            valid().replace(PRIV, &format!("{}!", &PRIV[..43])),
            valid_with(&[&format!("PrivateKey = {PRIV}")], &[]),
            valid_with(&[PRIV], &[]),
            valid_with(&[&format!("PrivateKey {PRIV}")], &[]),
            valid_with(&[&PRIV[..43]], &[]),
            valid_with(&[&format!("[{}]", &PRIV[..43])], &[]),
            valid_with(&[&format!("PresharedKey = {PRIV}")], &[]),
            valid_with(&[], &[&format!("PresharedKey = {}", &PRIV[..40])]),
            valid_with(
                &[],
                &[
                    &format!("PresharedKey = {PRIV}"),
                    &format!("PresharedKey = {PRIV}"),
                ],
            ),
            format!("{PRIV}\n{}", valid()),
            format!("PrivateKey = {PRIV}\n{}", valid()),
        ];
        for text in texts {
            let all = errors(&text);
            let shown = format!(
                "{all:?} {}",
                all.iter().map(ToString::to_string).collect::<String>()
            );
            assert!(!leaks(&shown, PRIV), "{shown}");
            assert!(!leaks(&shown, &secret), "{shown}");
        }

        let config = ok(&valid_with(&[], &[&format!("PresharedKey = {PSK}")]));
        let debug = format!("{config:?} {config:#?}");
        assert!(!leaks(&debug, PRIV), "{debug}");
        assert!(!leaks(&debug, PSK), "{debug}");
        for raw in [config.private_key, bytes(PSK)] {
            let as_numbers = format!("{:?}", &raw[..4]);
            assert!(
                !debug.contains(&as_numbers[1..as_numbers.len() - 1]),
                "{debug}"
            );
        }
        assert!(debug.contains("private_key: ***"), "{debug}");
        assert!(debug.contains("preshared_key: Some(***)"), "{debug}");
        assert!(debug.contains(PUB), "the public key is shown: {debug}");
        // to_text is the file, secrets included.
        assert!(config.to_text().contains(PRIV));
        assert!(config.to_text().contains(PSK));
    }

    #[test]
    fn public_keys_are_derived_as_wg_pubkey_does() {
        // RFC 7748 section 6.1: Alice's private and public keys.
        let alice = bytes("dwdtCnMYpX08FsFyUbJmRd9ML4frwJkqsXf7pR25LCo=");
        let public = bytes("hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo=");
        assert_eq!(public_key_of(&alice), public);
        let text = valid().replace(PRIV, "dwdtCnMYpX08FsFyUbJmRd9ML4frwJkqsXf7pR25LCo=");
        assert_eq!(ok(&text).public_key(), public);
        // The same as the node's own key type computes.
        let key = crate::wireguard_key::WireguardKey::from_private(bytes(PRIV));
        assert_eq!(public_key_of(&bytes(PRIV)), key.public_bytes());
    }
}
