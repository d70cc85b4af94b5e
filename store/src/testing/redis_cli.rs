//! `redis-cli`, run once per command against a loopback port: how the topologies look
//! at their nodes, and how tests poke them.

use std::io::Write;
use std::process::{Command, Stdio};

/// Runs `redis-cli -h 127.0.0.1 -p PORT -e ARGS...` (options such as `-c` may lead
/// `args`) and returns its stdout; panics with its stderr if it fails (an error reply
/// included).
pub fn cli(port: u16, args: &[&str]) -> String {
    try_cli(port, args, None).unwrap_or_else(|err| panic!("{err}"))
}

/// Like [`cli`], but feeds `script` (one command a line) to one `redis-cli` session, so
/// a `WAIT` covers the writes before it.
pub fn cli_script(port: u16, args: &[&str], script: &str) -> String {
    try_cli(port, args, Some(script)).unwrap_or_else(|err| panic!("{err}"))
}

/// [`cli`] without the panic: what failed, if it did.
pub fn try_cli(port: u16, args: &[&str], script: Option<&str>) -> Result<String, String> {
    let port_text = port.to_string();
    let mut command = Command::new("redis-cli");
    command
        .args(["-h", "127.0.0.1", "-p", &port_text, "-e"])
        .args(args);
    run_cli(command, script).map_err(|err| format!("redis-cli -p {port} {args:?}: {err}"))
}

/// [`try_cli`] with `--json`, parsed.
pub(crate) fn cli_json(port: u16, args: &[&str]) -> Result<serde_json::Value, String> {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = try_cli(port, &all, None)?;
    serde_json::from_str(&out).map_err(|err| format!("redis-cli {args:?}: {err} in {out:?}"))
}

/// Runs a `redis-cli` command (with `script` on its stdin) and returns its stdout.
pub(crate) fn run_cli(mut command: Command, script: Option<&str>) -> Result<String, String> {
    let mut child = match command
        .stdin(if script.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(err) => panic!(
            "cannot run redis-cli ({err}): the Redis tests need it; \
             run `make test`, which installs it (package redis-server)"
        ),
    };
    let written = match (script, child.stdin.take()) {
        // Dropping stdin after the script ends the session.
        (Some(script), Some(mut stdin)) => stdin.write_all(script.as_bytes()),
        _ => Ok(()),
    };
    let output = child
        .wait_with_output()
        .map_err(|err| format!("waiting for redis-cli: {err}"))?;
    written.map_err(|err| format!("writing to redis-cli: {err}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if output.status.success() {
        Ok(stdout)
    } else {
        Err(format!(
            "{}: {}{stdout}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// The value of `field` in an `INFO` or `CLUSTER INFO` reply (`field:value` lines).
pub(crate) fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        let (key, value) = line.trim_end().split_once(':')?;
        (key == field).then_some(value)
    })
}
