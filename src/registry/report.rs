//! One report per response: what a response (or an error) says about each
//! of its request's scopes, judged against their configs, then applied
//! under one lock of the registry. The backoff and rate-limit layers report
//! through it, and inside a throttle they leave their reports for the lock
//! its completion takes ([`collect`]), so a response costs one lock.

use std::time::Duration;

use tokio::time::Instant;

use super::configs::ConfigsOf;
use super::fast_path::StatusSet;
use super::feedback::{AnnouncedLimits, Feedback};
use super::scheduler::{Scheduler, WakeList};
use super::{Registry, ScopeConfig};
use crate::scope::{Scope, Scopes};
use crate::store::backend::BackoffStep;
use crate::time::saturating_add;

pub(crate) mod collect;

pub(crate) use collect::{Collected, ScopeReports};

/// What one response says about one of its request's scopes: the answer of
/// a [`Registry::report`] judge for that scope. Everything is optional; an
/// empty report changes nothing.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ScopeReport {
    feedback: Option<Feedback>,
    hold: Option<Duration>,
    pacing: Option<(Duration, Instant)>,
    announced: Option<AnnouncedLimits>,
}

impl ScopeReport {
    /// A report that says nothing yet.
    pub(crate) fn new() -> Self {
        ScopeReport::default()
    }

    /// Backoff, success or quota feedback, as [`Registry::feedback`]
    /// applies it.
    #[must_use]
    pub(crate) fn feedback(mut self, feedback: Feedback) -> Self {
        self.feedback = Some(feedback);
        self
    }

    /// A hold from now, as [`Registry::hold`] applies it (capped at the
    /// registry's `max_hold`, never shortening a longer hold).
    #[must_use]
    pub(crate) fn hold(mut self, duration: Duration) -> Self {
        self.hold = Some(duration);
        self
    }

    /// At least `delay` between sends until `until` (the rate-limit
    /// header layer spreading an announced quota).
    #[must_use]
    pub(crate) fn pacing(mut self, delay: Duration, until: Instant) -> Self {
        self.pacing = Some((delay, until));
        self
    }

    /// What the server announced about the scope's limits, for
    /// [`ScopeStats::announced`](super::ScopeStats::announced).
    #[must_use]
    pub(crate) fn announced(mut self, limits: AnnouncedLimits) -> Self {
        self.announced = Some(limits);
        self
    }

    /// Whether the report says nothing.
    pub(crate) fn is_empty(&self) -> bool {
        *self == ScopeReport::default()
    }
}

/// Every status that is a backoff status in some scope's config (codes are
/// 100–599): a response with any other status is success feedback in every
/// scope, which the built-in backoff rule can say without looking at a
/// config, so without taking the registry's lock. Codes are only ever
/// added: a code no config has any more costs a lock, never a wrong answer.
#[derive(Debug)]
pub(crate) struct BackoffStatuses {
    codes: StatusSet,
}

impl BackoffStatuses {
    /// The backoff statuses of `configs`.
    pub(crate) fn of<'a>(configs: impl IntoIterator<Item = &'a ScopeConfig>) -> Self {
        let statuses = BackoffStatuses {
            codes: StatusSet::default(),
        };
        for config in configs {
            statuses.add(config);
        }
        statuses
    }

    /// Adds `config`'s backoff statuses.
    pub(crate) fn add(&self, config: &ScopeConfig) {
        for &code in config.get_backoff().codes() {
            self.codes.add(code);
        }
    }

    /// Whether `status` is a backoff status in some config.
    pub(crate) fn may_contain(&self, status: u16) -> bool {
        self.codes.may_contain(status)
    }
}

/// A fact for the fleet's store, written once the lock is released.
pub(crate) enum SharedWrite {
    Backoff(Scope, Duration, Duration),
    Hold(Scope, Duration),
    /// A backoff feedback of a rampup scope, at this instant, for a
    /// request sent then (when known), for the fleet's search.
    RampupBackoff(Scope, Instant, Option<Instant>),
    /// A backoff feedback of a scope under the built-in backoff, for the
    /// fleet's level.
    BackoffStep(Scope, BackoffStep),
}

impl Registry {
    /// Whether `status` may be a backoff status in one of the registry's
    /// scope configs (if not, it is success in every scope).
    pub(crate) fn may_back_off_on(&self, status: u16) -> bool {
        self.shared.backoff_statuses.may_contain(status)
    }

    /// The configs of `scopes`, in their order, read without the
    /// scheduler's lock (see [`ConfigTable`](super::configs::ConfigTable)).
    pub(crate) fn configs_of(&self, scopes: &Scopes) -> ConfigsOf {
        self.shared.configs.configs_of(scopes)
    }

    /// Applies what one response (or error) says about its request's
    /// `scopes`, all under **one** lock of the registry: `judge` is asked,
    /// scope by scope with that scope's config, for a [`ScopeReport`], and
    /// then every report is applied at once (feedback as
    /// [`feedback`](Self::feedback), then the hold, the pacing and the
    /// announced limits). With a [scope store](crate::store), backoff
    /// delays and holds are written to the store afterwards, in the
    /// background.
    ///
    /// `judge` runs before the lock is taken, with the configs as they are
    /// then (it may call the registry). A response with nothing to say
    /// (every report empty) takes no lock.
    ///
    /// The crate's backoff and rate-limit layers make the same report, but
    /// when they sit inside a [`Throttle`](crate::Throttle) of this
    /// registry they leave it for the lock the throttle takes when the
    /// request ends ([`report_on_completion`](Self::report_on_completion)),
    /// so a response costs one lock however many layers have something to
    /// say. This method applies at once.
    pub(crate) fn report(&self, scopes: &Scopes, judge: impl FnMut(&Scope, &ScopeConfig) -> ScopeReport) {
        let reports = self.judge(scopes, judge);
        if let Some(reports) = reports {
            self.apply_now(scopes, &reports);
        }
    }

    /// [`report`](Self::report), left for the completion of the throttle
    /// of this registry polling on this thread when there is one (see
    /// [`collect`]): what the crate's feedback layers call.
    pub(crate) fn report_on_completion(
        &self,
        scopes: &Scopes,
        judge: impl FnMut(&Scope, &ScopeConfig) -> ScopeReport,
    ) {
        let Some(reports) = self.judge(scopes, judge) else {
            return;
        };
        if let Some(reports) = collect::leave(self.id(), scopes, reports) {
            self.apply_now(scopes, &reports);
        }
    }

    /// `judge`'s report for each of `scopes`; `None` when none says
    /// anything.
    fn judge(
        &self,
        scopes: &Scopes,
        mut judge: impl FnMut(&Scope, &ScopeConfig) -> ScopeReport,
    ) -> Option<ScopeReports> {
        let configs = self.configs_of(scopes);
        let reports: ScopeReports = scopes
            .iter()
            .zip(&configs)
            .map(|((scope, _), config)| judge(scope, config))
            .collect();
        (!reports.iter().all(ScopeReport::is_empty)).then_some(reports)
    }

    /// Applies `reports` (one per scope of `scopes`) under one lock.
    fn apply_now(&self, scopes: &Scopes, reports: &[ScopeReport]) {
        let shared = self.sharing();
        let mut writes = Vec::new();
        self.with_scheduler(|scheduler, now, wake| {
            apply_reports(scheduler, (scopes, reports), shared, (now, wake), &mut writes);
        });
        self.write_shared(writes);
    }

    /// Applies reports left for a throttle's completion that did not come
    /// (its inner future is not done: a layer inside retried), under one
    /// lock.
    pub(crate) fn apply_collected_now(&self, collected: &[Collected]) {
        let mut writes = Vec::new();
        self.with_scheduler(|scheduler, now, wake| {
            self.apply_collected(scheduler, collected, (now, wake), &mut writes);
        });
        self.write_shared(writes);
    }

    /// Applies reports left for a throttle's completion, under the lock
    /// the completion holds; the store writes they call for go to
    /// `writes`, for [`write_shared`](Self::write_shared) once it is
    /// released.
    pub(crate) fn apply_collected(
        &self,
        scheduler: &mut Scheduler,
        collected: &[Collected],
        (now, wake): (Instant, &mut WakeList),
        writes: &mut Vec<SharedWrite>,
    ) {
        let shared = self.sharing();
        for report in collected {
            apply_reports(
                scheduler,
                (&report.scopes, &report.reports),
                shared,
                (now, wake),
                writes,
            );
        }
    }

    /// What reports must write to the store: whether there is one, and
    /// whether its fleet learns together.
    fn sharing(&self) -> Sharing {
        Sharing {
            fleet: self.fleet().is_some(),
            learns: self.fleet().is_some_and(|fleet| fleet.learns),
        }
    }

    /// Writes to the fleet's store, in the background, what reports
    /// applied under the lock called for.
    pub(crate) fn write_shared(&self, writes: Vec<SharedWrite>) {
        let Some(fleet) = self.fleet() else {
            return;
        };
        for write in writes {
            match write {
                SharedWrite::Backoff(scope, delay, left) => {
                    fleet.in_background(fleet.store.backoff(scope, delay, left));
                }
                SharedWrite::Hold(scope, left) => fleet.in_background(fleet.store.hold(scope, left)),
                SharedWrite::RampupBackoff(scope, at, sent) => self.share_rampup_backoff(scope, at, sent),
                SharedWrite::BackoffStep(scope, step) => self.share_backoff_step(scope, step),
            }
        }
    }
}

/// Applies one response's `reports` to its `scopes` (in the same order),
/// under the scheduler's lock; with a store (`shared`), notes in `writes`
/// the backoff delays and holds the fleet must learn.
/// What a registry shares through its store.
#[derive(Debug, Clone, Copy)]
struct Sharing {
    /// It has a store: backoffs and holds.
    fleet: bool,
    /// Its fleet learns together: rampup's backoffs.
    learns: bool,
}

fn apply_reports(
    scheduler: &mut Scheduler,
    (scopes, reports): (&Scopes, &[ScopeReport]),
    shared: Sharing,
    (now, wake): (Instant, &mut WakeList),
    writes: &mut Vec<SharedWrite>,
) {
    for ((scope, expected_cost), report) in scopes.iter().zip(reports) {
        apply_report(
            scheduler,
            (scope, expected_cost, report),
            shared,
            (now, wake),
            writes,
        );
    }
}

/// [`apply_reports`] for one scope.
fn apply_report(
    scheduler: &mut Scheduler,
    (scope, expected_cost, report): (&Scope, f64, &ScopeReport),
    shared: Sharing,
    (now, wake): (Instant, &mut WakeList),
    writes: &mut Vec<SharedWrite>,
) {
    {
        if let Some(feedback) = report.feedback {
            let heard = scheduler
                .config_arc(scope.as_str())
                .manager_kind()
                .hears(&feedback);
            if feedback.says_something() || heard {
                scheduler.feedback(scope, feedback, expected_cost, now, wake);
                let step = (shared.learns && feedback.is_backoff())
                    .then(|| scheduler.backoff_step_terms(scope))
                    .flatten();
                if let Some(step) = step {
                    writes.push(SharedWrite::BackoffStep(scope.clone(), step));
                } else if let (true, true, Some((delay, left))) = (
                    shared.fleet,
                    feedback.is_backoff(),
                    scheduler.backoff_left(scope, now),
                ) {
                    writes.push(SharedWrite::Backoff(scope.clone(), delay, left));
                }
                if shared.learns && feedback.is_backoff() && scheduler.runs_rampup(scope) {
                    let sent = feedback.latency().and_then(|latency| now.checked_sub(latency));
                    writes.push(SharedWrite::RampupBackoff(scope.clone(), now, sent));
                }
            }
        }
        if let Some(hold) = report.hold {
            scheduler.hold(scope, saturating_add(now, hold), now, wake);
            if let (true, Some(left)) = (shared.fleet, scheduler.hold_left(scope, now)) {
                writes.push(SharedWrite::Hold(scope.clone(), left));
            }
        }
        if let Some(pacing) = report.pacing {
            scheduler.set_pacing(scope, Some(pacing), now, wake);
        }
        if let Some(limits) = report.announced.clone() {
            scheduler.set_announced_limits(scope, limits, now);
        }
    }
}
