//! What a response's rate-limit headers ask of the request's scopes, and
//! reporting it to the registry. The decisions are pure functions of the
//! parsed headers, tested below; [`Observer::observe`] applies them.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderValue, StatusCode};
use tokio::time::Instant;

use super::DEFAULT_REDIRECT_MAX_DELAY;
use crate::parse::rate_limit_headers::{
    parse_delta_seconds, parse_ratelimit, parse_ratelimit_policy, parse_remaining, parse_retry_after,
    parse_x_ratelimit_reset, RateLimitHeaders, RateLimitPolicyItem,
};
use crate::registry::{AnnouncedLimits, Feedback, Registry, ScopeReport, MAX_CONFIG_DELAY};
use crate::scope::Scopes;

/// The layer's options, copied into every service and response future.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Settings {
    pub(crate) redirect_max_delay: Duration,
    pub(crate) pace_to_policy: bool,
    pub(crate) remaining_quota: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            redirect_max_delay: DEFAULT_REDIRECT_MAX_DELAY,
            pace_to_policy: false,
            remaining_quota: false,
        }
    }
}

/// Which header a hold came from, named in its debug event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HoldSource {
    RetryAfter,
    /// The quota reset of `RateLimit`, `RateLimit-Reset` or `X-RateLimit-Reset`.
    Reset,
}

impl HoldSource {
    fn header(self) -> &'static str {
        match self {
            HoldSource::RetryAfter => "retry-after",
            HoldSource::Reset => "ratelimit reset",
        }
    }
}

/// The hold a response with `status` asks of one scope, where
/// `backoff_status` says whether `status` is among that scope's backoff
/// codes:
///
/// - a redirect with `Retry-After`: that value, at most `redirect_max_delay`
///   (even if the scope counts that 3xx as a backoff status);
/// - a backoff response: `Retry-After`, else the quota reset (the IETF
///   draft gives `Retry-After` precedence);
/// - otherwise: the reset, when the remaining quota is 0.
fn hold_of(
    status: StatusCode,
    backoff_status: bool,
    headers: &RateLimitHeaders,
    redirect_max_delay: Duration,
) -> Option<(Duration, HoldSource)> {
    if let (true, Some(retry_after)) = (status.is_redirection(), headers.retry_after) {
        let hold = retry_after.min(redirect_max_delay);
        return (!hold.is_zero()).then_some((hold, HoldSource::RetryAfter));
    }
    if backoff_status {
        let source = if headers.retry_after.is_some() {
            HoldSource::RetryAfter
        } else {
            HoldSource::Reset
        };
        return headers.backoff_hold().map(|hold| (hold, source));
    }
    headers.exhausted_hold().map(|hold| (hold, HoldSource::Reset))
}

/// The pacing `pace_to_policy` derives: `(delay between sends, how long)`.
///
/// With `r` units remaining and a reset in `t`: `t / max(r, 1)` until the
/// reset. Without both, from the strictest `RateLimit-Policy` (`q` units per
/// `w`): `w / q` for one window. With `r = 0` nothing: the hold until the
/// reset covers it, and pacing at `t` after it would contradict a shorter
/// `Retry-After`.
fn pacing_of(headers: &RateLimitHeaders) -> Option<(Duration, Duration)> {
    match (headers.remaining, headers.reset) {
        (Some(0), _) => None,
        (Some(remaining), Some(reset)) => Some((reset / saturating_u32(remaining), reset)),
        _ => strictest_policy(&headers.policies)
            .map(|(quota, window)| (window / saturating_u32(quota), window)),
    }
}

/// The policy with the lowest rate (the longest `w / q`), among those with
/// a positive quota and window: the one that binds in the long run.
fn strictest_policy(policies: &[RateLimitPolicyItem]) -> Option<(u64, Duration)> {
    policies
        .iter()
        .filter_map(|policy| {
            Some((
                policy.quota.filter(|&q| q > 0)?,
                policy.window.filter(|w| !w.is_zero())?,
            ))
        })
        .max_by_key(|&(quota, window)| window / saturating_u32(quota))
}

fn saturating_u32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// What the headers announce about the server's limits, for the stats; `None`
/// when they announce nothing (a bare `Retry-After` is not an announcement).
fn announced_limits(headers: &RateLimitHeaders, now: Instant) -> Option<AnnouncedLimits> {
    if headers.remaining.is_none() && headers.reset.is_none() && headers.policies.is_empty() {
        return None;
    }
    let (quota, window) = match strictest_policy(&headers.policies) {
        Some((quota, window)) => (Some(quota), Some(window)),
        None => headers
            .policies
            .first()
            .map_or((None, None), |policy| (policy.quota, policy.window)),
    };
    let reset_at = headers.reset.and_then(|reset| now.checked_add(reset));
    Some(AnnouncedLimits::new(quota, window, headers.remaining, reset_at))
}

/// Reports one response to the registry on behalf of one request.
#[derive(Debug)]
pub(crate) struct Observer {
    registry: Registry,
    scopes: Scopes,
    settings: Settings,
}

impl Observer {
    pub(crate) fn new(registry: Registry, scopes: Scopes, settings: Settings) -> Self {
        Observer {
            registry,
            scopes,
            settings,
        }
    }

    /// Holds, paces and records announced limits for every scope of the
    /// request, as the response's headers ask.
    pub(crate) fn observe(self, status: StatusCode, headers: &HeaderMap) {
        // HTTP dates and epoch resets are wall-clock values, so they are read
        // against the wall clock; each becomes a duration at once, and the
        // hold itself runs on tokio time in the registry.
        let wall_now = SystemTime::now();
        let parsed = RateLimitHeaders::from_headers(headers, wall_now);
        if tracing::enabled!(target: "tower_throttle", tracing::Level::DEBUG) {
            report_unusable(headers, &parsed, status, &self.scopes, wall_now);
        }
        if parsed == RateLimitHeaders::default() {
            return;
        }
        let now = Instant::now();
        let limits = announced_limits(&parsed, now);
        let pacing = if self.settings.pace_to_policy {
            pacing_of(&parsed)
        } else {
            None
        };
        // Only scopes with a quota of their own take the remaining quota up.
        let quota_feedback = match (self.settings.remaining_quota, parsed.remaining) {
            (true, Some(remaining)) => Some(Feedback::ignore().with_remaining_quota(remaining as f64)),
            _ => None,
        };
        let may_hold = parsed.retry_after.is_some() || parsed.reset.is_some();
        // Everything, for every scope, as one report (applied under the
        // throttle's completion lock, or one of its own).
        self.registry.report_on_completion(&self.scopes, |scope, config| {
            let mut report = ScopeReport::new();
            if let Some(feedback) = quota_feedback {
                report = report.feedback(feedback);
            }
            if may_hold {
                let backoff_status = config.get_backoff().is_backoff_status(status.as_u16());
                let hold = hold_of(status, backoff_status, &parsed, self.settings.redirect_max_delay);
                if let Some((hold, source)) = hold {
                    tracing::debug!(
                        target: "tower_throttle",
                        scope = %scope,
                        status = status.as_u16(),
                        header = source.header(),
                        hold_ms = hold.as_millis() as u64,
                        "the response asks to hold the scope"
                    );
                    report = report.hold(hold);
                }
                if parsed.retry_after.is_some()
                    && hold.is_none_or(|(_, source)| source != HoldSource::RetryAfter)
                {
                    tracing::debug!(
                        target: "tower_throttle",
                        scope = %scope,
                        status = status.as_u16(),
                        header = "retry-after",
                        "Retry-After ignored: only the scope's backoff statuses and redirects \
                         (up to redirect_max_delay) hold for it"
                    );
                }
            }
            if let Some((delay, span)) = pacing {
                tracing::debug!(
                    target: "tower_throttle",
                    scope = %scope,
                    delay_ms = delay.as_millis() as u64,
                    for_ms = span.as_millis() as u64,
                    "pacing the scope to the announced quota"
                );
                let until = now + span.min(MAX_CONFIG_DELAY);
                report = report.pacing(delay, until);
            }
            if let Some(limits) = &limits {
                report = report.announced(limits.clone());
            }
            report
        });
    }
}

type Usable = fn(&[u8], SystemTime) -> bool;

/// Every header this layer reads, with the check that its value is usable.
const CHECKS: [(&str, Usable); 9] = [
    ("retry-after", |value, now| {
        parse_retry_after(value, now).is_some()
    }),
    ("ratelimit", |value, _| parse_ratelimit(value).is_some()),
    ("ratelimit-policy", |value, _| {
        parse_ratelimit_policy(value).is_some()
    }),
    ("ratelimit-reset", |value, _| parse_delta_seconds(value).is_some()),
    ("ratelimit-remaining", |value, _| parse_remaining(value).is_some()),
    ("x-ratelimit-reset", |value, now| {
        parse_x_ratelimit_reset(value, now).is_some()
    }),
    ("x-rate-limit-reset", |value, now| {
        parse_x_ratelimit_reset(value, now).is_some()
    }),
    ("x-ratelimit-remaining", |value, _| {
        parse_remaining(value).is_some()
    }),
    ("x-rate-limit-remaining", |value, _| {
        parse_remaining(value).is_some()
    }),
];

/// A debug event for each header line that asks for no hold or cannot be
/// read (zero, a past date, malformed), so a user can see why a server's
/// request to slow down was not followed.
fn report_unusable(
    headers: &HeaderMap,
    parsed: &RateLimitHeaders,
    status: StatusCode,
    scopes: &Scopes,
    wall_now: SystemTime,
) {
    for (name, usable) in CHECKS {
        for value in headers.get_all(name) {
            if !usable(value.as_bytes(), wall_now) {
                tracing::debug!(
                    target: "tower_throttle",
                    header = name,
                    value = ?shown(value),
                    scopes = ?scopes,
                    status = status.as_u16(),
                    "rate-limit header value is zero, in the past or malformed: no hold from it"
                );
            }
        }
    }
    if parsed.remaining == Some(0) && parsed.reset.is_none() {
        tracing::debug!(
            target: "tower_throttle",
            scopes = ?scopes,
            status = status.as_u16(),
            "the remaining quota is 0 but no usable reset was announced: no hold"
        );
    }
}

/// The start of a header value as text, for a log line.
fn shown(value: &HeaderValue) -> std::borrow::Cow<'_, str> {
    let bytes = value.as_bytes();
    String::from_utf8_lossy(bytes.get(..64).unwrap_or(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn headers(retry_after: Option<u64>, remaining: Option<u64>, reset: Option<u64>) -> RateLimitHeaders {
        RateLimitHeaders {
            retry_after: retry_after.map(secs),
            remaining,
            reset: reset.map(secs),
            policies: Vec::new(),
        }
    }

    fn policy(quota: Option<u64>, window: Option<u64>) -> RateLimitPolicyItem {
        RateLimitPolicyItem {
            policy: "p".to_owned(),
            quota,
            window: window.map(secs),
        }
    }

    const TOO_MANY: StatusCode = StatusCode::TOO_MANY_REQUESTS;
    const CAP: Duration = Duration::from_secs(10);

    #[test]
    fn backoff_responses_prefer_retry_after_then_the_reset() {
        let both = headers(Some(5), Some(0), Some(50));
        assert_eq!(
            hold_of(TOO_MANY, true, &both, CAP),
            Some((secs(5), HoldSource::RetryAfter))
        );
        let reset_only = headers(None, Some(3), Some(50));
        assert_eq!(
            hold_of(TOO_MANY, true, &reset_only, CAP),
            Some((secs(50), HoldSource::Reset))
        );
        assert_eq!(hold_of(TOO_MANY, true, &headers(None, Some(0), None), CAP), None);
    }

    #[test]
    fn other_responses_hold_only_when_the_quota_is_spent() {
        let ok = StatusCode::OK;
        assert_eq!(
            hold_of(ok, false, &headers(None, Some(0), Some(10)), CAP),
            Some((secs(10), HoldSource::Reset))
        );
        assert_eq!(hold_of(ok, false, &headers(None, Some(1), Some(10)), CAP), None);
        // Retry-After means nothing on a 200 or on a status the scope does
        // not back off on.
        assert_eq!(hold_of(ok, false, &headers(Some(30), None, None), CAP), None);
        assert_eq!(
            hold_of(TOO_MANY, false, &headers(Some(30), None, None), CAP),
            None
        );
        let forbidden = StatusCode::FORBIDDEN;
        assert_eq!(
            hold_of(forbidden, false, &headers(None, Some(0), Some(20)), CAP),
            Some((secs(20), HoldSource::Reset))
        );
    }

    #[test]
    fn redirects_hold_for_retry_after_up_to_the_cap() {
        let found = StatusCode::FOUND;
        let short = headers(Some(3), None, None);
        assert_eq!(
            hold_of(found, false, &short, CAP),
            Some((secs(3), HoldSource::RetryAfter))
        );
        let long = headers(Some(60), Some(0), Some(90));
        assert_eq!(
            hold_of(found, false, &long, CAP),
            Some((CAP, HoldSource::RetryAfter))
        );
        assert_eq!(hold_of(found, false, &long, Duration::ZERO), None);
        assert_eq!(
            hold_of(found, true, &long, CAP),
            Some((CAP, HoldSource::RetryAfter)),
            "a 3xx the scope backs off on is still capped as a redirect"
        );
        // Without Retry-After a spent quota still holds a redirect's scope.
        let spent = headers(None, Some(0), Some(90));
        assert_eq!(
            hold_of(found, false, &spent, CAP),
            Some((secs(90), HoldSource::Reset))
        );
    }

    #[test]
    fn pacing_spreads_the_remaining_quota_until_the_reset() {
        assert_eq!(
            pacing_of(&headers(None, Some(4), Some(20))),
            Some((secs(5), secs(20)))
        );
        assert_eq!(
            pacing_of(&headers(None, Some(3), Some(1))),
            Some((secs(1) / 3, secs(1)))
        );
        assert_eq!(
            pacing_of(&headers(None, Some(u64::MAX), Some(20))).map(|(_, span)| span),
            Some(secs(20))
        );
        // The hold covers a spent quota; an unknown remaining or reset gives
        // nothing to spread.
        assert_eq!(pacing_of(&headers(None, Some(0), Some(20))), None);
        assert_eq!(pacing_of(&headers(None, Some(4), None)), None);
        assert_eq!(pacing_of(&headers(None, None, Some(20))), None);
    }

    #[test]
    fn pacing_falls_back_to_the_strictest_policy() {
        let mut announced = headers(None, None, None);
        announced.policies = vec![
            policy(Some(10), Some(1)),
            policy(Some(100), Some(1000)),
            policy(Some(0), Some(60)),
            policy(None, Some(60)),
        ];
        assert_eq!(pacing_of(&announced), Some((secs(10), secs(1000))));
        announced.remaining = Some(4);
        announced.reset = Some(secs(20));
        assert_eq!(pacing_of(&announced), Some((secs(5), secs(20))), "r and t win");
    }

    #[test]
    fn announced_limits_are_recorded_only_when_announced() {
        let now = Instant::now();
        assert_eq!(announced_limits(&headers(Some(5), None, None), now), None);
        let mut announced = headers(None, Some(7), Some(30));
        announced.policies = vec![policy(Some(100), Some(60))];
        assert_eq!(
            announced_limits(&announced, now),
            Some(AnnouncedLimits::new(
                Some(100),
                Some(secs(60)),
                Some(7),
                Some(now + secs(30))
            ))
        );
        announced.policies = vec![policy(Some(0), None)];
        let limits = announced_limits(&announced, now).unwrap();
        assert_eq!((limits.quota, limits.window), (Some(0), None));
    }
}
