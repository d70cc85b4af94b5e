//! The TUN writer: inner packets from the ingress are written to the TUN
//! device by a task of their own, so that the channel reader never waits on a
//! TUN write and control messages (Drain, Accepted, Migrate) never queue
//! behind bulk packets.
//!
//! Between the reader and the writer is a bounded queue of batches. When it
//! is full (the TUN device is slower than the ingress sends), a batch is
//! dropped and its packets counted as lost, as a router's full egress queue
//! drops: the inner protocols (TCP, QUIC) recover, and nothing else stalls.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use blipless_protocol::channel::Packets;
use tokio::sync::mpsc;

use super::PacketPath;

/// Batches waiting for the TUN device at most.
pub const QUEUE_BATCHES: usize = 1024;

/// Hands batches to the writer task; cheap to clone.
#[derive(Debug, Clone)]
pub struct TunWriter {
    queue: mpsc::Sender<Packets<'static>>,
    packets: Arc<PacketPath>,
}

impl TunWriter {
    /// Starts the writer task for `packets`; it ends when every handle is dropped.
    pub fn spawn(packets: Arc<PacketPath>) -> Self {
        let (queue, mut batches) = mpsc::channel::<Packets<'static>>(QUEUE_BATCHES);
        let path = packets.clone();
        tokio::spawn(async move {
            while let Some(batch) = batches.recv().await {
                path.to_tun(&batch).await;
            }
        });
        Self { queue, packets }
    }

    /// Queues a batch for the TUN device without waiting; a full queue drops
    /// it (counted as lost).
    pub fn enqueue(&self, batch: Packets<'static>) {
        if let Err(refused) = self.queue.try_send(batch) {
            let batch = match refused {
                mpsc::error::TrySendError::Full(batch)
                | mpsc::error::TrySendError::Closed(batch) => batch,
            };
            self.packets
                .counters
                .lost
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
        }
    }
}
