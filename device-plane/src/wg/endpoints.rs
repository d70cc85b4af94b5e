//! WireGuard endpoint snapshots: kept for the ingress, handed back after a crash
//! (docs/ARCHITECTURE.md, "Crash recovery and the fd store").
//!
//! The ingress sends the active device plane a snapshot of where its peers are every
//! few seconds, in `Endpoints` parts. [`Assembler`] puts the parts together and
//! [`Snapshots::keep`] hands the whole snapshot to a background writer that saves it
//! with [`Store::put_endpoints`], so the session loop never waits on the store. The
//! writer keeps only the latest snapshot pending: one that arrives while a write is in
//! flight replaces the one waiting, and a failed write is retried by the next snapshot.
//!
//! An ingress that started with no predecessor to hand off from says so in Welcome
//! (`wants_endpoints`). After sending it the WireGuard peer set, the plane answers once
//! per attachment ([`Snapshots::answer`]) with the newest snapshot it knows (the store's
//! or one not yet written), read within [`READ_TIMEOUT`]. No snapshot (none kept, or the
//! store failing) is one empty part, so the ingress knows the answer is "none".

use std::sync::Arc;
use std::time::Duration;

use blipless_config::wireguard_key;
use blipless_protocol::channel::{EndpointEntry, EndpointPart, ToIngress};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_seqpacket::UnixSeqpacket;
use tokio_util::task::AbortOnDropHandle;

use blipless_store::{EndpointSnapshot, NodeId, Store, StoredEndpoint};

/// How long the answer to a fresh ingress may wait for the store.
pub const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// At most one warning a minute while writes keep failing (the others go to debug).
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Puts `Endpoints` parts back together into snapshots.
///
/// A part flagged `start` begins a new snapshot (dropping any unfinished one); the part
/// flagged `end` completes it. Parts that belong to no snapshot (no start seen, or
/// another `taken_at_ms` than their start's) are dropped, and so is the snapshot they
/// interrupt; the next snapshot comes in a few seconds.
#[derive(Debug, Default)]
pub struct Assembler {
    pending: Option<EndpointSnapshot>,
}

impl Assembler {
    /// Takes one part; returns the snapshot it completes, if any.
    pub fn push(&mut self, part: &EndpointPart) -> Option<EndpointSnapshot> {
        if part.start {
            self.pending = Some(EndpointSnapshot {
                taken_at_ms: part.taken_at_ms,
                peers: Vec::new(),
            });
        }
        let Some(pending) = self.pending.as_mut() else {
            tracing::debug!(
                taken_at_ms = part.taken_at_ms,
                "an endpoint snapshot part without its start; dropped"
            );
            return None;
        };
        if pending.taken_at_ms != part.taken_at_ms {
            tracing::debug!(
                expected = pending.taken_at_ms,
                got = part.taken_at_ms,
                "an endpoint snapshot part of another snapshot; both dropped"
            );
            self.pending = None;
            return None;
        }
        pending.peers.extend(part.entries().iter().map(stored));
        if part.end {
            self.pending.take()
        } else {
            None
        }
    }
}

/// An entry as the store keeps it (the key in base64).
pub fn stored(entry: &EndpointEntry) -> StoredEndpoint {
    StoredEndpoint {
        public_key: wireguard_key::encode(&entry.public_key),
        endpoint: entry.endpoint,
        last_received_ms: entry.last_received_ms,
    }
}

/// A stored snapshot's entries for the channel, and how many were skipped because
/// their key is not 32 bytes of base64.
pub fn entries(snapshot: &EndpointSnapshot) -> (Vec<EndpointEntry>, usize) {
    let entries: Vec<EndpointEntry> = snapshot
        .peers
        .iter()
        .filter_map(|peer| {
            Some(EndpointEntry {
                public_key: wireguard_key::decode(&peer.public_key)?,
                endpoint: peer.endpoint,
                last_received_ms: peer.last_received_ms,
            })
        })
        .collect();
    let skipped = snapshot.peers.len() - entries.len();
    (entries, skipped)
}

/// The parts that answer a fresh ingress: the snapshot's entries, or for no snapshot
/// one empty part (start and end, `taken_at_ms` 0).
pub fn answer_parts(snapshot: Option<&EndpointSnapshot>) -> Vec<EndpointPart> {
    let Some(snapshot) = snapshot else {
        return EndpointPart::split(0, &[]);
    };
    let (entries, skipped) = entries(snapshot);
    if skipped > 0 {
        tracing::warn!(
            skipped,
            "endpoint snapshot: skipped peers whose public key is not 32 bytes of base64"
        );
    }
    EndpointPart::split(snapshot.taken_at_ms, &entries)
}

/// This node's endpoint snapshots: the background writer and the store to read back.
#[derive(Debug)]
pub struct Snapshots {
    store: Arc<dyn Store>,
    node: NodeId,
    /// The latest snapshot given to [`Snapshots::keep`]; the writer follows it.
    latest: watch::Sender<Option<Arc<EndpointSnapshot>>>,
}

impl Snapshots {
    /// Starts the writer for `node` (a task that ends when this is dropped, after the
    /// write in flight and the one pending, if any).
    pub fn new(store: Arc<dyn Store>, node: NodeId) -> Self {
        let (latest, follow) = watch::channel(None);
        tokio::spawn(write(store.clone(), node.clone(), follow));
        Self {
            store,
            node,
            latest,
        }
    }

    /// Has `snapshot` written to the store, replacing any snapshot still waiting for the
    /// writer. Never waits.
    pub fn keep(&self, snapshot: EndpointSnapshot) {
        self.latest.send_replace(Some(Arc::new(snapshot)));
    }

    /// Sends a fresh ingress the newest snapshot known (see the module doc), in parts,
    /// from a task of its own; dropping the handle stops it.
    pub fn answer(&self, socket: Arc<UnixSeqpacket>) -> AbortOnDropHandle<()> {
        let (store, node) = (self.store.clone(), self.node.clone());
        let unwritten = self.latest.borrow().clone();
        AbortOnDropHandle::new(tokio::spawn(async move {
            let snapshot = newest(read(store.as_ref(), &node).await, unwritten);
            let parts = answer_parts(snapshot.as_deref());
            let peers: usize = parts.iter().map(|part| part.entries().len()).sum();
            for part in parts {
                if let Err(error) = crate::link::send(&socket, &ToIngress::Endpoints(part)).await {
                    tracing::warn!(%error, "sending the endpoint snapshot to the ingress failed");
                    return;
                }
            }
            match snapshot {
                Some(snapshot) => tracing::info!(
                    peers,
                    taken_at_ms = snapshot.taken_at_ms,
                    "sent the ingress the last WireGuard endpoint snapshot"
                ),
                None => tracing::info!("no WireGuard endpoint snapshot to send the ingress"),
            }
        }))
    }
}

/// The node's snapshot from the store within [`READ_TIMEOUT`]; None if there is none
/// or the store fails (logged).
async fn read(store: &dyn Store, node: &NodeId) -> Option<Arc<EndpointSnapshot>> {
    match tokio::time::timeout(READ_TIMEOUT, store.get_endpoints(node)).await {
        Ok(Ok(snapshot)) => snapshot.map(Arc::new),
        Ok(Err(error)) => {
            tracing::warn!(%error, "reading the WireGuard endpoint snapshot failed");
            None
        }
        Err(_) => {
            tracing::warn!(
                timeout = ?READ_TIMEOUT,
                "reading the WireGuard endpoint snapshot timed out"
            );
            None
        }
    }
}

/// The later of two snapshots (the stored one on a tie).
fn newest(
    stored: Option<Arc<EndpointSnapshot>>,
    unwritten: Option<Arc<EndpointSnapshot>>,
) -> Option<Arc<EndpointSnapshot>> {
    match (stored, unwritten) {
        (Some(stored), Some(unwritten)) if unwritten.taken_at_ms > stored.taken_at_ms => {
            Some(unwritten)
        }
        (Some(stored), _) => Some(stored),
        (None, unwritten) => unwritten,
    }
}

/// The writer: saves each latest snapshot, one write at a time.
async fn write(
    store: Arc<dyn Store>,
    node: NodeId,
    mut latest: watch::Receiver<Option<Arc<EndpointSnapshot>>>,
) {
    let mut last_warning: Option<Instant> = None;
    let mut failures = 0u64;
    while latest.changed().await.is_ok() {
        let Some(snapshot) = latest.borrow_and_update().clone() else {
            continue;
        };
        let peers = snapshot.peers.len();
        match store.put_endpoints(&node, &snapshot).await {
            Ok(()) => {
                if failures > 0 {
                    tracing::info!(failures, "keeping WireGuard endpoint snapshots works again");
                    failures = 0;
                    last_warning = None;
                }
                tracing::debug!(peers, "WireGuard endpoint snapshot kept");
            }
            Err(error) => {
                failures += 1;
                if last_warning.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
                    last_warning = Some(Instant::now());
                    tracing::warn!(%error, peers, failures, "keeping the WireGuard endpoint snapshot failed; the next one will try again");
                } else {
                    tracing::debug!(%error, peers, failures, "keeping the WireGuard endpoint snapshot failed");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;

    fn entry(n: u8) -> EndpointEntry {
        EndpointEntry {
            public_key: [n; 32],
            endpoint: SocketAddr::from(([192, 0, 2, n], 51_000 + u16::from(n))),
            last_received_ms: 1_000 + u64::from(n),
        }
    }

    fn part(start: bool, end: bool, taken_at_ms: u64, entries: &[EndpointEntry]) -> EndpointPart {
        let mut part = EndpointPart::new(start, end, taken_at_ms);
        for entry in entries {
            assert!(part.try_push(*entry));
        }
        part
    }

    fn snapshot(taken_at_ms: u64, entries: &[EndpointEntry]) -> EndpointSnapshot {
        EndpointSnapshot {
            taken_at_ms,
            peers: entries.iter().map(stored).collect(),
        }
    }

    #[test]
    fn one_part_is_a_whole_snapshot() {
        let mut assembler = Assembler::default();
        assert_eq!(
            assembler.push(&part(true, true, 7, &[entry(1), entry(2)])),
            Some(snapshot(7, &[entry(1), entry(2)]))
        );
        assert_eq!(
            assembler.push(&part(true, true, 8, &[])),
            Some(snapshot(8, &[])),
            "an empty snapshot is a snapshot"
        );
    }

    #[test]
    fn parts_are_put_together_in_order() {
        let mut assembler = Assembler::default();
        assert_eq!(assembler.push(&part(true, false, 5, &[entry(1)])), None);
        assert_eq!(assembler.push(&part(false, false, 5, &[entry(2)])), None);
        assert_eq!(
            assembler.push(&part(false, true, 5, &[entry(3)])),
            Some(snapshot(5, &[entry(1), entry(2), entry(3)]))
        );
        // Done: a stray end without a start completes nothing.
        assert_eq!(assembler.push(&part(false, true, 5, &[entry(4)])), None);
    }

    #[test]
    fn split_parts_reassemble() {
        let many: Vec<EndpointEntry> = (0..=255u8)
            .cycle()
            .take(8_000)
            .enumerate()
            .map(|(i, n)| EndpointEntry {
                last_received_ms: i as u64,
                ..entry(n)
            })
            .collect();
        let parts = EndpointPart::split(42, &many);
        assert!(parts.len() > 1, "more than one frame's worth");
        let mut assembler = Assembler::default();
        let (last, rest) = parts.split_last().expect("parts");
        for part in rest {
            assert_eq!(assembler.push(part), None);
        }
        assert_eq!(assembler.push(last), Some(snapshot(42, &many)));
    }

    #[test]
    fn start_resets() {
        let mut assembler = Assembler::default();
        assert_eq!(assembler.push(&part(true, false, 5, &[entry(1)])), None);
        // The ingress started over (a newer snapshot): the unfinished one is dropped.
        assert_eq!(assembler.push(&part(true, false, 9, &[entry(2)])), None);
        assert_eq!(
            assembler.push(&part(false, true, 9, &[entry(3)])),
            Some(snapshot(9, &[entry(2), entry(3)]))
        );
    }

    #[test]
    fn parts_of_no_snapshot_are_dropped() {
        let mut assembler = Assembler::default();
        // No start seen (attached mid-snapshot).
        assert_eq!(assembler.push(&part(false, false, 5, &[entry(1)])), None);
        assert_eq!(assembler.push(&part(false, true, 5, &[entry(2)])), None);
        // A part of another snapshot drops the one it interrupts, and itself.
        assert_eq!(assembler.push(&part(true, false, 6, &[entry(1)])), None);
        assert_eq!(assembler.push(&part(false, true, 7, &[entry(2)])), None);
        assert_eq!(assembler.push(&part(false, true, 6, &[entry(3)])), None);
        // The next whole one goes through.
        assert_eq!(
            assembler.push(&part(true, true, 8, &[entry(4)])),
            Some(snapshot(8, &[entry(4)]))
        );
    }

    #[test]
    fn answers_skip_bad_keys_and_say_none() {
        let none = answer_parts(None);
        assert_eq!(none.len(), 1);
        assert!(none[0].start && none[0].end && none[0].entries().is_empty());

        let mut kept = snapshot(11, &[entry(1), entry(2)]);
        kept.peers.insert(
            1,
            StoredEndpoint {
                public_key: "not base64!".into(),
                ..kept.peers[0].clone()
            },
        );
        kept.peers.push(StoredEndpoint {
            public_key: wireguard_key::encode(&[3; 32])[..20].to_owned(),
            ..kept.peers[0].clone()
        });
        let (good, skipped) = entries(&kept);
        assert_eq!((good, skipped), (vec![entry(1), entry(2)], 2));
        let parts = answer_parts(Some(&kept));
        assert_eq!(parts.len(), 1);
        assert!(parts[0].start && parts[0].end);
        assert_eq!(parts[0].taken_at_ms, 11);
        assert_eq!(parts[0].entries(), [entry(1), entry(2)]);
    }

    #[test]
    fn the_newest_snapshot_wins() {
        let at = |ms| Some(Arc::new(snapshot(ms, &[])));
        assert_eq!(newest(None, None), None);
        assert_eq!(newest(at(1), None), at(1));
        assert_eq!(newest(None, at(2)), at(2));
        assert_eq!(newest(at(1), at(2)), at(2));
        assert_eq!(newest(at(3), at(2)), at(3));
    }

    async fn sqlite() -> (tempfile::TempDir, Arc<dyn Store>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("state.db").display());
        let store = blipless_store::open(&url).await.expect("store");
        (dir, store)
    }

    fn node() -> NodeId {
        NodeId {
            host: "test".into(),
            block: "0".into(),
        }
    }

    /// Reads every Endpoints part the plane sends until the one flagged end.
    async fn received(socket: &UnixSeqpacket) -> Vec<EndpointPart> {
        let mut buffer = vec![0u8; blipless_protocol::channel::MAX_FRAME];
        let mut parts = Vec::new();
        loop {
            let (message, _) = tokio::time::timeout(
                Duration::from_secs(5),
                blipless_link::receive::<ToIngress>(socket, &mut buffer),
            )
            .await
            .expect("in time")
            .expect("receive")
            .expect("open");
            let ToIngress::Endpoints(part) = message else {
                panic!("unexpected {message:?}");
            };
            let end = part.end;
            parts.push(part);
            if end {
                return parts;
            }
        }
    }

    #[tokio::test]
    async fn kept_snapshots_are_written_and_answered() {
        let (_dir, store) = sqlite().await;
        let snapshots = Snapshots::new(store.clone(), node());
        let (plane, ingress) = UnixSeqpacket::pair().expect("socketpair");
        let plane = Arc::new(plane);

        // Nothing kept yet: one empty part.
        snapshots.answer(plane.clone()).await.expect("answer");
        let parts = received(&ingress).await;
        assert_eq!(parts.len(), 1);
        assert!(parts[0].start && parts[0].entries().is_empty());

        // Several in a row: the last one is what the store ends up with.
        for ms in 1..=5 {
            snapshots.keep(snapshot(ms, &[entry(ms as u8)]));
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let stored = store.get_endpoints(&node()).await.expect("get");
            if stored == Some(snapshot(5, &[entry(5)])) {
                break;
            }
            assert!(Instant::now() < deadline, "not written: {stored:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        snapshots.answer(plane.clone()).await.expect("answer");
        let parts = received(&ingress).await;
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].taken_at_ms, 5);
        assert_eq!(parts[0].entries(), [entry(5)]);
    }
}
