//! Snapshots of the registry for users: what each scope's limits are now
//! and which source set them.

use std::borrow::Cow;
use std::time::Duration;

use tokio::time::Instant;

use super::feedback::AnnouncedLimits;
use super::scheduler::{Scheduler, ScopeEntry};
use super::scope_state::{Effective, Manager, OnWord, ScopeState};
use super::LimitSource;
use crate::scope::Scope;
use crate::time::{saturating_add, Stamp};

/// A snapshot of one scope, from [`Registry::scope_stats`](crate::Registry::scope_stats).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ScopeStats {
    /// The scope.
    pub scope: Scope,
    /// Requests sent and not yet answered.
    pub in_flight: u32,
    /// Requests waiting for this scope (and possibly others) to allow them.
    pub queued: usize,
    /// Lanes the scope may use now.
    pub concurrency: u32,
    /// What set [`concurrency`](Self::concurrency).
    pub concurrency_limited_by: LimitSource,
    /// Minimum time between two sends of the scope now (before jitter).
    pub delay: Duration,
    /// What set [`delay`](Self::delay).
    pub delay_limited_by: LimitSource,
    /// Minimum time between two sends on one lane now (before jitter).
    pub delay_per_slot: Duration,
    /// Time left on a hold (Retry-After, rate-limit reset, or the scope's
    /// custom manager), if one is active.
    pub held_for: Option<Duration>,
    /// The name of the [`ScopeManager`](crate::registry::manager::ScopeManager) the scope runs:
    /// `"default"` for the built-in backoff and rampup, the custom
    /// manager's [`name`](crate::registry::manager::ScopeManager::name) once it is made (on
    /// the scope's first feedback), and `"custom (not yet created: no
    /// feedback)"` before that.
    pub manager: Cow<'static, str>,
    /// Requests sent since the scope was first seen.
    pub sent: u64,
    /// Backoff steps in force (0: none).
    pub backoff_level: u32,
    /// The delay backoff contributes now, if backing off.
    pub backoff_delay: Option<Duration>,
    /// Backoff feedbacks received since the scope was first seen.
    pub backoff_feedbacks: u64,
    /// AutoThrottle's delay contribution, when AutoThrottle is on.
    pub autothrottle_delay: Option<Duration>,
    /// The robots.txt Crawl-delay known for the scope.
    pub robots_delay: Option<Duration>,
    /// Whether that Crawl-delay limits the scope: a scope config of its own
    /// keeps the `concurrency` and `delay` it sets, and when it sets both
    /// the Crawl-delay does not apply.
    pub robots_delay_applies: bool,
    /// The pace rampup has set, when rampup is on.
    pub rampup_delay: Option<Duration>,
    /// Rampup windows completed.
    pub rampup_windows: u64,
    /// Moving average of latency (send to response head), once a response
    /// was seen.
    pub latency: Option<Duration>,
    /// Sum of actual costs reported by feedback.
    pub reported_cost: f64,
    /// The delay contributed by pacing to an announced rate-limit policy,
    /// while it applies.
    pub pacing_delay: Option<Duration>,
    /// What the server last announced about its limits.
    pub announced: Option<AnnouncedLimits>,
    /// The scope's quota window, when it has a [quota](crate::ScopeConfig::quota).
    pub quota: Option<QuotaStats>,
    /// What keeps the scope's first waiter from being sent now, when
    /// something does: the quota ([`LimitSource::Quota`]), a hold
    /// ([`LimitSource::Hold`]), busy lanes (the source of
    /// [`concurrency`](Self::concurrency)) or the scope's delay (the source
    /// of [`delay`](Self::delay)). `None` with nobody waiting, or when the
    /// waiter is only held by another of its scopes, a lane's own delay or
    /// the departure or first answer of an earlier request.
    pub held_back_by: Option<LimitSource>,
    /// How long the scope has had nothing in flight or queued (`None`
    /// while it has); an idle scope is evicted after the registry's
    /// `idle_ttl`.
    pub idle_for: Option<Duration>,
    /// The earliest instant the scope's limits would let a request go
    /// (its lanes, gaps, hold and quota window, played forward as
    /// [`Registry::predict`](crate::Registry::predict) does, but with
    /// nobody ahead): now, when a request of it could go at once.
    pub next_send: Instant,
}

/// A scope's quota window, in [`ScopeStats::quota`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct QuotaStats {
    /// Units per window.
    pub quota: f64,
    /// The window's length.
    pub window: Duration,
    /// Units spent in the current window (expected costs at send, corrected
    /// by reported actual costs or remaining quota).
    pub used: f64,
    /// Units left in the current window (0 when overspent).
    pub remaining: f64,
    /// Time until the current window ends and spending starts from zero;
    /// `None` when no window is running (nothing spent yet).
    pub resets_in: Option<Duration>,
}

/// A snapshot of the whole registry, from [`Registry::stats`](crate::Registry::stats).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Stats {
    /// Requests in flight over all scopes.
    pub in_flight: u32,
    /// The global cap on requests in flight.
    pub max_concurrency: u32,
    /// Requests waiting for their scopes.
    pub waiting: usize,
    /// Scopes the registry holds now (idle ones are evicted after
    /// `idle_ttl`, or first past `max_scopes`).
    pub scopes_tracked: usize,
    /// Idle scopes evicted since the registry was built.
    pub evictions: u64,
}

impl Scheduler {
    pub(crate) fn scope_stats(&self, key: &str, now: Instant) -> Option<ScopeStats> {
        let (id, scope) = self.scope_with_id(key)?;
        Some(scope.stats(now, self.max_concurrency(), self.head_cost(id)))
    }

    pub(crate) fn stats(&self) -> Stats {
        Stats {
            in_flight: self.in_flight(),
            max_concurrency: self.max_concurrency(),
            waiting: self.waiting(),
            scopes_tracked: self.scopes_tracked(),
            evictions: self.evictions(),
        }
    }

    pub(crate) fn all_scope_stats(&self, now: Instant) -> Vec<ScopeStats> {
        let max_concurrency = self.max_concurrency();
        let mut scopes: Vec<ScopeStats> = self
            .scopes_with_ids()
            .map(|(id, scope)| scope.stats(now, max_concurrency, self.head_cost(id)))
            .collect();
        scopes.sort_by(|a, b| a.scope.cmp(&b.scope));
        scopes
    }
}

impl ScopeEntry {
    fn stats(&self, now: Instant, max_concurrency: u32, head_cost: f64) -> ScopeStats {
        let mut stats = self.scheduler_stats(now, max_concurrency, head_cost);
        if let Some(fast) = self.open_fast() {
            // What the open word adds: its requests and sends, the latency
            // average it moves, and its last end as the idle instant.
            let in_flight = fast.in_flight();
            stats.in_flight += in_flight;
            stats.sent += fast.sent();
            stats.latency = crate::registry::fast_path::latency_of(fast.latency()).or(stats.latency);
            stats.idle_for = match (in_flight, fast.last_end()) {
                (0, Some(end)) => Some(now.saturating_duration_since(end.instant())),
                (0, None) => stats.idle_for,
                _ => None,
            };
        }
        stats
    }

    /// The stats of what the scheduler itself holds.
    fn scheduler_stats(&self, now: Instant, max_concurrency: u32, head_cost: f64) -> ScopeStats {
        let queued = self.queued();
        let scope = &self.state;
        let effective = scope.effective(now, max_concurrency);
        let contributions = scope.contributions();
        ScopeStats {
            scope: scope.key.clone(),
            in_flight: scope.in_flight,
            queued,
            concurrency: effective.concurrency,
            concurrency_limited_by: effective.concurrency_source,
            delay: effective.delay,
            delay_limited_by: effective.delay_source,
            delay_per_slot: effective.delay_per_slot,
            held_for: contributions
                .hold_until
                .max(effective.manager_hold.map(Stamp::instant))
                .map(|until| until.saturating_duration_since(now))
                .filter(|left| !left.is_zero()),
            manager: Manager::name_in_stats(contributions.manager.as_ref(), &scope.config),
            sent: scope.sent,
            backoff_level: effective.backoff.map_or(0, |backoff| backoff.level),
            backoff_delay: effective.backoff.map(|backoff| backoff.delay),
            backoff_feedbacks: contributions.backoff_feedbacks,
            autothrottle_delay: contributions.autothrottle_delay,
            robots_delay: contributions.robots.map(|robots| robots.crawl_delay),
            robots_delay_applies: contributions.robots.is_some_and(|robots| robots.applies()),
            rampup_delay: contributions.rampup().map(|rampup| rampup.delay),
            rampup_windows: contributions.rampup().map_or(0, |rampup| rampup.windows),
            latency: scope.latency(),
            reported_cost: contributions.reported_cost,
            pacing_delay: contributions
                .pacing
                .filter(|(_, until)| now < *until)
                .map(|(delay, _)| delay),
            announced: contributions.announced.as_deref().cloned(),
            quota: quota_stats(scope, now),
            idle_for: self
                .idle_since()
                .map(|since| now.saturating_duration_since(since)),
            next_send: scope.forecast(now, &effective, (head_cost, 0), OnWord::NONE).at,
            held_back_by: (queued > 0)
                .then(|| held_back_by(scope, &effective, head_cost, now))
                .flatten(),
        }
    }
}

fn quota_stats(scope: &ScopeState, now: Instant) -> Option<QuotaStats> {
    let quota = scope.config.get_quota()?;
    let window = scope.config.get_window();
    let current = scope.current_window(now);
    let used = current.map_or(0.0, |current| current.used);
    Some(QuotaStats {
        quota,
        window,
        used,
        remaining: (quota - used).max(0.0),
        resets_in: current
            .map(|current| saturating_add(current.started, window).saturating_duration_since(now)),
    })
}

/// What keeps a first waiter costing `cost` from going now, in the order
/// a user would look: money, the server's word, lanes, the delay.
fn held_back_by(scope: &ScopeState, effective: &Effective, cost: f64, now: Instant) -> Option<LimitSource> {
    if scope.quota_frees_at(cost, now).is_some() {
        return Some(LimitSource::Quota);
    }
    if scope.contributions().hold_until.is_some_and(|until| until > now) {
        return Some(LimitSource::Hold);
    }
    if effective.manager_hold.is_some_and(|until| until.instant() > now) {
        return Some(LimitSource::Manager);
    }
    if scope.in_flight >= effective.concurrency {
        return Some(effective.concurrency_source);
    }
    scope
        .last_send_blocks(effective, now)
        .then_some(effective.delay_source)
}
