//! The addresses of this host's own interfaces, which the egress policy
//! refuses as destinations (unless `egress.allow` lists them): a customer
//! must not reach the node's own services through its public address, nor a
//! WireGuard client the host's other addresses. Behind a 1:1 NAT the public
//! address is on no interface: the ones the configuration names as the
//! node's (`proxy.udp_public_address`, `wireguard.endpoint`) are refused
//! too ([`configured_public`]).
//!
//! They are read with `getifaddrs` when the set is made and then every
//! [`REFRESH_EVERY`] (30 s) by a task that ends with the last clone of the
//! set; a failed read keeps the previous set (and is logged). Lookups take
//! read locks on two hash sets (read and configured), cheap enough for every
//! inner packet.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

/// How often the set is read again.
pub const REFRESH_EVERY: Duration = Duration::from_secs(30);

/// How long resolving a `wireguard.endpoint` name may take.
const ENDPOINT_LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// The host's own addresses, shared by every clone.
#[derive(Debug, Clone, Default)]
pub struct HostAddresses {
    set: Arc<RwLock<HashSet<IpAddr>>>,
    /// The node's addresses that no interface has (its public ones behind a
    /// 1:1 NAT), from the configuration: kept across refreshes.
    configured: Arc<RwLock<HashSet<IpAddr>>>,
}

impl HostAddresses {
    /// Reads the host's addresses now and, inside a tokio runtime, keeps
    /// them fresh every [`REFRESH_EVERY`] for as long as a clone lives. A
    /// failed first read leaves the set empty until a refresh succeeds
    /// (logged).
    pub fn watch() -> HostAddresses {
        let host = HostAddresses::default();
        if let Err(error) = host.refresh() {
            tracing::error!(%error, "cannot read this host's addresses (getifaddrs): egress does not refuse them until a later read succeeds");
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(keep_fresh(Arc::downgrade(&host.set)));
        }
        host
    }

    /// A fixed set (tests).
    pub fn fixed(addresses: impl IntoIterator<Item = IpAddr>) -> HostAddresses {
        HostAddresses {
            set: Arc::new(RwLock::new(addresses.into_iter().collect())),
            configured: Arc::default(),
        }
    }

    /// Counts `addresses` among the host's own from now on, whatever its
    /// interfaces have.
    pub fn add_configured(&self, addresses: impl IntoIterator<Item = IpAddr>) {
        self.configured
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend(addresses.into_iter().map(|ip| ip.to_canonical()));
    }

    /// True when `ip` is one of the host's addresses (an IPv4-mapped IPv6
    /// address counts as the IPv4 address it carries).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        let read = |set: &RwLock<HashSet<IpAddr>>| {
            set.read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .contains(&ip)
        };
        read(&self.set) || read(&self.configured)
    }

    /// How many addresses are known.
    pub fn len(&self) -> usize {
        self.set
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// True when no address is known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads the addresses again, replacing the set; on failure the set is
    /// left as it was.
    pub fn refresh(&self) -> nix::Result<()> {
        let fresh = read()?;
        store(&self.set, fresh);
        Ok(())
    }
}

/// Counts the node's public addresses that the configuration names among
/// `host`'s: `proxy.udp_public_address` and `wireguard.endpoint`'s address at
/// once, and the addresses an endpoint name resolves to once a lookup (in the
/// background, within 5 s, so that it never holds up a start) answers.
pub fn configured_public(config: &blipless_config::Config, host: &HostAddresses) {
    host.add_configured(config.proxy.udp_public_address);
    let Some(endpoint) = config.wireguard.endpoint.clone() else {
        return;
    };
    if let Ok(address) = endpoint.parse::<SocketAddr>() {
        host.add_configured([address.ip()]);
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let host = host.clone();
    runtime.spawn(async move {
        let lookup = tokio::net::lookup_host(endpoint.as_str());
        match tokio::time::timeout(ENDPOINT_LOOKUP_TIMEOUT, lookup).await {
            Ok(Ok(found)) => host.add_configured(found.map(|address| address.ip())),
            Ok(Err(error)) => {
                tracing::warn!(%endpoint, %error, "cannot resolve wireguard.endpoint: its addresses are refused as destinations only where an interface of the host has them")
            }
            Err(_) => {
                tracing::warn!(%endpoint, "resolving wireguard.endpoint timed out: its addresses are refused as destinations only where an interface of the host has them")
            }
        }
    });
}

/// Every address of every interface of this host (its network namespace).
pub fn read() -> nix::Result<HashSet<IpAddr>> {
    let mut addresses = HashSet::new();
    for interface in nix::ifaddrs::getifaddrs()? {
        let Some(address) = interface.address else {
            continue;
        };
        if let Some(v4) = address.as_sockaddr_in() {
            addresses.insert(IpAddr::V4(v4.ip()));
        } else if let Some(v6) = address.as_sockaddr_in6() {
            addresses.insert(IpAddr::V6(v6.ip()).to_canonical());
        }
    }
    Ok(addresses)
}

fn store(set: &RwLock<HashSet<IpAddr>>, fresh: HashSet<IpAddr>) {
    let mut set = set
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if *set != fresh {
        tracing::debug!(addresses = fresh.len(), "this host's addresses changed");
        *set = fresh;
    }
}

/// Reads the addresses every [`REFRESH_EVERY`] until the set is dropped.
async fn keep_fresh(set: Weak<RwLock<HashSet<IpAddr>>>) {
    let mut failing = false;
    loop {
        tokio::time::sleep(REFRESH_EVERY).await;
        if set.strong_count() == 0 {
            return;
        }
        let fresh = match tokio::task::spawn_blocking(read).await {
            Ok(fresh) => fresh,
            Err(_) => continue,
        };
        let Some(set) = set.upgrade() else {
            return;
        };
        match fresh {
            Ok(fresh) => {
                failing = false;
                store(&set, fresh);
            }
            Err(error) => {
                if !failing {
                    tracing::warn!(%error, "cannot read this host's addresses again (getifaddrs); keeping the last ones");
                }
                failing = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_among_the_hosts_addresses() {
        let addresses = read().expect("getifaddrs");
        assert!(
            addresses.contains(&IpAddr::from([127, 0, 0, 1])),
            "{addresses:?}"
        );
    }

    #[test]
    fn mapped_addresses_count_as_ipv4() {
        let host = HostAddresses::fixed(["100.128.0.1".parse().expect("ip")]);
        assert!(host.contains("100.128.0.1".parse().expect("ip")));
        assert!(host.contains("::ffff:100.128.0.1".parse().expect("ip")));
        assert!(!host.contains("100.128.0.2".parse().expect("ip")));
        assert_eq!(host.len(), 1);
    }

    #[test]
    fn configured_addresses_stay_the_hosts_across_refreshes() {
        let host = HostAddresses::fixed([]);
        host.add_configured(["::ffff:100.128.0.7".parse().expect("ip")]);
        assert!(host.contains("100.128.0.7".parse().expect("ip")));
        host.refresh().expect("getifaddrs");
        assert!(host.contains("100.128.0.7".parse().expect("ip")));
        assert!(host.contains("127.0.0.1".parse().expect("ip")));
    }

    fn config(extra: &str) -> blipless_config::Config {
        blipless_config::Config::from_toml_str(extra, "test", [], &[]).expect("config")
    }

    #[tokio::test]
    async fn the_public_addresses_the_configuration_names_are_the_hosts() {
        let host = HostAddresses::fixed([]);
        configured_public(
            &config(
                "[proxy]\nudp_public_address = \"100.128.0.1\"\n[wireguard]\nendpoint = \"[2606:4700::1111]:51820\"\n",
            ),
            &host,
        );
        assert!(host.contains("100.128.0.1".parse().expect("ip")));
        assert!(host.contains("2606:4700::1111".parse().expect("ip")));
        let named = HostAddresses::fixed([]);
        configured_public(
            &config("[wireguard]\nendpoint = \"localhost:51820\"\n"),
            &named,
        );
        let resolved = async {
            while !named.contains("127.0.0.1".parse().expect("ip")) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), resolved)
            .await
            .expect("the endpoint's name resolved and counted");
        let none = HostAddresses::fixed([]);
        configured_public(&config(""), &none);
        assert!(none.configured.read().expect("lock").is_empty());
    }

    #[tokio::test]
    async fn watching_reads_at_once_and_the_refresher_ends_with_the_set() {
        let host = HostAddresses::watch();
        assert!(host.contains(IpAddr::from([127, 0, 0, 1])));
        let weak = Arc::downgrade(&host.set);
        drop(host);
        assert_eq!(
            weak.strong_count(),
            0,
            "the refresher holds no strong reference"
        );
    }
}
