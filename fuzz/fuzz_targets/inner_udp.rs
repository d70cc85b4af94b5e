//! The DNS gateway's reading of an inner packet (protocol/src/udp.rs) on
//! arbitrary bytes (IPv4 or IPv6). Checked: no panic; what `datagram` accepts has a payload
//! inside the packet; and building that datagram again gives a packet that
//! reads back to the same addresses, ports and payload.
#![no_main]

use blipless_protocol::udp::{build, datagram};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|packet: &[u8]| {
    let Some(read) = datagram(packet) else {
        return;
    };
    assert!(read.payload.len() + 28 <= packet.len());
    let rebuilt = build(&read).expect("a payload read from a packet fits one");
    assert_eq!(datagram(&rebuilt), Some(read));
});
