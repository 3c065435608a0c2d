//! The demo (`examples/demo/`): its crawl, summary table and SVG timeline,
//! run on small `--sites`/`--requests` values.
//!
//! The demo's own modules are compiled in here, so the test runs the code
//! the example runs. The crawl talks to a real hyper server over loopback in
//! real time, so these tests assert counts, order and the SVG's structure,
//! never timings.

#![allow(dead_code, unreachable_pub)]

#[path = "../examples/demo/cli.rs"]
mod cli;
#[path = "../examples/demo/client.rs"]
mod client;
#[path = "../examples/demo/crawl.rs"]
mod crawl;
#[path = "../examples/demo/progress.rs"]
mod progress;
#[path = "../examples/demo/server.rs"]
mod server;
#[path = "../examples/demo/sites.rs"]
mod sites;
#[path = "../examples/demo/summary.rs"]
mod summary;
#[path = "../examples/demo/timeline.rs"]
mod timeline;

use std::path::PathBuf;

use cli::{Command, Options};
use crawl::Run;
use progress::{Mode, Reporter};

fn args(args: &[&str]) -> Vec<String> {
    args.iter().map(|&arg| arg.to_owned()).collect()
}

fn options(args: &[&str]) -> Options {
    match cli::parse(self::args(args)) {
        Ok(Command::Run(options)) => options,
        other => panic!("{args:?} should parse as a run, got {other:?}"),
    }
}

fn temp_svg(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("tower-throttle-{name}-{}.svg", std::process::id()))
}

async fn run_demo(options: &Options) -> Run {
    let sites = sites::sites(options.sites_per_kind);
    // Lines, not bars: the test has no terminal, and its output is captured.
    let reporter = Reporter::new(Mode::Lines, &sites, options.requests);
    let run = crawl::crawl(sites, options.requests, reporter)
        .await
        .expect("the crawl runs");
    timeline::write(&run, &options.output).expect("the timeline is written");
    run
}

/// The elements `<tag class="class">` under `node`.
fn count(node: &roxmltree::Node<'_, '_>, tag: &str, class: &str) -> usize {
    node.descendants()
        .filter(|node| node.has_tag_name(tag) && node.attribute("class") == Some(class))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timeline_has_one_row_per_site_and_one_tick_per_send() {
    let output = temp_svg("timeline");
    let options = options(&[
        "--sites",
        "1",
        "--requests",
        "3",
        "--output",
        output.to_str().unwrap(),
    ]);
    let run = run_demo(&options).await;
    let svg = std::fs::read_to_string(&output).expect("the SVG exists");
    std::fs::remove_file(&output).ok();

    let document = roxmltree::Document::parse(&svg).expect("the timeline is well-formed XML");
    let root = document.root_element();
    assert!(root.has_tag_name(("http://www.w3.org/2000/svg", "svg")));

    let rows: Vec<_> = root
        .descendants()
        .filter(|node| node.has_tag_name("g") && node.attribute("class") == Some("row"))
        .collect();
    let sites = 7 + sites::SHARED_NAMES;
    assert_eq!(
        rows.len(),
        sites,
        "one row per site (7 kinds × 1, and 20 names on one shared server)"
    );
    assert_eq!(run.sites.len(), sites);
    for (index, (row, site)) in rows.iter().zip(&run.sites).enumerate() {
        assert_eq!(
            row.attribute("data-site"),
            Some(site.host.as_str()),
            "rows in site order"
        );
        let ticks = count(row, "line", "tick");
        assert_eq!(
            ticks,
            run.sends_of(index).count(),
            "{}: one tick per send",
            site.host
        );
    }
    let all_ticks = count(&root, "line", "tick");
    assert_eq!(
        all_ticks,
        run.sends.len(),
        "one tick per send, none outside the rows"
    );
    let backoff_marks = count(&root, "path", "backoff");
    let backoff_events: usize = (0..run.sites.len()).map(|site| run.backoffs_of(site).len()).sum();
    assert_eq!(
        backoff_marks, backoff_events,
        "one mark per sampled backoff event"
    );

    // Each page that waited: a bar of one part per cause of its record, in
    // its site's row, shaded by cause, every shade in the legend.
    for (index, (row, site)) in rows.iter().zip(&run.sites).enumerate() {
        let waited: Vec<_> = run
            .waits_of(index)
            .filter(|wait| !wait.waited.total().is_zero())
            .collect();
        assert_eq!(
            count(row, "g", "wait"),
            waited.len(),
            "{}: one bar per page that waited",
            site.host
        );
        assert_eq!(
            count(row, "rect", "wait-part"),
            waited
                .iter()
                .map(|wait| wait.waited.causes().count())
                .sum::<usize>(),
            "{}: one part per cause of each page's record",
            site.host
        );
    }
    // A lane and 250 ms (± 50 %) between sends, and the pages queued at
    // once: each page after the first waits for the one before it, on the
    // delay (the first one too, unless robots.txt took over 125 ms).
    let fast = run
        .sites
        .iter()
        .position(|site| site.kind == sites::Kind::Fast)
        .unwrap();
    let fast_bars = count(&rows[fast], "g", "wait");
    assert!(
        (2..=3).contains(&fast_bars),
        "the fast site's pages waited: {fast_bars}"
    );
    let fast_causes: Vec<&str> = rows[fast]
        .descendants()
        .filter(|node| node.attribute("class") == Some("wait-part"))
        .filter_map(|node| node.attribute("data-cause"))
        .collect();
    assert!(fast_causes.contains(&"delay"), "{fast_causes:?}");

    let mut drawn: Vec<&str> = root
        .descendants()
        .filter(|node| node.attribute("class") == Some("wait-part"))
        .map(|node| {
            assert!(node.attribute("fill").is_some_and(|fill| fill.starts_with('#')));
            node.attribute("data-cause").expect("each part names its cause")
        })
        .collect();
    drawn.sort_unstable();
    drawn.dedup();
    let mut legend: Vec<&str> = root
        .descendants()
        .filter(|node| node.has_tag_name("g") && node.attribute("class") == Some("wait-legend"))
        .map(|node| node.attribute("data-cause").unwrap())
        .collect();
    legend.sort_unstable();
    assert_eq!(legend, drawn, "a legend entry per cause drawn, once");
    assert!(
        svg.contains("each page's wait by cause"),
        "the wait legend's heading"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_site_is_crawled_once_robots_txt_is_known() {
    let output = temp_svg("crawl");
    let options = options(&["--requests", "4", "--output", output.to_str().unwrap()]);
    let run = run_demo(&options).await;
    std::fs::remove_file(&output).ok();

    // Each server on an address of its own; a shared server's names on its.
    let mut servers: Vec<_> = run
        .sites
        .iter()
        .zip(&run.addresses)
        .map(|(site, address)| (site.server, address.ip()))
        .collect();
    servers.sort();
    servers.dedup();
    let mut addresses: Vec<_> = servers.iter().map(|(_, ip)| *ip).collect();
    addresses.dedup();
    assert_eq!(addresses.len(), servers.len(), "each server on its own address");
    assert_eq!(servers.len(), 8, "7 sites and one shared server");
    // The shared server's names together keep its IP scope's gap (the send
    // log stamps hand-overs, which the scope spaces by its delay at least).
    let mut shared: Vec<_> = (0..run.sites.len())
        .filter(|&site| run.sites[site].kind == sites::Kind::Shared)
        .flat_map(|site| run.sends_of(site).map(|send| send.at))
        .collect();
    shared.sort();
    assert_eq!(
        shared.len(),
        sites::SHARED_NAMES * 5,
        "robots.txt and 4 pages per name"
    );
    let closest = shared.windows(2).map(|pair| pair[1] - pair[0]).min().unwrap();
    assert!(
        closest >= sites::SHARED_SERVER_DELAY,
        "two sends to the shared server {closest:?} apart"
    );
    assert!(summary::shared_servers(&run).contains("(20 names, one server): 100 sends"));
    for (index, site) in run.sites.iter().enumerate() {
        let sends: Vec<_> = run.sends_of(index).collect();
        assert!(sends[0].robots, "{}: robots.txt goes first", site.host);
        assert_eq!(
            sends.iter().filter(|send| send.robots).count(),
            1,
            "{}",
            site.host
        );
        assert_eq!(
            run.pages_ok[index], 4,
            "{}: every page answered 2xx in the end",
            site.host
        );
        // A page is sent once, plus a re-send per 429 (at most MAX_RETRIES).
        assert!(
            (5..=17).contains(&sends.len()),
            "{}: {} sends",
            site.host,
            sends.len()
        );
        let stats = run.stats[index].as_ref().expect("the scope is known");
        assert_eq!(
            stats.sent,
            sends.len() as u64,
            "{}: the registry counted every send",
            site.host
        );
    }
    assert!(
        run.sends.windows(2).all(|pair| pair[0].at <= pair[1].at),
        "sends are recorded in order"
    );
    // The moved site's pages answer 301 to the fast site: each hop is a
    // send of the fast site, spaced by its scope like its own pages.
    let site_of = |kind| run.sites.iter().position(|site| site.kind == kind).unwrap();
    let (fast, moved) = (site_of(sites::Kind::Fast), site_of(sites::Kind::Moved));
    assert_eq!(
        run.sends_of(moved).count(),
        1 + 4,
        "moved: robots.txt and 4 pages"
    );
    let fast_sends: Vec<_> = run.sends_of(fast).map(|send| send.at).collect();
    assert_eq!(
        fast_sends.len(),
        1 + 4 + 4,
        "fast: robots.txt, its 4 pages and 4 hops"
    );
    // One lane, 250 ms ± 50 %: no two sends closer than 125 ms.
    let closest = fast_sends.windows(2).map(|pair| pair[1] - pair[0]).min().unwrap();
    assert!(
        closest >= sites::DEFAULT_DELAY / 2,
        "two sends to the fast site {closest:?} apart"
    );

    let table = summary::table(&run);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        lines.len(),
        2 + run.sites.len(),
        "a header, a rule and a row per site:\n{table}"
    );
    assert!(lines[0].ends_with("  waited on"), "the last column: {}", lines[0]);
    for (index, (line, site)) in lines[2..].iter().zip(&run.sites).enumerate() {
        assert!(line.starts_with(&site.host), "{line}");
        assert!(line.contains(" 4/4 "), "{line}");
        // `delay 97%`, or `-` when no page of the site waited.
        let waited_on = match summary::top_wait_cause(&run, index) {
            Some((cause, share)) => {
                assert!(share > 0.0 && share <= 1.0 + 1e-9, "{line}");
                format!(" {cause} {:.0}%", share * 100.0)
            }
            None => " -".to_owned(),
        };
        assert!(line.ends_with(&waited_on), "{waited_on} at the end of {line}");
    }
    // A lane and 250 ms between sends: the fast site's pages waited.
    let fast = run
        .sites
        .iter()
        .position(|site| site.kind == sites::Kind::Fast)
        .unwrap();
    assert!(
        summary::top_wait_cause(&run, fast).is_some(),
        "{}",
        lines[2 + fast]
    );
}

#[test]
fn flags_parse_and_bad_ones_are_named() {
    assert_eq!(cli::parse(args(&[])), Ok(Command::Run(Options::default())));
    for help in ["--help", "-h"] {
        let Ok(Command::Help(text)) = cli::parse(args(&[help])) else {
            panic!("{help} asks for the help text");
        };
        for flag in ["--sites <N>", "--requests <N>", "--output <PATH>", "-h, --help"] {
            assert!(text.contains(flag), "{help}: {flag} in {text}");
        }
        assert!(text.contains("[default: 20]") && text.contains("[default: target/demo-timeline.svg]"));
    }
    let parsed = options(&["--sites=2", "--requests", "7", "--output", "x/y.svg"]);
    assert_eq!(parsed.sites_per_kind, 2);
    assert_eq!(parsed.requests, 7);
    assert_eq!(parsed.output, PathBuf::from("x/y.svg"));

    // clap's messages name the flag, the value and what was expected.
    let error = |list: &[&str]| cli::parse(args(list)).expect_err("a bad command line");
    let zero = error(&["--sites", "0"]);
    assert!(
        zero.contains("'0'") && zero.contains("--sites") && zero.contains("1..=31"),
        "{zero}"
    );
    let many = error(&["--requests", "many"]);
    assert!(many.contains("'many'") && many.contains("--requests"), "{many}");
    let missing = error(&["--output"]);
    assert!(
        missing.contains("--output") && missing.contains("value"),
        "{missing}"
    );
    let unknown = error(&["--fast"]);
    assert!(unknown.contains("'--fast'"), "{unknown}");
    let extra = error(&["extra"]);
    assert!(extra.contains("'extra'"), "{extra}");
    for message in [zero, many, missing, unknown, extra] {
        assert!(message.contains("--help"), "points at the help: {message}");
        assert!(!message.contains('\u{1b}'), "no terminal colours: {message}");
    }
}
