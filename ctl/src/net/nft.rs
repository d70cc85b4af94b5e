//! The nftables scripts setup and teardown feed to `nft -f -`: the one
//! `inet blipless` table (input, forward and postrouting chains) built from a
//! [`Plan`], and the `egress.allow` set elements it lets through.

use std::net::IpAddr;

use ipnet::IpNet;

use super::Plan;

/// The nftables table blipless owns (family `inet`, so one table serves
/// both IP versions).
pub const NFT_TABLE: &str = "inet blipless";

impl Plan {
    /// The `egress.allow` networks of one family, merged (an nftables
    /// interval set refuses overlapping elements), as set elements.
    fn allowed(&self, v4: bool) -> Vec<String> {
        let nets: Vec<IpNet> = self
            .allow
            .iter()
            .filter(|net| matches!(net.addr(), IpAddr::V4(_)) == v4)
            .map(IpNet::trunc)
            .collect();
        IpNet::aggregate(&nets)
            .iter()
            .map(IpNet::to_string)
            .collect()
    }

    /// The parts of the client pool `egress.allow` lists (an allowed network
    /// inside the pool, or the whole pool when an allowed network holds it),
    /// merged, as set elements.
    fn allowed_in_pool(&self) -> Vec<String> {
        let pool = IpNet::V4(self.pool);
        let nets: Vec<IpNet> = self
            .allow
            .iter()
            .map(IpNet::trunc)
            .filter_map(|net| {
                if pool.contains(&net) {
                    Some(net)
                } else if net.contains(&pool) {
                    Some(pool)
                } else {
                    None
                }
            })
            .collect();
        IpNet::aggregate(&nets)
            .iter()
            .map(IpNet::to_string)
            .collect()
    }

    /// The nftables transaction setup runs with `nft -f -`: create the table
    /// if missing, delete it, and define it afresh, all in one atomic
    /// transaction.
    ///
    /// - `input`: from the TUN device, only replies to the host's own
    ///   connections (established, related) and `egress.allow` destinations
    ///   reach the host; the rest (the host's services on any of its
    ///   addresses) is dropped.
    /// - `forward`: invalid TCP gets a reset, other invalid packets are
    ///   dropped; from the TUN device into the client pool (client to
    ///   client) is dropped but for the parts of the pool `egress.allow`
    ///   lists; into the TUN device from anywhere else, only replies to
    ///   what clients began (established, related) pass: a host that
    ///   routes the pool through the node reaches no client unasked.
    /// - `postrouting`: the pool is masqueraded out of `out_interface`.
    /// - With `wireguard.pool6`: the same client-to-client drop and
    ///   masquerade for the IPv6 pool, and DNS over TCP at the node's IPv6
    ///   address redirected and let in like the IPv4 one.
    pub fn nft_script(&self) -> String {
        let Plan {
            tun,
            out_interface,
            pool,
            ..
        } = self;
        let set = |elements: &[String]| format!("{{ {} }}", elements.join(", "));
        let mut input = String::new();
        for (family, elements) in [("ip", self.allowed(true)), ("ip6", self.allowed(false))] {
            if !elements.is_empty() {
                input.push_str(&format!(
                    "\t\tiifname \"{tun}\" {family} daddr {} accept\n",
                    set(&elements)
                ));
            }
        }
        let in_pool = self.allowed_in_pool();
        let pool_allowed = if in_pool.is_empty() {
            String::new()
        } else {
            format!("\t\tiifname \"{tun}\" ip daddr {} accept\n", set(&in_pool))
        };
        // DNS over TCP to the node's address: redirected to the device
        // plane's listener and let in (UDP never reaches the kernel).
        let node = self.address.addr();
        let (dns_input, dns_prerouting) = if self.dns {
            let port = super::DNS_TCP_PORT;
            // The node's IPv6 tunnel address answers too, with wireguard.pool6.
            let mut addresses = vec![("ip", node.to_string())];
            addresses.extend(
                self.pool6
                    .map(|(_, node6)| ("ip6", node6.addr().to_string())),
            );
            let (mut input, mut redirect) = (String::new(), String::new());
            for (family, address) in addresses {
                input.push_str(&format!(
                    "\t\tiifname \"{tun}\" {family} daddr {address} tcp dport {port} accept\n"
                ));
                redirect.push_str(&format!(
                    "\t\tiifname \"{tun}\" {family} daddr {address} tcp dport 53 redirect to :{port}\n"
                ));
            }
            (
                input,
                format!(
                    "\tchain prerouting {{\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n{redirect}\t}}\n"
                ),
            )
        } else {
            (String::new(), String::new())
        };
        // IPv6 inside the tunnel: the same client-to-client drop and
        // masquerade for the IPv6 pool.
        let (pool6_forward, pool6_postrouting) = match self.pool6 {
            Some((pool6, _)) => (
                format!("\t\tiifname \"{tun}\" ip6 daddr {pool6} drop\n"),
                format!("\t\tip6 saddr {pool6} oifname \"{out_interface}\" masquerade\n"),
            ),
            None => (String::new(), String::new()),
        };
        let exits = self.nft_exit_parts();
        let (exit_input, exit_forward, exit_postrouting) =
            (exits.input, exits.forward, exits.postrouting);
        format!(
            "add table {NFT_TABLE}
delete table {NFT_TABLE}
table {NFT_TABLE} {{
	chain input {{
		type filter hook input priority filter; policy accept;
		iifname \"{tun}\" ct state established,related accept
{dns_input}{input}		iifname \"{tun}\" drop
{exit_input}	}}
	chain forward {{
		type filter hook forward priority filter; policy accept;
		iifname \"{tun}\" ct state invalid meta l4proto tcp reject with tcp reset
		iifname \"{tun}\" ct state invalid drop
{pool_allowed}		iifname \"{tun}\" ip daddr {pool} drop
{pool6_forward}		oifname \"{tun}\" ct state established,related accept
		oifname \"{tun}\" drop
{exit_forward}	}}
{dns_prerouting}	chain postrouting {{
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr {pool} oifname \"{out_interface}\" masquerade
{pool6_postrouting}{exit_postrouting}	}}
}}
"
        )
    }

    /// The nftables transaction teardown runs: delete the table whether or
    /// not it exists.
    pub fn nft_teardown_script(&self) -> String {
        teardown_script()
    }
}

/// [`Plan::nft_teardown_script`]: both tables have fixed names.
pub(super) fn teardown_script() -> String {
    let steer = super::exits::STEER_TABLE;
    format!(
        "add table {NFT_TABLE}\ndelete table {NFT_TABLE}\nadd table {steer}\ndelete table {steer}\n"
    )
}
