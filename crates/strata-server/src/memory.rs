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
const PERIOD: Duration = Duration::from_millis(200);
/// DRAM's budget grows back only while the process holds less than the limit by this share
/// of it (so the budget does not swing around the limit).
const HEADROOM_FRACTION: f64 = 0.05;
/// DRAM's budget never goes below this share of `hot_bytes_max`: past that, what holds the
/// memory is not DRAM, and emptying it would not help.
const FLOOR_FRACTION: u64 = 8;

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
    if rss > limit {
        return budget.saturating_sub(rss - limit).max(floor);
    }
    let target = limit - (limit as f64 * HEADROOM_FRACTION) as u64;
    if rss < target {
        // Half of the room at a time: what DRAM takes shows up in the next reading.
        return (budget + (target - rss) / 2).min(cap);
    }
    budget
}

/// Runs until shutdown, keeping the process within `limit` bytes.
pub(crate) async fn govern(shared: Arc<Shared>, limit: u64) {
    let cap = shared.engine.settings().hot.hot_bytes_max;
    let mut stop = shared.shutdown.subscribe();
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tick.tick() => {}
        }
        let rss = rss_anon_bytes();
        let budget = shared.engine.hot_bytes_max();
        let next = next_budget(budget, rss, limit, cap);
        if next != budget {
            shared.engine.set_hot_bytes_max(next);
        }
        if next < budget {
            // What DRAM let go goes back to the operating system: glibc keeps freed memory
            // in its heap otherwise, and the reading would not fall. (The `strata` binary
            // allocates through jemalloc, which hands freed pages back within a second by
            // itself; this call then finds glibc's heap empty.)
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            // SAFETY: malloc_trim only returns free heap pages; it has no preconditions.
            unsafe {
                libc::malloc_trim(0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_falls_by_the_excess_and_grows_back_with_room() {
        let (limit, cap) = (1000, 800);
        // Over the limit by 100: the budget gives up 100.
        assert_eq!(next_budget(600, 1100, limit, cap), 500);
        // Never below the floor.
        assert_eq!(next_budget(150, 2000, limit, cap), 100);
        // Within the headroom: unchanged.
        assert_eq!(next_budget(600, 980, limit, cap), 600);
        // Room: half of it, up to the cap.
        assert_eq!(next_budget(600, 750, limit, cap), 700);
        assert_eq!(next_budget(790, 0, limit, cap), 800);
    }
}
