//! Read-your-writes for client changes (docs/ARCHITECTURE.md, "Client
//! changes, read-your-writes"): `blipless-ctl client add|remove` asks on the
//! control socket; every ready device plane (active or draining) is sent
//! `SyncClients` and must answer `Synced` once it has applied the store's
//! change feed through the given position and sent the peer-set changes
//! that caused. The answer to the operator waits for all of them, up to
//! [`SYNC_WAIT`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use blipless_protocol::channel::{SyncClients, ToDevice};
use blipless_protocol::control::ControlResponse;
use tokio::sync::oneshot;

use crate::planes::{PlaneLink, PlaneState, Planes};

/// Longest wait for the planes' confirmations.
pub const SYNC_WAIT: Duration = Duration::from_secs(5);

/// Sync requests in flight, by token, per plane.
#[derive(Debug, Default)]
pub struct ClientSyncs {
    next_token: AtomicU64,
    waiting: Mutex<HashMap<(u64, u64), oneshot::Sender<u64>>>,
}

impl ClientSyncs {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(u64, u64), oneshot::Sender<u64>>> {
        self.waiting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A plane's `Synced`: wakes the request waiting for it (an unknown or
    /// late token is ignored).
    pub fn on_synced(&self, generation: u64, token: u64, applied: u64) {
        if let Some(done) = self.lock().remove(&(generation, token)) {
            let _ = done.send(applied);
        }
    }

    /// Asks every ready plane to apply the feed through `through` and waits
    /// for all of them (up to [`SYNC_WAIT`], sending included: a plane whose
    /// channel is full, frozen or wedged, is asked at the same time as the
    /// others and counted as not confirming). The answer says how many
    /// confirmed, or which did not.
    pub async fn sync(&self, planes: &Planes, through: u64) -> ControlResponse {
        let deadline = tokio::time::Instant::now() + SYNC_WAIT;
        let token = self.next_token.fetch_add(1, Ordering::Relaxed) + 1;
        let ready: Vec<Arc<PlaneLink>> = planes
            .all()
            .into_iter()
            .filter(|plane| {
                !plane.closed.is_cancelled()
                    && matches!(plane.state(), PlaneState::Active | PlaneState::Draining)
            })
            .collect();
        let mut answers = Vec::with_capacity(ready.len());
        let mut sends = tokio::task::JoinSet::new();
        for plane in &ready {
            let (done, answer) = oneshot::channel();
            self.lock().insert((plane.generation, token), done);
            answers.push((plane.generation, answer));
            let plane = plane.clone();
            sends.spawn(async move {
                let request = ToDevice::SyncClients(SyncClients { token, through });
                let sent = tokio::time::timeout_at(deadline, plane.send(&request, &[])).await;
                (plane.generation, sent)
            });
        }
        let mut unasked = Vec::new();
        while let Some(joined) = sends.join_next().await {
            let Ok((generation, sent)) = joined else {
                continue;
            };
            match sent {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    tracing::warn!(generation, %error, "could not ask a device plane to sync clients");
                    unasked.push(generation);
                }
                Err(_) => {
                    tracing::warn!(generation, wait = ?SYNC_WAIT, "could not ask a device plane to sync clients: its channel stayed full");
                    unasked.push(generation);
                }
            }
        }
        let mut missing = Vec::new();
        for (generation, answer) in answers {
            let confirmed = !unasked.contains(&generation)
                && matches!(
                    tokio::time::timeout_at(deadline, answer).await,
                    Ok(Ok(applied)) if applied >= through
                );
            if !confirmed {
                self.lock().remove(&(generation, token));
                missing.push(generation);
            }
        }
        if missing.is_empty() {
            ControlResponse::Synced {
                planes: ready.len() as u64,
            }
        } else {
            let list: Vec<String> = missing.iter().map(|g| format!("g{g}")).collect();
            ControlResponse::Error {
                message: format!(
                    "device plane {} did not confirm the client change within {}s (it is in the store and will apply when the plane reads the change feed)",
                    list.join(", "),
                    SYNC_WAIT.as_secs()
                ),
            }
        }
    }
}
