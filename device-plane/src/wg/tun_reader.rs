//! The return path of WireGuard clients' packets: what the kernel routes
//! back into the TUN device is read from each of this plane's queues, held
//! to the receiving client's limits, and sent to the ingress in batches
//! addressed by inner destination ([`read_queue`], run by
//! [`super::packets::PacketPath`] for every queue it holds).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use blipless_protocol::channel::{Packets, ToIngress};
use blipless_protocol::offload::{self, VnetHeader, HEADER_LEN};
use tokio_seqpacket::UnixSeqpacket;
use tokio_util::sync::CancellationToken;

use super::accounting::{admit, Way};
use super::packets::{PacketCounters, BATCH_PACKETS, MAX_PACKET};
use super::tun::TunQueue;
use crate::clients::Directory;

/// Reads one queue, sending batches to the ingress, until `stop`. Stopping
/// happens only between batches: a packet read is always sent on.
pub(super) async fn read_queue(
    queue: Arc<TunQueue>,
    channel: Arc<Mutex<Option<Arc<UnixSeqpacket>>>>,
    counters: Arc<PacketCounters>,
    directory: Arc<Directory>,
    stop: CancellationToken,
) {
    // A packet to a WireGuard client passes its client's limits, or is dropped.
    let admitted = |packet: &[u8]| {
        let client = blipless_protocol::ip::destination(packet)
            .and_then(|destination| directory.by_address(destination));
        match client {
            Some(client) if !admit(&client, Way::Down, packet.len()) => {
                counters.limited.fetch_add(1, Ordering::Relaxed);
                false
            }
            _ => true,
        }
    };
    // An offload queue's reads start with a virtio-net header, and a TCP
    // super-packet is cut into its segments before it joins a batch.
    let offload = queue.offload();
    let mut buffer = vec![0u8; MAX_PACKET + HEADER_LEN];
    let mut segment = Vec::new();
    let mut read_one = |read: &mut [u8], batch: &mut Packets<'static>, batches: &mut Vec<_>| {
        let mut add = |packet: &[u8]| {
            if !admitted(packet) {
                return;
            }
            if !batch.try_push(packet) {
                batches.push(std::mem::replace(batch, Packets::new(0)));
                let _ = batch.try_push(packet);
            }
        };
        if !offload {
            add(read);
            return;
        }
        let at = HEADER_LEN.min(read.len());
        let (header, packet) = read.split_at_mut(at);
        let split = VnetHeader::decode(header)
            .and_then(|header| offload::split(header, packet, &mut segment, &mut add));
        match split {
            Ok(1) => {}
            Ok(_) => {
                counters.super_reads.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => {
                counters.lost.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%error, "a packet from the TUN device was dropped");
            }
        }
    };
    loop {
        let first = tokio::select! {
            read = queue.recv(&mut buffer) => read,
            () = stop.cancelled() => break,
        };
        let length = match first {
            Ok(length) => length,
            Err(error) => {
                tracing::warn!(%error, "reading the TUN device failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let mut batch = Packets::new(0);
        let mut batches = Vec::new();
        read_one(&mut buffer[..length], &mut batch, &mut batches);
        for _ in 1..BATCH_PACKETS {
            match queue.try_recv(&mut buffer) {
                Ok(Some(length)) => read_one(&mut buffer[..length], &mut batch, &mut batches),
                Ok(None) | Err(_) => break,
            }
        }
        if !batch.is_empty() {
            batches.push(batch);
        }
        if !batches.is_empty() {
            send_batches(&channel, &counters, batches).await;
        }
    }
}

async fn send_batches(
    channel: &Mutex<Option<Arc<UnixSeqpacket>>>,
    counters: &PacketCounters,
    batches: Vec<Packets<'static>>,
) {
    let socket = channel
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    for batch in batches {
        let count = batch.len() as u64;
        let Some(socket) = &socket else {
            counters.lost.fetch_add(count, Ordering::Relaxed);
            continue;
        };
        match blipless_link::send(socket, &ToIngress::Packets(batch), &[]).await {
            Ok(()) => counters.from_tun.fetch_add(count, Ordering::Relaxed),
            Err(error) => {
                tracing::debug!(%error, "sending packets to the ingress failed");
                counters.lost.fetch_add(count, Ordering::Relaxed)
            }
        };
    }
}
