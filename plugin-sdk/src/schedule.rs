//! A fixed-interval schedule for probes that sample (read a file or a map
//! every interval) instead of draining a ring: `drain` waits for the next
//! due time within the host's timeout, so the host's drain loop keeps its
//! pace and a stop is never held up by a long interval.

use std::time::{Duration, Instant};

/// Sleeps for `d` unless a signal comes first: the host signals its drain
/// threads when the run stops, so a probe that waits with `nap` (rather
/// than `std::thread::sleep`, which sleeps out the rest after a signal)
/// stops at once. True when the whole time was slept.
pub fn nap(d: Duration) -> bool {
    if d.is_zero() {
        return true;
    }
    let ts = libc::timespec {
        tv_sec: libc::time_t::try_from(d.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: d.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `ts` is a valid timespec; the remaining time is not wanted.
    unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) == 0 }
}

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
    /// first, or until a signal (see [`nap`]). True when a sample is due
    /// now; the schedule has then moved
    /// on: by one interval after a small delay, or to one interval from now
    /// when it is more than an interval late (no burst of catch-up samples).
    pub fn wait(&mut self, timeout: Duration) -> bool {
        let now = Instant::now();
        if now < self.next_due {
            let wait = self.next_due - now;
            if wait > timeout {
                nap(timeout);
                return false;
            }
            if !nap(wait) && Instant::now() < self.next_due {
                return false;
            }
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
        // A signal cuts a nap short.
        extern "C" fn ignore(_: libc::c_int) {}
        // SAFETY: installs a handler that does nothing for SIGURG (whose
        // default is to be ignored), then signals this thread from another.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = ignore as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigaction(libc::SIGURG, &sa, std::ptr::null_mut());
        }
        // SAFETY: pthread_self has no preconditions.
        let me = unsafe { libc::pthread_self() } as usize;
        let t = Instant::now();
        let waker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            // SAFETY: the test thread is alive: it waits in `nap` below.
            unsafe { libc::pthread_kill(me as libc::pthread_t, libc::SIGURG) };
        });
        let slept = nap(Duration::from_secs(10));
        waker.join().expect("waker");
        assert!(
            !slept && t.elapsed() < Duration::from_secs(5),
            "{:?}",
            t.elapsed()
        );
        assert!(nap(Duration::from_millis(1)));
        // A zero interval is always due.
        let mut every = Schedule::new(Duration::ZERO, Duration::ZERO);
        assert!(every.wait(Duration::ZERO) && every.wait(Duration::ZERO));
    }
}
