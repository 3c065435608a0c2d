//! The clock as the frontier reads it under its lock: every reading is
//! kept, so an instant at or before the latest one is known to have passed
//! without the clock being read again (it never goes back).

use tokio::time::Instant;

/// The frontier's clock readings (see the [module docs](self)).
#[derive(Debug, Default)]
pub(super) struct Clock {
    latest: Option<Instant>,
}

impl Clock {
    /// Reads the clock.
    pub(super) fn now(&mut self) -> Instant {
        let now = Instant::now();
        self.latest = Some(now);
        now
    }

    /// A reading at or after `at`, if `at` has passed: the latest one when
    /// it shows it, else the clock read now.
    pub(super) fn reached(&mut self, at: Instant) -> Option<Instant> {
        match self.latest {
            Some(latest) if at <= latest => Some(latest),
            _ => Some(self.now()).filter(|&now| at <= now),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn an_instant_passed_is_known_from_the_latest_reading() {
        let mut clock = Clock::default();
        let start = Instant::now();
        assert_eq!(clock.reached(start), Some(start), "read: it has passed");
        let later = start + Duration::from_secs(1);
        assert_eq!(clock.reached(later), None, "not yet");
        tokio::time::advance(Duration::from_secs(2)).await;
        // The latest reading shows `start` passed: no new reading.
        assert_eq!(clock.reached(start), Some(start));
        assert_eq!(clock.reached(later), Some(start + Duration::from_secs(2)));
    }
}
