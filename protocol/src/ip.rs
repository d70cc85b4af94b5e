//! Just enough of an inner IP packet's header to route it: its version, source
//! and destination. WireGuard carries whole IP packets; the ingress checks the
//! source of what a peer sends (cryptokey routing) and routes what comes back by
//! destination, and the device plane applies the egress policy to destinations
//! (and lets TCP to the node's DNS port through: [`tcp_destination_port_v4`];
//! refuses ICMP errors about other clients' flows: [`icmp_error_about_another`]).

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

/// Whether `packet` is an ICMP error (ICMPv4 destination unreachable,
/// source quench, redirect, time exceeded, parameter problem; ICMPv6
/// destination unreachable, packet too big, time exceeded, parameter
/// problem) that is not about a packet its sender received: the packet it
/// quotes must be addressed to the error's source. A client may send errors
/// about its own flows only; one quoting another client's flow would be
/// taken by the node's connection tracking as related to that flow and
/// passed on for it (a port unreachable or a small MTU against a
/// neighbour's connection). An error whose quoted header is cut short
/// counts as foreign too, and so does the first fragment of one (an error
/// is never fragmented: conntrack would reassemble it and see the quote in
/// a later fragment). A later fragment has no ICMP header to judge; without
/// its first it is never reassembled. IPv6 extension headers (hop-by-hop,
/// routing, destination options, fragment) are followed to the ICMPv6
/// header, as conntrack follows them.
pub fn icmp_error_about_another(packet: &[u8]) -> bool {
    let Some(&first) = packet.first() else {
        return false;
    };
    let Some((source, _)) = addresses(packet) else {
        return false;
    };
    let (icmp, first_fragment) = match first >> 4 {
        4 => {
            if packet.get(9) != Some(&1) {
                return false;
            }
            let Some(flags) = packet.get(6..8) else {
                return false;
            };
            let flags = u16::from_be_bytes([flags[0], flags[1]]);
            if flags & 0x1fff != 0 {
                // A later fragment: no ICMP header here.
                return false;
            }
            let header = usize::from(first & 0x0f) * 4;
            if header < 20 {
                return false;
            }
            (header, flags & 0x2000 != 0)
        }
        6 => match icmpv6_offset(packet) {
            Some(found) => found,
            None => return false,
        },
        _ => return false,
    };
    let Some(&kind) = packet.get(icmp) else {
        return false;
    };
    let is_error = if first >> 4 == 4 {
        matches!(kind, 3 | 4 | 5 | 11 | 12)
    } else {
        (1..=4).contains(&kind)
    };
    if !is_error {
        return false;
    }
    if first_fragment {
        return true;
    }
    // The quoted packet follows the 8-byte ICMP header.
    let quoted = packet.get(icmp + 8..).unwrap_or_default();
    destination(quoted) != Some(source)
}

/// Where an IPv6 packet's ICMPv6 header starts, past any hop-by-hop,
/// routing, destination options and fragment headers, and whether the
/// packet is the first of several fragments; `None` when it carries no
/// ICMPv6 header (another protocol, a later fragment, a chain cut short).
fn icmpv6_offset(packet: &[u8]) -> Option<(usize, bool)> {
    const HOP_BY_HOP: u8 = 0;
    const ROUTING: u8 = 43;
    const FRAGMENT: u8 = 44;
    const DESTINATION_OPTIONS: u8 = 60;
    const ICMPV6: u8 = 58;
    let mut next = *packet.get(6)?;
    let mut at = 40;
    let mut first_fragment = false;
    // A bounded walk: a chain longer than this is not followed.
    for _ in 0..8 {
        match next {
            ICMPV6 => return Some((at, first_fragment)),
            HOP_BY_HOP | ROUTING | DESTINATION_OPTIONS => {
                let length = (usize::from(*packet.get(at + 1)?) + 1) * 8;
                next = *packet.get(at)?;
                at += length;
            }
            FRAGMENT => {
                let offset = packet.get(at + 2..at + 4)?;
                let offset = u16::from_be_bytes([offset[0], offset[1]]);
                if offset & 0xfff8 != 0 {
                    return None;
                }
                first_fragment = offset & 1 != 0;
                next = *packet.get(at)?;
                at += 8;
            }
            _ => return None,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ICMPv4 port unreachable from `from`, quoting a UDP packet from
    /// 1.1.1.1 to `quoted_to`.
    fn unreachable_v4(from: [u8; 4], quoted_to: [u8; 4]) -> Vec<u8> {
        let mut packet = vec![0x45, 0, 0, 56, 0, 0, 0, 0, 64, 1, 0, 0];
        packet.extend_from_slice(&from);
        packet.extend_from_slice(&[1, 1, 1, 1]);
        packet.extend_from_slice(&[3, 3, 0, 0, 0, 0, 0, 0]);
        packet.extend_from_slice(&[0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0, 1, 1, 1, 1]);
        packet.extend_from_slice(&quoted_to);
        packet.extend_from_slice(&[0, 53, 0x30, 0x39, 0, 8, 0, 0]);
        packet
    }

    #[test]
    fn an_icmp_error_may_quote_only_its_senders_own_packets() {
        let own = unreachable_v4([10, 64, 0, 5], [10, 64, 0, 5]);
        assert!(!icmp_error_about_another(&own));
        let other = unreachable_v4([10, 64, 0, 5], [10, 64, 0, 7]);
        assert!(icmp_error_about_another(&other));
        // Cut inside the quoted header: foreign.
        assert!(icmp_error_about_another(&other[..40]));
        assert!(icmp_error_about_another(&own[..40]));
        // The first fragment of an error: foreign; a later fragment of
        // anything carries no ICMP header to judge.
        let mut fragment = own.clone();
        fragment[6] = 0x20;
        assert!(icmp_error_about_another(&fragment));
        let mut later = other.clone();
        later[7] = 0x10;
        assert!(!icmp_error_about_another(&later));
        // An echo request is no error.
        let mut echo = other.clone();
        echo[20] = 8;
        assert!(!icmp_error_about_another(&echo));
        // Nor is UDP.
        let mut udp = other;
        udp[9] = 17;
        assert!(!icmp_error_about_another(&udp));

        // ICMPv6 packet too big from fd00::5 quoting a packet to fd00::7.
        let mut v6 = vec![0x60, 0, 0, 0, 0, 48, 58, 64];
        v6.extend_from_slice(&Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 5).octets());
        v6.extend_from_slice(&Ipv6Addr::new(0x2606, 0, 0, 0, 0, 0, 0, 1).octets());
        v6.extend_from_slice(&[2, 0, 0, 0, 0, 0, 5, 0x28]);
        v6.extend_from_slice(&[0x60, 0, 0, 0, 0, 0, 17, 64]);
        v6.extend_from_slice(&Ipv6Addr::new(0x2606, 0, 0, 0, 0, 0, 0, 1).octets());
        v6.extend_from_slice(&Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 7).octets());
        assert!(icmp_error_about_another(&v6));
        v6[87] = 5;
        assert!(!icmp_error_about_another(&v6));
        // Behind a destination options header, still judged.
        v6[87] = 7;
        let mut behind = v6[..40].to_vec();
        behind[6] = 60;
        behind.extend_from_slice(&[58, 0, 1, 4, 0, 0, 0, 0]);
        behind.extend_from_slice(&v6[40..]);
        assert!(icmp_error_about_another(&behind));
        // The first fragment of an ICMPv6 error: foreign.
        let mut fragment = v6[..40].to_vec();
        fragment[6] = 44;
        fragment.extend_from_slice(&[58, 0, 0, 1, 0, 0, 0, 9]);
        fragment.extend_from_slice(&v6[40..]);
        fragment[87 + 8] = 5;
        assert!(icmp_error_about_another(&fragment));
        // An echo request (128) is no error.
        v6[40] = 128;
        assert!(!icmp_error_about_another(&v6));
    }

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
