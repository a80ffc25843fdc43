//! The clock commands are timed by (`INFO commandstats`, latency buckets): where the kernel
//! itself keeps time by the CPU's time-stamp counter (x86-64, clocksource `tsc`, which it
//! chooses only when the counter is invariant and in step across CPUs), the counter read
//! directly and scaled to nanoseconds by one calibration against `Instant`; `Instant`
//! elsewhere. A read costs a few nanoseconds instead of a clock call, and a script's
//! `redis.call`s each take two.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long the one calibration watches both clocks.
const CALIBRATION: Duration = Duration::from_millis(10);

/// A moment, in the clock's own units.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tick(u64);

/// What the clock is: the counter with its nanoseconds per tick, or `Instant` counted
/// from a start.
enum Clock {
    Counter(f64),
    Instant(Instant),
}

fn clock() -> &'static Clock {
    static CLOCK: OnceLock<Clock> = OnceLock::new();
    CLOCK.get_or_init(|| calibrate().map_or_else(|| Clock::Instant(Instant::now()), Clock::Counter))
}

/// Chooses the clock now (the first command then does not wait for the calibration).
pub(crate) fn start() {
    clock();
}

#[cfg(target_arch = "x86_64")]
fn counter() -> u64 {
    // SAFETY: `rdtsc` exists on every x86-64 processor and has no preconditions.
    unsafe { std::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
fn counter() -> u64 {
    unreachable!("the counter is chosen only on x86-64")
}

/// Nanoseconds per tick of the time-stamp counter, if the kernel keeps time by it.
fn calibrate() -> Option<f64> {
    if !cfg!(target_arch = "x86_64") {
        return None;
    }
    let source =
        std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
            .ok()?;
    if source.trim() != "tsc" {
        return None;
    }
    let (i0, t0) = (Instant::now(), counter());
    std::thread::sleep(CALIBRATION);
    let (i1, t1) = (Instant::now(), counter());
    let ticks = t1.checked_sub(t0).filter(|&t| t > 0)?;
    Some(i1.duration_since(i0).as_nanos() as f64 / ticks as f64)
}

pub(crate) fn now() -> Tick {
    match clock() {
        Clock::Counter(_) => Tick(counter()),
        Clock::Instant(start) => Tick(start.elapsed().as_nanos() as u64),
    }
}

impl Tick {
    /// The time from `self` to `end` (zero if `end` is earlier).
    pub(crate) fn until(self, end: Tick) -> Duration {
        let d = end.0.saturating_sub(self.0);
        match clock() {
            Clock::Counter(ns_per_tick) => Duration::from_nanos((d as f64 * ns_per_tick) as u64),
            Clock::Instant(_) => Duration::from_nanos(d),
        }
    }

    pub(crate) fn elapsed(self) -> Duration {
        self.until(now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_agrees_with_instant() {
        start();
        let (i0, t0) = (Instant::now(), now());
        std::thread::sleep(Duration::from_millis(30));
        let (t1, i1) = (now(), Instant::now());
        let measured = t0.until(t1).as_secs_f64();
        let real = i1.duration_since(i0).as_secs_f64();
        assert!(
            (measured - real).abs() < real * 0.05 + 0.001,
            "{measured} s against {real} s"
        );
        assert_eq!(t1.until(t0), Duration::ZERO, "an earlier end is no time");
    }
}
