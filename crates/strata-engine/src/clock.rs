//! The one seam through which the engine reads time, so tests can move it by hand.

use std::sync::atomic::{AtomicU64, Ordering};

/// A source of wall-clock time in Unix milliseconds.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> u64;
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
