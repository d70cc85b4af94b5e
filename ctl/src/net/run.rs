//! Running a [`Plan`]'s steps on the host: `ip` and `nft` as child processes
//! with a timeout, the sysctl write, and reading a link's state.

use std::process::Stdio;

use tokio::io::AsyncWriteExt;

use super::*;

/// Runs `steps` in order, stopping at the first that fails (setup).
pub(super) async fn run_steps(steps: &[Step]) -> Result<(), NetError> {
    let mut removed = Removed::default();
    for step in steps {
        run_step(step, &mut removed).await?;
    }
    Ok(())
}

/// Runs every one of `steps`, past any that fails (teardown removes all it
/// can): what was removed, and every failure.
pub(super) async fn run_all_steps(steps: &[Step]) -> (Removed, Vec<NetError>) {
    let mut removed = Removed::default();
    let mut failures = Vec::new();
    for step in steps {
        if let Err(error) = run_step(step, &mut removed).await {
            failures.push(error);
        }
    }
    (removed, failures)
}

async fn run_step(step: &Step, removed: &mut Removed) -> Result<(), NetError> {
    match step {
        Step::EnsureTun {
            name,
            probe,
            create,
            delete,
            owner,
        } => match link_state(probe).await? {
            LinkState::Absent => {
                run(create).await?;
                tracing::info!(%name, %owner, "created the persistent multi-queue TUN device");
            }
            LinkState::Tun {
                multi_queue: true,
                user,
                group,
                queues,
            } => {
                if !owner.matches(user.as_deref(), group.as_deref()) {
                    let found = match (&user, &group) {
                        (None, None) => "no user and no group".to_string(),
                        _ => format!(
                            "user {}, group {}",
                            user.as_deref().unwrap_or("none"),
                            group.as_deref().unwrap_or("none")
                        ),
                    };
                    if queues > 0 {
                        return Err(NetError::TunOwner {
                            name: name.clone(),
                            found,
                            wanted: owner.to_string(),
                            queues,
                        });
                    }
                    // Unused: nothing is lost by making it again; the
                    // next steps give it its address and route back.
                    run(delete).await?;
                    run(create).await?;
                    tracing::warn!(%name, %found, wanted = %owner, "recreated the TUN device with its configured owner (no queue was attached)");
                }
            }
            LinkState::Tun {
                multi_queue: false, ..
            } => {
                return Err(NetError::NotMultiQueueTun {
                    name: name.clone(),
                    what: "a TUN device without multi_queue".into(),
                })
            }
            LinkState::Other { kind } => {
                return Err(NetError::NotMultiQueueTun {
                    name: name.clone(),
                    what: format!("a {kind} device, not a TUN device"),
                })
            }
        },
        Step::RemoveTun {
            name,
            probe,
            delete,
        } => match link_state(probe).await? {
            LinkState::Absent => {}
            LinkState::Tun { .. } => {
                run(delete).await?;
                removed.tuns.push(name.clone());
                tracing::info!(%name, "deleted the TUN device");
            }
            LinkState::Other { kind } => {
                return Err(NetError::NotMultiQueueTun {
                    name: name.clone(),
                    what: format!("a {kind} device, not a TUN device (left alone)"),
                })
            }
        },
        Step::Run(cmd) => {
            run(cmd).await?;
        }
        Step::RunUnlessExists(cmd) => run_tolerating(cmd, &["File exists"]).await?,
        Step::RunIfPresent(cmd) => run_tolerating(cmd, ABSENT).await?,
        Step::RemoveMarked { rules, links } => remove_marked(rules, links, removed).await?,
        Step::Sysctl { path, value } => write_sysctl(path, value).await?,
        Step::LoosenReversePath { device } => loosen_reverse_path(device).await?,
    }
    Ok(())
}

/// What `ip` says when the object to delete is gone already.
const ABSENT: &[&str] = &[
    "No such file or directory",
    "Cannot find device",
    "No such process",
];

/// [`Step::RemoveMarked`]: the exits' rules first, then the devices.
async fn remove_marked(rules: &Cmd, links: &Cmd, removed: &mut Removed) -> Result<(), NetError> {
    let listed = listing(rules).await?;
    let found = leftovers::exit_rules(&listed).map_err(|detail| NetError::Unreadable {
        command: rules.to_string(),
        detail,
    })?;
    for rule in found {
        let (priority, table) = (rule.priority.to_string(), rule.table.to_string());
        let delete = Cmd::new(
            "ip",
            &["rule", "del", "priority", &priority, "lookup", &table],
        );
        run_tolerating(&delete, ABSENT).await?;
        removed.rules += 1;
        tracing::info!(
            priority = rule.priority,
            table = rule.table,
            "deleted an exit's routing rule"
        );
    }
    let listed = listing(links).await?;
    let found = leftovers::marked_tuns(&listed).map_err(|detail| NetError::Unreadable {
        command: links.to_string(),
        detail,
    })?;
    for name in found {
        run_tolerating(&Cmd::new("ip", &["link", "del", "dev", &name]), ABSENT).await?;
        tracing::info!(%name, "deleted a TUN device an earlier setup made");
        removed.tuns.push(name);
    }
    Ok(())
}

/// What `cmd` prints, when it succeeds.
pub(super) async fn listing(cmd: &Cmd) -> Result<String, NetError> {
    let output = execute(cmd).await?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(failed(cmd, &output))
    }
}

async fn link_state(probe: &Cmd) -> Result<LinkState, NetError> {
    let output = execute(probe).await?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        if stderr.contains("does not exist") {
            return Ok(LinkState::Absent);
        }
        return Err(failed(probe, &output));
    }
    parse_link(&String::from_utf8_lossy(&output.stdout)).map_err(|detail| NetError::Unreadable {
        command: probe.to_string(),
        detail,
    })
}

async fn run(cmd: &Cmd) -> Result<(), NetError> {
    let output = execute(cmd).await?;
    if output.status.success() {
        tracing::debug!(command = %cmd, "ran");
        Ok(())
    } else {
        Err(failed(cmd, &output))
    }
}

/// Runs `cmd`; a failure whose standard error says one of `done` counts as
/// success (the state it would make is there already).
async fn run_tolerating(cmd: &Cmd, done: &[&str]) -> Result<(), NetError> {
    let output = execute(cmd).await?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if output.status.success() || done.iter().any(|text| stderr.contains(text)) {
        tracing::debug!(command = %cmd, "ran");
        Ok(())
    } else {
        Err(failed(cmd, &output))
    }
}

fn failed(cmd: &Cmd, output: &std::process::Output) -> NetError {
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
    let hint = if stderr.contains("Operation not permitted") || stderr.contains("Permission denied")
    {
        HINT_CAP
    } else {
        ""
    };
    NetError::Command {
        command: cmd.to_string(),
        status: output.status.to_string(),
        stderr,
        hint,
    }
}

async fn execute(cmd: &Cmd) -> Result<std::process::Output, NetError> {
    let mut command = tokio::process::Command::new(cmd.program);
    command
        .args(&cmd.args)
        .stdin(if cmd.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().map_err(|source| NetError::Spawn {
        program: cmd.program,
        hint: match (source.kind(), cmd.program) {
            (std::io::ErrorKind::NotFound, "nft") => {
                " (is nftables installed? apt-get install nftables)"
            }
            (std::io::ErrorKind::NotFound, "ip") => {
                " (is iproute2 installed? apt-get install iproute2)"
            }
            _ => "",
        },
        source,
    })?;
    let io_failed = |source: std::io::Error| NetError::Command {
        command: cmd.to_string(),
        status: "no status".into(),
        stderr: source.to_string(),
        hint: "",
    };
    let finish = async {
        if let (Some(text), Some(mut stdin)) = (&cmd.stdin, child.stdin.take()) {
            stdin.write_all(text.as_bytes()).await.map_err(io_failed)?;
            // Closing standard input ends the script.
            drop(stdin);
        }
        child.wait_with_output().await.map_err(io_failed)
    };
    match tokio::time::timeout(COMMAND_TIMEOUT, finish).await {
        Ok(output) => output,
        Err(_) => Err(NetError::Command {
            command: cmd.to_string(),
            status: format!("no answer within {}s; killed", COMMAND_TIMEOUT.as_secs()),
            stderr: String::new(),
            hint: "",
        }),
    }
}

/// [`Step::LoosenReversePath`].
async fn loosen_reverse_path(device: &str) -> Result<(), NetError> {
    let path = format!("/proc/sys/net/ipv4/conf/{device}/rp_filter");
    let read = |path: String| async move {
        let text = tokio::fs::read_to_string(&path)
            .await
            .map_err(|source| NetError::Sysctl {
                path: path.clone(),
                value: "2",
                source,
                hint: "",
            })?;
        Ok::<u8, NetError>(text.trim().parse().unwrap_or(0))
    };
    let all = read("/proc/sys/net/ipv4/conf/all/rp_filter".to_owned()).await?;
    let own = read(path.clone()).await?;
    if all.max(own) == 1 {
        write_sysctl(&path, "2").await?;
    }
    Ok(())
}

async fn write_sysctl(path: &str, value: &'static str) -> Result<(), NetError> {
    let error = |source: std::io::Error| NetError::Sysctl {
        path: path.to_owned(),
        value,
        hint: match source.kind() {
            std::io::ErrorKind::PermissionDenied => HINT_CAP,
            _ => "",
        },
        source,
    };
    let current = tokio::fs::read_to_string(path).await.map_err(error)?;
    if current.trim() == value {
        return Ok(());
    }
    tokio::fs::write(path, format!("{value}\n"))
        .await
        .map_err(error)?;
    tracing::info!(path, value, "sysctl set");
    Ok(())
}
