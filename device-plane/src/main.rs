//! `blipless-device`: parse the command line and configuration, then run a
//! device plane until the ingress says Drain or SIGTERM/SIGINT asks for one.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use blipless_config::{Config, EXIT_CONFIG_ERROR};
use clap::Parser;
use tokio_util::sync::CancellationToken;

/// The deployable plane of a blipless node: attaches to the ingress, serves
/// SOCKS5 and HTTP proxy customers, connects them out, and sends WireGuard
/// clients' packets out through the TUN device (egress.tun). Starting a second
/// one beside a running one is a deploy: the new one pre-warms, takes over
/// new connections, receives every open tunnel and idle HTTP connection (and
/// the TUN queues) from the old one byte-exact, and the old one exits 0 once
/// it holds nothing.
/// SIGTERM: drain with no successor (finish within drain.grace, then exit).
#[derive(Debug, Parser)]
#[command(
    version,
    after_help = "Every configuration key can also be set as BLIPLESS_<SECTION>_<KEY> (for example BLIPLESS_STORE_URL=sqlite:///tmp/state.db); precedence: defaults < file < environment < --set."
)]
struct Args {
    /// The TOML configuration file shared with blipless-ingress.
    #[arg(long, short, env = "BLIPLESS_CONFIG")]
    config: Option<PathBuf>,
    /// Override one key, for example `--set drain.grace=30s` (repeatable).
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
            eprintln!("blipless-device: {errors}");
            return ExitCode::from(EXIT_CONFIG_ERROR as u8);
        }
    };
    blipless_config::daemon::init_logging(&config);
    blipless_config::daemon::raise_fd_limit();
    match run(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error:#}");
            eprintln!("blipless-device: {error:#}");
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
            eprintln!("blipless-device --supervise: locating this program: {error}");
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
        let terminate = CancellationToken::new();
        let signals = terminate.clone();
        let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("installing the SIGTERM handler")?;
        let restart = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined2())
            .context("installing the SIGUSR2 handler")?;
        tokio::spawn(async move {
            tokio::select! {
                _ = sigterm.recv() => tracing::info!("SIGTERM: draining"),
                _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: draining"),
            }
            signals.cancel();
        });
        tokio::spawn(blipless_supervise::lifecycle::wait_for_successor(
            restart,
            config.drain.grace,
            terminate.clone(),
        ));
        tokio::spawn(blipless_supervise::lifecycle::tell_stopping(
            terminate.clone(),
        ));
        blipless_device::run(config, terminate).await
    })
}
