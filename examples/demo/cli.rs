//! The demo's flags, parsed by `clap` (derive).

use std::path::PathBuf;

use clap::Parser;

/// The most sites of each kind: 8 kinds × 31 servers fit on
/// 127.0.0.2–127.0.0.249 (the `shared` names of a server share its address).
pub const MAX_SITES_PER_KIND: usize = 31;

/// The most pages per site.
pub const MAX_REQUESTS: usize = 1000;

/// Crawls virtual sites on loopback addresses through the whole
/// tower-throttle stack, shows live progress per site, prints a summary
/// table and writes an SVG timeline.
#[derive(Debug, Parser)]
#[command(
    name = "demo",
    override_usage = "cargo run --release --example demo -- [--sites N] [--requests N] [--output PATH]",
    disable_version_flag = true
)]
struct Flags {
    /// Sites of each of the 6 kinds (fast, slow, busy, polite, api, tuned),
    /// 1 to 40
    #[arg(long = "sites", value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(1..=MAX_SITES_PER_KIND as u64))]
    sites_per_kind: u64,
    /// Pages per site, 1 to 1000
    #[arg(long, value_name = "N", default_value_t = 20,
          value_parser = clap::value_parser!(u64).range(1..=MAX_REQUESTS as u64))]
    requests: u64,
    /// Where the SVG timeline goes
    #[arg(long, value_name = "PATH", default_value = "target/demo-timeline.svg")]
    output: PathBuf,
}

/// A run's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Sites of each kind.
    pub sites_per_kind: usize,
    /// Pages per site.
    pub requests: usize,
    /// The SVG timeline's path.
    pub output: PathBuf,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            sites_per_kind: 1,
            requests: 20,
            output: PathBuf::from("target/demo-timeline.svg"),
        }
    }
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Run the demo.
    Run(Options),
    /// Print this help text.
    Help(String),
}

/// Parses the arguments after the program name.
///
/// # Errors
///
/// clap's message, naming the flag and the value at fault (an unknown
/// flag, a flag without its value, a number out of range) and the usage.
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Command, String> {
    let with_name = std::iter::once("demo".to_owned()).chain(args);
    match Flags::try_parse_from(with_name) {
        Ok(flags) => Ok(Command::Run(Options {
            sites_per_kind: flags.sites_per_kind as usize,
            requests: flags.requests as usize,
            output: flags.output,
        })),
        Err(error) if error.kind() == clap::error::ErrorKind::DisplayHelp => {
            Ok(Command::Help(error.to_string()))
        }
        Err(error) => Err(error.to_string()),
    }
}
