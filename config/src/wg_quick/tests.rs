//! Tests of the wg-quick parser: real providers' files, every refusal,
//! and that no secret shows in an error.

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
