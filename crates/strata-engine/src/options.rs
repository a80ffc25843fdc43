//! Engine options, with units last in every name and a limit on everything.

use std::path::PathBuf;

use crate::{Error, Result};

/// When a write is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Each write fsyncs the RocksDB WAL before it is acknowledged.
    Sync,
    /// Writes are acknowledged after a shared WAL fsync that covers them (group commit):
    /// as safe as `Sync`, cheaper under concurrency. Other clients may read a value a few
    /// hundred microseconds before its fsync completes.
    Group,
    /// Acknowledged once in the WAL's OS buffers: survives a process crash, not a power loss.
    None,
}

impl std::str::FromStr for Durability {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "sync" => Ok(Durability::Sync),
            "group" => Ok(Durability::Group),
            "none" => Ok(Durability::None),
            _ => Err(Error::Invalid(format!(
                "durability must be sync, group or none, not '{s}'"
            ))),
        }
    }
}

/// The DRAM tier's eviction policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HotPolicy {
    Lru,
    /// Frequency-weighted aging (see `strata-policy`): keeps reused keys through scans.
    Strata,
}

impl std::str::FromStr for HotPolicy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "lru" => Ok(HotPolicy::Lru),
            "strata" => Ok(HotPolicy::Strata),
            _ => Err(Error::Invalid(format!(
                "hot_policy must be lru or strata, not '{s}'"
            ))),
        }
    }
}

/// How to reach an S3-compatible cold tier; unset fields fall back to `AWS_*` variables.
#[derive(Debug, Clone, Default)]
pub struct S3Options {
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    /// Allow `http://` endpoints (a local S3-compatible server in tests).
    pub allow_http: bool,
}

#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Root of everything on local disk; RocksDB lives in `<data_dir>/warm`.
    pub data_dir: PathBuf,
    /// `file:///path` or `s3://bucket/prefix`; `None` means `file://<data_dir>/cold`.
    pub cold_url: Option<String>,
    pub s3: S3Options,
    pub hot_bytes_max: u64,
    pub hot_shard_count: usize,
    pub hot_policy: HotPolicy,
    pub warm_bytes_max: u64,
    /// Demotion stops once warm holds this fraction of `warm_bytes_max`.
    pub warm_demote_to_fraction: f64,
    /// Past this many warm bytes (demotion is behind, or the object store is down), writes
    /// that add bytes are refused. 0 means 1.5 × `warm_bytes_max`.
    pub warm_bytes_hard_max: u64,
    pub durability: Durability,
    /// Values at least this large go to RocksDB blob files instead of the LSM tree.
    pub blob_bytes_min: u64,
    /// Values at least this large go to the value log (`<data_dir>/vlog`), read without a
    /// copy; 0 keeps every value in RocksDB.
    pub vlog_value_bytes_min: u64,
    /// A value-log file is sealed once it holds this many bytes.
    pub vlog_file_bytes: u64,
    /// Writeback of appended value-log bytes starts each time this many accumulate (0
    /// leaves it to the kernel).
    pub vlog_writeback_bytes: u64,
    /// A sealed value-log file at least this garbage (bytes no record points at) is
    /// rewritten: its live entries move to the newest file and it is deleted.
    pub vlog_garbage_fraction_max: f64,
    /// RocksDB's rate limiter for flushes and compactions.
    pub compaction_bytes_per_sec: i64,
    pub rocksdb_block_cache_bytes: usize,
    pub segment_bytes_max: u64,
    pub block_bytes: usize,
    pub zstd_level: i32,
    /// Segments with less than this fraction of their bytes still live are rewritten.
    pub segment_live_fraction_min: f64,
    pub background_interval_ms: u64,
    pub cold_request_timeout_ms: u64,
    /// Most object-store reads in flight at once (others wait their turn), so one large
    /// multi-key read cannot open a connection per key.
    pub cold_reads_max: usize,
    pub value_bytes_max: usize,
    pub key_bytes_max: usize,
    /// Most expired keys removed per background pass.
    pub expire_sweep_count_max: usize,
    /// Most value bytes that pins may hold in the warm tier.
    pub pinned_bytes_max: u64,
    /// Writes are refused while less than this many bytes are free on the warm tier's disk
    /// (0 turns the check off).
    pub disk_free_min_bytes: u64,
    /// A value read from the object store is written back to the warm tier (a read says it
    /// is in use again) while the warm tier holds less than halfway from `warm_bytes_max`
    /// to its hard limit.
    pub cold_reads_return_to_warm: bool,
    /// Speculative prefetch after cold reads (block neighbours and Markov predictions).
    pub prefetch: bool,
    /// Most bytes one cold read may prefetch.
    pub prefetch_bytes_max: u64,
    /// Most predicted keys followed after one cold read.
    pub prefetch_keys_max: usize,
    /// Most prefetch jobs running at once.
    pub prefetch_tasks_max: usize,
}

impl EngineOptions {
    /// Defaults for a store rooted at `data_dir`.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        EngineOptions {
            data_dir: data_dir.into(),
            cold_url: None,
            s3: S3Options::default(),
            hot_bytes_max: 256 << 20,
            hot_shard_count: 16,
            hot_policy: HotPolicy::Strata,
            warm_bytes_max: 8 << 30,
            warm_demote_to_fraction: 0.9,
            warm_bytes_hard_max: 0,
            durability: Durability::Group,
            blob_bytes_min: 4096,
            vlog_value_bytes_min: 64 << 10,
            vlog_file_bytes: 256 << 20,
            vlog_writeback_bytes: 8 << 20,
            vlog_garbage_fraction_max: 0.5,
            compaction_bytes_per_sec: 256 << 20,
            rocksdb_block_cache_bytes: 64 << 20,
            segment_bytes_max: 64 << 20,
            block_bytes: 64 << 10,
            zstd_level: 3,
            segment_live_fraction_min: 0.5,
            background_interval_ms: 1000,
            cold_request_timeout_ms: 10_000,
            cold_reads_max: 64,
            value_bytes_max: strata_format::VALUE_BYTES_MAX,
            key_bytes_max: strata_format::KEY_BYTES_MAX,
            expire_sweep_count_max: 10_000,
            pinned_bytes_max: 1 << 30,
            disk_free_min_bytes: 256 << 20,
            cold_reads_return_to_warm: true,
            prefetch: true,
            prefetch_bytes_max: 4 << 20,
            prefetch_keys_max: 8,
            prefetch_tasks_max: 4,
        }
    }

    /// The warm tier's hard limit in bytes (`warm_bytes_hard_max`, or its default).
    pub fn warm_hard_limit(&self) -> u64 {
        if self.warm_bytes_hard_max == 0 {
            self.warm_bytes_max.saturating_add(self.warm_bytes_max / 2)
        } else {
            self.warm_bytes_hard_max
        }
    }

    /// Checks the options for values that cannot work.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::Invalid(m.to_string()));
        if self.hot_shard_count == 0 || self.hot_shard_count > 1024 {
            return bad("hot_shard_count must be between 1 and 1024");
        }
        if self.warm_bytes_hard_max != 0 && self.warm_bytes_hard_max < self.warm_bytes_max {
            return bad("warm_bytes_hard_max must be 0 (automatic) or at least warm_bytes_max");
        }
        if !(0.1..=1.0).contains(&self.warm_demote_to_fraction) {
            return bad("warm_demote_to_fraction must be between 0.1 and 1.0");
        }
        if self.block_bytes < 512 || self.block_bytes > 16 << 20 {
            return bad("block_bytes must be between 512 and 16 MiB");
        }
        if !(1..=4096).contains(&self.cold_reads_max) {
            return bad("cold_reads_max must be between 1 and 4096");
        }
        if !(1..=22).contains(&self.zstd_level) {
            return bad("zstd_level must be between 1 and 22");
        }
        if self.value_bytes_max > strata_format::VALUE_BYTES_MAX {
            return bad("value_bytes_max may not exceed 512 MiB");
        }
        if self.key_bytes_max > strata_format::KEY_BYTES_MAX {
            return bad("key_bytes_max may not exceed 64 KiB");
        }
        if self.compaction_bytes_per_sec <= 0 {
            return bad("compaction_bytes_per_sec must be positive");
        }
        if let Some(u) = &self.cold_url {
            if !(u.starts_with("file://") || u.starts_with("s3://")) {
                let scheme = u.split("://").next().unwrap_or(u);
                return Err(Error::Invalid(format!(
                    "cold_url scheme '{scheme}' is not supported; use file:///path or s3://bucket/prefix"
                )));
            }
        }
        if !(0.05..=1.0).contains(&self.vlog_garbage_fraction_max) {
            return bad("vlog_garbage_fraction_max must be between 0.05 and 1");
        }
        if self.vlog_file_bytes < 1 << 20 {
            return bad("vlog_file_bytes must be at least 1 MiB");
        }
        if !(0.0..=1.0).contains(&self.segment_live_fraction_min) {
            return bad("segment_live_fraction_min must be between 0 and 1");
        }
        Ok(())
    }
}
