//! The DNS gateway for WireGuard clients (docs/WIREGUARD.md, "DNS"): client
//! configs carry `DNS = <the node's tunnel address>`, and the queries sent
//! there (UDP port 53) never reach the kernel. The packet path hands each one
//! here; it is resolved with hickory against the host's resolvers
//! (`/etc/resolv.conf`) or `wireguard.dns_upstreams`, and the answer goes back
//! to the client as an inner packet, like anything read from the TUN device.
//!
//! Each query is stateless, so DNS needs nothing at a deploy: queries reach
//! whichever plane is active, and a draining plane finishes the ones it holds
//! (bounded) before it exits. Without this, a phone's resolver is its home or
//! carrier one, a private address the default deny refuses: "connected,
//! nothing loads".
//!
//! DNS over TCP (a client's fallback after a truncated answer) goes the
//! kernel's way: the packet path lets TCP to the node's address, port 53,
//! through the egress policy, `net setup`'s nftables table redirects it to
//! [`DNS_TCP_PORT`], and [`DnsGateway::serve_tcp`] answers there ([`tcp`]:
//! RFC 7766 framing, connections capped in all, per client and by the
//! plane's descriptor budget). Both planes of a deploy listen with
//! SO_REUSEPORT; the old one stops at its exit.
//!
//! [`respond`] and [`refuse`] are pure (bytes in, bytes out); the resolver and
//! the TCP listener are the only I/O.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use blipless_protocol::channel::Packets;
use blipless_protocol::udp::{self, Datagram};
use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolveHosts, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::net::{DnsError, NetError};
use hickory_resolver::proto::op::{Edns, Message, MessageType, OpCode, ResponseCode};
use hickory_resolver::TokioResolver;
use tokio::sync::Semaphore;
use tokio_seqpacket::UnixSeqpacket;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use blipless_ctl::net::DNS_TCP_PORT;

use crate::conn::fd_budget::FdBudget;

mod tcp;

/// The port queries are answered on.
pub const DNS_PORT: u16 = 53;
/// Queries resolved at once; more are dropped (the client's resolver retries).
const IN_FLIGHT: usize = 512;
/// Of those, UDP queries from one client address at once: a client asking
/// for many slow names cannot take every slot from the others.
const IN_FLIGHT_PER_CLIENT: usize = 32;
/// The largest answer sent over UDP when the query states no EDNS size.
const CLASSIC_UDP: usize = 512;
/// The EDNS payload size this gateway announces and honours at most (the
/// DNS flag day 2020 figure: no fragmentation on common paths).
const EDNS_PAYLOAD: u16 = 1232;
/// How long a draining plane waits for the queries it is resolving.
pub const DRAIN_WAIT: Duration = Duration::from_secs(2);

/// How an answer travels, which bounds its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    Udp,
    Tcp,
}

/// What the gateway did so far.
#[derive(Debug, Default)]
pub struct DnsCounters {
    /// Queries answered (with records, NXDOMAIN or an error code).
    pub answered: AtomicU64,
    /// Queries dropped (unreadable, a response, or too many in flight), and
    /// TCP connections closed unserved (over a cap, or no descriptor room).
    pub dropped: AtomicU64,
}

/// Answers WireGuard clients' DNS queries to the node's tunnel address.
pub struct DnsGateway {
    address: Ipv4Addr,
    /// The node's IPv6 tunnel address, with `wireguard.pool6`.
    address6: Option<Ipv6Addr>,
    /// `None`: no resolver could be made; every lookup is SERVFAIL.
    resolver: Option<TokioResolver>,
    slots: Arc<Semaphore>,
    /// UDP queries under way per client address.
    per_client: Arc<Mutex<HashMap<IpAddr, usize>>>,
    tasks: TaskTracker,
    /// Stops the TCP listener.
    stop: CancellationToken,
    /// The TCP connections open now.
    tcp: tcp::TcpConnections,
    /// The plane's descriptor budget, which TCP connections count in
    /// ([`Self::count_in`]).
    fds: std::sync::OnceLock<Arc<FdBudget>>,
    /// What the gateway did so far (shared with the plane's reports).
    pub counters: Arc<DnsCounters>,
}

impl std::fmt::Debug for DnsGateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DnsGateway")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

impl DnsGateway {
    /// The gateway on `address` (the node's tunnel address), resolving
    /// through `upstreams`, or the host's resolvers when there are none.
    /// When no resolver can be made (the host's configuration unreadable),
    /// every query is answered SERVFAIL and the reason is logged once, here.
    pub fn new(address: Ipv4Addr, upstreams: &[SocketAddr]) -> Self {
        let provider = TokioRuntimeProvider::default();
        let builder = if upstreams.is_empty() {
            TokioResolver::builder(provider).map_err(|error| {
                format!("cannot read the host's resolver configuration (/etc/resolv.conf): {error}")
            })
        } else {
            let servers = upstreams
                .iter()
                .map(|upstream| {
                    let mut over_udp = ConnectionConfig::udp();
                    over_udp.port = upstream.port();
                    let mut over_tcp = ConnectionConfig::tcp();
                    over_tcp.port = upstream.port();
                    NameServerConfig::new(upstream.ip(), true, vec![over_udp, over_tcp])
                })
                .collect();
            Ok(TokioResolver::builder_with_config(
                ResolverConfig::from_parts(None, Vec::new(), servers),
                provider,
            ))
        };
        let resolver = builder.and_then(|mut builder| {
            // The host's /etc/hosts names the node's own machines: not for
            // customers (hickory reads it by default).
            builder.options_mut().use_hosts_file = ResolveHosts::Never;
            builder
                .build()
                .map_err(|error| format!("the resolver could not be built: {error}"))
        });
        let resolver = match resolver {
            Ok(resolver) => Some(resolver),
            Err(why) => {
                tracing::warn!(
                    "DNS gateway: {why}; queries get SERVFAIL (set wireguard.dns_upstreams)"
                );
                None
            }
        };
        Self {
            address,
            address6: None,
            resolver,
            slots: Arc::new(Semaphore::new(IN_FLIGHT)),
            per_client: Arc::default(),
            tasks: TaskTracker::new(),
            stop: CancellationToken::new(),
            tcp: tcp::TcpConnections::default(),
            fds: std::sync::OnceLock::new(),
            counters: Arc::default(),
        }
    }

    /// Counts the TCP connections from now on in `fds`, the plane's
    /// descriptor budget (and refuses them when it has no room). Set once;
    /// a second budget is ignored.
    pub fn count_in(&self, fds: Arc<FdBudget>) {
        let _ = self.fds.set(fds);
    }

    /// The same gateway answering at the node's IPv6 tunnel address too.
    pub fn with_address6(mut self, address6: Option<Ipv6Addr>) -> Self {
        self.address6 = address6;
        self
    }

    /// Whether `address` is one of the gateway's.
    fn is_gateway(&self, address: IpAddr) -> bool {
        address == IpAddr::V4(self.address) || self.address6.map(IpAddr::V6) == Some(address)
    }

    /// Whether `packet` is TCP to this gateway's DNS port: the packet path
    /// writes it to the TUN device whatever the egress policy says.
    pub fn carries_tcp_query(&self, packet: &[u8]) -> bool {
        blipless_protocol::ip::destination(packet).is_some_and(|to| self.is_gateway(to))
            && blipless_protocol::ip::tcp_destination_port(packet) == Some(DNS_PORT)
    }

    /// The query `packet` carries, if it is one for this gateway.
    pub fn query<'a>(&self, packet: &'a [u8]) -> Option<Datagram<'a>> {
        udp::datagram(packet)
            .filter(|d| self.is_gateway(d.destination) && d.destination_port == DNS_PORT)
    }

    /// Answers `query` (from [`Self::query`]) in the background, sending the
    /// answer packet on `channel` as it stands then, if `admit_answer` lets
    /// through an answer packet of that size (the client's download limits:
    /// it counts the packet, or refuses it and counts that).
    pub fn answer(
        self: &Arc<Self>,
        query: &Datagram<'_>,
        channel: Arc<Mutex<Option<Arc<UnixSeqpacket>>>>,
        admit_answer: impl FnOnce(usize) -> bool + Send + 'static,
    ) {
        let Some(client_slot) = ClientSlot::take(&self.per_client, query.source) else {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let Ok(slot) = self.slots.clone().try_acquire_owned() else {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        // Answered from the address it was asked at (IPv4 or IPv6).
        let (client, client_port, asked, payload) = (
            query.source,
            query.source_port,
            query.destination,
            query.payload.to_vec(),
        );
        let gateway = self.clone();
        self.tasks.spawn(async move {
            let _slots = (slot, client_slot);
            let Some(answer) = gateway.resolve(&payload, Transport::Udp).await else {
                gateway.counters.dropped.fetch_add(1, Ordering::Relaxed);
                return;
            };
            let Some(packet) = udp::build(&Datagram {
                source: asked,
                destination: client,
                source_port: DNS_PORT,
                destination_port: client_port,
                payload: &answer,
            }) else {
                gateway.counters.dropped.fetch_add(1, Ordering::Relaxed);
                return;
            };
            if !admit_answer(packet.len()) {
                return;
            }
            let socket = channel
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
            let mut batch = Packets::new(0);
            let sent = match socket {
                Some(socket) if batch.try_push(&packet) => blipless_link::send(
                    &socket,
                    &blipless_protocol::channel::ToIngress::Packets(batch),
                    &[],
                )
                .await
                .is_ok(),
                _ => false,
            };
            let counter = if sent {
                &gateway.counters.answered
            } else {
                &gateway.counters.dropped
            };
            counter.fetch_add(1, Ordering::Relaxed);
        });
    }

    /// The answer to the query bytes `payload`, or `None` when nothing is
    /// to be sent back.
    async fn resolve(&self, payload: &[u8], transport: Transport) -> Option<Vec<u8>> {
        let request = match Message::from_vec(payload) {
            Ok(request) => request,
            Err(_) => return refuse(payload, ResponseCode::FormErr),
        };
        if request.metadata.message_type != MessageType::Query {
            // Never answer an answer: that is how loops start.
            return None;
        }
        if request.metadata.op_code != OpCode::Query {
            return respond(&request, Outcome::Code(ResponseCode::NotImp), transport);
        }
        let [question] = request.queries.as_slice() else {
            return respond(&request, Outcome::Code(ResponseCode::FormErr), transport);
        };
        let Some(resolver) = &self.resolver else {
            return respond(&request, Outcome::Code(ResponseCode::ServFail), transport);
        };
        let outcome = match resolver
            .lookup(question.name().clone(), question.query_type())
            .await
        {
            Ok(lookup) => Outcome::Records(lookup.answers().to_vec()),
            Err(NetError::Dns(DnsError::NoRecordsFound(none))) => Outcome::Code(none.response_code),
            Err(error) => {
                tracing::debug!(%error, name = %question.name(), "DNS gateway: lookup failed");
                Outcome::Code(ResponseCode::ServFail)
            }
        };
        respond(&request, outcome, transport)
    }

    /// Stops listening on TCP and waits (at most `wait`) for the queries
    /// being resolved to be answered.
    pub async fn drain(&self, wait: Duration) {
        self.stop.cancel();
        self.tasks.close();
        let _ = tokio::time::timeout(wait, self.tasks.wait()).await;
    }
}

/// One of a client address's [`IN_FLIGHT_PER_CLIENT`] UDP query places,
/// given back on drop.
struct ClientSlot {
    counts: Arc<Mutex<HashMap<IpAddr, usize>>>,
    client: IpAddr,
}

impl ClientSlot {
    /// A place for `client`, or `None` when it has every one.
    fn take(counts: &Arc<Mutex<HashMap<IpAddr, usize>>>, client: IpAddr) -> Option<Self> {
        let mut held = counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let count = held.entry(client).or_default();
        if *count >= IN_FLIGHT_PER_CLIENT {
            return None;
        }
        *count += 1;
        Some(Self {
            counts: counts.clone(),
            client,
        })
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut held = self
            .counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(count) = held.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.client);
            }
        }
    }
}

/// What a lookup came to.
#[derive(Debug)]
enum Outcome {
    /// These records answer the question.
    Records(Vec<hickory_resolver::proto::rr::Record>),
    /// No records: this code (NOERROR for an empty answer, NXDOMAIN...).
    Code(ResponseCode),
}

/// The response to `request`: its question, the outcome, EDNS when the
/// query had it; over UDP truncated (TC set, no records) when it would not
/// fit the size the client can take.
fn respond(request: &Message, outcome: Outcome, transport: Transport) -> Option<Vec<u8>> {
    let mut response = Message::response(request.metadata.id, request.metadata.op_code);
    response.metadata.recursion_desired = request.metadata.recursion_desired;
    response.metadata.recursion_available = true;
    response.add_queries(request.queries.iter().cloned());
    match outcome {
        Outcome::Records(records) => {
            response.add_answers(records);
        }
        Outcome::Code(code) => response.metadata.response_code = code,
    }
    let limit = match &request.edns {
        Some(edns) => {
            let mut ours = Edns::new();
            ours.set_max_payload(EDNS_PAYLOAD);
            response.set_edns(ours);
            usize::from(edns.max_payload().clamp(512, EDNS_PAYLOAD))
        }
        None => CLASSIC_UDP,
    };
    let limit = match transport {
        Transport::Udp => limit,
        Transport::Tcp => usize::from(u16::MAX),
    };
    let bytes = response.to_vec().ok()?;
    if bytes.len() <= limit {
        return Some(bytes);
    }
    response.truncate().to_vec().ok()
}

/// An error response to query bytes that did not parse: the header's id
/// with QR set and `code`, no sections; `None` when even the header is
/// missing or the bytes were a response.
fn refuse(payload: &[u8], code: ResponseCode) -> Option<Vec<u8>> {
    let header: [u8; 12] = payload.get(..12)?.try_into().ok()?;
    if header[2] & 0x80 != 0 {
        return None;
    }
    let id = u16::from_be_bytes([header[0], header[1]]);
    let opcode = OpCode::from_u8((header[2] >> 3) & 0x0f);
    let mut response = Message::error_msg(id, opcode, code);
    response.metadata.recursion_desired = header[2] & 0x01 != 0;
    response.metadata.recursion_available = true;
    response.to_vec().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_resolver::proto::op::Query;
    use hickory_resolver::proto::rr::{Name, RData, Record, RecordType};

    #[test]
    fn one_client_holds_at_most_its_share_of_the_lookups() {
        let counts = Arc::default();
        let (busy, other): (IpAddr, IpAddr) = (
            "10.64.0.2".parse().expect("address"),
            "10.64.0.3".parse().expect("address"),
        );
        let mut held: Vec<ClientSlot> = (0..IN_FLIGHT_PER_CLIENT)
            .map(|_| ClientSlot::take(&counts, busy).expect("within the share"))
            .collect();
        assert!(ClientSlot::take(&counts, busy).is_none(), "over its share");
        let theirs = ClientSlot::take(&counts, other).expect("another client is not held up");
        drop(held.pop());
        assert!(
            ClientSlot::take(&counts, busy).is_some(),
            "a place given back"
        );
        drop((held, theirs));
        assert!(
            counts.lock().expect("lock").is_empty(),
            "nothing kept for idle clients"
        );
    }

    fn query(name: &str, edns: Option<u16>) -> Message {
        let mut message = Message::query();
        message.metadata.id = 0x1234;
        message.metadata.recursion_desired = true;
        message.add_query(Query::query(
            Name::from_ascii(name).expect("name"),
            RecordType::A,
        ));
        if let Some(size) = edns {
            let mut e = Edns::new();
            e.set_max_payload(size);
            message.set_edns(e);
        }
        message
    }

    fn a(name: &str, octets: [u8; 4]) -> Record {
        Record::from_rdata(
            Name::from_ascii(name).expect("name"),
            300,
            RData::A(Ipv4Addr::from(octets).into()),
        )
    }

    #[test]
    fn an_answer_carries_the_question_the_records_and_the_id() {
        let request = query("shop.example.", None);
        let bytes = respond(
            &request,
            Outcome::Records(vec![a("shop.example.", [192, 0, 2, 7])]),
            Transport::Udp,
        )
        .expect("an answer");
        let answer = Message::from_vec(&bytes).expect("parses");
        assert_eq!(answer.metadata.id, 0x1234);
        assert_eq!(answer.metadata.message_type, MessageType::Response);
        assert!(answer.metadata.recursion_desired && answer.metadata.recursion_available);
        assert_eq!(answer.queries, request.queries);
        assert_eq!(answer.answers.len(), 1);
        assert_eq!(answer.metadata.response_code, ResponseCode::NoError);
        assert!(answer.edns.is_none(), "no EDNS in, none out");
    }

    #[test]
    fn no_such_name_is_nxdomain() {
        let bytes = respond(
            &query("nope.example.", Some(4096)),
            Outcome::Code(ResponseCode::NXDomain),
            Transport::Udp,
        )
        .expect("an answer");
        let answer = Message::from_vec(&bytes).expect("parses");
        assert_eq!(answer.metadata.response_code, ResponseCode::NXDomain);
        assert!(answer.answers.is_empty());
        assert_eq!(
            answer.edns.expect("EDNS echoed").max_payload(),
            EDNS_PAYLOAD
        );
    }

    #[test]
    fn an_answer_too_big_for_the_client_is_truncated() {
        let records: Vec<Record> = (0..60u8)
            .map(|i| a("many.example.", [198, 51, 100, i]))
            .collect();
        let small = respond(
            &query("many.example.", None),
            Outcome::Records(records.clone()),
            Transport::Udp,
        )
        .expect("an answer");
        assert!(small.len() <= CLASSIC_UDP);
        let small = Message::from_vec(&small).expect("parses");
        assert!(small.metadata.truncation && small.answers.is_empty());
        // With EDNS 1232 the same answer fits whole.
        let big = respond(
            &query("many.example.", Some(4096)),
            Outcome::Records(records.clone()),
            Transport::Udp,
        )
        .expect("an answer");
        let big = Message::from_vec(&big).expect("parses");
        assert!(!big.metadata.truncation);
        assert_eq!(big.answers.len(), 60);
        // Over TCP nothing is truncated, EDNS or not.
        let tcp = respond(
            &query("many.example.", None),
            Outcome::Records(records),
            Transport::Tcp,
        )
        .expect("an answer");
        let tcp = Message::from_vec(&tcp).expect("parses");
        assert!(!tcp.metadata.truncation);
        assert_eq!(tcp.answers.len(), 60);
    }

    #[test]
    fn garbage_gets_formerr_when_it_has_a_header_and_nothing_otherwise() {
        let mut bytes = query("x.example.", None).to_vec().expect("encodes");
        bytes.truncate(15); // a header and a cut question
        let answer = Message::from_vec(&refuse(&bytes, ResponseCode::FormErr).expect("FORMERR"))
            .expect("parses");
        assert_eq!(answer.metadata.id, 0x1234);
        assert_eq!(answer.metadata.response_code, ResponseCode::FormErr);
        assert_eq!(refuse(&bytes[..11], ResponseCode::FormErr), None);
        // A response is never answered.
        let mut response = bytes;
        response[2] |= 0x80;
        assert_eq!(refuse(&response, ResponseCode::FormErr), None);
    }

    #[tokio::test]
    async fn the_gateway_answers_what_it_can_without_a_resolver() {
        // No upstream at all: a query that needs one gets SERVFAIL-free
        // handling only for what is decided before the lookup.
        let gateway = DnsGateway::new(Ipv4Addr::new(10, 64, 0, 1), &[]);
        let mut not_query = query("x.example.", None);
        not_query.metadata.op_code = OpCode::Status;
        let answer = gateway
            .resolve(&not_query.to_vec().expect("encodes"), Transport::Udp)
            .await
            .expect("an answer");
        assert_eq!(
            Message::from_vec(&answer)
                .expect("parses")
                .metadata
                .response_code,
            ResponseCode::NotImp
        );
        let mut two = query("x.example.", None);
        two.add_query(Query::query(
            Name::from_ascii("y.example.").expect("name"),
            RecordType::A,
        ));
        let answer = gateway
            .resolve(&two.to_vec().expect("encodes"), Transport::Udp)
            .await
            .expect("an answer");
        assert_eq!(
            Message::from_vec(&answer)
                .expect("parses")
                .metadata
                .response_code,
            ResponseCode::FormErr
        );
        let mut reply = query("x.example.", None);
        reply.metadata.message_type = MessageType::Response;
        assert_eq!(
            gateway
                .resolve(&reply.to_vec().expect("encodes"), Transport::Udp)
                .await,
            None
        );
    }

    #[test]
    fn only_queries_to_the_gateway_are_taken() {
        let gateway_address = Ipv4Addr::new(10, 64, 0, 1);
        let gateway6: Ipv6Addr = "fd64::1".parse().expect("address");
        let packet = |destination: IpAddr, port| {
            let source: IpAddr = if destination.is_ipv4() {
                Ipv4Addr::new(10, 64, 0, 2).into()
            } else {
                "fd64::2".parse().expect("address")
            };
            udp::build(&Datagram {
                source,
                destination,
                source_port: 5353,
                destination_port: port,
                payload: b"q",
            })
            .expect("fits")
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let gateway = rt.block_on(async {
            DnsGateway::new(gateway_address, &[]).with_address6(Some(gateway6))
        });
        assert!(gateway.query(&packet(gateway_address.into(), 53)).is_some());
        assert!(gateway.query(&packet(gateway_address.into(), 54)).is_none());
        assert!(gateway
            .query(&packet(Ipv4Addr::new(1, 1, 1, 1).into(), 53))
            .is_none());
        assert!(gateway.query(&packet(gateway6.into(), 53)).is_some());
        assert!(gateway
            .query(&packet("fd64::9".parse().expect("address"), 53))
            .is_none());
    }
}
