//! Just enough of an inner IP packet's header to route it: its version, source
//! and destination. WireGuard carries whole IP packets; the ingress checks the
//! source of what a peer sends (cryptokey routing) and routes what comes back by
//! destination, and the device plane applies the egress policy to destinations
//! (and lets TCP to the node's DNS port through: [`tcp_destination_port_v4`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The source and destination of an IPv4 or IPv6 packet; `None` when the bytes
/// are too short for the header their version nibble announces, or the version
/// is neither 4 nor 6.
pub fn addresses(packet: &[u8]) -> Option<(IpAddr, IpAddr)> {
    match packet.first()? >> 4 {
        4 if packet.len() >= 20 => {
            let source: [u8; 4] = packet.get(12..16)?.try_into().ok()?;
            let destination: [u8; 4] = packet.get(16..20)?.try_into().ok()?;
            Some((
                IpAddr::V4(Ipv4Addr::from(source)),
                IpAddr::V4(Ipv4Addr::from(destination)),
            ))
        }
        6 if packet.len() >= 40 => {
            let source: [u8; 16] = packet.get(8..24)?.try_into().ok()?;
            let destination: [u8; 16] = packet.get(24..40)?.try_into().ok()?;
            Some((
                IpAddr::V6(Ipv6Addr::from(source)),
                IpAddr::V6(Ipv6Addr::from(destination)),
            ))
        }
        _ => None,
    }
}

/// The destination of an IPv4 or IPv6 packet (see [`addresses`]).
pub fn destination(packet: &[u8]) -> Option<IpAddr> {
    addresses(packet).map(|(_, destination)| destination)
}

/// The source of an IPv4 or IPv6 packet (see [`addresses`]).
pub fn source(packet: &[u8]) -> Option<IpAddr> {
    addresses(packet).map(|(source, _)| source)
}

/// The destination port of a TCP segment in an unfragmented IPv4 packet
/// (the first fragment carries the port too); `None` for anything else.
pub fn tcp_destination_port_v4(packet: &[u8]) -> Option<u16> {
    let first = *packet.first()?;
    if first >> 4 != 4 || packet.get(9) != Some(&6) {
        return None;
    }
    // A later fragment holds no TCP header.
    let offset = u16::from_be_bytes([*packet.get(6)?, *packet.get(7)?]) & 0x1fff;
    if offset != 0 {
        return None;
    }
    let header = usize::from(first & 0x0f) * 4;
    if header < 20 {
        return None;
    }
    let port = packet.get(header + 2..header + 4)?;
    Some(u16::from_be_bytes([port[0], port[1]]))
}

/// The destination port of a TCP segment in an IPv4 packet
/// ([`tcp_destination_port_v4`]) or an IPv6 packet whose next header is TCP
/// (extension headers are not followed); `None` for anything else.
pub fn tcp_destination_port(packet: &[u8]) -> Option<u16> {
    match *packet.first()? >> 4 {
        4 => tcp_destination_port_v4(packet),
        6 if packet.get(6) == Some(&6) => {
            let port = packet.get(42..44)?;
            Some(u16::from_be_bytes([port[0], port[1]]))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tcp_port_of_an_ipv6_segment() {
        let mut v6 = [0u8; 60];
        v6[0] = 0x60;
        v6[6] = 6;
        v6[42..44].copy_from_slice(&53u16.to_be_bytes());
        assert_eq!(tcp_destination_port(&v6), Some(53));
        v6[6] = 17;
        assert_eq!(tcp_destination_port(&v6), None);
        assert_eq!(tcp_destination_port(&v6[..43]), None);
    }

    #[test]
    fn reads_v4_and_v6_headers() {
        let mut v4 = [0u8; 20];
        v4[0] = 0x45;
        v4[12..16].copy_from_slice(&[10, 64, 0, 2]);
        v4[16..20].copy_from_slice(&[93, 184, 216, 34]);
        assert_eq!(source(&v4), Some(IpAddr::from([10, 64, 0, 2])));
        assert_eq!(destination(&v4), Some(IpAddr::from([93, 184, 216, 34])));

        let mut v6 = [0u8; 40];
        v6[0] = 0x60;
        v6[23] = 1;
        v6[39] = 2;
        assert_eq!(source(&v6), Some(IpAddr::V6(Ipv6Addr::from(1))));
        assert_eq!(destination(&v6), Some(IpAddr::V6(Ipv6Addr::from(2))));
    }

    #[test]
    fn a_tcp_segments_destination_port() {
        let mut segment = [0u8; 40];
        segment[0] = 0x45;
        segment[9] = 6;
        segment[22..24].copy_from_slice(&53u16.to_be_bytes());
        assert_eq!(tcp_destination_port_v4(&segment), Some(53));
        assert_eq!(tcp_destination_port_v4(&segment[..23]), None, "cut");
        let mut udp = segment;
        udp[9] = 17;
        assert_eq!(tcp_destination_port_v4(&udp), None);
        let mut later = segment;
        later[7] = 1;
        assert_eq!(tcp_destination_port_v4(&later), None, "a later fragment");
        let mut bad = segment;
        bad[0] = 0x44;
        assert_eq!(tcp_destination_port_v4(&bad), None);
        assert_eq!(tcp_destination_port_v4(&[]), None);
    }

    #[test]
    fn short_or_foreign_packets_have_no_addresses() {
        assert_eq!(addresses(&[]), None);
        assert_eq!(addresses(&[0x45; 19]), None);
        assert_eq!(addresses(&[0x60; 39]), None);
        assert_eq!(addresses(&[0x50; 60]), None);
    }
}
