//! Host setup for packet egress: the persistent multi-queue TUN device, its
//! address (which routes the client pool to it), IPv4 forwarding, and one
//! nftables table that masquerades the client pool out of the configured
//! interface and answers `ct state invalid` TCP with a reset (so an orphaned
//! flow fails fast instead of hanging).
//!
//! Local trust: the TUN device is owned by a user and group
//! (`egress.tun.user` and `egress.tun.group`, default: whoever runs setup),
//! so that no other local user can attach a queue to read or inject the
//! clients' packets (without CAP_NET_ADMIN). The nftables table keeps the
//! WireGuard clients away from the host and from each other: input from the
//! TUN device is dropped but for replies (established, related) and
//! `egress.allow` destinations, and forwarded traffic from the TUN device to
//! the client pool is dropped but for the parts of the pool `egress.allow`
//! lists. An existing device with another owner is recreated when no queue
//! is attached to it, and refused otherwise.
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
//! CAP_NET_ADMIN. The client pool is IPv4; `wireguard.pool6` adds its IPv6
//! twin (the node's address, IPv6 forwarding, the same masquerade and
//! client-to-client drop; docs/WIREGUARD.md, "IPv6").
//!
//! The files: this one holds the errors, the [`Plan`] and its steps,
//! reading `ip`'s link JSON ([`parse_link`]), and [`setup`] / [`teardown`];
//! `owner.rs` who owns the TUN device ([`TunOwner`]); `leftovers.rs` what
//! setup marks as its own and how teardown finds it; `nft.rs` the nftables
//! scripts ([`Plan::nft_script`], [`Plan::nft_teardown_script`]); `run.rs`
//! running the steps on the host; `uplink.rs` the interface traffic leaves
//! by (the configured one, which must exist, or the default route's).

use std::fmt;
use std::net::Ipv4Addr;
use std::time::Duration;

use blipless_config::pool6::TunnelPools;
use blipless_config::Config;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// Where IPv4 forwarding is switched on.
pub const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";
/// The sysctl that lets the host forward IPv6 (with `wireguard.pool6`).
pub const IPV6_FORWARD: &str = "/proc/sys/net/ipv6/conf/all/forwarding";

/// The port the device plane takes WireGuard clients' DNS over TCP on: the
/// nftables table redirects TCP to the node's tunnel address, port 53, here
/// (a port above 1024 needs no capability to bind; docs/WIREGUARD.md, "DNS").
pub const DNS_TCP_PORT: u16 = 10053;

/// How long one `ip` or `nft` command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// Why host setup or teardown failed.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// `wireguard.pool` is an IPv6 network: it must be IPv4 (IPv6 inside the
    /// tunnel comes from `wireguard.pool6`, beside it).
    #[error("wireguard.pool is {0}, an IPv6 network: it must be IPv4; give IPv6 inside the tunnel with wireguard.pool6 beside it")]
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
    /// `egress.tun.out_interface` is empty (the default route's interface)
    /// and the host has no IPv4 default route.
    #[error("egress.tun.out_interface is empty, meaning the IPv4 default route's interface, and this host has no IPv4 default route: set egress.tun.out_interface to the interface toward the internet")]
    NoDefaultRoute,
    /// `egress.tun.out_interface` names no interface of this host: the
    /// masquerade would match nothing and clients would reach nothing.
    #[error("egress.tun.out_interface = {name:?}: no such network interface on this host{default_route}")]
    NoSuchInterface {
        /// The name as configured.
        name: String,
        /// Which interface the default route leaves by, as advice.
        default_route: String,
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
        path: String,
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
    /// `egress.tun.user` or `egress.tun.group` names no user or group here.
    #[error("{key} = {name:?}: no such {what} on this host{detail}")]
    UnknownAccount {
        /// The configuration key.
        key: &'static str,
        /// The name as configured.
        name: String,
        /// `user` or `group`.
        what: &'static str,
        /// Why the lookup failed, possibly empty.
        detail: String,
    },
    /// The TUN device exists with another owner and queues are attached to
    /// it, so it cannot be recreated with the right one now.
    #[error("the TUN device {name} is owned by {found}, not {wanted}, and {queues} queue(s) are attached to it: stop the device plane(s) using it, then run `blipless-ctl net setup` again (it recreates an unused device with the right owner), or set egress.tun.user and egress.tun.group to its owner")]
    TunOwner {
        /// The device's name.
        name: String,
        /// Its owner now, as `ip` shows it.
        found: String,
        /// The owner the configuration asks for.
        wanted: String,
        /// Queues attached to it (attached and detached).
        queues: u64,
    },
}

const HINT_CAP: &str = " (host network setup needs CAP_NET_ADMIN: run as root)";

/// What the configuration asks of the host, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The TUN device (`egress.tun.name`).
    pub tun: String,
    /// The interface client traffic is masqueraded out of
    /// (`egress.tun.out_interface`; empty until [`setup`] finds the default
    /// route's, see `uplink.rs`).
    pub out_interface: String,
    /// The client pool (`wireguard.pool`), host bits cleared.
    pub pool: Ipv4Net,
    /// The node's own address on the TUN device: the pool's first host
    /// address, with the pool's prefix length (the connected route sends
    /// the whole pool to the TUN device).
    pub address: Ipv4Net,
    /// The TUN device's owner (`egress.tun.user`, `egress.tun.group`).
    pub owner: TunOwner,
    /// Destinations the clients may reach on the host itself and in the
    /// pool (`egress.allow`, the same list the device plane's policy uses).
    pub allow: Vec<IpNet>,
    /// The WireGuard exits (`[[egress.upstream]]` of kind `wireguard`).
    pub exits: Vec<ExitPlan>,
    /// Whether the device plane answers DNS at the node's address
    /// (`wireguard.dns`): TCP to port 53 there is redirected to
    /// [`DNS_TCP_PORT`] and let in.
    pub dns: bool,
    /// IPv6 inside the tunnel (`wireguard.pool6`): the pool and the node's
    /// address in it (the twin of [`Plan::address`], with the pool's prefix
    /// length), masqueraded out of `out_interface` like the IPv4 pool.
    pub pool6: Option<(Ipv6Net, Ipv6Net)>,
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
    /// accept a multi-queue TUN device owned by `owner`; recreate (`delete`,
    /// `create`) one with another owner if no queue is attached to it, and
    /// refuse it otherwise; refuse any other device.
    EnsureTun {
        /// The device's name.
        name: String,
        /// `ip -j -d link show dev NAME`.
        probe: Cmd,
        /// `ip tuntap add dev NAME mode tun multi_queue user UID group GID`.
        create: Cmd,
        /// `ip link del dev NAME`.
        delete: Cmd,
        /// Who must own it.
        owner: TunOwner,
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
    /// Run a command whose failure with "File exists" means it is done
    /// (`ip rule add` of a rule that is there).
    RunUnlessExists(Cmd),
    /// Run a command whose failure because its object is absent means it is
    /// done (`ip rule del` of a rule that is not there).
    RunIfPresent(Cmd),
    /// Delete every rule that looks up an exit's routing table (listed by
    /// `rules`, `ip -j rule show`) and every TUN device setup marked as
    /// its own (listed by `links`, `ip -j -d link show`), whatever the
    /// configuration says now ([`leftovers`]).
    RemoveMarked {
        /// `ip -j rule show`.
        rules: Cmd,
        /// `ip -j -d link show`.
        links: Cmd,
    },
    /// Write `value` to the sysctl at `path` unless it holds it already.
    Sysctl {
        /// The `/proc/sys` path.
        path: String,
        /// The value.
        value: &'static str,
    },
    /// Loose reverse-path filtering (2) on `device`, written only where the
    /// filtering in effect there (the larger of `all` and the device's own)
    /// is strict (1), which would drop what the device receives from a
    /// WireGuard exit; 0 and 2 accept it already, and nothing is written
    /// (the device plane's unit keeps `/proc/sys` read-only).
    LoosenReversePath {
        /// The network device.
        device: String,
    },
}

impl Plan {
    /// Checks the configuration: an IPv4 pool with room for the node and a
    /// client, interface names that are safe to put in an nftables script,
    /// and a TUN owner that exists ([`TunOwner::from_config`]).
    pub fn from_config(config: &Config) -> Result<Plan, NetError> {
        let tun = &config.egress.tun;
        check_interface("egress.tun.name", &tun.name)?;
        if !tun.out_interface.is_empty() {
            check_interface("egress.tun.out_interface", &tun.out_interface)?;
        }
        let pool = match config.wireguard.pool {
            IpNet::V4(pool) => pool.trunc(),
            IpNet::V6(pool) => return Err(NetError::Ipv6Pool(pool)),
        };
        let address = first_host(pool)?;
        let pool6 = config.wireguard.pool6.and_then(|pool6| {
            let pools = TunnelPools::new(IpNet::V4(pool), pool6)?;
            let node = pools.v6_of(address.addr())?;
            let net = pools.v6();
            Some((net, Ipv6Net::new(node, net.prefix_len()).ok()?))
        });
        Ok(Plan {
            tun: tun.name.clone(),
            out_interface: tun.out_interface.clone(),
            address,
            pool6,
            pool,
            owner: TunOwner::from_config(tun.user.as_deref(), tun.group.as_deref())?,
            allow: config.egress.allow.clone(),
            exits: ExitPlan::from_config(config),
            dns: config.wireguard.dns,
        })
    }

    /// What setup does, in order.
    pub fn setup_steps(&self) -> Vec<Step> {
        let name = self.tun.as_str();
        let address = self.address.to_string();
        let mut steps = vec![
            self.ensure_tun(name),
            mark_tun(name, &leftovers::egress_alias()),
        ];
        steps.extend([
            Step::Run(Cmd::new("ip", &["addr", "replace", &address, "dev", name])),
            Step::Run(Cmd::new("ip", &["link", "set", "dev", name, "up"])),
            Step::Sysctl {
                path: IP_FORWARD.to_owned(),
                value: "1",
            },
        ]);
        if let Some((_, address6)) = self.pool6 {
            let address6 = address6.to_string();
            steps.extend([
                // No duplicate address detection: nothing else is on the
                // device, and the address must serve at once.
                Step::Run(Cmd::new(
                    "ip",
                    &["addr", "replace", &address6, "dev", name, "nodad"],
                )),
                Step::Sysctl {
                    path: IPV6_FORWARD.to_owned(),
                    value: "1",
                },
            ]);
        }
        for exit in &self.exits {
            steps.extend(self.exit_setup_steps(exit));
        }
        steps.push(Step::Run(Cmd {
            stdin: Some(self.nft_script()),
            ..Cmd::new("nft", &["-f", "-"])
        }));
        steps.push(Step::Run(Cmd {
            stdin: Some(self.steer_script()),
            ..Cmd::new("nft", &["-f", "-"])
        }));
        steps
    }

    /// Makes sure the multi-queue TUN device `name` exists with our owner.
    fn ensure_tun(&self, name: &str) -> Step {
        let (uid, gid) = (self.owner.uid.to_string(), self.owner.gid.to_string());
        Step::EnsureTun {
            name: name.to_string(),
            probe: probe(name),
            create: Cmd::new(
                "ip",
                &[
                    "tuntap",
                    "add",
                    "dev",
                    name,
                    "mode",
                    "tun",
                    "multi_queue",
                    "user",
                    &uid,
                    "group",
                    &gid,
                ],
            ),
            delete: Cmd::new("ip", &["link", "del", "dev", name]),
            owner: self.owner.clone(),
        }
    }

    /// What teardown does, in order: what the configuration names, then
    /// whatever else setup marked as its own (a device renamed since, an
    /// exit removed). Forwarding is left on: other services on the host may
    /// rely on it.
    pub fn teardown_steps(&self) -> Vec<Step> {
        let name = self.tun.as_str();
        let mut steps = vec![
            Step::Run(Cmd {
                stdin: Some(self.nft_teardown_script()),
                ..Cmd::new("nft", &["-f", "-"])
            }),
            Step::RemoveTun {
                name: name.to_string(),
                probe: probe(name),
                delete: Cmd::new("ip", &["link", "del", "dev", name]),
            },
        ];
        for exit in &self.exits {
            steps.extend(exit_teardown_steps(exit));
        }
        steps.push(remove_marked());
        steps
    }

    /// What teardown does with no configuration to go by (it does not
    /// load): the nftables tables, which have fixed names, and everything
    /// setup marked as its own ([`leftovers`]).
    pub fn teardown_marked_steps() -> Vec<Step> {
        vec![
            Step::Run(Cmd {
                stdin: Some(nft::teardown_script()),
                ..Cmd::new("nft", &["-f", "-"])
            }),
            remove_marked(),
        ]
    }
}

/// Gives the TUN device `name` the alias that tells a later teardown setup
/// made it.
fn mark_tun(name: &str, alias: &str) -> Step {
    Step::Run(Cmd::new(
        "ip",
        &["link", "set", "dev", name, "alias", alias],
    ))
}

fn remove_marked() -> Step {
    Step::RemoveMarked {
        rules: Cmd::new("ip", &["-j", "rule", "show"]),
        links: Cmd::new("ip", &["-j", "-d", "link", "show"]),
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
        /// Its owner as `ip` shows it (a user name, or the uid when it has
        /// none); `None`: no owner.
        user: Option<String>,
        /// Its group, likewise.
        group: Option<String>,
        /// Queues attached to it now, enabled or detached (`numqueues` +
        /// `numdisabled`).
        queues: u64,
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
    let data = &info["info_data"];
    let account = |value: &serde_json::Value| {
        value
            .as_str()
            .map(str::to_string)
            .or_else(|| value.as_u64().map(|id| id.to_string()))
    };
    Ok(LinkState::Tun {
        multi_queue: data["multi_queue"].as_bool() == Some(true),
        user: account(&data["user"]),
        group: account(&data["group"]),
        queues: data["numqueues"].as_u64().unwrap_or(0) + data["numdisabled"].as_u64().unwrap_or(0),
    })
}

/// Sets the host up for packet egress as `config` says (see the module
/// documentation). Idempotent. Returns the plan it carried out, with the
/// interface traffic leaves by found (`uplink.rs`).
pub async fn setup(config: &Config) -> Result<Plan, NetError> {
    let mut plan = Plan::from_config(config)?;
    plan.out_interface = uplink::find(&plan.out_interface)?;
    run_steps(&plan.setup_steps()).await?;
    tracing::info!(
        tun = %plan.tun,
        owner = %plan.owner,
        address = %plan.address,
        pool = %plan.pool,
        out_interface = %plan.out_interface,
        "packet egress host setup done"
    );
    Ok(plan)
}

/// What a teardown removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Removed {
    /// The TUN devices it deleted.
    pub tuns: Vec<String>,
    /// How many exits' routing rules it deleted.
    pub rules: usize,
}

/// How a teardown went: what it removed, and every step that failed (it
/// goes on past a failure, to remove all it can).
#[derive(Debug, Default)]
pub struct Teardown {
    /// What it removed.
    pub removed: Removed,
    /// The steps that failed, in order; the plan's own problem first when
    /// the configuration gave none (then only the marked rest was removed).
    pub failures: Vec<NetError>,
}

/// Removes what [`setup`] made: the nftables tables, the TUN devices and
/// the exits' rules, including those of an earlier configuration.
/// Idempotent; leaves IPv4 forwarding as it is. A configuration [`Plan`]
/// refuses (a TUN owner that no longer exists) still removes the tables
/// and what setup marked ([`teardown_marked`]).
pub async fn teardown(config: &Config) -> Teardown {
    match Plan::from_config(config) {
        Ok(plan) => {
            let (removed, failures) = run_all_steps(&plan.teardown_steps()).await;
            tracing::info!(tun = %plan.tun, ?removed, "packet egress host setup removed");
            Teardown { removed, failures }
        }
        Err(problem) => {
            let mut done = teardown_marked().await;
            done.failures.insert(0, problem);
            done
        }
    }
}

/// Removes what [`setup`] made without a configuration to go by: the
/// nftables tables and everything it marked ([`Plan::teardown_marked_steps`]).
pub async fn teardown_marked() -> Teardown {
    let (removed, failures) = run_all_steps(&Plan::teardown_marked_steps()).await;
    tracing::info!(
        ?removed,
        "packet egress host setup removed, found by its marks"
    );
    Teardown { removed, failures }
}

mod exits;
pub mod leftovers;
mod nft;
mod owner;
mod run;
pub mod steer;
#[cfg(test)]
mod tests;
mod uplink;

use exits::exit_teardown_steps;
pub use exits::{ExitPlan, STEER_TABLE};
pub use nft::NFT_TABLE;
pub use owner::TunOwner;
use run::{run_all_steps, run_steps};
