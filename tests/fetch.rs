//! The fetch example against two loopback sites: one JSON line per URL
//! with its fields, and each site's configured delay held between the
//! sends the site saw.

#[path = "../examples/fetch/cli.rs"]
mod cli;
#[path = "../examples/fetch/tool.rs"]
mod tool;

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

const CONFIG: &str = r#"
[default_scope]
delay = 0
delay_per_slot = 0
jitter = 0
backoff = { min_delay = "50ms" }

[scopes."a.test"]
delay = "200ms"

[scopes."b.test"]
concurrency = 2
delay = "100ms"
"#;

type Arrivals = Arc<Mutex<Vec<(String, String, Instant)>>>;

/// Two sites by Host header; every arrival recorded as the server sees it.
async fn start_sites(arrivals: Arrivals) -> u16 {
    let addr = support::serve(move |request: http::Request<hyper::body::Incoming>| {
        let arrivals = arrivals.clone();
        async move {
            let host = request
                .uri()
                .host()
                .or_else(|| request.headers().get(http::header::HOST)?.to_str().ok())
                .unwrap_or_default()
                .split(':')
                .next()
                .unwrap_or_default()
                .to_owned();
            let path = request.uri().path().to_owned();
            arrivals
                .lock()
                .unwrap()
                .push((host.clone(), path.clone(), Instant::now()));
            if path.starts_with("/page/") {
                support::text(page_body(&host, &path))
            } else if path.starts_with("/held/") {
                let mut response = support::text("come back in an hour");
                *response.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
                response
                    .headers_mut()
                    .insert(http::header::RETRY_AFTER, 3600.into());
                response
            } else {
                let mut response = support::text("no such page");
                *response.status_mut() = http::StatusCode::NOT_FOUND;
                response
            }
        }
    })
    .await;
    addr.port()
}

fn page_body(host: &str, path: &str) -> String {
    format!("page {path} of {host}")
}

fn write_config(name: &str, text: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("tower-throttle-fetch-{}-{name}", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test]
async fn fetches_two_sites_with_one_json_line_per_url_and_their_delays_held() {
    let arrivals = Arrivals::default();
    let port = start_sites(arrivals.clone()).await;
    let config = write_config("sites.toml", CONFIG);
    let registry = tool::load_registry(&config).unwrap();
    std::fs::remove_file(&config).unwrap();

    let mut urls = Vec::new();
    for page in 0..4 {
        urls.push(format!("http://a.test:{port}/page/{page}"));
        urls.push(format!("http://b.test:{port}/page/{page}"));
    }
    urls.push(format!("http://b.test:{port}/missing"));
    // Nothing listens on port 1: refused, retried once, then an error.
    urls.push("http://refused.test:1/".to_owned());
    urls.push("ftp://a.test/file".to_owned());
    let input: Vec<String> = urls
        .iter()
        .cloned()
        .chain(["".to_owned(), "# a comment".to_owned()])
        .collect();

    let options = tool::Options {
        retries: 1,
        progress_every: 5,
        ..tool::Options::default()
    };
    let (mut out, mut progress) = (Vec::new(), Vec::new());
    let summary = tool::run(
        registry,
        support::loopback_client(),
        input,
        &options,
        &mut out,
        &mut progress,
    )
    .await
    .unwrap();
    assert_eq!(
        summary,
        tool::Summary {
            urls: 11,
            success: 8,
            other_status: 1,
            errors: 2
        }
    );

    let lines: HashMap<String, Value> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|line| {
            let json: Value = serde_json::from_str(line).unwrap();
            (json["url"].as_str().unwrap().to_owned(), json)
        })
        .collect();
    assert_eq!(lines.len(), urls.len(), "one line per URL");

    for host in ["a.test", "b.test"] {
        for page in 0..4 {
            let path = format!("/page/{page}");
            let line = &lines[&format!("http://{host}:{port}{path}")];
            assert_eq!(line["status"], 200, "{line}");
            assert_eq!(line["bytes"], page_body(host, &path).len(), "{line}");
            assert_eq!(line["attempts"], 1, "{line}");
            assert_eq!(line["scopes"], serde_json::json!([host]), "{line}");
            assert!(line["latency_ms"].as_f64().unwrap() >= 0.0, "{line}");
            assert!(line["waited_ms"].as_f64().unwrap() >= 0.0, "{line}");
            assert!(line.get("error").is_none(), "{line}");
        }
    }
    let missing = &lines[&format!("http://b.test:{port}/missing")];
    assert_eq!(missing["status"], 404);
    assert_eq!(missing["bytes"], "no such page".len());
    let refused = &lines["http://refused.test:1/"];
    assert!(refused.get("status").is_none());
    assert!(
        refused["error"].as_str().unwrap().contains("Connection refused"),
        "{refused}"
    );
    assert_eq!(refused["attempts"], 2, "one send and one retry");
    assert_eq!(refused["bytes"], Value::Null);
    let invalid = &lines["ftp://a.test/file"];
    assert!(
        invalid["error"].as_str().unwrap().starts_with("invalid URL"),
        "{invalid}"
    );
    assert_eq!(invalid["attempts"], 0);
    assert_eq!(invalid["waited_ms"], Value::Null);

    // What each site saw, robots.txt included: never two arrivals closer
    // than its delay (less 2 ms for the trip through loopback).
    let arrivals = arrivals.lock().unwrap().clone();
    for (host, delay) in [("a.test", 200), ("b.test", 100)] {
        let at: Vec<Instant> = arrivals
            .iter()
            .filter(|(h, ..)| h == host)
            .map(|(.., at)| *at)
            .collect();
        let expected = if host == "a.test" { 5 } else { 6 };
        assert_eq!(at.len(), expected, "robots.txt and the pages of {host}");
        for pair in at.windows(2) {
            let gap = pair[1] - pair[0];
            assert!(
                gap >= Duration::from_millis(delay - 2),
                "{host}: {gap:?} between two arrivals"
            );
        }
    }
    // The throttle's wait shows in `waited_ms`: the k-th page of a.test
    // to go waited at least k delays after robots.txt (less the few
    // milliseconds between the tool's calls).
    let mut waited: Vec<f64> = (0..4)
        .map(|page| {
            lines[&format!("http://a.test:{port}/page/{page}")]["waited_ms"]
                .as_f64()
                .unwrap()
        })
        .collect();
    waited.sort_by(f64::total_cmp);
    for (k, waited) in waited.iter().enumerate() {
        assert!(
            *waited >= 200.0 * (k + 1) as f64 - 20.0,
            "page {k} of a.test waited {waited} ms"
        );
    }

    let progress = String::from_utf8(progress).unwrap();
    assert!(progress.starts_with("5 URLs in "), "{progress}");
    assert!(
        progress.contains("done: 11 URLs in ")
            && progress.ends_with("8 answered 2xx, 1 another status, 2 failed\n"),
        "{progress}"
    );
}

#[test]
fn config_files_are_read_as_toml_or_json_by_extension() {
    let json = write_config("c.json", r#"{"scopes": {"a.test": {"concurrency": 3}}}"#);
    let registry = tool::load_registry(&json).unwrap();
    let toml = "[scopes.\"a.test\"]\nconcurrency = 3\n";
    assert_eq!(registry.config().to_toml_string().unwrap(), toml);
    std::fs::remove_file(&json).unwrap();

    let bad = write_config("bad.toml", "max_concurrency = 0");
    let err = tool::load_registry(&bad).unwrap_err();
    assert_eq!(
        err,
        format!("{}: max_concurrency: must be at least 1, got 0", bad.display())
    );
    std::fs::remove_file(&bad).unwrap();

    let yaml = write_config("c.yaml", "max_concurrency: 3");
    let err = tool::load_registry(&yaml).unwrap_err();
    assert!(
        err.ends_with("the config file must end in .toml or .json"),
        "{err}"
    );
    std::fs::remove_file(&yaml).unwrap();
}

fn command_line(args: &[&str]) -> Result<cli::Command, String> {
    cli::parse(args.iter().map(|&arg| arg.to_owned()))
}

#[test]
fn the_flags_keep_their_defaults_and_bad_values_are_named() {
    let Ok(cli::Command::Run(defaults)) = command_line(&[]) else {
        panic!("no flags is a run");
    };
    assert_eq!(
        (defaults.urls, defaults.config, defaults.ca_cert),
        (None, None, None)
    );
    assert_eq!(defaults.options.user_agent, tool::Options::default().user_agent);
    assert_eq!(defaults.options.retries, tool::Options::default().retries);
    assert_eq!(
        defaults.options.progress_every,
        tool::Options::default().progress_every
    );

    let Ok(cli::Command::Run(given)) = command_line(&[
        "--urls",
        "u.txt",
        "--config=t.toml",
        "--user-agent",
        "bot/1",
        "--retries",
        "0",
        "--progress-every",
        "0",
        "--ca-cert",
        "ca.pem",
        "--max-wait",
        "2.5",
    ]) else {
        panic!("every flag given is a run");
    };
    assert_eq!(given.urls.as_deref(), Some(std::path::Path::new("u.txt")));
    assert_eq!(given.config.as_deref(), Some(std::path::Path::new("t.toml")));
    assert_eq!(given.ca_cert.as_deref(), Some(std::path::Path::new("ca.pem")));
    assert_eq!(
        (
            given.options.user_agent.as_str(),
            given.options.retries,
            given.options.progress_every
        ),
        ("bot/1", 0, 0)
    );
    assert_eq!(given.options.max_wait, Some(Duration::from_millis(2500)));
    assert_eq!(defaults.options.max_wait, None);

    let Ok(cli::Command::Help(help)) = command_line(&["--help"]) else {
        panic!("--help asks for the help text");
    };
    for expected in [
        "--urls <FILE>",
        "--progress-every <N>",
        "[default: 3]",
        "waited_ms",
    ] {
        assert!(help.contains(expected), "{expected} in {help}");
    }

    let retries = command_line(&["--retries", "-1"]).expect_err("a negative count");
    assert!(
        retries.contains("'-1'") || retries.contains("--retries"),
        "{retries}"
    );
    let words = command_line(&["--progress-every", "often"]).expect_err("not a number");
    assert!(
        words.contains("'often'") && words.contains("--progress-every"),
        "{words}"
    );
    let unknown = command_line(&["--url", "x"]).expect_err("a misspelt flag");
    assert!(
        unknown.contains("'--url'") && unknown.contains("--urls"),
        "suggests the right one: {unknown}"
    );
}

/// A loopback https server with a certificate made here for `localhost`
/// (rcgen); returns its port and the certificate's PEM.
async fn start_https_site() -> (u16, String) {
    let localhost = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let (address, _, pem) = support::tls::serve_https(localhost, "localhost", |_, request| {
        let status = if request.uri().path() == "/robots.txt" {
            404
        } else {
            200
        };
        let mut response = support::text("over tls");
        *response.status_mut() = http::StatusCode::from_u16(status).unwrap();
        response
    })
    .await;
    (address.port(), pem)
}

/// Fetches `url` with `client`, no retries; the one JSON line.
async fn fetch_one(client: tool::WebClient, url: String) -> Value {
    let options = tool::Options {
        retries: 0,
        progress_every: 0,
        ..tool::Options::default()
    };
    let (mut out, mut progress) = (Vec::new(), Vec::new());
    tool::run(
        tower_throttle::Registry::default(),
        client,
        [url],
        &options,
        &mut out,
        &mut progress,
    )
    .await
    .unwrap();
    serde_json::from_str(String::from_utf8(out).unwrap().trim()).unwrap()
}

#[tokio::test]
async fn fetches_over_https_with_an_extra_root_and_reports_an_untrusted_certificate() {
    let (port, pem) = start_https_site().await;
    let url = format!("https://localhost:{port}/page");

    let trusted = write_config("ca.pem", &pem);
    let line = fetch_one(tool::web_client(Some(&trusted)).unwrap(), url.clone()).await;
    std::fs::remove_file(&trusted).unwrap();
    assert_eq!(line["status"], 200, "{line}");
    assert_eq!(line["bytes"], "over tls".len(), "{line}");

    // Another certificate as the root: the server's is not trusted.
    let other = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let wrong = write_config("wrong-ca.pem", &other.cert.pem());
    let line = fetch_one(tool::web_client(Some(&wrong)).unwrap(), url.clone()).await;
    std::fs::remove_file(&wrong).unwrap();
    assert!(line.get("status").is_none(), "{line}");
    let error = line["error"].as_str().unwrap();
    assert!(error.contains("certificate"), "names the certificate: {error}");

    // Mozilla's roots alone do not vouch for a test certificate either.
    let line = fetch_one(tool::web_client(None).unwrap(), url).await;
    assert!(line["error"].as_str().unwrap().contains("certificate"), "{line}");
}

#[test]
fn a_ca_cert_file_that_holds_no_certificate_is_refused_with_its_name() {
    let empty = write_config("empty.pem", "not a certificate\n");
    let error = tool::web_client(Some(&empty)).expect_err("no certificate in it");
    std::fs::remove_file(&empty).unwrap();
    assert!(
        error.contains("--ca-cert") && error.contains("empty.pem"),
        "{error}"
    );
    let missing =
        tool::web_client(Some(std::path::Path::new("/nonexistent/ca.pem"))).expect_err("no such file");
    assert!(missing.contains("/nonexistent/ca.pem"), "{missing}");
}

/// `--ip-scopes` through the tool's own web client (the one `main` builds):
/// two names of one server share its IP scope, which the config file's
/// `[ip_scopes]` sets, and the site sees that scope's delay between them.
#[tokio::test]
async fn with_ip_scopes_the_names_of_one_server_share_its_delay() {
    let arrivals = Arrivals::default();
    let port = start_sites(arrivals.clone()).await;
    let config = write_config(
        "ip.toml",
        r#"
[default_scope]
concurrency = 4
delay = 0
delay_per_slot = 0
jitter = 0

[ip_scopes]
concurrency = 1
delay = "150ms"
delay_per_slot = 0
jitter = 0
"#,
    );
    let registry = tool::load_registry(&config).unwrap();
    std::fs::remove_file(&config).unwrap();
    let options = tool::Options {
        retries: 0,
        progress_every: 0,
        ip_scopes: true,
        ..tool::Options::default()
    };
    // Both hosts are the server's address itself (no lookup needed, so
    // the test does not depend on how this machine resolves localhost),
    // under two spellings that are two host scopes.
    let urls = [
        format!("http://127.0.0.1:{port}/page/0"),
        format!("http://127.1:{port}/page/1"),
        format!("http://127.0.0.1:{port}/page/2"),
    ];
    let (mut out, mut progress) = (Vec::new(), Vec::new());
    let summary = tool::run(
        registry.clone(),
        tool::web_client(None).unwrap(),
        urls,
        &options,
        &mut out,
        &mut progress,
    )
    .await
    .unwrap();
    assert_eq!(summary.success, 3, "{}", String::from_utf8_lossy(&out));
    // The three pages and each host's robots.txt: the server's scope
    // holds them all.
    assert_eq!(registry.scope_stats("ip:127.0.0.1").unwrap().sent, 5);
    let times: Vec<Instant> = arrivals.lock().unwrap().iter().map(|arrival| arrival.2).collect();
    assert_eq!(times.len(), 5);
    for pair in times.windows(2) {
        let gap = pair[1] - pair[0];
        // The site thread's clock: a little late or early, never 10 ms.
        assert!(gap >= Duration::from_millis(140), "arrivals {gap:?} apart");
    }
}

/// A figure printed to 0.1 ms, in whole tenths of a millisecond.
fn tenths(millis: &Value) -> i64 {
    (millis.as_f64().expect("a number of milliseconds") * 10.0).round() as i64
}

/// The `waited` object: the breakdown of the throttle's wait by cause, from
/// the response's `Waited`. Real time, so only what is certain is checked:
/// a page behind a delay waited at least most of that delay on `delay`,
/// every key is a cause's name, and the throttle's record up to the
/// hand-over fits inside the tool's own `waited_ms` (which starts earlier
/// and ends when the request reaches the client, before the throttle's
/// departure reading ends the hand-over).
#[tokio::test]
async fn a_request_held_by_a_delay_shows_it_in_its_waited_object() {
    const DELAY_MS: f64 = 300.0;
    let arrivals = Arrivals::default();
    let port = start_sites(arrivals.clone()).await;
    let config = write_config(
        "waited.toml",
        r#"
[default_scope]
concurrency = 4
delay = 0
delay_per_slot = 0
jitter = 0

[scopes."a.test"]
delay = "300ms"
"#,
    );
    let registry = tool::load_registry(&config).unwrap();
    std::fs::remove_file(&config).unwrap();
    let urls = [
        format!("http://a.test:{port}/page/0"),
        format!("http://a.test:{port}/page/1"),
        // Nothing listens on port 1: no response, so no record.
        "http://refused.test:1/".to_owned(),
    ];
    let options = tool::Options {
        retries: 0,
        progress_every: 0,
        ..tool::Options::default()
    };
    let (mut out, mut progress) = (Vec::new(), Vec::new());
    tool::run(
        registry,
        support::loopback_client(),
        urls.clone(),
        &options,
        &mut out,
        &mut progress,
    )
    .await
    .unwrap();
    let lines: HashMap<String, Value> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|line| {
            let json: Value = serde_json::from_str(line).unwrap();
            (json["url"].as_str().unwrap().to_owned(), json)
        })
        .collect();

    let names = [
        "queue",
        "global_concurrency",
        "lanes",
        "delay",
        "quota",
        "hold",
        "pacing",
        "departure",
        "other_scope",
        "store",
        "hand_over",
        "robots",
    ];
    // Both pages waited for robots.txt's send, 300 ms apart from it and from
    // each other: the later one to go at least a whole delay after the
    // first page was sent, on the scope's delay.
    let mut pages: Vec<&Value> = urls[..2].iter().map(|url| &lines[url]).collect();
    pages.sort_by(|a, b| {
        a["waited_ms"]
            .as_f64()
            .unwrap()
            .total_cmp(&b["waited_ms"].as_f64().unwrap())
    });
    for line in &pages {
        assert_eq!(line["status"], 200, "{line}");
        let waited = line["waited"].as_object().expect("an object of causes");
        for (cause, millis) in waited {
            assert!(names.contains(&cause.as_str()), "{cause} is a cause: {line}");
            // Rounded to 0.1 ms: a short hand-over can read 0.0.
            assert!(millis.as_f64().unwrap() >= 0.0, "{line}");
        }
        // The record up to the hand-over fits in the tool's stopwatch,
        // which starts before the throttle's `poll_ready` and stops when
        // the request reaches the client. The hand-over itself is left
        // out: it ends at the throttle's departure reading, taken after
        // the client's first poll, so after the tool's stamp (a CI run
        // had 0.3 ms more in all than the stopwatch).
        // Each figure is rounded to 0.1 ms, so each is off by at most half a
        // tenth: counted in whole tenths (floats would add their own error
        // at the bound), the parts' sum may exceed the stopwatch by half a
        // tenth per figure, the stopwatch's own included.
        let before_hand_over: Vec<i64> = waited
            .iter()
            .filter(|(cause, _)| cause.as_str() != "hand_over")
            .map(|(_, millis)| tenths(millis))
            .collect();
        let sum: i64 = before_hand_over.iter().sum();
        let stopwatch = tenths(&line["waited_ms"]);
        assert!(
            2 * sum <= 2 * stopwatch + (before_hand_over.len() as i64 + 1),
            "the throttle's record up to the hand-over within the tool's stopwatch: {line}"
        );
    }
    let last = pages[1];
    let delay = last["waited"]["delay"].as_f64().expect("a delay key");
    assert!(delay >= 0.9 * DELAY_MS, "{last}");
    let refused = &lines["http://refused.test:1/"];
    assert!(refused.get("error").is_some(), "{refused}");
    assert_eq!(refused["waited"], Value::Null, "no response, no record");
}

#[tokio::test]
async fn a_url_past_its_bound_is_not_sent_and_its_line_gives_the_predicted_wait() {
    let arrivals = Arrivals::default();
    let port = start_sites(arrivals.clone()).await;
    let config = write_config("held.toml", CONFIG);
    let registry = tool::load_registry(&config).unwrap();
    std::fs::remove_file(&config).unwrap();
    // The first answer holds a.test for an hour; the second URL, queued
    // behind it with a 2 s bound, fails once the hold makes its wait an hour.
    let urls = vec![
        format!("http://a.test:{port}/held/0"),
        format!("http://a.test:{port}/held/1"),
    ];
    let options = tool::Options {
        retries: 0,
        max_wait: Some(Duration::from_secs(2)),
        ..tool::Options::default()
    };
    let (mut out, mut progress) = (Vec::new(), Vec::new());
    let summary = tool::run(
        registry,
        support::loopback_client(),
        urls,
        &options,
        &mut out,
        &mut progress,
    )
    .await
    .unwrap();
    assert_eq!((summary.other_status, summary.errors), (1, 1));
    let lines: HashMap<String, Value> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|line| {
            let json: Value = serde_json::from_str(line).unwrap();
            (json["url"].as_str().unwrap().to_owned(), json)
        })
        .collect();
    let held = &lines[&format!("http://a.test:{port}/held/0")];
    assert_eq!(held["status"], 429);
    assert!(held.get("retry_after_ms").is_none());
    let refused = &lines[&format!("http://a.test:{port}/held/1")];
    assert!(
        refused["error"].as_str().unwrap().contains("past its bound"),
        "{refused}"
    );
    let retry_after = refused["retry_after_ms"].as_f64().unwrap();
    assert!(
        (3_599_000.0..=3_600_000.0).contains(&retry_after),
        "{retry_after}"
    );
    assert_eq!(refused["attempts"], 0);
    let pages: Vec<String> = arrivals
        .lock()
        .unwrap()
        .iter()
        .map(|(_, path, _)| path.clone())
        .filter(|path| path.starts_with("/held/"))
        .collect();
    assert_eq!(pages, ["/held/0"]);
}
