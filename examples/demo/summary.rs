//! The table printed at the end: per site, what was sent, how fast, and
//! what limited it.

use std::fmt::Write as _;
use std::time::Duration;

use tower_throttle::registry::LimitSource;
use tower_throttle::waited::WaitCause;

use crate::crawl::{Run, Sample};

/// A short name for what set a limit.
pub fn source_name(source: LimitSource) -> &'static str {
    match source {
        LimitSource::Config => "config",
        LimitSource::MaxConcurrency => "max_concurrency",
        LimitSource::Backoff => "backoff",
        LimitSource::AutoThrottle => "autothrottle",
        LimitSource::Robots => "robots.txt",
        LimitSource::Rampup => "rampup",
        LimitSource::RateLimitPolicy => "RateLimit",
        LimitSource::Quota => "quota",
        LimitSource::Hold => "hold",
        _ => "other",
    }
}

/// `250 ms`, `1.25 s`.
pub fn format_duration(duration: Duration) -> String {
    if duration < Duration::from_secs(1) {
        format!("{} ms", duration.as_millis())
    } else {
        format!("{:.2} s", duration.as_secs_f64())
    }
}

/// The summary table, one row per site. The lanes and delays are those the
/// samples saw while the site was being crawled; holds are counted from the
/// samples too (a hold shorter than the sampling step can be missed), while
/// backoffs are the registry's own count of feedbacks. "waited on" is the
/// cause the site's pages waited on longest in all (from the records their
/// responses carried) and its share of their whole wait.
pub fn table(run: &Run) -> String {
    let header = [
        "site",
        "address",
        "pages ok",
        "sends",
        "rate/s",
        "lanes",
        "typical delay",
        "peak delay",
        "backoffs",
        "holds",
        "waited on",
    ];
    let rows: Vec<[String; 11]> = (0..run.sites.len()).map(|site| row(run, site)).collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|column| {
            rows.iter()
                .map(|row| row[column].chars().count())
                .chain([header[column].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut table = String::new();
    push_row(&mut table, &widths, header.iter().copied());
    let rule: Vec<String> = widths.iter().map(|&width| "-".repeat(width)).collect();
    push_row(&mut table, &widths, rule.iter().map(String::as_str));
    for row in &rows {
        push_row(&mut table, &widths, row.iter().map(String::as_str));
    }
    table
}

fn push_row<'a>(table: &mut String, widths: &[usize], cells: impl Iterator<Item = &'a str>) {
    let mut line = String::new();
    for (index, (cell, width)) in cells.zip(widths).enumerate() {
        // The site name reads best left-aligned, the figures right-aligned.
        if index == 0 {
            let _ = write!(line, "{cell:<width$}  ");
        } else {
            let _ = write!(line, "{cell:>width$}  ");
        }
    }
    table.push_str(line.trim_end());
    table.push('\n');
}

/// One line per server that several names share: its IP scope's sends in
/// all, their rate, and the share of the server's allowance it is (the
/// names' own scopes together would ask for twice as much).
pub fn shared_servers(run: &Run) -> String {
    let mut lines = String::new();
    let mut servers: Vec<usize> = run.sites.iter().map(|site| site.server).collect();
    servers.sort_unstable();
    servers.dedup();
    for server in servers {
        let names: Vec<usize> = (0..run.sites.len())
            .filter(|&site| run.sites[site].server == server)
            .collect();
        if names.len() < 2 {
            continue;
        }
        let mut sends: Vec<Duration> = names
            .iter()
            .flat_map(|&site| run.sends_of(site).map(|send| send.at))
            .collect();
        sends.sort_unstable();
        let allowance = crate::sites::shared_server_allowance();
        let _ = writeln!(
            lines,
            "{} ({} names, one server): {} sends at {} per second in all, {} of its {allowance:.0}/s allowance",
            crate::sites::ip_scope(&run.addresses[names[0]]),
            names.len(),
            sends.len(),
            achieved_rate(&sends).map_or_else(|| "-".to_owned(), |rate| format!("{rate:.1}")),
            achieved_rate(&sends).map_or_else(
                || "-".to_owned(),
                |rate| format!("{:.0} %", 100.0 * rate / allowance)
            ),
        );
    }
    lines
}

fn row(run: &Run, site: usize) -> [String; 11] {
    let sends: Vec<Duration> = run.sends_of(site).map(|send| send.at).collect();
    let active = match (sends.first(), sends.last()) {
        (Some(&first), Some(&last)) => (first, last),
        _ => (Duration::ZERO, Duration::ZERO),
    };
    let samples: Vec<&Sample> = run.samples[site]
        .iter()
        .filter(|sample| (active.0..=active.1).contains(&sample.at))
        .collect();
    [
        run.sites[site].host.clone(),
        run.addresses[site].ip().to_string(),
        format!("{}/{}", run.pages_ok[site], run.requests),
        sends.len().to_string(),
        achieved_rate(&sends).map_or_else(|| "-".to_owned(), |rate| format!("{rate:.1}")),
        most_frequent(
            samples
                .iter()
                .map(|sample| (sample.concurrency, sample.concurrency_source)),
        )
        .map_or_else(
            || "-".to_owned(),
            |(lanes, source)| format!("{lanes} ({})", source_name(source)),
        ),
        most_common_delay(&samples).map_or_else(|| "-".to_owned(), describe),
        samples
            .iter()
            .max_by_key(|sample| sample.delay)
            .map_or_else(|| "-".to_owned(), |sample| describe(sample)),
        run.stats[site]
            .as_ref()
            .map_or(0, |stats| stats.backoff_feedbacks)
            .to_string(),
        run.holds_of(site).len().to_string(),
        top_wait_cause(run, site).map_or_else(
            || "-".to_owned(),
            |(cause, share)| format!("{cause} {:.0}%", share * 100.0),
        ),
    ]
}

/// The cause site `site`'s pages waited on longest, each cause's time
/// summed over the pages (and over its sources), with its share of the
/// pages' whole wait; `None` when no page waited.
pub fn top_wait_cause(run: &Run, site: usize) -> Option<(WaitCause, f64)> {
    let mut by_cause: Vec<(WaitCause, Duration)> = Vec::new();
    let mut total = Duration::ZERO;
    for wait in run.waits_of(site) {
        total += wait.waited.total();
        for (cause, _, time) in wait.waited.causes() {
            match by_cause.iter_mut().find(|(known, _)| *known == cause) {
                Some((_, sum)) => *sum += time,
                None => by_cause.push((cause, time)),
            }
        }
    }
    // The first seen of equals.
    let (cause, time) = by_cause
        .into_iter()
        .rev()
        .max_by_key(|&(_, time)| time)
        .filter(|&(_, time)| !time.is_zero())?;
    Some((cause, time.as_secs_f64() / total.as_secs_f64()))
}

/// Sends per second between the site's first and last send.
fn achieved_rate(sends: &[Duration]) -> Option<f64> {
    let span = (*sends.last()? - *sends.first()?).as_secs_f64();
    (span > 0.0).then(|| (sends.len() - 1) as f64 / span)
}

/// The source that set the delay in most samples, with the median delay it
/// set (a policy's pace changes with every answer, so no single value repeats).
fn most_common_delay<'a>(samples: &[&'a Sample]) -> Option<&'a Sample> {
    let source = most_frequent(samples.iter().map(|sample| sample.delay_source))?;
    let mut set: Vec<&Sample> = samples
        .iter()
        .copied()
        .filter(|sample| sample.delay_source == source)
        .collect();
    set.sort_by_key(|sample| sample.delay);
    Some(set[set.len() / 2])
}

/// The value that occurs most often (the first of equals).
fn most_frequent<T: PartialEq + Copy>(values: impl Iterator<Item = T>) -> Option<T> {
    let mut counts: Vec<(T, usize)> = Vec::new();
    for value in values {
        match counts.iter_mut().find(|(seen, _)| *seen == value) {
            Some((_, count)) => *count += 1,
            None => counts.push((value, 1)),
        }
    }
    counts
        .into_iter()
        .rev()
        .max_by_key(|&(_, count)| count)
        .map(|(value, _)| value)
}

fn describe(sample: &Sample) -> String {
    format!(
        "{} ({})",
        format_duration(sample.delay),
        source_name(sample.delay_source)
    )
}
