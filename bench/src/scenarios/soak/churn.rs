//! The churn fault: a client added with `blipless-ctl client add`, used at
//! once over SOCKS5 and HTTP (read-your-writes: it must work the instant
//! `client add` returns), removed, and checked refused at once (SOCKS5
//! authentication refused, HTTP 407).

use super::faults::{Fault, Stage};
use super::load::request;
use crate::client::{self, Mode, Proxies};

/// `blipless-ctl --json client add|remove NAME`: the JSON, once the node
/// confirmed.
fn ctl_client(stage: &Stage<'_>, verb: &str, name: &str) -> Result<serde_json::Value, String> {
    let output = stage.world.node.ctl(&["--json", "client", verb, name]);
    if !output.status.success() {
        return Err(format!(
            "`client {verb} {name}` exited with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    let value: serde_json::Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("`client {verb} {name}` printed no JSON: {e}"))?;
    if value["node"]["confirmed"] != true {
        return Err(format!(
            "`client {verb} {name}`: the node did not confirm: {value}"
        ));
    }
    Ok(value)
}

/// Adds, uses, removes and checks the client `churn<number>`; what went
/// wrong goes into the fault's problems.
pub fn churn(stage: &mut Stage<'_>, fault: &mut Fault) {
    let name = format!("churn{}", fault.number);
    let added = match ctl_client(stage, "add", &name) {
        Ok(value) => value,
        Err(problem) => return fault.problems.push(problem),
    };
    let Some(secret) = added["secret"].as_str() else {
        return fault.problems.push(format!("no secret in {added}"));
    };
    let proxies = Proxies {
        user: name.clone(),
        secret: secret.to_string(),
        ..stage.world.proxies()
    };
    let origin = stage.world.origin;
    for mode in super::load::REQUEST_MODES {
        if let Err(error) = stage.runtime.block_on(request(&proxies, mode, origin)) {
            fault.problems.push(format!(
                "{} right after `client add` returned: {error}",
                mode.label()
            ));
        }
    }
    if let Err(problem) = ctl_client(stage, "remove", &name) {
        return fault.problems.push(problem);
    }
    match stage
        .runtime
        .block_on(client::open(&proxies, Mode::Socks5, origin))
    {
        Err(error) if error.to_string().contains("auth status") => {}
        Err(error) => fault.problems.push(format!(
            "SOCKS5 right after `client remove` returned failed, but not as a refusal: {error}"
        )),
        Ok(_) => fault
            .problems
            .push("SOCKS5 still logged in after `client remove` returned".into()),
    }
    match stage
        .runtime
        .block_on(request(&proxies, Mode::HttpAbsolute, origin))
    {
        Err(error) if error.contains("407") => {}
        Err(error) => fault.problems.push(format!(
            "HTTP right after `client remove` returned failed, but not with 407: {error}"
        )),
        Ok(()) => fault
            .problems
            .push("HTTP still served after `client remove` returned".into()),
    }
    if fault.problems.is_empty() {
        fault.detail = "worked at once, refused at once".into();
    }
}
