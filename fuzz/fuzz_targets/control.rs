//! Feeds arbitrary lines to the control socket's decoders, as the ingress
//! reads a request (ingress/src/control.rs: one line, at most
//! `MAX_REQUEST_LINE` bytes, UTF-8, trailing whitespace trimmed, then
//! `serde_json::from_str::<ControlRequest>`) and as `blipless-ctl` reads the
//! answer (`ControlResponse`).
//!
//! The first byte picks how the rest is used. Even: as the line itself.
//! Odd: to build a JSON object whose keys and strings are mostly the
//! protocol's own words (`TOKENS`: tags, field names, outcome words) and
//! whose values are of any JSON type, so that every request and response
//! variant, and every wrong type in each field, is reached quickly.
//!
//! Checked: no panic; a parsed request or response re-serialises to one
//! line (no raw newline: the protocol is JSON lines) that parses back equal
//! (a response's `seconds`, the one float, within a rounding step:
//! serde_json's default float parsing is not always exact).
#![no_main]

use blipless_protocol::control::{ControlRequest, ControlResponse, MAX_REQUEST_LINE};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};

/// The words of protocol/src/control.rs: tags, variants, fields and
/// values. A word missing here is still reachable, only more slowly.
const TOKENS: &[&str] = &[
    "command",
    "status",
    "drain",
    "sync_clients",
    "through",
    "result",
    "ok",
    "synced",
    "planes",
    "error",
    "message",
    "state",
    "ingress_pid",
    "uptime_seconds",
    "connections_accepted",
    "listeners",
    "device_planes",
    "last_deploy",
    "name",
    "address",
    "generation",
    "pid",
    "software",
    "connections_handed",
    "connections_open",
    "clients",
    "migrated",
    "from",
    "to",
    "outcome",
    "detail",
    "seconds",
    "in progress",
    "succeeded",
    "failed",
    "starting",
    "draining",
    "standby",
    "ready",
    "active",
    "socks",
    "http",
];

fn word(u: &mut Unstructured<'_>) -> Result<String> {
    Ok(if u.ratio(7, 8)? {
        (*u.choose(TOKENS)?).to_owned()
    } else {
        u.arbitrary()?
    })
}

fn value(u: &mut Unstructured<'_>, depth: u32) -> Result<Value> {
    let most = if depth >= 3 { 5 } else { 7 };
    Ok(match u.int_in_range(0..=most)? {
        0 => Value::Null,
        1 => Value::Bool(u.arbitrary()?),
        2 => Value::from(u.arbitrary::<u64>()?),
        3 => Value::from(u.arbitrary::<i64>()?),
        4 => Value::from(u.arbitrary::<f64>()?),
        5 => Value::String(word(u)?),
        6 => {
            let mut items = Vec::new();
            for _ in 0..u.int_in_range(0..=3)? {
                items.push(value(u, depth + 1)?);
            }
            Value::Array(items)
        }
        _ => object(u, depth + 1)?,
    })
}

fn object(u: &mut Unstructured<'_>, depth: u32) -> Result<Value> {
    let mut fields = Map::new();
    for _ in 0..u.int_in_range(0..=9)? {
        fields.insert(word(u)?, value(u, depth)?);
    }
    Ok(Value::Object(fields))
}

/// Takes the response's float out, so the rest compares exactly.
fn take_seconds(response: &mut ControlResponse) -> Option<f64> {
    match response {
        ControlResponse::Status(report) => report.last_deploy.as_mut()?.seconds.take(),
        _ => None,
    }
}

fn check(line: &str) {
    if let Ok(request) = serde_json::from_str::<ControlRequest>(line) {
        let again = serde_json::to_string(&request).expect("a request serialises");
        assert!(!again.contains('\n'), "{again:?} is not one line");
        let back: ControlRequest = serde_json::from_str(&again).expect("re-serialised parses");
        assert_eq!(back, request);
    }

    if let Ok(mut response) = serde_json::from_str::<ControlResponse>(line) {
        let again = serde_json::to_string(&response).expect("a response serialises");
        assert!(!again.contains('\n'), "{again:?} is not one line");
        let mut back: ControlResponse = serde_json::from_str(&again).expect("re-serialised parses");
        match (take_seconds(&mut response), take_seconds(&mut back)) {
            (Some(a), Some(b)) => assert!(
                a == b || (a - b).abs() <= a.abs().max(b.abs()) * 4.0 * f64::EPSILON,
                "seconds {a} came back as {b}"
            ),
            (a, b) => assert_eq!(a, b),
        }
        assert_eq!(back, response);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        if rest.len() > MAX_REQUEST_LINE + 1 {
            return;
        }
        if let Ok(text) = std::str::from_utf8(rest) {
            check(text.trim_end());
        }
    } else if let Ok(built) = object(&mut Unstructured::new(rest), 0) {
        check(&built.to_string());
    }
});
