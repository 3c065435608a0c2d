//! The server address in a URI's userinfo: written by `PinServer`, read by
//! `PinnedConnector` (pure functions of the URI).

use std::net::IpAddr;

use http::uri::{Authority, Parts};
use http::Uri;

/// `uri` with `server` as its userinfo (`http://203.0.113.7@books.example/`),
/// or with no userinfo when there is no server; `None` when `uri` is
/// already so, or has no authority. A host that is itself the server's
/// address needs no userinfo.
pub(super) fn with_server_in_userinfo(uri: &Uri, server: Option<IpAddr>) -> Option<Uri> {
    let authority = uri.authority()?;
    let (userinfo, host_and_port) = split_userinfo(authority);
    let server = server.filter(|address| literal_host(authority) != Some(*address));
    let new_authority = match (userinfo, server) {
        (None, None) => return None,
        (Some(current), Some(address)) if current.parse::<IpAddr>() == Ok(address) => return None,
        (_, Some(address)) => format!("{address}@{host_and_port}"),
        (Some(_), None) => host_and_port.to_owned(),
    };
    with_authority(uri, &new_authority)
}

/// Where to connect for `uri`: the address in its userinfo, with the URI's
/// scheme, port and path (`https://203.0.113.7@books.example:8443/` →
/// `https://203.0.113.7:8443/`); `None` when its userinfo is not an address.
pub(super) fn dial_target(uri: &Uri) -> Option<Uri> {
    let authority = uri.authority()?;
    let address: IpAddr = split_userinfo(authority).0?.parse().ok()?;
    let host = match address {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    };
    let new_authority = match authority.port_u16() {
        Some(port) => format!("{host}:{port}"),
        None => host,
    };
    with_authority(uri, &new_authority)
}

/// The authority's userinfo, if any, and the rest (host and port).
fn split_userinfo(authority: &Authority) -> (Option<&str>, &str) {
    match authority.as_str().rsplit_once('@') {
        Some((userinfo, host_and_port)) => (Some(userinfo), host_and_port),
        None => (None, authority.as_str()),
    }
}

/// The host, when it is an IP literal (`203.0.113.7`, `[2001:db8::1]`).
fn literal_host(authority: &Authority) -> Option<IpAddr> {
    let host = authority.host();
    host.strip_prefix('[')
        .and_then(|bracketed| bracketed.strip_suffix(']'))
        .unwrap_or(host)
        .parse()
        .ok()
}

/// `uri` with another authority, its scheme, path and query kept.
fn with_authority(uri: &Uri, authority: &str) -> Option<Uri> {
    let mut parts = Parts::from(uri.clone());
    parts.authority = Some(Authority::try_from(authority).ok()?);
    Uri::from_parts(parts).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uri(text: &str) -> Uri {
        text.parse().unwrap()
    }

    fn address(text: &str) -> Option<IpAddr> {
        Some(text.parse().unwrap())
    }

    #[test]
    fn the_server_goes_into_the_userinfo_and_the_host_stays_the_name() {
        let pinned =
            with_server_in_userinfo(&uri("http://books.example:8080/a?b=1"), address("203.0.113.7")).unwrap();
        assert_eq!(pinned, uri("http://203.0.113.7@books.example:8080/a?b=1"));
        assert_eq!(pinned.host(), Some("books.example"));
        assert_eq!(pinned.port_u16(), Some(8080));

        let v6 = with_server_in_userinfo(&uri("https://books.example/"), address("2001:db8::1")).unwrap();
        assert_eq!(v6, uri("https://2001:db8::1@books.example/"));
        assert_eq!(v6.host(), Some("books.example"));
    }

    #[test]
    fn userinfo_not_written_by_the_layer_goes() {
        // A crawled link must not choose the address the connector dials.
        let crafted = uri("http://10.0.0.1@example.com/");
        assert_eq!(
            with_server_in_userinfo(&crafted, None),
            Some(uri("http://example.com/"))
        );
        assert_eq!(
            with_server_in_userinfo(&crafted, address("203.0.113.7")),
            Some(uri("http://203.0.113.7@example.com/"))
        );
        assert_eq!(
            with_server_in_userinfo(&uri("http://user:secret@example.com/"), None),
            Some(uri("http://example.com/"))
        );
    }

    #[test]
    fn a_uri_that_needs_nothing_is_left_alone() {
        let plain = uri("http://example.com/");
        assert_eq!(with_server_in_userinfo(&plain, None), None);
        let pinned = uri("http://203.0.113.7@example.com/");
        assert_eq!(with_server_in_userinfo(&pinned, address("203.0.113.7")), None);
        assert_eq!(
            with_server_in_userinfo(&uri("/origin-form"), address("203.0.113.7")),
            None
        );
        // The host is the address already.
        assert_eq!(
            with_server_in_userinfo(&uri("http://203.0.113.7/"), address("203.0.113.7")),
            None
        );
        assert_eq!(
            with_server_in_userinfo(&uri("http://[2001:db8::1]/"), address("2001:db8::1")),
            None
        );
    }

    #[test]
    fn the_connector_dials_the_address_in_the_userinfo() {
        assert_eq!(
            dial_target(&uri("https://203.0.113.7@books.example/")),
            Some(uri("https://203.0.113.7/"))
        );
        assert_eq!(
            dial_target(&uri("http://203.0.113.7@books.example:8080/")),
            Some(uri("http://203.0.113.7:8080/"))
        );
        assert_eq!(
            dial_target(&uri("https://2001:db8::1@books.example:8443/")),
            Some(uri("https://[2001:db8::1]:8443/"))
        );
    }

    #[test]
    fn the_connector_resolves_a_uri_without_an_address_as_usual() {
        assert_eq!(dial_target(&uri("http://books.example/")), None);
        assert_eq!(dial_target(&uri("http://user:secret@books.example/")), None);
        assert_eq!(dial_target(&uri("http://203.0.113.7/")), None);
    }
}
