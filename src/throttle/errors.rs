//! How a [`Throttle`](super::Throttle) reports errors: the inner service's
//! own, or the crate's [`Error`], which can also say that a
//! scope store failed, or that a request would wait past its bound.

use crate::error::{BoxError, Error};
use crate::store::StoreError;

/// The error type a [`Throttle`](super::Throttle) returns, chosen on its
/// layer: [`InnerErrors`] (the default) or [`StoreErrors`]
/// ([`ThrottleLayer::store_errors`](super::ThrottleLayer::store_errors)).
/// Sealed: these two are the only ones.
pub trait ErrorMode<E>: sealed::Sealed {
    /// The service's error type.
    type Error;

    /// An error of the inner service.
    fn inner(error: E) -> Self::Error;

    /// A store failure, if this mode can say it.
    ///
    /// # Errors
    ///
    /// Gives the store error back when the mode has no way to report it.
    fn store(error: StoreError) -> Result<Self::Error, StoreError>;

    /// Whether the mode can fail a request on the throttle's own account
    /// (a wait past its bound, a full scope queue): only then do bounds
    /// apply.
    #[doc(hidden)]
    const REFUSES: bool;

    /// The throttle's own failure of a request, if this mode can say it
    /// (see [`REFUSES`](Self::REFUSES)).
    #[doc(hidden)]
    fn refused(error: Error) -> Option<Self::Error>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::InnerErrors {}
    impl Sealed for super::StoreErrors {}
}

/// The throttle passes the inner service's error type through unchanged
/// (the default). It cannot report a store failure: under
/// [`StoreFailure::FailClosed`](crate::store::StoreFailure::FailClosed)
/// its requests wait for the store instead. Nor can it fail a request that
/// would wait past its bound: bounds
/// ([`ScopeConfig::max_wait`](crate::ScopeConfig::max_wait),
/// [`max_waiting`](crate::ScopeConfig::max_waiting),
/// [`MaxWait`](crate::scope::MaxWait)) do not apply to its requests, which
/// wait as if there were none (a scope's bounds with a warning, once).
#[derive(Debug, Clone, Copy, Default)]
pub struct InnerErrors;

/// The throttle returns the crate's [`Error`]: the inner service's errors
/// wrapped ([`Error::is_inner`]), store failures ([`Error::is_store`]),
/// and requests failed for their bounds ([`Error::is_would_wait`],
/// [`Error::is_queue_full`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct StoreErrors;

impl<E> ErrorMode<E> for InnerErrors {
    type Error = E;

    fn inner(error: E) -> E {
        error
    }

    fn store(error: StoreError) -> Result<E, StoreError> {
        Err(error)
    }

    const REFUSES: bool = false;

    fn refused(_error: Error) -> Option<E> {
        None
    }
}

impl<E: Into<BoxError>> ErrorMode<E> for StoreErrors {
    type Error = Error;

    fn inner(error: E) -> Error {
        Error::inner(error)
    }

    fn store(error: StoreError) -> Result<Error, StoreError> {
        Ok(Error::store(error))
    }

    const REFUSES: bool = true;

    fn refused(error: Error) -> Option<Error> {
        Some(error)
    }
}
