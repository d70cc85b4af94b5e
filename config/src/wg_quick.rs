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
mod tests;
