//! Feeds text to the wg-quick parser, `blipless_config::wg_quick::parse` (a
//! provider's `.conf` or `blipless-ctl client add --wg`'s output, as the exit
//! of a node).
//!
//! The first byte picks how the rest is used. Even: as is, if it is UTF-8.
//! Odd: a file built from the format's words, so that valid files (and every
//! key's value parser) are reached from an empty corpus: maybe a complete
//! valid file first, then lines put anywhere (section headers, known,
//! ignored and unknown keys in any case with fitting or arbitrary values,
//! comments, arbitrary lines, and private keys pasted where they do not
//! belong), with LF or CRLF line ends and maybe a byte order mark.
//!
//! Checked, always: no panic; an error is a non-empty list in line order
//! (those without a line last), each line within the text, each message
//! starting `line N: ` exactly when it has a line; a parsed file has an
//! address and an allowed network, no zero keepalive, an MTU of at least 68,
//! its `Debug` shows neither its private nor its preshared key, and
//! `to_text` parses back to an equal config and is its own canonical form.
//! Built input only: no error message and no `Debug` shows 12 characters in a
//! row of a private or preshared key written in the file (arbitrary text in
//! built input never holds such a run, so a hit is the parser's).
#![no_main]

use blipless_config::wg_quick::{parse, WgQuick, WgQuickError};
use blipless_config::wireguard_key::encode;
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;

/// Private and preshared keys: only ever written where a secret goes.
const SECRETS: [&str; 3] = [
    "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=",
    "gN65BkIKy1eCE9pP1wdc8ROUtkHLF2PfAqYdyYBz6EA=",
    "dwdtCnMYpX08FsFyUbJmRd9ML4frwJkqsXf7pR25LCo=",
];

/// Public keys (and wrong ones).
const PUBLICS: [&str; 5] = [
    "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=",
    "TrMvSoP4jYQlY6RIzBgbssQqY3vxI2Pi+y71lOWWXX0=",
    "hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo=",
    "AAAA",
    "not base64!",
];

const HEADERS: [&str; 9] = [
    "[Interface]",
    "[Peer]",
    "[interface]",
    "[ PEER ]",
    "[Peers]",
    "[Interface",
    "[]",
    "[Wireguard]",
    "[[Peer]]",
];

/// Every key the parser knows, ignored ones and a few it does not.
const KEYS: [&str; 20] = [
    "PrivateKey",
    "Address",
    "DNS",
    "MTU",
    "PublicKey",
    "PresharedKey",
    "Endpoint",
    "AllowedIPs",
    "PersistentKeepalive",
    "ListenPort",
    "FwMark",
    "Table",
    "PreUp",
    "PostUp",
    "PreDown",
    "PostDown",
    "SaveConfig",
    "Colour",
    "Private Key",
    "",
];

const NETS: [&str; 14] = [
    "10.0.0.2/32",
    "10.0.0.2",
    "fd00::2/128",
    "fd00::2",
    "0.0.0.0/0",
    "::/0",
    "::0/0",
    "10.0.0.9/24",
    "::ffff:1.2.3.4/128",
    "10.0.0.300",
    "fd00::1/129",
    "10.0.0.0/8/8",
    "1.2.3",
    "",
];

const DNS: [&str; 7] = [
    "1.1.1.1",
    "2606:4700:4700::1111",
    "example.lan",
    "corp.example",
    "1.2.3",
    "fe80::1%eth0",
    "::ffff:9.9.9.9",
];

const ENDPOINTS: [&str; 14] = [
    "192.0.2.1:51820",
    "vpn.example.com:51820",
    "Host-1.Example.NET.:443",
    "[2001:db8::1]:51820",
    "[2001:DB8:0::1]:051820",
    "[::ffff:1.2.3.4]:1",
    "localhost:65535",
    "h:0",
    "h:65536",
    "2001:db8::1:1",
    "[192.0.2.1]:1",
    "1.2.3.999:1",
    "vpn.example.com",
    "",
];

const NUMBERS: [&str; 10] = [
    "0", "25", "68", "1420", "65535", "65536", "off", "OFF", "-1", "",
];

const COMMENTS: [&str; 5] = ["", "# a comment", "   ", "# Key = value in a comment", "#"];

/// Whether `text` holds 12 characters in a row of a secret.
fn leaks(text: &str) -> bool {
    SECRETS.iter().any(|secret| {
        (0..=secret.len() - 12).any(|start| text.contains(&secret[start..start + 12]))
    })
}

/// Arbitrary text for one line: no line break, no run of a secret.
fn arbitrary_text(u: &mut Unstructured<'_>) -> Result<String> {
    let text: String = u.arbitrary()?;
    let text = text.replace(['\n', '\r'], " ");
    Ok(if leaks(&text) { String::new() } else { text })
}

/// `key` in wg-quick's spelling, lower case or upper case.
fn spelled(u: &mut Unstructured<'_>, key: &str) -> Result<String> {
    Ok(match u.int_in_range(0..=3)? {
        0 => key.to_lowercase(),
        1 => key.to_uppercase(),
        _ => key.to_owned(),
    })
}

/// ` = `, `=`, ` \t=  ` ...
fn equals(u: &mut Unstructured<'_>) -> Result<&'static str> {
    u.choose(&[" = ", "=", " =", "= ", "\t=\t", "  =   "])
        .copied()
}

/// A list value: 0 to 3 items from `pool`, separated as files do.
fn list(u: &mut Unstructured<'_>, pool: &[&str]) -> Result<String> {
    let mut out = String::new();
    for n in 0..u.int_in_range(0..=3)? {
        if n > 0 {
            out.push_str(u.choose(&[", ", ",", " ", " , "])?);
        }
        out.push_str(u.choose(pool)?);
    }
    Ok(out)
}

/// A value that fits `key` (a secret for a private or preshared key).
fn fitting(u: &mut Unstructured<'_>, key: &str) -> Result<String> {
    Ok(match key {
        "PrivateKey" | "PresharedKey" => {
            let secret = *u.choose(&SECRETS)?;
            match u.int_in_range(0..=5)? {
                0 => secret[..43].to_owned(),
                1 => format!("{secret}AAAA"),
                2 => secret[..40].to_owned(),
                _ => secret.to_owned(),
            }
        }
        "PublicKey" => u.choose(&PUBLICS)?.to_string(),
        "Address" | "AllowedIPs" => list(u, &NETS)?,
        "DNS" => list(u, &DNS)?,
        "Endpoint" => u.choose(&ENDPOINTS)?.to_string(),
        "MTU" | "PersistentKeepalive" | "ListenPort" => u.choose(&NUMBERS)?.to_string(),
        _ => arbitrary_text(u)?,
    })
}

/// `Key = value`, maybe with a trailing comment.
fn key_line(u: &mut Unstructured<'_>, key: &str, value: &str) -> Result<String> {
    let mut line = format!("{}{}{value}", spelled(u, key)?, equals(u)?);
    if u.ratio(1, 4)? {
        line.push_str(" # trailing");
    }
    Ok(line)
}

/// One line of any kind.
fn any_line(u: &mut Unstructured<'_>) -> Result<String> {
    Ok(match u.int_in_range(0..=9)? {
        0 | 1 => u.choose(&HEADERS)?.to_string(),
        2..=4 => {
            let key = *u.choose(&KEYS)?;
            let value = fitting(u, key)?;
            key_line(u, key, &value)?
        }
        5 => {
            let key = *u.choose(&KEYS)?;
            let value = arbitrary_text(u)?;
            key_line(u, key, &value)?
        }
        6 => u.choose(&COMMENTS)?.to_string(),
        7 => {
            // A secret where it does not belong.
            let secret = *u.choose(&SECRETS)?;
            match u.int_in_range(0..=4)? {
                0 => secret.to_owned(),
                1 => format!("PrivateKey {secret}"),
                2 => format!("[{secret}]"),
                3 => format!("{} = x", &secret[..43]),
                _ => format!("{secret} = {secret}"),
            }
        }
        _ => arbitrary_text(u)?,
    })
}

/// A complete, valid file's lines.
fn skeleton(u: &mut Unstructured<'_>) -> Result<Vec<String>> {
    let mut lines = vec!["[Interface]".to_owned()];
    let secret = *u.choose(&SECRETS)?;
    lines.push(key_line(u, "PrivateKey", secret)?);
    let address = *u.choose(&NETS[..9])?;
    lines.push(key_line(u, "Address", address)?);
    if u.arbitrary()? {
        let dns = *u.choose(&DNS[..4])?;
        lines.push(key_line(u, "DNS", dns)?);
    }
    if u.arbitrary()? {
        lines.push(key_line(u, "MTU", "1420")?);
    }
    lines.push(String::new());
    lines.push("[Peer]".to_owned());
    let public = *u.choose(&PUBLICS[..3])?;
    lines.push(key_line(u, "PublicKey", public)?);
    if u.arbitrary()? {
        let psk = *u.choose(&SECRETS)?;
        lines.push(key_line(u, "PresharedKey", psk)?);
    }
    let endpoint = *u.choose(&ENDPOINTS[..7])?;
    lines.push(key_line(u, "Endpoint", endpoint)?);
    let allowed = *u.choose(&NETS[..9])?;
    lines.push(key_line(u, "AllowedIPs", allowed)?);
    if u.arbitrary()? {
        let seconds = *u.choose(&NUMBERS[..5])?;
        lines.push(key_line(u, "PersistentKeepalive", seconds)?);
    }
    Ok(lines)
}

fn built(u: &mut Unstructured<'_>) -> Result<String> {
    let mut lines = if u.arbitrary()? {
        skeleton(u)?
    } else {
        Vec::new()
    };
    for _ in 0..u.int_in_range(0..=6)? {
        let line = any_line(u)?;
        let at = u.int_in_range(0..=lines.len())?;
        lines.insert(at, line);
    }
    let eol = if u.arbitrary()? { "\r\n" } else { "\n" };
    let mut text = if u.ratio(1, 4)? {
        "\u{feff}".to_owned()
    } else {
        String::new()
    };
    text.push_str(&lines.join(eol));
    if u.arbitrary()? {
        text.push_str(eol);
    }
    Ok(text)
}

fn check_errors(text: &str, errors: &[WgQuickError]) {
    assert!(!errors.is_empty(), "an error with no problem in it");
    let lines = text.lines().count();
    let mut last = 0;
    for error in errors {
        let shown = error.to_string();
        let order = match error.line() {
            Some(line) => {
                assert!((1..=lines).contains(&line), "{error:?} of {lines} lines");
                assert!(shown.starts_with(&format!("line {line}: ")), "{shown}");
                line
            }
            None => {
                assert!(!shown.starts_with("line "), "{shown}");
                usize::MAX
            }
        };
        assert!(order >= last, "not in line order: {errors:?}");
        last = order;
    }
}

fn check_config(config: &WgQuick) {
    assert!(!config.addresses.is_empty());
    assert!(!config.peer.allowed_ips.is_empty());
    assert_ne!(config.peer.persistent_keepalive, Some(0));
    assert!(config.mtu.is_none_or(|mtu| mtu >= 68));

    let debug = format!("{config:?}");
    assert!(!debug.contains(&encode(&config.private_key)), "{debug}");
    if let Some(psk) = &config.peer.preshared_key {
        assert!(!debug.contains(&encode(psk)), "{debug}");
    }

    let text = config.to_text();
    match parse(&text) {
        Ok(again) => {
            assert_eq!(&again, config, "to_text parses back equal:\n{text}");
            assert_eq!(again.to_text(), text, "to_text is canonical");
        }
        Err(errors) => panic!("to_text does not parse: {errors:?}\n{text}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let is_built = mode & 1 == 1;
    let text = if is_built {
        match built(&mut Unstructured::new(rest)) {
            Ok(text) => text,
            Err(_) => return,
        }
    } else {
        match std::str::from_utf8(rest) {
            Ok(text) => text.to_owned(),
            Err(_) => return,
        }
    };

    match parse(&text) {
        Ok(config) => {
            check_config(&config);
            if is_built {
                let debug = format!("{config:?} {config:#?}");
                assert!(!leaks(&debug), "a secret in Debug: {debug}");
            }
        }
        Err(errors) => {
            check_errors(&text, &errors);
            if is_built {
                let shown: String = errors
                    .iter()
                    .map(|error| format!("{error} {error:?}\n"))
                    .collect();
                assert!(!leaks(&shown), "a secret in an error:\n{shown}\n{text}");
            }
        }
    }
});
