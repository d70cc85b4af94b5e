//! `blipless-ctl`: the operator's tool. `status` asks the ingress over its
//! control socket; `client add|set|show|list|remove` manage clients in the store and
//! return once this node's device planes applied the change (read-your-writes,
//! through the ingress's control socket; `client add --wg` also
//! gives the client a WireGuard address and key pair and prints its wg-quick
//! config: see [`blipless_ctl::wg_clients`]); `net setup|teardown`
//! prepare the host for WireGuard packet egress.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use blipless_config::{Config, EXIT_CONFIG_ERROR};
use blipless_store as store;
use clap::{Parser, Subcommand};
use serde_json::json;

/// Prints a line; a reader that went away (`| head`) ends the program quietly.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::print_line(format_args!($($arg)*))
    };
}

pub(crate) fn print_line(line: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if let Err(error) = writeln!(out, "{line}") {
        if error.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("blipless-ctl: writing the output failed: {error}");
        std::process::exit(1);
    }
}

mod clients;
mod control;
mod host;
mod limits;

use clients::WgNode;
use clients::{add, list, remove};
use control::{deploy, drain, print_egress, print_status, status_report};
use host::net;

/// Operate a blipless node: its status and its proxy clients.
#[derive(Debug, Parser)]
#[command(name = "blipless-ctl", version = blipless_config::build::VERSION)]
struct Args {
    /// The TOML configuration file the node's daemons use.
    #[arg(long, short, env = "BLIPLESS_CONFIG", global = true)]
    config: Option<PathBuf>,
    /// Override one key, for example `--set node.runtime_dir=/tmp/blip` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE", global = true)]
    sets: Vec<std::ffi::OsString>,
    /// Print JSON for machines instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The node's readiness, listeners and device planes (asks the ingress).
    Status,
    /// Drain the node: /status 503, listeners close after the lame-duck
    /// period, device planes finish what they hold, the ingress exits.
    Drain {
        /// Show progress every half second until the ingress is gone.
        #[arg(long)]
        watch: bool,
    },
    /// The latest device-plane deploy (start a second blipless-device to deploy).
    Deploy {
        /// Show progress every half second until the deploy is over.
        #[arg(long)]
        watch: bool,
    },
    /// Manage proxy clients (in the store; returns once this node's device planes have the change; exit 75 if they did not confirm).
    Client {
        #[command(subcommand)]
        command: ClientCommand,
    },
    /// The HTTPS proxy listener's certificate (asks the ingress).
    Tls {
        #[command(subcommand)]
        command: TlsCommand,
    },
    /// Egress routes (direct and upstreams) as the active device plane sees
    /// them: up or down, latency, clients, tunnels (asks the ingress).
    Egress,
    /// The configuration file's keys.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Host network setup for WireGuard packet egress (needs CAP_NET_ADMIN).
    Net {
        #[command(subcommand)]
        command: NetCommand,
    },
}

#[derive(Debug, Subcommand)]
enum TlsCommand {
    /// Read tls.certificate and tls.key again (as SIGHUP does): new
    /// handshakes use the new certificate, open connections keep theirs. A
    /// file that does not load keeps the certificate in use; the answer
    /// says why and the exit status is 1. On an ingress without an HTTPS
    /// listener there is nothing to reload: it says so and exits 0.
    Reload,
}

#[derive(Debug, Subcommand)]
enum NetCommand {
    /// Create the persistent multi-queue TUN device (egress.tun.name) with
    /// the node's pool address, turn IPv4 forwarding on, set up each
    /// WireGuard exit's TUN device and routing rules, and (re)load the
    /// nftables tables `inet blipless` (masquerade out of
    /// egress.tun.out_interface; invalid TCP answered with a reset) and
    /// `inet blipless_steer`. Marks its TUN devices with the alias
    /// "blipless ...". Idempotent.
    Setup,
    /// Delete the nftables tables, the TUN devices and the exits' routing
    /// rules, including those an earlier configuration's setup made (found
    /// by their marks, also when the configuration does not load; it then
    /// still exits 64 listing the problems). Goes on past a step that fails
    /// and lists every failure (exit 1). Idempotent; leaves IPv4 forwarding
    /// as it is.
    Teardown,
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Print a TOML file with every key, its default and what it is for
    /// (under --json: {"toml": "..."}). Reads no configuration.
    Defaults,
    /// Load the configuration (--config, BLIPLESS_* variables, --set) as the
    /// daemons would: exit 0 when it is sound, 64 listing every problem.
    Check,
    /// Write man pages and shell completions into DIR (packaging).
    #[command(hide = true)]
    Docs {
        /// Where to write them.
        dir: std::path::PathBuf,
    },
}

#[derive(Debug, Subcommand)]
enum ClientCommand {
    /// Create a client with a new random secret and print its proxy URLs.
    Add {
        /// The client's name, also its proxy username ([A-Za-z0-9._-], up to 64).
        name: String,
        /// Also make it a WireGuard client: give it the lowest free address of
        /// wireguard.pool and a new key pair, and print its wg-quick config (and a
        /// QR code of it on a terminal). Needs wireguard.endpoint.
        #[arg(long)]
        wg: bool,
        /// Which routes its egress window may use: any (every upstream, or
        /// direct when there is none), direct, upstream:NAME or tags:A,B.
        #[arg(long, default_value = "any")]
        egress: String,
        /// With --wg: also write the config's QR code to FILE as a PNG (mode 0600:
        /// it holds the client's private key).
        #[arg(long, value_name = "FILE", requires = "wg")]
        qr_png: Option<std::path::PathBuf>,
        #[command(flatten)]
        limits: limits::LimitArgs,
    },
    /// Change a client's limits (docs/LIMITS.md); a limit left out stays as it
    /// is, `none` clears it (the node's [limits] default applies).
    #[command(group(
        clap::ArgGroup::new("change")
            .required(true)
            .multiple(true)
            .args(["rate_up", "rate_down", "quota", "max_connections", "source", "quota_reset"])
    ))]
    Set {
        /// The client's name.
        name: String,
        #[command(flatten)]
        limits: limits::LimitArgs,
        /// Start the client's quota count of the current period again from zero.
        #[arg(long)]
        quota_reset: bool,
    },
    /// Show what the store keeps of a client: its proxy URLs (without the secret),
    /// usage, and a WireGuard client's config without its private key, which
    /// blipless does not keep (so no QR code: it says why).
    Show {
        /// The client's name.
        name: String,
        /// Refused with the reason: a scannable config needs the private key.
        #[arg(long, value_name = "FILE")]
        qr_png: Option<std::path::PathBuf>,
    },
    /// List clients, their WireGuard addresses and their usage.
    List,
    /// Remove a client; when it returns, it is refused and its open connections on this node are closed.
    Remove {
        /// The client's name.
        name: String,
    },
}

/// A configuration that cannot serve the command: exits with [`EXIT_CONFIG_ERROR`],
/// like a configuration that does not load.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct ConfigProblem(String);

/// Every configuration problem a command found before changing anything,
/// reported together (exit [`EXIT_CONFIG_ERROR`]), as a configuration that
/// does not load reports all of its own.
#[derive(Debug)]
pub(crate) struct ConfigProblems(Vec<String>);

impl std::fmt::Display for ConfigProblems {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.as_slice() {
            [one] => f.write_str(one),
            all => {
                write!(f, "{} problems with this command:", all.len())?;
                for problem in all {
                    write!(f, "\n  - {problem}")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for ConfigProblems {}

/// Both results, or every [`ConfigProblem`] among their errors (an error of
/// another kind wins: the first one).
fn both<A, B>(a: anyhow::Result<A>, b: anyhow::Result<B>) -> anyhow::Result<(A, B)> {
    match (a, b) {
        (Ok(a), Ok(b)) => Ok((a, b)),
        (Err(e), Ok(_)) | (Ok(_), Err(e)) => Err(e),
        (Err(first), Err(second)) => match (
            first.downcast_ref::<ConfigProblem>(),
            second.downcast_ref::<ConfigProblem>(),
        ) {
            (Some(one), Some(two)) => {
                Err(ConfigProblems(vec![one.0.clone(), two.0.clone()]).into())
            }
            (None, _) => Err(first),
            (_, None) => Err(second),
        },
    }
}

/// A client change is in the store, but the running node did not confirm
/// that its device planes applied it: exits with [`EXIT_UNCONFIRMED`].
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Unconfirmed(String);

/// A failure the `--json` answer already carries: exit 1 without a second
/// JSON object (said on stderr without `--json`).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Answered(pub(crate) String);

/// The command line, with every `--set` kept in the order given.
///
/// `--set` is global, so it may come before the subcommand or after it (or
/// both), but clap keeps only the values of the deepest level that has any:
/// `--set store.url=... client add bob --wg --set wireguard.endpoint=...`
/// silently dropped the store. The values are therefore taken from the
/// command line itself, as clap read it (a `--set` token is always the flag:
/// no option here takes a value beginning with `--`, and nothing follows a
/// `--`).
fn parse_args() -> Args {
    let mut args = Args::parse();
    args.sets = sets_in_order(std::env::args_os().skip(1));
    args
}

/// Every `--set` value on a command line, in order, UTF-8 or not (one that
/// is not is reported with the configuration's other problems).
fn sets_in_order(
    arguments: impl IntoIterator<Item = std::ffi::OsString>,
) -> Vec<std::ffi::OsString> {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let mut sets = Vec::new();
    let mut arguments = arguments.into_iter();
    while let Some(argument) = arguments.next() {
        if argument == "--" {
            break;
        }
        if argument == "--set" {
            sets.extend(arguments.next());
        } else if let Some(value) = argument.as_bytes().strip_prefix(b"--set=") {
            sets.push(std::ffi::OsString::from_vec(value.to_vec()));
        }
    }
    sets
}

/// Exit status when a change is stored but the node could not confirm it
/// (EX_TEMPFAIL: the planes pick it up from the change feed later).
pub(crate) const EXIT_UNCONFIRMED: u8 = 75;

fn main() -> ExitCode {
    blipless_config::daemon::forget_empty_flag_variables();
    let args = parse_args();
    if let Command::Config {
        command: ConfigCommand::Docs { dir },
    } = &args.command
    {
        use clap::CommandFactory;
        return blipless_supervise::daemon::write_docs(Args::command(), "blipless-ctl", dir);
    }
    if let Command::Config {
        command: ConfigCommand::Defaults,
    } = &args.command
    {
        // Needs no configuration: it prints what one looks like.
        let defaults = blipless_config::documented_defaults();
        if args.json {
            say!("{}", json!({ "toml": defaults }));
        } else {
            say!("{}", defaults.trim_end());
        }
        return ExitCode::SUCCESS;
    }
    let config = match Config::load_os(args.config.as_deref(), std::env::vars_os(), &args.sets) {
        Ok(config) => config,
        Err(mut errors) => {
            // The check lists what makes the daemons exit 64 beside the
            // configuration, as they do.
            if matches!(
                args.command,
                Command::Config {
                    command: ConfigCommand::Check
                }
            ) {
                errors
                    .0
                    .extend(blipless_config::daemon::take_bad_flag_variables());
            }
            // Removing the host setup must not hang on a configuration that
            // may be broken because the node is going away (an exit's file
            // deleted before `apt remove`): what setup made is found by its
            // marks. The problems are still reported, with exit 64.
            let teardown = matches!(
                args.command,
                Command::Net {
                    command: NetCommand::Teardown
                }
            )
            .then(host::teardown_marked);
            if args.json {
                let problems: Vec<String> = errors.0.iter().map(|e| e.to_string()).collect();
                let mut answer = json!({ "error": "configuration", "problems": problems });
                if let Some(done) = &teardown {
                    answer["teardown"] = match done {
                        Ok(done) if done.failures.is_empty() => json!({
                            "ok": true,
                            "removed": host::removed_json(&done.removed),
                        }),
                        Ok(done) => json!({
                            "ok": false,
                            "removed": host::removed_json(&done.removed),
                            "failures": done.failures.iter().map(ToString::to_string).collect::<Vec<_>>(),
                        }),
                        Err(error) => json!({ "ok": false, "failures": [format!("{error:#}")] }),
                    };
                }
                say!("{answer}");
            } else {
                eprintln!("blipless-ctl: {errors}");
                match teardown {
                    Some(Ok(done)) => {
                        eprintln!(
                            "blipless-ctl: net teardown: removed what setup made anyway, found by its marks: {}",
                            host::removed_text(&done.removed)
                        );
                        for failure in &done.failures {
                            eprintln!("blipless-ctl: net teardown: {failure}");
                        }
                    }
                    Some(Err(error)) => eprintln!("blipless-ctl: net teardown: {error:#}"),
                    None => {}
                }
            }
            return ExitCode::from(EXIT_CONFIG_ERROR as u8);
        }
    };
    match run(&args, &config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) if error.is::<ConfigProblem>() || error.is::<ConfigProblems>() => {
            if args.json {
                let problems = match error.downcast_ref::<ConfigProblems>() {
                    Some(all) => all.0.clone(),
                    None => vec![error.to_string()],
                };
                say!(
                    "{}",
                    json!({ "error": "configuration", "problems": problems })
                );
            } else {
                eprintln!("blipless-ctl: {error}");
            }
            ExitCode::from(EXIT_CONFIG_ERROR as u8)
        }
        Err(error) if error.is::<Answered>() => {
            if !args.json {
                eprintln!("blipless-ctl: {error}");
            }
            ExitCode::FAILURE
        }
        Err(error) if error.is::<Unconfirmed>() => {
            // The answer line already said so under --json.
            if !args.json {
                eprintln!("blipless-ctl: {error}");
            }
            ExitCode::from(EXIT_UNCONFIRMED)
        }
        Err(error) => {
            if args.json {
                say!("{}", json!({ "error": format!("{error:#}") }));
            } else {
                eprintln!("blipless-ctl: {error:#}");
            }
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args, config: &Config) -> anyhow::Result<()> {
    match &args.command {
        Command::Status => {
            let report = status_report(config)?;
            if args.json {
                say!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print_status(&report);
            }
            Ok(())
        }
        Command::Drain { watch } => drain(config, *watch, args.json),
        Command::Tls {
            command: TlsCommand::Reload,
        } => control::tls_reload(config, args.json),
        Command::Egress => {
            let report = status_report(config)?;
            print_egress(&report, args.json)
        }
        Command::Config {
            command: ConfigCommand::Check,
        } => {
            // Loading it was the check (main exits 64 with every problem);
            // what the daemons read only when they start is read here too,
            // with this user's rights (the package's postinst runs the check
            // as the service user).
            let mut problems: Vec<String> = blipless_config::files::ingress_start_problems(config)
                .iter()
                .map(ToString::to_string)
                .collect();
            // What makes the daemons exit 64 beside the configuration.
            problems.extend(
                blipless_config::daemon::take_bad_flag_variables()
                    .iter()
                    .map(ToString::to_string),
            );
            if !problems.is_empty() {
                return Err(ConfigProblems(problems).into());
            }
            let source = args.config.as_ref().map_or_else(
                || "no file: defaults".to_owned(),
                |p| p.display().to_string(),
            );
            if args.json {
                say!("{}", json!({ "ok": true, "config": source }));
            } else {
                say!("configuration sound ({source})");
            }
            Ok(())
        }
        // Answered in main before any configuration is read.
        Command::Config {
            command: ConfigCommand::Defaults | ConfigCommand::Docs { .. },
        } => Ok(()),
        Command::Deploy { watch } => deploy(config, *watch, args.json),
        Command::Net { command } => net(config, command, args.json),
        Command::Client { command } => {
            // Before the store is opened, and all at once: a missing setting
            // or an unknown upstream changes nothing.
            let checked_add = match command {
                ClientCommand::Add { wg, egress, .. } => {
                    let policy = clients::egress_policy(config, egress);
                    // The node's key is created only for an add that will be made.
                    let node = match (*wg, &policy) {
                        (false, _) => Ok(None),
                        (true, Ok(_)) => WgNode::prepare(config).map(Some),
                        (true, Err(_)) => WgNode::check(config).map(|()| None),
                    };
                    Some(both(node, policy)?)
                }
                _ => None,
            };
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            runtime.block_on(async {
                let store = store::open(&config.store.url).await.with_context(|| {
                    format!(
                        "opening the store {} (is store.url the same as the device plane's?)",
                        store::display_url(&config.store.url)
                    )
                })?;
                match command {
                    ClientCommand::Add {
                        name,
                        qr_png,
                        limits,
                        ..
                    } => {
                        let Some((wg, policy)) = checked_add else {
                            unreachable!("checked above for every client add");
                        };
                        let new = clients::NewClient {
                            name,
                            egress: policy,
                            limits: limits.apply(store::ClientLimits::default()),
                        };
                        let png = qr_png.as_deref();
                        add(&*store, config, new, wg.as_ref(), png, args.json).await
                    }
                    ClientCommand::Set {
                        name,
                        limits,
                        quota_reset,
                    } => limits::set(&*store, config, name, limits, *quota_reset, args.json).await,
                    ClientCommand::Show { name, qr_png } => {
                        clients::show(&*store, config, name, qr_png.as_deref(), args.json).await
                    }
                    ClientCommand::List => list(&*store, config, args.json).await,
                    ClientCommand::Remove { name } => {
                        remove(&*store, config, name, args.json).await
                    }
                }
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::sets_in_order;

    fn line(words: &[&str]) -> Vec<std::ffi::OsString> {
        words.iter().map(std::ffi::OsString::from).collect()
    }

    #[test]
    fn sets_before_and_after_the_subcommand_are_all_kept_in_order() {
        let sets = sets_in_order(line(&[
            "--set",
            "store.url=redis://127.0.0.1:1",
            "client",
            "add",
            "bob",
            "--set=wireguard.endpoint=192.0.2.1:51820",
            "--wg",
            "--set",
            "log.level=debug",
        ]));
        assert_eq!(
            sets,
            [
                "store.url=redis://127.0.0.1:1",
                "wireguard.endpoint=192.0.2.1:51820",
                "log.level=debug"
            ]
        );
    }

    #[test]
    fn nothing_after_a_double_dash_is_a_set() {
        assert_eq!(
            sets_in_order(line(&["--set", "a=1", "--", "--set", "b=2"])),
            ["a=1"]
        );
    }
}
