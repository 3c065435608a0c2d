//! Whether a key given a config of its own can ever be a request's scope
//! under the host rule (lower-cased host, no port, no trailing dot): the
//! checks behind [`ScopeResolver::check_key`](super::ScopeResolver::check_key)
//! for the ready-made resolvers.

/// What makes `key` a key the host rule never gives, and the key it
/// would give requests to that host instead; `Ok` for a bare host name.
/// `resolver` names the resolver in the reason (`the host resolver`).
pub(crate) fn check_host_key(key: &str, resolver: &str) -> Result<(), String> {
    let mut faults = Vec::new();
    let (host, path) = split_key(key, &mut faults);
    if !path.is_empty() {
        faults.push("a path");
    }
    explain(key, &host_fixed(host, &mut faults), &faults, resolver)
}

/// [`check_host_key`] for an [`EndpointResolver`](super::EndpointResolver)
/// key: a host, then at most `segments` path segments, each after one `/`.
pub(crate) fn check_endpoint_key(key: &str, segments: usize) -> Result<(), String> {
    let mut faults = Vec::new();
    let (host, path) = split_key(key, &mut faults);
    let (path, query) = path.split_at(path.find(['?', '#']).unwrap_or(path.len()));
    let given: Vec<&str> = path.split('/').filter(|segment| !segment.is_empty()).collect();
    if given.len() > segments {
        faults.push("more path segments than the resolver keeps");
    }
    if !query.is_empty() || path.ends_with('/') || path.contains("//") {
        faults.push("a path that is not segments after single slashes");
    }
    let mut fixed = host_fixed(host, &mut faults);
    for segment in given.iter().take(segments) {
        fixed.push('/');
        fixed.push_str(segment);
    }
    explain(key, &fixed, &faults, "this endpoint resolver")
}

/// The host in `key` (after a scheme, `http://`, and user info, `user@`;
/// before a port) and what follows the authority (a path, a query, a
/// fragment). Notes the scheme, user info and port in `faults`.
fn split_key<'k>(key: &'k str, faults: &mut Vec<&'static str>) -> (&'k str, &'k str) {
    let mut rest = key;
    if let Some(at) = rest.find("://") {
        faults.push("a scheme");
        rest = &rest[at + 3..];
    }
    let (mut authority, path) = rest.split_at(rest.find(['/', '?', '#']).unwrap_or(rest.len()));
    if let Some(at) = authority.rfind('@') {
        faults.push("user info");
        authority = &authority[at + 1..];
    }
    let host_end = if authority.starts_with('[') {
        authority.find(']').map_or(authority.len(), |close| close + 1)
    } else {
        authority.find(':').unwrap_or(authority.len())
    };
    if let Some(after) = authority.get(host_end..).filter(|after| !after.is_empty()) {
        let is_port = after
            .strip_prefix(':')
            .is_some_and(|port| port.bytes().all(|byte| byte.is_ascii_digit()));
        faults.push(if is_port { "a port" } else { "a colon" });
    }
    (&authority[..host_end], path)
}

/// `host` as the host rule writes it (lower case, no trailing dot), with
/// what differed noted in `faults`.
fn host_fixed(host: &str, faults: &mut Vec<&'static str>) -> String {
    let mut fixed = host.to_ascii_lowercase();
    if fixed != host {
        faults.push("upper case");
    }
    if fixed.len() > 1 && fixed.ends_with('.') {
        faults.push("a trailing dot");
        fixed.pop();
    }
    if !fixed.is_ascii() {
        faults.push("letters outside ASCII (requests carry such a host in its xn-- form)");
    }
    if fixed.contains(|c: char| c.is_ascii_whitespace()) {
        faults.push("a space");
    }
    fixed
}

/// `Ok` without faults; else why `key` never matches and what would.
fn explain(key: &str, fixed: &str, faults: &[&str], resolver: &str) -> Result<(), String> {
    if faults.is_empty() {
        return Ok(());
    }
    let mut unique: Vec<&str> = Vec::new();
    for fault in faults {
        if !unique.contains(fault) {
            unique.push(fault);
        }
    }
    let listed = match unique.as_slice() {
        [one] => (*one).to_owned(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
        [] => unreachable!("faults is not empty"),
    };
    let instead = if fixed.is_ascii() && !fixed.contains(|c: char| c.is_ascii_whitespace()) && fixed != key {
        format!("; it would match {fixed:?}")
    } else {
        String::new()
    };
    Err(format!(
        "{resolver} never gives a request this key (it has {listed}){instead}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_hosts_pass() {
        for key in [
            "example.com",
            "books.toscrape.com",
            "127.0.0.3",
            "[::1]",
            "localhost",
            "xn--bcher-kva.example",
            "",
            "api",
        ] {
            assert_eq!(check_host_key(key, "the host resolver"), Ok(()), "{key}");
        }
    }

    #[test]
    fn each_fault_is_named_with_the_key_it_would_match() {
        let cases = [
            ("example.com:8080", "a port", "example.com"),
            ("http://example.com/", "a scheme and a path", "example.com"),
            (
                "https://Example.com:8443/x",
                "a scheme, a port, a path and upper case",
                "example.com",
            ),
            ("Example.COM", "upper case", "example.com"),
            ("example.com.", "a trailing dot", "example.com"),
            ("example.com/page", "a path", "example.com"),
            ("user@example.com", "user info", "example.com"),
            ("[::1]:8080", "a port", "[::1]"),
            ("127.0.0.3:8002", "a port", "127.0.0.3"),
        ];
        for (key, faults, instead) in cases {
            let why = check_host_key(key, "the host resolver").unwrap_err();
            assert_eq!(
                why,
                format!(
                    "the host resolver never gives a request this key (it has {faults}); it would match {instead:?}"
                ),
                "{key}"
            );
        }
    }

    #[test]
    fn a_key_with_no_host_form_says_why_without_a_match() {
        let why = check_host_key("bücher.example", "the host resolver").unwrap_err();
        assert!(why.contains("xn--") && !why.contains("would match"), "{why}");
        assert!(check_host_key("two words", "the host resolver")
            .unwrap_err()
            .contains("a space"));
    }

    #[test]
    fn endpoint_keys_are_a_host_and_at_most_the_kept_segments() {
        for key in [
            "api.example.com",
            "api.example.com/v1",
            "api.example.com/v1/users",
        ] {
            assert_eq!(check_endpoint_key(key, 2), Ok(()), "{key}");
        }
        let why = check_endpoint_key("api.example.com/v1/users/7", 2).unwrap_err();
        assert!(
            why.contains("more path segments")
                && why.ends_with("it would match \"api.example.com/v1/users\""),
            "{why}"
        );
        let why = check_endpoint_key("https://API.example.com:443/v1", 1).unwrap_err();
        assert!(
            why.contains("a scheme, a port and upper case")
                && why.ends_with("it would match \"api.example.com/v1\""),
            "{why}"
        );
        assert!(check_endpoint_key("api.example.com/v1/", 2).is_err());
    }
}
