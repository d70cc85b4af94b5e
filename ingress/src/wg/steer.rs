//! The WireGuard UDP port as a SO_REUSEPORT group with room for two ingress
//! generations, and the classic BPF program that steers datagrams between them
//! (docs/ARCHITECTURE.md, "Two generations on one UDP port"): one of the two audited modules of the ingress that use `unsafe` (with `watched_listener.rs`).
//!
//! The group has exactly two members, bound once, in order: member 0 belongs to
//! generation 0 and member 1 to generation 1. An ingress reads only its own
//! generation's member; at a handoff both members' fds move to the successor,
//! which takes the other generation. Since neither member is ever closed while
//! an ingress lives, their indices in the group never change.
//!
//! The program, run by the kernel on each datagram's UDP payload:
//! - a handshake initiation (type 1) goes to the newest generation;
//! - a handshake response (type 2) by bit 31 of its receiver index (bytes
//!   8..12, little-endian: the top bit of byte 11), every other message by bit 31
//!   of the receiver index in bytes 4..8 (byte 7). Bit 31 of a receiver index is
//!   bit 23 of the peer index (boringtun shifts it left by 8): the generation.
//!
//! A datagram too short for its load makes the program return 0 (member 0), and
//! junk is dropped there like anywhere else.
//!
//! Audited: the only unsafe operation is one `setsockopt` call whose option
//! value points at a `sock_fprog` and a filter array that live on the stack for
//! the duration of the call; the kernel copies both before returning.

#![allow(unsafe_code)]

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use nix::sys::socket::{
    bind, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType, SockaddrStorage,
};

/// How many generations the group holds.
pub const GENERATIONS: usize = 2;

const LD_B_ABS: u16 = 0x30; // BPF_LD | BPF_B | BPF_ABS
const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const JA: u16 = 0x05; // BPF_JMP | BPF_JA
const RSH_K: u16 = 0x74; // BPF_ALU | BPF_RSH | BPF_K
const RET_K: u16 = 0x06; // BPF_RET | BPF_K
const RET_A: u16 = 0x16; // BPF_RET | BPF_A

fn op(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The steering program with initiations going to `newest` (0 or 1).
pub fn program(newest: u32) -> [libc::sock_filter; 9] {
    [
        op(LD_B_ABS, 0, 0, 0),   // 0: A = message type
        op(JEQ_K, 0, 1, 1),      // 1: initiation? 2 : 3
        op(RET_K, 0, 0, newest), // 2: the newest generation
        op(JEQ_K, 0, 2, 2),      // 3: response? 4 : 6
        op(LD_B_ABS, 0, 0, 11),  // 4: A = top byte of the receiver index
        op(JA, 0, 0, 1),         // 5: skip 6
        op(LD_B_ABS, 0, 0, 7),   // 6: A = top byte of the receiver index
        op(RSH_K, 0, 0, 7),      // 7: A = its top bit: the generation
        op(RET_A, 0, 0, 0),      // 8: that member
    ]
}

/// The member [`program`]`(newest)` picks for a datagram (its UDP payload),
/// decided in Rust: the same reads and the same answer, for the tests and the
/// fuzz target (fuzz/fuzz_targets/wg_datagram.rs). The kernel runs the
/// program itself; nothing calls this at run time.
pub fn member_for(datagram: &[u8], newest: u32) -> u32 {
    // A load past the end ends the program with 0.
    let top_bit = |at: usize| datagram.get(at).map_or(0, |byte| u32::from(byte >> 7));
    match datagram.first() {
        None => 0,
        Some(1) => newest,
        Some(2) => top_bit(11),
        Some(_) => top_bit(7),
    }
}

/// Binds the two members of a fresh group on `address` (member 1 on the port
/// member 0 got, when `address` asks for port 0).
pub fn bind_group(address: SocketAddr) -> io::Result<[UdpSocket; GENERATIONS]> {
    let first = bind_member(address)?;
    let bound = first.local_addr()?;
    let second = bind_member(bound)?;
    Ok([first, second])
}

fn bind_member(address: SocketAddr) -> io::Result<UdpSocket> {
    let family = if address.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    let fd: OwnedFd = socket(family, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None)?;
    setsockopt(&fd, sockopt::ReusePort, &true)?;
    bind(fd.as_raw_fd(), &SockaddrStorage::from(address))?;
    Ok(UdpSocket::from(fd))
}

/// Attaches the steering program to the group `member` belongs to, with
/// initiations going to generation `newest`. Replaces any program attached.
pub fn steer(member: BorrowedFd<'_>, newest: u32) -> io::Result<()> {
    let mut filter = program(newest & 1);
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_mut_ptr(),
    };
    // SAFETY: `prog` and the `filter` array it points to are valid, initialised
    // and live on this stack frame until `setsockopt` returns; the kernel copies
    // the program (sk_reuseport_attach_filter) and keeps no pointer to them. The
    // length passed is exactly the size of `prog`, and `member` is an open fd
    // borrowed for the call.
    let result = unsafe {
        libc::setsockopt(
            member.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            std::ptr::addr_of!(prog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::time::Duration;

    /// Runs a classic BPF program over `packet` as the kernel does, for the
    /// instructions [`program`] uses (a load past the end returns 0).
    fn run(program: &[libc::sock_filter], packet: &[u8]) -> u32 {
        let (mut a, mut pc) = (0u32, 0usize);
        loop {
            let instruction = program[pc];
            pc += 1;
            match instruction.code {
                LD_B_ABS => match packet.get(instruction.k as usize) {
                    Some(byte) => a = u32::from(*byte),
                    None => return 0,
                },
                JEQ_K if a == instruction.k => pc += usize::from(instruction.jt),
                JEQ_K => pc += usize::from(instruction.jf),
                JA => pc += instruction.k as usize,
                RSH_K => a >>= instruction.k,
                RET_K => return instruction.k,
                RET_A => return a,
                other => panic!("instruction {other:#x} is not interpreted"),
            }
        }
    }

    #[test]
    fn the_rust_mirror_decides_as_the_program() {
        let mut samples: Vec<Vec<u8>> = vec![vec![], vec![1], vec![2; 11], vec![4; 7]];
        for kind in [0u8, 1, 2, 3, 4, 5, 0xff] {
            for top in [0x00u8, 0x7f, 0x80, 0xff] {
                for len in [8usize, 12, 32, 64, 92, 148] {
                    let mut datagram = vec![0u8; len];
                    datagram[0] = kind;
                    datagram[7] = top;
                    if len > 11 {
                        datagram[11] = top ^ 0x80;
                    }
                    samples.push(datagram);
                }
            }
        }
        for newest in [0u32, 1] {
            let filter = program(newest);
            for datagram in &samples {
                assert_eq!(
                    member_for(datagram, newest),
                    run(&filter, datagram),
                    "{datagram:02x?}, newest {newest}"
                );
            }
        }
    }

    fn receives(socket: &UdpSocket) -> Option<Vec<u8>> {
        let mut buffer = [0u8; 64];
        socket
            .recv(&mut buffer)
            .ok()
            .map(|length| buffer[..length].to_vec())
    }

    #[test]
    fn datagrams_reach_the_generation_they_name() {
        let group = bind_group("127.0.0.1:0".parse().expect("address")).expect("group");
        for member in &group {
            member
                .set_read_timeout(Some(Duration::from_millis(300)))
                .expect("timeout");
        }
        let target = group[0].local_addr().expect("address");
        assert_eq!(group[1].local_addr().expect("address"), target);
        let sender = UdpSocket::bind("127.0.0.1:0").expect("sender");
        let message = |kind: u8, top_byte_at: usize, top: u8| {
            let mut datagram = vec![0u8; 32];
            datagram[0] = kind;
            datagram[top_byte_at] = top;
            datagram
        };
        for newest in [0u32, 1] {
            steer(group[0].as_fd(), newest).expect("attach");
            let newest = newest as usize;
            let cases = [
                (message(1, 7, 0x80), newest), // initiation: newest, whatever it says
                (message(2, 11, 0x80), 1),     // response, generation 1
                (message(2, 11, 0x00), 0),     // response, generation 0
                (message(4, 7, 0x80), 1),      // data, generation 1
                (message(4, 7, 0x7f), 0),      // data, generation 0
                (message(3, 7, 0x80), 1),      // cookie reply, generation 1
            ];
            for (datagram, member) in cases {
                assert_eq!(member_for(&datagram, newest as u32) as usize, member);
                sender.send_to(&datagram, target).expect("send");
                assert_eq!(
                    receives(&group[member]).as_deref(),
                    Some(datagram.as_slice()),
                    "type {} to member {member}",
                    datagram[0]
                );
                assert_eq!(receives(&group[1 - member]), None, "not to the other");
            }
        }
    }
}
