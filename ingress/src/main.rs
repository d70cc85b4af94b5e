//! `blipless-ingress`: parse the command line and configuration, then run
//! the ingress until SIGTERM or SIGINT starts a drain.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use blipless_config::{Config, EXIT_CONFIG_ERROR};
use clap::Parser;
use tokio_util::sync::CancellationToken;

/// The stable plane of a blipless node: owns the customer-facing sockets and
/// hands every accepted connection to the active device plane; terminates
/// WireGuard and trades inner packets with the device plane; serves /status
/// and /metrics and the control socket for blipless-ctl. Starting a second one
/// beside a running one restarts the ingress by handoff: the new one takes the
/// sockets and WireGuard peers, the old one exits once its sessions are quiet.
/// SIGTERM or `blipless-ctl drain`: drain the node and exit.
#[derive(Debug, Parser)]
#[command(
    version,
    after_help = "Every configuration key can also be set as BLIPLESS_<SECTION>_<KEY> (for example BLIPLESS_LISTEN_SOCKS=127.0.0.1:1081); precedence: defaults < file < environment < --set."
)]
struct Args {
    /// The TOML configuration file shared with blipless-device.
    #[arg(long, short, env = "BLIPLESS_CONFIG")]
    config: Option<PathBuf>,
    /// Override one key, for example `--set listen.socks=127.0.0.1:1081` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// Log as JSON lines instead of human-readable text (same as --set log.format=json).
    #[arg(long)]
    log_json: bool,
    /// Run under a stand-in main process for systemd (Type=notify,
    /// KillMode=process, RestartKillSignal=SIGUSR2): it relays readiness and
    /// SIGTERM/SIGINT, and on a restart (SIGUSR2) leaves this daemon running
    /// for its successor. Needs NOTIFY_SOCKET.
    #[arg(long, env = "BLIPLESS_SUPERVISE", value_parser = clap::builder::BoolishValueParser::new())]
    supervise: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.supervise {
        return supervise();
    }
    let mut sets = args.sets.clone();
    if args.log_json {
        sets.push("log.format=json".into());
    }
    let config = match Config::load(args.config.as_deref(), std::env::vars(), &sets) {
        Ok(config) => config,
        Err(errors) => {
            eprintln!("blipless-ingress: {errors}");
            return ExitCode::from(EXIT_CONFIG_ERROR as u8);
        }
    };
    blipless_config::daemon::init_logging(&config);
    blipless_config::daemon::raise_fd_limit();
    match run(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error:#}");
            eprintln!("blipless-ingress: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// `--supervise`: run this program again, without the flag, under the
/// stand-in, before loading anything else.
fn supervise() -> ExitCode {
    let program = match std::env::current_exe() {
        Ok(program) => program,
        Err(error) => {
            eprintln!("blipless-ingress --supervise: locating this program: {error}");
            return ExitCode::FAILURE;
        }
    };
    let args = blipless_supervise::child_args(std::env::args_os().skip(1));
    let code = blipless_supervise::run(&program, &args);
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

fn run(config: Config) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async {
        let shutdown = CancellationToken::new();
        let signals = shutdown.clone();
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .context("installing the SIGTERM handler")?;
        let restart = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined2())
            .context("installing the SIGUSR2 handler")?;
        tokio::spawn(async move {
            tokio::select! {
                _ = terminate.recv() => tracing::info!("SIGTERM: draining"),
                _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: draining"),
            }
            signals.cancel();
        });
        tokio::spawn(blipless_supervise::lifecycle::wait_for_successor(
            restart,
            config.drain.grace,
            shutdown.clone(),
        ));
        tokio::spawn(blipless_supervise::lifecycle::tell_stopping(
            shutdown.clone(),
        ));
        blipless_ingress::run(config, shutdown).await
    })
}
