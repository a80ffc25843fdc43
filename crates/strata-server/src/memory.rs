//! The process's memory limit (`maxmemory`, Redis's name). [`split`] carves it up: RocksDB's
//! memtables and block cache get their shares (at start-up, and again when `CONFIG SET`
//! changes the limit); DRAM's budget is what remains, and
//! this module's task keeps the whole process within the limit as it runs: it reads the
//! process's anonymous resident memory (`RssAnon`: heap, buffers, caches; not the file pages
//! RocksDB maps) and lowers DRAM's budget by what the process holds above the limit, or
//! raises it back (to at most `hot_bytes_max`) while there is room. What DRAM gives up stays
//! in the warm tier, so a lower budget costs hit rate, never data; write-back's share
//! follows DRAM's budget, so writes slow to RocksDB's pace before memory runs out. When
//! emptying DRAM down to its floor did not bring the process under the limit, the values
//! DRAM kept are moved to fresh allocations ([`should_relocate`]), so the allocator's pages
//! they each pinned can go back to the system.

use std::sync::Arc;
use std::time::Duration;

use strata_engine::MemoryShares;

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
/// While the process holds more than the limit with DRAM's budget at its floor and DRAM
/// within it, DRAM's entries are moved to fresh allocations (at most this often): random
/// evictions leave a few survivors on each of many allocator pages, which then cannot go
/// back to the system.
const RELOCATE_PERIOD: Duration = Duration::from_secs(30);

/// The least memory a limit keeps back for what no budget counts.
const RESERVE_BYTES_MIN: u64 = 32 << 20;

/// How a memory limit is carved up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    /// RocksDB's memtables and block cache.
    pub warm: MemoryShares,
    /// DRAM's budget: what the warm store's shares and a reserve leave.
    pub dram: u64,
}

/// Carves `limit` up: RocksDB's memtables get an eighth and its block cache a sixteenth (or
/// less, as `asked` sets them; memtables 0 asks for no total), a reserve is kept for the
/// rest of the process (the runtime, connection buffers, RocksDB's table readers, the
/// allocator's slack: an eighth, at least [`RESERVE_BYTES_MIN`]), and DRAM's budget is what
/// remains. At [`crate::config::MAXMEMORY_MIN`] that is 20 MiB; past it, more than 5/16 of the limit.
pub fn split(limit: u64, asked: MemoryShares) -> Split {
    let memtables = match asked.memtables_bytes_max {
        0 => limit / 8,
        set => set.min(limit / 8),
    };
    let block_cache = asked.block_cache_bytes.min(limit / 16);
    let reserve = (limit / 8).max(RESERVE_BYTES_MIN);
    Split {
        warm: MemoryShares {
            memtables_bytes_max: memtables,
            block_cache_bytes: block_cache,
        },
        dram: limit.saturating_sub(memtables + block_cache + reserve),
    }
}

/// The allocator the binary chose: its name (`INFO`'s `mem_allocator`), how it hands
/// freed memory back to the system when DRAM's budget falls, and how a thread's cache of
/// freed blocks goes back to the shared pages (so the next allocations fill those pages,
/// not the holes the thread just made). Set once by the binary; unset, glibc's `malloc`
/// and its `malloc_trim`.
pub struct Allocator {
    pub name: String,
    pub release: fn(),
    pub flush_thread_cache: fn(),
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

/// See [`Allocator::flush_thread_cache`].
fn flush_thread_cache() {
    if let Some(a) = ALLOCATOR.get() {
        (a.flush_thread_cache)();
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
    let high = aim(limit);
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

/// The most the process should hold under `limit`: DRAM's budget falls above it.
fn aim(limit: u64) -> u64 {
    limit - (limit as f64 * AIM_BELOW_FRACTION) as u64
}

/// Whether DRAM's entries should move to fresh allocations: the process holds more than
/// `limit` allows though DRAM's budget is at its floor under `cap` and DRAM holds no more
/// than it (`hot_bytes` of `budget`), so what holds the rest is not DRAM's bytes but the
/// pages its survivors keep.
pub(crate) fn should_relocate(rss: u64, limit: u64, budget: u64, cap: u64, hot_bytes: u64) -> bool {
    limit != 0 && rss > aim(limit) && budget <= cap / FLOOR_FRACTION && hot_bytes <= budget
}

/// The shares of the process's memory under `limit` (0: none) as it changes at run time,
/// given what they were at start (`start`; `start_cap` DRAM's budget): the warm store's
/// shares and DRAM's largest budget by [`split`], each at most what it was at start.
pub(crate) fn shares_at(limit: u64, start: MemoryShares, start_cap: u64) -> Split {
    if limit == 0 {
        return Split {
            warm: start,
            dram: start_cap,
        };
    }
    let s = split(limit, start);
    Split {
        dram: s.dram.min(start_cap),
        ..s
    }
}

/// Runs until shutdown, keeping the process within `maxmemory` as it stands (`CONFIG SET`
/// changes it at run time): a new limit gives the warm store its shares by [`shares_at`]
/// at once; DRAM's budget is at most what they leave, and back at `hot_bytes_max` as the
/// server started while there is no limit.
pub(crate) async fn govern(shared: Arc<Shared>) {
    let start_cap = shared.engine.settings().hot.hot_bytes_max;
    let start = shared.engine.warm_memory_shares();
    // The limit the warm store's shares were last set for (at start, by the configuration).
    let mut applied = shared.cfg.read().maxmemory;
    let mut relocated_at: Option<std::time::Instant> = None;
    let mut stop = shared.shutdown.subscribe();
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tick.tick() => {}
        }
        let limit = shared.cfg.read().maxmemory;
        let shares = shares_at(limit, start, start_cap);
        if limit != applied {
            applied = limit;
            if let Err(e) = shared.engine.set_warm_memory_shares(shares.warm) {
                tracing::warn!(error = %e, "the warm store's memory shares could not be changed");
            }
        }
        let budget = shared.engine.hot_bytes_max();
        let next = match limit {
            0 => start_cap,
            _ => next_budget(budget, rss_anon_bytes(), limit, shares.dram),
        };
        if next != budget {
            shared.engine.set_hot_bytes_max(next);
        }
        if next < budget {
            // What DRAM let go goes back to the operating system now: allocators keep
            // freed pages a while otherwise, and the reading would not fall.
            release_freed();
        }
        // (No limit: nothing to relocate for, and no reading to take.)
        let due = limit != 0 && relocated_at.is_none_or(|t| t.elapsed() >= RELOCATE_PERIOD);
        let rss = if due { rss_anon_bytes() } else { 0 };
        if due && should_relocate(rss, limit, next, shares.dram, shared.engine.hot_bytes()) {
            relocated_at = Some(std::time::Instant::now());
            let engine = shared.engine.clone();
            let moved = tokio::task::spawn_blocking(move || {
                let moved = engine.relocate_hot(&flush_thread_cache);
                release_freed();
                moved
            })
            .await
            .unwrap_or(0);
            let after = rss_anon_bytes();
            tracing::info!(
                moved,
                rss_before = rss,
                rss_after = after,
                "DRAM's entries relocated"
            );
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

    const M: u64 = 1 << 20;

    fn shares(memtables: u64, cache: u64) -> MemoryShares {
        MemoryShares {
            memtables_bytes_max: memtables * M,
            block_cache_bytes: cache * M,
        }
    }

    #[test]
    fn dram_relocates_only_when_it_cannot_shrink_and_the_process_is_over() {
        let (limit, cap) = (1000, 800);
        // Over the aim (960), budget at the floor (100), DRAM within it: relocate.
        assert!(should_relocate(1100, limit, 100, cap, 90));
        // DRAM still above its budget: it is evicting, and the pages follow.
        assert!(!should_relocate(1100, limit, 100, cap, 300));
        // The budget can still fall.
        assert!(!should_relocate(1100, limit, 400, cap, 90));
        // Under the aim, or no limit.
        assert!(!should_relocate(950, limit, 100, cap, 90));
        assert!(!should_relocate(1100, 0, 100, cap, 90));
    }

    #[test]
    fn a_limit_is_split_between_rocksdb_a_reserve_and_dram() {
        // The defaults asked for: no memtables total, a 64 MiB block cache.
        let asked = shares(0, 64);
        let s = split(384 * M, asked);
        assert_eq!(s.warm, shares(48, 24));
        assert_eq!(s.dram, 264 * M, "384 less 48, 24 and a 48 MiB reserve");
        // What the configuration sets lower stays lower.
        assert_eq!(split(384 * M, shares(16, 8)).warm, shares(16, 8));
        // The least limit leaves DRAM 20 MiB beside the 32 MiB reserve.
        let least = split(crate::config::MAXMEMORY_MIN, asked);
        assert_eq!((least.warm, least.dram), (shares(8, 4), 20 * M));
    }

    #[test]
    fn a_limit_set_at_run_time_moves_rocksdb_s_shares_and_caps_dram() {
        // Started at 384 MiB: RocksDB 48 + 24, DRAM 264.
        let (start, cap) = (shares(48, 24), 264 * M);
        let lower = shares_at(256 * M, start, cap);
        assert_eq!((lower.warm, lower.dram), (shares(32, 16), 176 * M));
        let higher = shares_at(1024 * M, start, cap);
        assert_eq!(
            (higher.warm, higher.dram),
            (start, cap),
            "never past the start shares"
        );
        assert_eq!(
            shares_at(0, start, cap),
            Split {
                warm: start,
                dram: cap
            }
        );
        // Started with no limit: a limit set later takes RocksDB's shares out of it too.
        let unlimited = shares(0, 64);
        let later = shares_at(256 * M, unlimited, 1024 * M);
        assert_eq!((later.warm, later.dram), (shares(32, 16), 176 * M));
        assert_eq!(shares_at(0, unlimited, 1024 * M).warm, unlimited);
    }
}
