//! [`PacketsFrame`]: a [`super::Packets`] frame written in place, for the
//! sender of inner packets that produces each packet itself (the ingress
//! decrypting a WireGuard datagram). Each packet is written straight into
//! the frame that will be sent, after its length; the frame's header and the
//! batch's peer and count are filled in when it is finished. The result is
//! byte for byte what [`super::encode`] makes of the same `Packets` message,
//! so the receiver decodes it as any other.
//!
//! The buffer keeps its full length once it was zeroed (its first use):
//! writing a packet never zeroes or grows it, and a finished frame gives the
//! buffer back for the next one.

use super::payloads::T_PACKETS;
use super::{HEADER_LEN, MAGIC, MAX_FRAME, PROTOCOL_VERSION};

/// Where the first packet's length goes: after the header, the peer (u32)
/// and the count (u16).
const FIRST_PACKET: usize = HEADER_LEN + 4 + 2;

/// A `Packets` frame being written (see the module doc).
#[derive(Debug)]
pub struct PacketsFrame {
    bytes: Vec<u8>,
    /// Bytes of `bytes` in use: the header, the fixed fields, the packets.
    used: usize,
    peer: u32,
    count: u16,
    /// Room last handed out by [`PacketsFrame::spare`].
    lent: usize,
}

impl PacketsFrame {
    /// A frame for `peer`'s packets in `buffer`, whose length (at most
    /// [`MAX_FRAME`]; a longer buffer is cut) is the frame's capacity.
    pub fn new(peer: u32, mut buffer: Vec<u8>) -> Self {
        buffer.truncate(MAX_FRAME);
        if buffer.len() < FIRST_PACKET {
            buffer.resize(FIRST_PACKET, 0);
        }
        Self {
            bytes: buffer,
            used: FIRST_PACKET,
            peer,
            count: 0,
            lent: 0,
        }
    }

    /// The peer the packets belong to.
    pub fn peer(&self) -> u32 {
        self.peer
    }

    /// How many packets the frame holds.
    pub fn len(&self) -> usize {
        usize::from(self.count)
    }

    /// The bytes the frame holds so far (its header and packets).
    pub fn size(&self) -> usize {
        self.used
    }

    /// True when the frame holds no packet.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Whether [`PacketsFrame::spare`] has `room` bytes to lend.
    pub fn has_room(&self, room: usize) -> bool {
        self.count < u16::MAX && self.used + 2 + room.min(usize::from(u16::MAX)) <= self.bytes.len()
    }

    /// Room for one more packet of at most `room` bytes (at most 65535):
    /// the place to write it, to be kept with [`PacketsFrame::commit`].
    /// None when the frame cannot take that much more (start another).
    pub fn spare(&mut self, room: usize) -> Option<&mut [u8]> {
        let room = room.min(usize::from(u16::MAX));
        self.lent = 0;
        if !self.has_room(room) {
            return None;
        }
        let start = self.used + 2;
        self.lent = room;
        self.bytes.get_mut(start..start + room)
    }

    /// The first `len` bytes of the last room lent (fewer if it was
    /// smaller; none if nothing is lent), as written so far: to look at a
    /// packet before keeping it.
    pub fn written(&self, len: usize) -> &[u8] {
        let start = self.used + 2;
        self.bytes
            .get(start..start + len.min(self.lent))
            .unwrap_or(&[])
    }

    /// Gives the frame to `peer`: a frame is lent before anyone knows
    /// whose packet will be kept in it (the ingress decrypts before it
    /// knows the datagram is authentic).
    pub fn set_peer(&mut self, peer: u32) {
        self.peer = peer;
    }

    /// The same frame in a buffer of its own size (a copy): for a frame
    /// that waits long, so that it holds only what it carries. No more
    /// packets fit in it.
    pub fn shrunk(mut self) -> Self {
        self.bytes.truncate(self.used);
        self.bytes.shrink_to_fit();
        self.lent = 0;
        self
    }

    /// Keeps the first `len` bytes written into the last
    /// [`PacketsFrame::spare`] as a packet; an empty packet, or one longer
    /// than that room, is not kept (returns false).
    pub fn commit(&mut self, len: usize) -> bool {
        if len == 0 || len > self.lent {
            return false;
        }
        self.lent = 0;
        // `len` ≤ 65535: `spare` lends at most that much.
        self.bytes[self.used..self.used + 2].copy_from_slice(&(len as u16).to_be_bytes());
        self.used += 2 + len;
        self.count += 1;
        true
    }

    /// The finished frame: the header, the peer and the count written over
    /// the packets as they stand.
    pub fn finish(&mut self) -> &[u8] {
        let payload_len = (self.used - HEADER_LEN) as u32;
        self.bytes[0..2].copy_from_slice(&MAGIC);
        self.bytes[2] = PROTOCOL_VERSION;
        self.bytes[3] = T_PACKETS;
        self.bytes[4..8].copy_from_slice(&payload_len.to_be_bytes());
        self.bytes[8..12].copy_from_slice(&self.peer.to_be_bytes());
        self.bytes[12..14].copy_from_slice(&self.count.to_be_bytes());
        &self.bytes[..self.used]
    }

    /// The buffer back, at its full length, for another frame.
    pub fn into_buffer(self) -> Vec<u8> {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::{decode, encode, Packets, ToDevice, ToIngress};

    fn write(frame: &mut PacketsFrame, packet: &[u8]) -> bool {
        let Some(spare) = frame.spare(packet.len() + 16) else {
            return false;
        };
        spare[..packet.len()].copy_from_slice(packet);
        frame.commit(packet.len())
    }

    #[test]
    fn a_frame_written_in_place_is_what_encode_makes() {
        let packets: [&[u8]; 3] = [&[0x45, 0, 0, 20], &[0x60; 40], &[1; 1400]];
        let mut frame = PacketsFrame::new(7, vec![0; 4096]);
        let mut batch = Packets::new(7);
        for packet in packets {
            assert!(write(&mut frame, packet));
            assert!(batch.try_push(packet));
        }
        assert_eq!(frame.len(), 3);
        let encoded = encode(&ToDevice::Packets(batch.clone()));
        assert_eq!(frame.finish(), &encoded[..]);
        assert_eq!(
            decode::<ToDevice>(frame.finish()).expect("decodes").0,
            ToDevice::Packets(batch.clone())
        );
        // Either direction: the same type byte.
        assert_eq!(
            decode::<ToIngress>(frame.finish()).expect("decodes").0,
            ToIngress::Packets(batch)
        );
    }

    #[test]
    fn an_empty_frame_decodes_as_an_empty_batch() {
        let mut frame = PacketsFrame::new(3, Vec::new());
        assert!(frame.is_empty());
        let encoded = encode(&ToDevice::Packets(Packets::new(3)));
        assert_eq!(frame.finish(), &encoded[..]);
    }

    #[test]
    fn room_past_the_buffer_is_refused_and_nothing_changes() {
        let mut frame = PacketsFrame::new(1, vec![0; FIRST_PACKET + 2 + 100]);
        assert!(frame.spare(101).is_none());
        assert!(write(&mut frame, &[9; 84]));
        // 16 bytes left: a length and 14 bytes of packet.
        assert!(frame.spare(15).is_none());
        assert!(frame.spare(14).is_some());
        assert_eq!(frame.len(), 1);
        let (message, used) = decode::<ToDevice>(frame.finish()).expect("decodes");
        assert_eq!(used, FIRST_PACKET + 2 + 84);
        let ToDevice::Packets(batch) = message else {
            panic!("{message:?}");
        };
        assert_eq!(batch.iter().collect::<Vec<_>>(), [&[9; 84][..]]);
    }

    #[test]
    fn a_commit_past_the_room_lent_or_without_a_loan_keeps_nothing() {
        let mut frame = PacketsFrame::new(1, vec![0; 4096]);
        assert!(!frame.commit(10), "nothing was lent");
        assert!(frame.written(10).is_empty());
        frame.spare(20).expect("room")[..3].copy_from_slice(&[1, 2, 3]);
        assert_eq!(frame.written(3), &[1, 2, 3]);
        assert_eq!(frame.written(30).len(), 20, "no more than was lent");
        assert!(!frame.commit(21));
        assert!(!frame.commit(0));
        assert!(frame.commit(20));
        assert!(!frame.commit(20), "one commit per loan");
        assert_eq!(frame.len(), 1);
    }

    #[test]
    fn a_reused_buffer_keeps_no_trace_of_its_last_frame() {
        let mut frame = PacketsFrame::new(1, vec![0; 4096]);
        assert!(write(&mut frame, &[7; 1000]));
        let _ = frame.finish();
        let mut again = PacketsFrame::new(2, frame.into_buffer());
        assert!(write(&mut again, &[8; 10]));
        let mut batch = Packets::new(2);
        assert!(batch.try_push(&[8; 10]));
        assert_eq!(again.finish(), &encode(&ToDevice::Packets(batch))[..]);
    }

    #[test]
    fn a_shrunk_frame_is_the_same_frame_in_its_own_size() {
        let mut frame = PacketsFrame::new(1, vec![0; 4096]);
        assert!(write(&mut frame, &[5; 100]));
        frame.set_peer(9);
        let expected = frame.finish().to_vec();
        let mut shrunk = frame.shrunk();
        assert_eq!(shrunk.finish(), &expected[..]);
        assert!(shrunk.into_buffer().capacity() < 4096);
        let empty = PacketsFrame::new(1, Vec::new());
        assert!(empty.written(10).is_empty(), "nothing lent, nothing to see");
    }

    #[test]
    fn a_buffer_longer_than_a_frame_is_cut_to_one() {
        let mut frame = PacketsFrame::new(1, vec![0; MAX_FRAME + 10_000]);
        let packet = vec![1u8; 1400];
        while write(&mut frame, &packet) {}
        assert!(frame.finish().len() <= MAX_FRAME);
    }
}
