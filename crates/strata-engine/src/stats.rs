//! Every figure the engine reports, each defined once: [`STATS`] holds its name (as `INFO`,
//! `STRATA.STATS` and the Rust API call it), its Prometheus family and labels, and its help
//! text; the server renders all three outputs from that table, so they cannot disagree.
//!
//! Counters count events (`fetch_add` from anywhere in the engine, through [`Counters`]);
//! gauges are read from the components when a snapshot is taken ([`crate::Engine::stats`]).

use std::sync::atomic::{AtomicU64, Ordering};

/// Whether a figure only grows (a counter) or moves both ways (a gauge).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        }
    }
}

/// One figure's definition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// The name in `INFO`, `STRATA.STATS` and [`Stats`].
    pub name: &'static str,
    pub kind: Kind,
    /// The Prometheus metric family; several figures may share one with their own labels.
    pub metric: &'static str,
    /// Prometheus labels (`tier="hot"`), empty for none.
    pub labels: &'static str,
    pub help: &'static str,
}

/// Defines a set of figures once: the atomic counters, the snapshot struct with one field
/// per figure, and the table of their definitions. Used for the engine's figures here and
/// for the server's own.
#[macro_export]
macro_rules! define_stats {
    (
        $(#[$cmeta:meta])* counters $counters:ident;
        $(#[$smeta:meta])* snapshot $snapshot:ident;
        table $table:ident;
        counters { $($c:ident: $cmetric:literal $clabels:literal $chelp:literal,)* }
        gauges { $($g:ident: $gmetric:literal $glabels:literal $ghelp:literal,)* }
    ) => {
        $(#[$cmeta])*
        #[derive(Debug, Default)]
        pub struct $counters {
            $(#[doc = $chelp] pub $c: ::std::sync::atomic::AtomicU64,)*
        }

        $(#[$smeta])*
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        pub struct $snapshot {
            $(#[doc = $chelp] pub $c: u64,)*
            $(#[doc = $ghelp] pub $g: u64,)*
        }

        /// Every figure's definition, in the order outputs show them.
        pub const $table: &[$crate::stats::Stat] = &[
            $($crate::stats::Stat {
                name: stringify!($c),
                kind: $crate::stats::Kind::Counter,
                metric: $cmetric,
                labels: $clabels,
                help: $chelp,
            },)*
            $($crate::stats::Stat {
                name: stringify!($g),
                kind: $crate::stats::Kind::Gauge,
                metric: $gmetric,
                labels: $glabels,
                help: $ghelp,
            },)*
        ];

        impl $counters {
            /// Copies every counter into `into` (gauges are left as they are).
            pub fn load_into(&self, into: &mut $snapshot) {
                $(into.$c = self.$c.load(::std::sync::atomic::Ordering::Relaxed);)*
            }
        }

        impl $snapshot {
            /// Every figure with its definition, in table order.
            pub fn rows(&self) -> Vec<(&'static $crate::stats::Stat, u64)> {
                $table
                    .iter()
                    .zip([$(self.$c,)* $(self.$g,)*])
                    .collect()
            }
        }
    };
}

/// Adds one to a counter.
pub(crate) fn add(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

define_stats! {
    /// The engine's counters, shared by its components.
    counters Counters;
    /// A snapshot of every figure of the engine.
    snapshot Stats;
    table STATS;
    counters {
        hot_hits: "strata_tier_hits_total" "tier=\"hot\"" "Reads served from DRAM.",
        warm_hits: "strata_tier_hits_total" "tier=\"warm\"" "Reads served from RocksDB.",
        cold_hits: "strata_tier_hits_total" "tier=\"cold\"" "Reads served from the object store.",
        misses: "strata_misses_total" "" "Reads that found no key.",
        key_filter_answers: "strata_key_filter_answers_total" "" "Look-ups of keys the key filter showed absent from the warm and cold tiers, with no read of RocksDB.",
        key_filter_builds: "strata_key_filter_builds_total" "" "Builds of the key filter (a scan of every key of the warm and cold tiers: at open, and when it fills).",
        demotions: "strata_demotions_total" "" "Keys moved from warm to cold.",
        promotions: "strata_promotions_total" "" "Keys copied into DRAM by reads.",
        returns_to_warm: "strata_returns_to_warm_total" "" "Values read from the object store and written back to the warm tier.",
        expired: "strata_expired_total" "" "Keys removed by expiry.",
        checksum_errors: "strata_checksum_errors_total" "" "Stored bytes that failed verification (never returned).",
        writes: "strata_writes_total" "" "Keys written or deleted.",
        writes_back: "strata_writes_back_total" "" "Writes taken by write-back (DRAM and the hot log; the warm store filled behind).",
        live_writes: "strata_live_writes_total" "" "Collection writes made in place, to a live (decoded) value in memory.",
        live_reads: "strata_live_reads_total" "" "Collection reads answered from a live (decoded) value in memory.",
        live_folds: "strata_live_folds_total" "" "Live values encoded and stored (before the logs are written out, or another command reads or writes the key).",
        live_deltas: "strata_live_deltas_total" "" "Live values whose changes a group commit logged as a delta (the items changed) instead of storing them whole.",
        parts_written: "strata_parts_written_total" "" "Fields, members and elements written or deleted as parts of a large hash, set, sorted set or list (`parts_bytes_min`): a change to one writes one (a list's insert or removal in the middle also moves those on its shorter side).",
        parts_read: "strata_parts_read_total" "" "Fields, members and elements of a collection stored as parts read alone instead of the whole value: asked for by name (`HGET`, `HMGET`, `SISMEMBER`, `ZSCORE`), walked in a sorted set's score index by a range (`ZRANGE`), a list's span (`LRANGE`, `LINDEX`), or the elements a list's insert or removal moves.",
        group_commits: "strata_group_commits_total" "" "Group commits (`durability = group`): rounds of log syncs, each covering every write that was waiting.",
        group_commits_warm: "strata_group_commits_warm_synced_total" "" "Syncs of the warm store's log by group commits and SAVE (skipped while it holds nothing new since the last: write-back's values go to the hot log).",
        checkpoints: "strata_checkpoints_total" "" "Write-back checkpoints: dirty values written to the warm store, older hot-log files deleted.",
        write_back_settles: "strata_write_back_settles_total" "" "Times write-back wrote the colder half of its dirty values to the warm store (past three quarters of its budget).",
        hot_log_compactions: "strata_hot_log_compactions_total" "" "Write-back compactions: dirty values logged again into a new hot-log file, older files deleted.",
        bucket_log_objects: "strata_bucket_log_objects_total" "" "Objects the bucket log wrote (one per round that had changes to ship).",
        bucket_log_errors: "strata_bucket_log_errors_total" "" "Bucket log rounds and snapshots that failed (what a round took is shipped by the next; a snapshot is tried again).",
        bucket_snapshots: "strata_bucket_snapshots_total" "" "Snapshots of the bucket log written (every key the node holds; the log before it deleted).",
        idle_flushes: "strata_warm_idle_flushes_total" "" "Times the warm store's memtables were written out after a quiet spell (what they held repeats what DRAM and the files hold).",
        writes_stalled: "strata_writes_stalled_total" "" "Writes that waited at the warm tier's hard limit for demotion to make room.",
        writes_refused_full: "strata_writes_refused_full_total" "" "Writes refused after waiting write_stall_ms_max at the warm tier's hard limit.",
        demotion_errors: "strata_demotion_errors_total" "" "Background rounds (demotion, expiry, collection) that failed and were retried.",
        segments_written: "strata_segments_written_total" "" "Segments uploaded.",
        segments_deleted: "strata_segments_deleted_total" "" "Segments deleted.",
        segments_rewritten: "strata_segments_rewritten_total" "" "Sparse segments whose live entries were moved to a new segment.",
        vlog_files_collected: "strata_vlog_files_collected_total" "" "Value-log files deleted after their live entries moved.",
        warm_batches_split: "strata_warm_batches_split_total" "" "Multi-key warm reads split over two threads (large values).",
        prefetch_issued: "strata_prefetches_total" "" "Values brought into DRAM by prefetch after cold reads.",
        prefetch_used: "strata_prefetch_used_total" "" "Prefetched values read from DRAM before eviction (cold reads avoided).",
        prefetch_dropped: "strata_prefetch_dropped_total" "" "Jobs reads left behind (returns to the warm tier, prefetches) dropped because the worker was behind.",
        object_store_gets: "strata_object_store_requests_total" "op=\"get\"" "Object-store GETs.",
        object_store_puts: "strata_object_store_requests_total" "op=\"put\"" "Object-store PUTs.",
        object_store_deletes: "strata_object_store_requests_total" "op=\"delete\"" "Object-store DELETEs.",
        object_store_lists: "strata_object_store_requests_total" "op=\"list\"" "Object-store LISTs.",
        object_store_errors: "strata_object_store_errors_total" "" "Failed object-store requests.",
        object_store_get_bytes: "strata_object_store_bytes_total" "dir=\"get\"" "Bytes read from the object store.",
        object_store_put_bytes: "strata_object_store_bytes_total" "dir=\"put\"" "Bytes written to the object store.",
        object_store_get_micros: "strata_object_store_get_micros_total" "" "Microseconds spent in object-store GETs.",
        object_store_shared_fetches: "strata_object_store_shared_fetches_total" "" "Reads that joined a fetch of the same block already in flight.",
        object_store_read_waits: "strata_object_store_read_waits_total" "" "Reads that waited for one of the cold_reads_max slots.",
    }
    gauges {
        hot_entries: "strata_tier_entries" "tier=\"hot\"" "Entries in DRAM.",
        warm_entries: "strata_tier_entries" "tier=\"warm\"" "Entries in RocksDB.",
        cold_entries: "strata_tier_entries" "tier=\"cold\"" "Entries in the object store.",
        hot_bytes: "strata_tier_bytes" "tier=\"hot\"" "Bytes in DRAM (keys, values, per-entry overhead).",
        warm_bytes: "strata_tier_bytes" "tier=\"warm\"" "Bytes in RocksDB and the value log (keys, records, values).",
        cold_bytes: "strata_tier_bytes" "tier=\"cold\"" "Value bytes in the object store.",
        hot_bytes_max: "strata_tier_bytes_max" "tier=\"hot\"" "DRAM budget.",
        hot_dirty_bytes: "strata_hot_dirty_bytes" "" "Bytes of values write-back holds that the warm store does not yet.",
        live_values: "strata_live_values" "" "Collections held decoded in memory, changed in place by their writes.",
        live_bytes: "strata_live_bytes" "" "About how many bytes the live values hold (at most half of write-back's budget).",
        warm_memory_bytes: "strata_warm_memory_bytes" "" "Memory the warm store holds: RocksDB's memtables, block cache and table readers.",
        warm_memtables_bytes_max: "strata_warm_memtables_bytes_max" "" "What RocksDB's memtables together may hold, about (0: no total, 64 MiB a family).",
        warm_block_cache_bytes_max: "strata_warm_block_cache_bytes_max" "" "What RocksDB's block cache may hold.",
        key_filter_bytes: "strata_key_filter_bytes" "" "Memory the key filter holds (about two bytes per key).",
        warm_bytes_max: "strata_tier_bytes_max" "tier=\"warm\"" "RocksDB budget; above it keys are demoted.",
        warm_bytes_hard_max: "strata_warm_bytes_hard_max" "" "Warm bytes past which writes wait for demotion (refused after write_stall_ms_max).",
        hot_evictions: "strata_hot_evictions_total" "" "Entries evicted from DRAM.",
        vlog_files: "strata_vlog_files" "" "Value-log files on disk.",
        vlog_bytes: "strata_vlog_bytes" "" "Bytes of the value-log files (live and garbage).",
        wal_bytes_dropped: "strata_wal_bytes_dropped" "" "Write-ahead log bytes dropped at the last open (a torn or truncated tail).",
        object_store_reads_in_flight_peak: "strata_object_store_reads_in_flight_peak" "" "Most object-store reads ever in flight at once.",
        prefetch_fetch_window: "strata_prefetch_fetch_window" "" "Prefetch GETs allowed at the object store at once now (halved when they slow clients' reads down, up to prefetch_fetches_max).",
        change_log_sequence: "strata_change_log_sequence" "" "Sequence number of the latest committed change.",
    }
}

impl Stats {
    /// Share of prefetched values read from DRAM before eviction.
    pub fn prefetch_precision(&self) -> f64 {
        self.prefetch_used as f64 / self.prefetch_issued.max(1) as f64
    }

    /// Share of would-be cold reads that prefetch served from DRAM instead.
    pub fn prefetch_coverage(&self) -> f64 {
        self.prefetch_used as f64 / (self.prefetch_used + self.cold_hits).max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_figure_is_named_once_and_rows_follow_the_table() {
        let mut names: Vec<&str> = STATS.iter().map(|s| s.name).collect();
        let n = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n, "a figure is defined twice");
        let c = Counters::default();
        add(&c.demotions);
        add(&c.demotions);
        let mut s = Stats {
            hot_bytes: 7,
            ..Stats::default()
        };
        c.load_into(&mut s);
        let rows = s.rows();
        assert_eq!(rows.len(), STATS.len());
        let get = |name: &str| rows.iter().find(|r| r.0.name == name).unwrap().1;
        assert_eq!(get("demotions"), 2);
        assert_eq!(get("hot_bytes"), 7);
        // Families shared by several figures have labels to tell them apart.
        for s in STATS {
            let same: Vec<_> = STATS.iter().filter(|t| t.metric == s.metric).collect();
            if same.len() > 1 {
                assert!(same.iter().all(|t| !t.labels.is_empty()), "{}", s.metric);
                assert!(same.iter().all(|t| t.kind == s.kind), "{}", s.metric);
            }
        }
    }
}
