//! The TUN writer: inner packets from the ingress are written to the TUN
//! device by a task of their own, so that the channel reader never waits on a
//! TUN write and control messages (Drain, Accepted, Migrate) never queue
//! behind bulk packets.
//!
//! Between the reader and the writer is a queue bounded by bytes
//! ([`QUEUE_BYTES`], 16 MiB: a burst of thousands of packets, such as what
//! the ingress held while no plane was active, fits whole). Past it (the TUN
//! device slower than the ingress sends, for long), a batch is dropped and
//! its packets counted as lost, as a router's full egress queue drops: the
//! inner protocols (TCP, QUIC) recover, and nothing else stalls.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use blipless_protocol::channel::Packets;
use tokio::sync::{mpsc, Notify};

use super::PacketPath;

/// Bytes of inner packets waiting for the TUN device at most.
pub const QUEUE_BYTES: usize = 16 * 1024 * 1024;

/// Hands batches to the writer task; cheap to clone.
#[derive(Debug, Clone)]
pub struct TunWriter {
    queue: mpsc::UnboundedSender<Packets<'static>>,
    queued: Arc<AtomicUsize>,
    /// Told each time the queue runs empty.
    emptied: Arc<Notify>,
    packets: Arc<PacketPath>,
}

impl TunWriter {
    /// Starts the writer task for `packets`; it ends when every handle is dropped.
    pub fn spawn(packets: Arc<PacketPath>) -> Self {
        let (queue, mut batches) = mpsc::unbounded_channel::<Packets<'static>>();
        let queued = Arc::new(AtomicUsize::new(0));
        let emptied = Arc::new(Notify::new());
        let (path, left, empty) = (packets.clone(), queued.clone(), emptied.clone());
        tokio::spawn(async move {
            while let Some(batch) = batches.recv().await {
                path.to_tun(&batch).await;
                let size = batch.encoded_len();
                if left.fetch_sub(size, Ordering::Relaxed) == size {
                    empty.notify_waiters();
                }
            }
        });
        Self {
            queue,
            queued,
            emptied,
            packets,
        }
    }

    /// Waits until every batch queued so far is written (or dropped), at
    /// most `limit`: before the TUN queues are handed over, so that what
    /// the ingress sent this plane is not left without a queue.
    pub async fn flushed(&self, limit: Duration) {
        let wait = async {
            loop {
                let emptied = self.emptied.notified();
                tokio::pin!(emptied);
                emptied.as_mut().enable();
                if self.queued.load(Ordering::Relaxed) == 0 {
                    return;
                }
                emptied.await;
            }
        };
        if tokio::time::timeout(limit, wait).await.is_err() {
            tracing::warn!(
                bytes = self.queued.load(Ordering::Relaxed),
                "inner packets still queued for the TUN device at the handover: they are lost"
            );
        }
    }

    /// Queues a batch for the TUN device without waiting; past
    /// [`QUEUE_BYTES`] it is dropped (counted as lost).
    pub fn enqueue(&self, batch: Packets<'static>) {
        let size = batch.encoded_len();
        let count = batch.len() as u64;
        let before = self.queued.fetch_add(size, Ordering::Relaxed);
        if before + size > QUEUE_BYTES || self.queue.send(batch).is_err() {
            self.queued.fetch_sub(size, Ordering::Relaxed);
            self.packets
                .counters
                .lost
                .fetch_add(count, Ordering::Relaxed);
        }
    }
}
