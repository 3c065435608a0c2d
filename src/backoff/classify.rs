//! Deciding what a response or an error says: the default rules and the
//! views user hooks receive.

use std::any::Any;
use std::error::Error as StdError;
use std::fmt;

use crate::registry::{BackoffConfig, ErrorKind, Feedback};

/// The head of a response, as a classification hook sees it. Made with
/// [`ResponseHead::of`] (it may gain fields).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct ResponseHead<'a> {
    /// The status code.
    pub status: http::StatusCode,
    /// The headers.
    pub headers: &'a http::HeaderMap,
    /// The response extensions.
    pub extensions: &'a http::Extensions,
}

impl<'a> ResponseHead<'a> {
    /// Borrows the head of `response`.
    pub fn of<B>(response: &'a http::Response<B>) -> Self {
        ResponseHead {
            status: response.status(),
            headers: response.headers(),
            extensions: response.extensions(),
        }
    }
}

/// An error of the inner service, as a classification hook sees it: the
/// concrete error (for [`downcast_ref`](Self::downcast_ref)) and, when its
/// type is one of the common error types, the `std::error::Error` chain.
pub struct ErrorView<'a> {
    any: &'a dyn Any,
    error: Option<&'a (dyn StdError + 'static)>,
}

impl fmt::Debug for ErrorView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.error {
            Some(error) => f
                .debug_tuple("ErrorView")
                .field(&format_args!("{error}"))
                .finish(),
            None => f.write_str("ErrorView(<opaque>)"),
        }
    }
}

type BoxError = Box<dyn StdError + Send + Sync>;

impl<'a> ErrorView<'a> {
    /// Views `error`. Its `std::error::Error` side is found for boxed
    /// errors (`Box<dyn Error + Send + Sync>`, what tower's own middleware
    /// returns), `std::io::Error`, tower's and tokio's timeout errors,
    /// `hyper::Error`, hyper-util's client error and (feature `reqwest`)
    /// `reqwest::Error`; other types are only
    /// reachable through [`downcast_ref`](Self::downcast_ref).
    pub fn of<E: 'static>(error: &'a E) -> Self {
        ErrorView {
            any: error,
            error: as_std_error(error),
        }
    }

    /// The error as its concrete type `T`, if it is one.
    pub fn downcast_ref<T: 'static>(&self) -> Option<&'a T> {
        self.any.downcast_ref::<T>()
    }

    /// The error and its sources, outermost first (empty when the type is
    /// not known).
    pub fn chain(&self) -> impl Iterator<Item = &'a (dyn StdError + 'static)> {
        std::iter::successors(self.error, |&error| error.source())
    }
}

fn as_std_error<E: 'static>(error: &E) -> Option<&(dyn StdError + 'static)> {
    let any: &dyn Any = error;
    if let Some(boxed) = any.downcast_ref::<BoxError>() {
        return Some(&**boxed);
    }
    if let Some(boxed) = any.downcast_ref::<Box<dyn StdError + Send>>() {
        return Some(&**boxed);
    }
    if let Some(boxed) = any.downcast_ref::<Box<dyn StdError>>() {
        return Some(&**boxed);
    }
    macro_rules! known {
        ($($ty:ty),* $(,)?) => {
            $(if let Some(error) = any.downcast_ref::<$ty>() {
                return Some(error);
            })*
        };
    }
    known!(
        // What `RobotsDelay` returns, so a `Retry` layer above it sees the
        // inner error through its source.
        crate::Error,
        std::io::Error,
        tower::timeout::error::Elapsed,
        tokio::time::error::Elapsed,
        hyper::Error,
    );
    #[cfg(feature = "hyper-util")]
    known!(hyper_util::client::legacy::Error);
    #[cfg(feature = "reqwest")]
    known!(reqwest::Error);
    None
}

/// The default response rule: a status in the scope's backoff `http_codes`
/// is backoff feedback, anything else is success.
pub fn default_response_feedback(head: &ResponseHead<'_>, config: &BackoffConfig) -> Feedback {
    if config.is_backoff_status(head.status.as_u16()) {
        Feedback::backoff()
    } else {
        Feedback::success()
    }
}

/// The default error rule: timeouts and connection failures are backoff
/// feedback, anything else is success (the error still reaches the caller).
///
/// Recognised anywhere in the error's source chain: `std::io::Error` of kind
/// `TimedOut`, `ConnectionRefused`, `ConnectionReset` or
/// `ConnectionAborted`; `tower::timeout::error::Elapsed`;
/// `tokio::time::error::Elapsed`; a `hyper::Error` that is a timeout; and,
/// with the `hyper-util` feature, a hyper-util client error that
/// `is_connect()`; with the `reqwest` feature, a `reqwest::Error` that
/// `is_timeout()` or `is_connect()`.
pub fn default_error_feedback(error: &ErrorView<'_>) -> Feedback {
    if error_kind(error) == ErrorKind::Other {
        Feedback::success()
    } else {
        Feedback::backoff()
    }
}

/// What kind of error `error` is, from the first timeout or connection
/// failure found in its source chain (what [`default_error_feedback`]
/// calls backoff feedback).
pub(crate) fn error_kind(error: &ErrorView<'_>) -> ErrorKind {
    error
        .chain()
        .find_map(overload_signal)
        .unwrap_or(ErrorKind::Other)
}

fn overload_signal(error: &(dyn StdError + 'static)) -> Option<ErrorKind> {
    use std::io::ErrorKind as Io;
    if let Some(io) = error.downcast_ref::<std::io::Error>() {
        let kind = match io.kind() {
            Io::TimedOut => Some(ErrorKind::Timeout),
            Io::ConnectionRefused | Io::ConnectionReset | Io::ConnectionAborted => {
                Some(ErrorKind::Connection)
            }
            _ => None,
        };
        // `io::Error::source` skips the error it wraps; look at it too.
        return kind.or_else(|| io.get_ref().and_then(|inner| overload_signal(inner)));
    }
    if error.is::<tower::timeout::error::Elapsed>() || error.is::<tokio::time::error::Elapsed>() {
        return Some(ErrorKind::Timeout);
    }
    if let Some(hyper) = error.downcast_ref::<hyper::Error>() {
        return hyper.is_timeout().then_some(ErrorKind::Timeout);
    }
    #[cfg(feature = "hyper-util")]
    if let Some(client) = error.downcast_ref::<hyper_util::client::legacy::Error>() {
        return client.is_connect().then_some(ErrorKind::Connection);
    }
    #[cfg(feature = "reqwest")]
    if let Some(reqwest) = error.downcast_ref::<reqwest::Error>() {
        if reqwest.is_timeout() {
            return Some(ErrorKind::Timeout);
        }
        return reqwest.is_connect().then_some(ErrorKind::Connection);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_kinds_tell_timeouts_from_connection_failures() {
        use std::io::{Error, ErrorKind as Io};
        let kind = |error: Error| error_kind(&ErrorView::of(&error));
        assert_eq!(kind(Error::from(Io::TimedOut)), ErrorKind::Timeout);
        assert_eq!(kind(Error::from(Io::ConnectionReset)), ErrorKind::Connection);
        assert_eq!(kind(Error::from(Io::InvalidData)), ErrorKind::Other);
        let elapsed = tower::timeout::error::Elapsed::new();
        assert_eq!(error_kind(&ErrorView::of(&elapsed)), ErrorKind::Timeout);
    }

    fn verdict<E: 'static>(error: E) -> bool {
        default_error_feedback(&ErrorView::of(&error)).is_backoff()
    }

    #[test]
    fn timeouts_and_connection_failures_are_backoff_feedback() {
        use std::io::{Error, ErrorKind};
        assert!(verdict(Error::from(ErrorKind::TimedOut)));
        assert!(verdict(Error::from(ErrorKind::ConnectionRefused)));
        assert!(verdict(Error::from(ErrorKind::ConnectionReset)));
        assert!(verdict(tower::timeout::error::Elapsed::new()));
        let boxed: BoxError = Box::new(tower::timeout::error::Elapsed::new());
        assert!(verdict(boxed));
        // Wrapped in another error: found through the source chain.
        #[derive(Debug)]
        struct RequestFailed(Error);
        impl std::fmt::Display for RequestFailed {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("request failed")
            }
        }
        impl StdError for RequestFailed {
            fn source(&self) -> Option<&(dyn StdError + 'static)> {
                Some(&self.0)
            }
        }
        let wrapped: BoxError = Box::new(RequestFailed(Error::from(ErrorKind::TimedOut)));
        assert!(verdict(wrapped));
        let custom: BoxError = Box::new(Error::other(Error::from(ErrorKind::ConnectionReset)));
        assert!(verdict(custom));
    }

    #[test]
    fn connection_failures_behind_robots_delay_are_backoff_feedback() {
        use std::io::{Error, ErrorKind};
        assert!(verdict(crate::Error::inner(Error::from(
            ErrorKind::ConnectionRefused
        ))));
        assert!(!verdict(crate::Error::inner(Error::other("bad request"))));
        assert!(!verdict(crate::Error::robots_disallowed(
            "http://a".into(),
            "/".into(),
            false
        )));
    }

    #[test]
    fn other_errors_are_success() {
        use std::io::{Error, ErrorKind};
        assert!(!verdict(Error::from(ErrorKind::InvalidData)));
        let boxed: BoxError = "bad request body".into();
        assert!(!verdict(boxed));
        #[derive(Debug)]
        struct Opaque;
        assert!(!verdict(Opaque));
        assert!(ErrorView::of(&Opaque).downcast_ref::<Opaque>().is_some());
    }

    #[test]
    fn default_codes_are_backoff_and_others_success() {
        let config = BackoffConfig::default();
        let headers = http::HeaderMap::new();
        let extensions = http::Extensions::new();
        for (code, backoff) in [
            (429, true),
            (503, true),
            (520, true),
            (200, false),
            (404, false),
            (500, false),
        ] {
            let head = ResponseHead {
                status: http::StatusCode::from_u16(code).unwrap(),
                headers: &headers,
                extensions: &extensions,
            };
            assert_eq!(
                default_response_feedback(&head, &config).is_backoff(),
                backoff,
                "{code}"
            );
        }
    }
}
