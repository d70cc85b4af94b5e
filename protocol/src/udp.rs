//! A UDP datagram inside an inner IPv4 or IPv6 packet: reading one a
//! WireGuard client sent, and building the answer the device plane sends back. Used by the DNS
//! gateway (docs/WIREGUARD.md, "DNS"), which answers queries addressed to the
//! node's tunnel address without the kernel's help.
//!
//! Reading is strict: a packet that is truncated, fragmented, carries IP
//! options it cannot skip (an IPv6 extension header: UDP must be the next
//! header), or whose lengths disagree is not a datagram here (`None`), and
//! the caller treats it as any other packet.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// IP protocol number of UDP.
const UDP: u8 = 17;
/// Length of the IPv4 header this module builds (no options).
const IPV4_HEADER: usize = 20;
/// Length of the IPv6 header (extension headers are not read or built).
const IPV6_HEADER: usize = 40;
/// Length of the UDP header.
const UDP_HEADER: usize = 8;
/// Time to live of the packets built here.
const TTL: u8 = 64;

/// A UDP datagram borrowed from an IPv4 or IPv6 packet (both addresses of
/// one family).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Datagram<'a> {
    /// The packet's source address.
    pub source: IpAddr,
    /// The packet's destination address.
    pub destination: IpAddr,
    /// The datagram's source port.
    pub source_port: u16,
    /// The datagram's destination port.
    pub destination_port: u16,
    /// What the datagram carries.
    pub payload: &'a [u8],
}

/// The UDP datagram `packet` carries; `None` when it is not a whole,
/// unfragmented IPv4 or IPv6 packet carrying one.
pub fn datagram(packet: &[u8]) -> Option<Datagram<'_>> {
    match *packet.first()? >> 4 {
        4 => datagram_v4(packet),
        6 => datagram_v6(packet),
        _ => None,
    }
}

fn datagram_v6(packet: &[u8]) -> Option<Datagram<'_>> {
    if packet.len() < IPV6_HEADER + UDP_HEADER || packet[6] != UDP {
        return None;
    }
    let payload_length = usize::from(u16::from_be_bytes([packet[4], packet[5]]));
    let udp = packet.get(IPV6_HEADER..IPV6_HEADER + payload_length)?;
    let length = usize::from(u16::from_be_bytes([*udp.get(4)?, *udp.get(5)?]));
    if length < UDP_HEADER || length > udp.len() {
        return None;
    }
    let address = |at: usize| -> Option<IpAddr> {
        let octets: [u8; 16] = packet.get(at..at + 16)?.try_into().ok()?;
        Some(Ipv6Addr::from(octets).into())
    };
    Some(Datagram {
        source: address(8)?,
        destination: address(24)?,
        source_port: u16::from_be_bytes([udp[0], udp[1]]),
        destination_port: u16::from_be_bytes([udp[2], udp[3]]),
        payload: &udp[UDP_HEADER..length],
    })
}

fn datagram_v4(packet: &[u8]) -> Option<Datagram<'_>> {
    let first = *packet.first()?;
    let header = usize::from(first & 0x0f) * 4;
    if header < IPV4_HEADER || packet.len() < header + UDP_HEADER {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([packet[2], packet[3]]));
    if total < header + UDP_HEADER || total > packet.len() {
        return None;
    }
    // More fragments, or a fragment offset: not a whole datagram.
    let fragment = u16::from_be_bytes([packet[6], packet[7]]);
    if fragment & 0x3fff != 0 || packet[9] != UDP {
        return None;
    }
    let udp = &packet[header..total];
    let length = usize::from(u16::from_be_bytes([udp[4], udp[5]]));
    if length < UDP_HEADER || length > udp.len() {
        return None;
    }
    Some(Datagram {
        source: Ipv4Addr::new(packet[12], packet[13], packet[14], packet[15]).into(),
        destination: Ipv4Addr::new(packet[16], packet[17], packet[18], packet[19]).into(),
        source_port: u16::from_be_bytes([udp[0], udp[1]]),
        destination_port: u16::from_be_bytes([udp[2], udp[3]]),
        payload: &udp[UDP_HEADER..length],
    })
}

/// The packet carrying `datagram` (its addresses, ports and payload), IPv4
/// with both checksums or IPv6 with the UDP checksum; `None` when the payload
/// does not fit one packet or the addresses are of two families.
pub fn build(datagram: &Datagram<'_>) -> Option<Vec<u8>> {
    match (datagram.source, datagram.destination) {
        (IpAddr::V4(source), IpAddr::V4(destination)) => build_v4(datagram, source, destination),
        (IpAddr::V6(source), IpAddr::V6(destination)) => build_v6(datagram, source, destination),
        _ => None,
    }
}

fn build_v6(datagram: &Datagram<'_>, source: Ipv6Addr, destination: Ipv6Addr) -> Option<Vec<u8>> {
    let udp_length = u16::try_from(UDP_HEADER + datagram.payload.len()).ok()?;
    let mut packet = Vec::with_capacity(IPV6_HEADER + usize::from(udp_length));
    packet.extend_from_slice(&[0x60, 0, 0, 0]);
    packet.extend_from_slice(&udp_length.to_be_bytes());
    packet.extend_from_slice(&[UDP, TTL]);
    packet.extend_from_slice(&source.octets());
    packet.extend_from_slice(&destination.octets());
    packet.extend_from_slice(&datagram.source_port.to_be_bytes());
    packet.extend_from_slice(&datagram.destination_port.to_be_bytes());
    packet.extend_from_slice(&udp_length.to_be_bytes());
    packet.extend_from_slice(&[0, 0]);
    packet.extend_from_slice(datagram.payload);
    // RFC 8200 §8.1: the pseudo-header is both addresses, the upper-layer
    // length (32 bits) and the next header; the checksum is mandatory.
    let mut pseudo = [0u8; 40];
    pseudo[..16].copy_from_slice(&source.octets());
    pseudo[16..32].copy_from_slice(&destination.octets());
    pseudo[32..36].copy_from_slice(&u32::from(udp_length).to_be_bytes());
    pseudo[39] = UDP;
    let udp_sum = match checksum(&[&pseudo, &packet[IPV6_HEADER..]]) {
        0 => 0xffff,
        sum => sum,
    };
    packet[IPV6_HEADER + 6..IPV6_HEADER + 8].copy_from_slice(&udp_sum.to_be_bytes());
    Some(packet)
}

fn build_v4(datagram: &Datagram<'_>, source: Ipv4Addr, destination: Ipv4Addr) -> Option<Vec<u8>> {
    let udp_length = u16::try_from(UDP_HEADER + datagram.payload.len()).ok()?;
    let total = u16::try_from(IPV4_HEADER + usize::from(udp_length)).ok()?;
    let mut packet = Vec::with_capacity(usize::from(total));
    packet.extend_from_slice(&[0x45, 0]);
    packet.extend_from_slice(&total.to_be_bytes());
    // Identification 0, don't fragment.
    packet.extend_from_slice(&[0, 0, 0x40, 0, TTL, UDP, 0, 0]);
    packet.extend_from_slice(&source.octets());
    packet.extend_from_slice(&destination.octets());
    let header_sum = checksum(&[&packet[..IPV4_HEADER]]);
    packet[10..12].copy_from_slice(&header_sum.to_be_bytes());
    packet.extend_from_slice(&datagram.source_port.to_be_bytes());
    packet.extend_from_slice(&datagram.destination_port.to_be_bytes());
    packet.extend_from_slice(&udp_length.to_be_bytes());
    packet.extend_from_slice(&[0, 0]);
    packet.extend_from_slice(datagram.payload);
    let mut pseudo = [0u8; 12];
    pseudo[..4].copy_from_slice(&source.octets());
    pseudo[4..8].copy_from_slice(&destination.octets());
    pseudo[9] = UDP;
    pseudo[10..12].copy_from_slice(&udp_length.to_be_bytes());
    let udp_sum = match checksum(&[&pseudo, &packet[IPV4_HEADER..]]) {
        // RFC 768: a computed zero is sent as all ones (zero means "none").
        0 => 0xffff,
        sum => sum,
    };
    packet[IPV4_HEADER + 6..IPV4_HEADER + 8].copy_from_slice(&udp_sum.to_be_bytes());
    Some(packet)
}

/// The Internet checksum (RFC 1071) over `parts` taken as one byte string.
fn checksum(parts: &[&[u8]]) -> u16 {
    let mut sum: u32 = 0;
    let mut odd: Option<u8> = None;
    for part in parts {
        for &byte in *part {
            match odd.take() {
                Some(high) => sum += u32::from(u16::from_be_bytes([high, byte])),
                None => odd = Some(byte),
            }
        }
    }
    if let Some(high) = odd {
        sum += u32::from(u16::from_be_bytes([high, 0]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(payload: &[u8]) -> Vec<u8> {
        build(&Datagram {
            source: Ipv4Addr::new(10, 64, 0, 2).into(),
            destination: Ipv4Addr::new(10, 64, 0, 1).into(),
            source_port: 40000,
            destination_port: 53,
            payload,
        })
        .expect("fits")
    }

    #[test]
    fn a_built_packet_reads_back_and_its_checksums_verify() {
        let packet = sample(b"query bytes");
        let read = datagram(&packet).expect("a datagram");
        assert_eq!(read.source, IpAddr::from(Ipv4Addr::new(10, 64, 0, 2)));
        assert_eq!(read.destination, IpAddr::from(Ipv4Addr::new(10, 64, 0, 1)));
        assert_eq!((read.source_port, read.destination_port), (40000, 53));
        assert_eq!(read.payload, b"query bytes");
        // A header with its checksum in sums to zero.
        assert_eq!(checksum(&[&packet[..20]]), 0);
        let mut pseudo = [0u8; 12];
        pseudo[..4].copy_from_slice(&packet[12..16]);
        pseudo[4..8].copy_from_slice(&packet[16..20]);
        pseudo[9] = UDP;
        pseudo[10..12].copy_from_slice(&packet[24..26]);
        assert_eq!(checksum(&[&pseudo, &packet[20..]]), 0);
    }

    #[test]
    fn a_known_header_checksum() {
        // The example of RFC 1071's usual illustration (Wikipedia's IPv4 header).
        let header = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(checksum(&[&header]), 0xb861);
    }

    #[test]
    fn odd_lengths_and_trailing_bytes() {
        let packet = sample(b"odd");
        assert_eq!(datagram(&packet).expect("datagram").payload, b"odd");
        // Bytes after the IP packet's total length are not the datagram's.
        let mut padded = packet.clone();
        padded.extend_from_slice(&[0xee; 5]);
        assert_eq!(datagram(&padded).expect("datagram").payload, b"odd");
    }

    #[test]
    fn what_is_not_a_whole_datagram_is_refused() {
        let packet = sample(b"payload");
        for cut in 0..packet.len() {
            assert_eq!(datagram(&packet[..cut]), None, "cut at {cut}");
        }
        let mut fragment = packet.clone();
        fragment[6] |= 0x20; // more fragments
        assert_eq!(datagram(&fragment), None);
        let mut later = packet.clone();
        later[7] = 1; // an offset
        assert_eq!(datagram(&later), None);
        let mut tcp = packet.clone();
        tcp[9] = 6;
        assert_eq!(datagram(&tcp), None);
        let mut v6 = packet.clone();
        v6[0] = 0x60;
        assert_eq!(datagram(&v6), None);
        let mut short_udp = packet.clone();
        short_udp[24..26].copy_from_slice(&7u16.to_be_bytes());
        assert_eq!(datagram(&short_udp), None);
        let mut long_udp = packet.clone();
        long_udp[24..26].copy_from_slice(&999u16.to_be_bytes());
        assert_eq!(datagram(&long_udp), None);
        let mut bad_ihl = packet;
        bad_ihl[0] = 0x44;
        assert_eq!(datagram(&bad_ihl), None);
    }

    #[test]
    fn options_are_skipped() {
        let plain = sample(b"x");
        let mut with_options = plain[..20].to_vec();
        with_options[0] = 0x46;
        with_options.extend_from_slice(&[1, 1, 1, 1]); // four NOPs
        with_options.extend_from_slice(&plain[20..]);
        let total = with_options.len() as u16;
        with_options[2..4].copy_from_slice(&total.to_be_bytes());
        let read = datagram(&with_options).expect("datagram");
        assert_eq!((read.destination_port, read.payload), (53, &b"x"[..]));
    }

    #[test]
    fn a_payload_too_big_for_a_packet_is_refused() {
        let big = vec![0u8; 65_536];
        assert_eq!(
            build(&Datagram {
                source: Ipv4Addr::LOCALHOST.into(),
                destination: Ipv4Addr::LOCALHOST.into(),
                source_port: 1,
                destination_port: 2,
                payload: &big,
            }),
            None
        );
    }

    fn sample_v6(payload: &[u8]) -> Vec<u8> {
        build(&Datagram {
            source: "fd64::2".parse().expect("address"),
            destination: "fd64::1".parse().expect("address"),
            source_port: 40000,
            destination_port: 53,
            payload,
        })
        .expect("fits")
    }

    #[test]
    fn an_ipv6_packet_reads_back_and_its_checksum_verifies() {
        let packet = sample_v6(b"query");
        assert_eq!(packet.len(), 40 + 8 + 5);
        let read = datagram(&packet).expect("a datagram");
        assert_eq!(read.source, "fd64::2".parse::<IpAddr>().expect("address"));
        assert_eq!(
            read.destination,
            "fd64::1".parse::<IpAddr>().expect("address")
        );
        assert_eq!((read.source_port, read.destination_port), (40000, 53));
        assert_eq!(read.payload, b"query");
        let mut pseudo = [0u8; 40];
        pseudo[..32].copy_from_slice(&packet[8..40]);
        pseudo[35] = 13;
        pseudo[39] = UDP;
        assert_eq!(checksum(&[&pseudo, &packet[40..]]), 0);
        for cut in 0..packet.len() {
            assert_eq!(datagram(&packet[..cut]), None, "cut at {cut}");
        }
        let mut extension = packet.clone();
        extension[6] = 0; // a hop-by-hop header first: not read
        assert_eq!(datagram(&extension), None);
    }

    #[test]
    fn mixed_families_are_not_built() {
        let mixed = Datagram {
            source: Ipv4Addr::LOCALHOST.into(),
            destination: Ipv6Addr::LOCALHOST.into(),
            source_port: 1,
            destination_port: 2,
            payload: b"",
        };
        assert_eq!(build(&mixed), None);
    }
}
