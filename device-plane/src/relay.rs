//! Moves bytes both ways between a customer and a destination until both
//! directions finish, one side fails, the tunnel idles out, or it is cut.
//!
//! Each direction copies into its own buffer and, at the other side's EOF,
//! half-closes the far side (shutdown of writing), so a client that sends a
//! request and shuts down its write half still gets the whole answer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clients::Meter;

/// Buffer per direction.
const BUFFER: usize = 64 * 1024;

/// How a relay ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayEnd {
    /// Both directions reached EOF and were passed on.
    Finished,
    /// A read or write failed (a reset, usually).
    Failed,
    /// Neither direction moved a byte for the idle timeout.
    Idle,
    /// Cut from outside (client removed, drain grace over).
    Cut,
}

/// Relays between `client` and `egress`, writing `pending_up` to the egress
/// first (bytes the client sent after its request). Counts bytes into `meter`.
pub async fn relay<C, E>(
    client: C,
    egress: E,
    pending_up: &[u8],
    meter: &Meter,
    idle_timeout: Duration,
    cut: &CancellationToken,
) -> RelayEnd
where
    C: AsyncRead + AsyncWrite + Unpin,
    E: AsyncRead + AsyncWrite + Unpin,
{
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut egress_read, mut egress_write) = tokio::io::split(egress);
    let started = Instant::now();
    let last_activity = Arc::new(AtomicU64::new(0));
    if !pending_up.is_empty() {
        if egress_write.write_all(pending_up).await.is_err() {
            return RelayEnd::Failed;
        }
        meter
            .up
            .fetch_add(pending_up.len() as u64, Ordering::Relaxed);
    }
    let up = copy_one_way(
        &mut client_read,
        &mut egress_write,
        &meter.up,
        &last_activity,
        started,
    );
    let down = copy_one_way(
        &mut egress_read,
        &mut client_write,
        &meter.down,
        &last_activity,
        started,
    );
    let both = async {
        let (up, down) = tokio::join!(up, down);
        if up.is_ok() && down.is_ok() {
            RelayEnd::Finished
        } else {
            RelayEnd::Failed
        }
    };
    let idle = watch_idle(&last_activity, started, idle_timeout);
    tokio::select! {
        end = both => end,
        () = idle => RelayEnd::Idle,
        () = cut.cancelled() => RelayEnd::Cut,
    }
}

async fn copy_one_way<R, W>(
    read: &mut R,
    write: &mut W,
    counter: &AtomicU64,
    last_activity: &AtomicU64,
    started: Instant,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buffer = vec![0u8; BUFFER];
    loop {
        let n = read.read(&mut buffer).await?;
        if n == 0 {
            // Pass the half-close on; the other direction keeps going.
            let _ = write.shutdown().await;
            return Ok(());
        }
        write.write_all(&buffer[..n]).await?;
        counter.fetch_add(n as u64, Ordering::Relaxed);
        last_activity.store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

async fn watch_idle(last_activity: &AtomicU64, started: Instant, idle_timeout: Duration) {
    loop {
        let last = Duration::from_millis(last_activity.load(Ordering::Relaxed));
        let deadline = started + last + idle_timeout;
        if Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep_until(deadline).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::duplex;

    #[tokio::test]
    async fn bytes_cross_both_ways_and_half_close_passes_on() {
        let (client_far, client_near) = duplex(1024);
        let (egress_near, egress_far) = duplex(1024);
        let meter = Meter::default();
        let cut = CancellationToken::new();
        let relay = relay(
            client_near,
            egress_near,
            b"pre",
            &meter,
            Duration::from_secs(5),
            &cut,
        );
        let peers = async {
            let (mut client_read, mut client_write) = tokio::io::split(client_far);
            let (mut egress_read, mut egress_write) = tokio::io::split(egress_far);
            client_write.write_all(b"hello").await.expect("write");
            client_write.shutdown().await.expect("shutdown");
            let mut got = Vec::new();
            egress_read.read_to_end(&mut got).await.expect("read");
            assert_eq!(got, b"prehello");
            egress_write.write_all(b"answer").await.expect("write");
            egress_write.shutdown().await.expect("shutdown");
            let mut answer = Vec::new();
            client_read.read_to_end(&mut answer).await.expect("read");
            assert_eq!(answer, b"answer");
        };
        let (end, ()) = tokio::join!(relay, peers);
        assert_eq!(end, RelayEnd::Finished);
        assert_eq!(meter.up.load(Ordering::Relaxed), 8);
        assert_eq!(meter.down.load(Ordering::Relaxed), 6);
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_tunnel_ends() {
        let (_client_far, client_near) = duplex(1024);
        let (egress_near, _egress_far) = duplex(1024);
        let meter = Meter::default();
        let cut = CancellationToken::new();
        let end = relay(
            client_near,
            egress_near,
            b"",
            &meter,
            Duration::from_secs(30),
            &cut,
        )
        .await;
        assert_eq!(end, RelayEnd::Idle);
    }

    #[tokio::test]
    async fn a_cut_ends_the_relay() {
        let (_client_far, client_near) = duplex(1024);
        let (egress_near, _egress_far) = duplex(1024);
        let meter = Meter::default();
        let cut = CancellationToken::new();
        cut.cancel();
        let end = relay(
            client_near,
            egress_near,
            b"",
            &meter,
            Duration::from_secs(30),
            &cut,
        )
        .await;
        assert_eq!(end, RelayEnd::Cut);
    }
}
