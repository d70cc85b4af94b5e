//! Wrappers around the customer's socket for hyper: [`Counted`] bills bytes
//! to the client once it is known (and charges them against its quota) and
//! marks when a byte last moved ([`LastMoved`]), [`Prefixed`] replays bytes
//! a predecessor had read but not yet parsed.

use std::sync::atomic::AtomicU64;

use super::*;

/// When a connection last moved a byte either way: a connection with none
/// for `proxy.idle_timeout` is cut, as a tunnel is (a client that stops
/// reading its answers would otherwise hold it, hyper's write waiting with
/// no timer of its own).
#[derive(Debug)]
pub(super) struct LastMoved {
    start: Instant,
    /// Milliseconds from `start` to the last byte moved.
    millis: AtomicU64,
}

impl LastMoved {
    pub(super) fn new() -> Self {
        Self {
            start: Instant::now(),
            millis: AtomicU64::new(0),
        }
    }

    fn mark(&self) {
        let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.millis.fetch_max(now, Ordering::Relaxed);
    }

    /// Completes once no byte has moved for `limit`.
    pub(super) async fn idle_for(&self, limit: Duration) {
        loop {
            let last = Duration::from_millis(self.millis.load(Ordering::Relaxed));
            let deadline = tokio::time::Instant::from_std(self.start + last + limit);
            if tokio::time::Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// The client socket, counting bytes into the client's meter once known,
/// and charging them against its quota at once (as a tunnel's relay does),
/// so that a forwarded download is cut as soon as this plane sees the
/// client over, not at the next look at the store.
pub(super) struct Counted {
    pub(super) inner: TcpStream,
    pub(super) identity: Identity,
    /// Bytes read before any request authenticated (the first request's
    /// head, usually): billed to the first client that does.
    pub(super) unbilled_up: u64,
    /// True until the first write: it goes out with a `send` first
    /// ([`crate::conn::send_now`]), because the socket may have been
    /// registered a moment ago with no readiness cached. hyper needs it:
    /// a request it cannot parse gets a 400 and the connection ends, and if
    /// that answer's flush were left waiting for readiness, hyper would
    /// close without it.
    pub(super) first_write: bool,
    /// Marked at each byte read or written.
    pub(super) moved: Arc<LastMoved>,
}

impl Counted {
    /// Counts `up` and `down` bytes, carrying reads over until a client is known.
    fn count(&mut self, up: u64, down: u64) {
        if up + down > 0 {
            self.moved.mark();
        }
        let identity = self.identity.lock();
        let Some(client) = identity.as_ref() else {
            self.unbilled_up += up;
            return;
        };
        let up = up + std::mem::take(&mut self.unbilled_up);
        if up > 0 {
            client.meter.up.fetch_add(up, Ordering::Relaxed);
        }
        if down > 0 {
            client.meter.down.fetch_add(down, Ordering::Relaxed);
        }
        client
            .limiter
            .charge_quota(usize::try_from(up + down).unwrap_or(usize::MAX));
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &poll {
            let read = (buf.filled().len() - before) as u64;
            self.count(read, 0);
        }
        poll
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if std::mem::take(&mut self.first_write) {
            match crate::conn::send_now(&self.inner, data) {
                Ok(Some(written)) => {
                    self.count(0, written as u64);
                    return Poll::Ready(Ok(written));
                }
                Ok(None) => {}
                Err(error) => return Poll::Ready(Err(error)),
            }
        }
        let poll = Pin::new(&mut self.inner).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = &poll {
            let written = *n as u64;
            self.count(0, written);
        }
        poll
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A socket that first yields bytes a predecessor read from it already.
pub(super) struct Prefixed<T> {
    pub(super) prefix: Vec<u8>,
    pub(super) offset: usize,
    pub(super) inner: T,
}

impl<T: AsyncRead + Unpin> AsyncRead for Prefixed<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.offset < self.prefix.len() {
            let take = buf.remaining().min(self.prefix.len() - self.offset);
            let from = self.offset;
            buf.put_slice(&self.prefix[from..from + take]);
            self.offset += take;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Prefixed<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
