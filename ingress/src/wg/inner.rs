//! Inner packets on their way to the device plane: decrypted per peer
//! straight into frames while a round is worked ([`InnerBatches`]), sent to
//! the active plane through [`crate::dispatch`], and held in order, up to
//! `wireguard.queue` packets, while no plane is active ([`Held`]).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use blipless_protocol::channel::PacketsFrame;
use tokio_util::sync::CancellationToken;

use super::Wireguard;
use crate::dispatch::{self, Wait};
use crate::planes::Frame;

/// Room for one peer's packets of a round: a frame written in place,
/// with room for the largest packet after its header.
const FRAME_BUFFER: usize = 64 * 1024 + 64;
/// Frame buffers a lane keeps for its next rounds.
const SPARE_FRAMES: usize = 8;

/// Inner packets waiting for an active device plane, in frames of their
/// own size.
///
/// The frame [`Wireguard::deliver_held`] is sending counts as held until it
/// is sent: a round that finds anything held, or that frame under way,
/// queues behind it rather than overtaking it (a peer's packets keep their
/// order across a plane's absence).
#[derive(Debug, Default)]
pub(super) struct Held {
    frames: VecDeque<PacketsFrame>,
    packets: usize,
    /// What the held frames take, to keep within
    /// [`HELD_BYTES_PER_PACKET`] × `wireguard.queue`.
    bytes: usize,
    /// True while the front frame is out being delivered.
    delivering: bool,
}

/// Bytes held per packet of `wireguard.queue` at most: a WireGuard MTU's
/// packet and its share of the frame, so that a client sending 64 KiB
/// packets cannot make the queue hold 256 MiB (8 MiB at the default 4,096).
const HELD_BYTES_PER_PACKET: usize = 2048;

impl Held {
    /// Whether a round may go straight to the active plane: nothing held
    /// and nothing held under way.
    fn may_send_directly(&self) -> bool {
        self.frames.is_empty() && !self.delivering
    }

    /// Takes the front frame to deliver; it still counts as held until
    /// [`Held::delivered`] or [`Held::not_delivered`].
    fn take_front(&mut self) -> Option<PacketsFrame> {
        let frame = self.frames.pop_front()?;
        self.delivering = true;
        Some(frame)
    }

    /// Holds `frame` at the back if its packets fit within `limit` packets
    /// and [`HELD_BYTES_PER_PACKET`] × `limit` bytes; false (dropped) if not.
    fn push(&mut self, frame: PacketsFrame, limit: usize) -> bool {
        let (count, size) = (frame.len(), frame.size());
        let byte_limit = limit.saturating_mul(HELD_BYTES_PER_PACKET);
        if self.packets + count > limit || self.bytes + size > byte_limit {
            return false;
        }
        self.packets += count;
        self.bytes += size;
        // A frame may wait long, and one packet may sit in a 64 KiB
        // buffer: it waits in one of its own size.
        self.frames.push_back(frame.shrunk());
        true
    }

    /// The frame taken was sent.
    fn delivered(&mut self, count: usize, size: usize) {
        self.packets = self.packets.saturating_sub(count);
        self.bytes = self.bytes.saturating_sub(size);
        self.delivering = false;
    }

    /// The frame taken was not sent: it goes back to the front.
    fn not_delivered(&mut self, frame: PacketsFrame) {
        self.frames.push_front(frame);
        self.delivering = false;
    }
}

/// Inner packets of one round, per peer in the order peers appeared, each
/// decrypted straight into the frame that goes to the device plane
/// ([`PacketsFrame`]): no copy between the decryption and the socket.
///
/// A datagram is decrypted before it is known to be authentic, so a peer
/// that has no frame with room yet is lent the lane's loose frame, which
/// becomes that peer's only when a packet is kept in it: forged datagrams
/// naming many peers cost no frame each.
#[derive(Debug, Default)]
pub(super) struct InnerBatches {
    frames: HashMap<u32, Vec<PacketsFrame>>,
    order: Vec<u32>,
    /// The frame lent to whoever has none with room.
    loose: Option<PacketsFrame>,
    /// Whom the last room was lent to, and whether it was the loose frame's.
    lent: Option<(u32, bool)>,
    /// Buffers of frames sent, at their full length, for the next rounds.
    free: Vec<Vec<u8>>,
}

impl InnerBatches {
    /// Room for one more of `peer`'s packets of at most `room` bytes
    /// (at most 65535; a larger room is cut to that): the place to decrypt
    /// it into, kept with [`InnerBatches::commit`].
    pub(super) fn spare(&mut self, peer: u32, room: usize) -> &mut [u8] {
        let own = self
            .frames
            .get_mut(&peer)
            .and_then(|frames| frames.last_mut())
            .filter(|frame| frame.has_room(room));
        self.lent = Some((peer, own.is_none()));
        let frame = match own {
            Some(frame) => frame,
            None => {
                let free = &mut self.free;
                self.loose.get_or_insert_with(|| {
                    let buffer = free.pop().unwrap_or_else(|| vec![0; FRAME_BUFFER]);
                    PacketsFrame::new(peer, buffer)
                })
            }
        };
        // A fresh frame lends up to 65535 bytes: always some.
        frame.spare(room).unwrap_or(&mut [])
    }

    /// Keeps the first `len` bytes of the last room lent to `peer` by
    /// [`InnerBatches::spare`] as its packet.
    pub(super) fn commit(&mut self, peer: u32, len: usize) -> bool {
        let Some((lent_to, loose)) = self.lent.take() else {
            return false;
        };
        if lent_to != peer {
            return false;
        }
        if !loose {
            return self
                .frames
                .get_mut(&peer)
                .and_then(|frames| frames.last_mut())
                .is_some_and(|frame| frame.commit(len));
        }
        let Some(mut frame) = self.loose.take() else {
            return false;
        };
        if !frame.commit(len) {
            self.loose = Some(frame);
            return false;
        }
        frame.set_peer(peer);
        let order = &mut self.order;
        self.frames
            .entry(peer)
            .or_insert_with(|| {
                order.push(peer);
                Vec::new()
            })
            .push(frame);
        true
    }

    /// The round's frames, in the order their peers appeared.
    pub(super) fn take(&mut self) -> Vec<PacketsFrame> {
        let mut out = Vec::new();
        for peer in self.order.drain(..) {
            out.extend(self.frames.remove(&peer).into_iter().flatten());
        }
        out
    }

    /// Keeps buffers of sent frames for the next rounds.
    pub(super) fn recycle(&mut self, buffers: Vec<Vec<u8>>) {
        let room = SPARE_FRAMES.saturating_sub(self.free.len());
        self.free.extend(
            buffers
                .into_iter()
                .filter(|buffer| buffer.len() == FRAME_BUFFER)
                .take(room),
        );
    }
}

impl Wireguard {
    /// Sends a round's frames to the active plane, or holds them while none
    /// is; gives back the buffers of the frames sent.
    pub(super) async fn to_plane(&self, frames: Vec<PacketsFrame>) -> Vec<Vec<u8>> {
        let mut sent = Vec::new();
        let mut pending: VecDeque<PacketsFrame> = frames.into();
        if self.lock_held().may_send_directly() {
            while let Some(mut frame) = pending.pop_front() {
                if self.send_to_active(&mut frame).await {
                    sent.push(frame.into_buffer());
                } else {
                    pending.push_front(frame);
                    break;
                }
            }
        }
        if !pending.is_empty() {
            self.hold(pending);
        }
        sent
    }

    /// Sends a frame to the active plane; false when none took it.
    async fn send_to_active(&self, frame: &mut PacketsFrame) -> bool {
        let frame = Frame {
            bytes: frame.finish(),
            name: "Packets",
            udp_association: false,
        };
        dispatch::to_active(&self.planes, frame, &[], None, Wait::No)
            .await
            .is_some()
    }

    fn lock_held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn hold(&self, frames: VecDeque<PacketsFrame>) {
        let mut held = self.lock_held();
        for frame in frames {
            let count = frame.len();
            if !held.push(frame, self.queue_limit) {
                self.metrics.count_drops("queue_full", count);
            }
        }
        self.metrics.set_held(held.packets);
        drop(held);
        self.held_changed.notify_one();
    }

    /// Delivers held packets, in order, whenever a plane is active.
    pub(super) async fn deliver_held(self: Arc<Self>, shutdown: CancellationToken) {
        let mut active = self.planes.subscribe();
        loop {
            loop {
                let next = self.lock_held().take_front();
                let Some(mut frame) = next else { break };
                let (count, size) = (frame.len(), frame.size());
                if self.send_to_active(&mut frame).await {
                    let mut held = self.lock_held();
                    held.delivered(count, size);
                    self.metrics.set_held(held.packets);
                } else {
                    self.lock_held().not_delivered(frame);
                    break;
                }
            }
            tokio::select! {
                changed = active.changed() => if changed.is_err() { return },
                () = self.held_changed.notified() => {}
                () = shutdown.cancelled() => return,
                // A plane that is active but briefly unable to take packets.
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blipless_protocol::channel::{decode, ToDevice};

    fn put(batches: &mut InnerBatches, peer: u32, packet: &[u8]) {
        let spare = batches.spare(peer, packet.len() + 32);
        spare[..packet.len()].copy_from_slice(packet);
        assert!(batches.commit(peer, packet.len()));
    }

    fn packets_of(frame: &mut PacketsFrame) -> (u32, Vec<Vec<u8>>) {
        let (message, _) = decode::<ToDevice>(frame.finish()).expect("decodes");
        let ToDevice::Packets(batch) = message else {
            panic!("{message:?}");
        };
        (batch.peer(), batch.iter().map(<[u8]>::to_vec).collect())
    }

    #[test]
    fn packets_go_into_their_peers_frames_in_the_order_peers_appeared() {
        let mut batches = InnerBatches::default();
        put(&mut batches, 9, &[1; 40]);
        put(&mut batches, 4, &[2; 60]);
        put(&mut batches, 9, &[3; 1400]);
        // Rooms lent and not kept (a handshake's reply, forged datagrams
        // naming many peers) leave nothing, and take no frame each.
        for peer in 100..1000 {
            let _ = batches.spare(peer, 256);
        }
        assert!(batches.frames.len() <= 2);
        // A commit for another peer than the room was lent to keeps nothing.
        let _ = batches.spare(7, 256);
        assert!(!batches.commit(8, 10));
        assert!(!batches.commit(7, 10), "one commit per loan");
        let mut frames = batches.take();
        assert_eq!(frames.len(), 2, "the peer with no packet has no frame");
        assert_eq!(
            packets_of(&mut frames[0]),
            (9, vec![vec![1; 40], vec![3; 1400]])
        );
        assert_eq!(packets_of(&mut frames[1]), (4, vec![vec![2; 60]]));
        assert!(batches.take().is_empty(), "taken once");
    }

    #[test]
    fn a_frame_under_delivery_still_counts_as_held() {
        let mut held = Held::default();
        assert!(held.may_send_directly());
        let mut batches = InnerBatches::default();
        put(&mut batches, 1, &[1; 10]);
        for frame in batches.take() {
            assert!(held.push(frame, 4096));
        }
        let frame = held.take_front().expect("the held frame");
        assert!(held.frames.is_empty());
        assert!(
            !held.may_send_directly(),
            "a round must not overtake a held frame under way"
        );
        held.not_delivered(frame);
        assert!(!held.may_send_directly(), "back at the front");
        let frame = held.take_front().expect("the frame put back");
        held.delivered(frame.len(), frame.size());
        assert!(held.may_send_directly());
        assert_eq!((held.packets, held.bytes), (0, 0));
    }

    /// Large packets fill the held queue by their bytes, not their count:
    /// 64 KiB packets cannot make it hold 4,096 of them.
    #[test]
    fn the_held_queue_is_bounded_in_bytes_too() {
        let mut held = Held::default();
        let limit = 64;
        let mut kept = 0;
        for _ in 0..limit {
            let mut batches = InnerBatches::default();
            put(&mut batches, 1, &[9; 60_000]);
            for frame in batches.take() {
                if held.push(frame, limit) {
                    kept += 1;
                }
            }
        }
        assert_eq!(kept, 2, "64 × 2 KiB holds two 60 kB packets");
        assert!(held.bytes <= limit * HELD_BYTES_PER_PACKET);
        // Small ones still fit up to the packet count.
        let mut small = Held::default();
        let mut batches = InnerBatches::default();
        for _ in 0..limit {
            put(&mut batches, 1, &[9; 100]);
        }
        for frame in batches.take() {
            assert!(small.push(frame, limit));
        }
        assert_eq!(small.packets, limit);
    }

    #[test]
    fn a_full_frame_is_followed_by_another_and_buffers_are_reused() {
        let mut batches = InnerBatches::default();
        for _ in 0..100 {
            put(&mut batches, 1, &[7; 1400]);
        }
        let mut frames = batches.take();
        assert!(
            frames.len() >= 2,
            "100 packets of 1400 bytes need two frames"
        );
        let total: usize = frames.iter_mut().map(|f| packets_of(f).1.len()).sum();
        assert_eq!(total, 100);
        let buffers: Vec<Vec<u8>> = frames.into_iter().map(PacketsFrame::into_buffer).collect();
        let first = buffers[0].as_ptr();
        batches.recycle(buffers);
        put(&mut batches, 2, &[8; 10]);
        let again = batches.take();
        let reused = again.into_iter().next().expect("a frame").into_buffer();
        assert!(
            std::ptr::eq(reused.as_ptr(), first)
                || batches.free.iter().any(|b| b.as_ptr() == first),
            "a sent frame's buffer is kept for the next"
        );
    }
}
