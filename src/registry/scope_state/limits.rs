//! A scope's effective limits at an instant: its config (or rampup's or a
//! custom manager's pace), lowered or raised by every contribution, with
//! what set each limit.

use std::time::Duration;

use tokio::time::Instant;

use super::{Effective, LimitSource, ScopeState};
use crate::registry::backoff::BackoffState;
use crate::registry::manager::{BaseLimits, ManagerLimits};
use crate::time::{saturating_add, Jitter, Stamp, MAX_CONFIG_DELAY};

/// A pace that replaces a scope's configured delay, per-slot delay, jitter
/// and concurrency: rampup's, or a custom manager's.
#[derive(Debug, Clone, Copy)]
struct Pace {
    delay: Duration,
    lanes: u32,
    source: LimitSource,
}

impl ScopeState {
    /// The limits without backoff: config, global cap, robots.txt and
    /// AutoThrottle. Backoff steps multiply these.
    pub(super) fn effective_before_backoff(&self, max_concurrency: u32) -> Effective {
        let pace = self.contributions().rampup().map(|rampup| Pace {
            delay: rampup.delay,
            lanes: self.rampup_lanes(rampup.delay),
            source: LimitSource::Rampup,
        });
        self.effective_at_pace(pace, max_concurrency)
    }

    /// The limits without backoff, at `pace` (rampup's, or a custom
    /// manager's) instead of the configured one if given.
    fn effective_at_pace(&self, pace: Option<Pace>, max_concurrency: u32) -> Effective {
        let config = &self.config;
        let mut effective = match pace {
            Some(pace) => Effective {
                concurrency: pace.lanes,
                concurrency_source: pace.source,
                delay: pace.delay,
                delay_source: pace.source,
                delay_per_slot: Duration::ZERO,
                // Rampup paces precisely: the boundary it finds is only
                // worth something if sends keep to it.
                jitter: Jitter::NONE,
                delay_floor: Duration::ZERO,
                backoff: None,
                manager_hold: None,
                review_at: None,
            },
            None => Effective {
                concurrency: config.concurrency,
                concurrency_source: LimitSource::Config,
                delay: config.delay,
                delay_source: LimitSource::Config,
                delay_per_slot: config.delay_per_slot,
                jitter: config.jitter,
                delay_floor: Duration::ZERO,
                backoff: None,
                manager_hold: None,
                review_at: None,
            },
        };
        effective.lower_concurrency(max_concurrency, LimitSource::MaxConcurrency);
        if let Some(robots) = self.contributions().robots {
            if robots.limits_concurrency {
                effective.lower_concurrency(1, LimitSource::Robots);
            }
            if robots.limits_delay {
                effective.raise_delay(robots.crawl_delay, LimitSource::Robots);
                // The site asked for at least this much: jitter may
                // lengthen a gap, never shorten it below the Crawl-delay.
                effective.delay_floor = robots.crawl_delay;
            }
        }
        if let Some(delay) = self.contributions().autothrottle_delay {
            effective.raise_delay(delay, LimitSource::AutoThrottle);
        }
        effective
    }

    /// Reports the backoff steps back that quiet windows earned since last
    /// looked at (recovery is computed lazily, so this is when it is seen),
    /// and drops the backoff state once the scope is back on its limits.
    pub(super) fn note_backoff_recovery(&mut self, now: Instant, max_concurrency: u32) {
        let Some(state) = self.contributions().backoff() else {
            return;
        };
        let base = self.effective_before_backoff(max_concurrency);
        let current = state.at(now, self.config.get_backoff(), base.concurrency);
        let level = current.map_or(0, |current| current.level);
        if level < state.reported_level {
            tracing::debug!(
                target: "tower_throttle",
                scope = %self.key,
                level,
                delay_ms = current.map_or(base.delay, |current| current.delay).as_millis() as u64,
                concurrency = current.map_or(base.concurrency, |current| current.concurrency),
                "backoff step down"
            );
        }
        self.contributions_mut()
            .set_backoff(current.map(|_| BackoffState {
                reported_level: level,
                ..state
            }));
    }

    /// Lanes a rampup scope needs to keep its pace at the observed latency
    /// (at least its configured concurrency).
    fn rampup_lanes(&self, delay: Duration) -> u32 {
        let latency = self.latency().unwrap_or_default().as_secs_f64();
        let needed = (latency / delay.as_secs_f64().max(1e-6)).ceil() + 1.0;
        (needed.min(f64::from(u32::MAX)) as u32).max(self.config.concurrency)
    }

    pub(crate) fn effective(&self, now: Instant, max_concurrency: u32) -> Effective {
        let mut effective = self.effective_before_backoff(max_concurrency);
        let managed = self.contributions().custom().map(|manager| {
            let base = BaseLimits::new(effective.delay, effective.concurrency, self.latency());
            manager.limits(now, &base)
        });
        if let Some((delay, lanes)) = managed.and_then(|limits| limits.get_pace()) {
            let pace = Pace {
                delay: delay.min(MAX_CONFIG_DELAY),
                lanes,
                source: LimitSource::Manager,
            };
            effective = self.effective_at_pace(Some(pace), max_concurrency);
        }
        if let Some((delay, until)) = self.contributions().pacing {
            if now < until {
                effective.raise_delay(delay, LimitSource::RateLimitPolicy);
            }
        }
        if let Some((delay, until)) = self.contributions().fleet_backoff {
            if now < until {
                effective.raise_delay(delay, LimitSource::Fleet);
            }
        }
        let backoff_config = self.config.get_backoff();
        let backoff = self
            .contributions()
            .backoff()
            .and_then(|state| state.at(now, backoff_config, effective.concurrency));
        if let Some(backoff) = backoff {
            effective.raise_delay(backoff.delay, LimitSource::Backoff);
            effective.lower_concurrency(backoff.concurrency, LimitSource::Backoff);
            effective.jitter = backoff_config.jitter;
            effective.backoff = Some(backoff);
        }
        if let Some(limits) = managed {
            apply_manager_limits(&mut effective, &limits, now);
        }
        effective
    }
}

/// Folds a custom manager's answer into the scope's limits.
fn apply_manager_limits(effective: &mut Effective, limits: &ManagerLimits, now: Instant) {
    if let Some(delay) = limits.get_delay() {
        effective.raise_delay(delay.min(MAX_CONFIG_DELAY), LimitSource::Manager);
    }
    if let Some(concurrency) = limits.get_concurrency() {
        effective.lower_concurrency(concurrency, LimitSource::Manager);
    }
    if let Some(until) = limits.get_hold_until() {
        let until = until.min(saturating_add(now, MAX_CONFIG_DELAY));
        effective.manager_hold = Some(Stamp::of(until));
    }
    effective.review_at = limits.get_review_at().map(Stamp::of);
}
