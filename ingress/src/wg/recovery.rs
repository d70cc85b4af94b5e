//! Keeping WireGuard customers through an ingress restart: endpoint snapshots,
//! seeding a new ingress, and calling peers back.
//!
//! - Every [`SNAPSHOT_EVERY`] the ingress sends the active device plane where
//!   its peers are (`Endpoints`); the plane keeps the latest in the store.
//! - A successor ingress is seeded by its predecessor (peer set and endpoints);
//!   an ingress that started fresh (after a crash) asks the device plane for the
//!   stored snapshot in Welcome ([`Wireguard::wants_endpoints`]).
//! - Either way, peers heard from within [`CALL_BACK_WINDOW`] are called back:
//!   the ingress initiates a handshake to each at once and again every
//!   [`CALL_BACK_RETRY`] until it has a new session, for at most
//!   [`CALL_BACK_BUDGET`]. A peer answers in a round trip, instead of its own
//!   retry 15-30 s later; with a predecessor still decrypting the old sessions,
//!   no packet is lost meanwhile.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blipless_protocol::channel::{EndpointEntry, EndpointPart, PeerEntry, ToDevice};
use boringtun::noise::TunnResult;
use tokio_util::sync::CancellationToken;

use super::peers::Peer;
use super::udp::Outgoing;
use super::{Wireguard, WORK_BUFFER};
use crate::planes::PlaneLink;

/// How often the ingress sends the active device plane an endpoint snapshot.
pub const SNAPSHOT_EVERY: Duration = Duration::from_secs(2);
/// Peers heard from within this window are called back after a restart.
pub const CALL_BACK_WINDOW: Duration = Duration::from_secs(600);
/// How often a peer that has not answered is called again.
pub const CALL_BACK_RETRY: Duration = Duration::from_secs(1);
/// How many call-back initiations are made between two yields to the
/// runtime (each costs two X25519 operations, about 100 µs).
const CALL_BACK_YIELD_EVERY: usize = 64;
/// How long the ingress keeps calling peers back.
pub const CALL_BACK_BUDGET: Duration = Duration::from_secs(30);
/// At most this many threads make the first calls (see `first_calls`).
const FIRST_CALL_THREADS: usize = 8;
/// How often the call-back looks for answered peers and retries due.
const CALL_BACK_CHECK: Duration = Duration::from_millis(20);

impl Wireguard {
    /// True while this ingress started with no predecessor and has not been
    /// given an endpoint snapshot yet: device planes are asked for one.
    pub fn wants_endpoints(&self) -> bool {
        !self.seeded.load(Ordering::SeqCst)
    }

    /// Each peer heard from, with its last authenticated packet (ms since the
    /// epoch), for a predecessor deciding whether it may leave.
    pub fn activity(&self) -> Vec<([u8; 32], u64)> {
        self.read_peers()
            .iter()
            .map(|peer| (peer.public_key, peer.last_received_ms()))
            .filter(|(_, last)| *last > 0)
            .collect()
    }

    /// Peers that have sent this ingress data and are not in `reported`
    /// (which they join): for a successor's progress report.
    pub fn newly_sending(&self, reported: &mut HashSet<[u8; 32]>) -> Vec<[u8; 32]> {
        self.read_peers()
            .iter()
            .filter(|peer| peer.data_ms() > 0)
            .map(|peer| peer.public_key)
            .filter(|key| reported.insert(*key))
            .collect()
    }

    /// The peer set and endpoints now, for a successor.
    pub fn snapshot(&self) -> (Vec<PeerEntry>, Vec<EndpointEntry>) {
        let peers = self
            .read_peers()
            .iter()
            .map(|peer| PeerEntry {
                public_key: peer.public_key,
                address: peer.address,
                client: peer.client.clone(),
            })
            .collect();
        (peers, self.endpoints())
    }

    /// Where each peer was last heard from, for a successor or the store.
    pub fn endpoints(&self) -> Vec<EndpointEntry> {
        self.read_peers()
            .iter()
            .filter_map(|peer| {
                Some(EndpointEntry {
                    public_key: peer.public_key,
                    endpoint: peer.endpoint()?,
                    last_received_ms: peer.last_received_ms(),
                })
            })
            .collect()
    }

    /// Seeds a successor from its predecessor: the peer set (so it can answer
    /// and initiate handshakes before a device plane attaches), then the
    /// endpoints, then calls the recently active peers back.
    pub fn seed(self: &Arc<Self>, peers: &[PeerEntry], endpoints: &[EndpointEntry]) {
        self.apply_full_set(peers);
        self.apply_endpoints(endpoints);
    }

    /// Applies endpoints (from a predecessor or the store) once, and calls the
    /// recently active peers back.
    fn apply_endpoints(self: &Arc<Self>, endpoints: &[EndpointEntry]) {
        if self.seeded.swap(true, Ordering::SeqCst) {
            return;
        }
        let now = self.now_ms();
        let window = CALL_BACK_WINDOW.as_millis() as u64;
        let mut recent = Vec::new();
        {
            let table = self.read_peers();
            for entry in endpoints {
                let Some(peer) = table.by_key(&entry.public_key) else {
                    continue;
                };
                peer.seed_endpoint(entry.endpoint, entry.last_received_ms);
                if now.saturating_sub(entry.last_received_ms) <= window {
                    recent.push((entry.last_received_ms, peer.public_key));
                }
            }
        }
        tracing::info!(
            endpoints = endpoints.len(),
            calling_back = recent.len(),
            "WireGuard endpoints seeded"
        );
        if !recent.is_empty() {
            // The most recently active first: they are the likeliest to be
            // sending now.
            recent.sort_unstable_by_key(|entry| std::cmp::Reverse(entry.0));
            let keys: Vec<[u8; 32]> = recent.into_iter().map(|(_, key)| key).collect();
            let first_calls = self.first_calls(&keys);
            tokio::spawn(self.clone().call_back(keys, first_calls));
        }
    }

    /// Collects an endpoint snapshot a device plane sends (the answer to
    /// `wants_endpoints`), and applies it when whole.
    pub fn on_endpoints(self: &Arc<Self>, from: &PlaneLink, part: EndpointPart) {
        let mut staging = self
            .endpoint_staging
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if part.start {
            *staging = Some((from.generation, Vec::new()));
        }
        let Some((generation, entries)) = staging.as_mut() else {
            return;
        };
        if *generation != from.generation {
            return;
        }
        entries.extend_from_slice(part.entries());
        if part.end {
            let Some((_, entries)) = staging.take() else {
                return;
            };
            drop(staging);
            tracing::info!(
                generation = from.generation,
                entries = entries.len(),
                "endpoint snapshot from the device plane"
            );
            // Off the device link's reader, which calls this and carries the
            // plane's return packets: this ingress serves already, and the
            // first calls cost four X25519 operations per peer called back
            // (seconds for a large node). A return packet meanwhile makes
            // its peer's state itself, as it would for any peer.
            let this = self.clone();
            drop(tokio::task::spawn_blocking(move || {
                this.apply_endpoints(&entries);
            }));
        }
    }

    /// Makes the session state of each of `keys` and its first handshake
    /// initiation, spread over the machine's cores: each costs four X25519
    /// operations. At a handoff it runs before this ingress serves, so that
    /// return traffic from a device plane finds a handshake under way for
    /// every peer called back and only queues behind it: were the device
    /// link's reader to make a peer's state and initiate inline, a thousand
    /// peers would hold it for a few hundred milliseconds, the plane's TUN
    /// reader would wait on the full channel, and the kernel would drop what
    /// the TUN device holds beyond its queue (docs/ARCHITECTURE.md, "Ingress
    /// restart-by-handoff"). After a crash (the endpoints come from the
    /// device plane once this ingress serves) it runs on the blocking pool,
    /// never on that reader.
    fn first_calls(&self, keys: &[[u8; 32]]) -> Vec<(SocketAddr, Vec<u8>)> {
        let threads = std::thread::available_parallelism()
            .map_or(1, std::num::NonZeroUsize::get)
            .clamp(1, FIRST_CALL_THREADS);
        // Taken out of the table first: its lock is not held for the X25519
        // work, which would hold a peer-set update (the writer) as long.
        let peers: Vec<Arc<Peer>> = {
            let table = self.read_peers();
            keys.iter()
                .filter_map(|key| table.by_key(key).cloned())
                .collect()
        };
        let per_thread = peers.len().div_ceil(threads).max(1);
        std::thread::scope(|scope| {
            let workers: Vec<_> = peers
                .chunks(per_thread)
                .map(|chunk| {
                    scope.spawn(move || {
                        let mut buffer = vec![0u8; WORK_BUFFER];
                        let mut calls = Vec::with_capacity(chunk.len());
                        for peer in chunk {
                            let Some(endpoint) = peer.endpoint() else {
                                continue;
                            };
                            if let TunnResult::WriteToNetwork(initiation) = self
                                .tunnel_of(peer)
                                .format_handshake_initiation(&mut buffer, false)
                            {
                                calls.push((endpoint, initiation.to_vec()));
                            }
                        }
                        calls
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|worker| worker.join().unwrap_or_default())
                .collect()
        })
    }

    /// Sends `first_calls`, then calls `keys` again every [`CALL_BACK_RETRY`]
    /// until each has a session made after the first calls, within
    /// [`CALL_BACK_BUDGET`]. A retry starts a fresh handshake (the first
    /// one's initiation or answer was lost).
    async fn call_back(
        self: Arc<Self>,
        keys: Vec<[u8; 32]>,
        first_calls: Vec<(SocketAddr, Vec<u8>)>,
    ) {
        let started = Instant::now();
        let started_ms = self.now_ms();
        let segments = self.socket.max_gso_segments();
        let mut out = Outgoing::default();
        for (endpoint, initiation) in &first_calls {
            out.push(*endpoint, initiation, segments);
        }
        drop(first_calls);
        let failed = out.flush(&self.socket).await;
        self.metrics.count_send_failures(failed);
        let mut waiting: Vec<([u8; 32], Instant)> =
            keys.into_iter().map(|key| (key, started)).collect();
        let mut buffer = vec![0u8; WORK_BUFFER];
        while !waiting.is_empty() && started.elapsed() < CALL_BACK_BUDGET {
            tokio::time::sleep(CALL_BACK_CHECK).await;
            // A successor takes over (from its offer on): it calls the
            // peers, not this ingress, which sends no initiation meanwhile.
            // Paused, not ended: a successor that goes away before it
            // serves, or is slow to (`set_stepped_aside(false)`), hands the
            // call-back back.
            if self
                .stepped_aside
                .load(std::sync::atomic::Ordering::Relaxed)
            {
                continue;
            }
            // The peers due a retry are picked under the table's lock and
            // called outside it: an initiation costs two X25519 operations,
            // and with thousands of peers offline, made under the lock they
            // held a peer-set update (the writer) for as long, and every
            // packet's lookup (readers queue behind a waiting writer) with it.
            let mut due = Vec::new();
            {
                let table = self.read_peers();
                waiting.retain_mut(|(key, last_try)| {
                    let Some(peer) = table.by_key(key) else {
                        return false;
                    };
                    // A session since the call-backs began: one of ours
                    // confirmed, or data on one it made with us.
                    if peer.session_made_ms() >= started_ms || peer.data_ms() >= started_ms {
                        return false;
                    }
                    if last_try.elapsed() < CALL_BACK_RETRY {
                        return true;
                    }
                    *last_try = Instant::now();
                    due.push(peer.clone());
                    true
                });
            }
            let mut out = Outgoing::default();
            for (n, peer) in due.iter().enumerate() {
                if let (Some(endpoint), TunnResult::WriteToNetwork(initiation)) = (
                    peer.endpoint(),
                    self.tunnel_of(peer)
                        .format_handshake_initiation(&mut buffer, true),
                ) {
                    // Checked for each: a successor may serve from any
                    // moment on.
                    if self.may_send(initiation) {
                        out.push(endpoint, initiation, segments);
                    }
                }
                // Other tasks on this thread (the receiving loop) get a turn.
                if n % CALL_BACK_YIELD_EVERY == CALL_BACK_YIELD_EVERY - 1 {
                    tokio::task::yield_now().await;
                }
            }
            drop(due);
            let failed = out.flush(&self.socket).await;
            self.metrics.count_send_failures(failed);
        }
        tracing::info!(
            took = ?started.elapsed(),
            unanswered = waiting.len(),
            "WireGuard call-back done"
        );
    }

    /// Sends the active device plane an endpoint snapshot every
    /// [`SNAPSHOT_EVERY`], for the store.
    pub(super) async fn send_snapshots(self: Arc<Self>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(SNAPSHOT_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_sent: Option<Vec<EndpointEntry>> = None;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = shutdown.cancelled() => return,
            }
            let Some(plane) = self.planes.active() else {
                continue;
            };
            let mut endpoints = self.endpoints();
            endpoints.sort_by_key(|entry| entry.public_key);
            // Unchanged endpoints and only newer timestamps: skip a round in
            // five, so the store still learns who was active recently.
            if last_sent
                .as_ref()
                .is_some_and(|sent| same_endpoints(sent, &endpoints))
                && tick_is_skippable(&self.epoch)
            {
                continue;
            }
            for part in EndpointPart::split(self.now_ms(), &endpoints) {
                if let Err(error) = plane.send(&ToDevice::Endpoints(part), &[]).await {
                    tracing::debug!(%error, "could not send an endpoint snapshot");
                    break;
                }
            }
            last_sent = Some(endpoints);
        }
    }
}

fn same_endpoints(a: &[EndpointEntry], b: &[EndpointEntry]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.public_key == y.public_key && x.endpoint == y.endpoint)
}

/// Four rounds in five may be skipped when nothing but timestamps changed.
fn tick_is_skippable(epoch: &Instant) -> bool {
    !(epoch.elapsed().as_secs() / SNAPSHOT_EVERY.as_secs().max(1)).is_multiple_of(5)
}
