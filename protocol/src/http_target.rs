//! HTTP proxy request targets (RFC 9112 §3.2), free of I/O: what a forward
//! proxy must know from the request line before it resolves or connects to
//! anything.
//!
//! - [`parse_absolute`]: an absolute-form target (`http://host:port/path?q`,
//!   §3.2.2) gives the [`Destination`] to connect to, the origin-form target
//!   to send there (`/path?q`, `/` for an empty path) and the `Host` value to
//!   send with it. §3.2.2: a proxy replaces the client's `Host` with the
//!   target's authority; the default port (80) is left out.
//! - [`parse_connect`]: an authority-form target (`host:port`, §3.2.3, the
//!   CONNECT method) gives its [`Destination`]; the port is required.
//! - [`has_userinfo`] and [`redact`]: an authority with userinfo
//!   (`user:password@host`, deprecated by RFC 9110 §4.2.4) is refused by both
//!   parsers with [`TargetError::Userinfo`] before anything else is looked
//!   at. [`redact`] is the form of any target that may be written to a log:
//!   userinfo replaced by `***`, control characters by `?`, at most
//!   [`MAX_LOGGED`] bytes.
//!
//! The grammar is RFC 3986's, narrowed to what this proxy serves. The
//! scheme is `http` (any case). A host is an IPv4 address, a bracketed IPv6
//! address (no zone identifier, no IPvFuture) or a DNS name of 1 to
//! [`MAX_HOST_LEN`] bytes of letters, digits, `-`, `_` and `.`
//! (percent-encoded and other reg-name characters are not names a resolver
//! takes). A port is 1 to 65535; an empty port (`host:`) is the default one
//! in the absolute form. Every byte of a target is visible ASCII other than
//! `#` (a fragment is never part of a request target).
//!
//! Errors carry no part of the target, so showing one never shows a
//! credential. Every function is total over its input (it never panics)
//! and allocates at most about the length of its input.

use std::borrow::Cow;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The default port of the `http` scheme, left out of the `Host` value.
pub const HTTP_DEFAULT_PORT: u16 = 80;

/// The longest DNS name accepted as a host, in bytes (a trailing dot allowed).
pub const MAX_HOST_LEN: usize = 254;

/// The longest [`redact`] output before its `...` marker, in bytes.
pub const MAX_LOGGED: usize = 256;

/// Why a request target cannot be served. No variant carries any of the
/// target's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// The target is empty.
    #[error("empty request target")]
    Empty,
    /// A byte that cannot appear in a request target: whitespace, a control
    /// character, a non-ASCII byte, or `#` (a fragment).
    #[error("request target has a byte that is not allowed")]
    InvalidCharacter,
    /// Not in absolute form (`scheme://authority...`): origin-form (`/path`),
    /// asterisk-form (`*`), or no scheme.
    #[error("request target is not an absolute URI")]
    NotAbsolute,
    /// The authority carries userinfo (`user:password@`). Refused before
    /// resolving or connecting, and never logged (see [`redact`]).
    #[error("request target carries userinfo (user:password@)")]
    Userinfo,
    /// An absolute URI whose scheme is not `http`.
    #[error("request target scheme is not http")]
    UnsupportedScheme,
    /// The authority has no host (`http:///path`, `:443`).
    #[error("request target has no host")]
    MissingHost,
    /// The host is neither a DNS name, an IPv4 address, nor a bracketed IPv6
    /// address (or it is longer than [`MAX_HOST_LEN`]).
    #[error("request target host is not valid")]
    InvalidHost,
    /// An authority-form target (CONNECT) without a port.
    #[error("request target has no port")]
    MissingPort,
    /// The port is not a number from 1 to 65535.
    #[error("request target port is not valid")]
    InvalidPort,
    /// An authority-form target (CONNECT) followed by a path, query or other
    /// bytes after `host:port`.
    #[error("request target is not host:port")]
    NotAuthority,
}

/// A destination's host as the target names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A DNS name, as written (to be resolved).
    Name(String),
    /// An IPv4 or IPv6 address literal.
    Ip(IpAddr),
}

/// Where a request target points: a host and a port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Destination {
    /// The host.
    pub host: Host,
    /// The port (the scheme's default when the target gives none).
    pub port: u16,
}

impl Destination {
    /// The `Host` header value for this destination (RFC 9110 §7.2):
    /// `host[:port]`, IPv6 in brackets, the port left out when it is
    /// `default_port`.
    pub fn host_header(&self, default_port: u16) -> String {
        let mut value = match &self.host {
            Host::Name(name) => name.clone(),
            Host::Ip(IpAddr::V4(ip)) => ip.to_string(),
            Host::Ip(IpAddr::V6(ip)) => format!("[{ip}]"),
        };
        if self.port != default_port {
            value.push(':');
            value.push_str(&self.port.to_string());
        }
        value
    }
}

impl fmt::Display for Destination {
    /// `host:port`, IPv6 in brackets; safe to log (it never has userinfo).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Host::Name(name) => write!(f, "{name}:{}", self.port),
            Host::Ip(IpAddr::V4(ip)) => write!(f, "{ip}:{}", self.port),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]:{}", self.port),
        }
    }
}

/// An absolute-form request, ready to forward in origin form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forward {
    /// Where to connect.
    pub destination: Destination,
    /// The origin-form target to send (`/path?query`; `/` for an empty path).
    pub origin_form: String,
    /// The `Host` value to send, replacing whatever the client sent.
    pub host_header: String,
}

/// Parses an absolute-form request target (`http://host[:port][/path][?query]`).
///
/// Userinfo is refused ([`TargetError::Userinfo`]) before the scheme, host
/// or port are looked at.
pub fn parse_absolute(target: &str) -> Result<Forward, TargetError> {
    check_characters(target)?;
    let (scheme, rest) = split_scheme(target).ok_or(TargetError::NotAbsolute)?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path_and_query) = rest.split_at(end);
    if authority.contains('@') {
        return Err(TargetError::Userinfo);
    }
    if !scheme.eq_ignore_ascii_case("http") {
        return Err(TargetError::UnsupportedScheme);
    }
    let destination = parse_authority(authority, Some(HTTP_DEFAULT_PORT))?;
    let origin_form = if path_and_query.starts_with('/') {
        path_and_query.to_owned()
    } else {
        format!("/{path_and_query}")
    };
    let host_header = destination.host_header(HTTP_DEFAULT_PORT);
    Ok(Forward {
        destination,
        origin_form,
        host_header,
    })
}

/// Parses an authority-form request target (`host:port`, CONNECT's).
pub fn parse_connect(target: &str) -> Result<Destination, TargetError> {
    check_characters(target)?;
    if target.contains('@') {
        return Err(TargetError::Userinfo);
    }
    if target.contains(['/', '?']) {
        return Err(TargetError::NotAuthority);
    }
    parse_authority(target, None)
}

/// Parses `host[:port]` (no userinfo). Without a port, or with an empty
/// one, the port is `default_port`; with `None` a port is required.
pub fn parse_authority(
    authority: &str,
    default_port: Option<u16>,
) -> Result<Destination, TargetError> {
    if authority.contains('@') {
        return Err(TargetError::Userinfo);
    }
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let close = bracketed.find(']').ok_or(TargetError::InvalidHost)?;
        let (inside, after) = (&bracketed[..close], &bracketed[close + 1..]);
        let ip: Ipv6Addr = inside.parse().map_err(|_| TargetError::InvalidHost)?;
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':').ok_or(TargetError::InvalidHost)?),
        };
        (Host::Ip(IpAddr::V6(ip)), port)
    } else {
        let (name, port) = match authority.split_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (authority, None),
        };
        (parse_host(name)?, port)
    };
    let port = match (port, default_port) {
        (Some(port), _) if !port.is_empty() => parse_port(port)?,
        (_, Some(default)) => default,
        (_, None) => return Err(TargetError::MissingPort),
    };
    Ok(Destination { host, port })
}

/// True when the target's authority carries userinfo (`...@host`): in
/// absolute form the part after `://` up to the first `/`, `?` or `#`; in
/// any other form, the part before the first of those.
pub fn has_userinfo(target: &str) -> bool {
    let start = authority_start(target);
    let rest = &target[start..];
    rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())].contains('@')
}

/// The target as it may be logged. Everything from the start of the
/// authority (after `://`, else the start) to the last `@` of the whole
/// target is replaced by `***`: a client that did not percent-encode a
/// `/`, `?` or `#` in its password still has none of it logged, at the
/// price of hiding a path up to an `@` in it. Control and non-ASCII
/// characters become `?`; the result is cut at [`MAX_LOGGED`] bytes (then
/// ending in `...`).
pub fn redact(target: &str) -> String {
    let redacted: Cow<'_, str> = match target.rfind('@') {
        Some(at) => {
            let start = authority_start(target);
            let start = if at >= start { start } else { 0 };
            format!("{}***{}", &target[..start], &target[at..]).into()
        }
        None => target.into(),
    };
    let mut out = String::with_capacity(redacted.len().min(MAX_LOGGED + 3));
    for c in redacted.chars() {
        if out.len() >= MAX_LOGGED {
            out.push_str("...");
            break;
        }
        out.push(if c.is_ascii_graphic() || c == ' ' {
            c
        } else {
            '?'
        });
    }
    out
}

/// Where the authority starts: after the first `://`, else at 0.
fn authority_start(target: &str) -> usize {
    target.find("://").map_or(0, |i| i + 3)
}

/// Splits `scheme://rest` when `scheme` is a valid scheme (RFC 3986 §3.1).
fn split_scheme(target: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = target.split_once("://")?;
    let mut bytes = scheme.bytes();
    let first = bytes.next()?;
    let valid = first.is_ascii_alphabetic()
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
    valid.then_some((scheme, rest))
}

/// Every byte visible ASCII, none of them `#`.
fn check_characters(target: &str) -> Result<(), TargetError> {
    if target.is_empty() {
        return Err(TargetError::Empty);
    }
    if target.bytes().all(|b| b.is_ascii_graphic() && b != b'#') {
        Ok(())
    } else {
        Err(TargetError::InvalidCharacter)
    }
}

/// An IPv4 address or a DNS name (not bracketed).
fn parse_host(name: &str) -> Result<Host, TargetError> {
    if name.is_empty() {
        return Err(TargetError::MissingHost);
    }
    if let Ok(ip) = name.parse::<Ipv4Addr>() {
        return Ok(Host::Ip(IpAddr::V4(ip)));
    }
    let valid = name.len() <= MAX_HOST_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if valid {
        Ok(Host::Name(name.to_owned()))
    } else {
        Err(TargetError::InvalidHost)
    }
}

/// 1 to 65535, decimal digits only (leading zeros allowed, as RFC 3986's
/// `*DIGIT` allows).
fn parse_port(port: &str) -> Result<u16, TargetError> {
    if !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(TargetError::InvalidPort);
    }
    let digits = port.trim_start_matches('0');
    if digits.len() > 5 {
        return Err(TargetError::InvalidPort);
    }
    match digits.parse::<u32>() {
        Ok(n @ 1..=65535) => u16::try_from(n).map_err(|_| TargetError::InvalidPort),
        _ => Err(TargetError::InvalidPort),
    }
}

#[cfg(test)]
mod tests;
