//! The interface WireGuard clients' traffic leaves by
//! (`egress.tun.out_interface`): as configured, which must exist, or, when
//! empty, the interface of the IPv4 default route (lowest metric), read from
//! `/proc/net/route` when `net setup` runs. A name that matches no interface
//! would make the masquerade rule match nothing, and clients would reach
//! nothing, silently; so setup refuses it and says which interface the
//! default route leaves by. Parsing is separate from reading, so it is
//! tested on fixed text.

use super::NetError;

/// The kernel's IPv4 routing table.
const ROUTES: &str = "/proc/net/route";
/// The route flag "up" (`RTF_UP`).
const RTF_UP: u32 = 0x1;

/// The interface of the IPv4 default route with the lowest metric in
/// `/proc/net/route` text, if there is one.
pub fn default_route_interface(routes: &str) -> Option<String> {
    routes
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [name, destination, _gateway, flags, _refs, _use, metric, mask, ..] =
                fields.as_slice()
            else {
                return None;
            };
            let flags = u32::from_str_radix(flags, 16).ok()?;
            let default = *destination == "00000000" && *mask == "00000000";
            (default && flags & RTF_UP != 0)
                .then(|| Some((metric.parse::<u32>().ok()?, name.to_string())))
                .flatten()
        })
        .min()
        .map(|(_, name)| name)
}

/// The interface to masquerade out of: `configured` if it exists
/// (`exists`), the default route's when `configured` is empty; an error that
/// says what to set otherwise.
pub fn choose(
    configured: &str,
    routes: &str,
    exists: impl Fn(&str) -> bool,
) -> Result<String, NetError> {
    let default = default_route_interface(routes);
    if configured.is_empty() {
        return default.ok_or(NetError::NoDefaultRoute);
    }
    if exists(configured) {
        return Ok(configured.to_string());
    }
    Err(NetError::NoSuchInterface {
        name: configured.to_string(),
        default_route: default.map_or_else(
            || " (this host has no IPv4 default route)".to_string(),
            |name| format!(" (the default route leaves by {name}: set egress.tun.out_interface = \"{name}\", or \"\" for the default route's)"),
        ),
    })
}

/// [`choose`] on this host (its network namespace).
pub fn find(configured: &str) -> Result<String, NetError> {
    let routes = std::fs::read_to_string(ROUTES).unwrap_or_default();
    choose(configured, &routes, |name| {
        std::path::Path::new("/sys/class/net").join(name).exists()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROUTES_TEXT: &str = "\
Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
ens5\t0000A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
wlan0\t00000000\t0101A8C0\t0003\t0\t0\t600\t00000000\t0\t0\t0
ens5\t00000000\t0100A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0
down0\t00000000\t0100A8C0\t0002\t0\t0\t1\t00000000\t0\t0\t0
";

    #[test]
    fn the_default_route_with_the_lowest_metric_that_is_up_wins() {
        assert_eq!(
            default_route_interface(ROUTES_TEXT).as_deref(),
            Some("ens5")
        );
    }

    #[test]
    fn no_default_route_and_garbage_give_none() {
        let header_only = ROUTES_TEXT.lines().next().unwrap_or_default();
        assert_eq!(default_route_interface(header_only), None);
        assert_eq!(default_route_interface("Iface\nnot a route line\n"), None);
        assert_eq!(default_route_interface(""), None);
    }

    #[test]
    fn empty_means_the_default_routes_interface() {
        let chosen = choose("", ROUTES_TEXT, |_| false).expect("found");
        assert_eq!(chosen, "ens5");
        let none = choose("", "", |_| true);
        assert!(matches!(none, Err(NetError::NoDefaultRoute)), "{none:?}");
    }

    #[test]
    fn a_configured_interface_must_exist_and_the_error_names_the_default_one() {
        let chosen = choose("eth1", ROUTES_TEXT, |name| name == "eth1").expect("exists");
        assert_eq!(chosen, "eth1");
        let error = choose("eth0", ROUTES_TEXT, |_| false).expect_err("missing");
        let said = error.to_string();
        assert!(said.contains("eth0") && said.contains("ens5"), "{said}");
    }
}
