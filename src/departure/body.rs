//! The request body a [`DepartureStamp`](super::DepartureStamp) hands to the
//! client: the request's own, stamping the departure the first time the
//! client asks it anything.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::stamp::WriteStamp;

pin_project! {
    /// A request body that stamps the request's departure the first time
    /// the client asks it anything: whether it is empty, its size or its
    /// first frame. hyper asks whether it is empty when its connection
    /// task takes the request to write its head, so the stamp is the
    /// instant the bytes leave for the socket, not the instant the request
    /// was handed to the client. The body is otherwise the request's own.
    #[derive(Debug)]
    pub struct StampedBody<B> {
        #[pin]
        inner: B,
        stamp: Option<Arc<WriteStamp>>,
        // The stamp is the socket write's (a `StampedIo` makes it), not
        // the first question's.
        on_socket_write: bool,
    }
}

impl<B> StampedBody<B> {
    pub(crate) fn new(inner: B, stamp: Option<Arc<WriteStamp>>, on_socket_write: bool) -> Self {
        StampedBody {
            inner,
            stamp,
            on_socket_write,
        }
    }

    /// A body that stamps nothing (for a request no throttle handed over).
    pub fn unstamped(inner: B) -> Self {
        StampedBody {
            inner,
            stamp: None,
            on_socket_write: false,
        }
    }

    /// The request's own body.
    pub fn into_inner(self) -> B {
        self.inner
    }

    fn stamp(&self) {
        match &self.stamp {
            Some(stamp) if self.on_socket_write => stamp.arm_once(),
            Some(stamp) => stamp.stamp(),
            None => {}
        }
    }
}

impl<B: Body> Body for StampedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        self.stamp();
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.stamp();
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.stamp();
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_first_question_stamps_and_the_body_is_unchanged() {
        let stamp = Arc::new(WriteStamp::default());
        let body = StampedBody::new(Full::new(Bytes::from_static(b"abc")), Some(stamp.clone()), false);
        assert_eq!(stamp.get(), None, "nothing asked yet");
        tokio::time::advance(std::time::Duration::from_millis(7)).await;
        let asked_at = tokio::time::Instant::now();
        assert!(!body.is_end_stream());
        assert_eq!(stamp.get(), Some(asked_at));
        tokio::time::advance(std::time::Duration::from_millis(7)).await;
        assert_eq!(body.size_hint().exact(), Some(3));
        assert_eq!(body.collect().await.unwrap().to_bytes(), "abc");
        assert_eq!(stamp.get(), Some(asked_at), "the first question's instant stays");
    }
}
