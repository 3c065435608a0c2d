//! The frontier polls the requests it has in the service itself, each with
//! a waker of its own: a request is polled when it is sent and again only
//! when its own future was woken, a future that wakes itself is not polled
//! in a loop, and a request pushed while the frontier hands others over is
//! sent without another wake. Paused virtual time, in-process services.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::Notify;
use tokio::time::Instant;
use tower::Service;
use tower_throttle::frontier::{FrontierBuilder, FrontierHandle};
use tower_throttle::{Registry, ScopeConfig};

/// Delay 0 and lanes to spare: every request may go at once.
fn open_registry() -> Registry {
    Registry::builder()
        .default_scope(
            ScopeConfig::default()
                .concurrency(100)
                .delay(Duration::ZERO)
                .delay_per_slot(Duration::ZERO)
                .jitter(0.0),
        )
        .build()
        .unwrap()
}

fn get(uri: &str) -> http::Request<()> {
    http::Request::get(uri).body(()).unwrap()
}

type Answer = Pin<Box<dyn Future<Output = Result<http::Response<()>, Infallible>> + Send>>;

/// A response future that counts its polls.
struct Counted {
    inner: Answer,
    polls: Arc<AtomicUsize>,
}

impl Future for Counted {
    type Output = Result<http::Response<()>, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.polls.fetch_add(1, Ordering::SeqCst);
        self.inner.as_mut().poll(cx)
    }
}

/// A site whose answer to each request is what `answer` makes of it, its
/// futures' polls counted in `polls`.
#[derive(Clone)]
struct Site<A> {
    answer: A,
    polls: Arc<AtomicUsize>,
}

impl<A: FnMut(&http::Request<()>) -> Answer> Service<http::Request<()>> for Site<A> {
    type Response = http::Response<()>;
    type Error = Infallible;
    type Future = Counted;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<()>) -> Self::Future {
        Counted {
            inner: (self.answer)(&request),
            polls: self.polls.clone(),
        }
    }
}

/// The delay a page's path asks for: `/300` answers after 300 ms.
fn delay_of(request: &http::Request<()>) -> Duration {
    Duration::from_millis(request.uri().path()[1..].parse().unwrap())
}

#[tokio::test(start_paused = true)]
async fn each_request_in_the_service_is_polled_when_sent_and_once_when_woken() {
    let polls = Arc::new(AtomicUsize::new(0));
    let site = Site {
        answer: |request: &http::Request<()>| -> Answer {
            let delay = delay_of(request);
            Box::pin(async move {
                tokio::time::sleep(delay).await;
                Ok(http::Response::new(()))
            })
        },
        polls: polls.clone(),
    };
    let (mut frontier, handle) = FrontierBuilder::new(open_registry())
        .in_flight(3)
        .build(site)
        .unwrap();
    let start = Instant::now();
    for (site, delay) in ["a", "b", "c", "d"].iter().zip([300, 100, 200, 50]) {
        handle
            .push(get(&format!("https://{site}.test/{delay}")))
            .await
            .unwrap();
    }
    drop(handle);
    let mut answered = Vec::new();
    while let Some((uri, response)) = frontier.next().await {
        response.unwrap();
        answered.push((uri.host().unwrap().to_owned(), start.elapsed().as_millis()));
    }
    // Three in the service at once; `d` goes when `b` ends, at 100 ms.
    let expected = [("b.test", 100), ("d.test", 150), ("c.test", 200), ("a.test", 300)];
    let expected: Vec<(String, u128)> = expected.iter().map(|&(host, at)| (host.to_owned(), at)).collect();
    assert_eq!(answered, expected);
    // No future was polled but when sent and when its own timer woke it.
    assert_eq!(polls.load(Ordering::SeqCst), 4 * 2);
}

/// A future that wakes itself and says `Pending` `times` times, then
/// answers.
struct SelfWaking {
    times: usize,
}

impl Future for SelfWaking {
    type Output = Result<http::Response<()>, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.times == 0 {
            return Poll::Ready(Ok(http::Response::new(())));
        }
        self.times -= 1;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[tokio::test(start_paused = true)]
async fn a_future_that_wakes_itself_is_polled_again_in_the_next_poll_not_in_a_loop() {
    let polls = Arc::new(AtomicUsize::new(0));
    let site = Site {
        answer: |_: &http::Request<()>| -> Answer { Box::pin(SelfWaking { times: 3 }) },
        polls: polls.clone(),
    };
    let (mut frontier, handle) = FrontierBuilder::new(open_registry()).build(site).unwrap();
    handle.push(get("https://a.test/")).await.unwrap();
    drop(handle);
    // Each poll of the frontier polls the future once, then yields.
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    for poll in 1..=3 {
        assert!(frontier.poll_next_unpin(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), poll);
    }
    assert!(matches!(frontier.poll_next_unpin(&mut cx), Poll::Ready(Some(_))));
    assert_eq!(polls.load(Ordering::SeqCst), 4);
    assert!(matches!(frontier.poll_next_unpin(&mut cx), Poll::Ready(None)));
}

#[tokio::test(start_paused = true)]
async fn a_request_pushed_while_the_frontier_hands_over_is_sent_without_another_wake() {
    // The first request's answer waits for the second request, which the
    // site pushes while the frontier hands the first over: nothing else
    // wakes the frontier, so it must see the push before it sleeps.
    let handle_slot: Arc<Mutex<Option<FrontierHandle<(), http::Uri>>>> = Arc::default();
    let second_sent = Arc::new(Notify::new());
    let site = Site {
        answer: {
            let handle_slot = handle_slot.clone();
            let second_sent = second_sent.clone();
            move |request: &http::Request<()>| -> Answer {
                if request.uri().path() == "/second" {
                    second_sent.notify_one();
                    return Box::pin(async { Ok(http::Response::new(())) });
                }
                let handle = handle_slot.lock().unwrap().take().unwrap();
                let second = get("https://b.test/second");
                handle
                    .try_push_tagged(second, "https://b.test/second".parse().unwrap())
                    .unwrap();
                let second_sent = second_sent.clone();
                Box::pin(async move {
                    second_sent.notified().await;
                    Ok(http::Response::new(()))
                })
            }
        },
        polls: Arc::default(),
    };
    let (mut frontier, handle) = FrontierBuilder::new(open_registry()).build(site).unwrap();
    *handle_slot.lock().unwrap() = Some(handle.clone());
    handle.push(get("https://a.test/first")).await.unwrap();
    drop(handle);
    // Polled by hand: whenever the frontier says `Pending`, it must have
    // been woken since (nothing else here would ever poll it again).
    let wakes = Arc::new(Wakes::default());
    let waker = std::task::Waker::from(wakes.clone());
    let mut cx = Context::from_waker(&waker);
    let mut answered = Vec::new();
    loop {
        match frontier.poll_next_unpin(&mut cx) {
            Poll::Ready(Some((uri, response))) => {
                response.unwrap();
                answered.push(uri.path().to_owned());
            }
            Poll::Ready(None) => break,
            Poll::Pending => assert!(wakes.take() > 0, "asleep with nothing to wake it: {answered:?}"),
        }
    }
    assert_eq!(answered, ["/second", "/first"]);
}

/// A waker that counts its wakes.
#[derive(Default)]
struct Wakes(AtomicUsize);

impl Wakes {
    fn take(&self) -> usize {
        self.0.swap(0, Ordering::SeqCst)
    }
}

impl std::task::Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}
