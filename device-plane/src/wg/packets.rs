//! The packet egress of WireGuard clients' inner packets ([`PacketPath`]):
//! inner packets from the ingress are checked against the egress policy
//! (default deny, as for the proxies; a refused packet is dropped and counted)
//! and written to the TUN device; the kernel forwards and masquerades them
//! (`blipless-ctl net setup`). What the kernel routes back into the TUN device
//! is read from this plane's queues and sent to the ingress in batches
//! ([`super::tun_reader`]),
//! addressed by inner destination. NAT state lives in the kernel, so the plane
//! holds no per-flow state. At a deploy the queues themselves move: the old
//! plane stops reading them and sends their fds (SCM_RIGHTS, through the
//! ingress) to the successor, which reads on. A queue is never detached or
//! closed in between, so nothing the kernel queued on it is dropped (closing or
//! detaching a TUN queue purges it). Each packet is metered to its client and
//! held to the client's limits ([`super::accounting`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use blipless_protocol::channel::{Packets, ToIngress};
use blipless_protocol::offload::{Coalescer, Write};
use tokio_seqpacket::UnixSeqpacket;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::accounting::{admit, Way};
use super::tun::TunQueue;
use crate::clients::Directory;
use crate::egress::Egress;

/// Largest inner packet read from the TUN device.
pub(super) const MAX_PACKET: usize = 65_535;
/// Packets read from a queue before a batch goes out even if more are waiting.
pub(super) const BATCH_PACKETS: usize = 256;
/// How long the readers may take to stop before the queues are handed over.
const DRAIN_WAIT: Duration = Duration::from_secs(2);

/// Counters of the packet path.
#[derive(Debug, Default)]
pub struct PacketCounters {
    /// Inner packets written to the TUN device.
    pub to_tun: AtomicU64,
    /// Inner packets read from the TUN device and sent to the ingress.
    pub from_tun: AtomicU64,
    /// Inner packets refused by the egress policy.
    pub denied: AtomicU64,
    /// Inner packets lost: no TUN device, no channel, or a write error.
    pub lost: AtomicU64,
    /// Inner packets dropped by their client's rate limit or quota.
    pub limited: AtomicU64,
    /// TCP super-packets read from an offload queue and cut into segments.
    pub super_reads: AtomicU64,
    /// Writes of joined TCP segments into an offload queue.
    pub joined_writes: AtomicU64,
}

/// Inner packets from the ingress held while this plane has no TUN queue yet
/// (a successor between Activate and its predecessor's queues arriving).
const PENDING_LIMIT: usize = 4096;
/// And their bytes (the ingress caps its own held packets the same way): a
/// packet may be 64 KiB, and 4,096 of them from one client would hold
/// 256 MiB, for good if no queue ever came.
const PENDING_BYTES: usize = PENDING_LIMIT * 2048;

/// The packets parked while no queue is held, and their bytes.
#[derive(Debug, Default)]
struct Parked {
    packets: Vec<Vec<u8>>,
    bytes: usize,
}
/// How long an activated successor waits for its predecessor's queues before
/// it attaches queues of its own.
const INHERIT_WAIT: Duration = Duration::from_secs(2);

impl PacketCounters {
    /// Logs the counters so far (at a handover or a handoff).
    pub fn log(&self) {
        tracing::info!(
            to_tun = self.to_tun.load(Ordering::Relaxed),
            from_tun = self.from_tun.load(Ordering::Relaxed),
            denied = self.denied.load(Ordering::Relaxed),
            lost = self.lost.load(Ordering::Relaxed),
            limited = self.limited.load(Ordering::Relaxed),
            tun_super_reads = self.super_reads.load(Ordering::Relaxed),
            tun_joined_writes = self.joined_writes.load(Ordering::Relaxed),
            "WireGuard packets so far"
        );
    }
}

/// The TUN queues of this plane and the tasks reading them.
pub struct PacketPath {
    device: String,
    /// A successor: its queues come from its predecessor.
    inherit: bool,
    queue_count: usize,
    /// `egress.tun.offload`: the first queue asks for virtio-net headers.
    offload: bool,
    queues: Mutex<Vec<Arc<TunQueue>>>,
    readers: Mutex<(TaskTracker, CancellationToken)>,
    channel: Arc<Mutex<Option<Arc<UnixSeqpacket>>>>,
    /// Packets parked until the first queues come; the lock is held while
    /// they are written, so that no later packet overtakes them.
    pending: Arc<tokio::sync::Mutex<Parked>>,
    /// Whether `pending` may hold packets: each batch written checks it
    /// (one atomic load) and writes them first.
    parked: Arc<AtomicBool>,
    /// Whether queues were ever held: only a successor that has not had its
    /// first queues yet parks packets in `pending`; any other plane without
    /// queues (handed over, or the device unusable) counts them as lost.
    held_queues: std::sync::atomic::AtomicBool,
    egress: Egress,
    /// The clients, for each packet's accounting.
    directory: Arc<Directory>,
    /// The WireGuard exits, run by whichever plane holds the queues.
    exits: Mutex<Option<Arc<super::exits::Exits>>>,
    /// Answers clients' DNS queries to the node's tunnel address.
    dns: Option<Arc<super::dns::DnsGateway>>,
    /// What happened to packets so far.
    pub counters: Arc<PacketCounters>,
}

impl std::fmt::Debug for PacketPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PacketPath")
            .field("device", &self.device)
            .field("queues", &self.lock_queues().len())
            .finish_non_exhaustive()
    }
}

impl PacketPath {
    /// The packet path of a plane. The first plane (`inherit` false) attaches
    /// `queues` queues of the TUN device `device` now; a successor (`inherit`
    /// true) gets its predecessor's queues at handover ([`PacketPath::adopt`]),
    /// so no queue is ever closed under the kernel's feet, and attaches its own
    /// only if none arrive ([`PacketPath::expect_inherited`]). When the device
    /// cannot be used (not set up, no CAP_NET_ADMIN) the plane still serves the
    /// proxies: the reason is logged and WireGuard packets are counted as lost.
    /// `offload`: attach asking for TCP offload ([`super::tun`]).
    pub fn new(
        device: &str,
        queues: usize,
        offload: bool,
        egress: Egress,
        directory: Arc<Directory>,
        inherit: bool,
    ) -> Self {
        let path = Self {
            directory,
            device: device.to_owned(),
            inherit,
            queue_count: queues,
            offload,
            queues: Mutex::new(Vec::new()),
            readers: Mutex::new((TaskTracker::new(), CancellationToken::new())),
            channel: Arc::new(Mutex::new(None)),
            pending: Arc::default(),
            parked: Arc::default(),
            held_queues: std::sync::atomic::AtomicBool::new(false),
            egress,
            exits: Mutex::new(None),
            dns: None,
            counters: Arc::default(),
        };
        if !inherit {
            path.open_queues();
        }
        path
    }

    /// Gives the path the exits to run, starting them now if it holds
    /// queues or is a first plane (one with no predecessor to hand exits
    /// over). A successor starts them when its queues come, or when it gives
    /// up waiting for them ([`Self::expect_inherited`]). Exits carry
    /// proxied streams too, so they run whether or not the client TUN
    /// device could be attached.
    pub fn set_exits(&self, exits: Arc<super::exits::Exits>) {
        if self.has_queues() || !self.inherit {
            exits.start();
        }
        *self
            .exits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(exits);
    }

    /// Keeps a WireGuard exit's descriptors the predecessor handed over.
    pub fn adopt_exit(
        &self,
        message: &blipless_protocol::channel::ExitQueues,
        fds: Vec<std::os::fd::OwnedFd>,
    ) {
        match self.exits() {
            Some(exits) => exits.adopt(message, fds),
            None => {
                tracing::warn!(exit = %message.exit, "exit descriptors before the exits exist: closed")
            }
        }
    }

    fn exits(&self) -> Option<Arc<super::exits::Exits>> {
        self.exits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn lock_queues(&self) -> std::sync::MutexGuard<'_, Vec<Arc<TunQueue>>> {
        self.queues
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn open_queues(&self) {
        match super::tun::attach_queues(&self.device, self.queue_count, self.offload) {
            Ok(opened) => {
                let offload = opened.first().is_some_and(|queue| queue.offload());
                tracing::info!(device = %self.device, queues = opened.len(), offload, "TUN queues attached: WireGuard egress ready");
                self.install(opened);
            }
            Err(error) => {
                tracing::warn!(device = %self.device, "WireGuard egress unavailable, packets from WireGuard clients are dropped: {error}");
            }
        }
    }

    /// Starts reading `added` beside any queues already held, then writes the
    /// packets that waited for a queue.
    fn install(&self, added: Vec<TunQueue>) {
        let added: Vec<Arc<TunQueue>> = added.into_iter().map(Arc::new).collect();
        let (tracker, stop) = {
            let mut readers = self
                .readers
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if readers.1.is_cancelled() {
                *readers = (TaskTracker::new(), CancellationToken::new());
            }
            readers.clone()
        };
        for queue in &added {
            tracker.spawn(super::tun_reader::read_queue(
                queue.clone(),
                self.channel.clone(),
                self.counters.clone(),
                self.directory.clone(),
                stop.clone(),
            ));
        }
        let first = added.first().cloned();
        let holds = !added.is_empty();
        if holds {
            self.held_queues.store(true, Ordering::Relaxed);
        }
        self.lock_queues().extend(added);
        if let (true, Some(exits)) = (holds, self.exits()) {
            exits.start();
        }
        if let (Some(queue), true) = (first, self.parked.load(Ordering::Acquire)) {
            let (pending, parked) = (self.pending.clone(), self.parked.clone());
            let counters = self.counters.clone();
            tokio::spawn(async move {
                write_parked(&queue, &pending, &parked, &counters).await;
            });
        }
    }

    /// Takes over queues a predecessor handed over (their fds).
    pub fn adopt(&self, fds: Vec<std::os::fd::OwnedFd>) {
        let mut adopted = Vec::new();
        for fd in fds {
            match TunQueue::adopt(fd, &self.device) {
                Ok(queue) => adopted.push(queue),
                Err(error) => tracing::warn!(%error, "refusing a handed-over TUN queue"),
            }
        }
        tracing::info!(
            queues = adopted.len(),
            offload = adopted.first().is_some_and(|queue| queue.offload()),
            "TUN queues inherited from the predecessor"
        );
        self.install(adopted);
    }

    /// After Activate as a successor: attaches queues of our own unless the
    /// predecessor's arrive within [`INHERIT_WAIT`] (it may have died). A
    /// first plane has tried at start already: nothing to do.
    pub fn expect_inherited(self: &Arc<Self>) {
        if !self.inherit {
            return;
        }
        let path = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(INHERIT_WAIT).await;
            if !path.has_queues() {
                tracing::warn!("no TUN queues came from a predecessor: attaching our own");
                path.open_queues();
                // Attached or not, the exits run (install started them if
                // it could attach): they carry proxied streams too.
                if let Some(exits) = path.exits() {
                    exits.start();
                }
            }
        });
    }

    /// True when TUN queues are held.
    pub fn has_queues(&self) -> bool {
        !self.lock_queues().is_empty()
    }

    /// Sets (or clears) the channel packets from the TUN device go to.
    pub fn set_channel(&self, channel: Option<Arc<UnixSeqpacket>>) {
        *self
            .channel
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = channel;
    }

    /// Writes a batch from the ingress to the TUN device, packet by packet,
    /// after the egress policy. With no queue yet, packets wait (bounded).
    pub async fn to_tun(&self, batch: &Packets<'_>) {
        let queue = {
            let queues = self.lock_queues();
            if queues.is_empty() {
                None
            } else {
                Some(queues[batch.peer() as usize % queues.len()].clone())
            }
        };
        // One batch is one peer's: the ingress checked every packet's source
        // is that peer's tunnel address. The first whose source names a
        // client says whose (a packet without a source, or with one this
        // plane does not map, such as an IPv6 twin where this plane has no
        // wireguard.pool6, must not leave the rest of the batch unmetered).
        let client = batch
            .iter()
            .filter_map(blipless_protocol::ip::source)
            .find_map(|source| self.directory.by_address(source));
        // IPv6 is not steered into WireGuard exits (their steering map is
        // IPv4): a client that must not leave directly has its IPv6
        // refused rather than sent out of the node (docs/WIREGUARD.md, "IPv6").
        let ipv6_leaves = client
            .as_ref()
            .is_some_and(|client| self.egress.routes.leaves_directly(&client.record.egress));
        // IPv4 of a client that must leave through an exit goes only once the
        // steering map holds it: without its element the kernel would send
        // it out of the node's own address (`Exits::admits`). A batch of no
        // client this plane knows (one just removed here, its peer not yet
        // gone from the ingress) does not leave at all: it would leave
        // unmetered, and past an exits-only policy.
        let ipv4_leaves = client.as_ref().is_some_and(|client| {
            self.exits()
                .is_none_or(|exits| exits.admits(&client.record.egress, client.record.wg_address))
        });
        // Packets parked before the first queues go first (a successor's
        // first batches): written here if the task `install` started has
        // not written them yet, waited for if it is writing them.
        if let (Some(queue), true) = (&queue, self.parked.load(Ordering::Acquire)) {
            write_parked(queue, &self.pending, &self.parked, &self.counters).await;
        }
        // An offload queue takes a flow's consecutive TCP segments as one
        // super-packet: they are joined here and written after the batch.
        let mut coalescer = queue
            .as_ref()
            .filter(|queue| queue.offload())
            .map(|_| Coalescer::new());
        let mut joined = Vec::new();
        for packet in batch.iter() {
            if let Some((dns, query)) = self
                .dns
                .as_ref()
                .and_then(|dns| Some((dns, dns.query(packet)?)))
            {
                // A query of no client this plane knows (one removed here,
                // its peer not yet gone from the ingress) is not answered:
                // the answer would be unmetered, like its other packets.
                let Some(asking) = &client else {
                    self.counters.denied.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                if !admit(asking, Way::Up, packet.len()) {
                    self.counters.limited.fetch_add(1, Ordering::Relaxed);
                } else {
                    // The answer comes down to the client: its download
                    // limits and usage, as any packet to it.
                    let (answered, counters) = (client.clone(), self.counters.clone());
                    dns.answer(&query, self.channel.clone(), move |size| {
                        let refused = answered
                            .as_ref()
                            .is_some_and(|client| !admit(client, Way::Down, size));
                        if refused {
                            counters.limited.fetch_add(1, Ordering::Relaxed);
                        }
                        !refused
                    });
                }
                continue;
            }
            // Only a client this plane knows reaches the gateway over TCP.
            let to_dns_over_tcp = client.is_some()
                && self
                    .dns
                    .as_ref()
                    .is_some_and(|dns| dns.carries_tcp_query(packet));
            // An ICMP error about another client's flow would pass the
            // node's connection tracking as related to that flow.
            let permitted = to_dns_over_tcp
                || blipless_protocol::ip::destination(packet).is_some_and(|destination| {
                    let family_leaves = if destination.is_ipv4() {
                        ipv4_leaves
                    } else {
                        ipv6_leaves
                    };
                    self.egress.permits(destination)
                        && family_leaves
                        && !blipless_protocol::ip::icmp_error_about_another(packet)
                });
            if !permitted {
                self.counters.denied.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if let Some(client) = &client {
                if !admit(client, Way::Up, packet.len()) {
                    self.counters.limited.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            }
            match (&queue, &mut coalescer) {
                (Some(_), Some(coalescer)) => coalescer.push(packet, &mut joined),
                (Some(queue), None) => write_packet(queue, packet, &self.counters).await,
                (None, _) => {
                    let mut pending = self.pending.lock().await;
                    let parks = self.inherit && !self.held_queues.load(Ordering::Relaxed);
                    if parks
                        && pending.packets.len() < PENDING_LIMIT
                        && pending.bytes + packet.len() <= PENDING_BYTES
                    {
                        pending.bytes += packet.len();
                        pending.packets.push(packet.to_vec());
                        self.parked.store(true, Ordering::Release);
                    } else {
                        self.counters.lost.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        if let (Some(queue), Some(mut coalescer)) = (&queue, coalescer) {
            coalescer.finish(&mut joined);
            for write in &joined {
                write_joined(queue, write, &self.counters).await;
            }
        }
    }

    /// Hands this plane's queues to the successor: stops reading them (a
    /// packet already read is sent on first), then sends their fds to the
    /// ingress, which passes them to the active plane. The queues stay
    /// attached throughout, so the kernel drops nothing queued on them. With
    /// no channel to send them on, they are closed (the kernel then steers to
    /// the other queues).
    pub async fn hand_over(&self) {
        // The successor runs the exits from the moment it has the queues:
        // their descriptors go first, on the same channel (after, in tests
        // of a late arrival).
        let late_exits = crate::fault::late_exit_handover();
        if late_exits.is_none() {
            self.hand_exits_over().await;
        }
        self.hand_queues_over().await;
        if let Some(delay) = late_exits {
            tokio::time::sleep(delay).await;
            self.hand_exits_over().await;
        }
    }

    async fn hand_exits_over(&self) {
        if let Some(exits) = self.exits() {
            let channel = self
                .channel
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
            exits.hand_over(channel.as_deref()).await;
        }
    }

    async fn hand_queues_over(&self) {
        let (tracker, stop) = self
            .readers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        stop.cancel();
        tracker.close();
        if tokio::time::timeout(DRAIN_WAIT, tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!("TUN readers did not stop in time");
        }
        let queues = std::mem::take(&mut *self.lock_queues());
        if queues.is_empty() {
            return;
        }
        let channel = self
            .channel
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let fds: Vec<std::os::fd::BorrowedFd<'_>> = queues.iter().map(|q| q.as_fd()).collect();
        let sent = match &channel {
            Some(socket) => {
                let message = ToIngress::TunQueues(fds.len().min(usize::from(u8::MAX)) as u8);
                blipless_link::send(socket, &message, &fds).await
            }
            None => Err(blipless_link::LinkError::Io(
                std::io::ErrorKind::NotConnected.into(),
            )),
        };
        match sent {
            Ok(()) => {
                tracing::info!(queues = queues.len(), "TUN queues handed to the successor");
                self.counters.log();
            }
            Err(error) => {
                tracing::warn!(%error, "could not hand the TUN queues over; closing them")
            }
        }
    }

    /// Answers clients' DNS queries to `gateway`'s address from now on.
    pub fn with_dns(mut self, gateway: Option<Arc<super::dns::DnsGateway>>) -> Self {
        self.dns = gateway;
        self
    }

    /// Waits (bounded) for the DNS queries being resolved to be answered:
    /// a draining plane's last work before it exits.
    pub async fn finish_dns(&self) {
        if let Some(dns) = &self.dns {
            dns.drain(super::dns::DRAIN_WAIT).await;
        }
    }

    /// Serving again (re-activated after a failed successor): attaches fresh
    /// queues if this plane gave its own away.
    pub fn resume(&self) {
        if !self.has_queues() {
            self.open_queues();
        }
    }
}

/// Writes the packets parked in `pending` to `queue`, holding its lock
/// throughout: whoever comes next (the writer with a batch, or the task
/// [`PacketPath::install`] started) waits, and writes after them.
async fn write_parked(
    queue: &TunQueue,
    pending: &tokio::sync::Mutex<Parked>,
    parked: &AtomicBool,
    counters: &PacketCounters,
) {
    let mut pending = pending.lock().await;
    pending.bytes = 0;
    for packet in std::mem::take(&mut pending.packets) {
        write_packet(queue, &packet, counters).await;
    }
    parked.store(false, Ordering::Release);
}

async fn write_joined(queue: &TunQueue, write: &Write<'_>, counters: &PacketCounters) {
    let (first, rest) = write.parts();
    let sent = queue.send_gathered(&write.header(), first, rest).await;
    if sent.is_ok() && write.segments() > 1 {
        counters.joined_writes.fetch_add(1, Ordering::Relaxed);
    }
    count_written(sent, write.segments() as u64, counters);
}

async fn write_packet(queue: &TunQueue, packet: &[u8], counters: &PacketCounters) {
    count_written(queue.send(packet).await, 1, counters);
}

/// Counts `packets` written to the TUN device, or lost with the write.
fn count_written(sent: std::io::Result<()>, packets: u64, counters: &PacketCounters) {
    match sent {
        Ok(()) => {
            counters.to_tun.fetch_add(packets, Ordering::Relaxed);
        }
        Err(error) => {
            counters.lost.fetch_add(packets, Ordering::Relaxed);
            tracing::debug!(%error, "writing to the TUN device failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};

    /// A directory of one client, alice, at 10.64.0.5 (and no IPv6 pool),
    /// and the store it came from (kept alive with its folder).
    async fn alice_at_10_64_0_5() -> (Arc<Directory>, tempfile::TempDir) {
        let folder = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}/state.db", folder.path().display());
        let store = blipless_store::open(&url).await.expect("store");
        let mut alice = blipless_store::testing::client_record("alice");
        alice.wg_address = Some(IpAddr::V4(Ipv4Addr::new(10, 64, 0, 5)));
        store.add_client(alice).await.expect("add");
        (Directory::load(store).await.expect("directory"), folder)
    }

    /// A successor's path before its queues come: what passes is parked.
    fn path(directory: Arc<Directory>) -> PacketPath {
        let egress = Egress::new(Vec::new(), std::time::Duration::from_secs(1));
        PacketPath::new("blip-none", 1, false, egress, directory, true)
    }

    fn udp4(source: [u8; 4]) -> Vec<u8> {
        let mut packet = vec![0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0];
        packet.extend_from_slice(&source);
        packet.extend_from_slice(&[1, 1, 1, 1]);
        packet.extend_from_slice(&[0x30, 0x39, 0, 53, 0, 8, 0, 0]);
        packet
    }

    /// An IPv6 packet with no payload, from `fd00:64::5` (a twin this plane
    /// cannot map: it has no wireguard.pool6).
    fn ipv6_from_an_unmapped_twin() -> Vec<u8> {
        let mut packet = vec![0x60, 0, 0, 0, 0, 0, 59, 64];
        packet.extend_from_slice(&[0xfd, 0, 0, 0x64, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5]);
        packet.extend_from_slice(&[
            0x26, 0x06, 0x47, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x11, 0x11,
        ]);
        packet
    }

    /// A batch whose first packet's source names no client still belongs
    /// to the client a later one names: before, the whole batch was
    /// nobody's, and its IPv4 left unmetered (and past an exits-only
    /// policy).
    #[tokio::test]
    async fn a_batch_is_charged_to_the_client_any_of_its_sources_names() {
        let (directory, _folder) = alice_at_10_64_0_5().await;
        let path = path(directory.clone());
        let ipv4 = udp4([10, 64, 0, 5]);
        let mut batch = Packets::new(0);
        assert!(batch.try_push(&ipv6_from_an_unmapped_twin()));
        assert!(batch.try_push(&ipv4));
        path.to_tun(&batch).await;
        let alice = directory.get("alice").expect("alice");
        assert!(
            alice.meter.up.load(Ordering::Relaxed) >= ipv4.len() as u64,
            "the IPv4 packet was charged to alice"
        );
    }

    /// What waits for a successor's first queues is bounded in bytes too,
    /// not only in packets.
    #[tokio::test]
    async fn packets_parked_before_the_first_queues_are_bounded_in_bytes() {
        let (directory, _folder) = alice_at_10_64_0_5().await;
        let path = path(directory);
        let mut big = udp4([10, 64, 0, 5]);
        big.resize(60_000, 0);
        big[2..4].copy_from_slice(&60_000u16.to_be_bytes());
        let mut batch = Packets::new(0);
        assert!(batch.try_push(&big));
        for _ in 0..300 {
            path.to_tun(&batch).await;
        }
        let parked = path.pending.lock().await;
        assert!(
            parked.bytes <= PENDING_BYTES,
            "{} bytes parked",
            parked.bytes
        );
        assert_eq!(
            parked.bytes,
            parked.packets.iter().map(Vec::len).sum::<usize>()
        );
        assert!(
            path.counters.lost.load(Ordering::Relaxed) > 0,
            "the rest counted lost"
        );
    }

    /// An ICMP error alice sends about a packet to another client is
    /// denied; one about her own passes.
    #[tokio::test]
    async fn an_icmp_error_about_another_clients_flow_is_denied() {
        let (directory, _folder) = alice_at_10_64_0_5().await;
        let path = path(directory);
        let unreachable = |quoted_to: [u8; 4]| {
            let mut packet = vec![0x45, 0, 0, 56, 0, 0, 0, 0, 64, 1, 0, 0, 10, 64, 0, 5];
            packet.extend_from_slice(&[1, 1, 1, 1, 3, 3, 0, 0, 0, 0, 0, 0]);
            packet.extend_from_slice(&[0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0, 1, 1, 1, 1]);
            packet.extend_from_slice(&quoted_to);
            packet.extend_from_slice(&[0, 53, 0x30, 0x39, 0, 8, 0, 0]);
            packet
        };
        let mut batch = Packets::new(0);
        assert!(batch.try_push(&unreachable([10, 64, 0, 7])));
        assert!(batch.try_push(&unreachable([10, 64, 0, 5])));
        path.to_tun(&batch).await;
        assert_eq!(path.counters.denied.load(Ordering::Relaxed), 1);
        assert_eq!(path.pending.lock().await.packets.len(), 1, "her own passes");
    }

    /// A DNS query of a client this plane does not know gets no answer from
    /// the gateway: the answer would come down unmetered.
    #[tokio::test]
    async fn a_dns_query_of_no_known_client_is_denied_not_answered() {
        let (directory, _folder) = alice_at_10_64_0_5().await;
        let gateway = std::sync::Arc::new(crate::wg::dns::DnsGateway::new(
            std::net::Ipv4Addr::new(10, 64, 0, 1),
            &["127.0.0.1:9".parse().expect("addr")],
        ));
        let path = path(directory).with_dns(Some(gateway.clone()));
        // A UDP query from 10.64.0.9 (no client) to the gateway's port 53.
        let mut query = vec![0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0];
        query.extend_from_slice(&[10, 64, 0, 9, 10, 64, 0, 1]);
        query.extend_from_slice(&[0x30, 0x39, 0, 53, 0, 8, 0, 0]);
        assert!(gateway.query(&query).is_some(), "a query for the gateway");
        let mut batch = Packets::new(0);
        assert!(batch.try_push(&query));
        path.to_tun(&batch).await;
        assert_eq!(path.counters.denied.load(Ordering::Relaxed), 1);
    }

    /// A batch of a client this plane does not know (one removed here
    /// whose peer the ingress still has) does not leave.
    #[tokio::test]
    async fn a_batch_of_no_known_client_is_denied() {
        let (directory, _folder) = alice_at_10_64_0_5().await;
        let path = path(directory);
        let mut batch = Packets::new(0);
        assert!(batch.try_push(&udp4([10, 64, 0, 9])));
        path.to_tun(&batch).await;
        assert_eq!(path.counters.denied.load(Ordering::Relaxed), 1);
        assert!(
            path.pending.lock().await.packets.is_empty(),
            "nothing parked to leave"
        );
    }
}
