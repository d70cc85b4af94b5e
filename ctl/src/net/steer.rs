//! Steering WireGuard clients to their exits: the `client_exit` map of the
//! `inet blipless_steer` table (client tunnel address to the exit's mark),
//! which the kernel keeps across device-plane deploys, crashes and `net
//! setup`. The device plane
//! that holds the TUN queues replaces the whole map whenever a client's
//! first route changes (docs/EGRESS.md, "WireGuard exits").

use std::net::Ipv4Addr;

use super::{run::run_steps, Cmd, NetError, Step, STEER_TABLE};

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

#[cfg(test)]
mod tests {
    use super::*;

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
