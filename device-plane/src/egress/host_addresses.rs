//! The addresses of this host's own interfaces, which the egress policy
//! refuses as destinations (unless `egress.allow` lists them): a customer
//! must not reach the node's own services through its public address, nor a
//! WireGuard client the host's other addresses.
//!
//! They are read with `getifaddrs` when the set is made and then every
//! [`REFRESH_EVERY`] (30 s) by a task that ends with the last clone of the
//! set; a failed read keeps the previous set (and is logged). Lookups take a
//! read lock on a hash set, cheap enough for every inner packet.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

/// How often the set is read again.
pub const REFRESH_EVERY: Duration = Duration::from_secs(30);

/// The host's own addresses, shared by every clone.
#[derive(Debug, Clone, Default)]
pub struct HostAddresses {
    set: Arc<RwLock<HashSet<IpAddr>>>,
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
        }
    }

    /// True when `ip` is one of the host's addresses (an IPv4-mapped IPv6
    /// address counts as the IPv4 address it carries).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.set
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(&ip)
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
