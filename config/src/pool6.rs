//! IPv6 inside the WireGuard tunnel (`wireguard.pool6`, docs/WIREGUARD.md,
//! "IPv6"): a client's IPv6 tunnel address is not stored anywhere; it is its
//! IPv4 address's place in `wireguard.pool` at the same place in
//! `wireguard.pool6`. Every process derives it the same way, and two clients
//! never share one because they never share an IPv4 address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// The two client pools, for mapping a tunnel address between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TunnelPools {
    v4: Ipv4Net,
    v6: Ipv6Net,
}

impl TunnelPools {
    /// The pools, when `pool` is IPv4, `pool6` IPv6 and it has at least as
    /// many host bits; None otherwise (the configuration check says why).
    pub fn new(pool: IpNet, pool6: IpNet) -> Option<Self> {
        match (pool, pool6) {
            (IpNet::V4(v4), IpNet::V6(v6)) if fits(v4, v6) => Some(Self {
                v4: v4.trunc(),
                v6: v6.trunc(),
            }),
            _ => None,
        }
    }

    /// The IPv6 network.
    pub fn v6(&self) -> Ipv6Net {
        self.v6
    }

    /// The IPv6 twin of an address in the IPv4 pool.
    pub fn v6_of(&self, v4: Ipv4Addr) -> Option<Ipv6Addr> {
        if !self.v4.contains(&v4) {
            return None;
        }
        let offset = u32::from(v4) - u32::from(self.v4.network());
        Some(Ipv6Addr::from(
            u128::from(self.v6.network()) + u128::from(offset),
        ))
    }

    /// The IPv4 address whose twin `v6` is, if it is one.
    pub fn v4_of(&self, v6: Ipv6Addr) -> Option<Ipv4Addr> {
        if !self.v6.contains(&v6) {
            return None;
        }
        let offset = u128::from(v6) - u128::from(self.v6.network());
        let offset = u32::try_from(offset).ok()?;
        let v4 = u32::from(self.v4.network()).checked_add(offset)?;
        let v4 = Ipv4Addr::from(v4);
        self.v4.contains(&v4).then_some(v4)
    }

    /// An inner address as the IPv4 tunnel address it stands for: itself
    /// if IPv4, its IPv4 twin if it is one, None otherwise.
    pub fn as_v4(&self, address: IpAddr) -> Option<Ipv4Addr> {
        match address {
            IpAddr::V4(v4) => Some(v4),
            IpAddr::V6(v6) => self.v4_of(v6),
        }
    }
}

/// Whether `v6` has room for every address of `v4` at the same place.
pub(crate) fn fits(v4: Ipv4Net, v6: Ipv6Net) -> bool {
    128 - u32::from(v6.prefix_len()) >= 32 - u32::from(v4.prefix_len())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;

    fn pools(v4: &str, v6: &str) -> Option<TunnelPools> {
        TunnelPools::new(v4.parse().unwrap(), v6.parse().unwrap())
    }

    #[test]
    fn addresses_map_both_ways_at_the_same_place() {
        let pools = pools("10.64.0.0/16", "fd64::/64").unwrap();
        let v4: Ipv4Addr = "10.64.3.7".parse().unwrap();
        let v6 = pools.v6_of(v4).unwrap();
        assert_eq!(v6, "fd64::307".parse::<Ipv6Addr>().unwrap());
        assert_eq!(pools.v4_of(v6), Some(v4));
        assert_eq!(pools.as_v4(IpAddr::V6(v6)), Some(v4));
        assert_eq!(pools.as_v4(IpAddr::V4(v4)), Some(v4));
        // The node's own address (the pool's first host) too.
        assert_eq!(
            pools.v6_of("10.64.0.1".parse().unwrap()),
            Some("fd64::1".parse().unwrap())
        );
    }

    #[test]
    fn outside_either_pool_is_nothing() {
        let pools = pools("10.64.0.0/16", "fd64::/112").unwrap();
        assert_eq!(pools.v6_of("10.65.0.1".parse().unwrap()), None);
        assert_eq!(pools.v4_of("fd65::1".parse().unwrap()), None);
        // Outside the /112 (which holds exactly what the /16 maps).
        assert_eq!(pools.v4_of("fd64::1:0".parse().unwrap()), None);
        assert_eq!(
            pools.v4_of("fd64::ffff".parse().unwrap()),
            Some("10.64.255.255".parse().unwrap())
        );
        // A /64 holds more than the /16 maps: past the mapping is nothing.
        let wide = super::TunnelPools::new(
            "10.64.0.0/16".parse().unwrap(),
            "fd64::/64".parse().unwrap(),
        )
        .unwrap();
        assert_eq!(wide.v4_of("fd64::1:0".parse().unwrap()), None);
        assert_eq!(wide.v4_of("fd64::1:0:0".parse().unwrap()), None);
        assert_eq!(
            wide.v4_of("fd64::ffff".parse().unwrap()),
            Some("10.64.255.255".parse().unwrap())
        );
    }

    #[test]
    fn a_pool6_too_small_or_of_the_wrong_family_is_refused() {
        assert!(pools("10.64.0.0/16", "fd64::/113").is_none());
        assert!(pools("10.64.0.0/16", "10.65.0.0/16").is_none());
        assert!(pools("fd00::/64", "fd64::/64").is_none());
        assert!(pools("10.64.0.0/24", "fd64::/120").is_some());
    }
}
