//! The fetch tool's flags, parsed by `clap` (derive).

use std::path::PathBuf;

use clap::Parser;

use crate::tool;

/// What the tool prints, after the flags, for `--help`.
const OUTPUT: &str = "\
Output (stdout), one JSON object per URL, in completion order:
  url         the URL as given
  status      the final HTTP status (absent when the request failed)
  error       why the request failed (absent when it got a response)
  bytes       the body's length (null on error)
  latency_ms  from the last attempt's send to the answer (response head or error)
  waited_ms   from the call to the first send: robots.txt, the throttle's queue, holds
  waited      why it waited, in ms by cause, e.g. {\"delay\": 812.0, \"lanes\": 40.0}, as the
              response's record says (tower_throttle::waited); {} when the request went at
              once, null when no response came. Not a split of waited_ms: the record covers
              the last attempt, up to the throttle's hand-over, while waited_ms is the tool's
              own stopwatch up to the first send
  retry_after_ms  with --max-wait, for a URL not sent because its wait was predicted past the
              bound: the predicted wait (absent otherwise)
  attempts    sends made (retries included; 0 when nothing was sent)
  scopes      the throttling scopes of the request

http:// and https:// URLs; https trusts Mozilla's root certificates and those of --ca-cert.
A certificate the roots do not vouch for is an error line, like a refused connection.";

/// Fetch URLs politely through tower-throttle, one JSON line per URL.
#[derive(Debug, Parser)]
#[command(name = "fetch", after_help = OUTPUT, disable_version_flag = true)]
struct Flags {
    /// URLs, one per line (blank lines and lines starting with # skipped);
    /// read from stdin when not given
    #[arg(long, value_name = "FILE")]
    urls: Option<PathBuf>,
    /// The registry's config, TOML (.toml) or JSON (.json); the keys are
    /// those of tower_throttle::config_file (default: the built-in
    /// defaults)
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// User-Agent header, and the name robots.txt groups are matched by
    #[arg(long, value_name = "UA", default_value = "tower-throttle-fetch/0.1")]
    user_agent: String,
    /// Re-sends of backoff responses (429, 503, ...) and failed
    /// connections, each through the throttle again
    #[arg(long, value_name = "N", default_value_t = 3)]
    retries: u32,
    /// A progress line on stderr after every N URLs (0: none)
    #[arg(long, value_name = "N", default_value_t = 10)]
    progress_every: usize,
    /// Extra root certificates for https, in PEM (a private CA, a
    /// self-signed test server); Mozilla's roots are always trusted
    #[arg(long, value_name = "PATH")]
    ca_cert: Option<PathBuf>,
    /// Throttle by server address too: names that resolve to one server
    /// share its scope (ip:203.0.113.7, set by [ip_scopes] in --config),
    /// and each request connects to the address it was throttled for
    #[arg(long)]
    ip_scopes: bool,
    /// The longest a URL may wait for its turn, in seconds: one whose wait
    /// the registry predicts longer (a site held by Retry-After, a long
    /// queue behind a delay) is not sent, and its line gives the predicted
    /// wait (retry_after_ms)
    #[arg(long, value_name = "SECONDS", value_parser = seconds)]
    max_wait: Option<std::time::Duration>,
}

fn seconds(text: &str) -> Result<std::time::Duration, String> {
    let seconds: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    std::time::Duration::try_from_secs_f64(seconds).map_err(|error| error.to_string())
}

/// A run's settings.
#[derive(Debug)]
pub struct Args {
    /// Where the URLs come from (stdin when `None`).
    pub urls: Option<PathBuf>,
    /// The registry's config file, if any.
    pub config: Option<PathBuf>,
    /// Extra root certificates (PEM), if any.
    pub ca_cert: Option<PathBuf>,
    /// The tool's own options.
    pub options: tool::Options,
}

/// What the command line asks for.
#[derive(Debug)]
pub enum Command {
    /// Fetch.
    Run(Args),
    /// Print this help text.
    Help(String),
}

/// Parses the arguments after the program name.
///
/// # Errors
///
/// clap's message, naming the flag and the value at fault.
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Command, String> {
    let with_name = std::iter::once("fetch".to_owned()).chain(args);
    match Flags::try_parse_from(with_name) {
        Ok(flags) => Ok(Command::Run(Args {
            urls: flags.urls,
            config: flags.config,
            ca_cert: flags.ca_cert,
            options: tool::Options {
                user_agent: flags.user_agent,
                retries: flags.retries,
                progress_every: flags.progress_every,
                ip_scopes: flags.ip_scopes,
                max_wait: flags.max_wait,
            },
        })),
        Err(error) if error.kind() == clap::error::ErrorKind::DisplayHelp => {
            Ok(Command::Help(error.to_string()))
        }
        Err(error) => Err(error.to_string()),
    }
}
