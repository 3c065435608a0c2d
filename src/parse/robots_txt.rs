//! Reading a site's robots.txt: which of its rules apply to our crawler.
//!
//! The rules language is RFC 9309 plus the widely used but non-standard
//! `Crawl-delay` directive. Matching of paths against `Allow`/`Disallow`
//! patterns and the selection of the group that applies to us are done by the
//! [`texting_robots`] crate, which is tested against Google's and Moz's
//! robots.txt suites. This module only puts a size bound on the input,
//! repairs a handful of cases where that crate's answer differs from
//! RFC 9309 (or from what a polite crawler wants), and turns its crawl delay
//! into a [`Duration`] that can never panic.
//!
//! Most repairs are a line-by-line rewrite of the body before it is handed to
//! `texting_robots` (see `prepare_body` and the functions it calls); the rest
//! are in `agent_token`, `normalise_path` and `delay_from_secs`. Each one's
//! documentation names the case that needed it. Nothing here returns an error or
//! panics: a robots.txt we cannot make sense of means "no restrictions",
//! which is what RFC 9309 prescribes for an unusable file.

use std::sync::Arc;
use std::time::Duration;

use texting_robots::Robot;

/// Bytes of robots.txt we parse at most; RFC 9309 requires at least 500 KiB.
///
/// The robots.txt parser ignores everything past this many bytes of the
/// body, so a hostile or broken server cannot make us spend unbounded time or
/// memory on its robots.txt. Groups and rules that start after the bound are
/// not seen at all.
pub const MAX_ROBOTS_TXT_BYTES: usize = 512 * 1024;

/// The rules of one robots.txt that apply to one user agent.
///
/// Built once per site (by [`RobotsRules::parse`], [`RobotsRules::allow_all`]
/// or [`RobotsRules::disallow_all`]) and then queried per request with
/// [`RobotsRules::is_allowed`] and [`RobotsRules::crawl_delay`]. Cloning is
/// cheap: the compiled rules are shared, not copied. The type is `Send` and
/// `Sync`, so one value can be shared between tasks.
#[derive(Debug, Clone)]
pub(crate) struct RobotsRules {
    access: Access,
    crawl_delay: Option<Duration>,
}

/// How paths are judged; kept apart from the delay because the two fixed
/// states need no compiled rules at all.
#[derive(Debug, Clone)]
enum Access {
    AllowAll,
    DisallowAll,
    // `Robot` is not `Clone`, and its compiled patterns can be large, so it is
    // shared rather than rebuilt for every clone.
    Rules(Arc<Robot>),
}

/// The one path RFC 9309 says is implicitly allowed whatever the rules.
const ROBOTS_TXT_PATH: &str = "/robots.txt";

impl RobotsRules {
    /// Parses `body` for the crawler named by `user_agent`.
    ///
    /// # Which group applies
    ///
    /// Only the *product token* of `user_agent` takes part in matching: the
    /// text after any leading whitespace and before the first `/` or
    /// whitespace character. `mybot/1.0` is matched as `mybot`. A browser-like
    /// string such as `Mozilla/5.0 (compatible; MyBot/2.1; +http://x)` would
    /// be matched as `Mozilla`, so callers with such a header must pass the
    /// token they want robots.txt authors to address (here `MyBot`). An
    /// agent whose token is empty (`""`, `"/x"`) is treated as unnamed and
    /// gets the `*` group.
    ///
    /// The token is compared case-insensitively with the value of every
    /// `User-agent` line. Those values are cut down to their own product
    /// token the same way, so `User-agent: MyBot/2.1` and
    /// `User-agent: MyBot crawler` both name `mybot` (this is Google's
    /// behaviour; a plain comparison would silently fall back to `*`).
    /// Several consecutive `User-agent` lines share the rules that follow
    /// them, and when several groups name us their rules are combined. If no
    /// group names us the `*` group applies; if there is no `*` group either,
    /// every path is allowed and there is no crawl delay.
    ///
    /// # What is ignored
    ///
    /// * Everything past [`MAX_ROBOTS_TXT_BYTES`]. The body is cut at the last
    ///   line break before the bound, so a line straddling it is dropped
    ///   rather than read half-written (a truncated `Disallow: /private`
    ///   would otherwise become `Disallow: /priv`). Only when the first
    ///   512 KiB contain no line break at all is the body cut at the bound
    ///   itself. A group that starts after the bound is never seen.
    /// * Rules and crawl delays before the first `User-agent` line: RFC 9309
    ///   only gives meaning to rules inside a group.
    /// * `Disallow:` with an empty value, which RFC 9309 and Google treat as
    ///   no rule at all.
    /// * A `Crawl-delay` whose value is not a plain non-negative decimal
    ///   number (see [`RobotsRules::crawl_delay`]).
    /// * Unknown directives, comments (`#` to end of line) and `Sitemap`
    ///   lines, none of which affect what we may fetch.
    ///
    /// # Encoding
    ///
    /// A leading byte order mark is skipped, NUL bytes are removed, and
    /// `\n`, `\r\n` and a bare `\r` all end a line. Together the first two
    /// make a UTF-16 file that only uses ASCII readable.
    ///
    /// # Cost
    ///
    /// Work is bounded by [`MAX_ROBOTS_TXT_BYTES`], not by the body's length,
    /// and is linear for ordinary files. Each pattern containing `$` in our
    /// group is compiled into a regular expression, though, so a file made of
    /// tens of thousands of such patterns can take on the order of a second
    /// or more; call this off the async executor (for example in
    /// `spawn_blocking`) and cache the result per site.
    ///
    /// # Failure
    ///
    /// This never returns an error and never panics. If `texting_robots`
    /// rejects the body (in practice only when one of our group's patterns
    /// is so long and wildcard-heavy that its compiled form exceeds that
    /// crate's size limit), the result is [`RobotsRules::allow_all`]: the
    /// same answer RFC 9309 gives for a robots.txt that cannot be used.
    pub(crate) fn parse(body: &[u8], user_agent: &str) -> Self {
        let Some(prepared) = prepare_body(body) else {
            // No group at all: nothing can apply to us.
            return Self::allow_all();
        };
        let agent = agent_token(user_agent);
        match Robot::new(&agent, &prepared) {
            Ok(robot) => Self {
                crawl_delay: robot.delay.and_then(delay_from_secs),
                access: Access::Rules(Arc::new(robot)),
            },
            Err(_) => Self::allow_all(),
        }
    }

    /// Rules that allow everything (for a 4xx robots.txt).
    ///
    /// RFC 9309 treats an unavailable robots.txt (a 4xx response) as "no
    /// restrictions". There is no crawl delay.
    pub(crate) fn allow_all() -> Self {
        Self {
            access: Access::AllowAll,
            crawl_delay: None,
        }
    }

    /// Rules that disallow everything (while a 5xx robots.txt is being
    /// retried, when obeying rules).
    ///
    /// Every path is refused except exactly `/robots.txt`, which RFC 9309
    /// says is always allowed; keeping that exception here means the
    /// answer for `/robots.txt` is the same in every state, and a retry of
    /// the robots.txt fetch is never blocked by these rules. There is no
    /// crawl delay.
    pub(crate) fn disallow_all() -> Self {
        Self {
            access: Access::DisallowAll,
            crawl_delay: None,
        }
    }

    /// The Crawl-delay of our group.
    ///
    /// Crawl-delay is not part of RFC 9309; we follow common practice. Only
    /// the group that applies to us counts (a `*` group's delay is not used
    /// when a group names us, even if ours has none or an unusable one), and
    /// when that group has several usable values the first one wins.
    ///
    /// * A plain decimal number of seconds, integer or fractional (`5`,
    ///   `3.16`, `.5`, with an optional leading `+`), gives that many
    ///   seconds. The value passes through an `f32` inside `texting_robots`;
    ///   it is turned back into the shortest decimal that round-trips before
    ///   becoming a [`Duration`], so `3.16` is exactly 3.16 s, and values
    ///   with more than about seven significant digits are rounded.
    /// * Exponent notation (`1e3`) is accepted as the number it denotes
    ///   (1000 s): it is a valid decimal number and some generators write it.
    /// * `0` gives `Some(Duration::ZERO)`: the site states no delay is
    ///   needed, which differs from not stating a delay.
    /// * A value too large for a `Duration` (e.g. 2^256 written out in
    ///   digits, or `1e300`) saturates to [`Duration::MAX`]. Callers must cap
    ///   the delay to something sensible before sleeping on it.
    /// * Anything else is ignored and gives `None`: negative values
    ///   (including `-0`), `NaN`, `inf`/`infinity`, words such as `wait`,
    ///   units (`5s`), and an empty value.
    ///
    /// [`RobotsRules::allow_all`] and [`RobotsRules::disallow_all`] have no
    /// crawl delay.
    pub(crate) fn crawl_delay(&self) -> Option<Duration> {
        self.crawl_delay
    }

    /// Whether `path_and_query` (e.g. `/private/x?a=1`) may be fetched.
    ///
    /// Follows RFC 9309: among the `Allow` and `Disallow` patterns of our
    /// group that match, the longest pattern decides, and `Allow` wins when
    /// an `Allow` and a `Disallow` pattern are equally long. A pattern matches
    /// from the start of the path; `*` matches any run of characters and a
    /// trailing `$` anchors the end. Patterns and paths are compared after
    /// percent-encoding characters outside ASCII, so `/café` and
    /// `/caf%C3%A9` are the same path. When no pattern matches, the path is
    /// allowed. `/robots.txt` itself is always allowed.
    ///
    /// The query string takes part in matching, as RFC 9309 requires. An
    /// empty string or one starting with `?` is taken relative to `/`. An
    /// absolute URL (`https://host/path`) is also accepted: only its path
    /// and query are used.
    ///
    /// Each call tries every `Allow`/`Disallow` pattern of our group, so its
    /// cost grows with the number of patterns (see the cost note on
    /// [`RobotsRules::parse`]).
    pub(crate) fn is_allowed(&self, path_and_query: &str) -> bool {
        let path = normalise_path(path_and_query);
        match &self.access {
            Access::AllowAll => true,
            Access::DisallowAll => path == ROBOTS_TXT_PATH,
            Access::Rules(robot) => robot.allowed(&path),
        }
    }
}

/// Makes the path absolute, as robots.txt patterns always start with `/`.
///
/// `texting_robots` would compare `?a=1` against `/`-rooted patterns and find
/// no match, allowing it even under `Disallow: /`.
fn normalise_path(path_and_query: &str) -> String {
    if path_and_query.is_empty() || path_and_query.starts_with('?') {
        format!("/{path_and_query}")
    } else {
        path_and_query.to_owned()
    }
}

/// The lower-cased product token of our user agent, or `*` when it has none.
///
/// `texting_robots` compares the whole agent string with each `User-agent`
/// value, so `mybot/1.0` would never match `User-agent: mybot`. An empty token
/// is replaced by `*` because an empty `User-agent:` line would otherwise name
/// us.
fn agent_token(user_agent: &str) -> String {
    let token = user_agent
        .trim_start()
        .split(|c: char| c == '/' || c.is_whitespace())
        .next()
        .unwrap_or("");
    if token.is_empty() {
        "*".to_owned()
    } else {
        token.to_ascii_lowercase()
    }
}

/// Converts the crawl delay reported by `texting_robots` into a `Duration`.
///
/// `Duration::from_secs_f64` panics on negative, NaN and overflowing input,
/// so the checked constructor is used and overflow saturates. An infinite
/// value can only come from a finite decimal too large for an `f32` (written
/// `inf` is filtered out by [`is_plain_decimal`]), so it saturates too.
fn delay_from_secs(secs: f32) -> Option<Duration> {
    if secs.is_nan() || secs < 0.0 {
        return None;
    }
    if secs.is_infinite() {
        return Some(Duration::MAX);
    }
    // `3.16_f32 as f64` is 3.1600000858...: go through the shortest decimal
    // that identifies the `f32`, which is what the site wrote whenever the
    // value fits an `f32`'s precision.
    let secs = secs
        .to_string()
        .parse::<f64>()
        .unwrap_or_else(|_| f64::from(secs));
    Some(Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX))
}

/// The directives whose lines the pre-pass rewrites or drops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Directive {
    UserAgent,
    CrawlDelay,
    Disallow,
}

/// Key spellings, matched case-insensitively.
///
/// These are exactly the spellings `texting_robots` accepts (misspellings of
/// `Disallow` included), so the pre-pass and that crate agree on what each
/// line is. Inside a group, a line the pre-pass does not recognise reaches
/// that crate unchanged.
const DIRECTIVE_SPELLINGS: &[(Directive, &[&[u8]])] = &[
    (
        Directive::UserAgent,
        &[b"user-agent", b"user agent", b"useragent"],
    ),
    (
        Directive::CrawlDelay,
        &[b"crawl-delay", b"crawl delay", b"crawldelay"],
    ),
    (
        Directive::Disallow,
        &[
            b"disallow",
            b"dissallow",
            b"dissalow",
            b"disalow",
            b"diasllow",
            b"disallaw",
        ],
    ),
];

/// Rewrites the body into a form on which `texting_robots` gives RFC 9309
/// answers, or returns `None` when the body contains no group at all.
///
/// Each step works around a case where that crate, given the raw body, is
/// wrong or fragile:
///
/// * [`truncate_body`]: it has no size bound of its own.
/// * NUL bytes are removed. It turns each NUL into a line break, so
///   `Crawl-\0delay: 5` lost its delay; removing them also makes a UTF-16
///   file that only uses ASCII readable.
/// * [`strip_byte_order_mark`]: it only knows the UTF-8 mark.
/// * `\r\n` and bare `\r` become `\n`. It already accepts all three; the
///   pre-pass needs a single line ending to rewrite lines, and writing `\n`
///   keeps the two in agreement.
/// * Lines before the first `User-agent` line are dropped. It applies a
///   `Crawl-delay` found there to every agent that has none, and when a file
///   has no `User-agent` line at all it applies every rule to everyone
///   (`Disallow: /` alone blocked the whole site); RFC 9309 ignores rules
///   outside a group.
/// * [`rewrite_user_agent`], [`rewrite_crawl_delay`]: see there.
/// * `Disallow:` with an empty value is neutralised. It turns that line into
///   `Allow: /`, which ties with `Disallow: /` and, Allow winning ties,
///   opened a site whose group said `Disallow: /` and `Disallow:`; RFC 9309
///   and Google give an empty `Disallow` no effect.
///
/// A line inside a group is never simply dropped: it is replaced by
/// [`NO_OP_RULE`]. `texting_robots` forgets lines it does not understand
/// before grouping, so removing the only line between `User-agent: mybot`
/// and `User-agent: *` would fuse the two groups and hand us the `*` rules.
/// That also fixes the crate's own version of the problem: it treated
/// `Crawl-delay: wait` as an unknown line, so in
/// `User-agent: mybot`, `Crawl-delay: wait`, `User-agent: *`,
/// `Disallow: /` the site's `Disallow: /` for `*` applied to `mybot` too.
fn prepare_body(body: &[u8]) -> Option<Vec<u8>> {
    let body: Vec<u8> = truncate_body(body).iter().copied().filter(|&b| b != 0).collect();
    let body = strip_byte_order_mark(&body);

    let mut out = Vec::with_capacity(body.len() + 1);
    let mut in_group = false;
    for line in lines(body) {
        match classify_line(line) {
            Some((Directive::UserAgent, value)) => {
                in_group = true;
                rewrite_user_agent(value, &mut out);
            }
            _ if !in_group => {}
            Some((Directive::CrawlDelay, value)) => rewrite_crawl_delay(value, &mut out),
            Some((Directive::Disallow, value)) if is_blank(value) => {
                out.extend_from_slice(NO_OP_RULE);
            }
            _ => {
                out.extend_from_slice(line);
                out.push(b'\n');
            }
        }
    }
    in_group.then_some(out)
}

/// Stands in for a line of a group that must have no effect.
///
/// Like any rule it ends a run of `User-agent` lines, so the groups around it
/// stay apart; its empty pattern matches every path with length 0, so it only
/// decides when no other pattern matches, and then it says "allowed", which
/// is the answer for no match anyway.
const NO_OP_RULE: &[u8] = b"allow:\n";

/// Cuts the body to at most [`MAX_ROBOTS_TXT_BYTES`], at a line break when
/// there is one within the bound.
fn truncate_body(body: &[u8]) -> &[u8] {
    let Some(&next) = body.get(MAX_ROBOTS_TXT_BYTES) else {
        return body;
    };
    let head = &body[..MAX_ROBOTS_TXT_BYTES];
    if is_line_break(next) {
        // The last kept line is complete: its terminator lies just past it.
        return head;
    }
    match head.iter().rposition(|&b| is_line_break(b)) {
        Some(end) => &head[..=end],
        None => head,
    }
}

fn is_line_break(b: u8) -> bool {
    b == b'\n' || b == b'\r'
}

/// Skips a UTF-8, UTF-16LE or UTF-16BE byte order mark.
///
/// `texting_robots` skips the UTF-8 mark only, and only at the very start;
/// the pre-pass drops lines in front of the first group, so the mark must be
/// gone before lines are classified or a first `User-agent` line behind it
/// would not be recognised. The UTF-16 marks are left over when a UTF-16 file
/// has had its NUL bytes removed.
fn strip_byte_order_mark(body: &[u8]) -> &[u8] {
    for mark in [&b"\xEF\xBB\xBF"[..], b"\xFF\xFE", b"\xFE\xFF"] {
        if let Some(rest) = body.strip_prefix(mark) {
            return rest;
        }
    }
    body
}

/// Splits on `\n`, `\r\n` and bare `\r`, without the terminators.
fn lines(body: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = body;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let end = rest.iter().position(|&b| is_line_break(b)).unwrap_or(rest.len());
        let line = &rest[..end];
        let after = match rest.get(end..end + 2) {
            Some(b"\r\n") => end + 2,
            _ => (end + 1).min(rest.len()),
        };
        rest = &rest[after..];
        Some(line)
    })
}

/// Recognises a `key: value` line for the directives the pre-pass handles.
///
/// Mirrors the grammar `texting_robots` uses: optional spaces or tabs, the
/// key, then either a colon (spaces allowed before it) or at least one space
/// or tab. The returned value stops at `#` and is trimmed.
fn classify_line(line: &[u8]) -> Option<(Directive, &[u8])> {
    let line = skip_blanks(line);
    DIRECTIVE_SPELLINGS
        .iter()
        .flat_map(|(directive, spellings)| spellings.iter().map(move |s| (*directive, *s)))
        .find_map(|(directive, spelling)| {
            let rest = strip_prefix_ignore_case(line, spelling)?;
            let value = after_separator(rest)?;
            Some((directive, directive_value(value)))
        })
}

fn skip_blanks(s: &[u8]) -> &[u8] {
    let start = s.iter().position(|&b| b != b' ' && b != b'\t').unwrap_or(s.len());
    &s[start..]
}

fn strip_prefix_ignore_case<'a>(s: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix).then(|| &s[prefix.len()..])
}

fn after_separator(rest: &[u8]) -> Option<&[u8]> {
    let after_blanks = skip_blanks(rest);
    match after_blanks.split_first() {
        Some((b':', value)) => Some(value),
        // `Disallow /x` (no colon) counts, but `Disallowance: x` does not.
        _ if after_blanks.len() < rest.len() => Some(after_blanks),
        _ => None,
    }
}

fn directive_value(value: &[u8]) -> &[u8] {
    let end = value.iter().position(|&b| b == b'#').unwrap_or(value.len());
    value[..end].trim_ascii()
}

/// `texting_robots` trims Unicode whitespace from values, so a value made of
/// a no-break space is empty to it and must be empty here too.
fn is_blank(value: &[u8]) -> bool {
    String::from_utf8_lossy(value).trim().is_empty()
}

/// Writes a `User-agent` line holding only the value's product token.
///
/// `texting_robots` compares the whole value, so `User-agent: MyBot/2.1` did
/// not name `mybot` and `User-agent: Foo Bar` did not name `foo`; Google cuts
/// the value down to its product token, and so do we (which also keeps
/// `User-agent: * everyone` a `*` group). The line is written in a canonical
/// spelling so that `texting_robots` certainly sees it as a group start.
fn rewrite_user_agent(value: &[u8], out: &mut Vec<u8>) {
    let end = value
        .iter()
        .position(|&b| b == b'/' || b.is_ascii_whitespace())
        .unwrap_or(value.len());
    out.extend_from_slice(b"user-agent: ");
    out.extend(value[..end].iter().map(u8::to_ascii_lowercase));
    out.push(b'\n');
}

/// Keeps a `Crawl-delay` line only when its value is a plain decimal number,
/// and otherwise writes [`NO_OP_RULE`] in its place.
///
/// `texting_robots` accepts anything Rust's float parser accepts that is not
/// negative: `inf` and `infinity` gave an infinite delay and `-0` a negative
/// zero. Without this filter a written `inf` could not be told apart from
/// 2^256 written in digits, which also becomes infinite in an `f32`; we want
/// the first ignored and the second saturated.
fn rewrite_crawl_delay(value: &[u8], out: &mut Vec<u8>) {
    if is_plain_decimal(value) {
        out.extend_from_slice(b"crawl-delay: ");
        out.extend_from_slice(value);
        out.push(b'\n');
    } else {
        out.extend_from_slice(NO_OP_RULE);
    }
}

/// `+`? digits? (`.` digits?)? with at least one digit, then an optional
/// exponent `e`/`E`, sign, digits. Every such string is a valid Rust float.
fn is_plain_decimal(value: &[u8]) -> bool {
    fn digits(s: &[u8]) -> (usize, &[u8]) {
        let n = s.iter().take_while(|b| b.is_ascii_digit()).count();
        (n, &s[n..])
    }
    let rest = value.strip_prefix(b"+").unwrap_or(value);
    let (whole, rest) = digits(rest);
    let (fraction, rest) = match rest.strip_prefix(b".") {
        Some(after_point) => digits(after_point),
        None => (0, rest),
    };
    if whole + fraction == 0 {
        return false;
    }
    match rest.split_first() {
        None => true,
        Some((b'e' | b'E', exponent)) => {
            let exponent = exponent
                .strip_prefix(b"+")
                .or_else(|| exponent.strip_prefix(b"-"))
                .unwrap_or(exponent);
            let (count, rest) = digits(exponent);
            count > 0 && rest.is_empty()
        }
        Some(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AGENT: &str = "mybot/1.0";
    const TWO_POW_256: &str =
        "115792089237316195423570985008687907853269984665640564039457584007913129639936";
    const FIVE_MB: usize = 5 * 1024 * 1024;

    enum Source {
        Parse(Vec<u8>, &'static str),
        AllowAll,
        DisallowAll,
    }

    struct Row {
        label: &'static str,
        source: Source,
        delay: Option<Duration>,
        allowed: &'static [&'static str],
        disallowed: &'static [&'static str],
    }

    fn parse(label: &'static str, body: impl Into<Vec<u8>>, delay: Option<Duration>) -> Row {
        Row {
            label,
            source: Source::Parse(body.into(), AGENT),
            delay,
            allowed: &[],
            disallowed: &[],
        }
    }

    impl Row {
        fn agent(mut self, agent: &'static str) -> Self {
            if let Source::Parse(_, a) = &mut self.source {
                *a = agent;
            }
            self
        }
        fn allowed(mut self, paths: &'static [&'static str]) -> Self {
            self.allowed = paths;
            self
        }
        fn disallowed(mut self, paths: &'static [&'static str]) -> Self {
            self.disallowed = paths;
            self
        }
    }

    fn secs(s: u64) -> Option<Duration> {
        Some(Duration::from_secs(s))
    }

    /// `head`, then comment lines up to `FIVE_MB`, then `tail`.
    fn padded(head: &str, tail: &str) -> Vec<u8> {
        let mut body = head.as_bytes().to_vec();
        let filler = b"# filler line that is long enough to add up quickly ......\n";
        while body.len() + tail.len() < FIVE_MB {
            body.extend_from_slice(filler);
        }
        body.extend_from_slice(tail.as_bytes());
        body
    }

    /// A group whose `Crawl-delay: 12345` line straddles the size bound, so
    /// that cutting at the bound itself would leave `Crawl-delay: 12`.
    fn straddling_bound() -> Vec<u8> {
        let mut body = b"User-agent: mybot\nDisallow: /x\n#".to_vec();
        body.resize(MAX_ROBOTS_TXT_BYTES - "Crawl-delay: 12".len() - 1, b'-');
        body.push(b'\n');
        body.extend_from_slice(b"Crawl-delay: 12345\n");
        assert!(body[..MAX_ROBOTS_TXT_BYTES].ends_with(b"\nCrawl-delay: 12"));
        body
    }

    fn utf16le(text: &str) -> Vec<u8> {
        let mut body = vec![0xFF, 0xFE];
        body.extend(text.encode_utf16().flat_map(u16::to_le_bytes));
        body
    }

    fn rows() -> Vec<Row> {
        vec![
            // Group selection and Crawl-delay.
            parse(
                "several user-agent lines, ours second",
                "User-agent: other\nUser-agent: mybot\nCrawl-delay: 7\n",
                secs(7),
            ),
            parse(
                "* group when no group names us",
                "User-agent: other\nCrawl-delay: 1\n\nUser-agent: *\nCrawl-delay: 2\n",
                secs(2),
            ),
            parse(
                "specific group beats * listed first",
                "User-agent: *\nCrawl-delay: 2\nDisallow: /\n\nUser-agent: mybot\nCrawl-delay: 9\n",
                secs(9),
            )
            .allowed(&["/x"]),
            parse(
                "no group names us and no * group",
                "User-agent: other\nCrawl-delay: 1\nDisallow: /\n",
                None,
            )
            .allowed(&["/x"]),
            parse("key CRAWL-DELAY", "User-agent: mybot\nCRAWL-DELAY: 3\n", secs(3)),
            parse("key crawl-delay", "user-agent: mybot\ncrawl-delay: 3\n", secs(3)),
            parse("key Crawl-Delay", "User-Agent: mybot\nCrawl-Delay: 3\n", secs(3)),
            parse("key with spaces before colon", "User-agent: mybot\n  Crawl-delay : 3\n", secs(3)),
            parse("agent MYBOT vs mybot/1.0", "User-agent: MYBOT\nCrawl-delay: 4\n", secs(4)),
            parse("agent MyBot/2.1 vs mybot", "User-agent: mybot\nCrawl-delay: 4\n", secs(4))
                .agent("MyBot/2.1"),
            parse(
                "user-agent value with version",
                "User-agent: MyBot/2.1\nCrawl-delay: 4\nUser-agent: *\nCrawl-delay: 1\n",
                secs(4),
            ),
            parse(
                "user-agent value cut at first space (Google)",
                "User-agent: *\nDisallow: /\nUser-Agent: Foo Bar\nAllow: /x/\nDisallow: /\n",
                None,
            )
            .agent("Foo")
            .allowed(&["/x/page"])
            .disallowed(&["/y"]),
            parse("user-agent * with comment", "User-agent: * # all\nDisallow: /\n", None)
                .disallowed(&["/x"]),
            parse(
                "browser-like agent is matched by its first token",
                "User-agent: mybot\nCrawl-delay: 4\nUser-agent: *\nCrawl-delay: 1\n",
                secs(1),
            )
            .agent("Mozilla/5.0 (compatible; MyBot/2.1; +http://x)"),
            parse(
                "empty agent gets the * group",
                "User-agent:\nCrawl-delay: 4\nUser-agent: *\nCrawl-delay: 1\n",
                secs(1),
            )
            .agent(""),
            parse(
                "groups naming us are merged, first delay wins",
                "User-agent: mybot\nCrawl-delay: 5\nDisallow: /a\n\nUser-agent: *\nDisallow: /b\n\nUser-agent: mybot\nCrawl-delay: 6\nDisallow: /c\n",
                secs(5),
            )
            .allowed(&["/b"])
            .disallowed(&["/a", "/c"]),
            parse("fractional 3.16", "User-agent: mybot\nCrawl-delay: 3.16\n", Some(Duration::from_millis(3160))),
            parse("leading point .5", "User-agent: mybot\nCrawl-delay: .5\n", Some(Duration::from_millis(500))),
            parse("zero", "User-agent: mybot\nCrawl-delay: 0\n", Some(Duration::ZERO)),
            parse(
                "-1 ignored, * delay not borrowed",
                "User-agent: mybot\nCrawl-delay: -1\nUser-agent: *\nCrawl-delay: 9\nDisallow: /\n",
                None,
            )
            .allowed(&["/x"]),
            parse("-0 ignored", "User-agent: mybot\nCrawl-delay: -0\n", None),
            parse(
                "wait ignored, still ends its group",
                "User-agent: mybot\nCrawl-delay: wait\n\nUser-agent: *\nDisallow: /\n",
                None,
            )
            .allowed(&["/x"]),
            parse("units ignored", "User-agent: mybot\nCrawl-delay: 5s\n", None),
            parse("empty value ignored", "User-agent: mybot\nCrawl-delay:\n", None),
            parse("NaN ignored", "User-agent: mybot\nCrawl-delay: NaN\n", None),
            parse("inf ignored", "User-agent: mybot\nCrawl-delay: inf\n", None),
            parse("infinity ignored", "User-agent: mybot\nCrawl-delay: Infinity\n", None),
            parse(
                "invalid value skipped, next usable value wins",
                "User-agent: mybot\nCrawl-delay: wait\nCrawl-delay: 8\n",
                secs(8),
            ),
            parse("exponent 1e3 accepted", "User-agent: mybot\nCrawl-delay: 1e3\n", secs(1000)),
            parse(
                "2^256 in digits saturates",
                format!("User-agent: mybot\nCrawl-delay: {TWO_POW_256}\n"),
                Some(Duration::MAX),
            ),
            parse("1e300 saturates", "User-agent: mybot\nCrawl-delay: 1e300\n", Some(Duration::MAX)),
            parse("comment after value", "User-agent: mybot\nCrawl-delay: 4 # slow\n", secs(4)),
            // Encoding and line endings.
            parse("UTF-8 BOM", "\u{FEFF}User-agent: mybot\nCrawl-delay: 5\nDisallow: /x\n", secs(5))
                .disallowed(&["/x"]),
            parse(
                "CRLF",
                "User-agent: other\r\nCrawl-delay: 1\r\n\r\nUser-agent: mybot\r\nCrawl-delay: 5\r\nDisallow: /x\r\n",
                secs(5),
            )
            .disallowed(&["/x"]),
            parse(
                "bare CR",
                "User-agent: other\rCrawl-delay: 1\r\rUser-agent: mybot\rCrawl-delay: 5\rDisallow: /x\r",
                secs(5),
            )
            .disallowed(&["/x"])
            .allowed(&["/y"]),
            parse(
                "NUL bytes inside lines",
                &b"User-agent: my\0bot\0\nCrawl-\0delay: 5\nDisallow: /x\0\n"[..],
                secs(5),
            )
            .disallowed(&["/x"]),
            parse(
                "UTF-16LE with BOM, ASCII only",
                utf16le("User-agent: mybot\r\nCrawl-delay: 5\r\nDisallow: /x\r\n"),
                secs(5),
            )
            .disallowed(&["/x"]),
            // Lines outside any group.
            parse(
                "Crawl-delay before any user-agent line",
                "Crawl-delay: 5\nUser-agent: *\nDisallow: /x\n",
                None,
            )
            .disallowed(&["/x"]),
            parse(
                "Disallow before any user-agent line",
                "Disallow: /\nUser-agent: *\nDisallow: /x\n",
                None,
            )
            .allowed(&["/y"])
            .disallowed(&["/x"]),
            parse("rules but no user-agent line at all", "Disallow: /\nCrawl-delay: 5\n", None)
                .allowed(&["/", "/x"]),
            parse("empty file", "", None).allowed(&["/", "/x"]),
            parse("only comments and blank lines", "# nothing\n\n   \n", None).allowed(&["/x"]),
            // Size bound.
            parse(
                "5 MB: group at start, then junk",
                padded("User-agent: mybot\nCrawl-delay: 3\nDisallow: /x\n", ""),
                secs(3),
            )
            .disallowed(&["/x"]),
            parse(
                "5 MB: our group after the bound is not seen",
                padded(
                    "User-agent: *\nCrawl-delay: 1\n",
                    "User-agent: mybot\nCrawl-delay: 9\nDisallow: /\n",
                ),
                secs(1),
            )
            .allowed(&["/x"]),
            parse("line straddling the bound is dropped", straddling_bound(), None)
                .disallowed(&["/x"]),
            parse(
                "5 MB with no line break at all",
                {
                    let mut body = b"User-agent: mybot\nCrawl-delay: 3\nDisallow: /".to_vec();
                    body.resize(FIVE_MB, b'a');
                    body
                },
                secs(3),
            )
            .allowed(&["/x"]),
            // Allow and Disallow.
            parse(
                "longest match wins",
                "User-agent: *\nDisallow: /a\nAllow: /a/b\nDisallow: /a/b/c\n",
                None,
            )
            .allowed(&["/", "/a/b", "/a/bx"])
            .disallowed(&["/a", "/a/x", "/a/b/c", "/a/b/cd"]),
            parse("Allow wins ties", "User-agent: *\nDisallow: /p\nAllow: /p\n", None)
                .allowed(&["/p", "/page"]),
            parse(
                "Allow wins ties against a wildcard of equal length",
                "User-agent: *\nDisallow: /*ge\nAllow: /page\n",
                None,
            )
            .allowed(&["/page"])
            .disallowed(&["/age"]),
            parse("$ anchors the end", "User-agent: *\nDisallow: /*.php$\n", None)
                .allowed(&["/x.php?a=1", "/x.phpx", "/x.html"])
                .disallowed(&["/x.php", "/a/b.php"]),
            parse("* wildcard", "User-agent: *\nDisallow: /*/private\n", None)
                .allowed(&["/private", "/a/public"])
                .disallowed(&["/a/private", "/a/b/private/c"]),
            parse("query string takes part", "User-agent: *\nDisallow: /*?\n", None)
                .allowed(&["/a", "/"])
                .disallowed(&["/a?b=1", "/?x", "?x"]),
            parse(
                "RFC 9309 example: longer Disallow beats Allow",
                "User-agent: *\nAllow: /page\nDisallow: /*.html\n",
                None,
            )
            .allowed(&["/page", "/page.htm"])
            .disallowed(&["/page.html", "/x.html"]),
            parse(
                "empty Disallow has no effect",
                "User-agent: *\nDisallow: /\nDisallow:\n",
                None,
            )
            .disallowed(&["/", "/x"]),
            parse(
                "empty Disallow still ends its group",
                "User-agent: mybot\nDisallow:\n\nUser-agent: *\nDisallow: /\n",
                None,
            )
            .allowed(&["/", "/x"]),
            parse(
                "comments and Sitemap lines do not end a run of user-agent lines",
                "User-agent: other\n# note\nSitemap: https://x/s.xml\nUser-agent: mybot\nDisallow: /x\n",
                None,
            )
            .disallowed(&["/x"]),
            parse("empty Disallow alone allows all", "User-agent: *\nDisallow:\n", None)
                .allowed(&["/", "/x"]),
            parse("Disallow without colon", "User-agent: *\nDisallow /x\n", None)
                .disallowed(&["/x"]),
            parse("non-ASCII pattern", "User-agent: *\nDisallow: /café\n", None)
                .allowed(&["/cafe"])
                .disallowed(&["/café", "/caf%C3%A9"]),
            parse("/robots.txt always allowed", "User-agent: *\nDisallow: /\n", None)
                .allowed(&["/robots.txt"])
                .disallowed(&["/", "", "/robots.txt.bak"]),
            parse("absolute URL accepted", "User-agent: *\nDisallow: /x\n", None)
                .allowed(&["https://example.com/y"])
                .disallowed(&["https://example.com/x?q"]),
            parse(
                "pattern too large to compile: allow all",
                format!(
                    "User-agent: *\nDisallow: /\nCrawl-delay: 5\nDisallow: /{}$\n",
                    "a*".repeat(5000)
                ),
                None,
            )
            .allowed(&["/", "/x"]),
            Row {
                label: "allow_all",
                source: Source::AllowAll,
                delay: None,
                allowed: &["/", "", "/x?y", "/robots.txt"],
                disallowed: &[],
            },
            Row {
                label: "disallow_all",
                source: Source::DisallowAll,
                delay: None,
                allowed: &["/robots.txt"],
                disallowed: &["/", "", "/x?y", "?x", "/robots.txt?x"],
            },
        ]
    }

    #[test]
    fn table() {
        let rows = rows();
        assert!(rows.len() >= 30);
        let mut failures = Vec::new();
        for row in &rows {
            let rules = match &row.source {
                Source::Parse(body, agent) => RobotsRules::parse(body, agent),
                Source::AllowAll => RobotsRules::allow_all(),
                Source::DisallowAll => RobotsRules::disallow_all(),
            };
            if rules.crawl_delay() != row.delay {
                failures.push(format!(
                    "{}: crawl_delay {:?}, want {:?}",
                    row.label,
                    rules.crawl_delay(),
                    row.delay
                ));
            }
            for (paths, want) in [(row.allowed, true), (row.disallowed, false)] {
                for path in paths {
                    if rules.is_allowed(path) != want {
                        failures.push(format!("{}: is_allowed({path:?}) != {want}", row.label));
                    }
                }
            }
        }
        assert!(failures.is_empty(), "failing rows:\n{}", failures.join("\n"));
    }

    #[test]
    fn truncation_points() {
        let bound = MAX_ROBOTS_TXT_BYTES;
        let short = b"User-agent: *\nDisallow: /\n";
        assert_eq!(truncate_body(short), short);
        let mut exact = vec![b'#'; bound];
        assert_eq!(truncate_body(&exact).len(), bound);
        // The line ends right at the bound: it is complete and kept.
        exact.extend_from_slice(b"\nmore");
        assert_eq!(truncate_body(&exact).len(), bound);
        // The line runs past the bound: cut after the previous line break.
        let mut straddling = b"#\r".to_vec();
        straddling.resize(bound + 10, b'x');
        assert_eq!(truncate_body(&straddling), b"#\r");
        // No line break at all: cut at the bound.
        assert_eq!(truncate_body(&vec![b'x'; bound + 1]).len(), bound);
    }

    #[test]
    fn five_megabyte_bodies_take_bounded_work() {
        // Shapes that would be expensive if the whole body were read: many
        // groups naming us, many rules (with and without wildcards), and one
        // endless line. Completing at all, without panicking, is the check;
        // the work is bounded by MAX_ROBOTS_TXT_BYTES, not by the body.
        let shapes: [&[u8]; 5] = [
            b"User-agent: mybot\nCrawl-delay: 1\n",
            b"Disallow: /a*b*c\n",
            b"Allow: /x/y/z\n",
            b"\r\0#\xFF\xFE",
            b"a",
        ];
        for shape in shapes {
            let mut body = b"User-agent: mybot\n".to_vec();
            while body.len() < FIVE_MB {
                body.extend_from_slice(shape);
            }
            let rules = RobotsRules::parse(&body, AGENT);
            let _ = rules.is_allowed("/a/b/c/d");
            let _ = rules.crawl_delay();
        }
    }

    #[test]
    fn arbitrary_input_never_panics() {
        const PIECES: &[&[u8]] = &[
            b"User-agent:",
            b"user agent ",
            b"mybot",
            b"*",
            b"/",
            b"Disallow:",
            b"Allow:",
            b"Crawl-delay:",
            b"crawldelay ",
            b"1e309",
            b"-",
            b".",
            b"9",
            b"$",
            b"?",
            b"#",
            b" ",
            b"\t",
            b"\n",
            b"\r",
            b"\0",
            b"\xEF\xBB\xBF",
            b"\xFF",
            b"\xC3",
            b"%",
            b"\xE2\x80\xA8",
        ];
        // A fixed xorshift sequence: reproducible without a dependency.
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..2000 {
            let len = next() % 40;
            let mut body = Vec::new();
            for _ in 0..len {
                let index = usize::try_from(next() % PIECES.len() as u64).unwrap_or(0);
                body.extend_from_slice(PIECES[index]);
            }
            let rules = RobotsRules::parse(&body, AGENT);
            let _ = rules.crawl_delay();
            for path in ["/", "", "?", "/mybot$", "/%", "/\u{e9}*"] {
                let _ = rules.is_allowed(path);
            }
        }
    }

    #[test]
    fn rules_can_be_shared_between_threads() {
        fn assert_send_sync<T: Send + Sync + Clone + std::fmt::Debug>() {}
        assert_send_sync::<RobotsRules>();
    }

    #[test]
    fn plain_decimal_grammar() {
        for good in ["0", "5", "+5", "3.16", ".5", "5.", "1e3", "1E+3", "2.5e-1"] {
            assert!(is_plain_decimal(good.as_bytes()), "{good}");
        }
        for bad in [
            "", ".", "+", "-1", "-0", "e3", "1e", "1e+", "inf", "NaN", "5s", "1 2", "0x10",
        ] {
            assert!(!is_plain_decimal(bad.as_bytes()), "{bad}");
        }
    }
}
