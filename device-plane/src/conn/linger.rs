//! Closing a connection after a refusal without resetting it, and resetting
//! one whose answer broke off ([`reset`]). Linux answers
//! a close with unread bytes with a reset, which discards whatever of the
//! refusal is not yet sent, and a client on Windows discards what it had
//! received; a client that pipelines (HTTP, or SOCKS5 with its request and
//! first bytes in one write) then sees "connection reset" instead of the
//! refusal.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What a refused connection may still send (read and dropped) before it is
/// closed, so that the refusal reaches the client instead of a reset.
const LINGER_BYTES: usize = 1 << 20;
/// How long a refused connection is read from before it is closed.
const LINGER_TIME: Duration = Duration::from_secs(2);

/// Closes a connection that was just refused: our side is shut down (the
/// refusal and a FIN go out), then whatever the client still sends is read
/// and dropped, up to [`LINGER_BYTES`] or [`LINGER_TIME`], so that closing
/// with unread bytes does not reset the connection before the client has
/// read the refusal.
pub async fn linger_close(mut stream: TcpStream) {
    let _ = stream.shutdown().await;
    let mut sink = vec![0u8; 16 * 1024];
    let mut left = LINGER_BYTES;
    let drain = async {
        while left > 0 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(LINGER_TIME, drain).await;
}

/// Closes `stream` with a reset (a zero linger), so that a client whose
/// answer ends at the connection's end (HTTP/1.0 without a length) learns
/// that it was cut rather than complete.
pub fn reset(stream: TcpStream) {
    // Deprecated for the blocking close a non-zero linger makes; a zero
    // one does not block.
    #[allow(deprecated)]
    let _ = stream.set_linger(Some(Duration::ZERO));
    drop(stream);
}
