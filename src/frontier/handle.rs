//! The cloneable handle that pushes requests into a frontier.

use std::fmt;
use std::future::poll_fn;
use std::sync::Arc;
use std::task::Poll;

use super::shared::Shared;

/// Pushes requests into its [`Frontier`](super::Frontier) while the crawl
/// runs (the links a page gave, say). Cloning it gives another handle to
/// the same frontier; the frontier's stream ends once nothing is pending
/// or in flight and every handle is dropped.
pub struct FrontierHandle<B, T = http::Uri> {
    pub(super) shared: Arc<Shared<B, T>>,
}

/// Why a push failed: the frontier is gone, or (for
/// [`try_push_tagged`](FrontierHandle::try_push_tagged)) full. It carries
/// the request back.
#[derive(Debug)]
pub struct PushError<B> {
    request: Box<http::Request<B>>,
    closed: bool,
}

impl<B> PushError<B> {
    fn closed(request: Box<http::Request<B>>) -> Self {
        PushError {
            request,
            closed: true,
        }
    }

    fn full(request: Box<http::Request<B>>) -> Self {
        PushError {
            request,
            closed: false,
        }
    }

    /// Whether the frontier was dropped.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Whether the frontier held its `max_pending` requests already.
    pub fn is_full(&self) -> bool {
        !self.closed
    }

    /// The request that was not queued.
    pub fn into_request(self) -> http::Request<B> {
        *self.request
    }
}

impl<B> fmt::Display for PushError<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.closed {
            true => f.write_str("the frontier was dropped"),
            false => f.write_str("the frontier holds its max_pending requests"),
        }
    }
}

impl<B: fmt::Debug> std::error::Error for PushError<B> {}

impl<B, T> FrontierHandle<B, T> {
    /// Queues `request`, tagged with `tag` (what the frontier's stream
    /// gives back with its result). Waits while the frontier holds its
    /// `max_pending` requests already.
    ///
    /// # Errors
    ///
    /// [`PushError`], with the request, when the frontier was dropped.
    pub async fn push_tagged(&self, request: http::Request<B>, tag: T) -> Result<(), PushError<B>> {
        self.push_inner(request, Some(Box::new(tag))).await
    }

    /// Queues `request` with `tag` (`None`: its URI, made when it is sent).
    async fn push_inner(&self, request: http::Request<B>, tag: Option<Box<T>>) -> Result<(), PushError<B>> {
        let mut item = Some((request, tag));
        poll_fn(|cx| {
            let mut state = self.shared.lock();
            if state.closed {
                let (request, _) = item.take().expect("polled after completion");
                return Poll::Ready(Err(PushError::closed(Box::new(request))));
            }
            if state.pending() >= self.shared.max_pending {
                state.pushers.push(cx.waker().clone());
                return Poll::Pending;
            }
            let (request, tag) = item.take().expect("polled after completion");
            let request = state.spare_boxes.boxed(request);
            self.shared.enqueue(&mut state, (request, tag, None));
            Poll::Ready(Ok(()))
        })
        .await
    }

    /// [`push_tagged`](Self::push_tagged) without waiting: `Err` with the
    /// request when the frontier is full or gone.
    ///
    /// # Errors
    ///
    /// [`PushError`], with the request, when the frontier was dropped or
    /// holds its `max_pending` requests already.
    pub fn try_push_tagged(&self, request: http::Request<B>, tag: T) -> Result<(), PushError<B>> {
        let mut state = self.shared.lock();
        if state.closed {
            return Err(PushError::closed(Box::new(request)));
        }
        if state.pending() >= self.shared.max_pending {
            return Err(PushError::full(Box::new(request)));
        }
        // Boxed once, here (in the box of a request sent before, if one
        // is spare): the frontier moves the box, not the request.
        let request = state.spare_boxes.boxed(request);
        self.shared
            .enqueue(&mut state, (request, Some(Box::new(tag)), None));
        Ok(())
    }

    /// Requests waiting in the frontier (not yet in the service).
    pub fn pending(&self) -> usize {
        self.shared.lock().pending()
    }
}

impl<B> FrontierHandle<B, http::Uri> {
    /// Queues `request`, tagged with its URI. See
    /// [`push_tagged`](Self::push_tagged).
    ///
    /// # Errors
    ///
    /// [`PushError`], with the request, when the frontier was dropped.
    pub async fn push(&self, request: http::Request<B>) -> Result<(), PushError<B>> {
        // The URI is copied when the request is sent, not kept twice while
        // it waits.
        self.shared.lock().uri_tag = Some(|request| request.uri().clone());
        self.push_inner(request, None).await
    }
}

impl<B, T> Clone for FrontierHandle<B, T> {
    fn clone(&self) -> Self {
        self.shared.lock().handles += 1;
        FrontierHandle {
            shared: self.shared.clone(),
        }
    }
}

impl<B, T> Drop for FrontierHandle<B, T> {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.handles -= 1;
        if state.handles == 0 {
            if let Some(waker) = state.frontier.take() {
                waker.wake();
            }
        }
    }
}

impl<B, T> fmt::Debug for FrontierHandle<B, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrontierHandle")
            .field("pending", &self.pending())
            .finish()
    }
}
