//! WireGuard datagram classification and steering, on arbitrary UDP
//! payloads, as the ingress receives them (ingress/src/wg/mod.rs,
//! `handle_datagram`): boringtun's `Tunn::parse_incoming_packet`, the rate
//! limiter's `verify_packet` (what initiations go through) and
//! `parse_handshake_anon` on an initiation must not panic. Steering
//! (ingress/src/wg/steer.rs): the Rust mirror `steer::member_for` must pick
//! the member the classic BPF program `steer::program` picks (run here by a
//! small cBPF interpreter, as the kernel would), always 0 or 1 for a
//! generation of 0 or 1; and for every datagram boringtun accepts, the member
//! must be the one the peer-index layout (ingress/src/wg/peers.rs: bit 23 of
//! the peer index, bit 31 of the receiver index) names: initiations to the
//! newest generation, everything else to the generation of its receiver
//! index.
#![no_main]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::OnceLock;

use blipless_ingress::wg::peers::GENERATION_BIT;
use blipless_ingress::wg::steer;
use boringtun::noise::handshake::parse_handshake_anon;
use boringtun::noise::rate_limiter::RateLimiter;
use boringtun::noise::{Packet, Tunn};
use boringtun::x25519::{PublicKey, StaticSecret};
use libfuzzer_sys::fuzz_target;

// The instructions the steering program uses (linux/filter.h).
const LD_B_ABS: u16 = 0x30;
const JEQ_K: u16 = 0x15;
const JA: u16 = 0x05;
const RSH_K: u16 = 0x74;
const RET_K: u16 = 0x06;
const RET_A: u16 = 0x16;

/// One instruction, `struct sock_filter`: (code, jt, jf, k).
type Instruction = (u16, u8, u8, u32);

/// Runs a classic BPF program over `packet` as the kernel does for these
/// instructions: a load past the end ends the program with 0.
fn run(program: &[Instruction], packet: &[u8]) -> u32 {
    let (mut a, mut pc) = (0u32, 0usize);
    loop {
        let (code, jt, jf, k) = program[pc];
        pc += 1;
        match code {
            LD_B_ABS => match packet.get(k as usize) {
                Some(byte) => a = u32::from(*byte),
                None => return 0,
            },
            JEQ_K if a == k => pc += usize::from(jt),
            JEQ_K => pc += usize::from(jf),
            JA => pc += k as usize,
            RSH_K => a >>= k,
            RET_K => return k,
            RET_A => return a,
            other => panic!("instruction {other:#x} is not interpreted"),
        }
    }
}

struct Node {
    private: StaticSecret,
    public: PublicKey,
    limiter: RateLimiter,
    programs: [Vec<Instruction>; 2],
}

fn node() -> &'static Node {
    static NODE: OnceLock<Node> = OnceLock::new();
    NODE.get_or_init(|| {
        let private = StaticSecret::from([0x42; 32]);
        let public = PublicKey::from(&private);
        let program = |newest| {
            steer::program(newest)
                .iter()
                .map(|i| (i.code, i.jt, i.jf, i.k))
                .collect()
        };
        Node {
            limiter: RateLimiter::new(&public, 10),
            private,
            public,
            programs: [program(0), program(1)],
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let node = node();
    for newest in [0u32, 1] {
        let member = steer::member_for(data, newest);
        assert_eq!(
            member,
            run(&node.programs[newest as usize], data),
            "the mirror and the program disagree (newest {newest})"
        );
        assert!(member <= 1);
    }

    if let Ok(packet) = Tunn::parse_incoming_packet(data) {
        let receiver_index = match &packet {
            Packet::HandshakeInit(init) => {
                let _ = parse_handshake_anon(&node.private, &node.public, init);
                None
            }
            Packet::HandshakeResponse(response) => Some(response.receiver_idx),
            Packet::PacketCookieReply(reply) => Some(reply.receiver_idx),
            Packet::PacketData(packet_data) => Some(packet_data.receiver_idx),
        };
        for newest in [0u32, 1] {
            let expected = match receiver_index {
                None => newest,
                // The receiver index is `peer_index << 8 | n`.
                Some(index) => u32::from((index >> 8) & GENERATION_BIT != 0),
            };
            assert_eq!(
                steer::member_for(data, newest),
                expected,
                "{packet:?} steered away from its generation"
            );
        }
    }

    let mut buffer = [0u8; 256];
    let _ = node
        .limiter
        .verify_packet(Some(IpAddr::V4(Ipv4Addr::LOCALHOST)), data, &mut buffer);
});
