//! Fault injection for the end-to-end tests: the only hooks that let a test
//! make a device plane miss its ready budget, hold back its peer set,
//! announce another build, act older than a message, adopt slowly, die
//! adopting, hand its WireGuard exits over late or steer late.
//!
//! Compiled only with the cargo feature `fault-injection`, which the `tests`
//! crate turns on (its dependency on this crate names the feature, so every
//! workspace build of the binaries has it). Without the feature each hook is
//! an empty function: no `BLIPLESS_FAULT_*` variable is read, and none of
//! their names is in the binary. `make run` and release builds name the
//! daemons' packages (`-p`), so they never get it.

/// Stall the warm-up this many milliseconds, so the plane does not say Ready
/// within its budget.
#[cfg(feature = "fault-injection")]
pub const STALL_WARMUP: &str = "BLIPLESS_FAULT_STALL_WARMUP_MS";
/// Wait this many milliseconds after Activate before sending the WireGuard
/// peer set, so the ingress has an active plane but no peer set yet.
#[cfg(feature = "fault-injection")]
pub const DELAY_PEERS: &str = "BLIPLESS_FAULT_DELAY_PEERS_MS";
/// Announce this build in the Hello instead of this binary's own, so that a
/// test can deploy between two builds it told apart without compiling twice.
#[cfg(feature = "fault-injection")]
pub const SOFTWARE: &str = "BLIPLESS_FAULT_SOFTWARE";

/// Act as a plane older than `AcceptedMany`: say nothing of it in the
/// Hello, and close the channel on one, as an older plane's decoder would.
#[cfg(feature = "fault-injection")]
pub const OLDER_THAN_ACCEPTED_MANY: &str = "BLIPLESS_FAULT_OLDER_THAN_ACCEPTED_MANY";

/// Act as a plane older than SOCKS5 UDP associations: say nothing of them
/// in the Hello, and close the channel on a `Migrate` of one, as an older
/// plane's decoder (which knows no kind 4) would.
#[cfg(feature = "fault-injection")]
pub const OLDER_THAN_UDP_MIGRATE: &str = "BLIPLESS_FAULT_OLDER_THAN_UDP_MIGRATE";

/// An adopting plane waits this many milliseconds after confirming each
/// connection it takes over, before it serves it (as reading a long pipe of
/// pending bytes might), so a test can have a deploy begin meanwhile.
#[cfg(feature = "fault-injection")]
pub const SLOW_ADOPTION: &str = "BLIPLESS_FAULT_SLOW_ADOPTION_MS";

/// An adopting plane exits at once (status 70, no drain, as a crash would)
/// on the first connection handed over to it, before confirming it, so a
/// test can have a successor die with connections it never took.
#[cfg(feature = "fault-injection")]
pub const DIE_ADOPTING: &str = "BLIPLESS_FAULT_DIE_ADOPTING";

/// A plane handing over sends its WireGuard exits' descriptors this many
/// milliseconds after its client TUN queues instead of before them, so that
/// a test can have them reach a successor that opened the exits afresh.
#[cfg(feature = "fault-injection")]
pub const LATE_EXIT_HANDOVER: &str = "BLIPLESS_FAULT_LATE_EXIT_HANDOVER_MS";

/// A plane's WireGuard steering waits this many milliseconds before its
/// first pass (each time its exits start), so a test can have a client's
/// packets arrive before its `client_exit` element is written.
#[cfg(feature = "fault-injection")]
pub const DELAY_STEERING: &str = "BLIPLESS_FAULT_DELAY_STEERING_MS";

/// `BLIPLESS_FAULT_LATE_EXIT_HANDOVER_MS`, if it is set.
pub fn late_exit_handover() -> Option<std::time::Duration> {
    #[cfg(feature = "fault-injection")]
    if let Some(delay) = delay(LATE_EXIT_HANDOVER) {
        tracing::warn!(
            ?delay,
            "fault injection: handing the exits over after the TUN queues"
        );
        return Some(delay);
    }
    None
}

/// `BLIPLESS_FAULT_DIE_ADOPTING`: exits the process, if it is set.
pub fn die_adopting() {
    #[cfg(feature = "fault-injection")]
    if std::env::var_os(DIE_ADOPTING).is_some() {
        tracing::error!("fault injection: dying instead of adopting a connection");
        std::process::exit(70);
    }
}

/// Whether this plane reads `AcceptedMany` (says so in its Hello): yes,
/// unless `BLIPLESS_FAULT_OLDER_THAN_ACCEPTED_MANY` is set.
pub fn reads_accepted_many() -> bool {
    #[cfg(feature = "fault-injection")]
    if std::env::var_os(OLDER_THAN_ACCEPTED_MANY).is_some() {
        return false;
    }
    true
}

/// Whether this plane reads a `Migrate` of a UDP association (says so in
/// its Hello): yes, unless `BLIPLESS_FAULT_OLDER_THAN_UDP_MIGRATE` is set.
pub fn reads_udp_migrate() -> bool {
    #[cfg(feature = "fault-injection")]
    if std::env::var_os(OLDER_THAN_UDP_MIGRATE).is_some() {
        return false;
    }
    true
}

/// The build this plane announces in its Hello: this binary's
/// (`blipless_config::build::VERSION`), or `BLIPLESS_FAULT_SOFTWARE` if it
/// is set.
pub fn software() -> String {
    #[cfg(feature = "fault-injection")]
    if let Ok(software) = std::env::var(SOFTWARE) {
        tracing::warn!(%software, "fault injection: announcing another build");
        return software;
    }
    blipless_config::build::VERSION.to_string()
}

/// `BLIPLESS_FAULT_STALL_WARMUP_MS`: waits that long, if it is set.
pub async fn stall_warmup() {
    #[cfg(feature = "fault-injection")]
    if let Some(delay) = delay(STALL_WARMUP) {
        tracing::warn!(?delay, "fault injection: stalling warm-up");
        tokio::time::sleep(delay).await;
    }
}

/// `BLIPLESS_FAULT_DELAY_PEERS_MS`: waits that long, if it is set.
pub async fn delay_peers() {
    #[cfg(feature = "fault-injection")]
    if let Some(delay) = delay(DELAY_PEERS) {
        tracing::warn!(?delay, "fault injection: delaying the peer set");
        tokio::time::sleep(delay).await;
    }
}

/// `BLIPLESS_FAULT_DELAY_STEERING_MS`: waits that long, if it is set.
pub async fn delay_steering() {
    #[cfg(feature = "fault-injection")]
    if let Some(delay) = delay(DELAY_STEERING) {
        tracing::warn!(?delay, "fault injection: delaying the first steering pass");
        tokio::time::sleep(delay).await;
    }
}

/// `BLIPLESS_FAULT_SLOW_ADOPTION_MS`: waits that long, if it is set.
pub async fn slow_adoption() {
    #[cfg(feature = "fault-injection")]
    if let Some(delay) = delay(SLOW_ADOPTION) {
        tracing::warn!(?delay, "fault injection: adopting slowly");
        tokio::time::sleep(delay).await;
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
