//! Offload round trips: segments a super-packet, joins the segments back
//! into the same super-packet, and refuses what must not be joined.

use proptest::prelude::*;

use super::*;

const V4_SOURCE: [u8; 4] = [10, 64, 0, 2];
const V4_DESTINATION: [u8; 4] = [10, 81, 2, 2];

/// A TCP segment over IPv4 (or IPv6) with valid checksums.
fn tcp(ipv4: bool, seq: u32, flags: u8, options: &[u8], payload: &[u8]) -> Vec<u8> {
    let tcp_len = 20 + options.len();
    let mut packet = if ipv4 {
        let mut header = vec![0x45, 0, 0, 0, 0x12, 0x34, 0x40, 0, 64, TCP, 0, 0];
        header.extend_from_slice(&V4_SOURCE);
        header.extend_from_slice(&V4_DESTINATION);
        header
    } else {
        let mut header = vec![0x60, 0, 0, 0, 0, 0, TCP, 64];
        header.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        header.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9]);
        header
    };
    let ip_len = packet.len();
    packet.extend_from_slice(&[0x9c, 0x40, 0x14, 0x51]);
    packet.extend_from_slice(&seq.to_be_bytes());
    packet.extend_from_slice(&7u32.to_be_bytes());
    packet.extend_from_slice(&[(tcp_len as u8 / 4) << 4, flags, 0x01, 0xf6, 0, 0, 0, 0]);
    packet.extend_from_slice(options);
    packet.extend_from_slice(payload);
    let length = packet.len();
    if ipv4 {
        packet[2..4].copy_from_slice(&(length as u16).to_be_bytes());
        ipv4_header_checksum(&mut packet[..20]);
    } else {
        packet[4..6].copy_from_slice(&((length - 40) as u16).to_be_bytes());
    }
    tcp_checksum(&mut packet, ipv4, ip_len);
    packet
}

fn payload(length: usize) -> Vec<u8> {
    (0..length).map(|i| (i * 7 + i / 251) as u8).collect()
}

/// What the kernel would hand over for `segments`: one super-packet, its
/// TCP checksum partial.
fn super_packet(ipv4: bool, total: usize, mss: u16, flags: u8) -> (VnetHeader, Vec<u8>) {
    let mut packet = tcp(
        ipv4,
        1000,
        flags,
        &[1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2],
        &payload(total),
    );
    let ip_len = if ipv4 { 20 } else { 40 };
    let pseudo = fold(pseudo_header(&packet, ipv4, packet.len() - ip_len));
    packet[ip_len + 16..ip_len + 18].copy_from_slice(&pseudo.to_be_bytes());
    let header = VnetHeader {
        flags: NEEDS_CSUM,
        gso_type: if ipv4 { GSO_TCPV4 } else { GSO_TCPV6 },
        hdr_len: (ip_len + 32) as u16,
        gso_size: mss,
        csum_start: ip_len as u16,
        csum_offset: 16,
    };
    (header, packet)
}

fn split_all(header: VnetHeader, mut packet: Vec<u8>) -> Result<Vec<Vec<u8>>, OffloadError> {
    let mut segments = Vec::new();
    let mut scratch = Vec::new();
    let count = split(header, &mut packet, &mut scratch, |segment| {
        segments.push(segment.to_vec())
    })?;
    assert_eq!(count, segments.len());
    Ok(segments)
}

fn checksums_hold(packet: &[u8]) -> bool {
    let ipv4 = packet[0] >> 4 == 4;
    let ip_len = if ipv4 { 20 } else { 40 };
    let ip_ok = !ipv4 || fold(sum(&packet[..20], 0)) == 0xffff;
    let pseudo = pseudo_header(packet, ipv4, packet.len() - ip_len);
    ip_ok && fold(sum(&packet[ip_len..], pseudo)) == 0xffff
}

#[test]
fn the_header_round_trips_and_a_short_one_is_refused() {
    let header = VnetHeader {
        flags: NEEDS_CSUM,
        gso_type: GSO_TCPV6 | GSO_ECN,
        hdr_len: 72,
        gso_size: 1380,
        csum_start: 40,
        csum_offset: 16,
    };
    assert_eq!(VnetHeader::decode(&header.encode()), Ok(header));
    assert_eq!(VnetHeader::decode(&[0; 9]), Err(OffloadError::Truncated));
}

#[test]
fn a_super_packet_becomes_wire_segments_with_valid_checksums() -> Result<(), OffloadError> {
    for ipv4 in [true, false] {
        let (header, packet) = super_packet(ipv4, 5000, 1380, ACK | PSH | FIN);
        let segments = split_all(header, packet)?;
        assert_eq!(segments.len(), 4, "5000 bytes at 1380 each");
        let ip_len = if ipv4 { 20 } else { 40 };
        let mut carried = Vec::new();
        for (index, segment) in segments.iter().enumerate() {
            assert!(checksums_hold(segment), "segment {index} (v4: {ipv4})");
            let tcp = &segment[ip_len..];
            let seq = u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]);
            assert_eq!(seq, 1000 + 1380 * index as u32);
            let last = index == 3;
            assert_eq!(
                tcp[13] & (PSH | FIN) != 0,
                last,
                "PSH and FIN only on the last"
            );
            carried.extend_from_slice(&segment[ip_len + 32..]);
            assert!(segment.len() <= ip_len + 32 + 1380);
        }
        assert_eq!(carried, payload(5000), "the payload, whole and in order");
    }
    Ok(())
}

/// Segments built one after another in one buffer, as the device plane
/// builds them in its frame; the second room is refused (dropped).
#[derive(Default)]
struct InPlace {
    buffer: Vec<u8>,
    used: usize,
    kept: Vec<std::ops::Range<usize>>,
    rooms: usize,
}

impl Segments for InPlace {
    fn whole(&mut self, packet: &[u8]) {
        self.buffer.extend_from_slice(packet);
    }

    fn room(&mut self, len: usize) -> Option<&mut [u8]> {
        self.rooms += 1;
        if self.rooms == 2 {
            return None;
        }
        self.buffer.resize(self.used + len + 7, 0);
        Some(&mut self.buffer[self.used..])
    }

    fn built(&mut self, len: usize) {
        self.kept.push(self.used..self.used + len);
        self.used += len;
    }
}

#[test]
fn segments_built_in_place_are_those_split_makes_and_a_refused_room_drops_one(
) -> Result<(), OffloadError> {
    let (header, packet) = super_packet(true, 5000, 1380, ACK);
    let expected = split_all(header, packet.clone())?;
    let mut into = InPlace::default();
    let mut packet = packet;
    assert_eq!(split_into(header, &mut packet, &mut into)?, 4);
    let built: Vec<&[u8]> = into.kept.iter().map(|r| &into.buffer[r.clone()]).collect();
    assert_eq!(built.len(), 3, "the second segment's room was refused");
    assert_eq!(built[0], &expected[0][..]);
    assert_eq!(built[1], &expected[2][..]);
    assert_eq!(built[2], &expected[3][..]);
    Ok(())
}

#[test]
fn a_partial_checksum_on_a_single_packet_is_completed() -> Result<(), OffloadError> {
    let mut packet = tcp(true, 5, ACK, &[], b"hello");
    let pseudo = fold(pseudo_header(&packet, true, packet.len() - 20));
    packet[36..38].copy_from_slice(&pseudo.to_be_bytes());
    assert!(!checksums_hold(&packet));
    let header = VnetHeader {
        flags: NEEDS_CSUM,
        csum_start: 20,
        csum_offset: 16,
        ..VnetHeader::default()
    };
    let segments = split_all(header, packet)?;
    assert_eq!(segments.len(), 1);
    assert!(checksums_hold(&segments[0]));
    let bad = VnetHeader {
        csum_start: 60,
        ..header
    };
    assert!(split_all(bad, tcp(true, 5, ACK, &[], b"hi")).is_err());
    Ok(())
}

#[test]
fn joined_segments_split_back_into_the_same_segments() -> Result<(), OffloadError> {
    for ipv4 in [true, false] {
        let (header, packet) = super_packet(ipv4, 20_000, 1380, ACK | PSH);
        let segments = split_all(header, packet)?;
        let mut coalescer = Coalescer::new();
        let mut writes = Vec::new();
        for segment in &segments {
            coalescer.push(segment, &mut writes);
        }
        coalescer.finish(&mut writes);
        assert_eq!(writes.len(), 1, "one flow, in order: one write");
        assert_eq!(writes[0].segments(), segments.len());
        let again = split_all(writes[0].header(), writes[0].to_vec())?;
        assert_eq!(again, segments, "what the kernel would cut is what came in");
    }
    Ok(())
}

#[test]
fn what_must_not_be_joined_is_written_as_it_came_and_in_order() {
    let a = |seq: u32, flags: u8, bytes: usize| tcp(true, seq, flags, &[], &payload(bytes));
    let first = a(0, ACK, 100);
    let second = a(100, ACK, 100);
    let gap = a(300, ACK, 100);
    let fin = a(400, ACK | FIN, 0);
    let mut corrupt = a(500, ACK, 100);
    corrupt[50] ^= 1;
    let mut other_flow = a(0, ACK, 100);
    other_flow[21] ^= 1; // another source port
    let ip_len = 20;
    tcp_checksum(&mut other_flow, true, ip_len);
    let packets = [&first, &other_flow, &second, &gap, &fin, &corrupt];
    let mut coalescer = Coalescer::new();
    let mut writes = Vec::new();
    for packet in packets {
        coalescer.push(packet, &mut writes);
    }
    coalescer.finish(&mut writes);
    let summary: Vec<(usize, usize)> = writes
        .iter()
        .map(|write| (write.segments(), write.len()))
        .collect();
    // first+second joined (the gap starts a group of its own, which the
    // FIN of the same flow then finishes, before the FIN itself); the
    // corrupt one and the other flow alone.
    assert_eq!(
        summary,
        vec![(2, 240), (1, 140), (1, 40), (1, 140), (1, 140)],
        "{writes:?}"
    );
    assert!(matches!(writes[1], Write::Plain(p) if p == gap.as_slice()));
    assert!(matches!(writes[2], Write::Plain(p) if p == fin.as_slice()));
    let total: usize = writes.iter().map(Write::segments).sum();
    assert_eq!(total, packets.len(), "every packet is written once");
}

proptest! {
    #[test]
    fn nothing_read_from_a_queue_panics(
        header in proptest::array::uniform10(any::<u8>()),
        mut packet in proptest::collection::vec(any::<u8>(), 0..3000),
    ) {
        if let Ok(header) = VnetHeader::decode(&header) {
            let mut scratch = Vec::new();
            let _ = split(header, &mut packet, &mut scratch, |_| {});
        }
    }

    #[test]
    fn any_packets_are_each_written_once(
        packets in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 0..20),
    ) {
        let mut coalescer = Coalescer::new();
        let mut writes = Vec::new();
        for packet in &packets {
            coalescer.push(packet, &mut writes);
        }
        coalescer.finish(&mut writes);
        prop_assert_eq!(writes.iter().map(Write::segments).sum::<usize>(), packets.len());
    }
}
