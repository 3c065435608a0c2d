//! Helpers of the bounded-wait tests (`tests/bounded_*.rs`).

use std::time::Duration;

use tower_throttle::scope::MaxWait;
use tower_throttle::ScopeConfig;

use super::get;

pub fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// A GET of `uri` with its own bound.
pub fn bounded(uri: &str, bound: Duration) -> http::Request<()> {
    let mut request = get(uri);
    request.extensions_mut().insert(MaxWait(bound));
    request
}

/// One lane, a 1 s delay without jitter.
pub fn one_lane_one_second() -> ScopeConfig {
    ScopeConfig::default()
        .concurrency(1)
        .delay(ms(1000))
        .delay_per_slot(Duration::ZERO)
        .jitter(0.0)
}

/// Lets every spawned task run until it waits on time.
pub async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}
