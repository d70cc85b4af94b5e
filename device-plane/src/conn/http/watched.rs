//! A body passed on unchanged while what happens to it is reported: the one
//! shape behind the request and answer bodies of `turns.rs` (where an
//! exchange stands) and `exchange.rs` (its deadlines).
//!
//! [`Watched`] forwards every poll to the body it wraps and tells its
//! [`Watcher`] what the poll gave, as a [`Polled`]; what the watcher holds
//! (a [`Turn`](super::turns::Turn), an origin connection) lives as long as
//! the body, so its `Drop` marks the body's end however it ends.

use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame, SizeHint};

/// What one poll of a watched body gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Polled {
    /// Nothing yet: the body waits on its sender.
    Pending,
    /// A frame of `bytes` data bytes (0 for trailers); `last` when the body
    /// says it is at its end after it.
    Frame { bytes: u64, last: bool },
    /// The body ended.
    End,
    /// The body failed (malformed or cut short).
    Failed,
}

/// Told what each poll of a [`Watched`] body gave.
pub(super) trait Watcher {
    fn polled(&mut self, polled: Polled);
}

/// A body of `B`, reported to `W`.
pub(super) struct Watched<B, W> {
    inner: B,
    watcher: W,
}

impl<B, W> Watched<B, W> {
    pub(super) fn new(inner: B, watcher: W) -> Self {
        Self { inner, watcher }
    }
}

impl<B, W> HttpBody for Watched<B, W>
where
    B: HttpBody<Data = Bytes, Error = hyper::Error> + Unpin,
    W: Watcher + Unpin,
{
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_frame(cx);
        let polled = match &poll {
            Poll::Pending => Polled::Pending,
            Poll::Ready(Some(Ok(frame))) => Polled::Frame {
                bytes: frame.data_ref().map_or(0, |data| data.len() as u64),
                last: this.inner.is_end_stream(),
            },
            Poll::Ready(None) => Polled::End,
            Poll::Ready(Some(Err(_))) => Polled::Failed,
        };
        this.watcher.polled(polled);
        poll
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};

    #[derive(Default)]
    struct Record(Vec<Polled>);

    impl Watcher for &mut Record {
        fn polled(&mut self, polled: Polled) {
            self.0.push(polled);
        }
    }

    #[tokio::test]
    async fn every_poll_is_reported_and_the_bytes_pass_unchanged() {
        let mut record = Record::default();
        let body = Full::new(Bytes::from_static(b"hello")).map_err(|never| match never {});
        let collected = Watched::new(body, &mut record)
            .collect()
            .await
            .expect("collect")
            .to_bytes();
        assert_eq!(&collected[..], b"hello");
        assert_eq!(
            record.0,
            [
                Polled::Frame {
                    bytes: 5,
                    last: true
                },
                Polled::End
            ]
        );
    }
}
