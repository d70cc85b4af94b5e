//! The origin's response body in slices of at most [`SLICE`] bytes, so that
//! hyper takes the next one as soon as the client has read about that much.
//!
//! hyper hands the origin's body over in frames as large as its read
//! buffer (up to about 400 KiB when the origin is ahead), and the client
//! connection takes a new frame only once what it buffered drains to the
//! client. Progress (`timeouts.body_idle`, [`super::exchange`]) is seen per
//! frame taken, so with whole frames a client reading below about 13 KB/s
//! went 30 s without one and was cut mid-download. Slices are views of the
//! same bytes (no copy).

use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame, SizeHint};

/// The most one frame of a [`Sliced`] body carries.
pub(super) const SLICE: usize = 16 * 1024;

/// A body of `B` whose data frames are at most [`SLICE`] bytes.
pub(super) struct Sliced<B> {
    inner: B,
    /// What is left of the frame being sliced.
    rest: Bytes,
}

impl<B> Sliced<B> {
    pub(super) fn new(inner: B) -> Self {
        Self {
            inner,
            rest: Bytes::new(),
        }
    }
}

impl<B> HttpBody for Sliced<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        if this.rest.is_empty() {
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => this.rest = data,
                    Err(trailers) => return Poll::Ready(Some(Ok(trailers))),
                },
                other => return other,
            }
        }
        let take = this.rest.len().min(SLICE);
        Poll::Ready(Some(Ok(Frame::data(this.rest.split_to(take)))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let rest = self.rest.len() as u64;
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower().saturating_add(rest));
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(rest));
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};

    #[tokio::test]
    async fn a_large_frame_comes_out_in_slices_with_every_byte_in_order() {
        let original: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let body = Full::new(Bytes::from(original.clone()));
        let mut sliced = Sliced::new(body);
        assert_eq!(sliced.size_hint().exact(), Some(100_000));
        let mut received = Vec::new();
        let mut frames = 0;
        while let Some(frame) = sliced.frame().await {
            let data = frame.expect("frame").into_data().expect("data");
            assert!(!data.is_empty() && data.len() <= SLICE, "{}", data.len());
            received.extend_from_slice(&data);
            frames += 1;
            assert_eq!(
                sliced.is_end_stream(),
                received.len() == original.len(),
                "the end is said with the last slice, not before"
            );
        }
        assert_eq!(received, original);
        assert_eq!(frames, 100_000usize.div_ceil(SLICE));
    }
}
