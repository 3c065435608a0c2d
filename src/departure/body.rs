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
        by: StampedBy,
    }
}

/// Which of the client's questions stamps a [`StampedBody`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StampedBy {
    /// The first question, whatever it is (hyper and hyper-util ask first
    /// in the connection's task).
    FirstQuestion,
    /// The first question arms the stamp, and the socket write that
    /// carries the head stamps it (a `StampedIo` makes it).
    SocketWrite,
    /// Whether it is empty, or its first frame; not its size. reqwest's
    /// client (its redirect layer) asks the size when the request is
    /// handed over, before any connection; hyper asks whether it is empty
    /// in the connection's task, right before it writes the head.
    #[cfg_attr(not(any(feature = "reqwest", test)), allow(dead_code))]
    NotItsSize,
}

impl<B> StampedBody<B> {
    pub(crate) fn new(inner: B, stamp: Option<Arc<WriteStamp>>, by: StampedBy) -> Self {
        StampedBody { inner, stamp, by }
    }

    /// A body that stamps nothing (for a request no throttle handed over).
    pub fn unstamped(inner: B) -> Self {
        StampedBody {
            inner,
            stamp: None,
            by: StampedBy::FirstQuestion,
        }
    }

    /// The request's own body.
    pub fn into_inner(self) -> B {
        self.inner
    }

    /// The client asked a question: `size`, whether it asked the size.
    fn stamp(&self, size: bool) {
        let Some(stamp) = &self.stamp else {
            return;
        };
        match self.by {
            StampedBy::NotItsSize if size => {}
            StampedBy::SocketWrite => stamp.arm_once(),
            StampedBy::FirstQuestion | StampedBy::NotItsSize => stamp.stamp(),
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
        self.stamp(false);
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.stamp(false);
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.stamp(true);
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
        let body = StampedBody::new(
            Full::new(Bytes::from_static(b"abc")),
            Some(stamp.clone()),
            StampedBy::FirstQuestion,
        );
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

    /// reqwest's redirect layer asks the size when the request is handed
    /// over, before the connection: for reqwest the size does not stamp,
    /// hyper's question in the connection's task does.
    #[tokio::test(start_paused = true)]
    async fn not_its_size_stamps_at_the_emptiness_question_after_the_size() {
        let stamp = Arc::new(WriteStamp::default());
        let body = StampedBody::new(
            Full::new(Bytes::from_static(b"abc")),
            Some(stamp.clone()),
            StampedBy::NotItsSize,
        );
        assert_eq!(body.size_hint().exact(), Some(3));
        assert_eq!(stamp.get(), None, "the size does not stamp");
        tokio::time::advance(std::time::Duration::from_millis(40)).await;
        let asked_at = tokio::time::Instant::now();
        assert!(!body.is_end_stream());
        assert_eq!(stamp.get(), Some(asked_at));
        assert_eq!(body.collect().await.unwrap().to_bytes(), "abc");
    }
}
