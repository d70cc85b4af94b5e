//! DNS over TCP for WireGuard clients (RFC 7766 framing: a two-byte length
//! before each message), on [`DNS_TCP_PORT`] where `net setup` redirects
//! TCP port 53 to the node's tunnel address.
//!
//! A connection holds a descriptor for as long as its client keeps it
//! (up to [`TCP_IDLE`] between queries, and as long for an answer to be
//! taken), so what clients can open is
//! bounded: [`TCP_CONNECTIONS`] at once in all and [`TCP_PER_SOURCE`] per
//! client address (a redirected connection keeps its client's tunnel
//! address), each counted in the plane's descriptor budget and refused when
//! the budget has no room; over any of them the connection is closed at
//! once and counted as dropped (a client's resolver falls back or retries).
//! A query takes one of the gateway's in-flight slots while it is resolved,
//! as a UDP one does.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::{DnsGateway, Transport, DNS_TCP_PORT};
use crate::conn::fd_budget::Held;
use crate::keyed_places::{KeyedPlace, KeyedPlaces};

/// A TCP connection with no query for this long is closed (RFC 7766 §6.2.3
/// suggests seconds).
const TCP_IDLE: Duration = Duration::from_secs(10);
/// Queries answered on one TCP connection before it is closed.
const TCP_QUERIES: usize = 100;
/// TCP connections open at once, from all clients.
pub(super) const TCP_CONNECTIONS: usize = 256;
/// TCP connections open at once from one client address.
pub(super) const TCP_PER_SOURCE: usize = 8;

/// The TCP connections open now, per client address.
#[derive(Debug)]
pub(super) struct TcpConnections(KeyedPlaces<IpAddr>);

impl Default for TcpConnections {
    fn default() -> Self {
        Self(KeyedPlaces::new(TCP_PER_SOURCE))
    }
}

/// One admitted connection: its place in [`TcpConnections`] (and its
/// descriptor in the budget, when there is one) until dropped.
struct Admitted {
    _place: KeyedPlace<IpAddr>,
    _held: Option<Held>,
}

impl DnsGateway {
    /// Listens on the node's address, [`DNS_TCP_PORT`] (where `net setup`
    /// redirects TCP port 53), until [`Self::drain`]. Without the address
    /// (no TUN device set up) it says why and serves only UDP.
    pub fn serve_tcp(self: &Arc<Self>) {
        let addresses =
            std::iter::once(IpAddr::V4(self.address)).chain(self.address6.map(IpAddr::V6));
        for address in addresses {
            match listen(address) {
                Ok(listener) => self.serve_listener(listener),
                Err(error) => {
                    tracing::info!(%error, %address, port = DNS_TCP_PORT, "DNS gateway: not answering over TCP (is the TUN device set up?)");
                }
            }
        }
    }

    /// Accepts on `listener` until [`Self::drain`], each admitted
    /// connection served by a task of its own.
    pub(super) fn serve_listener(self: &Arc<Self>, listener: TcpListener) {
        let gateway = self.clone();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    () = gateway.stop.cancelled() => break,
                };
                match accepted {
                    Ok((stream, from)) => match gateway.admit(from.ip()) {
                        Some(admitted) => {
                            let connection = gateway.clone();
                            gateway.tasks.spawn(async move {
                                connection.serve_connection(stream).await;
                                drop(admitted);
                            });
                        }
                        None => {
                            // Closed at once (dropped here).
                            gateway.counters.dropped.fetch_add(1, Ordering::Relaxed);
                        }
                    },
                    Err(error) => {
                        tracing::debug!(%error, "DNS gateway: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        });
    }

    /// A place for one more connection from `source`, if the caps and the
    /// descriptor budget have room.
    fn admit(&self, source: IpAddr) -> Option<Admitted> {
        if self.fds.get().is_some_and(|fds| !fds.admits_another()) {
            return None;
        }
        Some(Admitted {
            _place: self.tcp.0.take(&source, TCP_CONNECTIONS)?,
            _held: self.fds.get().map(|fds| fds.hold()),
        })
    }

    /// Answers the queries of one TCP connection, in order.
    async fn serve_connection(&self, mut stream: TcpStream) {
        for _ in 0..TCP_QUERIES {
            let mut length = [0u8; 2];
            let read = tokio::select! {
                read = tokio::time::timeout(TCP_IDLE, stream.read_exact(&mut length)) => read,
                () = self.stop.cancelled() => return,
            };
            if !matches!(read, Ok(Ok(_))) {
                return;
            }
            let mut query = vec![0u8; usize::from(u16::from_be_bytes(length))];
            if !matches!(
                tokio::time::timeout(TCP_IDLE, stream.read_exact(&mut query)).await,
                Ok(Ok(_))
            ) {
                return;
            }
            let Ok(_slot) = self.slots.try_acquire() else {
                // As many lookups as the gateway makes at once are running.
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
                return;
            };
            let Some(answer) = self.resolve(&query, Transport::Tcp).await else {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
                return;
            };
            let Ok(size) = u16::try_from(answer.len()) else {
                return;
            };
            let mut framed = Vec::with_capacity(answer.len() + 2);
            framed.extend_from_slice(&size.to_be_bytes());
            framed.extend_from_slice(&answer);
            // Bounded like the reads: a client that stops reading must not
            // hold its place, and a descriptor, for ever.
            if !matches!(
                tokio::time::timeout(TCP_IDLE, stream.write_all(&framed)).await,
                Ok(Ok(()))
            ) {
                return;
            }
            self.counters.answered.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A listener on `address`, [`DNS_TCP_PORT`], shared with the other plane
/// of a deploy (SO_REUSEPORT).
fn listen(address: IpAddr) -> std::io::Result<TcpListener> {
    let socket = match address {
        IpAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
        IpAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
    }?;
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(true)?;
    socket.bind(SocketAddr::new(address, DNS_TCP_PORT))?;
    socket.listen(64)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use hickory_resolver::proto::op::{Message, OpCode, ResponseCode};

    use super::*;

    /// A query the gateway answers without a resolver: NOTIMP for a
    /// STATUS query, framed for TCP.
    fn framed_status_query() -> Vec<u8> {
        let mut query = Message::query();
        query.metadata.id = 7;
        query.metadata.op_code = OpCode::Status;
        let bytes = query.to_vec().expect("encodes");
        let mut framed = u16::try_from(bytes.len())
            .expect("small")
            .to_be_bytes()
            .to_vec();
        framed.extend_from_slice(&bytes);
        framed
    }

    async fn asks(stream: &mut TcpStream) -> std::io::Result<ResponseCode> {
        stream.write_all(&framed_status_query()).await?;
        let mut length = [0u8; 2];
        stream.read_exact(&mut length).await?;
        let mut answer = vec![0u8; usize::from(u16::from_be_bytes(length))];
        stream.read_exact(&mut answer).await?;
        Ok(Message::from_vec(&answer)
            .expect("parses")
            .metadata
            .response_code)
    }

    /// Whether the gateway closed `stream` without a word.
    async fn closed_at_once(stream: &mut TcpStream) -> bool {
        let mut byte = [0u8; 1];
        matches!(
            tokio::time::timeout(Duration::from_secs(10), stream.read(&mut byte)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    #[tokio::test]
    async fn one_client_gets_its_share_of_connections_and_no_more() {
        let gateway = Arc::new(DnsGateway::new(Ipv4Addr::new(10, 64, 0, 1), &[]));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let address = listener.local_addr().expect("address");
        gateway.serve_listener(listener);
        let mut admitted = Vec::new();
        for _ in 0..TCP_PER_SOURCE {
            let mut stream = TcpStream::connect(address).await.expect("connects");
            // Answered: the connection was admitted and is being served.
            assert_eq!(
                asks(&mut stream).await.expect("answered"),
                ResponseCode::NotImp
            );
            admitted.push(stream);
        }
        let mut over = TcpStream::connect(address).await.expect("connects");
        assert!(
            closed_at_once(&mut over).await,
            "a connection over the cap is closed"
        );
        assert_eq!(gateway.counters.dropped.load(Ordering::Relaxed), 1);
        // Those admitted are still served.
        for stream in &mut admitted {
            assert_eq!(asks(stream).await.expect("answered"), ResponseCode::NotImp);
        }
        // One closes: its place is free again.
        drop(admitted.pop());
        let mut again = None;
        for _ in 0..100 {
            let mut stream = TcpStream::connect(address).await.expect("connects");
            if let Ok(code) = asks(&mut stream).await {
                assert_eq!(code, ResponseCode::NotImp);
                again = Some(stream);
                break;
            }
            // The gateway had not seen the close yet.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(again.is_some(), "a freed place is given again");
        gateway.drain(Duration::from_secs(5)).await;
    }

    #[tokio::test]
    async fn connections_the_descriptor_budget_has_no_room_for_are_closed() {
        // A budget whose limit is what is open already: no room at all.
        let fds = Arc::new(crate::conn::fd_budget::FdBudget::new(3));
        let gateway = Arc::new(DnsGateway::new(Ipv4Addr::new(10, 64, 0, 1), &[]));
        gateway.count_in(fds);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let address = listener.local_addr().expect("address");
        gateway.serve_listener(listener);
        let mut stream = TcpStream::connect(address).await.expect("connects");
        assert!(closed_at_once(&mut stream).await);
        assert_eq!(gateway.counters.dropped.load(Ordering::Relaxed), 1);
        gateway.drain(Duration::from_secs(5)).await;
    }

    #[tokio::test]
    async fn admitted_connections_count_in_the_descriptor_budget() {
        let fds = Arc::new(crate::conn::fd_budget::FdBudget::new(1_000_000));
        let gateway = Arc::new(DnsGateway::new(Ipv4Addr::new(10, 64, 0, 1), &[]));
        gateway.count_in(fds.clone());
        let admitted = gateway.admit(IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert!(admitted.is_some());
        assert_eq!(fds.held(), 1);
        drop(admitted);
        assert_eq!(fds.held(), 0);
        assert!(gateway.tcp.0.is_empty());
    }
}
