//! Inner packets on their way to the device plane: collected per peer while a
//! receive batch is decrypted ([`InnerBatches`]), sent to the active plane
//! through [`crate::dispatch`], and held in order, up to `wireguard.queue`
//! packets, while no plane is active ([`Held`]).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use blipless_protocol::channel::{Packets, ToDevice};
use tokio_util::sync::CancellationToken;

use super::Wireguard;
use crate::dispatch::{self, Wait};

/// Inner packets waiting for an active device plane.
#[derive(Debug, Default)]
pub(super) struct Held {
    batches: VecDeque<Packets<'static>>,
    packets: usize,
}

/// Inner packets of one receive batch, per peer, in the order peers appeared.
#[derive(Default)]
pub(super) struct InnerBatches {
    inner: HashMap<u32, Vec<Packets<'static>>>,
    order: Vec<u32>,
}

impl InnerBatches {
    pub(super) fn push(&mut self, peer: u32, packet: &[u8]) {
        let batches = self.inner.entry(peer).or_insert_with(|| {
            self.order.push(peer);
            Vec::new()
        });
        if let Some(last) = batches.last_mut() {
            if last.try_push(packet) {
                return;
            }
        }
        let mut batch = Packets::new(peer);
        // A packet of at most 65535 bytes always fits an empty batch.
        let _ = batch.try_push(packet);
        batches.push(batch);
    }

    pub(super) fn take(&mut self) -> Vec<Packets<'static>> {
        let mut out = Vec::new();
        for peer in self.order.drain(..) {
            if let Some(batches) = self.inner.remove(&peer) {
                out.extend(batches);
            }
        }
        out
    }
}

impl Wireguard {
    /// Sends inner packets to the active plane, or holds them while none is.
    pub(super) async fn to_plane(&self, batches: Vec<Packets<'static>>) {
        let mut pending: VecDeque<Packets<'static>> = batches.into();
        if self.held_is_empty() {
            while let Some(batch) = pending.pop_front() {
                if let Err(batch) = self.send_to_active(batch).await {
                    pending.push_front(batch);
                    break;
                }
            }
        }
        if !pending.is_empty() {
            self.hold(pending);
        }
    }

    /// Sends a batch to the active plane; gives it back when none took it.
    async fn send_to_active(&self, batch: Packets<'static>) -> Result<(), Packets<'static>> {
        let message = ToDevice::Packets(batch);
        let taken = dispatch::to_active(&self.planes, &message, &[], None, Wait::No).await;
        match (taken, message) {
            (None, ToDevice::Packets(batch)) => Err(batch),
            _ => Ok(()),
        }
    }

    fn held_is_empty(&self) -> bool {
        self.lock_held().batches.is_empty()
    }

    fn lock_held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn hold(&self, batches: VecDeque<Packets<'static>>) {
        let mut held = self.lock_held();
        for batch in batches {
            let count = batch.len();
            if held.packets + count > self.queue_limit {
                self.metrics.count_drops("queue_full", count);
                continue;
            }
            held.packets += count;
            held.batches.push_back(batch);
        }
        self.metrics.set_held(held.packets);
        drop(held);
        self.held_changed.notify_one();
    }

    /// Delivers held packets, in order, whenever a plane is active.
    pub(super) async fn deliver_held(self: Arc<Self>, shutdown: CancellationToken) {
        let mut active = self.planes.subscribe();
        loop {
            loop {
                let next = self.lock_held().batches.pop_front();
                let Some(batch) = next else { break };
                let count = batch.len();
                match self.send_to_active(batch).await {
                    Ok(()) => {
                        let mut held = self.lock_held();
                        held.packets = held.packets.saturating_sub(count);
                        self.metrics.set_held(held.packets);
                    }
                    Err(batch) => {
                        self.lock_held().batches.push_front(batch);
                        break;
                    }
                }
            }
            tokio::select! {
                changed = active.changed() => if changed.is_err() { return },
                () = self.held_changed.notified() => {}
                () = shutdown.cancelled() => return,
                // A plane that is active but briefly unable to take packets.
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
    }
}
