//! A polite fetch tool: fetches a list of URLs through the whole
//! tower-throttle stack and prints one JSON line per URL.
//!
//! ```text
//! cargo run --example fetch --features serde -- --urls urls.txt --config throttle.toml
//! printf 'http://localhost:8000/a\nhttp://localhost:8000/b\n' | cargo run --example fetch --features serde
//! ```
//!
//! Redirects are followed through the throttle, each hop in the scope of
//! the host it goes to (at most 10; a loop is an error line).
//!
//! Run it with `--help` for the flags. Lines come out in completion order,
//! not input order: a slow site never holds back the lines of a fast one.

mod cli;
mod tool;

use std::io::{self, BufRead, Read};
use std::path::Path;
use std::process::ExitCode;

use tower_throttle::Registry;

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
    // Warnings (a setting that can never take effect, a hold capped) go to
    // `tracing`: print them on stderr (RUST_LOG=debug shows more).
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::builder()
                .with_default_directive(tracing_subscriber::filter::LevelFilter::WARN.into())
                .from_env_lossy(),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = match cli::parse(std::env::args().skip(1)) {
        Ok(cli::Command::Run(args)) => args,
        Ok(cli::Command::Help(help)) => {
            print!("{help}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprint!("{message}");
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
    let client = match tool::web_client(args.ca_cert.as_deref()) {
        Ok(client) => client,
        Err(message) => {
            eprintln!("fetch: {message}");
            return ExitCode::from(2);
        }
    };
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
