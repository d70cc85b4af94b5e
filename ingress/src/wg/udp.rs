//! The WireGuard UDP socket, driven through quinn-udp: batched receives with GRO
//! and batched sends with GSO where the kernel offers them.
//!
//! [`Outgoing`] collects datagrams and groups consecutive ones to the same
//! destination and of the same size into one GSO send (the last of a group may
//! be shorter, as the kernel allows).

use std::io::{self, IoSliceMut};
use std::net::SocketAddr;

use quinn_udp::{RecvMeta, Transmit, UdpSockRef, UdpSocketState};
use tokio::io::Interest;
use tokio::net::UdpSocket;

/// Largest datagram handled: WireGuard's overhead on a 65535-byte inner packet
/// is never sent (the MTU is far lower), so one GRO buffer of 64 KiB suffices.
pub const MAX_DATAGRAM: usize = 65_535;

/// The socket and its quinn-udp state.
#[derive(Debug)]
pub struct WgSocket {
    io: UdpSocket,
    state: UdpSocketState,
}

impl WgSocket {
    /// Wraps a bound, non-blocking UDP socket.
    pub fn new(socket: std::net::UdpSocket) -> io::Result<Self> {
        socket.set_nonblocking(true)?;
        let state = UdpSocketState::new(UdpSockRef::from(&socket))?;
        // Room for bursts: a deploy or a handoff may pause reading briefly.
        let _ = state.set_recv_buffer_size(UdpSockRef::from(&socket), 8 << 20);
        let _ = state.set_send_buffer_size(UdpSockRef::from(&socket), 8 << 20);
        Ok(Self {
            io: UdpSocket::from_std(socket)?,
            state,
        })
    }

    /// The UDP port the socket is bound to (0 if the kernel cannot say).
    pub fn local_port(&self) -> u16 {
        self.io
            .local_addr()
            .map(|address| address.port())
            .unwrap_or(0)
    }

    /// Whether datagrams are waiting in the socket's receive queue, not yet
    /// read (`FIONREAD`); an error counts as yes, the careful answer.
    pub fn has_queued(&self) -> bool {
        rustix::io::ioctl_fionread(&self.io).map_or(true, |bytes| bytes > 0)
    }

    /// Segments per GSO send the kernel accepts (1: no GSO).
    pub fn max_gso_segments(&self) -> usize {
        self.state.max_gso_segments()
    }

    /// Receives a batch: fills `meta[..n]`, each datagram group in `bufs[i]`
    /// (split it by `meta[i].stride` when GRO coalesced several).
    pub async fn recv(
        &self,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> io::Result<usize> {
        loop {
            self.io.readable().await?;
            match self.io.try_io(Interest::READABLE, || {
                self.state.recv(UdpSockRef::from(&self.io), bufs, meta)
            }) {
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                other => return other,
            }
        }
    }

    /// Sends one transmit, waiting while the socket buffer is full.
    async fn send(&self, transmit: &Transmit<'_>) -> io::Result<()> {
        loop {
            self.io.writable().await?;
            match self.io.try_io(Interest::WRITABLE, || {
                self.state.try_send(UdpSockRef::from(&self.io), transmit)
            }) {
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                other => return other,
            }
        }
    }
}

/// The most a GSO send may carry: a UDP datagram's largest payload over
/// IPv4 (65,535 less the IP and UDP headers). IPv6 would allow 65,527, but
/// a dual-stack socket reports IPv4 clients as IPv4-mapped IPv6 addresses
/// and sends to them over IPv4: one bound for all costs nothing.
const MAX_GSO_BYTES: usize = 65_507;

/// Bytes a round's buffer keeps across sends at most; a larger one (a
/// round that sent a lot) is cut back after its send.
const KEPT_BUFFER: usize = 4 * 1024 * 1024;

/// Datagrams waiting to be sent, grouped for GSO. Every group of a round
/// lies in one buffer, one after another, and a datagram is written in
/// place at its end ([`Outgoing::push_with`]: an encryption writes straight
/// where it is sent from). The buffer keeps its length across sends, so it
/// is zeroed only when it grows, never per datagram, and holds what a round
/// sent, not a fixed size per group.
#[derive(Debug, Default)]
pub struct Outgoing {
    groups: Vec<Group>,
    bytes: Vec<u8>,
    /// Bytes of `bytes` that hold datagrams.
    used: usize,
}

#[derive(Debug)]
struct Group {
    destination: SocketAddr,
    /// Every datagram's size but the last, which may be shorter.
    segment: usize,
    count: usize,
    /// Where its datagrams lie in the buffer.
    start: usize,
    len: usize,
    /// The last segment was shorter: nothing more may join.
    closed: bool,
}

impl Outgoing {
    /// Queues `datagram` for `destination`; `max_segments` is the socket's GSO limit.
    pub fn push(&mut self, destination: SocketAddr, datagram: &[u8], max_segments: usize) {
        self.push_with(destination, datagram.len(), max_segments, |room| {
            room.get_mut(..datagram.len())?.copy_from_slice(datagram);
            Some(datagram.len())
        });
    }

    /// Queues the datagram `write` makes for `destination` in at most `room`
    /// bytes (the slice it is given), written where it will be sent from;
    /// `write` returns its length, or None when it made none.
    pub fn push_with(
        &mut self,
        destination: SocketAddr,
        room: usize,
        max_segments: usize,
        write: impl FnOnce(&mut [u8]) -> Option<usize>,
    ) {
        let start = self.used;
        if self.bytes.len() < start + room {
            self.bytes.resize(start + room, 0);
        }
        let written = self.bytes[start..start + room].as_mut();
        let Some(len) = write(written).filter(|&len| len > 0 && len <= room) else {
            return;
        };
        self.used += len;
        if let Some(group) = self.groups.last_mut() {
            let joins = group.destination == destination
                && !group.closed
                && group.count < max_segments
                && len <= group.segment
                && group.len + len <= MAX_GSO_BYTES;
            if joins {
                group.count += 1;
                group.len += len;
                group.closed = len < group.segment;
                return;
            }
        }
        self.groups.push(Group {
            destination,
            segment: len,
            count: 1,
            start,
            len,
            closed: false,
        });
    }

    /// Sends everything queued; returns how many datagrams failed to go out
    /// (each failure is logged at debug: UDP sends fail only on local errors).
    pub async fn flush(&mut self, socket: &WgSocket) -> usize {
        let mut failed = 0;
        for group in &self.groups {
            let transmit = Transmit {
                destination: group.destination,
                ecn: None,
                contents: &self.bytes[group.start..group.start + group.len],
                segment_size: (group.count > 1).then_some(group.segment),
                src_ip: None,
            };
            if let Err(error) = socket.send(&transmit).await {
                tracing::debug!(destination = %group.destination, %error, "WireGuard send failed");
                failed += group.count;
            }
        }
        self.groups.clear();
        self.used = 0;
        if self.bytes.len() > KEPT_BUFFER {
            self.bytes.truncate(KEPT_BUFFER);
            self.bytes.shrink_to_fit();
        }
        failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn groups_same_size_runs_per_destination() {
        let mut out = Outgoing::default();
        out.push(addr(1), &[1; 100], 64);
        out.push(addr(1), &[2; 100], 64);
        out.push(addr(1), &[3; 60], 64); // shorter: closes the group
        out.push(addr(1), &[4; 60], 64); // new group
        out.push(addr(2), &[5; 60], 64); // other destination
        out.push(addr(2), &[6; 80], 64); // longer than the segment: new group
        let shape: Vec<(u16, usize, usize)> = out
            .groups
            .iter()
            .map(|g| (g.destination.port(), g.segment, g.count))
            .collect();
        assert_eq!(shape, vec![(1, 100, 3), (1, 60, 1), (2, 60, 1), (2, 80, 1)]);
    }

    #[test]
    fn a_datagram_is_written_in_place_and_nothing_is_queued_when_none_is_made() {
        let mut out = Outgoing::default();
        out.push_with(addr(1), 256, 64, |room| {
            room[..100].fill(1);
            Some(100)
        });
        out.push_with(addr(1), 256, 64, |_| None);
        out.push_with(addr(2), 256, 64, |_| None);
        out.push_with(addr(1), 256, 64, |room| {
            room[..100].fill(2);
            Some(100)
        });
        assert_eq!(
            out.groups.len(),
            1,
            "a write that made nothing leaves no group"
        );
        let group = &out.groups[0];
        assert_eq!((group.count, group.segment, group.len), (2, 100, 200));
        assert_eq!(group.start, 0);
        assert!(out.bytes[..100].iter().all(|&b| b == 1));
        assert!(out.bytes[100..200].iter().all(|&b| b == 2));
    }

    #[test]
    fn a_write_longer_than_its_room_is_not_queued() {
        let mut out = Outgoing::default();
        out.push_with(addr(1), 50, 64, |_| Some(51));
        assert!(out.groups.is_empty());
        assert_eq!(out.used, 0);
    }

    #[test]
    fn many_destinations_take_what_they_send_not_a_buffer_each() {
        let mut out = Outgoing::default();
        for port in 0..10_000u16 {
            out.push(addr(port), &[4; 32], 64);
        }
        assert_eq!(out.groups.len(), 10_000);
        assert!(
            out.bytes.len() < 10_000 * 32 + 1024,
            "{} bytes",
            out.bytes.len()
        );
    }

    #[test]
    fn a_gso_send_stays_within_one_udp_datagram() {
        let mut out = Outgoing::default();
        // 1,365-byte segments: 48 of them would be 65,520 bytes, over IPv4's 65,507.
        for _ in 0..48 {
            out.push(addr(1), &[1; 1365], 64);
        }
        // An IPv4 client on a dual-stack socket: an IPv4-mapped address,
        // sent to over IPv4, with IPv4's bound.
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:51820".parse().expect("address");
        for _ in 0..48 {
            out.push(mapped, &[1; 1365], 64);
        }
        let sizes: Vec<usize> = out.groups.iter().map(|g| g.len).collect();
        assert!(sizes.iter().all(|&len| len <= 65_507), "{sizes:?}");
        assert_eq!(out.groups.iter().map(|g| g.count).sum::<usize>(), 96);
    }

    #[tokio::test]
    async fn group_buffers_are_kept_for_the_next_sends() {
        let receiver = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let sender =
            WgSocket::new(std::net::UdpSocket::bind("127.0.0.1:0").expect("bind")).expect("wrap");
        let to = receiver.local_addr().expect("addr");
        let mut out = Outgoing::default();
        out.push(to, &[1; 100], 64);
        let buffer = out.bytes.as_ptr();
        assert_eq!(out.flush(&sender).await, 0);
        assert!(out.groups.is_empty());
        out.push(to, &[2; 100], 64);
        assert_eq!(out.bytes.as_ptr(), buffer, "the same buffer again");
        assert_eq!(&out.bytes[..100], &[2; 100][..]);
        assert_eq!(out.flush(&sender).await, 0);
    }

    #[test]
    fn no_gso_means_one_datagram_per_group() {
        let mut out = Outgoing::default();
        out.push(addr(1), &[1; 100], 1);
        out.push(addr(1), &[1; 100], 1);
        assert_eq!(out.groups.len(), 2);
    }

    #[tokio::test]
    async fn gso_batches_arrive_as_separate_datagrams() {
        let receiver = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        receiver
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .expect("timeout");
        let sender =
            WgSocket::new(std::net::UdpSocket::bind("127.0.0.1:0").expect("bind")).expect("wrap");
        let to = receiver.local_addr().expect("addr");
        let mut out = Outgoing::default();
        let segments = sender.max_gso_segments();
        for i in 0..5u8 {
            out.push(to, &[i; 200], segments);
        }
        out.push(to, &[9; 50], segments);
        assert_eq!(out.flush(&sender).await, 0);
        let mut buf = [0u8; 2048];
        let mut got = Vec::new();
        for _ in 0..6 {
            let n = receiver.recv(&mut buf).expect("datagram");
            got.push((buf[0], n));
        }
        assert_eq!(
            got,
            vec![(0, 200), (1, 200), (2, 200), (3, 200), (4, 200), (9, 50)]
        );
    }
}
