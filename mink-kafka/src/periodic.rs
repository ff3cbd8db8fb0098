//! Upkeep that requests bring about, at most once in an interval: forgetting idle
//! producers and idle groups' committed offsets in `meta.db` runs on the request that
//! finds it due, never on more than one request per interval.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Whether a piece of upkeep is due: the first time, then once `interval` has passed
/// since it last was.
#[derive(Debug)]
pub(crate) struct AtMostEvery {
    interval: Duration,
    last: Mutex<Option<Instant>>,
}

impl AtMostEvery {
    pub(crate) const fn new(interval: Duration) -> Self {
        Self {
            interval,
            last: Mutex::new(None),
        }
    }

    /// Whether the upkeep is due; if so, from now on it is not for another interval.
    pub(crate) fn due(&self) -> bool {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let due = last.is_none_or(|at| at.elapsed() >= self.interval);
        if due {
            *last = Some(Instant::now());
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_the_first_time_then_once_an_interval() {
        let upkeep = AtMostEvery::new(Duration::from_millis(50));
        assert!(upkeep.due());
        assert!(!upkeep.due());
        std::thread::sleep(Duration::from_millis(60));
        assert!(upkeep.due());
        assert!(!upkeep.due());
    }
}
