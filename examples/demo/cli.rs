//! The demo's flags, parsed by hand: four flags need no parser crate.

use std::path::PathBuf;

/// What `--help` prints.
pub const USAGE: &str = "\
usage: cargo run --release --example demo -- [--sites N] [--requests N] [--output PATH]

Crawls virtual sites on loopback addresses through the whole tower-throttle
stack, shows live progress per site, prints a summary table and writes an
SVG timeline.

  --sites N       sites of each of the 6 kinds (fast, slow, busy, polite, api,
                  tuned), 1 to 40; default 1 (6 sites)
  --requests N    pages per site, 1 to 1000; default 20
  --output PATH   where the SVG timeline goes; default target/demo-timeline.svg
  -h, --help      this text
";

/// The most sites of each kind: 6 kinds × 40 fit on 127.0.0.2–127.0.0.241.
pub const MAX_SITES_PER_KIND: usize = 40;

/// The most pages per site.
pub const MAX_REQUESTS: usize = 1000;

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
    /// Print [`USAGE`].
    Help,
}

/// Parses the arguments after the program name.
///
/// # Errors
///
/// A message naming the flag and the value at fault: an unknown flag, a
/// flag without its value, a number out of range.
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Command, String> {
    let mut options = Options::default();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag.to_owned(), Some(value.to_owned())),
            _ => (arg, None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "--sites" => options.sites_per_kind = number(&flag, &value()?, MAX_SITES_PER_KIND)?,
            "--requests" => options.requests = number(&flag, &value()?, MAX_REQUESTS)?,
            "--output" => options.output = PathBuf::from(value()?),
            _ => return Err(format!("unknown flag {flag:?}")),
        }
    }
    Ok(Command::Run(options))
}

fn number(flag: &str, value: &str, max: usize) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!(
            "{flag} must be a whole number from 1 to {max}, got {value:?}"
        )),
    }
}
