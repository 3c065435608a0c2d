//! The tower-throttle demo: virtual sites of different characters, each on
//! its own loopback address, crawled through a hyper-util client wrapped in
//! the whole stack (BackoffRetry → RobotsDelay → Throttle → RetryAfter →
//! Backoff). Live progress per site while it runs, a summary table at the
//! end, and an SVG timeline of every send.
//!
//! ```text
//! cargo run --release --example demo
//! cargo run --release --example demo -- --sites 2 --requests 30 --output /tmp/timeline.svg
//! RUST_LOG=tower_throttle=debug cargo run --release --example demo   # every wait, send and adjustment
//! ```

mod cli;
mod client;
mod crawl;
mod progress;
mod server;
mod sites;
mod summary;
mod timeline;

use std::process::ExitCode;

use crate::cli::{Command, Options};
use crate::crawl::BoxError;
use crate::progress::{Mode, Reporter};

fn main() -> ExitCode {
    let options = match cli::parse(std::env::args().skip(1)) {
        Ok(Command::Run(options)) => options,
        Ok(Command::Help(help)) => {
            print!("{help}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprint!("{message}");
            return ExitCode::from(2);
        }
    };
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
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("demo: cannot start the tokio runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&options)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("demo: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(options: &Options) -> Result<(), BoxError> {
    let sites = sites::sites(options.sites_per_kind);
    println!(
        "Crawling {} pages of each of {} sites, on loopback addresses of their own but the shared ones:",
        options.requests,
        sites.len()
    );
    for kind in sites::Kind::ALL {
        println!("  {:<7} {}", kind.name(), kind.lesson());
    }
    println!();
    let reporter = Reporter::new(Mode::for_stderr(), &sites, options.requests);
    let run = crawl::crawl(sites, options.requests, reporter).await?;

    let pages: usize = run.pages_ok.iter().sum();
    println!(
        "\n{} sends in {:.1} s; {pages} of {} pages answered 2xx in the end.\n",
        run.sends.len(),
        run.elapsed.as_secs_f64(),
        run.requests * run.sites.len()
    );
    print!("{}", summary::table(&run));
    let shared = summary::shared_servers(&run);
    if !shared.is_empty() {
        print!("\n{shared}");
    }
    timeline::write(&run, &options.output)
        .map_err(|error| format!("cannot write {}: {error}", options.output.display()))?;
    println!("\nTimeline: {}", options.output.display());
    Ok(())
}
