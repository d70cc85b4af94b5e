//! The origin socket of a forwarded (absolute-form) request, held to the
//! client's rates (docs/LIMITS.md): reads from the origin take tokens from
//! the client's down bucket, writes to it from its up bucket, as a tunnel's
//! relay does. An unlimited direction is the socket itself, plus one atomic
//! load per call.

use std::future::Future as _;

use super::*;
use crate::clients::limiter::{Bucket, Limiter};

/// The origin socket under the client's limiter.
pub(super) struct Throttled {
    pub(super) inner: TcpStream,
    pub(super) limiter: Arc<Limiter>,
    /// Waiting for the down bucket's tokens.
    read_wait: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Waiting for the up bucket's tokens.
    write_wait: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Where a limited read lands before it is copied out.
    scratch: Vec<u8>,
}

impl Throttled {
    pub(super) fn new(inner: TcpStream, limiter: Arc<Limiter>) -> Self {
        Self {
            inner,
            limiter,
            read_wait: None,
            write_wait: None,
            scratch: Vec::new(),
        }
    }
}

/// Tokens from `bucket` for one call: `Ready(None)` unlimited, `Ready(Some)`
/// taken, `Pending` until they are there (the timer in `wait` wakes us).
fn poll_tokens(
    bucket: &Bucket,
    wait: &mut Option<Pin<Box<tokio::time::Sleep>>>,
    cx: &mut TaskContext<'_>,
) -> Poll<Option<usize>> {
    loop {
        if let Some(sleep) = wait.as_mut() {
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            *wait = None;
        }
        match bucket.try_take() {
            None => return Poll::Ready(None),
            Some(Ok(taken)) => return Poll::Ready(Some(taken)),
            Some(Err(delay)) => *wait = Some(Box::pin(tokio::time::sleep(delay))),
        }
    }
}

impl AsyncRead for Throttled {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        let limiter = this.limiter.clone();
        let Poll::Ready(taken) = poll_tokens(&limiter.down, &mut this.read_wait, cx) else {
            return Poll::Pending;
        };
        let Some(taken) = taken else {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        };
        let room = buf.remaining().min(taken);
        // Read into our own buffer, then copy: a limited client's bytes cost
        // one copy, and no unsafe marking of `buf`'s bytes as initialized.
        this.scratch.resize(room, 0);
        let mut limited = ReadBuf::new(&mut this.scratch[..room]);
        let poll = Pin::new(&mut this.inner).poll_read(cx, &mut limited);
        let read = limited.filled().len();
        buf.put_slice(limited.filled());
        limiter.down.refund(taken.saturating_sub(read));
        poll
    }
}

impl AsyncWrite for Throttled {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        let limiter = this.limiter.clone();
        let Poll::Ready(taken) = poll_tokens(&limiter.up, &mut this.write_wait, cx) else {
            return Poll::Pending;
        };
        let Some(taken) = taken else {
            return Pin::new(&mut this.inner).poll_write(cx, data);
        };
        let poll = Pin::new(&mut this.inner).poll_write(cx, &data[..data.len().min(taken)]);
        let written = match &poll {
            Poll::Ready(Ok(n)) => *n,
            _ => 0,
        };
        limiter.up.refund(taken.saturating_sub(written));
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
