//! Names that are addresses. A SOCKS5 domain or an HTTP host such as
//! `127.0.0.1`, `::1`, or one of the older spellings a resolver still reads
//! as IPv4 (`inet_aton(3)`: `127.1`, `2130706433`, `0x7f.1`, `0177.0.0.1`)
//! names an address, not a host. Names go to an upstream unresolved, so
//! these must be caught here and held to the default deny like any literal
//! address (docs/EGRESS.md, "Streams through an upstream"; the device
//! plane's `egress/via.rs`).

use std::net::{IpAddr, Ipv4Addr};

/// What a host name turns out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostKind {
    /// A name to resolve.
    Name,
    /// An address, however spelt.
    Address(IpAddr),
    /// Neither a name nor an address: ends in a number but is no address
    /// (`1.2.3.4.5`, `300.1.1.1`), or holds a `:` or `%` (no host name
    /// does) and is no address. No resolver reads it as a name, and
    /// neither do we.
    NotAName,
}

/// Reads `host` (a trailing dot and IPv6 brackets allowed) as a resolver
/// would: an address in any spelling `inet_aton` accepts, an IPv6 address
/// with a zone (`::1%lo`, which `getaddrinfo` reads as `::1`), or a name. A
/// host whose last label is a number is never a name (as in the WHATWG URL
/// standard's "ends in a number").
pub fn classify(host: &str) -> HostKind {
    let host = host.strip_suffix('.').unwrap_or(host);
    let bare = host
        .strip_prefix('[')
        .and_then(|inner| inner.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(address) = bare.parse::<IpAddr>() {
        return HostKind::Address(address);
    }
    if let Some((address, _zone)) = bare.split_once('%') {
        if let Ok(address) = address.parse::<std::net::Ipv6Addr>() {
            return HostKind::Address(IpAddr::V6(address));
        }
    }
    if host.contains([':', '%']) {
        return HostKind::NotAName;
    }
    let last = host.rsplit('.').next().unwrap_or(host);
    if !is_number(last) {
        return HostKind::Name;
    }
    inet_aton(host).map_or(HostKind::NotAName, |v4| HostKind::Address(IpAddr::V4(v4)))
}

/// A label `inet_aton` would read as a number: decimal or octal digits, or
/// `0x` and hex digits (possibly none).
fn is_number(label: &str) -> bool {
    match label
        .strip_prefix("0x")
        .or_else(|| label.strip_prefix("0X"))
    {
        Some(hex) => hex.bytes().all(|b| b.is_ascii_hexdigit()),
        None => !label.is_empty() && label.bytes().all(|b| b.is_ascii_digit()),
    }
}

/// One to four parts, each decimal, octal (a leading 0) or hex (`0x`); the
/// last fills the bytes the others left.
fn inet_aton(host: &str) -> Option<Ipv4Addr> {
    let parts: Vec<u32> = host.split('.').map(part).collect::<Option<_>>()?;
    let (last, leading) = parts.split_last()?;
    if leading.len() > 3 || leading.iter().any(|&p| p > 255) {
        return None;
    }
    let last_bits = 8 * (4 - leading.len() as u32);
    if last_bits < 32 && *last >= 1 << last_bits {
        return None;
    }
    let high = leading
        .iter()
        .enumerate()
        .fold(0u32, |acc, (i, &p)| acc | p << (24 - 8 * i as u32));
    Some(Ipv4Addr::from(high | last))
}

fn part(text: &str) -> Option<u32> {
    if let Some(hex) = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        if hex.is_empty() {
            return Some(0);
        }
        return u32::from_str_radix(hex, 16).ok();
    }
    if text.len() > 1 && text.starts_with('0') {
        return u32::from_str_radix(&text[1..], 8).ok();
    }
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_of_an_address_is_one() {
        for (host, address) in [
            ("127.0.0.1", "127.0.0.1"),
            ("127.0.0.1.", "127.0.0.1"),
            ("127.1", "127.0.0.1"),
            ("127.0.1", "127.0.0.1"),
            ("2130706433", "127.0.0.1"),
            ("0x7f.1", "127.0.0.1"),
            ("0X7F000001", "127.0.0.1"),
            ("0177.0.0.1", "127.0.0.1"),
            ("169.254.43518", "169.254.169.254"),
            ("1.65536", "1.1.0.0"),
            ("0", "0.0.0.0"),
            ("0x", "0.0.0.0"),
            ("4294967295", "255.255.255.255"),
            ("::1", "::1"),
            ("[::ffff:10.0.0.1]", "::ffff:10.0.0.1"),
            ("::1%lo", "::1"),
            ("[::1%1]", "::1"),
            ("::ffff:169.254.169.254%0", "::ffff:169.254.169.254"),
        ] {
            let expected: IpAddr = address.parse().expect("an address");
            assert_eq!(classify(host), HostKind::Address(expected), "{host}");
        }
    }

    #[test]
    fn numbers_that_are_no_address_are_refused() {
        for host in [
            "1.2.3.4.5",
            "256.1.1.1",
            "1.2.3.256",
            "1.16777216",
            "1.2.65536",
            "4294967296",
            "08.1.1.1",
            "1..1",
            "example.123",
            "::1::1",
            "host:80",
            "exa%mple.com",
            "%lo",
        ] {
            assert_eq!(classify(host), HostKind::NotAName, "{host}");
        }
    }

    #[test]
    fn names_are_names() {
        for host in [
            "example.com",
            "exit-resolves-this.invalid",
            "1.example",
            "0x7f.example",
            "localhost",
            "a1",
            "123.456.example.com",
            "[not-v6]",
            "0xg",
        ] {
            assert_eq!(classify(host), HostKind::Name, "{host}");
        }
    }
}
