//! SOCKS5 UDP ASSOCIATE (RFC 1928 §7): an authenticated customer gets a
//! relay address; datagrams it sends there (each behind the SOCKS5 UDP
//! header, `blipless_protocol::socks5::udp`) leave from an egress socket of
//! this node, and what comes back to that socket is returned to it behind a
//! header naming the sender (docs/ARCHITECTURE.md, "UDP associations").
//!
//! An association is three fds: the TCP control connection, the
//! customer-facing relay socket (bound to the address the customer reached,
//! a fresh port) and the egress socket. Datagrams between them are never
//! held here across an await that a handover can interrupt: each is read,
//! judged and sent before the next select. So at a deploy the three fds
//! move to the successor with every datagram the kernel had queued for
//! them still in their receive queues ([`MigrateKind::SocksUdp`]).
//!
//! Policy: a customer's datagrams are taken only from the control
//! connection's address, from any port (a NAT gives the UDP flow a port of
//! its own, unlike the one a client names in its request); answers go to
//! the port of the first datagram that passed every check, and move to
//! another port only after that one has been silent for [`PORT_MOVE_QUIET`]
//! (a NAT that rebinds an idle flow), so another host behind the same
//! address cannot take the customer's answers with one datagram;
//! every destination must be permitted by the egress policy, and so must
//! the sender of every datagram that comes back. Fragments (FRAG ≠ 0) and
//! datagrams with a bad header are dropped and counted. UDP leaves directly
//! from the node, from the client's sticky source address; a client whose
//! egress policy names upstreams or tags, or whose policy is `any` on a node
//! with upstreams (where `any` never means direct), is refused (reply 2).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use blipless_protocol::channel::{Direction, Migrate, MigrateKind, UdpAssociation, UdpCounts};
use blipless_protocol::socks5::udp::{encode_udp_header, parse_udp_datagram};
use blipless_protocol::socks5::{self, Destination, Reply};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, UdpSocket};
use tokio::time::Instant;

use super::caps::{TunnelCount, UdpAssociationCount};
use super::context::Context;
use crate::clients::Client;
use crate::egress::{canonical, canonical_addr};

/// Room before a returned datagram's payload for its header (IPv6 source).
const HEADER_ROOM: usize = 22;
/// Largest UDP payload.
const MAX_DATAGRAM: usize = 65_535;
/// What a datagram costs against the client's rate beyond its payload: the
/// IPv4 and UDP headers it is sent with (20 + 8 bytes), as a WireGuard
/// client's inner packet counts them. Without it empty datagrams passed any
/// rate. Usage and quota count the payload (docs/LIMITS.md).
const UDP_OVERHEAD: usize = 28;
/// Names an association remembers the addresses of, and for how long.
const NAME_CACHE: usize = 64;
const NAME_TTL: Duration = Duration::from_secs(60);
/// The most addresses kept of one name's answer, per family (the first
/// permitted ones).
const NAME_ADDRESSES: usize = 8;
/// Datagrams taken from one socket before the other gets a turn.
const BATCH: usize = 32;
/// Limit on resolving a destination name.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a name that does not resolve is remembered as such (a lookup
/// that timed out is not remembered at all).
const NO_SUCH_NAME_TTL: Duration = Duration::from_secs(5);
/// How long the customer's port must be silent before its answers may move
/// to another port of its address.
pub const PORT_MOVE_QUIET: Duration = Duration::from_secs(5);
/// TCP keepalive on the control connection: probes after this much
/// silence, every [`KEEPALIVE_INTERVAL`], [`KEEPALIVE_PROBES`] of them. A
/// customer that vanished (no FIN: a sleeping laptop, a NAT that dropped
/// the flow) ends its association within about 90 s, even while the far
/// side keeps sending to it.
const KEEPALIVE_IDLE: u32 = 60;
const KEEPALIVE_INTERVAL: u32 = 10;
const KEEPALIVE_PROBES: u32 = 3;

/// Datagrams the SOCKS5 UDP relays dropped since the plane started, by
/// reason, and associations opened.
#[derive(Debug, Default)]
pub struct Counters {
    /// Associations opened here (adopted ones not counted).
    pub opened: AtomicU64,
    /// FRAG ≠ 0.
    pub fragments: AtomicU64,
    /// A header that does not parse.
    pub bad_header: AtomicU64,
    /// A destination (or a returning sender) the egress policy refuses, or
    /// a name that does not resolve to a permitted address.
    pub denied: AtomicU64,
    /// Sent to the relay from an address other than the customer's, or
    /// from another port of it while the customer's port is in use.
    pub foreign: AtomicU64,
    /// Over the client's rate limit.
    pub rate_limited: AtomicU64,
    /// Refused by the kernel's send, either way (a destination port 0, an
    /// unreachable network, a firewall's reject).
    pub send_failed: AtomicU64,
    /// UDP ASSOCIATE requests refused at the client's association cap.
    pub refused_at_cap: AtomicU64,
}

impl Counters {
    /// The counts now, for the plane's report.
    pub fn counts(&self) -> UdpCounts {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        UdpCounts {
            opened: load(&self.opened),
            fragment: load(&self.fragments),
            bad_header: load(&self.bad_header),
            denied: load(&self.denied),
            foreign: load(&self.foreign),
            rate_limited: load(&self.rate_limited),
            send_failed: load(&self.send_failed),
            refused_at_cap: load(&self.refused_at_cap),
        }
    }
}

/// Serves a UDP ASSOCIATE request from an authenticated `client` on its
/// control connection `control`: refuses it with the protocol's reply, or
/// answers with the relay address and relays until the association ends.
pub async fn serve(
    mut control: TcpStream,
    context: Arc<Context>,
    id: u64,
    client: Arc<Client>,
    requested: Destination,
) {
    let name = client.record.name.clone();
    let failure = |reply: Reply| socks5::encode_reply(reply, None);
    let policy = client.record.egress.clone();
    if !context.egress.routes.leaves_directly(&policy) {
        tracing::info!(id, client = %name, %policy, "udp associate refused: UDP leaves only directly");
        super::socks::refuse(control, &failure(Reply::NotAllowed)).await;
        return;
    }
    let counted = match context.caps.check_tunnel(&client) {
        Ok(counted) => counted,
        Err(refusal) => {
            tracing::debug!(id, client = %name, ?refusal, "udp associate refused: the client's limits");
            super::socks::refuse(control, &failure(Reply::NotAllowed)).await;
            return;
        }
    };
    // Each association holds two of the host's UDP ports: one client must
    // not take them all (limits.udp_associations_per_client).
    let Some(udp_counted) = context.caps.check_udp_association(&client.meter) else {
        drop(counted);
        context
            .udp_counters
            .refused_at_cap
            .fetch_add(1, Ordering::Relaxed);
        tracing::debug!(id, client = %name, cap = context.caps.udp_associations_per_client, "udp associate refused: the client's association cap");
        super::socks::refuse(control, &failure(Reply::NotAllowed)).await;
        return;
    };
    let sockets = open_sockets(&control, &context, &name).await;
    let (relay, egress) = match sockets {
        Ok(sockets) => sockets,
        Err(error) => {
            tracing::warn!(id, client = %name, %error, "udp associate failed: no sockets");
            // Out of sockets: this connection is not held on to.
            drop((counted, udp_counted));
            let _ = control.write_all(&failure(Reply::GeneralFailure)).await;
            let _ = control.shutdown().await;
            return;
        }
    };
    let bound = relay.local_addr().ok();
    let named = bound.map(|bound| relay_as_named(bound, context.udp_public_address));
    if control
        .write_all(&socks5::encode_reply(Reply::Succeeded, named))
        .await
        .is_err()
    {
        return;
    }
    context.udp_counters.opened.fetch_add(1, Ordering::Relaxed);
    client.meter.connections.fetch_add(1, Ordering::Relaxed);
    // The port the customer named (PySocks names its own, with the host
    // "0") is kept, not trusted: a NAT gives the flow another, and answers
    // go only where a datagram that passed came from (`Relay::up`). Nothing
    // comes back before the customer's first datagram anyway: no one knows
    // the egress socket yet.
    let announced_port = match requested {
        Destination::Ip(address) => address.port(),
        Destination::Domain { port, .. } => port,
    };
    let customer = None;
    tracing::debug!(id, client = %name, relay = ?bound, "udp association open");
    let association = Association {
        control,
        relay,
        egress,
        state: UdpAssociation {
            customer,
            announced_port,
        },
    };
    run(
        context,
        id,
        client,
        association,
        true,
        Some((counted, udp_counted)),
    )
    .await;
}

/// The relay's address as a UDP ASSOCIATE reply names it: `bound`, or
/// behind a 1:1 NAT the public address of its family (`public`) with
/// `bound`'s port, which the NAT maps to it.
fn relay_as_named(bound: SocketAddr, public: Option<IpAddr>) -> SocketAddr {
    match public {
        Some(public) if public.is_ipv4() == canonical(bound.ip()).is_ipv4() => {
            SocketAddr::new(public, bound.port())
        }
        _ => bound,
    }
}

/// The relay socket on the address the customer reached (a fresh port),
/// and the egress socket from the client's source address.
async fn open_sockets(
    control: &TcpStream,
    context: &Context,
    client: &str,
) -> std::io::Result<(UdpSocket, UdpSocket)> {
    let reached = canonical(control.local_addr()?.ip());
    let relay = UdpSocket::bind(SocketAddr::new(reached, 0)).await?;
    context.identities.touch(client);
    // Nothing is opened for a client removed meanwhile: no identity is
    // saved for it.
    let source = || async {
        match context
            .identities
            .open_known(&context.directory, client)
            .await
        {
            Some((held, _)) => Ok(held.identity.source),
            None => Err(std::io::Error::other(format!(
                "client {client} was removed"
            ))),
        }
    };
    let first = source().await?;
    let egress = match egress_socket(first).await {
        // The source address is no longer the host's: the identity is
        // evicted and the socket opened once more from a new one, as a TCP
        // connect does (`Context::connect_direct`).
        Err(error) if error.kind() == std::io::ErrorKind::AddrNotAvailable => {
            tracing::warn!(client, %error, "egress identity unusable; evicting it");
            match first {
                Some(unusable) => context.identities.source_unusable(client, unusable).await,
                None => context.identities.evict(client).await,
            }
            egress_socket(source().await?).await?
        }
        other => other?,
    };
    Ok((relay, egress))
}

/// The egress socket: from `source`, or both families from one unbound
/// socket where the host has IPv6.
async fn egress_socket(source: Option<IpAddr>) -> std::io::Result<UdpSocket> {
    match source {
        Some(source) => UdpSocket::bind(SocketAddr::new(source, 0)).await,
        None => match dual_stack_socket() {
            Ok(socket) => Ok(socket),
            Err(_) => UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).await,
        },
    }
}

/// An unbound `[::]` socket that reaches IPv4 too (through mapped
/// addresses): `IPV6_V6ONLY` is turned off before the bind, whatever the
/// namespace's `net.ipv6.bindv6only` says. Left to that default, a host
/// where it is 1 made every IPv4 destination fail to send, silently.
fn dual_stack_socket() -> std::io::Result<UdpSocket> {
    use nix::sys::socket::{
        bind, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType, SockaddrIn6,
    };
    let fd = socket(
        AddressFamily::Inet6,
        SockType::Datagram,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    setsockopt(&fd, sockopt::Ipv6V6Only, &false)?;
    let any = std::net::SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, 0, 0, 0);
    bind(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &SockaddrIn6::from(any),
    )?;
    UdpSocket::from_std(std::net::UdpSocket::from(fd))
}

/// An association's sockets and state.
#[derive(Debug)]
pub struct Association {
    control: TcpStream,
    relay: UdpSocket,
    egress: UdpSocket,
    state: UdpAssociation,
}

impl Association {
    /// An association a predecessor handed over: the control connection,
    /// the relay socket and the egress socket, in that order.
    pub fn adopted(
        control: TcpStream,
        relay: OwnedFd,
        egress: OwnedFd,
        state: UdpAssociation,
    ) -> std::io::Result<Self> {
        Ok(Self {
            control,
            relay: udp_from_fd(relay)?,
            egress: udp_from_fd(egress)?,
            state,
        })
    }
}

fn udp_from_fd(fd: OwnedFd) -> std::io::Result<UdpSocket> {
    let socket = std::net::UdpSocket::from(fd);
    socket.set_nonblocking(true)?;
    UdpSocket::from_std(socket)
}

/// How relaying stopped.
enum End {
    /// The control connection closed, the association idled out, or it was cut.
    Closed(&'static str),
    /// A successor takes it: the slot to hold while handing it over.
    Handover(tokio::sync::OwnedSemaphorePermit),
}

/// Relays `association` until it ends or is handed to the successor (in
/// this handover only if `may_hand_over`, [`Context::handover_slot_when`]).
/// `counted`: the counts its admission took (as a tunnel, as an
/// association); None for an adopted association, counted here (never
/// refused).
pub async fn run(
    context: Arc<Context>,
    id: u64,
    client: Arc<Client>,
    mut association: Association,
    mut may_hand_over: bool,
    counted: Option<(TunnelCount, UdpAssociationCount)>,
) {
    let name = client.record.name.clone();
    // An adopted association is held to this plane's configuration, as a
    // new one is at its request (`serve`): a deploy that adds the node's
    // first upstream makes `any` no longer mean direct, and UDP leaves only
    // directly. The customer sees its control connection close and may
    // associate again (and be refused).
    if counted.is_none() && !context.egress.routes.leaves_directly(&client.record.egress) {
        tracing::info!(id, client = %name, policy = %client.record.egress, "adopted udp association closed: this client's UDP no longer leaves directly");
        return;
    }
    let _counted = counted.unwrap_or_else(|| {
        (
            TunnelCount::new(client.meter.clone()),
            UdpAssociationCount::new(client.meter.clone()),
        )
    });
    let Ok(control_peer) = association.control.peer_addr() else {
        return;
    };
    keep_alive(&association.control);
    let mut relay = Relay {
        context: &context,
        client: &client,
        customer_ip: canonical(control_peer.ip()),
        names: HashMap::new(),
        // An adopted association's port counts as just heard from: a move
        // right after a deploy waits as any other does. (A predecessor
        // before this change put the request's port there unconfirmed; a
        // NAT'd customer that had sent nothing before the deploy then waits
        // 5 s, once.)
        customer_heard: Instant::now(),
        last_relayed: Instant::now(),
        looked_up: false,
        buffer: vec![0u8; HEADER_ROOM + MAX_DATAGRAM],
    };
    loop {
        let end = relay.relay(&mut association, may_hand_over).await;
        let slot = match end {
            End::Closed(why) => {
                tracing::debug!(id, client = %name, why, "udp association closed");
                return;
            }
            End::Handover(slot) => slot,
        };
        if !context.channel_passes_udp.load(Ordering::Relaxed) {
            tracing::info!(id, client = %name, "udp association closed at the deploy: the ingress cannot pass it on");
            return;
        }
        let migrate = Migrate {
            kind: MigrateKind::SocksUdp,
            connection_id: id,
            client: name.clone(),
            up: Direction::default(),
            down: Direction::default(),
            up_piped: 0,
            down_piped: 0,
            bytes_up: 0,
            bytes_down: 0,
            udp: Some(association.state),
        };
        let fds = [
            association.control.as_fd(),
            association.relay.as_fd(),
            association.egress.as_fd(),
        ];
        let handed = context.hand_over(migrate, &fds).await;
        drop(slot);
        match handed {
            // Our copies close here; the successor holds the sockets now.
            Ok(()) => return,
            Err(not_handed) => may_hand_over = not_handed.may_hand_over_again(),
        }
    }
}

/// The relaying half of an association: what each datagram is judged by.
struct Relay<'a> {
    context: &'a Context,
    client: &'a Client,
    /// The control connection's address: customer datagrams come from it.
    customer_ip: IpAddr,
    /// Destination names resolved lately, with until when they hold.
    names: HashMap<String, (Vec<SocketAddr>, Instant)>,
    /// When the customer's current port last sent a datagram (one that
    /// passed, or any from that port once one has).
    customer_heard: Instant,
    /// When a datagram was last relayed either way: the idle timeout counts
    /// from it, across handovers that did not happen.
    last_relayed: Instant,
    /// Whether the datagram just judged needed a lookup (then the batch
    /// ends, so that a run of slow names does not keep the association
    /// from its tokens and its other socket).
    looked_up: bool,
    /// One datagram, with room before it for a header.
    buffer: Vec<u8>,
}

impl Relay<'_> {
    async fn relay(&mut self, association: &mut Association, may_hand_over: bool) -> End {
        let context = self.context;
        let handover = context.handover_slot_when(may_hand_over);
        tokio::pin!(handover);
        let cut = context.cut_token();
        let over_quota = self.client.limiter.over_quota_token();
        let timeout = context.udp_idle_timeout;
        let idle = tokio::time::sleep_until(self.last_relayed + timeout);
        tokio::pin!(idle);
        // Made once, so each token's waiter is registered once per
        // association, not at every datagram batch.
        let cut = cut.cancelled();
        let revoked = self.client.revoked.clone().cancelled_owned();
        let over_quota = over_quota.cancelled();
        tokio::pin!(cut, revoked, over_quota);
        loop {
            // Also here: a flood of dropped datagrams keeps the data arms
            // busy and would starve the idle arm.
            if self.last_relayed.elapsed() >= timeout {
                return End::Closed("idle");
            }
            tokio::select! {
                biased;
                slot = &mut handover => return End::Handover(slot),
                () = &mut cut => return End::Closed("cut"),
                () = &mut revoked => return End::Closed("client removed"),
                () = &mut over_quota => return End::Closed("over quota"),
                ready = association.control.readable() => {
                    if ready.is_err() || control_ended(&association.control) {
                        return End::Closed("control connection closed");
                    }
                }
                // Either socket ready: a batch of each, so that a busy one
                // (a bulk upload, a flood) cannot starve the other under
                // `biased`.
                ready = association.relay.readable() => {
                    if ready.is_err() {
                        return End::Closed("relay socket failed");
                    }
                    self.up_batch(association).await;
                    self.down_batch(association).await;
                }
                ready = association.egress.readable() => {
                    if ready.is_err() {
                        return End::Closed("egress socket failed");
                    }
                    self.down_batch(association).await;
                    self.up_batch(association).await;
                }
                () = &mut idle => {
                    if self.last_relayed.elapsed() >= timeout {
                        return End::Closed("idle");
                    }
                    idle.as_mut().reset(self.last_relayed + timeout);
                }
            }
        }
    }

    /// Up to [`BATCH`] datagrams the customer sent to the relay, passed on
    /// as they may be (fewer after one that needed a lookup).
    async fn up_batch(&mut self, association: &mut Association) {
        for _ in 0..BATCH {
            // A client over its quota mid-batch: not one datagram more (the
            // relay loop then ends the association).
            if self.client.limiter.is_over_quota() {
                break;
            }
            let Ok((len, from)) = association.relay.try_recv_from(&mut self.buffer) else {
                break;
            };
            if self.up(association, len, from).await {
                self.last_relayed = Instant::now();
            }
            if std::mem::take(&mut self.looked_up) {
                break;
            }
        }
    }

    /// Up to [`BATCH`] datagrams back at the egress socket, returned to
    /// the customer as they may be.
    async fn down_batch(&mut self, association: &mut Association) {
        for _ in 0..BATCH {
            if self.client.limiter.is_over_quota() {
                break;
            }
            let received = association
                .egress
                .try_recv_from(&mut self.buffer[HEADER_ROOM..]);
            let Ok((len, from)) = received else { break };
            if self.down(association, len, from).await {
                self.last_relayed = Instant::now();
            }
        }
    }

    /// A datagram from the customer (`buffer[..len]`, from `from`): passed
    /// on if it may be; true if it was.
    async fn up(&mut self, association: &mut Association, len: usize, from: SocketAddr) -> bool {
        let counters = &self.context.udp_counters;
        if canonical(from.ip()) != self.customer_ip || !self.may_move_to(association, from) {
            counters.foreign.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        // The customer's port is in use while it sends, whether or not what
        // it sends passes (over its rate, to a denied destination): a
        // neighbour behind its address must not take its answers then.
        if association.state.customer == Some(from) {
            self.customer_heard = Instant::now();
        }
        let Ok(datagram) = parse_udp_datagram(&self.buffer[..len]) else {
            counters.bad_header.fetch_add(1, Ordering::Relaxed);
            return false;
        };
        if datagram.frag != 0 {
            counters.fragments.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let (destination, payload_len) = (datagram.destination, datagram.payload.len());
        let payload_start = len - payload_len;
        // The rate first: a client over it must not start a name lookup per
        // datagram (and fill its lookup places) for datagrams then dropped.
        if !self
            .client
            .limiter
            .up
            .admit_packet(payload_len + UDP_OVERHEAD)
        {
            counters.rate_limited.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        // A datagram that goes nowhere gives its tokens back: the bucket is
        // shared with the client's tunnels.
        let Some(to) = self.destination(&association.egress, destination).await else {
            counters.denied.fetch_add(1, Ordering::Relaxed);
            self.client.limiter.up.refund(payload_len + UDP_OVERHEAD);
            return false;
        };
        let payload = &self.buffer[payload_start..len];
        if let Err(error) = association.egress.send_to(payload, to).await {
            tracing::debug!(%to, %error, "a customer's datagram could not be sent");
            counters.send_failed.fetch_add(1, Ordering::Relaxed);
            self.client.limiter.up.refund(payload_len + UDP_OVERHEAD);
            return false;
        }
        self.client
            .meter
            .up
            .fetch_add(payload_len as u64, Ordering::Relaxed);
        self.client.limiter.charge_quota(payload_len);
        // Only a datagram that passed names where answers go.
        association.state.customer = Some(from);
        self.customer_heard = Instant::now();
        true
    }

    /// Whether a datagram from `from` (the customer's address) may be the
    /// customer's: from any port while none has passed yet, from the port
    /// of the last that passed, or from another once that one has been
    /// silent for [`PORT_MOVE_QUIET`].
    fn may_move_to(&self, association: &Association, from: SocketAddr) -> bool {
        match association.state.customer {
            Some(current) if current != from => self.customer_heard.elapsed() >= PORT_MOVE_QUIET,
            _ => true,
        }
    }

    /// A datagram back from `from` (`buffer[HEADER_ROOM..][..len]`):
    /// returned to the customer behind its header; true if it was.
    async fn down(&mut self, association: &mut Association, len: usize, from: SocketAddr) -> bool {
        let counters = &self.context.udp_counters;
        let Some(customer) = association.state.customer else {
            return false;
        };
        if !self.context.egress.permits(from.ip()) {
            counters.denied.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        if !self.client.limiter.down.admit_packet(len + UDP_OVERHEAD) {
            counters.rate_limited.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let mut header = Vec::with_capacity(HEADER_ROOM);
        encode_udp_header(canonical_addr(from), &mut header);
        let start = HEADER_ROOM - header.len();
        self.buffer[start..HEADER_ROOM].copy_from_slice(&header);
        let datagram = &self.buffer[start..HEADER_ROOM + len];
        if let Err(error) = association.relay.send_to(datagram, customer).await {
            tracing::debug!(%customer, %error, "a datagram could not be returned to the customer");
            counters.send_failed.fetch_add(1, Ordering::Relaxed);
            self.client.limiter.down.refund(len + UDP_OVERHEAD);
            return false;
        }
        self.client
            .meter
            .down
            .fetch_add(len as u64, Ordering::Relaxed);
        self.client.limiter.charge_quota(len);
        true
    }

    /// Where a datagram for `destination` goes from `egress`: a permitted
    /// address of a family the socket can reach, None if there is none.
    async fn destination(
        &mut self,
        egress: &UdpSocket,
        destination: Destination,
    ) -> Option<SocketAddr> {
        let candidates = match destination {
            Destination::Ip(address) => vec![address],
            Destination::Domain { host, port } => self.resolve(host, port).await,
        };
        // Unbound `[::]` reaches both families; a socket bound to a source
        // address reaches only its own.
        let local = egress.local_addr().ok()?.ip();
        let dual_stack = local == IpAddr::V6(Ipv6Addr::UNSPECIFIED);
        candidates
            .into_iter()
            .map(canonical_addr)
            .filter(|a| self.context.egress.permits(a.ip()))
            .find(|a| dual_stack || a.is_ipv4() == local.is_ipv4())
            .map(|a| match a {
                // A dual-stack socket reaches IPv4 through mapped addresses.
                SocketAddr::V4(v4) if dual_stack => {
                    SocketAddr::new(IpAddr::V6(v4.ip().to_ipv6_mapped()), v4.port())
                }
                other => other,
            })
    }

    /// `host`'s addresses, from the association's cache while it holds
    /// them: [`NAME_TTL`] for an answer, [`NO_SUCH_NAME_TTL`] for a name
    /// that does not resolve, not at all for a lookup that timed out (the
    /// resolver, or this client's share of it, was busy: the next datagram
    /// tries again).
    async fn resolve(&mut self, host: String, port: u16) -> Vec<SocketAddr> {
        if let Some((addresses, until)) = self.names.get(&host) {
            if Instant::now() < *until {
                return addresses
                    .iter()
                    .map(|a| SocketAddr::new(a.ip(), port))
                    .collect();
            }
        }
        self.looked_up = true;
        let deadline = tokio::time::Instant::now() + RESOLVE_TIMEOUT;
        let looked_up = self
            .context
            .egress
            .lookups
            .resolve(&self.client.record.name, &host, port, deadline)
            .await;
        let (addresses, holds) = match looked_up {
            Ok(addresses) if !addresses.is_empty() => (addresses, NAME_TTL),
            Ok(_) | Err(crate::egress::lookups::LookupError::Failed) => {
                (Vec::new(), NO_SUCH_NAME_TTL)
            }
            Err(crate::egress::lookups::LookupError::TimedOut) => return Vec::new(),
        };
        if self.names.len() >= NAME_CACHE {
            self.names.clear();
        }
        // A name can answer with thousands of addresses (a 64 KiB answer
        // over TCP): the cache bounds what each name holds too, keeping
        // the first permitted ones of each family (the egress socket may
        // reach only one).
        let mut kept = [0usize; 2];
        let addresses: Vec<SocketAddr> = addresses
            .into_iter()
            .filter(|a| self.context.egress.permits(canonical_addr(*a).ip()))
            .filter(|a| {
                let family = usize::from(canonical_addr(*a).is_ipv6());
                kept[family] += 1;
                kept[family] <= NAME_ADDRESSES
            })
            .collect();
        self.names
            .insert(host, (addresses.clone(), Instant::now() + holds));
        addresses
    }
}

/// Turns TCP keepalive on for the control connection ([`KEEPALIVE_IDLE`]):
/// without it a customer gone without a FIN would hold its association,
/// a connection of its cap, for as long as anyone sends to it. Failing
/// that is logged; the association then ends by its idle timeout only.
fn keep_alive(control: &TcpStream) {
    use nix::sys::socket::{setsockopt, sockopt};
    let set = setsockopt(control, sockopt::KeepAlive, &true)
        .and_then(|()| setsockopt(control, sockopt::TcpKeepIdle, &KEEPALIVE_IDLE))
        .and_then(|()| setsockopt(control, sockopt::TcpKeepInterval, &KEEPALIVE_INTERVAL))
        .and_then(|()| setsockopt(control, sockopt::TcpKeepCount, &KEEPALIVE_PROBES));
    if let Err(error) = set {
        tracing::debug!(%error, "cannot turn on keepalive on a UDP association's control connection");
    }
}

/// True when the control connection has ended: EOF, an error, or bytes.
/// RFC 1928 gives it no use after the request but to hold the association;
/// a customer that writes on it is not following the protocol, and reading
/// on would cost the node what no rate or quota counts (and, under the
/// relay loop's `biased` order, starve its datagrams).
fn control_ended(control: &TcpStream) -> bool {
    let mut scratch = [0u8; 1];
    match control.try_read(&mut scratch) {
        Ok(0) => true,
        Ok(_) => {
            tracing::debug!("bytes on a UDP association's control connection; ending it");
            true
        }
        Err(error) => error.kind() != std::io::ErrorKind::WouldBlock,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;

    #[test]
    fn addresses_are_judged_as_ipv4_when_they_are() {
        let mapped: SocketAddr = "[::ffff:192.0.2.1]:4000".parse().unwrap();
        assert_eq!(canonical_addr(mapped), "192.0.2.1:4000".parse().unwrap());
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(canonical(v6), v6);
    }

    #[test]
    fn behind_a_nat_the_reply_names_the_public_address_of_the_customers_family() {
        let bound: SocketAddr = "10.0.0.5:40000".parse().unwrap();
        let public: IpAddr = "203.0.113.7".parse().unwrap();
        assert_eq!(
            relay_as_named(bound, Some(public)),
            "203.0.113.7:40000".parse().unwrap()
        );
        assert_eq!(relay_as_named(bound, None), bound);
        // Reached over IPv6 (or IPv4-mapped): an IPv4 public address is not
        // this customer's.
        let v6: SocketAddr = "[2001:db8::5]:40000".parse().unwrap();
        assert_eq!(relay_as_named(v6, Some(public)), v6);
        let mapped: SocketAddr = "[::ffff:10.0.0.5]:40000".parse().unwrap();
        assert_eq!(
            relay_as_named(mapped, Some(public)),
            "203.0.113.7:40000".parse().unwrap()
        );
    }
}
