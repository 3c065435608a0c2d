//! A polite fetch tool: fetches a list of URLs through the whole
//! tower-throttle stack and prints one JSON line per URL.
//!
//! ```text
//! cargo run --example fetch --features serde -- --urls urls.txt --config throttle.toml
//! printf 'http://localhost:8000/a\nhttp://localhost:8000/b\n' | cargo run --example fetch --features serde
//! ```
//!
//! Run it with `--help` for the flags. Lines come out in completion order,
//! not input order: a slow site never holds back the lines of a fast one.

mod tool;

use std::io::{self, BufRead, Read};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower_throttle::Registry;

const HELP: &str = "\
fetch: fetch URLs politely through tower-throttle, one JSON line per URL

USAGE:
    fetch [--urls FILE] [--config FILE] [--user-agent UA] [--retries N] [--progress-every N]

OPTIONS:
    --urls FILE           URLs, one per line (blank lines and lines starting with # skipped);
                          read from stdin when not given
    --config FILE         the registry's config, TOML (.toml) or JSON (.json); the keys are those
                          of tower_throttle::config_file (default: the built-in defaults)
    --user-agent UA       User-Agent header, and the name robots.txt groups are matched by
                          (default: tower-throttle-fetch/0.1)
    --retries N           re-sends of backoff responses (429, 503, ...) and failed connections,
                          each through the throttle again (default: 3)
    --progress-every N    a progress line on stderr after every N URLs (default: 10; 0: none)
    -h, --help            this text

OUTPUT (stdout), one JSON object per URL, in completion order:
    url         the URL as given
    status      the final HTTP status (absent when the request failed)
    error       why the request failed (absent when it got a response)
    bytes       the body's length (null on error)
    latency_ms  from the last attempt's send to the answer (response head or error)
    waited_ms   from the call to the first send: robots.txt, the throttle's queue, holds
    attempts    sends made (retries included; 0 when nothing was sent)
    scopes      the throttling scopes of the request

Only http:// URLs: the example's client has no TLS.
";

struct Args {
    urls: Option<PathBuf>,
    config: Option<PathBuf>,
    options: tool::Options,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Option<Args>, String> {
    let mut parsed = Args {
        urls: None,
        config: None,
        options: tool::Options::default(),
    };
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "-h" | "--help" => return Ok(None),
            "--urls" => parsed.urls = Some(value()?.into()),
            "--config" => parsed.config = Some(value()?.into()),
            "--user-agent" => parsed.options.user_agent = value()?,
            "--retries" => parsed.options.retries = number(&flag, &value()?)?,
            "--progress-every" => parsed.options.progress_every = number(&flag, &value()?)?,
            _ => return Err(format!("unknown argument {flag:?} (try --help)")),
        }
    }
    Ok(Some(parsed))
}

fn number<T: std::str::FromStr>(flag: &str, text: &str) -> Result<T, String> {
    text.parse()
        .map_err(|_| format!("{flag} takes a whole number, got {text:?}"))
}

fn read_urls(path: Option<&Path>) -> Result<Vec<String>, String> {
    let mut text = String::new();
    match path {
        Some(path) => {
            text = std::fs::read_to_string(path).map_err(|err| format!("{}: {err}", path.display()))?
        }
        None => {
            io::stdin()
                .lock()
                .read_to_string(&mut text)
                .map_err(|err| format!("reading URLs from stdin: {err}"))?;
        }
    }
    Ok(text.as_bytes().lines().map_while(Result::ok).collect())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(Some(args)) => args,
        Ok(None) => {
            print!("{HELP}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("fetch: {message}");
            return ExitCode::from(2);
        }
    };
    let registry = match args.config.as_deref() {
        Some(path) => tool::load_registry(path),
        None => Ok(Registry::default()),
    };
    let setup = registry.and_then(|registry| Ok((registry, read_urls(args.urls.as_deref())?)));
    let (registry, urls) = match setup {
        Ok(setup) => setup,
        Err(message) => {
            eprintln!("fetch: {message}");
            return ExitCode::from(2);
        }
    };
    let client = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let outcome = tool::run(
        registry,
        client,
        urls,
        &args.options,
        &mut io::stdout().lock(),
        &mut io::stderr().lock(),
    )
    .await;
    match outcome {
        Ok(summary) if summary.errors == 0 => ExitCode::SUCCESS,
        Ok(_) => ExitCode::from(1),
        Err(err) => {
            eprintln!("fetch: writing the output: {err}");
            ExitCode::from(2)
        }
    }
}
