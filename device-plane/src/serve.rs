//! What every connection handler shares: the clients, the egress, the
//! timeouts, and the tokens that cut connections.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::clients::Directory;
use crate::egress::Egress;

/// Shared by every connection this plane serves.
#[derive(Debug)]
pub struct Context {
    /// Known clients.
    pub directory: Arc<Directory>,
    /// The egress policy and connector.
    pub egress: Egress,
    /// Time a customer has to finish its proxy handshake.
    pub handshake_timeout: Duration,
    /// A tunnel with no byte either way for this long is closed.
    pub idle_timeout: Duration,
    /// Every live connection task.
    pub connections: TaskTracker,
    /// Cancelled when the plane starts draining: idle keep-alive HTTP
    /// connections close, handshakes in progress still finish.
    pub draining: CancellationToken,
    /// Cancelled when the drain grace is over: everything still open is cut.
    pub cut_all: CancellationToken,
    /// Connections taken since start.
    pub taken: std::sync::atomic::AtomicU64,
}
