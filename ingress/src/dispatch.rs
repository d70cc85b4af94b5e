//! Sending to the active device plane: the one place that decides "send it
//! to the active plane, or wait for one, or give up", for everything that
//! goes there: accepted connections ([`crate::accept`]; a burst of them is
//! first offered in one `AcceptedMany` to the plane active when they were
//! accepted, by `accept::hand_over_burst` with the same
//! [`PlaneLink::send_if_active`], and comes here if that fails), connections and TUN
//! queues passed on from a draining plane ([`crate::device_link`]), and
//! WireGuard clients' inner packets ([`crate::wg`]).
//!
//! A send is made under the plane's send lock and only while that plane is
//! active ([`PlaneLink::send_if_active`]), so nothing is queued to a plane
//! after the Drain that ended its activity. A plane that stopped being
//! active in the meantime is passed by for the next; one whose channel is
//! gone is marked closed (its reader detaches it) and the next is tried; a
//! send the kernel had no buffer for is tried again on the same plane
//! ([`SendFailure`]). The
//! caller keeps what it sent when no plane took it (fds and packets are
//! only borrowed here), and decides what then: hold, return, or drop.

use std::os::fd::BorrowedFd;
use std::sync::Arc;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::planes::{Frame, PlaneLink, Planes, SendFailure};

/// The pause before a send the kernel had no buffer for is tried again.
const SEND_RETRY: std::time::Duration = std::time::Duration::from_millis(50);

/// How long a send may wait for an active plane.
#[derive(Debug, Clone, Copy)]
pub enum Wait<'a> {
    /// Not at all: only the plane active now (or one that takes over while
    /// the send is tried) may take it.
    No,
    /// Until a deadline.
    Until(Instant),
    /// Until a plane is active, however long, unless `shutdown` is cancelled.
    Forever(&'a CancellationToken),
}

/// Sends `frame`, with `fds` beside it, to the active plane, skipping the
/// plane of generation `except` (the sender of what is passed on): if that
/// plane is the active one, nothing is sent. Returns the plane that took it,
/// or None when none did within `wait`.
pub async fn to_active(
    planes: &Planes,
    frame: Frame<'_>,
    fds: &[BorrowedFd<'_>],
    except: Option<u64>,
    wait: Wait<'_>,
) -> Option<Arc<PlaneLink>> {
    let mut active = planes.subscribe();
    let mut tried: Option<u64> = None;
    loop {
        let target = active.borrow_and_update().clone();
        match target {
            Some(target) if Some(target.generation) == except => return None,
            // A plane older than this message (a rollback) would take it for
            // garbage and lose its channel: the caller keeps it instead.
            Some(target) if !frame.readable_by(&target) => {
                tracing::info!(
                    generation = target.generation,
                    "the active plane is too old for {}; not sent",
                    frame.name
                );
                return None;
            }
            Some(target) if !target.closed.is_cancelled() => {
                match target.send_if_active(frame, fds).await {
                    Ok(true) => return Some(target),
                    // A newer plane took over since; the watch says which.
                    Ok(false) => {}
                    Err(error) => match SendFailure::of(&error) {
                        SendFailure::ChannelGone => {
                            tracing::warn!(generation = target.generation, %error, "could not send {} to the device plane", frame.name);
                            target.closed.cancel();
                        }
                        // The plane stays: marking it closed would leave
                        // it active and skipped, every later send waiting
                        // for a change of plane that never comes.
                        SendFailure::NoBuffer => {
                            tracing::warn!(generation = target.generation, %error, "could not send {} to the device plane just now; trying again", frame.name);
                            let again = Instant::now() + SEND_RETRY;
                            let in_time = match wait {
                                Wait::No => false,
                                Wait::Until(deadline) => again < deadline,
                                Wait::Forever(shutdown) => !shutdown.is_cancelled(),
                            };
                            if !in_time {
                                return None;
                            }
                            tokio::time::sleep_until(again).await;
                            continue;
                        }
                        SendFailure::ThisFrame => {
                            tracing::warn!(generation = target.generation, %error, "could not send {} to the device plane; not sent", frame.name);
                            return None;
                        }
                    },
                }
                if matches!(wait, Wait::No) && tried == Some(target.generation) {
                    return None;
                }
                tried = Some(target.generation);
                if matches!(wait, Wait::No) && active.has_changed().unwrap_or(false) {
                    continue;
                }
            }
            _ => {}
        }
        match wait {
            Wait::No => return None,
            Wait::Until(deadline) => {
                match tokio::time::timeout_at(deadline, active.changed()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) | Err(_) => return None,
                }
            }
            Wait::Forever(shutdown) => {
                tokio::select! {
                    changed = active.changed() => if changed.is_err() { return None },
                    () = shutdown.cancelled() => return None,
                }
            }
        }
    }
}
