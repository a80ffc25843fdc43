//! The one seam through which the engine reads time, so tests can move it by hand.

use std::sync::atomic::{AtomicU64, Ordering};

/// A source of wall-clock time in Unix milliseconds.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> u64;

    /// [`Clock::now_ms`] as the clock stood at its last tick (up to a few milliseconds
    /// behind, never ahead), for what is judged by the second (when a value was last used):
    /// a read of a word instead of the time-stamp counter.
    fn coarse_ms(&self) -> u64 {
        self.now_ms()
    }
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        // Seconds and milliseconds apart: `as_millis` divides a u128 (a per-command cost).
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() * 1000 + u64::from(d.subsec_millis()))
            .unwrap_or(0)
    }

    fn coarse_ms(&self) -> u64 {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `t` is a valid timespec to write into; the clock id is a constant.
        if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut t) } != 0 {
            return self.now_ms();
        }
        t.tv_sec as u64 * 1000 + t.tv_nsec as u64 / 1_000_000
    }
}

/// A clock that only moves when told to; for deterministic TTL tests.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    pub fn new(start_ms: u64) -> Self {
        ManualClock(AtomicU64::new(start_ms))
    }
    pub fn advance_ms(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
    pub fn set_ms(&self, ms: u64) {
        self.0.store(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The coarse clock is the clock as of its last tick: never ahead, a tick behind at
    /// most (a second allowed here for a thread put off between the two reads).
    #[test]
    fn the_coarse_clock_trails_the_clock() {
        let c = SystemClock;
        for _ in 0..10_000 {
            let coarse = c.coarse_ms();
            let now = c.now_ms();
            assert!(
                coarse <= now && now - coarse < 1000,
                "{coarse} against {now}"
            );
        }
        let m = ManualClock::new(5);
        assert_eq!(m.coarse_ms(), 5, "a manual clock's coarse time is its time");
    }
}
