//! How a [`Throttle`](super::Throttle) reports errors: the inner service's
//! own, or the crate's [`Error`], which can also say that a
//! scope store failed.

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
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::InnerErrors {}
    impl Sealed for super::StoreErrors {}
}

/// The throttle passes the inner service's error type through unchanged
/// (the default). It cannot report a store failure: under
/// [`StoreFailure::FailClosed`](crate::store::StoreFailure::FailClosed)
/// its requests wait for the store instead.
#[derive(Debug, Clone, Copy, Default)]
pub struct InnerErrors;

/// The throttle returns the crate's [`Error`]: the inner service's errors
/// wrapped ([`Error::is_inner`]), and store failures
/// ([`Error::is_store`]).
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
}

impl<E: Into<BoxError>> ErrorMode<E> for StoreErrors {
    type Error = Error;

    fn inner(error: E) -> Error {
        Error::inner(error)
    }

    fn store(error: StoreError) -> Result<Error, StoreError> {
        Ok(Error::store(error))
    }
}
