//! Fault injection for the end-to-end tests: the only hooks that let a test
//! make a successor ingress stall or crash on cue.
//!
//! Compiled only with the cargo feature `fault-injection`, which the `tests`
//! crate turns on (its dependency on this crate names the feature, so every
//! workspace build of the binaries has it). Without the feature each hook is
//! an empty function: no `BLIPLESS_FAULT_*` variable is read, and none of
//! their names is in the binary. `make run` and release builds name the
//! daemons' packages (`-p`), so they never get it.

/// A successor stalls this many milliseconds after taking the offer, before
/// it serves (and before it tells its predecessor so).
#[cfg(feature = "fault-injection")]
pub const STALL_HANDOFF: &str = "BLIPLESS_FAULT_STALL_HANDOFF_MS";
/// A successor exits (status 3) this many milliseconds after it started
/// serving, as a crash would.
#[cfg(feature = "fault-injection")]
pub const DIE_AFTER_SERVING: &str = "BLIPLESS_FAULT_DIE_AFTER_SERVING_MS";

/// A successor sends its predecessor no progress reports, as one built
/// before they existed: the predecessor then waits on the quiet rule.
#[cfg(feature = "fault-injection")]
pub const SILENT_SUCCESSOR: &str = "BLIPLESS_FAULT_SILENT_SUCCESSOR";

/// A stopping ingress waits this many milliseconds after its handoff
/// server has stopped and before it closes its sockets and removes their
/// files: a successor that connects then sits in the handoff socket's
/// backlog until the close. An ingress that stepped aside for a successor
/// waits as long before it exits, so the successor stays beside it.
#[cfg(feature = "fault-injection")]
pub const LINGER_AT_STOP: &str = "BLIPLESS_FAULT_LINGER_AT_STOP_MS";

/// The send buffer, in bytes, of each device plane's channel (instead of
/// one that holds a largest frame): a plane that stops reading fills it
/// after a few frames.
#[cfg(feature = "fault-injection")]
pub const CHANNEL_SNDBUF: &str = "BLIPLESS_FAULT_CHANNEL_SNDBUF_BYTES";

/// `BLIPLESS_FAULT_CHANNEL_SNDBUF_BYTES`: shrinks `socket`'s send buffer
/// to that, if it is set.
pub fn shrink_channel_buffer(socket: &tokio_seqpacket::UnixSeqpacket) {
    #[cfg(feature = "fault-injection")]
    if let Some(bytes) = std::env::var(CHANNEL_SNDBUF)
        .ok()
        .and_then(|bytes| bytes.parse::<usize>().ok())
    {
        tracing::warn!(bytes, "fault injection: {CHANNEL_SNDBUF}");
        let _ = nix::sys::socket::setsockopt(socket, nix::sys::socket::sockopt::SndBuf, &bytes);
    }
    #[cfg(not(feature = "fault-injection"))]
    let _ = socket;
}

/// False when `BLIPLESS_FAULT_SILENT_SUCCESSOR` is set: this successor
/// reports no progress to its predecessor.
pub fn reports_progress() -> bool {
    #[cfg(feature = "fault-injection")]
    if std::env::var_os(SILENT_SUCCESSOR).is_some() {
        tracing::warn!("fault injection: {SILENT_SUCCESSOR}");
        return false;
    }
    true
}

/// `BLIPLESS_FAULT_STALL_HANDOFF_MS`: waits that long, if it is set.
pub async fn stall_handoff() {
    #[cfg(feature = "fault-injection")]
    if let Some(delay) = delay(STALL_HANDOFF) {
        tracing::warn!(?delay, "fault injection: {STALL_HANDOFF}");
        tokio::time::sleep(delay).await;
    }
}

/// `BLIPLESS_FAULT_LINGER_AT_STOP_MS`: waits that long, if it is set.
pub async fn linger_at_stop() {
    #[cfg(feature = "fault-injection")]
    if let Some(delay) = delay(LINGER_AT_STOP) {
        tracing::warn!(?delay, "fault injection: {LINGER_AT_STOP}");
        tokio::time::sleep(delay).await;
    }
}

/// `BLIPLESS_FAULT_DIE_AFTER_SERVING_MS`: if it is set, exits the process
/// that long from now.
pub fn die_after_serving() {
    #[cfg(feature = "fault-injection")]
    if let Some(delay) = delay(DIE_AFTER_SERVING) {
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            tracing::error!("fault injection: dying after serving");
            std::process::exit(3);
        });
    }
}

/// The delay in milliseconds that `variable` holds, if it holds one.
#[cfg(feature = "fault-injection")]
fn delay(variable: &str) -> Option<std::time::Duration> {
    std::env::var(variable)
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map(std::time::Duration::from_millis)
}
