//! Errors: [`ConfigError`] for rejected settings, [`Error`] for requests a
//! layer fails.

use std::any::Any;
use std::borrow::Cow;
use std::time::Duration;
use std::{fmt, io};

use crate::store::StoreError;

/// A configuration value was rejected when the registry was built or a scope
/// config was replaced. The message names the field and the value; for a
/// scope key that the registry's resolver can never give a request, the
/// field is `scope key` and the value the key (see
/// [`ScopeResolver::check_key`](crate::scope::ScopeResolver::check_key)).
///
/// ```
/// use tower_throttle::{Registry, ScopeConfig};
///
/// let err = Registry::builder()
///     .scope("api", ScopeConfig::default().concurrency(0))
///     .build()
///     .unwrap_err();
/// assert_eq!(err.field(), "scope \"api\" concurrency");
/// assert_eq!(err.to_string(), "invalid scope \"api\" concurrency = 0: must be at least 1");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConfigError {
    field: String,
    value: String,
    reason: Cow<'static, str>,
}

impl ConfigError {
    pub(crate) fn new(field: impl Into<String>, value: impl fmt::Debug, reason: &'static str) -> Self {
        ConfigError::with_reason(field, value, reason)
    }

    /// [`new`](Self::new) with a reason made for this value.
    pub(crate) fn with_reason(
        field: impl Into<String>,
        value: impl fmt::Debug,
        reason: impl Into<Cow<'static, str>>,
    ) -> Self {
        ConfigError {
            field: field.into(),
            value: format!("{value:?}"),
            reason: reason.into(),
        }
    }

    /// The rejected field, e.g. `max_concurrency` or `scope "api" jitter`.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// The rejected value, as written in Rust debug notation.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// Why the value was rejected.
    #[cfg(feature = "serde")]
    pub(crate) fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {} = {}: {}", self.field, self.value, self.reason)
    }
}

impl std::error::Error for ConfigError {}

/// A type-erased error, as the inner services of this crate's layers may
/// return.
pub(crate) use tower::BoxError;

/// The error of a layer that can fail a request on its own account, such as
/// [`RobotsDelay`](crate::RobotsDelay) or a [`Throttle`](crate::Throttle)
/// whose registry's store is unreachable: either the layer refused the
/// request, or the inner service failed.
///
/// The type is opaque so that its kinds can grow without breaking callers;
/// ask it with the predicates ([`is_robots_disallowed`](Self::is_robots_disallowed),
/// [`is_inner`](Self::is_inner)). An inner service's error is kept boxed and
/// is this error's [`source`](std::error::Error::source); take it back with
/// [`into_inner`](Self::into_inner) to downcast it. When the inner error is
/// itself an `Error` of this crate (two such layers stacked), it is passed
/// through as it is rather than wrapped twice.
///
/// ```
/// use tower_throttle::Error;
///
/// fn describe(err: &Error) -> &'static str {
///     if err.is_robots_disallowed() {
///         "skipped: robots.txt says no"
///     } else {
///         "the request failed"
///     }
/// }
/// # let _ = describe;
/// ```
pub struct Error {
    kind: Failure,
}

enum Failure {
    /// robots.txt disallows the request (or is unreachable while rules are
    /// obeyed, which RFC 9309 treats as a complete disallow).
    #[cfg_attr(not(feature = "robots"), allow(dead_code))]
    RobotsDisallowed {
        origin: String,
        path: String,
        unreachable: bool,
    },
    /// The scope store could not be reached (the registry fails closed).
    Store(StoreError),
    /// The request's host could not be resolved (`IpScopeLayer`).
    Dns(LookupFailure),
    /// The request would wait past its bound, or did (see
    /// [`ScopeConfig::max_wait`](crate::ScopeConfig::max_wait)).
    WouldWait(Box<dyn Refused>),
    /// Its scope had `max_waiting` requests waiting already.
    QueueFull {
        scope: String,
        max_waiting: usize,
    },
    Inner(BoxError),
}

/// What a request failed for its bound learnt (`waited::WouldWait`),
/// known here only by this trait: this module depends on none that reaches
/// the registry, whose errors it defines.
pub(crate) trait Refused: fmt::Debug + fmt::Display + Send + Sync + 'static {
    /// The wait predicted when the request was failed.
    fn retry_after(&self) -> Duration;
    /// The details, for `waited`'s accessors.
    fn as_any(&self) -> &dyn Any;
}

impl Error {
    #[cfg_attr(not(feature = "robots"), allow(dead_code))]
    pub(crate) fn robots_disallowed(origin: String, path: String, unreachable: bool) -> Self {
        Error {
            kind: Failure::RobotsDisallowed {
                origin,
                path,
                unreachable,
            },
        }
    }

    pub(crate) fn dns(failure: LookupFailure) -> Self {
        Error {
            kind: Failure::Dns(failure),
        }
    }

    pub(crate) fn would_wait(would_wait: Box<dyn Refused>) -> Self {
        Error {
            kind: Failure::WouldWait(would_wait),
        }
    }

    /// The details of a request failed for its bound.
    pub(crate) fn refused(&self) -> Option<&dyn Any> {
        match &self.kind {
            Failure::WouldWait(would_wait) => Some(would_wait.as_any()),
            _ => None,
        }
    }

    pub(crate) fn queue_full(scope: String, max_waiting: usize) -> Self {
        Error {
            kind: Failure::QueueFull { scope, max_waiting },
        }
    }

    pub(crate) fn store(error: StoreError) -> Self {
        Error {
            kind: Failure::Store(error),
        }
    }

    /// Wraps an inner service's error, passing an `Error` of this crate
    /// through unchanged.
    pub(crate) fn inner(err: impl Into<BoxError>) -> Self {
        match err.into().downcast::<Error>() {
            Ok(err) => *err,
            Err(err) => Error {
                kind: Failure::Inner(err),
            },
        }
    }

    /// Whether the request was refused because robots.txt disallows it, or
    /// because the site's robots.txt is unreachable while its rules are
    /// obeyed. The inner service never saw the request.
    pub fn is_robots_disallowed(&self) -> bool {
        matches!(self.kind, Failure::RobotsDisallowed { .. })
    }

    /// Whether the registry's [scope store](crate::store) could not be
    /// reached (or timed out) and the registry fails closed
    /// ([`StoreFailure::FailClosed`](crate::store::StoreFailure)). The
    /// inner service never saw the request. The store's error is the
    /// [`source`](std::error::Error::source).
    pub fn is_store(&self) -> bool {
        matches!(self.kind, Failure::Store(_))
    }

    /// Whether the request's host could not be resolved
    /// ([`IpScopeLayer`](crate::ip::IpScopeLayer)): the lookup failed or
    /// found no address. The inner service never saw the request. The
    /// lookup's error is the [`source`](std::error::Error::source).
    pub fn is_dns(&self) -> bool {
        matches!(self.kind, Failure::Dns(_))
    }

    /// Whether the request would have waited past its bound
    /// ([`ScopeConfig::max_wait`](crate::ScopeConfig::max_wait) or its
    /// [`MaxWait`](crate::scope::MaxWait)): the registry predicted so when
    /// it came, or while it waited, or the bound passed while it waited.
    /// The inner service never saw the request; it took no lane, started
    /// no gap and spent no quota. [`retry_after`](Self::retry_after) says
    /// when to try again, [`wait_cause`](Self::wait_cause) why, and
    /// [`waited`](Self::waited) what it waited when it was failed while it
    /// waited.
    pub fn is_would_wait(&self) -> bool {
        matches!(self.kind, Failure::WouldWait(_))
    }

    /// Whether the request's scope had its
    /// [`max_waiting`](crate::ScopeConfig::max_waiting) requests waiting
    /// already when it came. The inner service never saw the request.
    pub fn is_queue_full(&self) -> bool {
        matches!(self.kind, Failure::QueueFull { .. })
    }

    /// For a request that [would wait](Self::is_would_wait): the wait the
    /// registry predicted when it failed the request (from then on), for a
    /// `Retry-After` header.
    pub fn retry_after(&self) -> Option<Duration> {
        match &self.kind {
            Failure::WouldWait(would_wait) => Some(would_wait.retry_after()),
            _ => None,
        }
    }

    /// Whether the inner service failed (its error is the
    /// [`source`](std::error::Error::source)).
    pub fn is_inner(&self) -> bool {
        matches!(self.kind, Failure::Inner(_))
    }

    /// The inner service's error, to downcast it; `None` when the error is
    /// the layer's own.
    pub fn into_inner(self) -> Option<BoxError> {
        match self.kind {
            Failure::Inner(err) => Some(err),
            Failure::RobotsDisallowed { .. }
            | Failure::Store(_)
            | Failure::Dns(_)
            | Failure::WouldWait(_)
            | Failure::QueueFull { .. } => None,
        }
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Failure::RobotsDisallowed {
                origin,
                path,
                unreachable,
            } => f
                .debug_struct("Error")
                .field("kind", &"RobotsDisallowed")
                .field("origin", origin)
                .field("path", path)
                .field("unreachable", unreachable)
                .finish(),
            Failure::Store(err) => f
                .debug_struct("Error")
                .field("kind", &"Store")
                .field("source", err)
                .finish(),
            Failure::Dns(failure) => f
                .debug_struct("Error")
                .field("kind", &"Dns")
                .field("host", &failure.host)
                .field("io_kind", &failure.kind)
                .field("error", &failure.message)
                .finish(),
            Failure::WouldWait(would_wait) => f
                .debug_struct("Error")
                .field("kind", &"WouldWait")
                .field("refused", would_wait)
                .finish(),
            Failure::QueueFull { scope, max_waiting } => f
                .debug_struct("Error")
                .field("kind", &"QueueFull")
                .field("scope", scope)
                .field("max_waiting", max_waiting)
                .finish(),
            Failure::Inner(err) => f
                .debug_struct("Error")
                .field("kind", &"Inner")
                .field("source", err)
                .finish(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Failure::RobotsDisallowed {
                origin,
                path,
                unreachable: false,
            } => write!(f, "robots.txt of {origin} disallows {path}"),
            Failure::RobotsDisallowed {
                origin,
                path,
                unreachable: true,
            } => write!(
                f,
                "robots.txt of {origin} is unreachable, so {path} is disallowed until it can be fetched"
            ),
            Failure::Store(_) => f.write_str("scope store unreachable, and the registry fails closed"),
            Failure::Dns(failure) => write!(f, "{failure}"),
            Failure::WouldWait(would_wait) => write!(f, "{would_wait}"),
            Failure::QueueFull { scope, max_waiting } => write!(
                f,
                "scope {scope:?} has {max_waiting} requests waiting already (its max_waiting)"
            ),
            Failure::Inner(_) => f.write_str("inner service error"),
        }
    }
}

/// A reqwest error (a request reqwest could not build) is an inner
/// service's error.
#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
impl From<reqwest::Error> for Error {
    fn from(err: reqwest::Error) -> Self {
        Error::inner(err)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            Failure::Inner(err) => Some(&**err),
            Failure::Store(err) => Some(err),
            Failure::Dns(failure) => Some(failure),
            Failure::RobotsDisallowed { .. } | Failure::WouldWait(_) | Failure::QueueFull { .. } => None,
        }
    }
}

/// A failed lookup of a request's host (`IpScopeLayer`), as every request
/// that shared it sees it.
#[derive(Debug, Clone)]
pub(crate) struct LookupFailure {
    pub(crate) host: String,
    pub(crate) kind: io::ErrorKind,
    pub(crate) message: String,
}

impl fmt::Display for LookupFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "could not resolve {:?}: {}", self.host, self.message)
    }
}

impl std::error::Error for LookupFailure {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn robots_disallowed_is_its_own_failure_without_source() {
        let err = Error::robots_disallowed("https://example.com".into(), "/private/x".into(), false);
        assert!(err.is_robots_disallowed());
        assert!(!err.is_inner());
        assert!(err.source().is_none());
        assert_eq!(
            err.to_string(),
            "robots.txt of https://example.com disallows /private/x"
        );
        assert!(err.into_inner().is_none());
    }

    #[test]
    fn inner_errors_are_the_source_and_are_not_wrapped_twice() {
        let io = std::io::Error::other("connection reset");
        let err = Error::inner(io);
        assert!(err.is_inner());
        assert_eq!(err.to_string(), "inner service error");
        assert_eq!(err.source().unwrap().to_string(), "connection reset");

        let twice = Error::inner(err);
        assert!(twice.is_inner());
        assert!(twice.into_inner().unwrap().downcast::<std::io::Error>().is_ok());

        let store = Error::store(StoreError::unexpected("nonsense"));
        assert!(Error::inner(store).is_store());

        let disallowed = Error::robots_disallowed("http://a".into(), "/".into(), true);
        assert!(Error::inner(disallowed).is_robots_disallowed());
    }
}
