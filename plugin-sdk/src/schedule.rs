//! A fixed-interval schedule for probes that sample (read a file or a map
//! every interval) instead of draining a ring: `drain` waits for the next
//! due time within the host's timeout, so the host's drain loop keeps its
//! pace and a stop is never held up by a long interval.

use std::time::{Duration, Instant};

/// When the next sample is due.
#[derive(Debug, Clone)]
pub struct Schedule {
    interval: Duration,
    next_due: Instant,
}

impl Schedule {
    /// A schedule of `interval`, first due `first` from now.
    pub fn new(interval: Duration, first: Duration) -> Self {
        Self {
            interval,
            next_due: Instant::now() + first,
        }
    }

    /// Sleeps until the next sample is due, or for `timeout` if that comes
    /// first. True when a sample is due now; the schedule has then moved
    /// on: by one interval after a small delay, or to one interval from now
    /// when it is more than an interval late (no burst of catch-up samples).
    pub fn wait(&mut self, timeout: Duration) -> bool {
        let now = Instant::now();
        if now < self.next_due {
            let wait = self.next_due - now;
            if wait > timeout {
                std::thread::sleep(timeout);
                return false;
            }
            std::thread::sleep(wait);
        }
        let now = Instant::now();
        self.next_due += self.interval;
        if self.next_due + self.interval < now {
            self.next_due = now + self.interval;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_due_on_schedule_and_a_late_one_starts_again_from_now() {
        let interval = Duration::from_millis(200);
        let mut s = Schedule::new(interval, Duration::ZERO);
        assert!(s.wait(Duration::ZERO), "due at once");
        // The next is 200 ms away: a 1 ms timeout runs out first.
        assert!(!s.wait(Duration::from_millis(1)));
        assert!(s.wait(Duration::from_secs(1)), "due within the timeout");
        // Far behind: due once, then a whole interval later, not at once.
        std::thread::sleep(interval * 3);
        assert!(s.wait(Duration::ZERO));
        assert!(!s.wait(Duration::ZERO), "no catch-up burst");
        // A zero interval is always due.
        let mut every = Schedule::new(Duration::ZERO, Duration::ZERO);
        assert!(every.wait(Duration::ZERO) && every.wait(Duration::ZERO));
    }
}
