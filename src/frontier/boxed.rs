//! A pending request's box: made once per push, and given back to a few
//! spares when the request leaves for the service, so that a crawl in
//! its steady state pushes and sends without allocating.

use std::ops::Deref;

/// A queued request in its box (see the [module docs](self)).
pub(super) struct QueuedRequest<B>(Box<Option<http::Request<B>>>);

/// Spare boxes kept for the next pushes: as many as a burst of hand-overs
/// frees at once, so a full queue of a million requests going out keeps
/// no more than this many.
const SPARES: usize = 64;

/// The boxes of requests that left, for the next pushes.
pub(super) struct SpareBoxes<B>(Vec<Box<Option<http::Request<B>>>>);

impl<B> Default for SpareBoxes<B> {
    fn default() -> Self {
        SpareBoxes(Vec::new())
    }
}

impl<B> QueuedRequest<B> {
    /// `request` in a new box.
    pub(super) fn new(request: http::Request<B>) -> Self {
        QueuedRequest(Box::new(Some(request)))
    }

    /// The request, its box dropped.
    pub(super) fn into_inner(mut self) -> http::Request<B> {
        take_out(&mut self.0)
    }
}

/// The request out of its box, which it fills from its push to its leave.
fn take_out<B>(boxed: &mut Option<http::Request<B>>) -> http::Request<B> {
    boxed
        .take()
        .expect("a queued request is in its box until it leaves")
}

impl<B> Deref for QueuedRequest<B> {
    type Target = http::Request<B>;

    fn deref(&self) -> &http::Request<B> {
        self.0
            .as_ref()
            .as_ref()
            .expect("a queued request is in its box until it leaves")
    }
}

impl<B> SpareBoxes<B> {
    /// `request` in a spare box, or a new one.
    pub(super) fn boxed(&mut self, request: http::Request<B>) -> QueuedRequest<B> {
        match self.0.pop() {
            Some(mut spare) => {
                *spare = Some(request);
                QueuedRequest(spare)
            }
            None => QueuedRequest::new(request),
        }
    }

    /// The request out of its box; the box is kept as a spare.
    pub(super) fn unboxed(&mut self, queued: QueuedRequest<B>) -> http::Request<B> {
        let mut boxed = queued.0;
        let request = take_out(&mut boxed);
        if self.0.len() < SPARES {
            self.0.push(boxed);
        }
        request
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_box_given_back_carries_the_next_request() {
        let mut spares = SpareBoxes::default();
        let first = spares.boxed(http::Request::get("https://a.example/1").body(()).unwrap());
        let address = &*first as *const http::Request<()> as usize;
        assert_eq!(spares.unboxed(first).uri(), "https://a.example/1");
        let second = spares.boxed(http::Request::get("https://a.example/2").body(()).unwrap());
        assert_eq!(second.uri(), "https://a.example/2");
        assert_eq!(
            &*second as *const http::Request<()> as usize, address,
            "the same box"
        );
        assert_eq!(QueuedRequest::into_inner(second).uri(), "https://a.example/2");
    }

    #[test]
    fn no_more_than_the_spares_are_kept() {
        let mut spares = SpareBoxes::default();
        let queued: Vec<_> = (0..SPARES + 10)
            .map(|_| QueuedRequest::new(http::Request::new(())))
            .collect();
        for request in queued {
            spares.unboxed(request);
        }
        assert_eq!(spares.0.len(), SPARES);
    }
}
