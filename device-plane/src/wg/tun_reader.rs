//! The return path of WireGuard clients' packets: what the kernel routes
//! back into the TUN device is read from each of this plane's queues, held
//! to the receiving client's limits, and sent to the ingress in batches
//! addressed by inner destination ([`read_queue`], run by
//! [`super::packets::PacketPath`] for every queue it holds).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use blipless_protocol::channel::{PacketsFrame, MAX_FRAME};
use blipless_protocol::offload::{self, Segments, VnetHeader, HEADER_LEN};
use tokio_seqpacket::UnixSeqpacket;
use tokio_util::sync::CancellationToken;

use super::accounting::{admit, Way};
use super::packets::{PacketCounters, BATCH_PACKETS, MAX_PACKET};
use super::tun::TunQueue;
use crate::clients::Directory;

/// Reads one queue, sending batches to the ingress, until `stop`. Stopping
/// happens only between batches: a packet read is always sent on.
pub(super) async fn read_queue(
    queue: Arc<TunQueue>,
    channel: Arc<Mutex<Option<Arc<UnixSeqpacket>>>>,
    counters: Arc<PacketCounters>,
    directory: Arc<Directory>,
    stop: CancellationToken,
) {
    // A packet to a WireGuard client passes its client's limits, or is dropped.
    let admitted = |packet: &[u8]| {
        let client = blipless_protocol::ip::destination(packet)
            .and_then(|destination| directory.by_address(destination));
        match client {
            Some(client) if !admit(&client, Way::Down, packet.len()) => {
                counters.limited.fetch_add(1, Ordering::Relaxed);
                false
            }
            _ => true,
        }
    };
    // An offload queue's reads start with a virtio-net header, and a TCP
    // super-packet is cut into its segments, each built in the frame to the
    // ingress; a plain queue's packets are read straight into it.
    let offload = queue.offload();
    let mut buffer = if offload {
        vec![0u8; MAX_PACKET + HEADER_LEN]
    } else {
        Vec::new()
    };
    let mut frames = Frames::default();
    // Reads failed in a row.
    let mut failures: u32 = 0;
    let split_one = |read: &mut [u8], frames: &mut Frames| {
        let at = HEADER_LEN.min(read.len());
        let (header, packet) = read.split_at_mut(at);
        let mut into = IntoFrames {
            frames,
            admitted: &admitted,
        };
        let split = VnetHeader::decode(header)
            .and_then(|header| offload::split_into(header, packet, &mut into));
        match split {
            Ok(1) => {}
            Ok(_) => {
                counters.super_reads.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => {
                counters.lost.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%error, "a packet from the TUN device was dropped");
            }
        }
    };
    loop {
        let first = {
            let room = if offload {
                &mut buffer[..]
            } else {
                frames.spare(MAX_PACKET)
            };
            tokio::select! {
                read = queue.recv(room) => read,
                () = stop.cancelled() => break,
            }
        };
        let length = match first {
            Ok(length) => {
                failures = 0;
                length
            }
            Err(error) => {
                // A device gone for good (`ip link del`) fails every read:
                // said at the first failure and at each doubling, and tried
                // again less and less often (up to every 5 s).
                failures += 1;
                if failures.is_power_of_two() {
                    tracing::warn!(%error, failures, "reading the TUN device failed");
                }
                let pause = Duration::from_millis(100)
                    .saturating_mul(failures)
                    .min(Duration::from_secs(5));
                tokio::select! {
                    () = tokio::time::sleep(pause) => continue,
                    () = stop.cancelled() => break,
                }
            }
        };
        let mut read = Some(length);
        let mut reads = 0;
        while let Some(length) = read.take() {
            if offload {
                split_one(&mut buffer[..length], &mut frames);
            } else if admitted(frames.lent(length)) {
                frames.commit(length);
            }
            reads += 1;
            if reads < BATCH_PACKETS {
                let room = if offload {
                    &mut buffer[..]
                } else {
                    frames.spare(MAX_PACKET)
                };
                read = queue.try_recv(room).ok().flatten();
            }
        }
        let batch = frames.take();
        if !batch.is_empty() {
            let sent = send_frames(&channel, &counters, batch).await;
            frames.recycle(sent);
        }
    }
}

/// Room for a round's packets: a frame of the largest size the channel
/// carries, written in place.
const FRAME_BUFFER: usize = MAX_FRAME;
/// Frame buffers a queue's reader keeps for its next rounds.
const SPARE_FRAMES: usize = 4;

/// The frames of one round of reads, each packet written straight into the
/// frame that goes to the ingress (return packets are addressed by their
/// inner destination, so every frame says peer 0).
#[derive(Debug, Default)]
struct Frames {
    done: Vec<PacketsFrame>,
    current: Option<PacketsFrame>,
    free: Vec<Vec<u8>>,
}

impl Frames {
    /// Room for one more packet of at most `room` bytes (at most 65535).
    fn spare(&mut self, room: usize) -> &mut [u8] {
        if !self
            .current
            .as_ref()
            .is_some_and(|frame| frame.has_room(room))
        {
            let buffer = self.free.pop().unwrap_or_else(|| vec![0; FRAME_BUFFER]);
            let full = self.current.replace(PacketsFrame::new(0, buffer));
            self.done.extend(full.filter(|frame| !frame.is_empty()));
        }
        // A fresh frame lends up to 65535 bytes; nothing here asks more.
        match self.current.as_mut().and_then(|frame| frame.spare(room)) {
            Some(spare) => spare,
            None => &mut [],
        }
    }

    /// The first `length` bytes of the last room lent.
    fn lent(&self, length: usize) -> &[u8] {
        self.current
            .as_ref()
            .map_or(&[], |frame| frame.written(length))
    }

    /// Keeps the first `length` bytes of the last room lent as a packet.
    fn commit(&mut self, length: usize) {
        if let Some(frame) = &mut self.current {
            frame.commit(length);
        }
    }

    /// Adds a packet (a copy: a segment cut from a super-packet).
    fn push(&mut self, packet: &[u8]) {
        let spare = self.spare(packet.len());
        if let Some(room) = spare.get_mut(..packet.len()) {
            room.copy_from_slice(packet);
            self.commit(packet.len());
        }
    }

    /// The round's frames with packets, in order.
    fn take(&mut self) -> Vec<PacketsFrame> {
        let mut frames = std::mem::take(&mut self.done);
        if self.current.as_ref().is_some_and(|frame| !frame.is_empty()) {
            frames.extend(self.current.take());
        }
        frames
    }

    /// Keeps buffers of sent frames for the next rounds.
    fn recycle(&mut self, buffers: Vec<Vec<u8>>) {
        let room = SPARE_FRAMES.saturating_sub(self.free.len());
        self.free.extend(buffers.into_iter().take(room));
    }
}

/// What an offload queue's read is cut into: each segment built straight in
/// the frame to the ingress, and kept if its client's limit admits it.
struct IntoFrames<'f, A> {
    frames: &'f mut Frames,
    admitted: &'f A,
}

impl<A: Fn(&[u8]) -> bool> Segments for IntoFrames<'_, A> {
    fn whole(&mut self, packet: &[u8]) {
        if (self.admitted)(packet) {
            self.frames.push(packet);
        }
    }

    fn room(&mut self, len: usize) -> Option<&mut [u8]> {
        Some(self.frames.spare(len))
    }

    fn built(&mut self, len: usize) {
        if (self.admitted)(self.frames.lent(len)) {
            self.frames.commit(len);
        }
    }
}

/// Sends a round's frames to the ingress; gives back their buffers.
async fn send_frames(
    channel: &Mutex<Option<Arc<UnixSeqpacket>>>,
    counters: &PacketCounters,
    frames: Vec<PacketsFrame>,
) -> Vec<Vec<u8>> {
    let socket = channel
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let mut buffers = Vec::with_capacity(frames.len());
    for mut frame in frames {
        let count = frame.len() as u64;
        let Some(socket) = &socket else {
            counters.lost.fetch_add(count, Ordering::Relaxed);
            buffers.push(frame.into_buffer());
            continue;
        };
        match blipless_link::send_encoded(socket, frame.finish(), "Packets", &[]).await {
            Ok(()) => counters.from_tun.fetch_add(count, Ordering::Relaxed),
            Err(error) => {
                tracing::debug!(%error, "sending packets to the ingress failed");
                counters.lost.fetch_add(count, Ordering::Relaxed)
            }
        };
        buffers.push(frame.into_buffer());
    }
    buffers
}

#[cfg(test)]
mod tests {
    use super::*;
    use blipless_protocol::channel::{decode, ToIngress};

    fn packets_of(frame: &mut PacketsFrame) -> Vec<Vec<u8>> {
        let (message, _) = decode::<ToIngress>(frame.finish()).expect("decodes");
        let ToIngress::Packets(batch) = message else {
            panic!("{message:?}");
        };
        batch.iter().map(<[u8]>::to_vec).collect()
    }

    #[test]
    fn packets_read_in_place_or_copied_arrive_in_order() {
        let mut frames = Frames::default();
        // Read in place: the reader writes into the room, looks, keeps.
        frames.spare(MAX_PACKET)[..40].fill(1);
        assert_eq!(frames.lent(40), &[1; 40][..]);
        frames.commit(40);
        // Looked at and not kept (a client over its limit).
        frames.spare(MAX_PACKET)[..40].fill(9);
        frames.push(&[2; 1400]);
        let mut taken = frames.take();
        assert_eq!(taken.len(), 1);
        assert_eq!(packets_of(&mut taken[0]), vec![vec![1; 40], vec![2; 1400]]);
        assert!(frames.take().is_empty(), "taken once");
    }

    #[test]
    fn a_round_larger_than_a_frame_fills_several_and_buffers_come_back() {
        let mut frames = Frames::default();
        for i in 0..200u8 {
            frames.spare(MAX_PACKET)[..1400].fill(i);
            frames.commit(1400);
        }
        let mut taken = frames.take();
        assert!(
            taken.len() >= 2,
            "200 packets of 1400 bytes need more than one frame"
        );
        let all: Vec<Vec<u8>> = taken.iter_mut().flat_map(packets_of).collect();
        assert_eq!(all.len(), 200);
        assert!(all
            .iter()
            .enumerate()
            .all(|(i, p)| p[0] == i as u8 && p.len() == 1400));
        let buffers: Vec<Vec<u8>> = taken.into_iter().map(PacketsFrame::into_buffer).collect();
        let sent = buffers.len();
        frames.recycle(buffers);
        assert_eq!(
            frames.free.len(),
            sent.min(SPARE_FRAMES),
            "kept, up to a bound"
        );
        frames.recycle(vec![vec![0; FRAME_BUFFER]; 10]);
        assert_eq!(frames.free.len(), SPARE_FRAMES, "never more than the bound");
    }
}
