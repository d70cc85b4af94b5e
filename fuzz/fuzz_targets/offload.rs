//! TUN offload (protocol/src/offload.rs) on arbitrary bytes: the first 10 as
//! a virtio-net header and the rest as what an offload queue read, given to
//! `split`; then the same bytes cut into packets (a length byte before
//! each) and pushed through a `Coalescer`. Checked: no panic; no segment
//! over 64 KiB; every pushed packet written exactly once; and a joined
//! super-packet, cut again as the kernel would, gives as many segments as
//! it joined.
#![no_main]

use blipless_protocol::offload::{split, Coalescer, VnetHeader, Write, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(header) = VnetHeader::decode(data) {
        let mut packet = data[HEADER_LEN..].to_vec();
        let mut scratch = Vec::new();
        let mut emitted = 0;
        let result = split(header, &mut packet, &mut scratch, |segment| {
            assert!(segment.len() <= 65_535 + 60);
            emitted += 1;
        });
        if let Ok(count) = result {
            assert_eq!(count, emitted);
        }
    }

    let mut packets = Vec::new();
    let mut rest = data;
    while let Some((&length, tail)) = rest.split_first() {
        let length = usize::from(length).min(tail.len());
        packets.push(&tail[..length]);
        rest = &tail[length..];
    }
    let mut coalescer = Coalescer::new();
    let mut writes = Vec::new();
    for packet in &packets {
        coalescer.push(packet, &mut writes);
    }
    coalescer.finish(&mut writes);
    assert_eq!(
        writes.iter().map(Write::segments).sum::<usize>(),
        packets.len()
    );
    for write in &writes {
        if let Write::Joined { header, segments, .. } = write {
            let mut packet = write.to_vec();
            assert_eq!(packet.len(), write.len());
            let mut scratch = Vec::new();
            let count =
                split(*header, &mut packet, &mut scratch, |_| {}).expect("a joined packet cuts");
            assert_eq!(count, *segments);
        }
    }
});
