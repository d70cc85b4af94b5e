//! dnsmasq as the DNS server of the tests that resolve names (the SOCKS5
//! UDP relay, the WireGuard DNS gateway over IPv4 and IPv6): one set of
//! arguments, so every test's server reads no configuration of the host's
//! and logs each query where the test can read it.

/// The name every test server answers.
pub const SHOP: &str = "shop.example";
/// The address it answers for [`SHOP`] (TEST-NET-1).
pub const SHOP_ADDRESS: &str = "192.0.2.77";

/// dnsmasq's arguments to serve in the foreground on `listen:port`, with
/// nothing from the host (no `/etc/dnsmasq.conf`, `resolv.conf` or
/// `/etc/hosts`), every query logged to its output, [`SHOP`] answered with
/// [`SHOP_ADDRESS`], and `more` added after (more `--address=` lines).
pub fn dnsmasq_args(listen: &str, port: u16, more: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--keep-in-foreground",
        "--conf-file=/dev/null",
        "--no-resolv",
        "--no-hosts",
        "--bind-interfaces",
        "--user=root",
        "--pid-file=",
        "--log-queries",
        "--log-facility=-",
    ]
    .iter()
    .map(|arg| arg.to_string())
    .collect();
    args.push(format!("--listen-address={listen}"));
    args.push(format!("--port={port}"));
    args.push(format!("--address=/{SHOP}/{SHOP_ADDRESS}"));
    args.extend(more.iter().map(|arg| arg.to_string()));
    args
}
