//! A scope's quota window: what its sends have spent, and whether a cost
//! fits.

use tokio::time::Instant;

use super::{QuotaWindow, ScopeState};
use crate::time::saturating_add;

impl ScopeState {
    /// The current quota window, if the scope has a quota and the window
    /// has not ended.
    pub(crate) fn current_window(&self, now: Instant) -> Option<&QuotaWindow> {
        self.config.get_quota()?;
        let window = self.contributions().quota.as_deref()?;
        (now < saturating_add(window.started, self.config.get_window())).then_some(window)
    }

    /// `None` when a request costing `cost` fits the scope's quota now;
    /// otherwise when the current window ends (and spending restarts from
    /// zero). An empty window takes any cost, so a request costing more
    /// than the whole quota goes at the start of a window, never starves.
    pub(crate) fn quota_frees_at(&self, cost: f64, now: Instant) -> Option<Instant> {
        let quota = self.config.get_quota()?;
        let window = self.current_window(now)?;
        // A small tolerance, so that float sums of exact fractions
        // (0.1 + 0.2 + ...) do not refuse a cost that fits.
        let fits = window.used <= 0.0 || window.used + cost <= quota * (1.0 + 1e-9);
        (!fits).then(|| saturating_add(window.started, self.config.get_window()))
    }

    /// Spends `cost` from the quota window at a send, starting a window if
    /// none is current.
    pub(super) fn spend_quota(&mut self, cost: f64, now: Instant) {
        if self.config.get_quota().is_none() {
            return;
        }
        match self.current_window(now).is_some() {
            true => {
                if let Some(window) = self.contributions_mut().quota.as_deref_mut() {
                    window.used += cost;
                }
            }
            false => {
                self.contributions_mut().quota = Some(Box::new(QuotaWindow {
                    started: now,
                    used: cost,
                }))
            }
        }
    }

    /// Gives back `cost`, spent at `spent_at` by a send that never left,
    /// when it was spent in the current window; a window that send started
    /// and nothing else spent in is dropped, so the next send starts one.
    pub(crate) fn refund_quota(&mut self, cost: f64, spent_at: Instant) {
        let Some(contributed) = self.contributed.as_deref_mut() else {
            return;
        };
        let Some(window) = contributed.quota.as_deref_mut() else {
            return;
        };
        if window.started > spent_at {
            return;
        }
        window.used = (window.used - cost).max(0.0);
        if window.started == spent_at && window.used <= 0.0 {
            contributed.quota = None;
        }
    }
}
