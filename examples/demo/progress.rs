//! Live progress per site: `indicatif` bars on a terminal, a plain line
//! every two seconds otherwise (a log file, CI, a pipe).

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use tower_throttle::ScopeStats;

use crate::sites::Site;
use crate::summary::{format_duration, source_name};

/// How often the plain lines come.
const LINE_EVERY: Duration = Duration::from_secs(2);

/// One site's state at a progress update.
#[derive(Debug)]
pub struct SiteStatus {
    /// Pages answered (in the end, after retries), well or not.
    pub done: usize,
    /// Pages asked.
    pub total: usize,
    /// The site's scope now; `None` before its first request.
    pub stats: Option<ScopeStats>,
}

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One bar per site, redrawn in place (stderr is a terminal).
    Bars,
    /// A plain line on stderr every two seconds.
    Lines,
}

impl Mode {
    /// Bars when stderr is a terminal, plain lines otherwise.
    pub fn for_stderr() -> Mode {
        if std::io::stderr().is_terminal() {
            Mode::Bars
        } else {
            Mode::Lines
        }
    }
}

/// Shows the crawl's progress in the chosen [`Mode`].
#[derive(Debug)]
pub struct Reporter {
    hosts: Vec<String>,
    output: Output,
}

#[derive(Debug)]
enum Output {
    Bars {
        _multi: MultiProgress,
        bars: Vec<ProgressBar>,
    },
    Lines {
        next: Duration,
    },
}

impl Reporter {
    /// A reporter for `sites`, `requests` pages each.
    pub fn new(mode: Mode, sites: &[Site], requests: usize) -> Self {
        let output = match mode {
            Mode::Bars => bars(sites, requests),
            Mode::Lines => Output::Lines { next: Duration::ZERO },
        };
        Reporter {
            hosts: sites.iter().map(|site| site.host.clone()).collect(),
            output,
        }
    }

    /// Shows the sites' state `at` since the crawl started.
    pub fn update(&mut self, at: Duration, statuses: &[SiteStatus]) {
        match &mut self.output {
            Output::Bars { bars, .. } => {
                for (bar, status) in bars.iter().zip(statuses) {
                    bar.set_position(status.done as u64);
                    bar.set_message(limits(status.stats.as_ref()));
                }
            }
            Output::Lines { next } if at >= *next => {
                *next = at + LINE_EVERY;
                let sites: Vec<String> = self
                    .hosts
                    .iter()
                    .zip(statuses)
                    .map(|(host, status)| format!("{} {}/{}", short(host), status.done, status.total))
                    .collect();
                eprintln!("[{:>5.1} s] {}", at.as_secs_f64(), sites.join(", "));
            }
            Output::Lines { .. } => {}
        }
    }

    /// Leaves the bars drawn in their final state.
    pub fn finish(&mut self) {
        if let Output::Bars { bars, .. } = &self.output {
            for bar in bars {
                bar.finish();
            }
            // The cursor stays at the end of the last bar.
            eprintln!();
        }
    }
}

fn bars(sites: &[Site], requests: usize) -> Output {
    let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template("{prefix:>16} [{bar:30}] {pos:>3}/{len:3} {msg}")
        .expect("a valid template")
        .progress_chars("=> ");
    let bars = sites
        .iter()
        .map(|site| {
            let bar = multi.add(ProgressBar::new(requests as u64));
            bar.set_style(style.clone());
            bar.set_prefix(short(&site.host).to_owned());
            bar
        })
        .collect();
    Output::Bars { _multi: multi, bars }
}

/// `fast-1.demo.test` → `fast-1`.
pub fn short(host: &str) -> &str {
    host.split('.').next().unwrap_or(host)
}

fn limits(stats: Option<&ScopeStats>) -> String {
    let Some(stats) = stats else {
        return "waiting".to_owned();
    };
    let delay = format!(
        "delay {} ({})",
        format_duration(stats.delay),
        source_name(stats.delay_limited_by)
    );
    match stats.held_for {
        Some(left) => format!("{delay}, held {}", format_duration(left)),
        None => delay,
    }
}
