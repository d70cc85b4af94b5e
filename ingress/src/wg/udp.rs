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

/// Datagrams waiting to be sent, grouped for GSO.
#[derive(Debug, Default)]
pub struct Outgoing {
    groups: Vec<Group>,
}

#[derive(Debug)]
struct Group {
    destination: SocketAddr,
    segment: usize,
    count: usize,
    bytes: Vec<u8>,
    /// The last segment was shorter: nothing more may join.
    closed: bool,
}

impl Outgoing {
    /// Queues `datagram` for `destination`; `max_segments` is the socket's GSO limit.
    pub fn push(&mut self, destination: SocketAddr, datagram: &[u8], max_segments: usize) {
        if let Some(group) = self.groups.last_mut() {
            let joins = group.destination == destination
                && !group.closed
                && group.count < max_segments
                && datagram.len() <= group.segment
                && group.bytes.len() + datagram.len() <= MAX_DATAGRAM;
            if joins {
                group.bytes.extend_from_slice(datagram);
                group.count += 1;
                group.closed = datagram.len() < group.segment;
                return;
            }
        }
        self.groups.push(Group {
            destination,
            segment: datagram.len(),
            count: 1,
            bytes: datagram.to_vec(),
            closed: false,
        });
    }

    /// Sends everything queued; returns how many datagrams failed to go out
    /// (each failure is logged at debug: UDP sends fail only on local errors).
    pub async fn flush(&mut self, socket: &WgSocket) -> usize {
        let mut failed = 0;
        for group in self.groups.drain(..) {
            let transmit = Transmit {
                destination: group.destination,
                ecn: None,
                contents: &group.bytes,
                segment_size: (group.count > 1).then_some(group.segment),
                src_ip: None,
            };
            if let Err(error) = socket.send(&transmit).await {
                tracing::debug!(destination = %group.destination, %error, "WireGuard send failed");
                failed += group.count;
            }
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
