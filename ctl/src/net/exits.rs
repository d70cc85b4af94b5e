//! Host setup for WireGuard exits (docs/EGRESS.md, "WireGuard exits"): per
//! exit a persistent multi-queue TUN device holding this node's tunnel
//! address, a routing table with a default route into it, and two rules that
//! choose that table: by firewall mark (WireGuard clients' packets, marked
//! by the `client_exit` nftables map the device plane fills) and by source
//! address (proxy streams, whose sockets the device plane binds to the
//! exit's tunnel address). The nftables table masquerades the client pool
//! to the exit's address and lets only replies in from the exit; the map
//! lives in a table of its own that setup never replaces
//! ([`Plan::steer_script`]).
//!
//! Loose reverse-path filtering on the exit's device: replies from the
//! internet arrive on it, while the main table routes the internet
//! elsewhere, and strict filtering would drop them.

use std::net::Ipv4Addr;

use blipless_config::upstreams::{UpstreamKind, FIRST_MARK};
use blipless_config::Config;

use super::{probe, Cmd, Plan, Step};

/// The default MTU of an exit's device when its wg-quick file sets none
/// (what wg-quick uses for an IPv4 endpoint over a 1500-byte link).
pub const DEFAULT_MTU: u16 = 1420;

/// What one WireGuard exit needs of the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitPlan {
    /// The upstream's name.
    pub name: String,
    /// Its TUN device.
    pub tun: String,
    /// This node's tunnel address toward it.
    pub address: Ipv4Addr,
    /// Its firewall mark, also its routing table's number.
    pub mark: u32,
    /// The device's MTU.
    pub mtu: u16,
}

impl ExitPlan {
    /// The exits in the configuration, in order.
    pub fn from_config(config: &Config) -> Vec<ExitPlan> {
        config
            .egress
            .upstreams
            .iter()
            .filter_map(|upstream| match &upstream.kind {
                UpstreamKind::Wireguard(exit) => Some(ExitPlan {
                    name: upstream.name.clone(),
                    tun: exit.tun.clone(),
                    address: exit.address,
                    mark: exit.mark,
                    mtu: exit.file.mtu.unwrap_or(DEFAULT_MTU),
                }),
                UpstreamKind::Socks5(_) => None,
            })
            .collect()
    }

    /// The priority of its rules: before the main table's (32766).
    fn priority(&self) -> String {
        (20_000 + self.mark.saturating_sub(FIRST_MARK).min(9_999)).to_string()
    }

    fn mark_rule(&self, verb: &str) -> Cmd {
        let (mark, priority) = (format!("{:#x}", self.mark), self.priority());
        let table = self.mark.to_string();
        Cmd::new(
            "ip",
            &[
                "rule", verb, "fwmark", &mark, "lookup", &table, "priority", &priority,
            ],
        )
    }

    fn source_rule(&self, verb: &str) -> Cmd {
        let (from, priority) = (self.address.to_string(), self.priority());
        let table = self.mark.to_string();
        Cmd::new(
            "ip",
            &[
                "rule", verb, "from", &from, "lookup", &table, "priority", &priority,
            ],
        )
    }
}

impl Plan {
    /// What setup does for one exit, after the client TUN device exists.
    pub(super) fn exit_setup_steps(&self, exit: &ExitPlan) -> Vec<Step> {
        let tun = exit.tun.as_str();
        let (address, mtu, table) = (
            format!("{}/32", exit.address),
            exit.mtu.to_string(),
            exit.mark.to_string(),
        );
        vec![
            self.ensure_tun(tun),
            super::mark_tun(tun, &super::leftovers::exit_alias(&exit.name)),
            Step::Run(Cmd::new("ip", &["addr", "replace", &address, "dev", tun])),
            Step::Run(Cmd::new(
                "ip",
                &["link", "set", "dev", tun, "mtu", &mtu, "up"],
            )),
            Step::LoosenReversePath {
                device: tun.to_owned(),
            },
            Step::Run(Cmd::new(
                "ip",
                &["route", "replace", "default", "dev", tun, "table", &table],
            )),
            Step::RunUnlessExists(exit.mark_rule("add")),
            Step::RunUnlessExists(exit.source_rule("add")),
        ]
    }

    /// The nftables lines for the exits in the main table: per exit what
    /// goes in input, forward and postrouting. The map and the chain that
    /// marks clients' packets live in their own table ([`steer_script`]).
    pub(super) fn nft_exit_parts(&self) -> NftExitParts {
        let mut parts = NftExitParts::default();
        let pool = &self.pool;
        for exit in &self.exits {
            let x = &exit.tun;
            parts.input.push_str(&format!(
                "\t\tiifname \"{x}\" ct state established,related accept\n\t\tiifname \"{x}\" drop\n"
            ));
            parts.forward.push_str(&format!(
                "\t\tiifname \"{x}\" ct state established,related accept\n\t\tiifname \"{x}\" drop\n"
            ));
            parts
                .postrouting
                .push_str(&format!("\t\tip saddr {pool} oifname \"{x}\" masquerade\n"));
        }
        parts
    }

    /// The steering table, `inet blipless_steer`: the `client_exit` map and
    /// the chain that marks clients' packets by it. Unlike the main table it
    /// is never replaced whole: setup adds what is missing and rewrites the
    /// chain, in one transaction, so the map's elements (which the device
    /// plane keeps) survive every `net setup`, including the one a device
    /// plane with `egress.tun.manage = true` runs at start. Without exits,
    /// setup deletes it.
    pub fn steer_script(&self) -> String {
        if self.exits.is_empty() {
            return format!("add table {STEER_TABLE}\ndelete table {STEER_TABLE}\n");
        }
        let tun = &self.tun;
        format!(
            "add table {STEER_TABLE}
add map {STEER_TABLE} client_exit {{ type ipv4_addr : mark; }}
add chain {STEER_TABLE} prerouting {{ type filter hook prerouting priority mangle; policy accept; }}
flush chain {STEER_TABLE} prerouting
add rule {STEER_TABLE} prerouting iifname \"{tun}\" meta mark set ip saddr map @client_exit
"
        )
    }
}

/// The nftables table that steers WireGuard clients to exits.
pub const STEER_TABLE: &str = "inet blipless_steer";

/// The exits' share of the main nftables table.
#[derive(Debug, Default)]
pub(super) struct NftExitParts {
    /// Lines for the input chain.
    pub input: String,
    /// Lines for the forward chain.
    pub forward: String,
    /// Lines for the postrouting chain.
    pub postrouting: String,
}

/// What teardown does for one exit (after the nftables table is gone).
pub(super) fn exit_teardown_steps(exit: &ExitPlan) -> Vec<Step> {
    let tun = exit.tun.as_str();
    vec![
        Step::RunIfPresent(exit.mark_rule("del")),
        Step::RunIfPresent(exit.source_rule("del")),
        Step::RemoveTun {
            name: tun.to_string(),
            probe: probe(tun),
            delete: Cmd::new("ip", &["link", "del", "dev", tun]),
        },
    ]
}
