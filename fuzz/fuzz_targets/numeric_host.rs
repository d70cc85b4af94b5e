//! Host names that are addresses (protocol/src/numeric_host.rs) on
//! arbitrary names. Checked: no panic, and
//!
//! - every address, written as Rust writes it, is read back as itself;
//! - whatever `std` reads as an address is read as that address;
//! - a name (`HostKind::Name`) never ends in a number label and holds no
//!   `:` or `%`, so nothing a resolver would read as an address (IPv4 in
//!   any spelling, IPv6 with or without a zone) goes to an upstream as a
//!   name.
#![no_main]

use std::net::IpAddr;

use blipless_protocol::numeric_host::{classify, HostKind};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let host = String::from_utf8_lossy(data);
    let host = host.as_ref();
    let kind = classify(host);
    if let HostKind::Address(address) = kind {
        assert_eq!(classify(&address.to_string()), kind, "{host:?}");
    }
    if let Ok(address) = host.parse::<IpAddr>() {
        assert_eq!(kind, HostKind::Address(address), "{host:?}");
    }
    if kind == HostKind::Name {
        let last = host.strip_suffix('.').unwrap_or(host).rsplit('.').next();
        let numeric = last.is_some_and(|label| {
            !label.is_empty() && label.bytes().all(|b| b.is_ascii_digit())
        });
        assert!(!numeric, "{host:?} ends in a number but was read as a name");
        assert!(!host.contains([':', '%']), "{host:?} was read as a name");
    }
});
