//! The SOCKS5 UDP request header (protocol/src/socks5/udp.rs) on arbitrary
//! datagrams, as a UDP ASSOCIATE relay reads them. Checked: no panic; the
//! payload is the datagram's tail after a header of at least 8 bytes; and a
//! datagram whose destination is an
//! address, written again behind a header the relay builds, parses to the
//! same address and payload.
#![no_main]

use blipless_protocol::socks5::udp::{encode_udp_header, parse_udp_datagram};
use blipless_protocol::socks5::Destination;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(datagram) = parse_udp_datagram(data) else {
        return;
    };
    assert!(data.ends_with(datagram.payload));
    // The shortest header: a one-byte name (4 + 1 + 1 + 2 bytes).
    assert!(data.len() - datagram.payload.len() >= 8);
    if let Destination::Ip(address) = datagram.destination {
        let mut again = Vec::new();
        encode_udp_header(address, &mut again);
        again.extend_from_slice(datagram.payload);
        let parsed = parse_udp_datagram(&again).expect("a header it built parses");
        assert_eq!(parsed.frag, 0);
        assert_eq!(parsed.payload, datagram.payload);
        let Destination::Ip(back) = parsed.destination else {
            panic!("an address came back as a name");
        };
        assert_eq!(back.port(), address.port());
        let canonical = |ip: std::net::IpAddr| match ip {
            std::net::IpAddr::V6(v6) => v6
                .to_ipv4_mapped()
                .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4),
            v4 => v4,
        };
        assert_eq!(back.ip(), canonical(address.ip()));
    }
});
