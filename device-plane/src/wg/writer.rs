//! The TUN writer: inner packets from the ingress are written to the TUN
//! device by a task of their own, so that the channel reader never waits on a
//! TUN write and control messages (Drain, Accepted, Migrate) never queue
//! behind bulk packets.
//!
//! The reader hands over each `Packets` frame as it came
//! ([`TunWriter::enqueue_frame`]): a large frame's receive buffer itself,
//! the reader taking a fresh one from a small pool, so its packets are not
//! copied between the channel and the TUN device; a small frame (at most
//! [`COPIED_FRAME`]) is copied, so that what waits holds only its size. The
//! writer decodes the frame again, a walk over its lengths, and writes the
//! packets from where they lie.
//!
//! Between the reader and the writer is a queue bounded by bytes
//! ([`QUEUE_BYTES`], a moved buffer counted whole: a burst of thousands of
//! packets, such as what the ingress held while no plane was active, fits).
//! Past it (the TUN device slower than the ingress sends, for long), a frame
//! is dropped and its packets counted as lost, as a router's full egress
//! queue drops: the inner protocols (TCP, QUIC) recover, and nothing else
//! stalls.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use blipless_protocol::channel::{self, ToDevice, MAX_FRAME};
use tokio::sync::mpsc;

use super::PacketPath;

/// Bytes waiting for the TUN device at most (frames, a moved receive
/// buffer counted whole).
pub const QUEUE_BYTES: usize = 32 * 1024 * 1024;
/// A frame of at most this many bytes is copied rather than moved.
pub const COPIED_FRAME: usize = 32 * 1024;
/// Receive buffers kept for the reader.
const SPARE_BUFFERS: usize = 4;

/// A `Packets` frame on its way to the writer.
#[derive(Debug)]
struct Queued {
    bytes: Vec<u8>,
    len: usize,
    /// What it counts against [`QUEUE_BYTES`].
    charged: usize,
}

/// Hands frames to the writer task; cheap to clone.
#[derive(Debug, Clone)]
pub struct TunWriter {
    queue: mpsc::UnboundedSender<Queued>,
    queued: Arc<AtomicUsize>,
    spare: Arc<Mutex<Vec<Vec<u8>>>>,
    packets: Arc<PacketPath>,
}

impl TunWriter {
    /// Starts the writer task for `packets`; it ends when every handle is dropped.
    pub fn spawn(packets: Arc<PacketPath>) -> Self {
        let (queue, mut frames) = mpsc::unbounded_channel::<Queued>();
        let queued = Arc::new(AtomicUsize::new(0));
        let spare = Arc::new(Mutex::new(Vec::new()));
        let (left, kept, path) = (queued.clone(), spare.clone(), packets.clone());
        tokio::spawn(async move {
            while let Some(frame) = frames.recv().await {
                match channel::decode::<ToDevice>(&frame.bytes[..frame.len]) {
                    Ok((ToDevice::Packets(batch), _)) => path.to_tun(&batch).await,
                    // The reader decoded it as `Packets` before handing it over.
                    _ => tracing::warn!("a frame for the TUN writer did not decode as Packets"),
                }
                left.fetch_sub(frame.charged, Ordering::Relaxed);
                if frame.bytes.len() == MAX_FRAME {
                    let mut kept = lock(&kept);
                    if kept.len() < SPARE_BUFFERS {
                        kept.push(frame.bytes);
                    }
                }
            }
        });
        Self {
            queue,
            queued,
            spare,
            packets,
        }
    }

    /// Queues the `Packets` frame of `len` bytes at the start of `buffer`
    /// (a [`MAX_FRAME`] receive buffer) holding `count` packets, without
    /// waiting: a large frame takes the buffer itself, leaving a fresh one
    /// in its place. Past [`QUEUE_BYTES`] it is dropped (counted as lost).
    pub fn enqueue_frame(&self, buffer: &mut Vec<u8>, len: usize, count: usize) {
        let Some(frame) = buffer.get(..len) else {
            return;
        };
        let queued = if len <= COPIED_FRAME {
            Queued {
                bytes: frame.to_vec(),
                len,
                charged: len,
            }
        } else {
            let fresh = lock(&self.spare)
                .pop()
                .unwrap_or_else(|| vec![0; MAX_FRAME]);
            let bytes = std::mem::replace(buffer, fresh);
            let charged = bytes.len();
            Queued {
                bytes,
                len,
                charged,
            }
        };
        let charged = queued.charged;
        let before = self.queued.fetch_add(charged, Ordering::Relaxed);
        if before + charged > QUEUE_BYTES || self.queue.send(queued).is_err() {
            self.queued.fetch_sub(charged, Ordering::Relaxed);
            self.packets
                .counters
                .lost
                .fetch_add(count as u64, Ordering::Relaxed);
        }
    }
}

fn lock(spare: &Mutex<Vec<Vec<u8>>>) -> std::sync::MutexGuard<'_, Vec<Vec<u8>>> {
    spare
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
