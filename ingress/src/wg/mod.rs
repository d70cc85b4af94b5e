//! WireGuard in the ingress: sessions terminate here (boringtun), inner packets
//! go to the active device plane in batches, and what the device plane sends back
//! is encrypted to the peer that owns its inner destination.
//!
//! - **Workers** ([`workers`]): decryption and encryption run in
//!   `wireguard.workers` workers (one per core by default; worker 0 is the
//!   receiving task, or a device plane's reader, itself), a source
//!   endpoint's datagrams and a peer's outgoing packets always in the same
//!   one (or in the receiving task, once that worker is idle), so that each
//!   peer's packets keep their order.
//! - **Receive** ([`Wireguard::serve`]): a batch of datagrams from the UDP socket
//!   (GRO), each checked by the shared handshake rate limiter first (mac1, then a
//!   cookie reply when more initiations arrive per second than
//!   `wireguard.handshake_limit`, and then at most 20 a second from each
//!   source, [`source_limit`]), then routed to its peer: an initiation by the
//!   static key it carries, every other message by its receiver index. A decrypted
//!   packet whose inner source is not the peer's own tunnel address is dropped and
//!   counted (cryptokey routing). An authenticated packet moves the peer's
//!   endpoint to where it came from (roaming).
//! - **To the device plane**: `Packets` frames of up to 64 KiB per peer per
//!   round of a worker's jobs, each packet decrypted straight into its frame, to
//!   the active plane; while none is active they are held, up to
//!   `wireguard.queue` packets (more are dropped and counted), and delivered in
//!   order once one is.
//! - **From the device plane** ([`Wireguard::from_plane`]): each packet goes to
//!   the peer whose tunnel address is its inner destination, encrypted (by that
//!   peer's worker) and sent to the peer's endpoint, grouped for GSO.
//! - **Timers** ([`Wireguard::tick`]): boringtun's timers (rekey, keepalive,
//!   expiry) every 250 ms, and the count of initiations set back every second.
//! - **Peers** ([`Wireguard::on_peers`]): only the active plane's peer set counts;
//!   a full set applies when its last part arrives. `/status` is 503 until the
//!   first full set has been applied.
//! - **`wg show`** ([`uapi`]): a read-only UAPI socket describes the device and
//!   its peers to stock `wg`.

mod inner;
mod peer_sync;
pub mod peers;
mod recovery;
mod source_limit;
pub mod steer;
pub mod uapi;
pub mod udp;
pub mod workers;

use std::io::IoSliceMut;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use blipless_protocol::channel::Packets;
use blipless_protocol::wg_uapi::{UapiDevice, UapiPeer};
use boringtun::noise::errors::WireGuardError;
use boringtun::noise::handshake::parse_handshake_anon;
use boringtun::noise::rate_limiter::RateLimiter;
use boringtun::noise::{Packet, Tunn, TunnResult};
use boringtun::x25519::{PublicKey, StaticSecret};
use quinn_udp::RecvMeta;
use tokio_util::sync::CancellationToken;

use crate::metrics::wg::Round;
use crate::metrics::WgMetrics;
use crate::planes::Planes;
use inner::{Held, InnerBatches};
use peer_sync::Staging;
use peers::PeerTable;
use udp::{Outgoing, WgSocket, MAX_DATAGRAM};
use workers::{Arrival, BufferPool, Lane, Outbound, Pooled, Routed, Span, Workers};

/// How often boringtun's timers run (as its own device loop does).
const TIMER_TICK: Duration = Duration::from_millis(250);
/// Room for what boringtun writes outside the frames: cookie replies, and
/// packets it queued while a session was being made.
const WORK_BUFFER: usize = MAX_DATAGRAM + 256;
/// The least room boringtun is given to write into, decapsulating or
/// encapsulating: what it may write for any message (a handshake
/// initiation, 148 bytes, is the largest).
const MIN_BORINGTUN_ROOM: usize = 256;

/// The ingress's WireGuard endpoint.
pub struct Wireguard {
    private: StaticSecret,
    public: PublicKey,
    /// Checks an initiation's cookie (mac2) while the node is under load,
    /// and makes the cookie replies: a limit of 0, so it always asks.
    cookies: Arc<RateLimiter>,
    /// Checks mac1 only, never asks for a cookie: initiations while the node
    /// is not under load, and every peer's `Tunn` (whose handshakes the
    /// node-wide count has let through already).
    mac1_only: Arc<RateLimiter>,
    /// `wireguard.handshake_limit`: initiations a second before the node is
    /// under load.
    handshake_limit: u64,
    /// Initiations with a valid mac1 this second: the node is under load
    /// once they reach `handshake_limit`. Counted here, not by boringtun's
    /// limiter, because the per-source limit must know it too, and
    /// boringtun does not say.
    initiations: AtomicU64,
    /// When `initiations` was last set back to 0.
    initiations_since: Mutex<std::time::Instant>,
    /// Under load, each source's initiations beyond 20 a second (burst 5)
    /// are dropped before any X25519 work.
    sources: Mutex<source_limit::SourceLimiter>,
    peers: RwLock<PeerTable>,
    socket: WgSocket,
    planes: Arc<Planes>,
    metrics: WgMetrics,
    held: Mutex<Held>,
    held_changed: tokio::sync::Notify,
    queue_limit: usize,
    staging: Mutex<Option<Staging>>,
    synced: AtomicBool,
    /// This ingress stepped aside for a successor: it starts no session
    /// (no handshake initiation, from its timers' rekey or for a packet to
    /// a peer without one). A peer that answered one would make this
    /// ingress's session its current one and send here, to an ingress
    /// about to exit, while the successor's traffic to it kept the peer
    /// from noticing for up to two minutes.
    stepped_aside: AtomicBool,
    /// Endpoints were given (by a predecessor or a device plane's snapshot).
    seeded: AtomicBool,
    endpoint_staging: Mutex<Option<(u64, Vec<blipless_protocol::channel::EndpointEntry>)>>,
    epoch: std::time::Instant,
    epoch_ms: u64,
    /// `wireguard.pool` and `wireguard.pool6`: a peer may also send from,
    /// and is sent to at, its address's IPv6 twin.
    pools6: Option<blipless_config::pool6::TunnelPools>,
    /// The crypto workers' queues.
    workers: Workers,
    /// The socket task's receive buffers, lent to the workers.
    receive_buffers: Arc<BufferPool>,
    /// Device-plane frame buffers, lent to the workers.
    frames: Arc<BufferPool>,
}

impl std::fmt::Debug for Wireguard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wireguard")
            .field(
                "public",
                &blipless_config::wireguard_key::encode(self.public.as_bytes()),
            )
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

/// What one receive batch produced.
struct Work {
    replies: Outgoing,
    inner: InnerBatches,
    buffer: Vec<u8>,
    round: Round,
}

impl Work {
    fn new() -> Self {
        Self {
            replies: Outgoing::default(),
            inner: InnerBatches::default(),
            buffer: vec![0u8; WORK_BUFFER],
            round: Round::default(),
        }
    }
}

impl Wireguard {
    /// A WireGuard endpoint on `socket` with the node's private key.
    /// `generation` (0 or 1) goes into bit 23 of every peer index; `workers`
    /// crypto workers (at least one) start with [`Wireguard::serve`].
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        private_key: [u8; 32],
        socket: WgSocket,
        planes: Arc<Planes>,
        metrics: WgMetrics,
        handshake_limit: usize,
        queue_limit: usize,
        generation: u32,
        workers: usize,
    ) -> Self {
        let private = StaticSecret::from(private_key);
        let public = PublicKey::from(&private);
        // Initiations from anyone, before they are routed to a peer, pass
        // `mac1_only`, and under load `cookies` too. The peers' Tunns share
        // `mac1_only`: with a limiter of their own (boringtun's default), a
        // peer named by forged initiations would be asked for a cookie of
        // another secret than the node's, and could satisfy only one of the
        // two at a time.
        let cookies = Arc::new(RateLimiter::new(&public, 0));
        let mac1_only = Arc::new(RateLimiter::new(&public, u64::MAX));
        let epoch_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        Self {
            private,
            public,
            cookies,
            mac1_only,
            handshake_limit: handshake_limit as u64,
            initiations: AtomicU64::new(0),
            initiations_since: Mutex::new(std::time::Instant::now()),
            sources: Mutex::new(source_limit::SourceLimiter::default()),
            peers: RwLock::new(PeerTable::new(generation)),
            socket,
            planes,
            metrics,
            held: Mutex::new(Held::default()),
            held_changed: tokio::sync::Notify::new(),
            queue_limit,
            staging: Mutex::new(None),
            synced: AtomicBool::new(false),
            stepped_aside: AtomicBool::new(false),
            seeded: AtomicBool::new(false),
            endpoint_staging: Mutex::new(None),
            epoch: std::time::Instant::now(),
            epoch_ms,
            pools6: None,
            workers: Workers::new(workers),
            receive_buffers: BufferPool::new(MAX_DATAGRAM),
            frames: BufferPool::new(blipless_protocol::channel::MAX_FRAME),
        }
    }

    /// The same endpoint with IPv6 inside the tunnel (`wireguard.pool6`).
    pub fn with_pools6(mut self, pools6: Option<blipless_config::pool6::TunnelPools>) -> Self {
        self.pools6 = pools6;
        self
    }

    /// An inner address as the IPv4 tunnel address that owns it.
    fn owner_address(&self, address: IpAddr) -> IpAddr {
        match (address, self.pools6) {
            (IpAddr::V6(v6), Some(pools)) => pools.v4_of(v6).map_or(address, IpAddr::V4),
            _ => address,
        }
    }

    /// True once the active device plane's first full peer set is applied.
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::SeqCst)
    }

    /// How many peers there are.
    pub fn peer_count(&self) -> usize {
        self.read_peers().len()
    }

    /// Whether datagrams wait in this ingress's WireGuard socket, unread, or
    /// in its workers' queues, not yet decrypted.
    pub fn has_queued(&self) -> bool {
        self.socket.has_queued() || self.workers.decrypting()
    }

    /// How many crypto workers there are.
    pub fn worker_count(&self) -> usize {
        self.workers.count()
    }

    /// How long since any peer's last authenticated packet on this ingress
    /// (`None`: none ever).
    pub fn idle_for(&self) -> Option<Duration> {
        let last = self
            .read_peers()
            .iter()
            .map(|peer| peer.last_received_ms())
            .max()
            .filter(|ms| *ms > 0)?;
        Some(Duration::from_millis(self.now_ms().saturating_sub(last)))
    }

    /// The device and every peer as `wg show` describes them ([`uapi`]).
    pub fn uapi_device(&self) -> UapiDevice {
        let now = std::time::SystemTime::now();
        let peers = self
            .read_peers()
            .iter()
            .map(|peer| {
                // A peer with no session state here has no figures yet.
                let (since_handshake, tx_bytes, rx_bytes, _, _) = peer
                    .made_tunnel()
                    .map_or((None, 0, 0, 0.0, None), |tunnel| tunnel.stats());
                let last_handshake = since_handshake
                    .and_then(|since| now.checked_sub(since))
                    .and_then(|at| at.duration_since(std::time::UNIX_EPOCH).ok());
                UapiPeer {
                    public_key: peer.public_key,
                    endpoint: peer.endpoint(),
                    last_handshake,
                    rx_bytes: rx_bytes as u64,
                    tx_bytes: tx_bytes as u64,
                    allowed_ip: peer.address,
                    allowed_ip6: match (peer.address, self.pools6) {
                        (IpAddr::V4(v4), Some(pools)) => pools.v6_of(v4).map(IpAddr::V6),
                        _ => None,
                    },
                }
            })
            .collect();
        UapiDevice {
            private_key: self.private.to_bytes(),
            listen_port: self.socket.local_port(),
            peers,
        }
    }

    /// Milliseconds since the Unix epoch, by this ingress's clock.
    pub fn now_ms(&self) -> u64 {
        self.epoch_ms + self.epoch.elapsed().as_millis() as u64
    }

    fn read_peers(&self) -> std::sync::RwLockReadGuard<'_, PeerTable> {
        self.peers
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write_peers(&self) -> std::sync::RwLockWriteGuard<'_, PeerTable> {
        self.peers
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A peer's session state, made now if this ingress has none for it yet.
    fn tunnel_of<'p>(&self, peer: &'p peers::Peer) -> peers::TunnelGuard<'p> {
        peer.tunnel(&|key, index| self.new_tunnel(key, index))
    }

    fn new_tunnel(&self, key: &[u8; 32], index: u32) -> Tunn {
        Tunn::new(
            self.private.clone(),
            PublicKey::from(*key),
            None,
            None,
            index,
            Some(self.mac1_only.clone()),
        )
    }

    /// Receives datagrams until `shutdown` and gives them to the workers,
    /// with the workers, the timers and the delivery of held packets running
    /// beside it; then lets the workers finish what they were given.
    pub async fn serve(self: Arc<Self>, shutdown: CancellationToken) {
        let workers = Workers::start(&self);
        let timers = tokio::spawn(self.clone().run_timers(shutdown.clone()));
        let flusher = tokio::spawn(self.clone().deliver_held(shutdown.clone()));
        let snapshots = tokio::spawn(self.clone().send_snapshots(shutdown.clone()));
        let batch = quinn_udp::BATCH_SIZE;
        let mut buffers: Vec<Vec<u8>> = (0..batch).map(|_| self.receive_buffers.take()).collect();
        let mut meta = vec![RecvMeta::default(); batch];
        let mut jobs: Vec<Vec<Arrival>> = (0..self.workers.count()).map(|_| Vec::new()).collect();
        let mut own = self.lane(0);
        loop {
            let received = {
                let mut slices: Vec<IoSliceMut<'_>> =
                    buffers.iter_mut().map(|b| IoSliceMut::new(b)).collect();
                tokio::select! {
                    received = self.socket.recv(&mut slices, &mut meta) => received,
                    () = shutdown.cancelled() => break,
                }
            };
            let count = match received {
                Ok(count) => count,
                Err(error) => {
                    // ICMP errors surface here on some kernels; never fatal.
                    tracing::debug!(%error, "WireGuard receive failed");
                    continue;
                }
            };
            for (buffer, meta) in buffers.iter_mut().zip(&meta).take(count) {
                let fresh = self.receive_buffers.take();
                let arrival = Arrival {
                    buffer: Pooled::new(
                        std::mem::replace(buffer, fresh),
                        self.receive_buffers.clone(),
                    ),
                    len: meta.len,
                    stride: meta.stride,
                    from: meta.addr,
                };
                jobs[self.workers.for_endpoint(meta.addr)].push(arrival);
            }
            // With nothing of its own to decrypt, this task takes the share
            // of a worker that has nothing queued or under way, rather than
            // wake it and wait: order holds, since all that worker was given
            // is decrypted and sent on already.
            let here = if jobs[0].is_empty() {
                (1..jobs.len())
                    .find(|&worker| !jobs[worker].is_empty() && self.workers.idle(worker))
                    .unwrap_or(0)
            } else {
                0
            };
            // The other workers' shares first, so they start while this
            // task decrypts its own.
            for (worker, arrivals) in jobs.iter_mut().enumerate().skip(1) {
                if worker != here && !arrivals.is_empty() {
                    self.workers.decrypt(worker, std::mem::take(arrivals)).await;
                }
            }
            if !jobs[here].is_empty() {
                self.decrypt(&jobs[here], &mut own);
                jobs[here].clear();
                self.end_round(&mut own, 1).await;
            }
        }
        self.workers.finish(workers).await;
        timers.abort();
        flusher.abort();
        snapshots.abort();
    }

    /// Handles one datagram from `from`.
    fn handle_datagram(&self, from: SocketAddr, datagram: &[u8], work: &mut Work) {
        work.round.datagrams_in += 1;
        let Ok(parsed) = Tunn::parse_incoming_packet(datagram) else {
            self.metrics.count_drop("invalid");
            return;
        };
        // Answered, it would make this ingress, about to exit, the peer's
        // current session (`stepped_aside`); unanswered, the peer tries
        // again, and its next initiation reaches the successor. The same
        // for a response to an initiation this ingress sent before it
        // stepped aside: taken, its keepalive would confirm the session at
        // the peer, which may then prefer it to the successor's (whose
        // call-back then stops), and send into an ingress about to exit.
        if matches!(
            parsed,
            Packet::HandshakeInit(_) | Packet::HandshakeResponse(_)
        ) && self.stepped_aside.load(Ordering::Relaxed)
        {
            self.metrics.count_drop("stepped_aside");
            return;
        }
        // Initiations are limited here: under load they get cookie
        // replies. Responses answer this ingress's own initiations (a
        // call-back may send a thousand at once): not here, but once their
        // peer is known (below, by the address they come from); the peer's
        // Tunn still checks their mac1 (`mac1_only`).
        // Under load, a cookie proves only that its sender receives at its
        // address, so each source is limited too (`source_limit`).
        let packet = if matches!(parsed, Packet::HandshakeInit(_)) {
            let mac1 = self
                .mac1_only
                .verify_packet(Some(from.ip()), datagram, &mut work.buffer);
            let Ok(packet) = mac1 else {
                self.metrics.count_drop("invalid");
                return;
            };
            if !self.count_initiation() {
                packet
            } else {
                match self
                    .cookies
                    .verify_packet(Some(from.ip()), datagram, &mut work.buffer)
                {
                    Ok(packet) if self.source_admitted(from.ip()) => packet,
                    Ok(_) => {
                        self.metrics.count_drop("source_limited");
                        return;
                    }
                    Err(TunnResult::WriteToNetwork(cookie)) => {
                        self.metrics.count_cookie_reply();
                        work.replies
                            .push(from, cookie, self.socket.max_gso_segments());
                        return;
                    }
                    Err(_) => {
                        self.metrics.count_drop("invalid");
                        return;
                    }
                }
            }
        } else {
            parsed
        };
        let handshake = matches!(
            packet,
            Packet::HandshakeInit(_) | Packet::HandshakeResponse(_)
        );
        let data = matches!(packet, Packet::PacketData(_));
        let peer = {
            let table = self.read_peers();
            let found = match &packet {
                Packet::HandshakeInit(init) => {
                    parse_handshake_anon(&self.private, &self.public, init)
                        .ok()
                        .and_then(|half| table.by_key(&half.peer_static_public).cloned())
                }
                Packet::HandshakeResponse(response) => {
                    table.by_receiver_index(response.receiver_idx).cloned()
                }
                Packet::PacketCookieReply(reply) => {
                    table.by_receiver_index(reply.receiver_idx).cloned()
                }
                Packet::PacketData(data) => table.by_receiver_index(data.receiver_idx).cloned(),
            };
            found
        };
        let Some(peer) = peer else {
            self.metrics.count_drop("unknown_peer");
            return;
        };
        let segments = self.socket.max_gso_segments();
        // Only an initiation (its sender's key proven by the decryption in
        // `parse_handshake_anon`) may make a peer's WireGuard state. A
        // response, a cookie reply or data answers what a state of ours sent
        // or holds: without one it cannot be genuine, and making one for it
        // would let anyone who guesses receiver indexes (generation and slot,
        // handed out in order) make every peer's, about 11 KiB and two X25519
        // operations each (docs/DECISIONS.md, "A node of 100,000 peers").
        let mut tunnel = if matches!(packet, Packet::HandshakeInit(_)) {
            self.tunnel_of(&peer)
        } else if let Some(tunnel) = peer.made_tunnel() {
            tunnel
        } else {
            self.metrics.count_drop("no_session");
            return;
        };
        // A response costs two X25519 operations before boringtun can tell
        // it is forged, and anyone with the node's public key can make its
        // mac1 and guess a receiver index held by an initiation of ours (a
        // call-back after a handoff holds one per peer for 30 s). One from
        // the address the initiation went to (a call-back's answer) always
        // goes on; one from elsewhere (a peer whose address changed) counts
        // as handshake work, and under load is dropped before that work.
        if matches!(packet, Packet::HandshakeResponse(_))
            && peer.endpoint() != Some(from)
            && self.count_initiation()
        {
            self.metrics.count_drop("under_load");
            return;
        }
        // Decrypted straight into the peer's frame to the device plane
        // (boringtun writes what it makes at the start of the room it is
        // given; the room holds any datagram of 65535 bytes or less).
        let room = datagram.len().max(MIN_BORINGTUN_ROOM);
        let spare = work.inner.spare(peer.index, room);
        if spare.len() < datagram.len() {
            // Never so: any datagram fits a fresh frame's room.
            self.metrics.count_drop("invalid");
            return;
        }
        let kept = match tunnel.decapsulate(Some(from.ip()), datagram, spare) {
            TunnResult::WriteToNetwork(reply) => {
                // A cookie reply (type 3) answers an unauthenticated message:
                // it must not move the endpoint. Nor does our response (type
                // 2) to an initiation: an initiation can be a replay (a
                // fresh session state, as a successor's or a restarted
                // ingress's is, knows no timestamp to refuse it by), and
                // the peer's first data on the new session, which follows
                // at once and cannot be replayed, moves it instead.
                if !matches!(reply.first(), Some(&2 | &3)) {
                    peer.heard_from(from, self.now_ms());
                    if handshake {
                        // The keepalive that confirms our own initiation
                        // (the peer's response is bound to it): a new
                        // session.
                        peer.session_made(self.now_ms());
                    }
                }
                if reply.first() == Some(&2) {
                    self.metrics.count_handshake();
                }
                work.replies.push(from, reply, segments);
                // Packets queued while the session was being made go now.
                self.send_queued(
                    &mut tunnel,
                    from,
                    &mut work.buffer,
                    &mut work.replies,
                    &mut work.round,
                );
                None
            }
            // boringtun's source is read from the whole plaintext, but it
            // keeps only what the packet's own length field says: judged
            // by what is kept.
            TunnResult::WriteToTunnelV4(inner, _) | TunnResult::WriteToTunnelV6(inner, _) => {
                peer.heard_from(from, self.now_ms());
                peer.sent_data(self.now_ms());
                let kept = self.kept_inner_allowed(&peer, inner).then_some(inner.len());
                // Data on a session the peer made (it initiated while ours
                // was under way, as during a call-back) makes that session
                // current, but boringtun sends what it queued meanwhile only
                // when asked: asked here, so those packets do not trail the
                // ones sent from now on.
                self.send_queued(
                    &mut tunnel,
                    from,
                    &mut work.buffer,
                    &mut work.replies,
                    &mut work.round,
                );
                kept
            }
            TunnResult::Done => {
                if data {
                    // A keepalive: data on a session of ours all the same.
                    peer.heard_from(from, self.now_ms());
                    peer.sent_data(self.now_ms());
                }
                // Else a cookie reply: anyone who saw our initiation can
                // make one, so it must not move the endpoint.
                None
            }
            TunnResult::Err(error) => {
                self.metrics.count_drop(drop_reason(&error));
                tunnel.unmake_if_fresh();
                None
            }
        };
        if let Some(len) = kept {
            if work.inner.commit(peer.index, len) {
                work.round.inner_in += 1;
            }
        }
    }

    /// Sends what boringtun queued for a peer while it had no session (up
    /// to 256 packets), once one is made, to `to`; counted as inner
    /// packets out. Nothing when the queue is empty (one look).
    fn send_queued(
        &self,
        tunnel: &mut peers::TunnelGuard<'_>,
        to: SocketAddr,
        buffer: &mut [u8],
        out: &mut Outgoing,
        round: &mut Round,
    ) {
        let segments = self.socket.max_gso_segments();
        while let TunnResult::WriteToNetwork(queued) = tunnel.decapsulate(None, &[], buffer) {
            if !self.may_send(queued) {
                self.metrics.count_drop("stepped_aside");
                continue;
            }
            if queued.first() == Some(&4) {
                round.inner_out += 1;
            }
            out.push(to, queued, segments);
        }
    }

    /// Whether a decrypted packet's source is the peer's own address, as it
    /// must be for the device plane to take it; counted as dropped if not.
    /// Whether the inner packet kept from a decryption goes to the plane:
    /// a whole IP header (a length field shorter than its own header leaves
    /// a stub the plane cannot tell the client of, and a batch it cannot
    /// meter) from the peer's own address.
    fn kept_inner_allowed(&self, peer: &peers::Peer, inner: &[u8]) -> bool {
        match blipless_protocol::ip::source(inner) {
            Some(source) => self.inner_allowed(peer, source),
            None => {
                self.metrics.count_drop("malformed_inner");
                false
            }
        }
    }

    fn inner_allowed(&self, peer: &peers::Peer, source: IpAddr) -> bool {
        if self.owner_address(source) != peer.address {
            self.metrics.count_drop("source");
            tracing::debug!(client = %peer.client, %source, own = %peer.address, "inner source is not the peer's address: dropped");
            return false;
        }
        true
    }

    /// Routes what a device plane sent back: each packet to the worker of the
    /// peer that owns its inner destination. `span` is where the buffer
    /// `batch` was decoded from lay (taken before the decoder borrowed it);
    /// [`Wireguard::from_plane`] then hands the buffer over.
    pub fn route_from_plane(&self, batch: &Packets<'_>, span: Span) -> Routed {
        let mut routed: Routed = (0..self.workers.count()).map(|_| Vec::new()).collect();
        let table = self.read_peers();
        for packet in batch.iter() {
            let Some(destination) = blipless_protocol::ip::destination(packet) else {
                self.metrics.count_drop("malformed_inner");
                continue;
            };
            let Some(peer) = table.by_address(self.owner_address(destination)) else {
                self.metrics.count_drop("no_peer_for_destination");
                continue;
            };
            // Always a slice of the buffer: the decoder borrows, never copies.
            let Some(place) = span.place(packet) else {
                self.metrics.count_drop("malformed_inner");
                continue;
            };
            routed[self.workers.for_peer(peer)].push((peer.clone(), place));
        }
        routed
    }

    /// Encrypts and sends the packets [`Wireguard::route_from_plane`] routed:
    /// worker 0's share here, in `lane`, the others' by their tasks, which
    /// share `frame`, the buffer the packets lie in (`frame` then gets a
    /// fresh buffer for the next read).
    pub async fn from_plane(&self, mut routed: Routed, frame: &mut Vec<u8>, lane: &mut Lane) {
        let own = std::mem::take(&mut routed[0]);
        if routed.iter().any(|packets| !packets.is_empty()) {
            // Where the frame's packets end: what a worker's queue is charged.
            let used = routed
                .iter()
                .flatten()
                .chain(&own)
                .map(|(_, place)| place.end)
                .max()
                .unwrap_or(0)
                .min(frame.len());
            let shared = Arc::new(if used <= workers::COPIED_FRAME {
                // A small frame is copied: it waits holding its own size,
                // and the reader keeps its buffer.
                Pooled::unpooled(frame[..used].to_vec())
            } else {
                Pooled::new(
                    std::mem::replace(frame, self.frames.take()),
                    self.frames.clone(),
                )
            });
            for (worker, packets) in routed.into_iter().enumerate().skip(1) {
                if !packets.is_empty() {
                    let outbound = Outbound {
                        frame: shared.clone(),
                        packets,
                    };
                    let dropped = self.workers.encrypt(worker, outbound, used);
                    if dropped > 0 {
                        self.metrics.count_drops("workers_busy", dropped);
                    }
                }
            }
            if !own.is_empty() {
                self.encrypt_into(shared.bytes(), &own, lane);
                self.end_round(lane, 1).await;
            }
        } else if !own.is_empty() {
            self.encrypt_into(frame, &own, lane);
            self.end_round(lane, 1).await;
        }
    }

    /// Encrypts `packets`, each a place in `frame` and the peer it goes to,
    /// into `out`, each straight into the buffer it is sent from.
    fn encrypt(
        &self,
        frame: &[u8],
        packets: &[(Arc<peers::Peer>, std::ops::Range<usize>)],
        out: &mut Outgoing,
        round: &mut Round,
    ) {
        let segments = self.socket.max_gso_segments();
        for (peer, place) in packets {
            let Some(packet) = frame.get(place.clone()) else {
                continue;
            };
            let Some(endpoint) = peer.endpoint() else {
                self.metrics.count_drop("no_endpoint");
                continue;
            };
            let mut tunnel = self.tunnel_of(peer);
            // A data message is the packet and 32 bytes; with no session
            // yet, boringtun queues the packet and writes a handshake
            // initiation instead.
            let room = (packet.len() + 32).max(MIN_BORINGTUN_ROOM);
            out.push_with(endpoint, room, segments, |room| {
                match tunnel.encapsulate(packet, room) {
                    TunnResult::WriteToNetwork(datagram) if !self.may_send(datagram) => {
                        self.metrics.count_drop("stepped_aside");
                        None
                    }
                    TunnResult::WriteToNetwork(datagram) => {
                        round.inner_out += 1;
                        Some(datagram.len())
                    }
                    // Queued inside boringtun until a handshake completes.
                    TunnResult::Done => None,
                    TunnResult::Err(error) => {
                        self.metrics.count_drop(drop_reason(&error));
                        None
                    }
                    _ => None,
                }
            });
        }
    }

    /// A successor serves (`true`: start no session from now on), or
    /// went away and this ingress serves again (`false`).
    pub fn set_stepped_aside(&self, stepped_aside: bool) {
        self.stepped_aside.store(stepped_aside, Ordering::SeqCst);
    }

    /// Whether `datagram`, made by a peer's state to be sent, may go: not a
    /// handshake initiation (type 1) once this ingress stepped aside.
    fn may_send(&self, datagram: &[u8]) -> bool {
        datagram.first() != Some(&1) || !self.stepped_aside.load(Ordering::Relaxed)
    }

    /// Counts an initiation with a valid mac1; whether the node was already
    /// under load (this second's count had reached
    /// `wireguard.handshake_limit`).
    fn count_initiation(&self) -> bool {
        self.initiations.fetch_add(1, Ordering::Relaxed) >= self.handshake_limit
    }

    /// Whether an initiation from `source` may go on while under load.
    fn source_admitted(&self, source: IpAddr) -> bool {
        self.sources
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .admit(source, std::time::Instant::now())
    }

    /// Starts a new second of counted initiations once a whole one has
    /// passed (asked every tick: asking every fourth, about 1 s and
    /// sometimes a hair under, would leave half the windows 2 s long), and
    /// forgets quiet sources.
    fn reset_initiation_count(&self) {
        let now = std::time::Instant::now();
        let mut since = self
            .initiations_since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if now.duration_since(*since) < Duration::from_secs(1) {
            return;
        }
        *since = now;
        self.initiations.store(0, Ordering::Relaxed);
        let mut sources = self
            .sources
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !sources.is_empty() {
            sources.forget_idle(now);
        }
    }

    async fn run_timers(self: Arc<Self>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(TIMER_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = shutdown.cancelled() => return,
            }
            self.reset_initiation_count();
            self.tick().await;
        }
    }

    /// Runs every peer's timers once, sending what they produce.
    pub async fn tick(&self) {
        let segments = self.socket.max_gso_segments();
        let mut out = Outgoing::default();
        let mut buffer = vec![0u8; WORK_BUFFER];
        let peers: Vec<Arc<peers::Peer>> = self.read_peers().iter().cloned().collect();
        for peer in peers {
            let Some(endpoint) = peer.endpoint() else {
                continue;
            };
            // A peer never used here has no timers to run.
            let Some(mut tunnel) = peer.made_tunnel() else {
                continue;
            };
            if let TunnResult::WriteToNetwork(datagram) = tunnel.update_timers(&mut buffer) {
                if self.may_send(datagram) {
                    out.push(endpoint, datagram, segments);
                } else {
                    self.metrics.count_drop("stepped_aside");
                }
            }
        }
        let failed = out.flush(&self.socket).await;
        self.metrics.count_send_failures(failed);
    }
}

fn drop_reason(error: &WireGuardError) -> &'static str {
    match error {
        WireGuardError::DuplicateCounter
        | WireGuardError::InvalidCounter
        | WireGuardError::WrongTai64nTimestamp => "replay",
        WireGuardError::InvalidMac | WireGuardError::InvalidAeadTag => "authentication",
        WireGuardError::NoCurrentSession => "no_session",
        WireGuardError::UnderLoad => "under_load",
        WireGuardError::InvalidPacket => "invalid",
        WireGuardError::ConnectionExpired => "expired",
        _ => "other",
    }
}
