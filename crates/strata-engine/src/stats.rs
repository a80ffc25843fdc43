//! Engine counters and the snapshot the server turns into `INFO` and `/metrics`.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) warm_batches_split: AtomicU64,
    pub(crate) warm_bytes: AtomicI64,
    pub(crate) warm_entries: AtomicI64,
    pub(crate) cold_bytes: AtomicI64,
    pub(crate) cold_entries: AtomicI64,
    pub(crate) hot_hits: AtomicU64,
    pub(crate) warm_hits: AtomicU64,
    pub(crate) cold_hits: AtomicU64,
    pub(crate) misses: AtomicU64,
    pub(crate) demotions: AtomicU64,
    pub(crate) promotions: AtomicU64,
    pub(crate) returns_to_warm: AtomicU64,
    pub(crate) expired: AtomicU64,
    pub(crate) checksum_errors: AtomicU64,
    pub(crate) segments_written: AtomicU64,
    pub(crate) segments_deleted: AtomicU64,
    pub(crate) segments_rewritten: AtomicU64,
    pub(crate) demotion_errors: AtomicU64,
    pub(crate) writes: AtomicU64,
    pub(crate) writes_refused_full: AtomicU64,
    pub(crate) wal_bytes_dropped: AtomicU64,
    pub(crate) vlog_files_collected: AtomicU64,
}

pub(crate) fn add(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Per-tier figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierStats {
    pub entries: u64,
    pub bytes: u64,
    pub bytes_max: u64,
    pub hits: u64,
}

/// Object-store request figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ColdRequestStats {
    pub gets: u64,
    pub puts: u64,
    pub deletes: u64,
    pub lists: u64,
    pub errors: u64,
    pub get_bytes: u64,
    pub put_bytes: u64,
    /// Sum of GET latencies, for a mean.
    pub get_micros_total: u64,
    /// Reads that joined a fetch already in flight for the same block.
    pub shared_fetches: u64,
    /// Reads that waited for one of the `cold_reads_max` slots.
    pub read_waits: u64,
    /// Most object-store reads ever in flight at once.
    pub reads_in_flight_peak: u64,
}

/// A consistent-enough snapshot of everything the engine counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub hot: TierStats,
    pub warm: TierStats,
    pub cold: TierStats,
    /// Reads that found nothing in any tier.
    pub misses: u64,
    pub hot_evictions: u64,
    /// Keys moved from warm to cold.
    pub demotions: u64,
    /// Keys copied from warm or cold into hot by a read.
    pub promotions: u64,
    /// Values read from the object store and written back to the warm tier.
    pub returns_to_warm: u64,
    pub expired: u64,
    pub checksum_errors: u64,
    pub segments_written: u64,
    pub segments_deleted: u64,
    pub segments_rewritten: u64,
    pub demotion_errors: u64,
    pub writes: u64,
    /// Writes refused because the warm tier was at its hard limit.
    pub writes_refused_full: u64,
    /// Values brought into DRAM by prefetch.
    pub prefetch_issued: u64,
    /// Prefetched values read from DRAM before eviction (cold reads avoided).
    pub prefetch_used: u64,
    /// Prefetch jobs dropped because the worker was behind.
    pub prefetch_dropped: u64,
    /// Multi-key warm reads split over two threads (large values).
    pub warm_batches_split: u64,
    /// WAL bytes RocksDB dropped at open (a torn or truncated tail).
    pub wal_bytes_dropped: u64,
    /// Value-log files on disk and their bytes (live entries and garbage).
    pub vlog_files: u64,
    pub vlog_bytes: u64,
    /// Sealed value-log files deleted after their live entries moved.
    pub vlog_files_collected: u64,
    /// The warm tier's hard limit in bytes.
    pub warm_bytes_hard_max: u64,
    pub cold_requests: ColdRequestStats,
    pub cold_url: String,
    pub durability: String,
}

impl EngineStats {
    /// Share of prefetched values read from DRAM before eviction.
    pub fn prefetch_precision(&self) -> f64 {
        self.prefetch_used as f64 / self.prefetch_issued.max(1) as f64
    }

    /// Share of would-be cold reads that prefetch served from DRAM instead.
    pub fn prefetch_coverage(&self) -> f64 {
        self.prefetch_used as f64 / (self.prefetch_used + self.cold.hits).max(1) as f64
    }
}
