//! The life of a blipless daemon process, shared by `blipless-ingress` and
//! `blipless-device`: the common command line, the `--supervise` re-exec,
//! loading the configuration (exit 64 on an error), logging and the
//! open-file limit, the async runtime, and the signals: SIGTERM and SIGINT
//! start a drain, SIGUSR2 (a restart under the stand-in) waits for a
//! successor, and the service manager hears STOPPING=1 when a drain starts.
//!
//! Each binary's `main.rs` keeps its own `--help` text: a clap `Parser` with
//! the binary's `about`, [`DaemonArgs`] flattened into it, and `mut_arg` to
//! reword the options whose help names the other daemon; then it calls
//! [`main`] with its `run(config, shutdown)`.

use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use blipless_config::{Config, ConfigError, ConfigErrors, EXIT_CONFIG_ERROR};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The options every daemon takes. The help of `config` and `sets` is
/// generic here: a binary rewords it (`mut_arg("config", ...)`) to name the
/// other daemon or give an example of its own.
#[derive(Debug, Clone, clap::Args)]
pub struct DaemonArgs {
    /// The TOML configuration file both daemons read.
    #[arg(long, short, env = "BLIPLESS_CONFIG")]
    pub config: Option<PathBuf>,
    /// Override one key, for example `--set drain.grace=30s` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<std::ffi::OsString>,
    /// Log as JSON lines instead of human-readable text (as a last --set log.format=json).
    #[arg(long)]
    pub log_json: bool,
    /// Run under a stand-in main process for systemd (Type=notify,
    /// KillMode=process, RestartKillSignal=SIGUSR2): it relays readiness and
    /// SIGTERM/SIGINT, and on a restart (SIGUSR2) leaves this daemon running
    /// for its successor. Needs NOTIFY_SOCKET.
    #[arg(long, env = "BLIPLESS_SUPERVISE", value_parser = clap::builder::BoolishValueParser::new())]
    pub supervise: bool,
    /// Write man pages and shell completions into DIR and exit (packaging).
    #[arg(long, hide = true, value_name = "DIR")]
    pub write_docs: Option<PathBuf>,
}

/// `--write-docs DIR`: the binary's man pages and completions, exit 0 (1 on
/// an I/O error).
pub fn write_docs(command: clap::Command, name: &str, dir: &std::path::Path) -> ExitCode {
    match crate::docs::write_docs(command, name, dir) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{name}: writing docs into {}: {error}", dir.display());
            ExitCode::FAILURE
        }
    }
}

/// Runs the daemon `name` (its binary's name, for messages on stderr) from
/// its parsed `args` to its exit status: under the stand-in if `--supervise`
/// asks for it (before anything else is loaded); otherwise it loads the
/// configuration and checks the files it names that the daemon reads at
/// start (`start_problems`; exit 64 listing every problem of both), sets up
/// logging and the open-file limit, and runs `serve(config, shutdown)` as a
/// task on a multi-threaded runtime, `shutdown` being cancelled by SIGTERM,
/// SIGINT, or a SIGUSR2 that no successor answered within `drain.grace`. An
/// error from `serve` is logged, printed, and exits 1.
pub fn main<F, Fut>(
    name: &str,
    args: DaemonArgs,
    start_problems: fn(&Config) -> Vec<ConfigError>,
    serve: F,
) -> ExitCode
where
    F: FnOnce(Config, CancellationToken) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    run_daemon(name, args, start_problems, |_| Ok(None), serve)
}

/// [`main`] for a daemon that reads no file at start beyond what loading
/// the configuration reads, with `before_threads(&config)` run once the
/// configuration is loaded and before any thread is started (logging's
/// included): the place for what is per thread, such as giving up a
/// capability. What it returns is logged once logging is up: `Ok(Some)` at
/// info, `Err` as a warning.
pub fn main_with<B, F, Fut>(name: &str, args: DaemonArgs, before_threads: B, serve: F) -> ExitCode
where
    B: FnOnce(&Config) -> Result<Option<String>, String>,
    F: FnOnce(Config, CancellationToken) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    run_daemon(name, args, |_| Vec::new(), before_threads, serve)
}

fn run_daemon<B, F, Fut>(
    name: &str,
    args: DaemonArgs,
    start_problems: fn(&Config) -> Vec<ConfigError>,
    before_threads: B,
    serve: F,
) -> ExitCode
where
    B: FnOnce(&Config) -> Result<Option<String>, String>,
    F: FnOnce(Config, CancellationToken) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    if args.supervise {
        return supervise(name);
    }
    let mut sets = args.sets;
    if args.log_json {
        sets.push("log.format=json".into());
    }
    let bad_flags = blipless_config::daemon::take_bad_flag_variables();
    let loaded = Config::load_os(args.config.as_deref(), std::env::vars_os(), &sets);
    // Every problem at once: the configuration's, the flag variables', and
    // (once it loads) the files it names that this daemon reads at start.
    let (config, mut problems) = match loaded {
        Ok(config) => {
            let problems = start_problems(&config);
            (Some(config), problems)
        }
        Err(ConfigErrors(errors)) => (None, errors),
    };
    problems.extend(bad_flags);
    let config = match config {
        Some(config) if problems.is_empty() => config,
        _ => {
            eprintln!("{name}: {}", ConfigErrors(problems));
            return ExitCode::from(EXIT_CONFIG_ERROR as u8);
        }
    };
    let before = before_threads(&config);
    blipless_config::daemon::init_logging(&config);
    match before {
        Ok(Some(said)) => tracing::info!("{said}"),
        Ok(None) => {}
        Err(error) => tracing::warn!("{error}"),
    }
    blipless_config::daemon::raise_fd_limit();
    match run(config, serve) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // Once: the log goes to stderr too, so a second eprintln would
            // print the same line twice (in the journal as well).
            tracing::error!("{name}: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// `--supervise`: run this program again, without the flag, under the
/// stand-in ([`crate::run`]).
fn supervise(name: &str) -> ExitCode {
    let program = match std::env::current_exe() {
        Ok(program) => program,
        Err(error) => {
            eprintln!("{name} --supervise: locating this program: {error}");
            return ExitCode::FAILURE;
        }
    };
    let args = crate::child_args(std::env::args_os().skip(1));
    let code = crate::run(&program, &args);
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// The runtime, the signal handlers and the tasks around `serve`.
fn run<F, Fut>(config: Config, serve: F) -> anyhow::Result<()>
where
    F: FnOnce(Config, CancellationToken) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async {
        let shutdown = CancellationToken::new();
        // WatchdogSec=: a runtime that still schedules timers says so; a
        // wedged one stops, and systemd restarts the unit.
        if let Some(every) = crate::notify::watchdog_interval() {
            tokio::spawn(async move {
                let mut ticks = tokio::time::interval(every);
                loop {
                    ticks.tick().await;
                    if let Err(error) = crate::notify::notify("WATCHDOG=1") {
                        tracing::debug!(%error, "sending WATCHDOG=1 failed");
                    }
                }
            });
        }
        let signals = shutdown.clone();
        let mut terminate =
            signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
        let restart =
            signal(SignalKind::user_defined2()).context("installing the SIGUSR2 handler")?;
        tokio::spawn(async move {
            tokio::select! {
                _ = terminate.recv() => tracing::info!("SIGTERM: draining"),
                _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: draining"),
            }
            signals.cancel();
        });
        tokio::spawn(wait_for_successor(
            restart,
            config.drain.grace,
            shutdown.clone(),
        ));
        tokio::spawn(tell_stopping(shutdown.clone()));
        // On a worker, not on this thread: a task `serve` spawns (a
        // connection the device plane takes, say) then starts on the same
        // worker, with no other thread woken to steal it from the runtime's
        // shared queue. That wake-up and the hop cost every new connection
        // a futex call and a thread switch or more.
        match tokio::spawn(serve(config, shutdown)).await {
            Ok(result) => result,
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Err(error) => Err(anyhow::anyhow!("the daemon's task ended: {error}")),
        }
    })
}

/// SIGUSR2 (`systemctl restart` through the `--supervise` stand-in): a
/// successor is starting beside this process and takes over (an ingress by
/// handoff, a device plane by a deploy), which ends this one. If it is still
/// running `grace` later, no successor came, and `drain` is cancelled: the
/// process drains as on SIGTERM.
///
/// The grace counts from the end of this process's own overlap with its
/// predecessor ([`BesidePredecessor`]), not from the signal: a successor
/// waits for its turn until then (two restarts in a row), and a grace
/// spent meanwhile would drain the node under it. That wait is bounded too,
/// by `grace` and [`OVERLAP_MARGIN`].
async fn wait_for_successor(mut restart: Signal, grace: Duration, drain: CancellationToken) {
    if restart.recv().await.is_none() {
        return;
    }
    let mut overlaps = OVERLAPS.subscribe();
    if *overlaps.borrow() > 0 {
        tracing::info!(
            "SIGUSR2 while still beside the predecessor: the grace counts once it has gone"
        );
        tokio::select! {
            _ = overlaps.wait_for(|beside| *beside == 0) => {}
            () = tokio::time::sleep(grace + OVERLAP_MARGIN) => {
                tracing::warn!("the predecessor is still here after drain.grace and a margin: counting the grace from now");
            }
            () = drain.cancelled() => return,
        }
    }
    tracing::info!(?grace, "SIGUSR2: waiting for a successor");
    tokio::select! {
        () = tokio::time::sleep(grace) => {
            tracing::warn!(?grace, "no successor took over within drain.grace: draining");
            drain.cancel();
        }
        () = drain.cancelled() => {}
    }
}

/// How much longer than `drain.grace` a SIGUSR2 waits for this process's
/// overlap with its predecessor to end before counting the grace anyway
/// (the predecessor leaves within its grace; this allows for a slow exit).
pub const OVERLAP_MARGIN: Duration = Duration::from_secs(5);

/// How many [`BesidePredecessor`] marks are alive in this process.
static OVERLAPS: std::sync::LazyLock<watch::Sender<usize>> =
    std::sync::LazyLock::new(|| watch::Sender::new(0));

/// Marks this process as still beside the predecessor it took over from
/// (an ingress whose predecessor has not exited yet), for as long as it is
/// alive: a SIGUSR2 meanwhile starts counting its grace only once the mark
/// is dropped ([`wait_for_successor`]). Process-wide, as signals are.
#[derive(Debug)]
#[must_use = "the mark ends when it is dropped"]
pub struct BesidePredecessor(());

impl BesidePredecessor {
    /// This process is beside its predecessor from now on.
    pub fn mark() -> Self {
        OVERLAPS.send_modify(|beside| *beside += 1);
        Self(())
    }
}

impl Drop for BesidePredecessor {
    fn drop(&mut self) {
        OVERLAPS.send_modify(|beside| *beside = beside.saturating_sub(1));
    }
}

/// Tells the service manager STOPPING=1 once `drain` is cancelled, however
/// the drain was asked for (a stand-in already gone makes this fail: logged
/// only).
async fn tell_stopping(drain: CancellationToken) {
    drain.cancelled().await;
    if let Err(error) = crate::notify::stopping() {
        tracing::debug!(%error, "telling the service manager STOPPING=1 failed");
    }
}
