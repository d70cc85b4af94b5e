//! The HTTP proxy's request-target handling (protocol/src/http_target.rs)
//! on arbitrary targets. Checked: no panic in any public function, and
//!
//! - a target `parse_absolute` or `parse_connect` accepts has no userinfo
//!   (`has_userinfo` is false, and neither the destination nor the `Host`
//!   value has an `@`); a target with userinfo is always refused;
//! - the `Host` value `parse_absolute` returns parses back (as an authority
//!   with the default port 80) to the same destination, and a destination
//!   shown as `host:port` parses back to itself (as CONNECT's target too);
//! - the origin form starts with `/` and is the target's path and query;
//! - `redact` gives at most `MAX_LOGGED` bytes and `...`, only visible ASCII
//!   and spaces, and, for a target with an `@`, `***` in place of
//!   everything from the authority's start to the last `@` (so no password
//!   is left in it).
#![no_main]

use blipless_protocol::http_target::{
    has_userinfo, parse_absolute, parse_authority, parse_connect, redact, TargetError,
    HTTP_DEFAULT_PORT, MAX_LOGGED,
};
use libfuzzer_sys::fuzz_target;

/// What `redact` makes of each character.
fn shown(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let target = String::from_utf8_lossy(data);
    let target = target.as_ref();
    let userinfo = has_userinfo(target);

    match parse_absolute(target) {
        Ok(forward) => {
            assert!(!userinfo, "{target:?} has userinfo but was accepted");
            assert!(!forward.host_header.contains('@'));
            assert!(!forward.destination.to_string().contains('@'));
            assert_eq!(
                parse_authority(&forward.host_header, Some(HTTP_DEFAULT_PORT)).as_ref(),
                Ok(&forward.destination),
                "Host {:?} of {target:?}",
                forward.host_header
            );
            assert_eq!(
                forward.host_header,
                forward.destination.host_header(HTTP_DEFAULT_PORT)
            );
            let origin = &forward.origin_form;
            assert!(origin.starts_with('/'));
            assert!(
                target.ends_with(origin.as_str()) || target.ends_with(&origin[1..]),
                "origin form {origin:?} of {target:?}"
            );
            assert_eq!(
                parse_connect(&forward.destination.to_string()).as_ref(),
                Ok(&forward.destination)
            );
        }
        Err(error) => {
            let _ = error.to_string();
            if userinfo {
                assert!(matches!(
                    error,
                    TargetError::Userinfo
                        | TargetError::Empty
                        | TargetError::InvalidCharacter
                        | TargetError::NotAbsolute
                ));
            }
        }
    }

    match parse_connect(target) {
        Ok(destination) => {
            assert!(!userinfo && !target.contains('@'));
            let shown = destination.to_string();
            assert!(!shown.contains('@'));
            assert_eq!(parse_connect(&shown).as_ref(), Ok(&destination));
            assert_eq!(
                parse_authority(&destination.host_header(443), Some(443)).as_ref(),
                Ok(&destination)
            );
        }
        Err(error) => {
            let _ = error.to_string();
        }
    }

    for default_port in [None, Some(HTTP_DEFAULT_PORT)] {
        if let Ok(destination) = parse_authority(target, default_port) {
            assert!(!target.contains('@'));
            assert_eq!(
                parse_authority(&destination.to_string(), None).as_ref(),
                Ok(&destination)
            );
        }
    }

    let redacted = redact(target);
    assert!(redacted.len() <= MAX_LOGGED + 3, "{} bytes", redacted.len());
    assert!(redacted.chars().all(|c| c.is_ascii_graphic() || c == ' '));
    // Short enough not to be cut: the userinfo is gone.
    if let Some(at) = target.rfind('@') {
        if target.len() + 3 < MAX_LOGGED {
            let authority_start = target.find("://").map_or(0, |i| i + 3);
            let stars = redacted
                .rfind("***@")
                .unwrap_or_else(|| panic!("{target:?} redacted as {redacted:?}"));
            assert!(
                stars <= authority_start,
                "{target:?} redacted as {redacted:?}"
            );
            assert_eq!(redacted[stars + 3..], shown(&target[at..]), "{target:?}");
        }
    }
});
