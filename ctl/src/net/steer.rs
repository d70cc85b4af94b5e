//! Steering WireGuard clients to their exits: the `client_exit` map of the
//! `inet blipless_steer` table (client tunnel address to the exit's mark),
//! which the kernel keeps across device-plane deploys, crashes and `net
//! setup`. The device plane
//! that holds the TUN queues replaces the whole map whenever a client's
//! first route changes (docs/EGRESS.md, "WireGuard exits").

use std::net::Ipv4Addr;

use super::{
    run::{listing, run_steps},
    Cmd, NetError, Step, STEER_TABLE,
};

/// The transaction that makes the map hold exactly `steered`.
pub fn map_script(steered: &[(Ipv4Addr, u32)]) -> String {
    let mut script = format!("flush map {STEER_TABLE} client_exit\n");
    if !steered.is_empty() {
        let elements: Vec<String> = steered
            .iter()
            .map(|(address, mark)| format!("{address} : {mark:#x}"))
            .collect();
        script.push_str(&format!(
            "add element {STEER_TABLE} client_exit {{ {} }}\n",
            elements.join(", ")
        ));
    }
    script
}

/// Replaces the map's elements with `steered`, in one atomic `nft -f -`.
/// Needs CAP_NET_ADMIN, like `net setup`.
pub async fn apply(steered: &[(Ipv4Addr, u32)]) -> Result<(), NetError> {
    run_steps(&[Step::Run(Cmd {
        stdin: Some(map_script(steered)),
        ..Cmd::new("nft", &["-f", "-"])
    })])
    .await
}

/// What the map holds now (`nft -j list map`). Needs CAP_NET_ADMIN, like
/// [`apply`].
pub async fn read() -> Result<Vec<(Ipv4Addr, u32)>, NetError> {
    let mut args = vec!["-j", "list", "map"];
    args.extend(STEER_TABLE.split(' '));
    args.push("client_exit");
    let command = Cmd::new("nft", &args);
    let json = listing(&command).await?;
    parse_map(&json).map_err(|detail| NetError::Unreadable {
        command: command.to_string(),
        detail,
    })
}

/// The elements of the `client_exit` map in `nft -j list map`'s output:
/// `{"nftables": [{"metainfo": ...}, {"map": {..., "elem": [["10.64.0.2",
/// 186537216], ...]}}]}` (no `elem` when it is empty).
pub fn parse_map(json: &str) -> Result<Vec<(Ipv4Addr, u32)>, String> {
    let value: serde_json::Value = serde_json::from_str(json).map_err(|error| error.to_string())?;
    let map = value
        .get("nftables")
        .and_then(serde_json::Value::as_array)
        .and_then(|items| items.iter().find_map(|item| item.get("map")))
        .ok_or("no map in the output")?;
    let Some(elements) = map.get("elem") else {
        return Ok(Vec::new());
    };
    let elements = elements.as_array().ok_or("elem is not a list")?;
    elements
        .iter()
        .map(|element| {
            let pair = element.as_array().filter(|pair| pair.len() == 2);
            let (address, mark) = pair
                .and_then(|pair| Some((pair[0].as_str()?, pair[1].as_u64()?)))
                .ok_or_else(|| format!("an element that is not [address, mark]: {element}"))?;
            let address = address
                .parse::<Ipv4Addr>()
                .map_err(|error| format!("{address}: {error}"))?;
            let mark = u32::try_from(mark).map_err(|_| format!("mark {mark} out of range"))?;
            Ok((address, mark))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_map_is_read_from_nft_json() {
        let empty = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}}, {"map": {"family": "inet", "name": "client_exit", "table": "blipless_steer", "type": "ipv4_addr", "handle": 1, "map": "mark"}}]}"#;
        assert_eq!(parse_map(empty), Ok(Vec::new()));
        let two = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}}, {"map": {"family": "inet", "name": "client_exit", "table": "blipless_steer", "type": "ipv4_addr", "handle": 1, "map": "mark", "elem": [["10.64.0.2", 186537216], ["10.64.0.3", 186537217]]}}]}"#;
        assert_eq!(
            parse_map(two),
            Ok(vec![
                (Ipv4Addr::new(10, 64, 0, 2), 0x0b1e_5500),
                (Ipv4Addr::new(10, 64, 0, 3), 0x0b1e_5501)
            ])
        );
        for bad in [
            "",
            "{}",
            r#"{"nftables": [{"map": {"elem": [["10.64.0.2"]]}}]}"#,
            r#"{"nftables": [{"map": {"elem": [["nope", 1]]}}]}"#,
            r#"{"nftables": [{"map": {"elem": [["10.64.0.2", 4294967296]]}}]}"#,
        ] {
            assert!(parse_map(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_map_is_replaced_whole() {
        assert_eq!(
            map_script(&[]),
            "flush map inet blipless_steer client_exit\n"
        );
        assert_eq!(
            map_script(&[
                (Ipv4Addr::new(10, 64, 0, 2), 0x0b1e_5500),
                (Ipv4Addr::new(10, 64, 0, 3), 0x0b1e_5501)
            ]),
            "flush map inet blipless_steer client_exit\n\
             add element inet blipless_steer client_exit { 10.64.0.2 : 0xb1e5500, 10.64.0.3 : 0xb1e5501 }\n"
        );
    }
}
