//! A `tracing` subscriber at DEBUG is an observer: a busy plain scope
//! admits on its lock-free word with a subscriber as without one, at the
//! same instants, and the word logs its sends.
//!
//! A file of its own: tracing caches whether a callsite is enabled across
//! threads, and a subscriber set for one test thread is seen reliably only
//! while no other test runs the same callsites at once.

use std::convert::Infallible;
use std::time::Duration;

use tokio::time::Instant;
use tower::{Service, ServiceExt};
use tower_throttle::{Registry, ScopeConfig};

mod support;
use support::Calls;

/// A request's label in the calls its client records: its path.
fn path(uri: &http::Uri) -> String {
    uri.path().to_owned()
}

fn registry() -> Registry {
    Registry::builder()
        .max_concurrency(16)
        .default_scope(
            ScopeConfig::default()
                .concurrency(2)
                .delay(Duration::ZERO)
                .delay_per_slot(Duration::ZERO)
                .jitter(0.0),
        )
        .lock_free_plain_scopes(true)
        .build()
        .unwrap()
}

fn get(uri: &str) -> http::Request<()> {
    http::Request::get(uri).body(()).unwrap()
}

/// Sends `uri` through `client` in a task of its own.
fn spawn<S, B>(client: &S, uri: &str) -> tokio::task::JoinHandle<()>
where
    S: Service<http::Request<()>, Response = http::Response<B>, Error = Infallible> + Clone + Send + 'static,
    B: Send + 'static,
    S::Future: Send,
{
    let client = client.clone();
    let request = get(uri);
    tokio::spawn(async move {
        client.oneshot(request).await.unwrap();
    })
}

/// The calls the inner service got, but the warm-up's.
fn calls_of(calls: &Calls) -> Vec<(String, Duration)> {
    calls
        .lock()
        .unwrap()
        .iter()
        .filter(|(path, _)| path != "/warm")
        .cloned()
        .collect()
}

/// What a DEBUG subscriber wrote.
#[derive(Clone, Default)]
struct Log(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Requests of one busy plain scope, some at once (a waiter closes the
/// word, which opens again once the scope drains), with a DEBUG subscriber
/// listening or none: the calls, the locks taken after the warm-up (debug
/// builds count them), and what was logged.
async fn listened(debug: bool) -> (Vec<(String, Duration)>, Option<u64>, String) {
    let log = Log::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _listening = debug.then(|| tracing::subscriber::set_default(subscriber));
    let registry = registry();
    let calls = Calls::default();
    let client = support::timed_client(&registry, Instant::now(), &calls, path);
    // Two requests one after the other: the second opens the word.
    for _ in 0..2 {
        client.clone().oneshot(get("http://a.test/warm")).await.unwrap();
    }
    let before = registry.debug_lock_count();
    for round in 0..3u64 {
        let tasks: Vec<_> = (0..3)
            .map(|i| spawn(&client, &format!("http://a.test/{round}-{i}?ms={}", 10 + 7 * i)))
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        for i in 0..2 {
            client
                .clone()
                .oneshot(get(&format!("http://a.test/{round}-one-{i}?ms=5")))
                .await
                .unwrap();
        }
    }
    let locks = before.map(|before| registry.debug_lock_count().unwrap() - before);
    let logged = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    (calls_of(&calls), locks, logged)
}

/// A `tracing` subscriber at DEBUG only listens: the words stay on for it,
/// so the same requests reach the inner service at the same instants,
/// taking the same locks, as with no subscriber; the sends admitted on the
/// word are logged from it.
#[tokio::test(start_paused = true)]
async fn a_debug_subscriber_changes_neither_the_path_nor_the_instants() {
    let (quiet, quiet_locks, _) = listened(false).await;
    let (heard, heard_locks, logged) = listened(true).await;
    assert_eq!(heard, quiet, "the same instants with a DEBUG subscriber");
    assert_eq!(heard_locks, quiet_locks, "the same locks with a DEBUG subscriber");
    assert_eq!(heard.len(), 15);
    let on_word = logged
        .lines()
        .filter(|line| line.contains("request sent") && line.contains("lock_free=true"))
        .count();
    let under_lock = logged
        .lines()
        .filter(|line| line.contains("request sent") && !line.contains("lock_free=true"))
        .count();
    // Every send is logged, some from the word, the others by the
    // scheduler (the warm-up's two, and those after a waiter closed the
    // word).
    assert!(on_word > 0, "no send logged from the word:\n{logged}");
    assert_eq!(on_word + under_lock, 17, "{logged}");
}
