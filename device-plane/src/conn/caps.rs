//! Caps on what one device plane serves (issue 14): customer connections at
//! once (`limits.connections`) and tunnels per client (`limits.tunnels_per_client`),
//! each refused with the protocol's own answer and counted.
//!
//! - Over the connection cap, a SOCKS5 customer gets "no acceptable method"
//!   to its greeting (RFC 1928 has no "busy" reply before a request) and an
//!   HTTP customer `503 Service Unavailable` with `Retry-After: 1`; then the
//!   connection closes. The refusal is a small task of its own, bounded by
//!   [`REFUSAL_TIME`], outside the plane's connection tracker (it never holds a
//!   drain).
//! - Over the tunnel cap, a CONNECT gets SOCKS5 reply 2 (not allowed by the
//!   ruleset) or HTTP `429 Too Many Requests`. Tunnels adopted from a
//!   predecessor always count and are never refused. A client's own
//!   `max_connections` (docs/LIMITS.md) wins over the node's cap, and
//!   counts its tunnels on the fleet's other nodes too, as they last
//!   recorded them in the store.
//! - A client over its quota gets SOCKS5 reply 2 or HTTP `403 Forbidden`
//!   with the reason, for every new tunnel or request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::clients::{Client, Meter};

/// Why a new tunnel of a client is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// It has this many tunnels open already, its cap.
    TunnelCap(u64),
    /// It is over its quota.
    OverQuota,
}

/// Longest a refused customer is given to send its greeting or request head,
/// read its refusal and close (the linger included).
pub const REFUSAL_TIME: Duration = Duration::from_secs(2);

/// The caps and what they refused.
#[derive(Debug, Default)]
pub struct Caps {
    /// Connections at once; 0: no cap.
    pub connections: u64,
    /// Tunnels per client at once; 0: no cap.
    pub tunnels_per_client: u64,
    /// SOCKS5 UDP associations per client at once; 0: no cap.
    pub udp_associations_per_client: u64,
    refused_connections: AtomicU64,
    refused_tunnels: AtomicU64,
    refused_over_quota: AtomicU64,
}

impl Caps {
    /// Caps as configured.
    pub fn new(connections: u64, tunnels_per_client: u64) -> Self {
        Self {
            connections,
            tunnels_per_client,
            ..Self::default()
        }
    }

    /// With a cap on each client's SOCKS5 UDP associations (0: none).
    pub fn with_udp_associations_per_client(mut self, cap: u64) -> Self {
        self.udp_associations_per_client = cap;
        self
    }

    /// Whether `meter`'s client may open one more UDP association: the
    /// count it returns is the association's, held until it ends. Counted
    /// before it is judged, as [`Caps::check_tunnel`] does. The refusal is
    /// counted by the caller (with the UDP relays' counts).
    pub fn check_udp_association(&self, meter: &Arc<Meter>) -> Option<UdpAssociationCount> {
        let (counted, here) = UdpAssociationCount::counting(meter.clone());
        let cap = self.udp_associations_per_client;
        (cap == 0 || here <= cap).then_some(counted)
    }

    /// Whether a new connection may be served with `open` connections now;
    /// counts a refusal.
    pub fn admits_connection(&self, open: u64) -> bool {
        if self.connections == 0 || open < self.connections {
            return true;
        }
        self.refused_connections.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// Whether a client with this meter may open one more tunnel under
    /// `own_cap` (its own `max_connections`) or else the node's cap; counts
    /// a refusal.
    pub fn admits_tunnel(&self, meter: &Meter, own_cap: Option<u64>) -> bool {
        self.admits_tunnel_in_fleet(meter, own_cap, 0)
    }

    /// [`Caps::admits_tunnel`], with `others` tunnels of the client open on
    /// the fleet's other nodes counted against its own cap (never against
    /// the node's `limits.tunnels_per_client`).
    pub fn admits_tunnel_in_fleet(&self, meter: &Meter, own_cap: Option<u64>, others: u64) -> bool {
        let (cap, elsewhere) = match own_cap {
            Some(cap) => (cap, others),
            None => (self.tunnels_per_client, 0),
        };
        let here = meter.live_tunnels.load(Ordering::Relaxed);
        if cap == 0 || here.saturating_add(elsewhere) < cap {
            return true;
        }
        self.refused_tunnels.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// Whether `client` may open one more tunnel (or send one more
    /// request): under its connection cap and not over its quota. Counts a
    /// refusal.
    /// The tunnel is counted before it is judged (and uncounted when
    /// refused), so CONNECTs arriving at once cannot all slip under the cap:
    /// the count it returns is the tunnel's, held until it ends.
    pub fn check_tunnel(&self, client: &Client) -> Result<TunnelCount, Refusal> {
        self.check_quota(client)?;
        let own_cap = client.limiter.max_connections();
        let (cap, elsewhere) = match own_cap {
            Some(cap) => (cap, client.limiter.fleet_others()),
            None => (self.tunnels_per_client, 0),
        };
        // Ours included: at most `cap`. Judged on the count our own
        // increment made, not on a load after it: a CONNECT counted after
        // ours (and refused) must not get ours refused too.
        let (counted, here) = TunnelCount::counting(client.meter.clone());
        if cap == 0 || here.saturating_add(elsewhere) <= cap {
            return Ok(counted);
        }
        drop(counted);
        self.refused_tunnels.fetch_add(1, Ordering::Relaxed);
        Err(Refusal::TunnelCap(cap))
    }

    /// Whether `client` is under its quota; counts a refusal.
    pub fn check_quota(&self, client: &Client) -> Result<(), Refusal> {
        if client.limiter.is_over_quota() {
            self.refused_over_quota.fetch_add(1, Ordering::Relaxed);
            return Err(Refusal::OverQuota);
        }
        Ok(())
    }

    /// Tunnels and requests refused because their client was over its quota.
    pub fn refused_over_quota(&self) -> u64 {
        self.refused_over_quota.load(Ordering::Relaxed)
    }

    /// Connections refused at the connection cap so far.
    pub fn refused_connections(&self) -> u64 {
        self.refused_connections.load(Ordering::Relaxed)
    }

    /// Tunnels refused at the per-client cap so far.
    pub fn refused_tunnels(&self) -> u64 {
        self.refused_tunnels.load(Ordering::Relaxed)
    }
}

/// One open tunnel of a client, counted while it lives.
#[derive(Debug)]
pub struct TunnelCount(Arc<Meter>);

impl TunnelCount {
    /// Counts a tunnel of the client with this meter until dropped.
    pub fn new(meter: Arc<Meter>) -> Self {
        Self::counting(meter).0
    }

    /// [`TunnelCount::new`], and the client's open tunnels with this one.
    pub fn counting(meter: Arc<Meter>) -> (Self, u64) {
        let before = meter.live_tunnels.fetch_add(1, Ordering::Relaxed);
        (Self(meter), before.saturating_add(1))
    }
}

impl Drop for TunnelCount {
    fn drop(&mut self) {
        self.0.live_tunnels.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One SOCKS5 UDP association of a client, counted in its meter while held.
#[derive(Debug)]
pub struct UdpAssociationCount(Arc<Meter>);

impl UdpAssociationCount {
    /// Counts an association of the client with this meter until dropped.
    pub fn new(meter: Arc<Meter>) -> Self {
        Self::counting(meter).0
    }

    /// [`UdpAssociationCount::new`], and the client's open associations
    /// with this one.
    pub fn counting(meter: Arc<Meter>) -> (Self, u64) {
        let before = meter.live_udp_associations.fetch_add(1, Ordering::Relaxed);
        (Self(meter), before.saturating_add(1))
    }
}

impl Drop for UdpAssociationCount {
    fn drop(&mut self) {
        self.0.live_udp_associations.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Answers a SOCKS5 customer over the connection cap: reads its greeting,
/// says no acceptable method, closes with a linger (all within
/// [`REFUSAL_TIME`]).
pub async fn refuse_socks(mut stream: TcpStream) {
    let _ = tokio::time::timeout(REFUSAL_TIME, async {
        let mut greeting = [0u8; 257];
        let _ = stream.read(&mut greeting).await;
        let _ = stream
            .write_all(&blipless_protocol::socks5::method_selection(
                blipless_protocol::socks5::METHOD_NONE_ACCEPTABLE,
            ))
            .await;
        // Not a plain close: bytes sent after the greeting (a client that
        // pipelines) would make it a reset.
        crate::conn::linger::linger_close(stream).await;
    })
    .await;
}

/// Answers an HTTP proxy customer over the connection cap with 503: reads
/// (up to 16 KiB of) its request head first, so the answer is not lost to a
/// reset for unread bytes.
pub async fn refuse_http(mut stream: TcpStream) {
    let _ = tokio::time::timeout(REFUSAL_TIME, async {
        let mut head = Vec::with_capacity(1024);
        let mut chunk = [0u8; 4096];
        while head.len() < 16 * 1024 && !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&chunk[..n]),
            }
        }
        let body = "this proxy is at its connection limit; try again\n";
        let answer = format!(
            "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let _ = stream.write_all(answer.as_bytes()).await;
        // Not a plain close: a body behind the head would make it a reset.
        crate::conn::linger::linger_close(stream).await;
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_means_no_cap() {
        let caps = Caps::new(0, 0);
        assert!(caps.admits_connection(u64::MAX - 1));
        let meter = Meter::default();
        meter.live_tunnels.store(1_000_000, Ordering::Relaxed);
        assert!(caps.admits_tunnel(&meter, None));
        assert_eq!((caps.refused_connections(), caps.refused_tunnels()), (0, 0));
    }

    #[test]
    fn caps_refuse_at_the_limit_and_count() {
        let caps = Caps::new(2, 1);
        assert!(caps.admits_connection(1));
        assert!(!caps.admits_connection(2));
        let meter = Arc::new(Meter::default());
        assert!(caps.admits_tunnel(&meter, None));
        let held = TunnelCount::new(meter.clone());
        assert!(!caps.admits_tunnel(&meter, None));
        drop(held);
        assert!(caps.admits_tunnel(&meter, None));
        assert_eq!((caps.refused_connections(), caps.refused_tunnels()), (1, 1));
        // A client's own cap wins over the node's, either way.
        let held = TunnelCount::new(meter.clone());
        assert!(caps.admits_tunnel(&meter, Some(2)));
        let _second = TunnelCount::new(meter.clone());
        assert!(!caps.admits_tunnel(&meter, Some(2)));
        drop(held);
        assert!(!Caps::new(0, 0).admits_tunnel(&meter, Some(1)));
        // Tunnels elsewhere in the fleet count against the client's own cap
        // only.
        assert!(!caps.admits_tunnel_in_fleet(&meter, Some(3), 2));
        assert!(caps.admits_tunnel_in_fleet(&meter, Some(4), 2));
        assert!(!caps.admits_tunnel_in_fleet(&meter, None, 0));
    }
}
