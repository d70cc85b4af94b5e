//! The commands that ask the ingress over its control socket: `status`,
//! `drain` and `deploy`, and how their answers are printed; and the client
//! sync that makes `client add|remove` read-your-writes.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use anyhow::Context;
use blipless_config::Config;
use blipless_protocol::control::{
    ControlRequest, ControlResponse, DeployInfo, DeployOutcome, StatusReport,
};
use serde_json::json;

/// Sends one request to the ingress's control socket and reads the answer.
fn request(config: &Config, request: &ControlRequest) -> anyhow::Result<ControlResponse> {
    let path = config.control_socket();
    let stream = UnixStream::connect(&path).with_context(|| {
        format!(
            "cannot reach the ingress at {} (is blipless-ingress running, with the same node.runtime_dir?)",
            path.display()
        )
    })?;
    check_ingress(&stream, &path)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut line = serde_json::to_string(request)?;
    line.push('\n');
    (&stream).write_all(line.as_bytes())?;
    let mut answer = String::new();
    BufReader::new(&stream)
        .read_line(&mut answer)
        .context("reading the ingress's answer")?;
    serde_json::from_str(&answer)
        .context("the ingress answered something this blipless-ctl cannot read")
}

pub(crate) fn status_report(config: &Config) -> anyhow::Result<StatusReport> {
    match request(config, &ControlRequest::Status)? {
        ControlResponse::Status(report) => Ok(*report),
        ControlResponse::Error { message } => anyhow::bail!("the ingress says: {message}"),
        ControlResponse::Ok { message } | ControlResponse::Unchanged { message } => {
            anyhow::bail!("unexpected answer: {message}")
        }
        ControlResponse::Synced { .. } => anyhow::bail!("unexpected answer to status"),
    }
}

/// Checks that what answers on the control socket is the ingress of this
/// service: the same uid as this command, root, or the user root gave the
/// socket's directory to (docs/ARCHITECTURE.md, "Sockets": every Unix socket
/// checks its peer on both ends). Nothing is sent to anyone else.
fn check_ingress(stream: &UnixStream, path: &std::path::Path) -> anyhow::Result<()> {
    let credentials =
        nix::sys::socket::getsockopt(stream, nix::sys::socket::sockopt::PeerCredentials)
            .context("reading the control socket peer's credentials")?;
    let (peer, own) = (credentials.uid(), nix::unistd::geteuid().as_raw());
    let delegated = path.parent().and_then(delegated_to);
    anyhow::ensure!(
        peer == 0 || peer == own || delegated == Some(peer),
        "the process answering on {} runs as uid {peer}, not as this user (uid {own}), root or the owner of a directory root made for it: it is not this node's ingress, and nothing was sent to it",
        path.display()
    );
    Ok(())
}

/// The user root gave `dir` to: its owner, when only that user and root can
/// create entries in it. `dir` is writable by its owner alone, and every
/// directory above it belongs to root and is writable by root alone (so
/// /run/blipless made by systemd's `RuntimeDirectory=` for the service user
/// qualifies; a folder someone made under /tmp does not).
fn delegated_to(dir: &std::path::Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    const GROUP_OR_OTHERS_WRITE: u32 = 0o022;
    let dir = std::fs::canonicalize(dir).ok()?;
    let meta = std::fs::metadata(&dir).ok()?;
    if meta.mode() & GROUP_OR_OTHERS_WRITE != 0 {
        return None;
    }
    let ancestors_root_only = dir.ancestors().skip(1).all(|above| {
        std::fs::metadata(above)
            .is_ok_and(|m| m.uid() == 0 && m.mode() & GROUP_OR_OTHERS_WRITE == 0)
    });
    ancestors_root_only.then_some(meta.uid())
}

#[cfg(test)]
mod tests {
    use super::delegated_to;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_directory_under_a_world_writable_one_is_nobody_s_delegation() {
        // tempdir() is under /tmp (1777): whoever made the folder there,
        // root did not give it to them.
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))
            .expect("chmod");
        assert_eq!(delegated_to(dir.path()), None);
    }

    #[test]
    fn a_root_owned_path_is_root_s() {
        // / and /usr are root's and writable by root alone on any sane host.
        assert_eq!(delegated_to(std::path::Path::new("/usr")), Some(0));
    }

    #[test]
    fn a_deploy_names_both_builds_when_the_ingress_recorded_them() {
        use blipless_protocol::control::{DeployInfo, DeployOutcome};
        let mut deploy = DeployInfo {
            from: Some(1),
            to: 2,
            from_software: Some("0.0.9+gold".into()),
            to_software: Some("0.1.0+gnew".into()),
            outcome: DeployOutcome::Succeeded,
            detail: "g1 handed over and exited".into(),
            seconds: Some(0.0221),
        };
        assert_eq!(
            super::deploy_summary(&deploy),
            "g1 (0.0.9+gold) -> g2 (0.1.0+gnew): succeeded in 0.022s (g1 handed over and exited)"
        );
        // An older ingress did not record them; a first plane has no predecessor.
        (deploy.from, deploy.from_software, deploy.to_software) = (None, None, None);
        deploy.seconds = None;
        assert_eq!(
            super::deploy_summary(&deploy),
            "none -> g2: succeeded (g1 handed over and exited)"
        );
    }
}

/// What the node said about a client change this command made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Confirmation {
    /// Every ready device plane of this node applied it (the number).
    Applied(u64),
    /// No ingress answers on this node's control socket: there is nothing
    /// to confirm; a node started later loads the client from the store.
    NoNode,
}

/// Asks the node's ingress to have every ready device plane apply the store's
/// change feed through `through` (read-your-writes), and waits for it.
/// An error means the node is running and could not confirm.
pub(crate) fn sync_clients(config: &Config, through: u64) -> anyhow::Result<Confirmation> {
    let path = config.control_socket();
    if let Err(error) = UnixStream::connect(&path) {
        use std::io::ErrorKind;
        if matches!(
            error.kind(),
            ErrorKind::NotFound | ErrorKind::ConnectionRefused
        ) {
            return Ok(Confirmation::NoNode);
        }
    }
    match request(config, &ControlRequest::SyncClients { through })? {
        ControlResponse::Synced { planes } => Ok(Confirmation::Applied(planes)),
        ControlResponse::Error { message } => anyhow::bail!("the ingress says: {message}"),
        _ => anyhow::bail!("unexpected answer to sync_clients"),
    }
}

/// `blipless-ctl tls reload`.
pub(crate) fn tls_reload(config: &Config, as_json: bool) -> anyhow::Result<()> {
    match request(config, &ControlRequest::TlsReload)? {
        ControlResponse::Ok { message } if as_json => {
            say!("{}", json!({ "reloaded": true, "message": message }));
        }
        ControlResponse::Ok { message } => say!("{message}"),
        ControlResponse::Unchanged { message } if as_json => {
            say!("{}", json!({ "reloaded": false, "message": message }));
        }
        ControlResponse::Unchanged { message } => say!("{message}"),
        ControlResponse::Error { message } => anyhow::bail!("the ingress says: {message}"),
        ControlResponse::Status(_) | ControlResponse::Synced { .. } => {
            anyhow::bail!("unexpected answer to tls_reload")
        }
    }
    Ok(())
}

pub(crate) fn drain(config: &Config, watch: bool, as_json: bool) -> anyhow::Result<()> {
    match request(config, &ControlRequest::Drain)? {
        ControlResponse::Ok { message } if as_json => {
            say!("{}", json!({ "draining": true, "message": message }))
        }
        ControlResponse::Ok { message } => say!("{message}"),
        ControlResponse::Error { message } => anyhow::bail!("the ingress says: {message}"),
        ControlResponse::Status(_)
        | ControlResponse::Synced { .. }
        | ControlResponse::Unchanged { .. } => anyhow::bail!("unexpected answer to drain"),
    }
    if !watch {
        return Ok(());
    }
    // Until the control socket stops answering: the ingress has exited.
    while let Ok(report) = status_report(config) {
        let held: u64 = report
            .device_planes
            .iter()
            .map(|p| p.connections_open)
            .sum();
        if as_json {
            say!(
                "{}",
                json!({ "state": report.state, "planes": report.device_planes.len(), "connections_remaining": held })
            );
        } else {
            say!(
                "{}: {} device plane(s), {held} connection(s) remaining",
                report.state,
                report.device_planes.len()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    if as_json {
        say!("{}", json!({ "state": "stopped" }));
    } else {
        say!("ingress stopped");
    }
    Ok(())
}

pub(crate) fn deploy(config: &Config, watch: bool, as_json: bool) -> anyhow::Result<()> {
    loop {
        let report = status_report(config)?;
        let in_progress = report
            .last_deploy
            .as_ref()
            .is_some_and(|d| d.outcome == DeployOutcome::InProgress);
        if as_json {
            say!(
                "{}",
                json!({ "last_deploy": report.last_deploy, "device_planes": report.device_planes })
            );
        } else {
            match &report.last_deploy {
                None => say!(
                    "no deploy yet: start a second blipless-device with the same config to deploy"
                ),
                Some(deploy) => print_deploy(deploy),
            }
            for plane in &report.device_planes {
                say!(
                    "  g{} {:<9} open {:>6}  migrated {:>6}",
                    plane.generation,
                    plane.state,
                    plane.connections_open,
                    plane.migrated
                );
            }
        }
        if !watch || !in_progress {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn print_deploy(deploy: &DeployInfo) {
    say!("deploy {}", deploy_summary(deploy));
}

/// `g1 (0.1.0+gabc) -> g2 (0.1.0+gdef): succeeded in 0.022s (detail)`: the
/// generations with the builds they said in their Hello (left out when an
/// older ingress did not record them), the outcome and what happened.
fn deploy_summary(deploy: &DeployInfo) -> String {
    let build = |software: &Option<String>| {
        software
            .as_deref()
            .map(|s| format!(" ({s})"))
            .unwrap_or_default()
    };
    let from = deploy
        .from
        .map(|g| format!("g{g}{}", build(&deploy.from_software)))
        .unwrap_or_else(|| "none".into());
    let took = deploy
        .seconds
        .map(|s| format!(" in {s:.3}s"))
        .unwrap_or_default();
    format!(
        "{from} -> g{}{}: {}{took} ({})",
        deploy.to,
        build(&deploy.to_software),
        deploy.outcome,
        deploy.detail
    )
}

pub(crate) fn print_status(report: &StatusReport) {
    say!(
        "node: {} (ingress {}, pid {}, up {}s, {} connections accepted)",
        report.state,
        report.version,
        report.ingress_pid,
        report.uptime_seconds,
        report.connections_accepted
    );
    for listener in &report.listeners {
        say!("  {:<7} {}", listener.name, listener.address);
    }
    if let Some(tls) = &report.tls {
        say!(
            "tls: {} expires {} (in {} days)",
            tls.certificate,
            tls.not_after,
            tls.expires_in_seconds.div_euclid(86_400)
        );
    }
    if let Some(deploy) = &report.last_deploy {
        say!("last deploy: {}", deploy_summary(deploy));
    }
    if report.device_planes.is_empty() {
        say!("device planes: none attached (new connections wait in the listen backlog)");
        return;
    }
    say!("device planes:");
    say!(
        "  {:<4} {:<8} {:<9} {:>8} {:>6} {:>8}  version",
        "gen",
        "pid",
        "state",
        "handed",
        "open",
        "clients"
    );
    for plane in &report.device_planes {
        say!(
            "  {:<4} {:<8} {:<9} {:>8} {:>6} {:>8}  {}",
            plane.generation,
            plane.pid,
            plane.state,
            plane.connections_handed,
            plane.connections_open,
            plane.clients,
            plane.software
        );
    }
}

/// `blipless-ctl egress`: the active device plane's routes (the newest
/// plane's when none is active).
pub(crate) fn print_egress(report: &StatusReport, as_json: bool) -> anyhow::Result<()> {
    let plane = report
        .device_planes
        .iter()
        .rev()
        .find(|p| p.state == "active")
        .or_else(|| report.device_planes.last());
    let routes = plane.map(|p| p.routes.clone()).unwrap_or_default();
    if as_json {
        say!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "device_plane": plane.map(|p| p.pid),
                "routes": routes,
            }))?
        );
        return Ok(());
    }
    let Some(plane) = plane else {
        say!("no device plane attached: no egress");
        return Ok(());
    };
    say!(
        "egress routes of device plane {} ({}):",
        plane.pid,
        plane.state
    );
    say!(
        "  {:<20} {:<7} {:<5} {:>10} {:>8} {:>10} {:>6}  error",
        "route",
        "kind",
        "state",
        "latency",
        "clients",
        "tunnels",
        "downs"
    );
    for route in &routes {
        let latency = route.latency_us.map_or_else(
            || "-".to_owned(),
            |us| format!("{:.1}ms", us as f64 / 1000.0),
        );
        say!(
            "  {:<20} {:<7} {:<5} {:>10} {:>8} {:>10} {:>6}  {}",
            route.name,
            route.kind,
            if route.up { "up" } else { "down" },
            latency,
            route.clients,
            route.opened,
            route.downs,
            route.error.as_deref().unwrap_or("")
        );
    }
    Ok(())
}
