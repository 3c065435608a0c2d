//! The SVG timeline: one row per site, one tick per send, the effective
//! delay as a step line, holds shaded, backoff feedback marked, and each
//! page's wait under the ticks, shaded by what it waited on.
//!
//! Written as SVG text: a few hundred shapes on a time axis need no plotting
//! library, and the output stays small and easy to test.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use tower_throttle::waited::WaitCause;

use crate::crawl::{PageWait, Run};
use crate::progress::short;
use crate::summary::{format_duration, source_name};

const WIDTH: f64 = 1100.0;
const LABELS: f64 = 290.0;
const RIGHT: f64 = 30.0;
const TOP: f64 = 56.0;
const ROW: f64 = 60.0;
/// Within a row: the delay line's band and the ticks' band.
const DELAY_TOP: f64 = 8.0;
const DELAY_BOTTOM: f64 = 36.0;
const TICK_TOP: f64 = 40.0;
const TICK_BOTTOM: f64 = 56.0;
/// Within the ticks' band: the pages' waits, drawn under the ticks.
const WAIT_TOP: f64 = 42.0;
const WAIT_BOTTOM: f64 = 54.0;

const SEND_COLOUR: &str = "#1f5fbf";
const ROBOTS_COLOUR: &str = "#2e9e44";
const DELAY_COLOUR: &str = "#222222";
const HOLD_COLOUR: &str = "#f0a030";
const BACKOFF_COLOUR: &str = "#d62728";

/// The fill of each cause of a wait, in the legend's order: light, so the
/// ticks drawn over them stay clear.
const WAIT_COLOURS: [(WaitCause, &str); 12] = [
    (WaitCause::Delay, "#9cc3ec"),
    (WaitCause::Lanes, "#c3a6e0"),
    (WaitCause::Hold, "#f7c27e"),
    (WaitCause::Quota, "#f29a9a"),
    (WaitCause::Pacing, "#8fd3c8"),
    (WaitCause::Departure, "#d4d4d4"),
    (WaitCause::OtherScope, "#e3c7a1"),
    (WaitCause::GlobalConcurrency, "#e7a6cf"),
    (WaitCause::Queue, "#f4e285"),
    (WaitCause::Store, "#b5d98a"),
    (WaitCause::HandOver, "#a8a8a8"),
    (WaitCause::Robots, "#9ed6a5"),
];
/// A cause this demo does not know yet (`WaitCause` is non-exhaustive).
const OTHER_WAIT_COLOUR: &str = "#eeeeee";

fn wait_colour(cause: WaitCause) -> &'static str {
    WAIT_COLOURS
        .iter()
        .find(|(known, _)| *known == cause)
        .map_or(OTHER_WAIT_COLOUR, |(_, colour)| colour)
}

/// Writes the timeline of `run` to `path`, creating its folder.
///
/// # Errors
///
/// When the folder or the file cannot be written.
pub fn write(run: &Run, path: &Path) -> std::io::Result<()> {
    if let Some(folder) = path.parent().filter(|folder| !folder.as_os_str().is_empty()) {
        std::fs::create_dir_all(folder)?;
    }
    std::fs::write(path, svg(run))
}

/// The timeline of `run` as an SVG document.
pub fn svg(run: &Run) -> String {
    let span = run
        .sends
        .iter()
        .map(|send| send.at)
        .max()
        .unwrap_or_default()
        .max(run.elapsed);
    let scale = Scale {
        span: span.as_secs_f64().max(0.001),
        delay_top: delay_scale(run),
    };
    let rows_bottom = TOP + ROW * run.sites.len() as f64;
    let height = rows_bottom + 100.0;

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="{WIDTH}" height="{height}" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{LABELS}" y="22" font-size="15" font-weight="bold">{} sends to {} sites in {:.1} s</text>"#,
        run.sends.len(),
        run.sites.len(),
        run.elapsed.as_secs_f64()
    );
    let _ = writeln!(
        svg,
        r##"<text x="{LABELS}" y="40" fill="#555">as the client handed them to the network, through BackoffRetry, RobotsDelay, Throttle, RetryAfter and Backoff</text>"##
    );
    time_axis(&mut svg, &scale, rows_bottom);
    for site in 0..run.sites.len() {
        row(&mut svg, run, site, &scale);
    }
    legend(&mut svg, &scale, rows_bottom + 52.0);
    wait_legend(&mut svg, run, rows_bottom + 74.0);
    svg.push_str("</svg>\n");
    svg
}

/// Maps seconds to x and delays to a row's band.
struct Scale {
    span: f64,
    delay_top: Duration,
}

impl Scale {
    fn x(&self, at: Duration) -> f64 {
        LABELS + at.as_secs_f64() / self.span * (WIDTH - LABELS - RIGHT)
    }

    fn delay_y(&self, row_top: f64, delay: Duration) -> f64 {
        let fraction = (delay.as_secs_f64() / self.delay_top.as_secs_f64()).min(1.0);
        row_top + DELAY_BOTTOM - fraction * (DELAY_BOTTOM - DELAY_TOP)
    }
}

/// The delay at a row's top: the largest sampled, rounded up to a tenth of a second.
fn delay_scale(run: &Run) -> Duration {
    let largest = run
        .samples
        .iter()
        .flatten()
        .map(|sample| sample.delay)
        .max()
        .unwrap_or_default();
    let tenths = (largest.as_secs_f64() * 10.0).ceil().max(1.0);
    Duration::from_secs_f64(tenths / 10.0)
}

/// Vertical grid lines and labels, one per second or per 2, 5, 10 s.
fn time_axis(svg: &mut String, scale: &Scale, rows_bottom: f64) {
    let step = [1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0]
        .into_iter()
        .find(|step| scale.span / step <= 15.0)
        .unwrap_or(120.0);
    let _ = writeln!(svg, r#"<g class="axis">"#);
    let mut second = 0.0;
    while second <= scale.span + 1e-9 {
        let x = scale.x(Duration::from_secs_f64(second));
        let _ = writeln!(
            svg,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#dddddd"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{second} s</text>"##,
            rows_bottom + 4.0,
            rows_bottom + 18.0
        );
        second += step;
    }
    let _ = writeln!(
        svg,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="end" fill="#555">time since the crawl started</text>"##,
        WIDTH - RIGHT,
        rows_bottom + 34.0
    );
    let _ = writeln!(svg, "</g>");
}

fn row(svg: &mut String, run: &Run, site: usize, scale: &Scale) {
    let top = TOP + ROW * site as f64;
    let host = &run.sites[site].host;
    let _ = writeln!(svg, r#"<g class="row" data-site="{}">"#, escape(host));
    if site % 2 == 1 {
        let _ = writeln!(
            svg,
            r##"<rect x="0" y="{top}" width="{WIDTH}" height="{ROW}" fill="#f4f6fa"/>"##
        );
    }
    let _ = writeln!(
        svg,
        r##"<text x="10" y="{:.1}" font-weight="bold">{}</text><text x="10" y="{:.1}" font-size="10" fill="#555">{}</text>"##,
        top + 26.0,
        escape(short(host)),
        top + 42.0,
        escape(run.sites[site].kind.lesson())
    );
    for (start, end) in run.holds_of(site) {
        let x = scale.x(start);
        let _ = writeln!(
            svg,
            r#"<rect class="hold" x="{x:.1}" y="{top}" width="{:.1}" height="{ROW}" fill="{HOLD_COLOUR}" fill-opacity="0.3"/>"#,
            (scale.x(end) - x).max(1.0)
        );
    }
    let _ = writeln!(
        svg,
        r##"<line x1="{LABELS}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#bbbbbb" stroke-dasharray="3,3"/>"##,
        WIDTH - RIGHT,
        y = top + DELAY_BOTTOM
    );
    delay_line(svg, run, site, scale, top);
    waits(svg, run, site, scale, top);
    for send in run.sends_of(site) {
        let x = scale.x(send.at);
        let colour = if send.robots { ROBOTS_COLOUR } else { SEND_COLOUR };
        let _ = writeln!(
            svg,
            r#"<line class="tick" x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="{colour}" stroke-width="1.5"/>"#,
            top + TICK_TOP,
            top + TICK_BOTTOM
        );
    }
    for (at, count) in run.backoffs_of(site) {
        let x = scale.x(at);
        let _ = writeln!(
            svg,
            r#"<path class="backoff" d="M{:.1},{:.1} h8 l-4,7 z" fill="{BACKOFF_COLOUR}"><title>{count} backoff feedback(s)</title></path>"#,
            x - 4.0,
            top + 1.0
        );
    }
    let _ = writeln!(svg, "</g>");
}

/// The effective delay as a step line over the row's samples.
fn delay_line(svg: &mut String, run: &Run, site: usize, scale: &Scale, top: f64) {
    let samples = &run.samples[site];
    let Some(first) = samples.first() else {
        return;
    };
    let mut path = format!("M{:.1},{:.1}", scale.x(first.at), scale.delay_y(top, first.delay));
    for sample in &samples[1..] {
        let _ = write!(
            path,
            " H{:.1} V{:.1}",
            scale.x(sample.at),
            scale.delay_y(top, sample.delay)
        );
    }
    let _ = write!(path, " H{:.1}", scale.x(run.elapsed));
    let _ = writeln!(
        svg,
        r#"<path class="delay" d="{path}" fill="none" stroke="{DELAY_COLOUR}" stroke-width="1.2"/>"#
    );
}

/// Each page's wait as a bar that ends at the page's last send, as long as
/// the wait its response recorded, split into consecutive sub-bars, one per
/// part of the record (a cause and the source of its limit), each as wide
/// as its share of the wait and filled with its cause's colour.
///
/// The sub-bars follow `Waited::causes()`: the order in which the causes
/// *first held* the page, each with all of its time. That is not an exact
/// timeline: a cause that held the page twice (lanes, then the delay, then
/// lanes again) is drawn once, its times added up, where it first held it.
///
/// Pages that wait at the same time overlap; the one sent first is drawn
/// on top, so at each instant the band shows the wait of the next page to
/// go.
fn waits(svg: &mut String, run: &Run, site: usize, scale: &Scale, top: f64) {
    let mut waits: Vec<&PageWait> = run
        .waits_of(site)
        .filter(|wait| !wait.waited.total().is_zero())
        .collect();
    waits.sort_by_key(|wait| std::cmp::Reverse(wait.sent));
    for wait in waits {
        let total = wait.waited.total();
        let start = scale.x(wait.sent.saturating_sub(total));
        let width = scale.x(wait.sent) - start;
        let parts: Vec<String> = wait
            .waited
            .causes()
            .map(|(cause, source, time)| match source {
                Some(source) => format!("{cause} ({}) {}", source_name(source), part_duration(time)),
                None => format!("{cause} {}", part_duration(time)),
            })
            .collect();
        let _ = writeln!(
            svg,
            r#"<g class="wait"><title>waited {}: {}</title>"#,
            part_duration(total),
            escape(&parts.join(", "))
        );
        let mut x = start;
        for (cause, _, time) in wait.waited.causes() {
            let part = width * time.as_secs_f64() / total.as_secs_f64();
            let _ = writeln!(
                svg,
                r#"<rect class="wait-part" data-cause="{}" x="{x:.2}" y="{:.1}" width="{part:.2}" height="{:.1}" fill="{}"/>"#,
                cause,
                top + WAIT_TOP,
                WAIT_BOTTOM - WAIT_TOP,
                wait_colour(cause)
            );
            x += part;
        }
        let _ = writeln!(svg, "</g>");
    }
}

/// A wait or a part of one: `0.4 ms` below 10 ms (a hand-over is that
/// short), else as [`format_duration`].
fn part_duration(time: Duration) -> String {
    if time < Duration::from_millis(10) {
        format!("{:.1} ms", time.as_secs_f64() * 1e3)
    } else {
        format_duration(time)
    }
}

/// The wait bars' legend: a swatch per cause that some page waited on.
fn wait_legend(svg: &mut String, run: &Run, y: f64) {
    let mut causes: Vec<WaitCause> = Vec::new();
    for (cause, _, _) in run.waits.iter().flat_map(|wait| wait.waited.causes()) {
        if !causes.contains(&cause) {
            causes.push(cause);
        }
    }
    let rank = |cause: &WaitCause| {
        WAIT_COLOURS
            .iter()
            .position(|(known, _)| known == cause)
            .unwrap_or(WAIT_COLOURS.len())
    };
    causes.sort_by_key(rank);
    let heading = if causes.is_empty() {
        "under the ticks, each page's wait by cause: no page waited"
    } else {
        "under the ticks, each page's wait by cause (in the order they first held it):"
    };
    let _ = writeln!(svg, r#"<text x="10" y="{y:.1}">{heading}</text>"#);
    let mut x = 10.0 + 6.5 * heading.len() as f64 + 12.0;
    for cause in causes {
        let name = cause.to_string();
        let _ = writeln!(
            svg,
            r#"<g class="wait-legend" data-cause="{name}"><rect x="{x:.1}" y="{:.1}" width="10" height="12" fill="{}"/><text x="{:.1}" y="{y:.1}">{name}</text></g>"#,
            y - 10.0,
            wait_colour(cause),
            x + 14.0,
        );
        x += 14.0 + 6.5 * name.len() as f64 + 24.0;
    }
}

fn legend(svg: &mut String, scale: &Scale, y: f64) {
    let delay = format!(
        "effective delay (dashed: 0, row top: {})",
        crate::summary::format_duration(scale.delay_top)
    );
    let entries = [
        (Marker::Send, "a send"),
        (Marker::Robots, "robots.txt"),
        (Marker::Delay, delay.as_str()),
        (Marker::Hold, "hold (Retry-After, quota reset)"),
        (Marker::Backoff, "backoff feedback"),
    ];
    let mut x = 10.0;
    for (marker, text) in entries {
        let _ = writeln!(
            svg,
            r#"{}<text x="{:.1}" y="{y:.1}">{}</text>"#,
            marker.shape(x, y),
            x + 14.0,
            escape(text)
        );
        // About 6.5 px per character at 12 px sans-serif.
        x += 14.0 + 6.5 * text.len() as f64 + 24.0;
    }
}

/// The legend's samples of each mark.
#[derive(Debug, Clone, Copy)]
enum Marker {
    Send,
    Robots,
    Delay,
    Hold,
    Backoff,
}

impl Marker {
    /// The mark drawn left of its text, whose baseline is at `y`.
    fn shape(self, x: f64, y: f64) -> String {
        let tick = |colour: &str| {
            format!(
                r#"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="{colour}" stroke-width="2"/>"#,
                y - 10.0,
                y + 2.0
            )
        };
        match self {
            Marker::Send => tick(SEND_COLOUR),
            Marker::Robots => tick(ROBOTS_COLOUR),
            Marker::Delay => format!(
                r#"<path d="M{:.1},{:.1} h6 v-6 h6" fill="none" stroke="{DELAY_COLOUR}"/>"#,
                x - 2.0,
                y - 2.0
            ),
            Marker::Hold => format!(
                r#"<rect x="{x:.1}" y="{:.1}" width="10" height="12" fill="{HOLD_COLOUR}" fill-opacity="0.3"/>"#,
                y - 10.0
            ),
            Marker::Backoff => format!(
                r#"<path d="M{:.1},{:.1} h8 l-4,7 z" fill="{BACKOFF_COLOUR}"/>"#,
                x + 1.0,
                y - 9.0
            ),
        }
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
