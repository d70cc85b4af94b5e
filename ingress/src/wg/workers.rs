//! Crypto workers: WireGuard's decryption and encryption spread over the
//! cores (`wireguard.workers`, one per core by default), each peer's packets
//! kept in order.
//!
//! - **Worker 0 is the caller itself**: the receiving task decrypts worker
//!   0's share of each batch, and a device link's reader encrypts worker 0's
//!   share of each frame, after handing the other shares on; tasks run
//!   workers 1 and up. One worker (`wireguard.workers = 1`) is one task
//!   doing everything, with no hand-off between threads; each further
//!   worker takes a share to another core. A receive batch with no share
//!   for worker 0 has one idle worker's share (nothing of it queued or under
//!   way: [`Workers::idle`]) decrypted by the receiving task itself, in
//!   order after all that worker did, rather than handed across threads.
//! - **Decryption**: each receive slot holds the datagrams of one source
//!   endpoint (GRO joins only one flow's), and the whole slot, buffer and
//!   all, goes to the worker that endpoint hashes to. A peer sends from one endpoint at a time, so its datagrams are
//!   decrypted, and reach the device plane, in the order they came. (A peer
//!   that roams mid-burst may have its last datagrams from the old endpoint
//!   and its first from the new one decrypted side by side: the network gave
//!   no order between two paths either.)
//! - **Encryption**: a device plane's `Packets` frame is split by inner
//!   destination. Each packet goes to the worker of the peer that owns it (by
//!   the peer's index) as a place in the frame, which the workers share: no
//!   packet is copied on the way.
//! - **Batches**: a worker takes what is queued for it (up to
//!   [`JOBS_PER_ROUND`] jobs) before it sends, so a busy worker sends large
//!   GSO groups and `Packets` messages.
//! - **Buffers** come from a small [`BufferPool`] and go back to it when the
//!   last worker is done with them.
//! - **Stopping** ([`Workers::finish`]): the receiving task stops, then each
//!   worker task finishes what is queued for it and ends.
//!
//! The design: docs/ARCHITECTURE.md, "WireGuard" (its "Crypto workers"
//! item); what it measured: docs/DECISIONS.md, "Crypto workers (issue 13
//! item 7)".

use std::hash::BuildHasher;
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::peers::Peer;
use super::Wireguard;

/// Jobs a worker takes before it sends what they produced.
pub const JOBS_PER_ROUND: usize = 16;
/// Receive batches queued for one worker task before the receiving task waits.
const DECRYPT_DEPTH: usize = 8;
/// Bytes of device-plane frames queued for one worker task; beyond them a
/// frame's share is dropped and counted (`workers_busy`), as a router's full
/// queue drops.
pub const ENCRYPT_QUEUE_BYTES: usize = 4 << 20;
/// A frame whose packets end within this many bytes is copied for the
/// workers (so that it holds its size, not a whole frame buffer, while it
/// waits); a longer one lends its buffer.
pub const COPIED_FRAME: usize = 32 << 10;
/// Buffers a pool keeps for reuse; more are freed.
const POOL_KEEP: usize = 64;

/// Byte buffers of one size, reused.
#[derive(Debug)]
pub struct BufferPool {
    size: usize,
    free: Mutex<Vec<Vec<u8>>>,
}

impl BufferPool {
    /// A pool of `size`-byte buffers.
    pub fn new(size: usize) -> Arc<Self> {
        Arc::new(Self {
            size,
            free: Mutex::new(Vec::new()),
        })
    }

    /// A buffer of the pool's size (zeroed the first time it is made).
    pub fn take(&self) -> Vec<u8> {
        self.lock().pop().unwrap_or_else(|| vec![0u8; self.size])
    }

    /// Gives a buffer back (dropped when the pool is full or the size differs).
    pub fn give(&self, buffer: Vec<u8>) {
        if buffer.len() != self.size {
            return;
        }
        let mut free = self.lock();
        if free.len() < POOL_KEEP {
            free.push(buffer);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Vec<u8>>> {
        self.free
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A buffer that goes back to its pool when dropped.
#[derive(Debug)]
pub struct Pooled {
    bytes: Vec<u8>,
    pool: Option<Arc<BufferPool>>,
}

impl Pooled {
    /// Wraps `bytes` (taken from `pool`) to return there.
    pub fn new(bytes: Vec<u8>, pool: Arc<BufferPool>) -> Self {
        Self {
            bytes,
            pool: Some(pool),
        }
    }

    /// Bytes of no pool, freed when dropped.
    pub fn unpooled(bytes: Vec<u8>) -> Self {
        Self { bytes, pool: None }
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some(pool) = &self.pool {
            pool.give(std::mem::take(&mut self.bytes));
        }
    }
}

/// The datagrams of one receive slot: all from `from`, `len` bytes, cut every
/// `stride` bytes when GRO joined several.
#[derive(Debug)]
pub struct Arrival {
    /// The receive buffer.
    pub buffer: Pooled,
    /// Bytes received into it.
    pub len: usize,
    /// Each datagram's length but the last's (`len` when only one).
    pub stride: usize,
    /// The source endpoint.
    pub from: SocketAddr,
}

impl Arrival {
    /// Each datagram in turn.
    pub fn datagrams(&self) -> impl Iterator<Item = &[u8]> {
        let bytes = self.buffer.bytes();
        bytes[..self.len.min(bytes.len())].chunks(self.stride.max(1))
    }
}

/// Packets of one device-plane frame for one worker: each with the peer it
/// goes to and its place in the shared frame.
#[derive(Debug)]
pub struct Outbound {
    /// The frame the packets are in.
    pub frame: Arc<Pooled>,
    /// Each packet's peer and byte range in `frame`, in the frame's order.
    pub packets: Vec<(Arc<Peer>, Range<usize>)>,
}

/// Packets of a device-plane frame, per worker: each with its peer and its
/// place in the frame.
pub type Routed = Vec<Vec<(Arc<Peer>, Range<usize>)>>;

/// One piece of work for a worker task.
#[derive(Debug)]
enum Job {
    /// Datagrams from the network to decrypt, counted as pending until the
    /// round that takes them has sent what they produced.
    Decrypt(Vec<Arrival>, Pending),
    /// Inner packets from a device plane to encrypt.
    Encrypt(Outbound),
}

/// One decrypt job not yet finished: counted in [`Workers::decrypting`]
/// from its making to its drop, however it ends (done, dropped with a queue,
/// or with a worker that panicked).
#[derive(Debug)]
struct Pending {
    all: Arc<AtomicUsize>,
    worker: Arc<AtomicUsize>,
}

impl Pending {
    /// Counted in `all` and in its worker's own count.
    fn new(all: &Arc<AtomicUsize>, worker: &Arc<AtomicUsize>) -> Self {
        all.fetch_add(1, Ordering::SeqCst);
        worker.fetch_add(1, Ordering::SeqCst);
        Self {
            all: all.clone(),
            worker: worker.clone(),
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.worker.fetch_sub(1, Ordering::SeqCst);
        self.all.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A worker task's queue of return packets, each frame with its bytes' token.
type EncryptQueue = mpsc::UnboundedSender<(Outbound, Queued)>;

/// Bytes of a frame queued for a worker task, counted until dropped.
#[derive(Debug)]
struct Queued(Arc<AtomicUsize>, usize);

impl Queued {
    fn new(counter: &Arc<AtomicUsize>, bytes: usize) -> Self {
        counter.fetch_add(bytes, Ordering::SeqCst);
        Self(counter.clone(), bytes)
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::SeqCst);
    }
}

/// A worker task's two queues: datagrams from the network, and return
/// packets from the device planes.
#[derive(Debug)]
struct Inbox {
    decrypt: mpsc::Receiver<(Vec<Arrival>, Pending)>,
    encrypt: mpsc::UnboundedReceiver<(Outbound, Queued)>,
}

impl Inbox {
    /// The next queued job, return packets first, without waiting.
    fn try_next(&mut self) -> Option<Job> {
        if let Ok((outbound, _queued)) = self.encrypt.try_recv() {
            return Some(Job::Encrypt(outbound));
        }
        let (arrivals, pending) = self.decrypt.try_recv().ok()?;
        Some(Job::Decrypt(arrivals, pending))
    }
}

/// The worker tasks' queues, and what they have not finished.
#[derive(Debug)]
pub struct Workers {
    count: usize,
    /// Decrypt queues of workers 1 and up (worker 0 is the caller's own
    /// share): the receiving task waits while one is full.
    decrypt: Vec<mpsc::Sender<(Vec<Arrival>, Pending)>>,
    /// Encrypt queues of workers 1 and up: a device link's reader never
    /// waits on one (see [`Workers::encrypt`]).
    encrypt: Vec<(EncryptQueue, Arc<AtomicUsize>)>,
    waiting: Mutex<Vec<Inbox>>,
    hasher: std::hash::RandomState,
    /// Decrypt jobs queued or under way (a handoff's departure waits for none).
    decrypting: Arc<AtomicUsize>,
    /// The same, per worker task (1 and up).
    decrypting_in: Vec<Arc<AtomicUsize>>,
    stop: CancellationToken,
}

impl Workers {
    /// `count` workers (at least one): worker 0 done by the callers
    /// themselves, queues for the others, which [`Workers::start`] runs.
    pub fn new(count: usize) -> Self {
        let count = count.max(1);
        let (mut decrypt, mut encrypt, mut waiting) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 1..count {
            let (decrypt_sender, decrypt_receiver) = mpsc::channel(DECRYPT_DEPTH);
            let (encrypt_sender, encrypt_receiver) = mpsc::unbounded_channel();
            decrypt.push(decrypt_sender);
            encrypt.push((encrypt_sender, Arc::new(AtomicUsize::new(0))));
            waiting.push(Inbox {
                decrypt: decrypt_receiver,
                encrypt: encrypt_receiver,
            });
        }
        Self {
            count,
            decrypt,
            encrypt,
            waiting: Mutex::new(waiting),
            hasher: std::hash::RandomState::new(),
            decrypting: Arc::new(AtomicUsize::new(0)),
            decrypting_in: (1..count).map(|_| Arc::new(AtomicUsize::new(0))).collect(),
            stop: CancellationToken::new(),
        }
    }

    /// How many workers there are.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The worker a source endpoint's datagrams go to.
    pub fn for_endpoint(&self, endpoint: SocketAddr) -> usize {
        (self.hasher.hash_one(endpoint) as usize) % self.count
    }

    /// The worker a peer's outgoing packets go to.
    pub fn for_peer(&self, peer: &Peer) -> usize {
        peer.index as usize % self.count
    }

    /// Whether worker task `worker` (1 and up) has no decrypt job queued or
    /// under way: every datagram it was given is decrypted and sent on.
    pub fn idle(&self, worker: usize) -> bool {
        worker
            .checked_sub(1)
            .and_then(|task| self.decrypting_in.get(task))
            .is_some_and(|count| count.load(Ordering::SeqCst) == 0)
    }

    /// Whether decrypt jobs are queued or under way.
    pub fn decrypting(&self) -> bool {
        self.decrypting.load(Ordering::SeqCst) > 0
    }

    /// Queues datagrams for worker task `worker` (1 and up), waiting while
    /// its queue is full: the socket's buffer takes the burst meanwhile.
    /// After [`Workers::finish`] they are dropped.
    pub async fn decrypt(&self, worker: usize, arrivals: Vec<Arrival>) {
        let task = worker.checked_sub(1);
        let Some((queue, count)) = task
            .and_then(|task| self.decrypt.get(task))
            .zip(task.and_then(|task| self.decrypting_in.get(task)))
        else {
            return;
        };
        let pending = Pending::new(&self.decrypting, count);
        // A closed queue (a worker gone) drops the job, and `pending` with it.
        let _ = queue.send((arrivals, pending)).await;
    }

    /// Queues return packets for worker task `worker` (1 and up) without
    /// waiting, `bytes` counting against its [`ENCRYPT_QUEUE_BYTES`]; gives
    /// back how many packets were dropped because its queue was full (or the
    /// ingress is stopping). A device link's reader must
    /// never wait on a worker: a worker may be waiting to send to that
    /// very device plane, whose reader may be waiting on this link.
    pub fn encrypt(&self, worker: usize, outbound: Outbound, bytes: usize) -> usize {
        let Some((queue, queued)) = worker
            .checked_sub(1)
            .and_then(|task| self.encrypt.get(task))
        else {
            return 0;
        };
        if queued.load(Ordering::SeqCst) + bytes > ENCRYPT_QUEUE_BYTES {
            return outbound.packets.len();
        }
        let token = Queued::new(queued, bytes);
        match queue.send((outbound, token)) {
            Ok(()) => 0,
            Err(mpsc::error::SendError((outbound, _))) => outbound.packets.len(),
        }
    }

    /// Starts the workers (once; later calls start none).
    pub fn start(wireguard: &Arc<Wireguard>) -> Vec<JoinHandle<()>> {
        let waiting = std::mem::take(
            &mut *wireguard
                .workers
                .waiting
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        waiting
            .into_iter()
            .zip(1..)
            .map(|(inbox, index)| tokio::spawn(wireguard.clone().run_worker(index, inbox)))
            .collect()
    }

    /// Tells the workers to end once their queues are empty, and waits for them.
    pub async fn finish(&self, handles: Vec<JoinHandle<()>>) {
        self.stop.cancel();
        for handle in handles {
            let _ = handle.await;
        }
    }
}

/// What one worker works with: its buffers, what its round produced, and
/// its job counter. Each worker task has one; so have the receiving task and
/// each device link's reader, for worker 0's share, which they do themselves.
pub struct Lane {
    work: super::Work,
    jobs: Counter,
}

impl std::fmt::Debug for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lane").finish_non_exhaustive()
    }
}

impl Wireguard {
    /// A lane for worker `index`.
    pub fn lane(&self, index: usize) -> Lane {
        Lane {
            work: super::Work::new(),
            jobs: self.metrics.worker_jobs(index),
        }
    }

    /// Decrypts datagrams into `lane`.
    pub(super) fn decrypt(&self, arrivals: &[Arrival], lane: &mut Lane) {
        for arrival in arrivals {
            for datagram in arrival.datagrams() {
                self.handle_datagram(arrival.from, datagram, &mut lane.work);
            }
        }
    }

    /// Encrypts packets of `frame` into `lane`.
    pub(super) fn encrypt_into(
        &self,
        frame: &[u8],
        packets: &[(Arc<Peer>, Range<usize>)],
        lane: &mut Lane,
    ) {
        let work = &mut lane.work;
        self.encrypt(frame, packets, &mut work.replies, &mut work.round);
    }

    /// Sends what a lane's round of `jobs` jobs produced: datagrams to peers,
    /// inner packets to the device plane.
    pub(super) async fn end_round(&self, lane: &mut Lane, jobs: usize) {
        let work = &mut lane.work;
        lane.jobs.inc_by(jobs as u64);
        self.metrics.count_round(&work.round.take());
        let failed = work.replies.flush(&self.socket).await;
        self.metrics.count_send_failures(failed);
        let frames = work.inner.take();
        if !frames.is_empty() {
            let sent = self.to_plane(frames).await;
            lane.work.inner.recycle(sent);
        }
    }

    /// One worker task: takes jobs until told to finish with none left.
    async fn run_worker(self: Arc<Self>, index: usize, mut inbox: Inbox) {
        let mut lane = self.lane(index);
        let mut finished = Vec::new();
        loop {
            let first = tokio::select! {
                biased;
                Some((outbound, _queued)) = inbox.encrypt.recv() => Some(Job::Encrypt(outbound)),
                Some((arrivals, pending)) = inbox.decrypt.recv() => Some(Job::Decrypt(arrivals, pending)),
                () = self.workers.stop.cancelled() => inbox.try_next(),
            };
            let Some(first) = first else {
                return;
            };
            let mut next = Some(first);
            let mut taken = 0;
            while let Some(job) = next.take() {
                match job {
                    Job::Decrypt(arrivals, pending) => {
                        self.decrypt(&arrivals, &mut lane);
                        finished.push(pending);
                    }
                    Job::Encrypt(outbound) => {
                        self.encrypt_into(outbound.frame.bytes(), &outbound.packets, &mut lane);
                    }
                }
                taken += 1;
                if taken < JOBS_PER_ROUND {
                    next = inbox.try_next();
                }
            }
            self.end_round(&mut lane, taken).await;
            // Decrypted and sent on: no longer pending.
            finished.clear();
        }
    }
}

/// Where a buffer lies in memory: kept before the buffer is lent to a
/// decoder, to find where the slices it returns lie in the buffer.
#[derive(Debug, Clone, Copy)]
pub struct Span {
    start: usize,
    len: usize,
}

impl Span {
    /// Where `bytes` lies.
    pub fn of(bytes: &[u8]) -> Self {
        Self {
            start: bytes.as_ptr() as usize,
            len: bytes.len(),
        }
    }

    /// The byte range `part` takes in the buffer, if it is a slice of it.
    pub fn place(&self, part: &[u8]) -> Option<Range<usize>> {
        let start = (part.as_ptr() as usize).checked_sub(self.start)?;
        let end = start.checked_add(part.len())?;
        (end <= self.len).then_some(start..end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slice_is_found_where_it_lies() {
        let whole = vec![7u8; 100];
        let span = Span::of(&whole);
        assert_eq!(span.place(&whole[10..30]), Some(10..30));
        assert_eq!(span.place(&whole[..0]), Some(0..0));
        assert_eq!(span.place(&whole[100..]), Some(100..100));
        // Another allocation never lies inside `whole`.
        let other = vec![7u8; 10];
        assert_eq!(span.place(&other), None);
    }

    #[test]
    fn a_pool_reuses_buffers_of_its_size_only() {
        let pool = BufferPool::new(16);
        let mut first = pool.take();
        first[0] = 9;
        let address = first.as_ptr();
        drop(Pooled::new(first, pool.clone()));
        let again = pool.take();
        assert_eq!(again.as_ptr(), address, "the buffer given back is reused");
        assert_eq!(again.len(), 16);
        pool.give(vec![0u8; 8]);
        assert_eq!(
            pool.take().len(),
            16,
            "a buffer of another size is not kept"
        );
    }

    #[test]
    fn an_arrival_is_cut_at_its_stride() {
        let pool = BufferPool::new(10);
        let mut bytes = pool.take();
        bytes[..7].copy_from_slice(b"aaabbbc");
        let arrival = Arrival {
            buffer: Pooled::new(bytes, pool),
            len: 7,
            stride: 3,
            from: SocketAddr::from(([127, 0, 0, 1], 1)),
        };
        let datagrams: Vec<&[u8]> = arrival.datagrams().collect();
        assert_eq!(datagrams, vec![&b"aaa"[..], b"bbb", b"c"]);
    }

    fn a_peer() -> Arc<Peer> {
        let mut table = super::super::peers::PeerTable::new(0);
        let entry = blipless_protocol::channel::PeerEntry {
            public_key: [7; 32],
            address: std::net::IpAddr::from([10, 64, 0, 2]),
            client: "alice".into(),
        };
        assert!(table.upsert(&entry));
        table.by_key(&[7; 32]).cloned().expect("the peer")
    }

    #[test]
    fn return_packets_never_wait_for_a_busy_worker_they_are_dropped_and_counted() {
        let workers = Workers::new(2);
        let frame = Arc::new(Pooled::unpooled(vec![0u8; 64]));
        let outbound = || Outbound {
            frame: frame.clone(),
            packets: vec![(a_peer(), 0..20), (a_peer(), 20..40)],
        };
        let share = ENCRYPT_QUEUE_BYTES / 4;
        for _ in 0..4 {
            assert_eq!(
                workers.encrypt(1, outbound(), share),
                0,
                "room in the queue"
            );
        }
        // No worker runs here: the queue is full, and the call returns at
        // once with the two packets it could not queue.
        assert_eq!(workers.encrypt(1, outbound(), 1), 2);
        assert_eq!(
            workers.encrypt(0, outbound(), 1),
            0,
            "worker 0 has no queue"
        );
        assert_eq!(workers.encrypt(9, outbound(), 1), 0, "no such worker");
        // Taken from the queue (here: dropped with it), the bytes count no more.
        drop(workers.waiting.lock().expect("lock").pop());
        assert_eq!(workers.encrypt[0].1.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_decrypt_job_is_pending_until_it_is_dropped_however_it_ends() {
        let workers = Workers::new(2);
        assert!(!workers.decrypting());
        assert!(workers.idle(1));
        workers.decrypt(1, Vec::new()).await;
        assert!(workers.decrypting(), "queued: pending");
        assert!(!workers.idle(1), "its worker is not idle");
        assert!(!workers.idle(0), "worker 0 is the caller: never idle here");
        // The worker's inbox goes away with the job in it (as with a
        // worker that panicked): no longer pending.
        drop(workers.waiting.lock().expect("lock").pop());
        assert!(!workers.decrypting());
        assert!(workers.idle(1));
        workers.decrypt(1, Vec::new()).await;
        assert!(
            !workers.decrypting(),
            "a closed queue drops the job at once"
        );
    }

    #[test]
    fn an_endpoint_always_goes_to_the_same_worker_and_endpoints_spread() {
        let workers = Workers::new(4);
        let mut used = std::collections::HashSet::new();
        for port in 1000..1400u16 {
            let endpoint: SocketAddr = ([10, 0, 0, 1], port).into();
            let worker = workers.for_endpoint(endpoint);
            assert_eq!(worker, workers.for_endpoint(endpoint));
            assert!(worker < 4);
            used.insert(worker);
        }
        assert_eq!(used.len(), 4, "400 endpoints use every worker");
        assert_eq!(Workers::new(0).count(), 1, "at least one worker");
        assert!(Workers::new(1).decrypt.is_empty(), "one worker: no task");
    }
}
