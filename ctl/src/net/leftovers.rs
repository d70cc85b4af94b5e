//! Finding what an earlier setup made that the configuration no longer
//! names, so that teardown removes it too: a TUN device renamed since
//! (`egress.tun.name`, an exit's `tun`), an exit removed from the
//! configuration, or everything, when the configuration no longer loads at
//! all (the package removed after an exit's wg-quick file was deleted).
//!
//! Setup marks what it makes: every TUN device gets the alias
//! [`ALIAS_PREFIX`] (`ip link set dev NAME alias "blipless …"`), and an
//! exit's routing rules point at a table numbered from
//! [`FIRST_MARK`] (its firewall mark), a range nothing else on a host uses.
//! The nftables tables have fixed names. Reading `ip`'s JSON here is
//! sans-IO; `run.rs` lists and deletes.

use blipless_config::upstreams::FIRST_MARK;

/// The start of the alias setup gives every TUN device it makes.
pub const ALIAS_PREFIX: &str = "blipless";

/// How many routing tables from [`FIRST_MARK`] count as an exit's.
const EXIT_TABLES: u32 = 0x1_0000;

/// The alias setup gives the clients' TUN device.
pub fn egress_alias() -> String {
    format!("{ALIAS_PREFIX} egress")
}

/// The alias setup gives the TUN device of the exit `name`.
pub fn exit_alias(name: &str) -> String {
    format!("{ALIAS_PREFIX} exit {name}")
}

/// The TUN devices in `ip -j -d link show`'s JSON whose alias says setup
/// made them.
pub fn marked_tuns(json: &str) -> Result<Vec<String>, String> {
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|error| format!("not JSON: {error}"))?;
    let links = value.as_array().ok_or("not a list of links")?;
    Ok(links
        .iter()
        .filter(|link| link["linkinfo"]["info_kind"].as_str() == Some("tun"))
        .filter(|link| {
            link["ifalias"]
                .as_str()
                .is_some_and(|alias| alias.split(' ').next() == Some(ALIAS_PREFIX))
        })
        .filter_map(|link| link["ifname"].as_str().map(str::to_owned))
        .collect())
}

/// One routing rule of an exit, as `ip rule del` finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitRule {
    /// Its priority.
    pub priority: u32,
    /// The routing table it looks up.
    pub table: u32,
}

/// The rules in `ip -j rule show`'s JSON that look up an exit's table.
pub fn exit_rules(json: &str) -> Result<Vec<ExitRule>, String> {
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|error| format!("not JSON: {error}"))?;
    let rules = value.as_array().ok_or("not a list of rules")?;
    let number = |value: &serde_json::Value| {
        value
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .or_else(|| value.as_str().and_then(|text| text.parse().ok()))
    };
    Ok(rules
        .iter()
        .filter_map(|rule| {
            Some(ExitRule {
                priority: number(&rule["priority"])?,
                table: number(&rule["table"])?,
            })
        })
        .filter(|rule| rule.table.wrapping_sub(FIRST_MARK) < EXIT_TABLES)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_tun_devices_with_our_alias_are_ours() {
        let json = r#"[
            {"ifname":"lo","link_type":"loopback"},
            {"ifname":"blip7","ifalias":"blipless egress","linkinfo":{"info_kind":"tun","info_data":{"type":"tun"}}},
            {"ifname":"blx0","ifalias":"blipless exit de-1","linkinfo":{"info_kind":"tun"}},
            {"ifname":"tun9","linkinfo":{"info_kind":"tun"}},
            {"ifname":"tun8","ifalias":"bliplessly","linkinfo":{"info_kind":"tun"}},
            {"ifname":"dummy0","ifalias":"blipless egress","linkinfo":{"info_kind":"dummy"}}
        ]"#;
        assert_eq!(marked_tuns(json).expect("parses"), ["blip7", "blx0"]);
        assert!(marked_tuns("[]").expect("parses").is_empty());
        assert!(marked_tuns("{").is_err());
        assert!(marked_tuns("{}").is_err());
        assert_eq!(egress_alias(), "blipless egress");
        assert_eq!(exit_alias("de-1"), "blipless exit de-1");
    }

    #[test]
    fn only_rules_looking_up_an_exits_table_are_ours() {
        let first = FIRST_MARK;
        let json = format!(
            r#"[
            {{"priority":0,"src":"all","table":"local"}},
            {{"priority":20000,"src":"all","fwmark":"0xb1e5500","table":"{first}"}},
            {{"priority":20001,"src":"10.99.0.2","table":"{}"}},
            {{"priority":100,"src":"all","table":"{}"}},
            {{"priority":32766,"src":"all","table":"main"}},
            {{"priority":5,"src":"all","table":"254"}}
        ]"#,
            first + 1,
            first - 1
        );
        assert_eq!(
            exit_rules(&json).expect("parses"),
            [
                ExitRule {
                    priority: 20000,
                    table: first
                },
                ExitRule {
                    priority: 20001,
                    table: first + 1
                },
            ]
        );
        assert!(exit_rules("not json").is_err());
    }
}
