//! `blipless-device`: parse the command line and configuration, then run a
//! device plane until the ingress says Drain or SIGTERM/SIGINT asks for one
//! (the process around it is [`blipless_supervise::daemon`]).

use std::process::ExitCode;

use blipless_supervise::daemon::{self, DaemonArgs};
use clap::{CommandFactory, Parser};

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
    version = blipless_config::build::VERSION,
    after_help = "Every configuration key can also be set as BLIPLESS_<SECTION>_<KEY> (for example BLIPLESS_STORE_URL=sqlite:///tmp/state.db), except the [[egress.upstream]] tables, which only the file holds; precedence: defaults < file < environment < --set.",
    mut_arg("config", |a| a.help("The TOML configuration file shared with blipless-ingress"))
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
    daemon::main_with(
        env!("CARGO_BIN_NAME"),
        args.daemon,
        blipless_device::privileges::drop_net_admin_if_unneeded,
        blipless_device::run,
    )
}
