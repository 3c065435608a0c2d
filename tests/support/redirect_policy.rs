//! A `tower_http::follow_redirect` policy that makes a redirect loop, or a
//! chain longer than its limit, an error instead of handing the last `3xx`
//! back (tower-http's `Limited` stops and returns it). The docs
//! (`docs/transfers-and-redirects.md`) show it.

use std::fmt;

use tower_http::follow_redirect::policy::{Action, Attempt, Policy};

/// Follows up to `max` redirects; a location already visited, or one hop
/// more, fails with [`RedirectError`].
#[derive(Debug, Clone)]
pub struct FailOnLoops {
    max: usize,
    visited: Vec<http::Uri>,
}

impl FailOnLoops {
    pub fn new(max: usize) -> Self {
        FailOnLoops {
            max,
            visited: Vec::new(),
        }
    }
}

/// Why a redirect was not followed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedirectError {
    /// The location was visited already in this chain.
    Loop(http::Uri),
    /// The chain went past the limit.
    TooMany(usize),
}

impl fmt::Display for RedirectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedirectError::Loop(uri) => write!(f, "redirect loop: {uri} was visited already"),
            RedirectError::TooMany(max) => write!(f, "more than {max} redirects"),
        }
    }
}

impl std::error::Error for RedirectError {}

impl<B, E: From<RedirectError>> Policy<B, E> for FailOnLoops {
    fn redirect(&mut self, attempt: &Attempt<'_>) -> Result<Action, E> {
        if self.visited.is_empty() {
            self.visited.push(attempt.previous().clone());
        }
        let next = attempt.location();
        if self.visited.contains(next) {
            return Err(RedirectError::Loop(next.clone()).into());
        }
        if self.visited.len() > self.max {
            return Err(RedirectError::TooMany(self.max).into());
        }
        self.visited.push(next.clone());
        Ok(Action::Follow)
    }
}
