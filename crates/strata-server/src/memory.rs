//! The process's memory limit (`maxmemory`, Redis's name). RocksDB's memtables and block
//! cache have fixed budgets carved out of it at start-up; DRAM's budget is what remains, and
//! this module's task keeps the whole process within the limit as it runs: it reads the
//! process's anonymous resident memory (`RssAnon`: heap, buffers, caches; not the file pages
//! RocksDB maps) and lowers DRAM's budget by what the process holds above the limit, or
//! raises it back (to at most `hot_bytes_max`) while there is room. What DRAM gives up stays
//! in the warm tier, so a lower budget costs hit rate, never data; write-back's share
//! follows DRAM's budget, so writes slow to RocksDB's pace before memory runs out.

use std::sync::Arc;
use std::time::Duration;

use crate::shared::Shared;

/// How often the task looks.
const PERIOD: Duration = Duration::from_millis(100);
/// DRAM's budget falls once the process holds more than the limit less this share of it:
/// a burst of writes between two readings then overshoots into the margin, not past the
/// limit (jemalloc's size classes round a 1 KiB value up to 1280 bytes, so the process
/// holds more per budgeted byte than the budget says).
const AIM_BELOW_FRACTION: f64 = 0.04;
/// DRAM's budget grows back only while the process holds less than the limit by this share
/// of it (so the budget does not swing around the limit).
const HEADROOM_FRACTION: f64 = 0.09;
/// DRAM's budget never goes below this share of `hot_bytes_max`: past that, what holds the
/// memory is not DRAM, and emptying it would not help.
const FLOOR_FRACTION: u64 = 8;

/// The allocator the binary chose: its name (`INFO`'s `mem_allocator`) and how it hands
/// freed memory back to the system when DRAM's budget falls. Set once by the binary;
/// unset, glibc's `malloc` and its `malloc_trim`.
pub struct Allocator {
    pub name: String,
    pub release: fn(),
}

static ALLOCATOR: std::sync::OnceLock<Allocator> = std::sync::OnceLock::new();

/// Names the process's allocator (see [`Allocator`]); the first call wins.
pub fn set_allocator(allocator: Allocator) {
    let _ = ALLOCATOR.set(allocator);
}

/// The allocator's name, as `INFO` reports it.
pub(crate) fn allocator_name() -> &'static str {
    ALLOCATOR.get().map_or("libc", |a| a.name.as_str())
}

/// Hands what the process freed back to the system, so `RssAnon` falls with it.
fn release_freed() {
    if let Some(a) = ALLOCATOR.get() {
        return (a.release)();
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap pages; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Anonymous resident memory of this process, in bytes (0 where `/proc` cannot tell).
pub(crate) fn rss_anon_bytes() -> u64 {
    rss_anon_in("/proc/self/status")
}

/// Anonymous resident memory (heap and other private buffers) of process `pid`, in bytes
/// (0 where `/proc` cannot tell). File-backed pages are left out: Strata reads RocksDB's
/// files through mmap, so the page cache it touches would otherwise count as its memory.
pub fn rss_anon_bytes_of(pid: u32) -> u64 {
    rss_anon_in(&format!("/proc/{pid}/status"))
}

/// The `RssAnon` line of the status file at `path`, in bytes.
fn rss_anon_in(path: &str) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("RssAnon:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// DRAM's next budget: `budget` now, the process at `rss` bytes, the limit `limit`, and
/// DRAM's budget at most `cap`.
pub(crate) fn next_budget(budget: u64, rss: u64, limit: u64, cap: u64) -> u64 {
    let floor = cap / FLOOR_FRACTION;
    let high = limit - (limit as f64 * AIM_BELOW_FRACTION) as u64;
    if rss > high {
        return budget.saturating_sub(rss - high).max(floor);
    }
    let target = limit - (limit as f64 * HEADROOM_FRACTION) as u64;
    if rss < target {
        // Half of the room at a time: what DRAM takes shows up in the next reading.
        return (budget + (target - rss) / 2).min(cap);
    }
    budget.min(cap)
}

/// DRAM's largest budget under `limit`: what the process's other shares, fixed at start
/// (`start_limit` less DRAM's budget then, `start_cap`; none known without a limit at
/// start), leave of it, at most `start_cap` and at least an eighth of the limit.
pub(crate) fn budget_cap(limit: u64, start_limit: u64, start_cap: u64) -> u64 {
    let fixed = start_limit.saturating_sub(start_cap);
    limit.saturating_sub(fixed).max(limit / 8).min(start_cap)
}

/// Runs until shutdown, keeping the process within `maxmemory` as it stands (`CONFIG SET`
/// changes it at run time): DRAM's budget is at most [`budget_cap`], and back at
/// `hot_bytes_max` as the server started while there is no limit.
pub(crate) async fn govern(shared: Arc<Shared>) {
    let start_cap = shared.engine.settings().hot.hot_bytes_max;
    let start_limit = shared.cfg.read().maxmemory;
    let mut stop = shared.shutdown.subscribe();
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tick.tick() => {}
        }
        let limit = shared.cfg.read().maxmemory;
        let budget = shared.engine.hot_bytes_max();
        let next = match limit {
            0 => start_cap,
            _ => {
                let cap = budget_cap(limit, start_limit, start_cap);
                next_budget(budget, rss_anon_bytes(), limit, cap)
            }
        };
        if next != budget {
            shared.engine.set_hot_bytes_max(next);
        }
        if next < budget {
            // What DRAM let go goes back to the operating system now: allocators keep
            // freed pages a while otherwise, and the reading would not fall.
            release_freed();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_falls_by_the_excess_and_grows_back_with_room() {
        let (limit, cap) = (1000, 800);
        // Over the aim (960) by 140: the budget gives up 140.
        assert_eq!(next_budget(600, 1100, limit, cap), 460);
        assert_eq!(next_budget(600, 970, limit, cap), 590);
        // Never below the floor.
        assert_eq!(next_budget(150, 2000, limit, cap), 100);
        // Between the headroom (910) and the aim: unchanged.
        assert_eq!(next_budget(600, 930, limit, cap), 600);
        // Room: half of it, up to the cap.
        assert_eq!(next_budget(600, 750, limit, cap), 680);
        assert_eq!(next_budget(790, 0, limit, cap), 800);
        // A budget above a lowered cap comes down to it at once.
        assert_eq!(next_budget(900, 930, limit, cap), 800);
    }

    #[test]
    fn a_limit_set_at_run_time_leaves_the_start_shares_and_caps_dram() {
        // Started at 384 with DRAM at 264: the other shares hold 120.
        assert_eq!(budget_cap(256, 384, 264), 136);
        assert_eq!(
            budget_cap(1024, 384, 264),
            264,
            "never past the start budget"
        );
        assert_eq!(
            budget_cap(128, 384, 264),
            16,
            "at least an eighth of the limit"
        );
        // Started with no limit: none of it is known to be taken.
        assert_eq!(budget_cap(256, 0, 1024), 256);
    }
}
