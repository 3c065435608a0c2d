//! Parsers for the response headers through which servers ask a client to slow down.
//!
//! Covered: `Retry-After` (RFC 9110 §10.2.3), the IETF `RateLimit` and
//! `RateLimit-Policy` structured fields (draft-ietf-httpapi-ratelimit-headers,
//! RFC 8941 List syntax), the older `RateLimit-Reset` / `RateLimit-Remaining`
//! delta headers, and the de-facto `X-RateLimit-*` / `X-Rate-Limit-*` family.
//!
//! Every function here is pure: the current time is an argument, nothing is
//! read from the clock, nothing panics, and the only allocations are bounded by
//! [`MAX_HEADER_VALUE_LEN`]. A value that is malformed in any way is reported as
//! `None` rather than guessed at, because a misread header either hammers a
//! struggling server or stalls the client for no reason.
//!
//! Two conventions hold for all parsers:
//!
//! * Optional whitespace (SP / HTAB) around the whole value is ignored, as HTTP
//!   parsers strip it anyway (RFC 9110 §5.5) and a hand-built
//!   [`http::HeaderValue`] may still carry it.
//! * A wait of zero is never returned by the wait parsers or by the holds of
//!   [`RateLimitHeaders`]: it asks for no hold at all, so it is reported the
//!   same way as "no usable value". Only the raw structured-field items keep a
//!   `t=0` or `w=0` exactly as sent.

use std::borrow::Cow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::HeaderMap;

/// Upper bound on the length of any header value we try to parse (bytes); longer values are "no value".
///
/// Legitimate rate-limit headers are a few dozen bytes; the cap keeps the work
/// and the allocations done for a hostile value small and predictable.
pub(crate) const MAX_HEADER_VALUE_LEN: usize = 256;

/// Values of `X-RateLimit-Reset` at or above this many seconds (2001-09-09) are
/// read as Unix timestamps even when they lie in the past: no server announces
/// a 31-year delta, so such a value is a stale epoch, not a request to wait.
const PAST_EPOCH_THRESHOLD: u64 = 1_000_000_000;

const RETRY_AFTER: &str = "retry-after";
const RATELIMIT: &str = "ratelimit";
const RATELIMIT_POLICY: &str = "ratelimit-policy";
const RATELIMIT_RESET: &str = "ratelimit-reset";
const RATELIMIT_REMAINING: &str = "ratelimit-remaining";
const X_RESET: [&str; 2] = ["x-ratelimit-reset", "x-rate-limit-reset"];
const X_REMAINING: [&str; 2] = ["x-ratelimit-remaining", "x-rate-limit-remaining"];

/// Every header [`RateLimitHeaders::from_headers`] reads, lower-case (for
/// the tests and the fuzz targets).
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) const HEADER_NAMES: [&str; 9] = [
    RETRY_AFTER,
    RATELIMIT,
    RATELIMIT_POLICY,
    RATELIMIT_RESET,
    RATELIMIT_REMAINING,
    X_RESET[0],
    X_RESET[1],
    X_REMAINING[0],
    X_REMAINING[1],
];

/// Parses a `Retry-After` value (RFC 9110 §10.2.3) into the wait it asks for, relative to `now`.
///
/// Two forms are accepted, each with optional surrounding whitespace:
///
/// * delay-seconds: one or more ASCII digits, giving `Some(Duration::from_secs(n))`;
/// * an HTTP-date in any of the three forms of RFC 9110 §5.6.7 (IMF-fixdate,
///   obsolete RFC 850, asctime), giving the time from `now` until that date,
///   rounded up to whole seconds so a client never retries early.
///
/// Returns `None` when the value is malformed or asks for no wait: `0`, a date
/// not after `now`, signs (`-5`, `+5`), fractions (`1.5`), exponents (`1e3`),
/// hex, words such as `nan`, non-ASCII digits (`²`, `٣`), an empty or
/// whitespace-only value, any byte that is not visible ASCII or a space, a date
/// with a zone other than `GMT` (or none), a digit string that overflows `u64`
/// (a hold that long is a broken header, not a real request), and any value
/// longer than [`MAX_HEADER_VALUE_LEN`] bytes.
#[must_use]
pub(crate) fn parse_retry_after(value: &[u8], now: SystemTime) -> Option<Duration> {
    if value.len() > MAX_HEADER_VALUE_LEN {
        return None;
    }
    let value = trim_ows(value);
    if !value.is_empty() && value.iter().all(u8::is_ascii_digit) {
        return parse_digits(value)
            .filter(|&secs| secs > 0)
            .map(Duration::from_secs);
    }
    // httpdate trims Unicode whitespace and tolerates control characters in
    // places; rejecting them here keeps the accepted grammar to RFC 9110's.
    if !value.iter().all(|&b| b == b' ' || b.is_ascii_graphic()) {
        return None;
    }
    let date = httpdate::parse_http_date(std::str::from_utf8(value).ok()?).ok()?;
    let wait = date.duration_since(now).ok()?;
    (!wait.is_zero()).then(|| ceil_to_secs(wait))
}

/// Parses a delta-seconds value such as `RateLimit-Reset` (draft-polli-ratelimit-headers) into a wait.
///
/// The value must be one or more ASCII digits, optionally surrounded by
/// whitespace. Returns `Some(Duration::from_secs(n))` for a positive `n`.
///
/// Returns `None` for anything else: signs, fractions, non-ASCII digits, an
/// empty value, overflow of `u64`, values longer than [`MAX_HEADER_VALUE_LEN`],
/// and also for `0`: a reset "now" asks for no hold, so it is reported like an
/// absent header instead of as `Some(Duration::ZERO)`.
#[must_use]
pub(crate) fn parse_delta_seconds(value: &[u8]) -> Option<Duration> {
    parse_digits(value)
        .filter(|&secs| secs > 0)
        .map(Duration::from_secs)
}

/// One item of the IETF `RateLimit` field: `"default";r=0;t=10`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RateLimitItem {
    /// The policy the item reports on: the sf-string (unescaped) or token naming it.
    pub(crate) policy: String,
    /// The `r` parameter: quota units left, or `None` when absent or not an integer.
    pub(crate) remaining: Option<u64>,
    /// The `t` parameter: seconds until the quota resets, or `None` when absent
    /// or not an integer. `t=0` is kept as `Some(Duration::ZERO)` here; the
    /// aggregate in [`RateLimitHeaders`] treats it as unknown.
    pub(crate) reset: Option<Duration>,
}

/// Parses the `RateLimit` field (draft-ietf-httpapi-ratelimit-headers) into its items, in order.
///
/// The value is an RFC 8941 List: members separated by commas with optional
/// whitespace, each an sf-string or token naming the policy, followed by
/// `;key[=value]` parameters. `r` (remaining) and `t` (reset seconds) are read;
/// any other parameter is ignored. A parameter value of another RFC 8941 type
/// (decimal, string, token, byte sequence, boolean, or a bare key meaning
/// `true`) is legal syntax and leaves that field of the item `None`. When a
/// parameter is repeated, the last occurrence wins, as RFC 8941 specifies.
///
/// Returns `None` for the whole field when anything is malformed, because
/// RFC 8941 has a malformed field ignored whole rather than partially trusted:
/// any RFC 8941 syntax error (unterminated string, `;r=` without value,
/// trailing or doubled comma, upper-case parameter key, integer over 15 digits,
/// decimal with more than 3 fraction digits, non-ASCII byte, ...), a member
/// that is not a string or token (an integer, or an inner list), a negative
/// `r` or `t` (the draft requires non-negative integers), an empty value, and
/// any value longer than [`MAX_HEADER_VALUE_LEN`] bytes.
#[must_use]
pub(crate) fn parse_ratelimit(value: &[u8]) -> Option<Vec<RateLimitItem>> {
    parse_list(value, [b"r", b"t"])?
        .into_iter()
        .map(|(policy, [r, t])| {
            Some(RateLimitItem {
                policy,
                remaining: non_negative(r)?,
                reset: non_negative(t)?.map(Duration::from_secs),
            })
        })
        .collect()
}

/// One item of the IETF `RateLimit-Policy` field: `"default";q=100;w=60`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RateLimitPolicyItem {
    /// The policy's name: the sf-string (unescaped) or token of the item.
    pub(crate) policy: String,
    /// The `q` parameter: quota units per window, or `None` when absent or not an integer.
    pub(crate) quota: Option<u64>,
    /// The `w` parameter: the window length in seconds, or `None` when absent or not an integer.
    pub(crate) window: Option<Duration>,
}

/// Parses the `RateLimit-Policy` field into its items, in order.
///
/// Syntax and error handling are exactly those of [`parse_ratelimit`], with
/// the parameters `q` (quota units) and `w` (window seconds) read instead of
/// `r` and `t`. Returns `None` for the whole field on any syntax error, a
/// member that is not a string or token, a negative `q` or `w`, an empty
/// value, or a value longer than [`MAX_HEADER_VALUE_LEN`] bytes.
#[must_use]
pub(crate) fn parse_ratelimit_policy(value: &[u8]) -> Option<Vec<RateLimitPolicyItem>> {
    parse_list(value, [b"q", b"w"])?
        .into_iter()
        .map(|(policy, [q, w])| {
            Some(RateLimitPolicyItem {
                policy,
                quota: non_negative(q)?,
                window: non_negative(w)?.map(Duration::from_secs),
            })
        })
        .collect()
}

/// Parses `X-RateLimit-Reset` / `X-Rate-Limit-Reset` into the wait until the quota resets.
///
/// The value must be ASCII digits (optional surrounding whitespace). Servers
/// disagree on its meaning: GitHub and others send Unix epoch seconds, others
/// a delta in seconds. The rule used to tell them apart, in order:
///
/// 1. If the number, read as Unix epoch seconds, is after `now`, it is an
///    epoch: the result is the time from `now` until then, rounded up to whole
///    seconds.
/// 2. Otherwise, if it is at least 1 000 000 000 (2001-09-09), it is an epoch in
///    the past (a stale header, or clock skew): `None`, never a multi-decade delta.
/// 3. Otherwise it is a delta: `Some(Duration::from_secs(n))`.
///
/// Also `None` for `0`, for anything but digits, for `u64` overflow, for an
/// empty value, and for values longer than [`MAX_HEADER_VALUE_LEN`] bytes.
#[must_use]
pub(crate) fn parse_x_ratelimit_reset(value: &[u8], now: SystemTime) -> Option<Duration> {
    let n = parse_digits(value).filter(|&n| n > 0)?;
    let at = Duration::from_secs(n);
    // Durations rather than `SystemTime`, whose range is platform-dependent:
    // a far-future epoch must be read the same way everywhere.
    let until_epoch = match now.duration_since(UNIX_EPOCH) {
        Ok(elapsed) => at.checked_sub(elapsed),
        // A clock before 1970 is broken, but the arithmetic still holds.
        Err(before) => at.checked_add(before.duration()),
    }
    .filter(|wait| !wait.is_zero());
    match until_epoch {
        Some(wait) => Some(ceil_to_secs(wait)),
        None if n >= PAST_EPOCH_THRESHOLD => None,
        None => Some(Duration::from_secs(n)),
    }
}

/// Parses `X-RateLimit-Remaining` / `X-Rate-Limit-Remaining` (or `RateLimit-Remaining`) into a count.
///
/// The value must be one or more ASCII digits, optionally surrounded by
/// whitespace; `0` is a valid count. Returns `None` for signs, fractions,
/// non-ASCII digits, an empty value, `u64` overflow, and values longer than
/// [`MAX_HEADER_VALUE_LEN`] bytes.
#[must_use]
pub(crate) fn parse_remaining(value: &[u8]) -> Option<u64> {
    parse_digits(value)
}

/// Everything a response's headers say about rate limits, each already validated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RateLimitHeaders {
    /// From `Retry-After`.
    pub(crate) retry_after: Option<Duration>,
    /// Remaining quota: the smallest `r` of the `RateLimit` items, else
    /// `RateLimit-Remaining`, else `X-RateLimit-Remaining` / `X-Rate-Limit-Remaining`.
    pub(crate) remaining: Option<u64>,
    /// When the quota resets: for `RateLimit`, the `t` of the item with the
    /// smallest `r` (ties: the largest `t`); else `RateLimit-Reset`; else
    /// `X-RateLimit-Reset` / `X-Rate-Limit-Reset`. Never `Some(Duration::ZERO)`.
    pub(crate) reset: Option<Duration>,
    /// Policies announced by `RateLimit-Policy` (empty when absent or malformed).
    pub(crate) policies: Vec<RateLimitPolicyItem>,
}

impl RateLimitHeaders {
    /// Reads all the rate-limit headers of a response into one validated summary.
    ///
    /// Header names are matched case-insensitively (as `http` stores them
    /// lower-case). When a header appears on several field lines:
    ///
    /// * `Retry-After`, `RateLimit-Reset`, `RateLimit-Remaining` and the
    ///   `X-RateLimit-*` / `X-Rate-Limit-*` headers use the first line that
    ///   parses; malformed lines are skipped (`X-RateLimit-*` lines are tried
    ///   before `X-Rate-Limit-*` lines).
    /// * `RateLimit` and `RateLimit-Policy` are structured fields: their lines
    ///   are joined with `", "` before parsing, as RFC 8941 requires, so one bad
    ///   line voids the whole field, and so does a joined value longer than
    ///   [`MAX_HEADER_VALUE_LEN`].
    ///
    /// In the `RateLimit` field only items with an `r` are considered; a
    /// `t=0` there counts as "reset unknown" and lets the fallback headers
    /// supply the reset.
    #[must_use]
    pub(crate) fn from_headers(headers: &HeaderMap, now: SystemTime) -> Self {
        let retry_after = first_valid(headers, &[RETRY_AFTER], |v| parse_retry_after(v, now));

        let items = combined_field(headers, RATELIMIT)
            .and_then(|v| parse_ratelimit(&v))
            .unwrap_or_default();
        let policies = combined_field(headers, RATELIMIT_POLICY)
            .and_then(|v| parse_ratelimit_policy(&v))
            .unwrap_or_default();

        // The tightest policy is the one that runs out first; among equally
        // tight ones the longest reset is the one that actually binds.
        let tightest = items
            .iter()
            .filter_map(|item| Some((item.remaining?, item.reset)))
            .min_by(|a, b| a.0.cmp(&b.0).then_with(|| b.1.cmp(&a.1)));

        let remaining = tightest.map(|(r, _)| r).or_else(|| {
            first_valid(headers, &[RATELIMIT_REMAINING], parse_remaining)
                .or_else(|| first_valid(headers, &X_REMAINING, parse_remaining))
        });
        let reset = tightest
            .and_then(|(_, t)| t)
            .filter(|t| !t.is_zero())
            .or_else(|| first_valid(headers, &[RATELIMIT_RESET], parse_delta_seconds))
            .or_else(|| first_valid(headers, &X_RESET, |v| parse_x_ratelimit_reset(v, now)));

        Self {
            retry_after,
            remaining,
            reset,
            policies,
        }
    }

    /// The hold a *backoff* response (429, 503) asks for.
    ///
    /// Returns `retry_after` if present, since the IETF draft gives
    /// `Retry-After` precedence over the rate-limit fields, else `reset`; `None`
    /// when neither is known.
    #[must_use]
    pub(crate) fn backoff_hold(&self) -> Option<Duration> {
        self.retry_after.or(self.reset)
    }

    /// The hold a successful response asks for proactively.
    ///
    /// Returns `Some(reset)` when the quota is spent (`remaining == Some(0)`)
    /// and a reset is known; `None` otherwise, including when some quota is
    /// left or the remaining count is unknown.
    #[must_use]
    pub(crate) fn exhausted_hold(&self) -> Option<Duration> {
        match self.remaining {
            Some(0) => self.reset,
            _ => None,
        }
    }
}

fn is_ows(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

// `<[u8]>::trim_ascii` would also strip CR, LF and FF, which are not OWS and
// must make a value malformed.
fn trim_ows(value: &[u8]) -> &[u8] {
    let start = value.iter().position(|&b| !is_ows(b)).unwrap_or(value.len());
    let end = value.iter().rposition(|&b| !is_ows(b)).map_or(start, |i| i + 1);
    value.get(start..end).unwrap_or_default()
}

/// 1*DIGIT with optional OWS around it; checked arithmetic so that overflow is
/// an error instead of a wrapped or saturated value.
fn parse_digits(value: &[u8]) -> Option<u64> {
    if value.len() > MAX_HEADER_VALUE_LEN {
        return None;
    }
    let digits = trim_ows(value);
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |acc, &b| {
        if !b.is_ascii_digit() {
            return None;
        }
        acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

// Rounding down would let a client come back a fraction of a second before
// the server said it may.
fn ceil_to_secs(wait: Duration) -> Duration {
    if wait.subsec_nanos() == 0 {
        wait
    } else {
        Duration::from_secs(wait.as_secs().saturating_add(1))
    }
}

fn non_negative(param: Option<BareItem>) -> Option<Option<u64>> {
    match param {
        // A negative integer is the right type with an impossible value: the
        // field is broken, not merely using an extension type.
        Some(BareItem::Integer(n)) => u64::try_from(n).ok().map(Some),
        _ => Some(None),
    }
}

fn first_valid<T>(headers: &HeaderMap, names: &[&str], parse: impl Fn(&[u8]) -> Option<T>) -> Option<T> {
    names
        .iter()
        .flat_map(|name| headers.get_all(*name))
        .find_map(|value| parse(value.as_bytes()))
}

/// Joins a structured field's lines with ", " (RFC 8941 §4.2), borrowing when
/// there is a single line and giving up as soon as the result would exceed
/// [`MAX_HEADER_VALUE_LEN`], so that many hostile lines cost no more than one.
fn combined_field<'h>(headers: &'h HeaderMap, name: &str) -> Option<Cow<'h, [u8]>> {
    let mut lines = headers.get_all(name).into_iter();
    let first = lines.next()?.as_bytes();
    if first.len() > MAX_HEADER_VALUE_LEN {
        return None;
    }
    let mut combined = Cow::Borrowed(first);
    for line in lines {
        let line = line.as_bytes();
        if combined.len().saturating_add(2).saturating_add(line.len()) > MAX_HEADER_VALUE_LEN {
            return None;
        }
        let buf = combined.to_mut();
        buf.extend_from_slice(b", ");
        buf.extend_from_slice(line);
    }
    Some(combined)
}

/// The RFC 8941 bare item, reduced to what these fields need.
#[derive(Debug)]
enum BareItem {
    Integer(i64),
    /// An sf-string (unescaped) or an sf-token.
    Text(String),
    /// Decimal, byte sequence or boolean: valid syntax, never a usable value here.
    Other,
}

/// A member's name and the values of the two parameters asked for.
type Member = (String, [Option<BareItem>; 2]);

/// Parses an RFC 8941 List whose members must be Items naming a policy.
fn parse_list(value: &[u8], keys: [&[u8]; 2]) -> Option<Vec<Member>> {
    if value.len() > MAX_HEADER_VALUE_LEN {
        return None;
    }
    let mut cursor = Cursor {
        input: trim_ows(value),
        pos: 0,
    };
    // RFC 8941 would read an empty value as an empty List, but for these
    // fields that carries no information, so it is reported like an absent field.
    if cursor.at_end() {
        return None;
    }
    let mut members = Vec::new();
    loop {
        members.push(cursor.member(keys)?);
        cursor.skip_ows();
        if cursor.at_end() {
            return Some(members);
        }
        if !cursor.eat(b',') {
            return None;
        }
        cursor.skip_ows();
        if cursor.at_end() {
            return None;
        }
    }
}

/// A read position in a field value; every method stops at the end of input
/// instead of indexing past it.
#[derive(Debug)]
struct Cursor<'a> {
    input: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<u8> {
        self.input.get(self.pos).copied()
    }

    fn bump(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.pos += 1;
        Some(b)
    }

    fn eat(&mut self, want: u8) -> bool {
        let hit = self.peek() == Some(want);
        if hit {
            self.pos += 1;
        }
        hit
    }

    fn at_end(&self) -> bool {
        self.pos >= self.input.len()
    }

    fn skip_while(&mut self, pred: impl Fn(u8) -> bool) {
        while self.peek().is_some_and(&pred) {
            self.pos += 1;
        }
    }

    fn skip_ows(&mut self) {
        self.skip_while(is_ows);
    }

    fn taken_since(&self, start: usize) -> &'a [u8] {
        self.input.get(start..self.pos).unwrap_or_default()
    }

    /// sf-item whose bare item is a string or token, then its parameters.
    fn member(&mut self, keys: [&[u8]; 2]) -> Option<Member> {
        let BareItem::Text(name) = self.bare_item()? else {
            return None;
        };
        let mut found = [None, None];
        while self.eat(b';') {
            self.skip_while(|b| b == b' ');
            let key = self.key()?;
            // A bare key is boolean true, which is never a usable integer.
            let value = if self.eat(b'=') {
                self.bare_item()?
            } else {
                BareItem::Other
            };
            if let Some(slot) = keys.iter().position(|k| *k == key).and_then(|i| found.get_mut(i)) {
                *slot = Some(value);
            }
        }
        Some((name, found))
    }

    fn key(&mut self) -> Option<&'a [u8]> {
        let start = self.pos;
        if !matches!(self.peek()?, b'a'..=b'z' | b'*') {
            return None;
        }
        self.skip_while(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' | b'*'));
        Some(self.taken_since(start))
    }

    fn bare_item(&mut self) -> Option<BareItem> {
        match self.peek()? {
            b'-' | b'0'..=b'9' => self.number(),
            b'"' => self.string().map(BareItem::Text),
            b'*' | b'a'..=b'z' | b'A'..=b'Z' => Some(BareItem::Text(self.token())),
            b':' => self.byte_sequence(),
            b'?' => {
                self.pos += 1;
                matches!(self.bump()?, b'0' | b'1').then_some(BareItem::Other)
            }
            _ => None,
        }
    }

    /// sf-integer (`-`? 1–15 digits) or sf-decimal (`-`? 1–12 digits `.` 1–3 digits).
    fn number(&mut self) -> Option<BareItem> {
        let negative = self.eat(b'-');
        let start = self.pos;
        self.skip_while(|b| b.is_ascii_digit());
        let int_digits = self.taken_since(start);
        if int_digits.is_empty() {
            return None;
        }
        if self.eat(b'.') {
            if int_digits.len() > 12 {
                return None;
            }
            let frac_start = self.pos;
            self.skip_while(|b| b.is_ascii_digit());
            let frac_len = self.taken_since(frac_start).len();
            return (1..=3).contains(&frac_len).then_some(BareItem::Other);
        }
        if int_digits.len() > 15 {
            return None;
        }
        let magnitude = int_digits.iter().try_fold(0i64, |acc, &b| {
            acc.checked_mul(10)?.checked_add(i64::from(b - b'0'))
        })?;
        Some(BareItem::Integer(if negative { -magnitude } else { magnitude }))
    }

    fn string(&mut self) -> Option<String> {
        self.bump(); // the opening DQUOTE, checked by the caller
        let mut out = String::new();
        loop {
            match self.bump()? {
                b'\\' => match self.bump()? {
                    c @ (b'"' | b'\\') => out.push(char::from(c)),
                    _ => return None,
                },
                b'"' => return Some(out),
                c @ 0x20..=0x7e => out.push(char::from(c)),
                _ => return None,
            }
        }
    }

    fn token(&mut self) -> String {
        let start = self.pos;
        self.pos += 1; // ALPHA or "*", checked by the caller
        self.skip_while(|b| is_tchar(b) || b == b':' || b == b'/');
        self.taken_since(start).iter().map(|&b| char::from(b)).collect()
    }

    /// `:` base64 `:`. Only validated, never decoded: no parameter read here
    /// can use bytes, but an undecodable sequence still voids the field.
    fn byte_sequence(&mut self) -> Option<BareItem> {
        self.pos += 1; // the opening ':', checked by the caller
        let start = self.pos;
        self.skip_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='));
        let body = self.taken_since(start);
        if !self.eat(b':') {
            return None;
        }
        let data_len = body.iter().position(|&b| b == b'=').unwrap_or(body.len());
        let padding = body.len() - data_len;
        let padding_ok = body.iter().skip(data_len).all(|&b| b == b'=')
            && padding <= 2
            && (padding == 0 || body.len().is_multiple_of(4));
        // A lone sextet in the last group cannot encode a whole byte.
        (padding_ok && data_len % 4 != 1).then_some(BareItem::Other)
    }
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderName, HeaderValue};
    use proptest::prelude::*;

    /// One table row: a label for failure messages, the raw value, the expected result.
    type Row<'a, T> = (&'a str, &'a [u8], T);

    /// A `from_headers` row: label, header lines, expected backoff and exhausted holds.
    type HeaderRow<'a> = (
        &'a str,
        Vec<(&'a str, &'a [u8])>,
        Option<Duration>,
        Option<Duration>,
    );

    const NOW_SECS: u64 = 1_700_000_000; // Tue, 14 Nov 2023 22:13:20 GMT

    fn now() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(NOW_SECS)
    }

    fn secs(n: u64) -> Option<Duration> {
        Some(Duration::from_secs(n))
    }

    fn rl(policy: &str, remaining: Option<u64>, reset: Option<u64>) -> RateLimitItem {
        RateLimitItem {
            policy: policy.to_owned(),
            remaining,
            reset: reset.map(Duration::from_secs),
        }
    }

    fn pol(policy: &str, quota: Option<u64>, window: Option<u64>) -> RateLimitPolicyItem {
        RateLimitPolicyItem {
            policy: policy.to_owned(),
            quota,
            window: window.map(Duration::from_secs),
        }
    }

    fn map(headers: &[(&str, &[u8])]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_bytes(value).unwrap(),
            );
        }
        map
    }

    #[test]
    fn retry_after_table() {
        let ten_kb = "9".repeat(10_000);
        let padded_256 = format!("{}5", "0".repeat(255));
        let padded_257 = format!("{}5", "0".repeat(256));
        let rows: &[Row<'_, Option<Duration>>] = &[
            ("delay", b"7", secs(7)),
            ("delay with OWS", b"  7 ", secs(7)),
            ("delay with tabs", b"\t7\t", secs(7)),
            ("leading zeros", b"007", secs(7)),
            ("one day", b"86400", secs(86_400)),
            ("u64::MAX fits", b"18446744073709551615", secs(u64::MAX)),
            ("256 bytes is allowed", padded_256.as_bytes(), secs(5)),
            ("257 bytes is too long", padded_257.as_bytes(), None),
            ("IMF-fixdate +30s", b"Tue, 14 Nov 2023 22:13:50 GMT", secs(30)),
            (
                "IMF-fixdate with OWS",
                b" Tue, 14 Nov 2023 22:13:50 GMT ",
                secs(30),
            ),
            ("RFC 850 +30s", b"Tuesday, 14-Nov-23 22:13:50 GMT", secs(30)),
            ("asctime +30s", b"Tue Nov 14 22:13:50 2023", secs(30)),
            ("past date", b"Sun, 06 Nov 1994 08:49:37 GMT", None),
            ("date equal to now", b"Tue, 14 Nov 2023 22:13:20 GMT", None),
            ("date without zone", b"Sun, 06 Nov 1994 08:49:37", None),
            ("future date without zone", b"Tue, 14 Nov 2023 22:13:50", None),
            ("UTC instead of GMT", b"Tue, 14 Nov 2023 22:13:50 UTC", None),
            ("wrong weekday", b"Mon, 14 Nov 2023 22:13:50 GMT", None),
            ("tab inside date", b"Tue,\t14 Nov 2023 22:13:50 GMT", None),
            ("zero", b"0", None),
            ("many zeros", b"000", None),
            ("negative", b"-5", None),
            ("fraction", b"1.5", None),
            ("nan", b"nan", None),
            ("inf", b"inf", None),
            ("plus sign", b"+5", None),
            ("exponent", b"1e3", None),
            ("hex", b"0x10", None),
            ("superscript two", "²".as_bytes(), None),
            ("Arabic-Indic three", "٣".as_bytes(), None),
            ("empty", b"", None),
            ("space only", b" ", None),
            ("10 kB of digits", ten_kb.as_bytes(), None),
            ("20 digits overflow u64", b"99999999999999999999", None),
            ("invalid UTF-8", b"\xff\xfe", None),
            ("embedded NUL", b"1\x002", None),
            ("trailing NUL", b"7\x00", None),
            ("internal space", b"7 7", None),
            ("list of delays", b"7, 8", None),
            ("trailing CRLF", b"7\r\n", None),
            ("unit suffix", b"7s", None),
        ];
        for (label, input, expected) in rows {
            assert_eq!(
                parse_retry_after(input, now()),
                *expected,
                "Retry-After case {label:?}"
            );
        }
    }

    #[test]
    fn retry_after_rounds_partial_seconds_up() {
        let now = now() + Duration::from_millis(500);
        assert_eq!(parse_retry_after(b"Tue, 14 Nov 2023 22:13:50 GMT", now), secs(30));
        let just_before = UNIX_EPOCH + Duration::from_secs(NOW_SECS + 30) - Duration::from_nanos(1);
        assert_eq!(
            parse_retry_after(b"Tue, 14 Nov 2023 22:13:50 GMT", just_before),
            secs(1)
        );
    }

    #[test]
    fn delta_and_remaining_table() {
        let delta_rows: &[Row<'_, Option<Duration>>] = &[
            ("RateLimit-Reset: 12", b"12", secs(12)),
            ("with OWS", b" 12\t", secs(12)),
            ("zero is no hold", b"0", None),
            ("negative", b"-1", None),
            ("fraction", b"1.5", None),
            ("empty", b"", None),
            ("unit suffix", b"12s", None),
            ("overflow", b"99999999999999999999", None),
        ];
        for (label, input, expected) in delta_rows {
            assert_eq!(parse_delta_seconds(input), *expected, "delta case {label:?}");
        }
        let remaining_rows: &[Row<'_, Option<u64>>] = &[
            ("X-RateLimit-Remaining: 0", b"0", Some(0)),
            ("count", b"42", Some(42)),
            ("with OWS", b" 5 ", Some(5)),
            ("negative", b"-1", None),
            ("decimal", b"5.0", None),
            ("empty", b"", None),
            ("exponent", b"1e3", None),
            ("overflow", b"18446744073709551616", None),
        ];
        for (label, input, expected) in remaining_rows {
            assert_eq!(parse_remaining(input), *expected, "remaining case {label:?}");
        }
    }

    #[test]
    fn x_ratelimit_reset_table() {
        let rows: &[Row<'_, Option<Duration>>] = &[
            ("epoch an hour ahead", b"1700003600", secs(3600)),
            ("epoch a second ahead", b"1700000001", secs(1)),
            ("small delta", b"30", secs(30)),
            ("delta with OWS", b" 30 ", secs(30)),
            (
                "largest delta below the epoch threshold",
                b"999999999",
                secs(999_999_999),
            ),
            ("threshold itself is a past epoch", b"1000000000", None),
            ("epoch equal to now", b"1700000000", None),
            ("epoch a second ago", b"1699999999", None),
            ("zero", b"0", None),
            ("negative", b"-30", None),
            ("not a number", b"soon", None),
            ("overflow", b"99999999999999999999", None),
            (
                "epoch beyond SystemTime's range",
                b"10000000000000000000",
                secs(10_000_000_000_000_000_000 - NOW_SECS),
            ),
        ];
        for (label, input, expected) in rows {
            assert_eq!(
                parse_x_ratelimit_reset(input, now()),
                *expected,
                "X-RateLimit-Reset case {label:?}"
            );
        }
        // A fractional `now` must not shorten the wait below the announced epoch.
        let late = now() + Duration::from_millis(250);
        assert_eq!(parse_x_ratelimit_reset(b"1700003600", late), secs(3600));
    }

    #[test]
    fn ratelimit_table() {
        let too_long = format!("\"{}\";r=1", "a".repeat(MAX_HEADER_VALUE_LEN));
        let rows: Vec<Row<'_, Option<Vec<RateLimitItem>>>> = vec![
            (
                "single item",
                b"\"default\";r=0;t=10",
                Some(vec![rl("default", Some(0), Some(10))]),
            ),
            (
                "several quoted items",
                b"\"default\";r=0;t=10, \"burst\";r=5;t=1",
                Some(vec![
                    rl("default", Some(0), Some(10)),
                    rl("burst", Some(5), Some(1)),
                ]),
            ),
            (
                "token item name",
                b"default;r=3;t=4",
                Some(vec![rl("default", Some(3), Some(4))]),
            ),
            (
                "unknown params ignored",
                b"\"a\";foo=bar;r=1;x=\"y\";t=2;z=1.5;pk=:AQI=:;b=?0",
                Some(vec![rl("a", Some(1), Some(2))]),
            ),
            (
                "boolean param ignored",
                b"\"a\";r=1;flag;t=2",
                Some(vec![rl("a", Some(1), Some(2))]),
            ),
            (
                "bare r is boolean, not a count",
                b"\"a\";r;t=2",
                Some(vec![rl("a", None, Some(2))]),
            ),
            (
                "OWS around commas, SP after semicolons",
                b"\"a\"; r=1 ,\t\"b\";t=3",
                Some(vec![rl("a", Some(1), None), rl("b", None, Some(3))]),
            ),
            (
                "escapes in name",
                br#""a\"b\\c";r=1"#,
                Some(vec![rl("a\"b\\c", Some(1), None)]),
            ),
            (
                "repeated param: last wins",
                b"\"a\";r=1;r=2",
                Some(vec![rl("a", Some(2), None)]),
            ),
            (
                "t=1.5 is a valid decimal, so only t is dropped",
                b"\"a\";r=1;t=1.5",
                Some(vec![rl("a", Some(1), None)]),
            ),
            (
                "string value for r",
                b"\"a\";r=\"5\"",
                Some(vec![rl("a", None, None)]),
            ),
            (
                "15-digit integer",
                b"\"a\";r=999999999999999",
                Some(vec![rl("a", Some(999_999_999_999_999), None)]),
            ),
            ("unterminated quote", b"\"default;r=0", None),
            ("r= without value", b"\"a\";r=", None),
            ("trailing comma", b"\"a\";r=1,", None),
            ("negative r", b"\"a\";r=-1", None),
            ("16-digit integer", b"\"a\";r=1234567890123456", None),
            ("empty", b"", None),
            ("leading comma", b",\"a\";r=1", None),
            ("doubled comma", b"\"a\";r=1,,\"b\";r=2", None),
            ("upper-case key", b"\"a\";R=1", None),
            ("space before semicolon", b"\"a\" ;r=1", None),
            ("inner list", b"(\"a\" \"b\");r=1", None),
            ("integer item", b"5;r=1", None),
            ("old dictionary form", b"limit=100, remaining=50, reset=5", None),
            ("non-ASCII in name", "\"d\u{e9}faut\";r=1".as_bytes(), None),
            ("decimal with 4 fraction digits", b"\"a\";t=1.2345", None),
            ("decimal with no fraction", b"\"a\";t=1.", None),
            ("bad escape", br#""a\n";r=1"#, None),
            ("trailing garbage", b"\"a\";r=1;t=2 x", None),
            ("bad boolean", b"\"a\";b=?2", None),
            ("bad byte sequence", b"\"a\";b=:A:", None),
            ("too long", too_long.as_bytes(), None),
        ];
        for (label, input, expected) in &rows {
            assert_eq!(parse_ratelimit(input), *expected, "RateLimit case {label:?}");
        }
    }

    #[test]
    fn ratelimit_policy_table() {
        let rows: Vec<Row<'_, Option<Vec<RateLimitPolicyItem>>>> = vec![
            (
                "single policy",
                b"\"default\";q=100;w=60",
                Some(vec![pol("default", Some(100), Some(60))]),
            ),
            (
                "two policies",
                b"\"default\";q=100;w=60, \"daily\";q=1000;w=86400",
                Some(vec![
                    pol("default", Some(100), Some(60)),
                    pol("daily", Some(1000), Some(86_400)),
                ]),
            ),
            (
                "token name, no window",
                b"permin;q=10",
                Some(vec![pol("permin", Some(10), None)]),
            ),
            (
                "RateLimit params are unknown here",
                b"\"a\";r=1;t=2;q=3",
                Some(vec![pol("a", Some(3), None)]),
            ),
            (
                "decimal quota",
                b"\"a\";q=1.5;w=60",
                Some(vec![pol("a", None, Some(60))]),
            ),
            ("negative quota", b"\"a\";q=-1", None),
            ("w= without value", b"\"a\";w=", None),
            ("dangling semicolon", b"\"a\";q=1;", None),
            ("old integer-item form", b"100;w=60", None),
        ];
        for (label, input, expected) in &rows {
            assert_eq!(
                parse_ratelimit_policy(input),
                *expected,
                "RateLimit-Policy case {label:?}"
            );
        }
    }

    #[test]
    fn from_headers_table() {
        let epoch_in_2m = (NOW_SECS + 120).to_string();
        let rows: Vec<HeaderRow<'_>> = vec![
            ("no headers", vec![], None, None),
            (
                "Retry-After beats RateLimit for backoff",
                vec![("retry-after", b"7"), ("ratelimit", b"\"default\";r=0;t=10")],
                secs(7),
                secs(10),
            ),
            (
                "exhausted RateLimit",
                vec![("RateLimit", b"\"default\";r=0;t=10")],
                secs(10),
                secs(10),
            ),
            (
                "RateLimit with quota left",
                vec![("RateLimit", b"\"default\";r=5;t=10")],
                secs(10),
                None,
            ),
            (
                "GitHub style",
                vec![
                    ("x-ratelimit-remaining", b"0"),
                    ("x-ratelimit-reset", epoch_in_2m.as_bytes()),
                ],
                secs(120),
                secs(120),
            ),
            (
                "X-Rate-Limit-* variant",
                vec![("X-Rate-Limit-Remaining", b"0"), ("X-Rate-Limit-Reset", b"30")],
                secs(30),
                secs(30),
            ),
            (
                "RateLimit-Reset beats X-RateLimit-Reset",
                vec![
                    ("ratelimit-reset", b"12"),
                    ("x-ratelimit-reset", b"99"),
                    ("x-ratelimit-remaining", b"0"),
                ],
                secs(12),
                secs(12),
            ),
            (
                "draft-polli RateLimit-Remaining",
                vec![("ratelimit-remaining", b"0"), ("ratelimit-reset", b"12")],
                secs(12),
                secs(12),
            ),
            (
                "first valid Retry-After wins",
                vec![
                    ("retry-after", b"soon"),
                    ("retry-after", b"5"),
                    ("retry-after", b"9"),
                ],
                secs(5),
                None,
            ),
            (
                "RateLimit lines are combined",
                vec![("ratelimit", b"\"a\";r=3;t=5"), ("ratelimit", b"\"b\";r=0;t=20")],
                secs(20),
                secs(20),
            ),
            (
                "tie on r: largest t",
                vec![("ratelimit", b"\"a\";r=0;t=5, \"b\";r=0;t=20, \"c\";r=0")],
                secs(20),
                secs(20),
            ),
            (
                "one bad RateLimit line voids the field",
                vec![
                    ("ratelimit", b"\"a\";r=0;t=5"),
                    ("ratelimit", b"\"b\";r=-1"),
                    ("x-ratelimit-remaining", b"3"),
                    ("x-ratelimit-reset", b"40"),
                ],
                secs(40),
                None,
            ),
            (
                "RateLimit without t falls back for the reset",
                vec![("ratelimit", b"\"a\";r=0"), ("x-ratelimit-reset", b"45")],
                secs(45),
                secs(45),
            ),
            (
                "t=0 is not a hold",
                vec![("ratelimit", b"\"a\";r=0;t=0")],
                None,
                None,
            ),
            (
                "remaining unknown: no proactive hold",
                vec![("x-ratelimit-reset", b"30")],
                secs(30),
                None,
            ),
        ];
        for (label, headers, backoff, exhausted) in &rows {
            let parsed = RateLimitHeaders::from_headers(&map(headers), now());
            assert_eq!(parsed.backoff_hold(), *backoff, "backoff case {label:?}");
            assert_eq!(parsed.exhausted_hold(), *exhausted, "exhausted case {label:?}");
        }
    }

    #[test]
    fn from_headers_full_summary() {
        let headers = map(&[
            ("Retry-After", b"Tue, 14 Nov 2023 22:13:50 GMT"),
            ("RateLimit", b"\"default\";r=50;t=30, \"burst\";r=2;t=1"),
            ("RateLimit-Policy", b"\"default\";q=100;w=60"),
            ("RateLimit-Policy", b"\"burst\";q=10;w=1"),
            ("X-RateLimit-Remaining", b"0"),
        ]);
        assert_eq!(
            RateLimitHeaders::from_headers(&headers, now()),
            RateLimitHeaders {
                retry_after: secs(30),
                remaining: Some(2),
                reset: secs(1),
                policies: vec![
                    pol("default", Some(100), Some(60)),
                    pol("burst", Some(10), Some(1)),
                ],
            }
        );
    }

    #[test]
    fn combined_structured_field_is_length_capped() {
        let line = format!("\"{}\";r=1", "a".repeat(100));
        let headers = map(&[
            ("ratelimit", line.as_bytes()),
            ("ratelimit", line.as_bytes()),
            ("ratelimit", line.as_bytes()),
        ]);
        assert_eq!(RateLimitHeaders::from_headers(&headers, now()).remaining, None);
        let headers = map(&[("ratelimit", line.as_bytes()), ("ratelimit", line.as_bytes())]);
        assert_eq!(RateLimitHeaders::from_headers(&headers, now()).remaining, Some(1));
    }

    // ---- property tests -------------------------------------------------

    /// Every header read, and one that is not.
    fn all_headers() -> impl Iterator<Item = &'static str> {
        HEADER_NAMES.into_iter().chain(["x-unrelated"])
    }

    /// Independent oracle for the digit forms, built on `str::parse`.
    fn oracle_digits(bytes: &[u8]) -> Option<u64> {
        if bytes.len() > MAX_HEADER_VALUE_LEN {
            return None;
        }
        let s = std::str::from_utf8(bytes).ok()?.trim_matches([' ', '\t']);
        // `str::parse` accepts a leading '+', the header grammar does not.
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    }

    fn check_every_parser(bytes: &[u8], now_secs: u64) {
        let now = UNIX_EPOCH + Duration::from_secs(now_secs);
        let digits = oracle_digits(bytes);
        let positive = digits.filter(|&n| n > 0);

        let retry = parse_retry_after(bytes, now);
        assert_ne!(retry, Some(Duration::ZERO));
        match digits {
            Some(_) => assert_eq!(retry, positive.map(Duration::from_secs)),
            // Only an HTTP-date remains, and httpdate stops at 9999-12-31.
            None => {
                if let Some(wait) = retry {
                    assert!(wait.as_secs() <= 253_402_300_800 - now_secs);
                    assert!(bytes.len() <= MAX_HEADER_VALUE_LEN);
                }
            }
        }

        assert_eq!(parse_delta_seconds(bytes), positive.map(Duration::from_secs));
        assert_eq!(parse_remaining(bytes), digits);

        let expected_reset = positive.and_then(|n| {
            if n > now_secs {
                Some(n - now_secs)
            } else if n >= PAST_EPOCH_THRESHOLD {
                None
            } else {
                Some(n)
            }
        });
        assert_eq!(
            parse_x_ratelimit_reset(bytes, now),
            expected_reset.map(Duration::from_secs)
        );

        if let Some(items) = parse_ratelimit(bytes) {
            assert!(!items.is_empty() && bytes.len() <= MAX_HEADER_VALUE_LEN);
        }
        if let Some(items) = parse_ratelimit_policy(bytes) {
            assert!(!items.is_empty() && bytes.len() <= MAX_HEADER_VALUE_LEN);
        }

        let Ok(value) = HeaderValue::from_bytes(bytes) else {
            return;
        };
        for copies in 1..=2 {
            let mut headers = HeaderMap::new();
            for name in all_headers() {
                for _ in 0..copies {
                    headers.append(name, value.clone());
                }
            }
            let parsed = RateLimitHeaders::from_headers(&headers, now);
            assert_eq!(parsed.retry_after, retry);
            assert_ne!(parsed.reset, Some(Duration::ZERO));
            assert_ne!(parsed.backoff_hold(), Some(Duration::ZERO));
            assert_eq!(parsed.backoff_hold(), parsed.retry_after.or(parsed.reset));
            if let Some(n) = digits {
                // A bare number is not a valid RateLimit member, so every
                // value comes from the delta headers and must be exactly n.
                assert_eq!(parsed.remaining, Some(n));
                assert_eq!(parsed.reset, positive.map(Duration::from_secs));
                assert!(parsed.policies.is_empty());
            }
            if parsed.exhausted_hold().is_some() {
                assert_eq!(parsed.remaining, Some(0));
                assert_eq!(parsed.exhausted_hold(), parsed.reset);
            }
        }
    }

    /// Strings drawn from the characters that matter to these grammars, so
    /// that the parsers' deeper branches are reached far more often than with
    /// uniformly random bytes.
    fn grammar_string() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            prop::sample::select(vec![
                "\"", ";", "=", ",", " ", "\t", "-", ".", "?", ":", "\\", "(", ")", "*", "r", "t", "q", "w",
                "GMT", "Tue, ", " Nov ", "+", "/", "0", "1",
            ])
            .prop_map(str::to_owned),
            "[0-9]{1,21}",
            "[a-zA-Z]{1,4}",
        ];
        prop::collection::vec(piece, 0..40).prop_map(|pieces| pieces.concat())
    }

    fn sf_integer() -> impl Strategy<Value = u64> {
        0u64..=999_999_999_999_999
    }

    /// A policy name and how it is serialized (quoted string or token).
    fn policy_name() -> impl Strategy<Value = (String, String)> {
        prop_oneof![
            "[ -~]{0,10}".prop_map(|name| {
                let escaped = name.replace('\\', "\\\\").replace('"', "\\\"");
                (name, format!("\"{escaped}\""))
            }),
            "[a-zA-Z*][a-zA-Z0-9:/!#$%&'*+.^_`|~-]{0,10}".prop_map(|name| (name.clone(), name)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        #[test]
        fn arbitrary_bytes_never_panic(
            bytes in prop::collection::vec(any::<u8>(), 0..400),
            now_secs in 0u64..4_000_000_000,
        ) {
            check_every_parser(&bytes, now_secs);
        }

        #[test]
        fn arbitrary_strings_never_panic(s in any::<String>()) {
            check_every_parser(s.as_bytes(), NOW_SECS);
        }

        #[test]
        fn grammar_strings_never_panic(s in grammar_string()) {
            check_every_parser(s.as_bytes(), NOW_SECS);
        }

        #[test]
        fn digit_forms_read_exactly(
            n in any::<u64>(),
            zeros in 0usize..5,
            lead in "[ \t]{0,3}",
            trail in "[ \t]{0,3}",
        ) {
            let value = format!("{lead}{}{n}{trail}", "0".repeat(zeros));
            let expected = (n > 0).then(|| Duration::from_secs(n));
            prop_assert_eq!(parse_retry_after(value.as_bytes(), now()), expected);
            prop_assert_eq!(parse_delta_seconds(value.as_bytes()), expected);
            prop_assert_eq!(parse_remaining(value.as_bytes()), Some(n));
        }

        #[test]
        fn dates_ahead_of_now_round_trip(ahead in 1u64..100_000_000, millis in 0u64..1000) {
            let date = httpdate::fmt_http_date(now() + Duration::from_secs(ahead));
            let now = now() + Duration::from_millis(millis);
            // A later `now` leaves a fractional wait, which rounds back up to `ahead`.
            prop_assert_eq!(parse_retry_after(date.as_bytes(), now), Some(Duration::from_secs(ahead)));
        }

        #[test]
        fn well_formed_fields_round_trip(
            items in prop::collection::vec(
                (policy_name(), prop::option::of(sf_integer()), prop::option::of(sf_integer())),
                1..6,
            ),
        ) {
            let rendered: Vec<String> = items
                .iter()
                .map(|((_, wire), r, t)| {
                    let mut member = wire.clone();
                    if let Some(r) = r {
                        member.push_str(&format!(";r={r}"));
                    }
                    member.push_str(";x=?1");
                    if let Some(t) = t {
                        member.push_str(&format!(";t={t}"));
                    }
                    member
                })
                .collect();
            let field = rendered.join(", ");
            let expected: Vec<RateLimitItem> = items
                .iter()
                .map(|((name, _), r, t)| rl(name, *r, *t))
                .collect();
            let parsed = parse_ratelimit(field.as_bytes());
            if field.len() <= MAX_HEADER_VALUE_LEN {
                prop_assert_eq!(parsed, Some(expected));
            } else {
                prop_assert_eq!(parsed, None);
            }
        }
    }
}
