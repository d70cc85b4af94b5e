//! Host setup for packet egress: the persistent multi-queue TUN device, its
//! address (which routes the client pool to it), IPv4 forwarding, and one
//! nftables table that masquerades the client pool out of the configured
//! interface and answers `ct state invalid` TCP with a reset (so an orphaned
//! flow fails fast instead of hanging).
//!
//! Sans-IO core, thin runner: [`Plan::from_config`] checks the configuration
//! and [`Plan::setup_steps`] / [`Plan::teardown_steps`] say exactly what to
//! run (the `ip` commands, the sysctl, the nftables script) without touching
//! the host, so they are unit tested without root. [`setup`] and
//! [`teardown`] run those steps with `ip` and `nft` (tokio::process). Both
//! are idempotent: setting up twice changes nothing the second time, and
//! tearing down what is not there succeeds. The nftables table is replaced
//! in one atomic `nft -f -` transaction, so re-running setup never leaves a
//! moment without the rules, and conntrack's existing NAT bindings survive.
//!
//! `blipless-ctl net setup|teardown` call these; a device plane calls
//! [`setup`] at start when `egress.tun.manage = true`. Both need
//! CAP_NET_ADMIN. IPv4 client pools only, for now.

use std::fmt;
use std::net::Ipv4Addr;
use std::process::Stdio;
use std::time::Duration;

use blipless_config::Config;
use ipnet::{IpNet, Ipv4Net};
use tokio::io::AsyncWriteExt;

/// The nftables table blipless owns (family `inet`, so one table serves
/// both IP versions).
pub const NFT_TABLE: &str = "inet blipless";

/// Where IPv4 forwarding is switched on.
pub const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";

/// How long one `ip` or `nft` command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// Why host setup or teardown failed.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// `wireguard.pool` is an IPv6 network; TUN egress masquerades IPv4 only.
    #[error("wireguard.pool is {0}, an IPv6 network: packet egress through the TUN device supports IPv4 pools only for now")]
    Ipv6Pool(ipnet::Ipv6Net),
    /// `wireguard.pool` leaves no room for the node's address and a client.
    #[error("wireguard.pool {0} is too small: it needs room for the node's address and at least one client (a /30 or larger)")]
    PoolTooSmall(Ipv4Net),
    /// An interface name from the configuration is not usable.
    #[error("{key} = {name:?} is not a usable interface name: {reason}")]
    InterfaceName {
        /// The configuration key (`egress.tun.name` or `egress.tun.out_interface`).
        key: &'static str,
        /// The name as configured.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A device with the TUN's name exists but is not a multi-queue TUN.
    #[error("a network device named {name} exists but is {what}: delete it (`ip link del {name}`) or pick another egress.tun.name")]
    NotMultiQueueTun {
        /// The device's name.
        name: String,
        /// What it is instead (for example `a tun device without multi_queue`).
        what: String,
    },
    /// A command could not be started (for example `nft` is not installed).
    #[error("cannot run {program}: {source}{hint}")]
    Spawn {
        /// The program (`ip` or `nft`).
        program: &'static str,
        /// Why it could not be started.
        source: std::io::Error,
        /// What to do about it, possibly empty.
        hint: &'static str,
    },
    /// A command ran and failed, or did not finish in time.
    #[error("`{command}` failed ({status}): {stderr}{hint}")]
    Command {
        /// The command line.
        command: String,
        /// Its exit status, or why it has none.
        status: String,
        /// What it printed on standard error.
        stderr: String,
        /// What to do about it, possibly empty.
        hint: &'static str,
    },
    /// Reading or writing a sysctl failed.
    #[error("writing {value} to {path}: {source}{hint}")]
    Sysctl {
        /// The `/proc/sys` path.
        path: &'static str,
        /// The value being written.
        value: &'static str,
        /// Why it failed.
        source: std::io::Error,
        /// What to do about it, possibly empty.
        hint: &'static str,
    },
    /// `ip` printed something this code cannot read.
    #[error("cannot read the output of `{command}`: {detail}")]
    Unreadable {
        /// The command line.
        command: String,
        /// What was wrong with its output.
        detail: String,
    },
}

const HINT_CAP: &str = " (host network setup needs CAP_NET_ADMIN: run as root)";

/// What the configuration asks of the host, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The TUN device (`egress.tun.name`).
    pub tun: String,
    /// The interface client traffic is masqueraded out of (`egress.tun.out_interface`).
    pub out_interface: String,
    /// The client pool (`wireguard.pool`), host bits cleared.
    pub pool: Ipv4Net,
    /// The node's own address on the TUN device: the pool's first host
    /// address, with the pool's prefix length (the connected route sends
    /// the whole pool to the TUN device).
    pub address: Ipv4Net,
}

/// One command line: a program and its arguments, and optionally what to
/// feed it on standard input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cmd {
    /// `ip` or `nft`.
    pub program: &'static str,
    /// Its arguments.
    pub args: Vec<String>,
    /// Standard input (the nftables script for `nft -f -`).
    pub stdin: Option<String>,
}

impl Cmd {
    fn new(program: &'static str, args: &[&str]) -> Cmd {
        Cmd {
            program,
            args: args.iter().map(|a| a.to_string()).collect(),
            stdin: None,
        }
    }
}

impl fmt::Display for Cmd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.program)?;
        for arg in &self.args {
            write!(f, " {arg}")?;
        }
        Ok(())
    }
}

/// One step of setup or teardown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Look the device up (`probe`); create it (`create`) if there is none;
    /// accept a multi-queue TUN device; refuse any other device.
    EnsureTun {
        /// The device's name.
        name: String,
        /// `ip -j -d link show dev NAME`.
        probe: Cmd,
        /// `ip tuntap add dev NAME mode tun multi_queue`.
        create: Cmd,
    },
    /// Look the device up (`probe`); delete it (`delete`) if it is a TUN
    /// device; nothing if there is none; refuse any other device.
    RemoveTun {
        /// The device's name.
        name: String,
        /// `ip -j -d link show dev NAME`.
        probe: Cmd,
        /// `ip link del dev NAME`.
        delete: Cmd,
    },
    /// Run a command that is idempotent by itself.
    Run(Cmd),
    /// Write `value` to the sysctl at `path` unless it holds it already.
    Sysctl {
        /// The `/proc/sys` path.
        path: &'static str,
        /// The value.
        value: &'static str,
    },
}

impl Plan {
    /// Checks the configuration: an IPv4 pool with room for the node and a
    /// client, and interface names that are safe to put in an nftables
    /// script.
    pub fn from_config(config: &Config) -> Result<Plan, NetError> {
        let tun = &config.egress.tun;
        check_interface("egress.tun.name", &tun.name)?;
        check_interface("egress.tun.out_interface", &tun.out_interface)?;
        let pool = match config.wireguard.pool {
            IpNet::V4(pool) => pool.trunc(),
            IpNet::V6(pool) => return Err(NetError::Ipv6Pool(pool)),
        };
        Ok(Plan {
            tun: tun.name.clone(),
            out_interface: tun.out_interface.clone(),
            address: first_host(pool)?,
            pool,
        })
    }

    /// The nftables transaction setup runs with `nft -f -`: create the table
    /// if missing, delete it, and define it afresh, all in one atomic
    /// transaction.
    pub fn nft_script(&self) -> String {
        let Plan {
            tun,
            out_interface,
            pool,
            ..
        } = self;
        format!(
            "add table {NFT_TABLE}
delete table {NFT_TABLE}
table {NFT_TABLE} {{
	chain forward {{
		type filter hook forward priority filter; policy accept;
		iifname \"{tun}\" ct state invalid meta l4proto tcp reject with tcp reset
		iifname \"{tun}\" ct state invalid drop
	}}
	chain postrouting {{
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr {pool} oifname \"{out_interface}\" masquerade
	}}
}}
"
        )
    }

    /// The nftables transaction teardown runs: delete the table whether or
    /// not it exists.
    pub fn nft_teardown_script(&self) -> String {
        format!("add table {NFT_TABLE}\ndelete table {NFT_TABLE}\n")
    }

    /// What setup does, in order.
    pub fn setup_steps(&self) -> Vec<Step> {
        let name = self.tun.as_str();
        let address = self.address.to_string();
        vec![
            Step::EnsureTun {
                name: name.to_string(),
                probe: probe(name),
                create: Cmd::new(
                    "ip",
                    &["tuntap", "add", "dev", name, "mode", "tun", "multi_queue"],
                ),
            },
            Step::Run(Cmd::new("ip", &["addr", "replace", &address, "dev", name])),
            Step::Run(Cmd::new("ip", &["link", "set", "dev", name, "up"])),
            Step::Sysctl {
                path: IP_FORWARD,
                value: "1",
            },
            Step::Run(Cmd {
                stdin: Some(self.nft_script()),
                ..Cmd::new("nft", &["-f", "-"])
            }),
        ]
    }

    /// What teardown does, in order. Forwarding is left on: other services
    /// on the host may rely on it.
    pub fn teardown_steps(&self) -> Vec<Step> {
        let name = self.tun.as_str();
        vec![
            Step::Run(Cmd {
                stdin: Some(self.nft_teardown_script()),
                ..Cmd::new("nft", &["-f", "-"])
            }),
            Step::RemoveTun {
                name: name.to_string(),
                probe: probe(name),
                delete: Cmd::new("ip", &["link", "del", "dev", name]),
            },
        ]
    }
}

fn probe(name: &str) -> Cmd {
    Cmd::new("ip", &["-j", "-d", "link", "show", "dev", name])
}

/// The pool's first host address, with the pool's prefix length.
fn first_host(pool: Ipv4Net) -> Result<Ipv4Net, NetError> {
    // A /31 or /32 has no room for a client beside the node.
    if pool.prefix_len() > 30 {
        return Err(NetError::PoolTooSmall(pool));
    }
    let first = Ipv4Addr::from(u32::from(pool.network()) + 1);
    Ipv4Net::new(first, pool.prefix_len()).map_err(|_| NetError::PoolTooSmall(pool))
}

/// Accepts names the kernel accepts and that are safe inside an nftables
/// quoted string: 1 to 15 bytes of ASCII letters, digits, `_`, `-`, `.`.
fn check_interface(key: &'static str, name: &str) -> Result<(), NetError> {
    let reason = if name.is_empty() {
        Some("it is empty")
    } else if name.len() > 15 {
        Some("longer than 15 bytes")
    } else if name == "." || name == ".." {
        Some("not a name")
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    {
        Some("use only ASCII letters, digits, '_', '-' and '.'")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(NetError::InterfaceName {
            key,
            name: name.to_string(),
            reason,
        }),
        None => Ok(()),
    }
}

/// What `ip -j -d link show dev NAME` says about a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkState {
    /// No device of that name.
    Absent,
    /// A TUN device; `multi_queue` tells whether it has several queues.
    Tun {
        /// Created with `multi_queue`.
        multi_queue: bool,
    },
    /// Some other kind of device (`kind` from `linkinfo.info_kind`, or
    /// `unknown`).
    Other {
        /// Its kind.
        kind: String,
    },
}

/// Reads the JSON `ip -j -d link show dev NAME` printed for an existing device.
pub fn parse_link(json: &str) -> Result<LinkState, String> {
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|error| format!("not JSON: {error}"))?;
    let Some(link) = value.as_array().and_then(|links| links.first()) else {
        return Ok(LinkState::Absent);
    };
    let info = &link["linkinfo"];
    let kind = info["info_kind"].as_str().unwrap_or("unknown");
    if kind != "tun" || info["info_data"]["type"].as_str() != Some("tun") {
        let kind = match info["info_data"]["type"].as_str() {
            Some(flavour) if kind == "tun" => flavour.to_string(),
            _ => kind.to_string(),
        };
        return Ok(LinkState::Other { kind });
    }
    Ok(LinkState::Tun {
        multi_queue: info["info_data"]["multi_queue"].as_bool() == Some(true),
    })
}

/// Sets the host up for packet egress as `config` says (see the module
/// documentation). Idempotent.
pub async fn setup(config: &Config) -> Result<(), NetError> {
    let plan = Plan::from_config(config)?;
    run_steps(&plan.setup_steps()).await?;
    tracing::info!(
        tun = %plan.tun,
        address = %plan.address,
        pool = %plan.pool,
        out_interface = %plan.out_interface,
        "packet egress host setup done"
    );
    Ok(())
}

/// Removes what [`setup`] made: the nftables table and the TUN device.
/// Idempotent; leaves IPv4 forwarding as it is.
pub async fn teardown(config: &Config) -> Result<(), NetError> {
    let plan = Plan::from_config(config)?;
    run_steps(&plan.teardown_steps()).await?;
    tracing::info!(tun = %plan.tun, "packet egress host setup removed");
    Ok(())
}

async fn run_steps(steps: &[Step]) -> Result<(), NetError> {
    for step in steps {
        match step {
            Step::EnsureTun {
                name,
                probe,
                create,
            } => match link_state(probe).await? {
                LinkState::Absent => {
                    run(create).await?;
                    tracing::info!(%name, "created the persistent multi-queue TUN device");
                }
                LinkState::Tun { multi_queue: true } => {}
                LinkState::Tun { multi_queue: false } => {
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
            Step::Sysctl { path, value } => write_sysctl(path, value).await?,
        }
    }
    Ok(())
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

async fn write_sysctl(path: &'static str, value: &'static str) -> Result<(), NetError> {
    let error = |source: std::io::Error| NetError::Sysctl {
        path,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn config(sets: &[&str]) -> Config {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        match Config::load(None, std::iter::empty(), &sets) {
            Ok(config) => config,
            Err(errors) => panic!("test configuration: {errors}"),
        }
    }

    fn plan(sets: &[&str]) -> Plan {
        match Plan::from_config(&config(sets)) {
            Ok(plan) => plan,
            Err(error) => panic!("plan: {error}"),
        }
    }

    #[test]
    fn defaults_give_first_host_with_the_pool_prefix() {
        let plan = plan(&[]);
        assert_eq!(plan.tun, "blip0");
        assert_eq!(plan.out_interface, "eth0");
        assert_eq!(plan.pool.to_string(), "10.64.0.0/16");
        assert_eq!(plan.address.to_string(), "10.64.0.1/16");
    }

    #[test]
    fn first_host_of_other_pools() {
        let plan = plan(&["wireguard.pool=192.168.7.0/24"]);
        assert_eq!(plan.address.to_string(), "192.168.7.1/24");
        let plan = self::plan(&["wireguard.pool=172.16.0.4/30"]);
        assert_eq!(plan.address.to_string(), "172.16.0.5/30");
    }

    #[test]
    fn host_bits_in_the_pool_are_cleared() -> Result<(), ipnet::AddrParseError> {
        // The configuration refuses such a pool; the plan copes anyway.
        let mut config = config(&[]);
        config.wireguard.pool = "192.168.7.77/24".parse()?;
        let plan = Plan::from_config(&config);
        let plan = plan
            .as_ref()
            .map(|p| (p.pool.to_string(), p.address.to_string()));
        assert_eq!(
            plan.ok(),
            Some(("192.168.7.0/24".to_string(), "192.168.7.1/24".to_string()))
        );
        Ok(())
    }

    #[test]
    fn tiny_pools_are_refused() {
        for pool in ["10.0.0.0/31", "10.0.0.1/32"] {
            let set = format!("wireguard.pool={pool}");
            let result = Plan::from_config(&config(&[&set]));
            assert!(
                matches!(result, Err(NetError::PoolTooSmall(_))),
                "{pool}: {result:?}"
            );
        }
    }

    #[test]
    fn ipv6_pool_is_refused_clearly() {
        let result = Plan::from_config(&config(&["wireguard.pool=fd00:64::/64"]));
        let Err(error) = result else {
            panic!("an IPv6 pool was accepted: {result:?}");
        };
        assert!(matches!(error, NetError::Ipv6Pool(_)), "{error:?}");
        let message = error.to_string();
        assert!(message.contains("fd00:64::/64"), "{message}");
        assert!(message.contains("IPv4"), "{message}");
    }

    #[test]
    fn nft_script_replaces_the_table_with_masquerade_and_reset() {
        let script = plan(&[
            "egress.tun.name=wg-out",
            "egress.tun.out_interface=ens5",
            "wireguard.pool=10.99.0.0/20",
        ])
        .nft_script();
        let lines: Vec<&str> = script.lines().map(str::trim).collect();
        assert_eq!(lines[0], "add table inet blipless");
        assert_eq!(lines[1], "delete table inet blipless");
        assert_eq!(lines[2], "table inet blipless {");
        let position = |wanted: &str| {
            lines
                .iter()
                .position(|line| *line == wanted)
                .unwrap_or_else(|| panic!("no line {wanted:?} in:\n{script}"))
        };
        let reset =
            position("iifname \"wg-out\" ct state invalid meta l4proto tcp reject with tcp reset");
        let drop = position("iifname \"wg-out\" ct state invalid drop");
        assert!(reset < drop, "the reset must come before the drop");
        assert!(position("type filter hook forward priority filter; policy accept;") < reset);
        let masquerade = position("ip saddr 10.99.0.0/20 oifname \"ens5\" masquerade");
        assert!(position("type nat hook postrouting priority srcnat; policy accept;") < masquerade);
        assert_eq!(script.matches("table inet blipless").count(), 3);
    }

    #[test]
    fn setup_and_teardown_steps() {
        let plan = plan(&[]);
        let steps = plan.setup_steps();
        let lines: Vec<String> = steps
            .iter()
            .map(|step| match step {
                Step::EnsureTun { create, .. } => create.to_string(),
                Step::RemoveTun { delete, .. } => delete.to_string(),
                Step::Run(cmd) => cmd.to_string(),
                Step::Sysctl { path, value } => format!("{value} > {path}"),
            })
            .collect();
        assert_eq!(
            lines,
            [
                "ip tuntap add dev blip0 mode tun multi_queue",
                "ip addr replace 10.64.0.1/16 dev blip0",
                "ip link set dev blip0 up",
                "1 > /proc/sys/net/ipv4/ip_forward",
                "nft -f -",
            ]
        );
        assert!(
            matches!(&steps[4], Step::Run(Cmd { stdin: Some(script), .. }) if *script == plan.nft_script())
        );
        let teardown = plan.teardown_steps();
        assert!(
            matches!(&teardown[0], Step::Run(Cmd { stdin: Some(script), .. })
            if script == "add table inet blipless\ndelete table inet blipless\n")
        );
        assert!(
            matches!(&teardown[1], Step::RemoveTun { delete, .. } if delete.to_string() == "ip link del dev blip0")
        );
    }

    #[test]
    fn unsafe_interface_names_are_refused() {
        for (key, name) in [
            ("egress.tun.out_interface", "eth0\" accept"),
            ("egress.tun.out_interface", ""),
            ("egress.tun.name", "a-name-that-is-too-long"),
            ("egress.tun.name", "bad/name"),
            ("egress.tun.name", ".."),
        ] {
            // The configuration refuses most of these already; the plan
            // checks again because the names go into an nftables script.
            let mut config = config(&[]);
            match key {
                "egress.tun.name" => config.egress.tun.name = name.to_string(),
                _ => config.egress.tun.out_interface = name.to_string(),
            }
            let result = Plan::from_config(&config);
            assert!(
                matches!(&result, Err(NetError::InterfaceName { key: k, .. }) if *k == key),
                "{name:?}: {result:?}"
            );
        }
    }

    #[test]
    fn link_states_are_read_from_ip_json() {
        let multi = r#"[{"ifname":"t0","linkinfo":{"info_kind":"tun","info_data":{"type":"tun","pi":false,"multi_queue":true,"persist":true}}}]"#;
        let single = r#"[{"ifname":"t1","linkinfo":{"info_kind":"tun","info_data":{"type":"tun","multi_queue":false}}}]"#;
        let tap = r#"[{"ifname":"t2","linkinfo":{"info_kind":"tun","info_data":{"type":"tap","multi_queue":true}}}]"#;
        let plain = r#"[{"ifname":"eth0","flags":["UP"]}]"#;
        let dummy = r#"[{"ifname":"d0","linkinfo":{"info_kind":"dummy"}}]"#;
        assert_eq!(parse_link(multi), Ok(LinkState::Tun { multi_queue: true }));
        assert_eq!(
            parse_link(single),
            Ok(LinkState::Tun { multi_queue: false })
        );
        assert_eq!(parse_link(tap), Ok(LinkState::Other { kind: "tap".into() }));
        assert_eq!(
            parse_link(plain),
            Ok(LinkState::Other {
                kind: "unknown".into()
            })
        );
        assert_eq!(
            parse_link(dummy),
            Ok(LinkState::Other {
                kind: "dummy".into()
            })
        );
        assert_eq!(parse_link("[]"), Ok(LinkState::Absent));
        assert!(parse_link("Device \"x\" does not exist.").is_err());
    }
}
