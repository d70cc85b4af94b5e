//! `blipless-ingress`: parse the command line and configuration, then run
//! the ingress until SIGTERM or SIGINT starts a drain (the process around it
//! is [`blipless_supervise::daemon`]).

use std::process::ExitCode;

use blipless_supervise::daemon::{self, DaemonArgs};
use clap::{CommandFactory, Parser};

/// The stable plane of a blipless node: owns the customer-facing sockets and
/// hands every accepted connection to the active device plane; terminates
/// WireGuard and trades inner packets with the device plane; serves /status
/// and /metrics and the control socket for blipless-ctl. Starting a second one
/// beside a running one restarts the ingress by handoff: the new one takes the
/// sockets and WireGuard peers, the old one exits once its peers and device
/// planes have moved.
/// SIGTERM or `blipless-ctl drain`: drain the node and exit.
#[derive(Debug, Parser)]
#[command(
    version = blipless_config::build::VERSION,
    after_help = "Every configuration key can also be set as BLIPLESS_<SECTION>_<KEY> (for example BLIPLESS_LISTEN_SOCKS=127.0.0.1:1081), except the [[egress.upstream]] tables, which only the file holds; precedence: defaults < file < environment < --set.",
    mut_arg("config", |a| a.help("The TOML configuration file shared with blipless-device")),
    mut_arg("sets", |a| a.help("Override one key, for example `--set listen.socks=127.0.0.1:1081` (repeatable)"))
)]
struct Args {
    #[command(flatten)]
    daemon: DaemonArgs,
}

fn main() -> ExitCode {
    blipless_config::daemon::forget_empty_flag_variables();
    let args = Args::parse();
    if let Some(dir) = &args.daemon.write_docs {
        return daemon::write_docs(Args::command(), env!("CARGO_BIN_NAME"), dir);
    }
    daemon::main(
        env!("CARGO_BIN_NAME"),
        args.daemon,
        blipless_config::files::ingress_start_problems,
        blipless_ingress::run,
    )
}
