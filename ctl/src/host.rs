//! `blipless-ctl net setup|teardown`: the host network setup for WireGuard
//! packet egress ([`blipless_ctl::net`]), and what it prints.

use anyhow::Context;
use blipless_config::Config;
use blipless_ctl::net;
use serde_json::json;

use crate::NetCommand;

/// `net teardown` with no configuration to go by: the nftables tables and
/// whatever setup marked as its own ([`net::teardown_marked`]).
pub(crate) fn teardown_marked() -> anyhow::Result<net::Teardown> {
    Ok(runtime()?.block_on(net::teardown_marked()))
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// What a teardown removed, in words.
pub(crate) fn removed_text(removed: &net::Removed) -> String {
    let tuns = if removed.tuns.is_empty() {
        "no TUN device was there".to_owned()
    } else {
        format!("deleted TUN devices {}", removed.tuns.join(", "))
    };
    format!(
        "nftables tables {} and {} gone, {tuns}, {} exit routing rule(s) deleted",
        net::NFT_TABLE,
        net::STEER_TABLE,
        removed.rules
    )
}

/// What a teardown removed, as JSON.
pub(crate) fn removed_json(removed: &net::Removed) -> serde_json::Value {
    json!({ "tuns": removed.tuns, "rules": removed.rules })
}

/// `net setup` and `net teardown`.
pub(crate) fn net(config: &Config, command: &NetCommand, as_json: bool) -> anyhow::Result<()> {
    let runtime = runtime()?;
    match command {
        NetCommand::Setup => {
            // Checks the configuration (IPv4 pool, interface names, the
            // TUN owner) before any change.
            let plan = runtime.block_on(net::setup(config))?;
            if as_json {
                say!(
                    "{}",
                    json!({
                        "net": "setup",
                        "tun": plan.tun,
                        "address": plan.address.to_string(),
                        "pool": plan.pool.to_string(),
                        "address6": plan.pool6.map(|(_, address6)| address6.to_string()),
                        "pool6": plan.pool6.map(|(pool6, _)| pool6.to_string()),
                        "out_interface": plan.out_interface,
                        "nft_table": net::NFT_TABLE,
                        "exits": plan.exits.iter().map(|exit| json!({
                            "name": exit.name,
                            "tun": exit.tun,
                            "address": exit.address.to_string(),
                            "mark": exit.mark,
                        })).collect::<Vec<_>>(),
                    })
                );
            } else {
                say!(
                    "host set up: TUN device {} (persistent, multi-queue) has {}, IPv4 forwarding is on,",
                    plan.tun,
                    plan.address
                );
                say!(
                    "  nftables table {} masquerades {} out of {} and resets invalid TCP",
                    net::NFT_TABLE,
                    plan.pool,
                    plan.out_interface
                );
                if let Some((pool6, address6)) = plan.pool6 {
                    say!(
                        "  IPv6 inside the tunnel: {} has {} too, IPv6 forwarding is on, {} is masqueraded the same way",
                        plan.tun,
                        address6,
                        pool6
                    );
                }
                for exit in &plan.exits {
                    say!(
                        "  WireGuard exit {}: TUN device {} has {}, routing table and mark {:#x}",
                        exit.name,
                        exit.tun,
                        exit.address,
                        exit.mark
                    );
                }
            }
        }
        NetCommand::Teardown => {
            let done = runtime.block_on(net::teardown(config));
            if !done.failures.is_empty() {
                // Everything it could remove is gone; say what was not.
                let mut all = format!(
                    "net teardown removed what it could ({}), but {} step(s) failed:",
                    removed_text(&done.removed),
                    done.failures.len()
                );
                for failure in &done.failures {
                    all.push_str(&format!("\n  - {failure}"));
                }
                return Err(anyhow::anyhow!(all));
            }
            if as_json {
                say!(
                    "{}",
                    json!({
                        "net": "teardown",
                        "tun": config.egress.tun.name,
                        "nft_table": net::NFT_TABLE,
                        "removed": removed_json(&done.removed),
                    })
                );
            } else {
                say!(
                    "host setup removed: {} (IPv4 and IPv6 forwarding left as they were)",
                    removed_text(&done.removed)
                );
            }
        }
    }
    Ok(())
}
