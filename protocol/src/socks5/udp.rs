//! The SOCKS5 UDP request header (RFC 1928 §7): what a client puts before
//! each datagram it sends to its UDP ASSOCIATE relay, and what the relay
//! puts before each datagram it sends back.
//!
//! ```text
//! RSV u16 (0) | FRAG u8 | ATYP u8 | DST.ADDR | DST.PORT u16 | DATA
//! ```
//!
//! A datagram is whole or nothing, so there is no "incomplete" here: a
//! datagram too short for its header is [`UdpHeaderError::Truncated`], and
//! the relay drops it (RFC 1928 answers nothing on the UDP path).
//! Fragments (FRAG ≠ 0) parse, and [`UdpDatagram::frag`] lets the relay drop
//! them: reassembly is optional in the RFC, and no common client fragments.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::{parse_domain, Destination, ATYP_DOMAIN, ATYP_IPV4, ATYP_IPV6};

/// Length of the header before a relayed datagram whose source is an IPv4
/// address; an IPv6 one adds 12.
pub const HEADER_V4: usize = 10;

/// A datagram a client sent to its relay, its payload borrowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpDatagram<'a> {
    /// The fragment number: 0 for a whole datagram.
    pub frag: u8,
    /// Where the client wants the payload to go.
    pub destination: Destination,
    /// The payload.
    pub payload: &'a [u8],
}

/// Why a datagram's header is not a SOCKS5 UDP request header.
#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone, Copy)]
pub enum UdpHeaderError {
    /// Shorter than its header.
    #[error("datagram shorter than its SOCKS5 header")]
    Truncated,
    /// The two reserved bytes are not zero.
    #[error("reserved bytes are not zero")]
    NonZeroReserved,
    /// ATYP is none of IPv4, domain, IPv6.
    #[error("unknown address type {0:#04x}")]
    BadAddressType(u8),
    /// The domain name is empty, not UTF-8, or holds control characters
    /// or whitespace.
    #[error("malformed domain name")]
    BadDomain,
}

/// Reads the header of a datagram a client sent to its relay.
pub fn parse_udp_datagram(datagram: &[u8]) -> Result<UdpDatagram<'_>, UdpHeaderError> {
    let [r0, r1, frag, atyp, rest @ ..] = datagram else {
        return Err(UdpHeaderError::Truncated);
    };
    if (*r0, *r1) != (0, 0) {
        return Err(UdpHeaderError::NonZeroReserved);
    }
    let (ip, rest): (Option<IpAddr>, &[u8]) = match *atyp {
        ATYP_IPV4 => {
            let (octets, rest) = split::<4>(rest)?;
            (Some(Ipv4Addr::from(octets).into()), rest)
        }
        ATYP_IPV6 => {
            let (octets, rest) = split::<16>(rest)?;
            (Some(Ipv6Addr::from(octets).into()), rest)
        }
        ATYP_DOMAIN => (None, rest),
        other => return Err(UdpHeaderError::BadAddressType(other)),
    };
    let (destination, rest) = match ip {
        Some(ip) => {
            let (port, rest) = split::<2>(rest)?;
            let port = u16::from_be_bytes(port);
            (Destination::Ip(SocketAddr::new(ip, port)), rest)
        }
        None => {
            let (&len, rest) = rest.split_first().ok_or(UdpHeaderError::Truncated)?;
            let len = usize::from(len);
            if rest.len() < len {
                return Err(UdpHeaderError::Truncated);
            }
            let (name, rest) = rest.split_at(len);
            let (port, rest) = split::<2>(rest)?;
            let host = parse_domain(name).map_err(|_| UdpHeaderError::BadDomain)?;
            let port = u16::from_be_bytes(port);
            (Destination::Domain { host, port }, rest)
        }
    };
    Ok(UdpDatagram {
        frag: *frag,
        destination,
        payload: rest,
    })
}

/// The first `N` bytes as an array, and the rest.
fn split<const N: usize>(bytes: &[u8]) -> Result<([u8; N], &[u8]), UdpHeaderError> {
    if bytes.len() < N {
        return Err(UdpHeaderError::Truncated);
    }
    let (head, rest) = bytes.split_at(N);
    let mut array = [0u8; N];
    array.copy_from_slice(head);
    Ok((array, rest))
}

/// Writes the header for a datagram that came from `source` into `out`
/// (cleared first); the payload goes after it. An IPv4-mapped IPv6 source
/// is written as IPv4, which is what the client sent to.
pub fn encode_udp_header(source: SocketAddr, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&[0, 0, 0]);
    let ip = match source.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    match ip {
        IpAddr::V4(v4) => {
            out.push(ATYP_IPV4);
            out.extend_from_slice(&v4.octets());
        }
        IpAddr::V6(v6) => {
            out.push(ATYP_IPV6);
            out.extend_from_slice(&v6.octets());
        }
    }
    out.extend_from_slice(&source.port().to_be_bytes());
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;

    #[test]
    fn ipv4_round_trip() {
        let source: SocketAddr = "192.0.2.7:5353".parse().unwrap();
        let mut datagram = Vec::new();
        encode_udp_header(source, &mut datagram);
        assert_eq!(datagram.len(), HEADER_V4);
        datagram.extend_from_slice(b"hello");
        let parsed = parse_udp_datagram(&datagram).unwrap();
        assert_eq!(parsed.frag, 0);
        assert_eq!(parsed.destination, Destination::Ip(source));
        assert_eq!(parsed.payload, b"hello");
    }

    #[test]
    fn ipv6_and_mapped_sources() {
        let source: SocketAddr = "[2001:db8::1]:53".parse().unwrap();
        let mut datagram = Vec::new();
        encode_udp_header(source, &mut datagram);
        assert_eq!(datagram.len(), HEADER_V4 + 12);
        assert_eq!(
            parse_udp_datagram(&datagram).unwrap().destination,
            Destination::Ip(source)
        );
        let mapped: SocketAddr = "[::ffff:10.0.0.1]:53".parse().unwrap();
        encode_udp_header(mapped, &mut datagram);
        assert_eq!(datagram[3], ATYP_IPV4);
        assert_eq!(&datagram[4..8], &[10, 0, 0, 1]);
    }

    #[test]
    fn domain_destination_and_empty_payload() {
        let mut datagram = vec![0, 0, 0, ATYP_DOMAIN, 11];
        datagram.extend_from_slice(b"example.org");
        datagram.extend_from_slice(&53u16.to_be_bytes());
        let parsed = parse_udp_datagram(&datagram).unwrap();
        assert_eq!(
            parsed.destination,
            Destination::Domain {
                host: "example.org".into(),
                port: 53
            }
        );
        assert!(parsed.payload.is_empty());
    }

    #[test]
    fn fragments_parse_with_their_number() {
        let datagram = [0, 0, 1, ATYP_IPV4, 127, 0, 0, 1, 0, 7, b'x'];
        assert_eq!(parse_udp_datagram(&datagram).unwrap().frag, 1);
    }

    #[test]
    fn bad_headers() {
        use UdpHeaderError::*;
        let cases: [(&[u8], UdpHeaderError); 8] = [
            (&[], Truncated),
            (&[0, 0, 0], Truncated),
            (&[0, 0, 0, ATYP_IPV4, 1, 2, 3], Truncated),
            (&[0, 0, 0, ATYP_IPV4, 1, 2, 3, 4, 0], Truncated),
            (&[0, 0, 0, ATYP_DOMAIN, 5, b'a'], Truncated),
            (&[0, 1, 0, ATYP_IPV4, 1, 2, 3, 4, 0, 1], NonZeroReserved),
            (&[0, 0, 0, 9, 1, 2, 3, 4, 0, 1], BadAddressType(9)),
            (&[0, 0, 0, ATYP_DOMAIN, 0, 0, 53], BadDomain),
        ];
        for (bytes, error) in cases {
            assert_eq!(parse_udp_datagram(bytes), Err(error), "{bytes:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
            let _ = parse_udp_datagram(&bytes);
        }
    }
}
