//! An in-process WireGuard peer built on boringtun, for what a real client
//! cannot be made to do: send junk, truncated and replayed messages, flood
//! handshake initiations, or stand in for hundreds of peers at once.
//!
//! The real client of the end-to-end tests is wireguard-go ([`crate::wireguard`]);
//! this one speaks the same protocol through the same UDP port, on a blocking
//! socket, from whatever network namespace its thread is in ([`in_netns`]).

use std::io;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use boringtun::noise::{Tunn, TunnResult};
use boringtun::x25519::{PublicKey, StaticSecret};

/// Runs `work` on a thread that has entered the network namespace `netns`
/// (sockets it creates live there), and returns what it returns.
pub fn in_netns<T: Send + 'static>(netns: &str, work: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/var/run/netns/{netns}");
    let thread = std::thread::spawn(move || {
        let file =
            std::fs::File::open(&path).unwrap_or_else(|error| panic!("opening {path}: {error}"));
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
            .unwrap_or_else(|error| panic!("entering {path}: {error}"));
        work()
    });
    match thread.join() {
        Ok(value) => value,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// One WireGuard peer talking to `endpoint`.
pub struct TestPeer {
    tunnel: Tunn,
    socket: UdpSocket,
    endpoint: SocketAddr,
    /// The peer's tunnel address.
    pub address: Ipv4Addr,
    buffer: Vec<u8>,
}

impl std::fmt::Debug for TestPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestPeer")
            .field("address", &self.address)
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl TestPeer {
    /// A peer with `private_key`, talking to the server `server_public` at
    /// `endpoint`, from a fresh UDP socket.
    pub fn new(
        private_key: [u8; 32],
        server_public: [u8; 32],
        address: Ipv4Addr,
        endpoint: SocketAddr,
        index: u32,
    ) -> io::Result<Self> {
        let socket = UdpSocket::bind(if endpoint.is_ipv4() {
            "0.0.0.0:0"
        } else {
            "[::]:0"
        })?;
        Ok(Self {
            tunnel: Tunn::new(
                StaticSecret::from(private_key),
                PublicKey::from(server_public),
                None,
                None,
                index,
                None,
            ),
            socket,
            endpoint,
            address,
            buffer: vec![0u8; 65_536],
        })
    }

    /// Moves to a fresh UDP socket (a new source port), as a client behind a
    /// NAT that changed its mapping would: the session stays.
    pub fn rebind(&mut self) -> io::Result<()> {
        self.socket = UdpSocket::bind(if self.endpoint.is_ipv4() {
            "0.0.0.0:0"
        } else {
            "[::]:0"
        })?;
        Ok(())
    }

    /// Moves to a fresh UDP socket bound to `local` (another source
    /// address of the namespace, say).
    pub fn bind_to(&mut self, local: SocketAddr) -> io::Result<()> {
        self.socket = UdpSocket::bind(local)?;
        Ok(())
    }

    /// Hands a datagram from the server to this peer's state: a cookie
    /// reply is kept, and the next initiation carries its mac2.
    pub fn receive(&mut self, datagram: &[u8]) {
        let _ = self.tunnel.decapsulate(None, datagram, &mut self.buffer);
    }

    /// The UDP socket (to send raw datagrams from the same address).
    pub fn socket(&self) -> &UdpSocket {
        &self.socket
    }

    /// A handshake initiation, as this peer would send it (not sent).
    pub fn initiation(&mut self) -> Option<Vec<u8>> {
        match self
            .tunnel
            .format_handshake_initiation(&mut self.buffer, true)
        {
            TunnResult::WriteToNetwork(bytes) => Some(bytes.to_vec()),
            _ => None,
        }
    }

    /// Makes a session: initiation, response, keepalive.
    pub fn handshake(&mut self, timeout: Duration) -> io::Result<()> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            let Some(initiation) = self.initiation() else {
                return Err(io::Error::other("boringtun made no initiation"));
            };
            self.socket.send_to(&initiation, self.endpoint)?;
            self.socket
                .set_read_timeout(Some(Duration::from_millis(500)))?;
            let mut datagram = [0u8; 2048];
            let Ok((length, _)) = self.socket.recv_from(&mut datagram) else {
                continue;
            };
            if let TunnResult::WriteToNetwork(keepalive) =
                self.tunnel
                    .decapsulate(None, &datagram[..length], &mut self.buffer)
            {
                let keepalive = keepalive.to_vec();
                self.socket.send_to(&keepalive, self.endpoint)?;
                return Ok(());
            }
        }
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "no handshake response",
        ))
    }

    /// Encrypts and sends one inner packet; returns the datagram sent.
    pub fn send_inner(&mut self, packet: &[u8]) -> io::Result<Vec<u8>> {
        match self.tunnel.encapsulate(packet, &mut self.buffer) {
            TunnResult::WriteToNetwork(datagram) => {
                let datagram = datagram.to_vec();
                self.socket.send_to(&datagram, self.endpoint)?;
                Ok(datagram)
            }
            other => Err(io::Error::other(format!(
                "no session to send on: {other:?}"
            ))),
        }
    }

    /// Receives until an inner packet arrives or `timeout` passes.
    pub fn recv_inner(&mut self, timeout: Duration) -> io::Result<Option<Vec<u8>>> {
        let deadline = Instant::now() + timeout;
        let mut datagram = [0u8; 65_536];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            self.socket.set_read_timeout(Some(left))?;
            let length = match self.socket.recv_from(&mut datagram) {
                Ok((length, _)) => length,
                Err(error)
                    if matches!(
                        error.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(None)
                }
                Err(error) => return Err(error),
            };
            match self
                .tunnel
                .decapsulate(None, &datagram[..length], &mut self.buffer)
            {
                TunnResult::WriteToTunnelV4(packet, _) => return Ok(Some(packet.to_vec())),
                TunnResult::WriteToTunnelV6(packet, _) => return Ok(Some(packet.to_vec())),
                TunnResult::WriteToNetwork(reply) => {
                    let reply = reply.to_vec();
                    self.socket.send_to(&reply, self.endpoint)?;
                }
                _ => {}
            }
        }
    }
}

/// An IPv4 ICMP echo request from `source` to `destination`.
pub fn icmp_echo(source: Ipv4Addr, destination: Ipv4Addr, id: u16, sequence: u16) -> Vec<u8> {
    let payload = b"blipless test ping";
    let total = 20 + 8 + payload.len();
    let mut packet = vec![0u8; total];
    packet[0] = 0x45;
    packet[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    packet[8] = 64; // TTL
    packet[9] = 1; // ICMP
    packet[12..16].copy_from_slice(&source.octets());
    packet[16..20].copy_from_slice(&destination.octets());
    let header_sum = checksum(&packet[..20]);
    packet[10..12].copy_from_slice(&header_sum.to_be_bytes());
    packet[20] = 8; // echo request
    packet[24..26].copy_from_slice(&id.to_be_bytes());
    packet[26..28].copy_from_slice(&sequence.to_be_bytes());
    packet[28..].copy_from_slice(payload);
    let icmp_sum = checksum(&packet[20..]);
    packet[22..24].copy_from_slice(&icmp_sum.to_be_bytes());
    packet
}

/// True when `packet` is an IPv4 ICMP echo reply with this id and sequence.
pub fn is_echo_reply(packet: &[u8], id: u16, sequence: u16) -> bool {
    packet.len() >= 28
        && packet[0] >> 4 == 4
        && packet[9] == 1
        && packet[20] == 0
        && packet[24..26] == id.to_be_bytes()
        && packet[26..28] == sequence.to_be_bytes()
}

/// The Internet checksum (RFC 1071).
fn checksum(bytes: &[u8]) -> u16 {
    let mut sum = 0u32;
    for pair in bytes.chunks(2) {
        let word = u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]);
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_requests_carry_valid_checksums() {
        let packet = icmp_echo(
            Ipv4Addr::new(10, 64, 0, 2),
            Ipv4Addr::new(10, 1, 2, 2),
            7,
            9,
        );
        assert_eq!(checksum(&packet[..20]), 0, "header checksum verifies");
        assert_eq!(checksum(&packet[20..]), 0, "ICMP checksum verifies");
        let mut reply = packet.clone();
        reply[20] = 0;
        assert!(is_echo_reply(&reply, 7, 9));
        assert!(!is_echo_reply(&reply, 7, 10));
    }
}
