//! The engine's settings: one struct per component, each read from the configuration file
//! as it is (the binary flattens them into its own), with units last in every name and a
//! limit on everything. [`Settings::validate`] refuses values that cannot work.

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// When a write is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Durability {
    /// Each write fsyncs the write-ahead log before it is acknowledged.
    Sync,
    /// Writes are acknowledged after a shared fsync that covers them (group commit): as
    /// safe as `Sync`, cheaper under concurrency. Other clients may read a value a few
    /// hundred microseconds before its fsync completes.
    Group,
    /// Acknowledged once in the log's OS buffers: survives a process crash, not a power loss.
    None,
    /// As `Group`, and acknowledged only once the bucket log (`bucket`) holds the write:
    /// it survives the loss of the node and its disk.
    Bucket,
}

impl std::str::FromStr for Durability {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "sync" => Ok(Durability::Sync),
            "group" => Ok(Durability::Group),
            "none" => Ok(Durability::None),
            "bucket" => Ok(Durability::Bucket),
            _ => Err(Error::Invalid(format!(
                "durability must be sync, group, none or bucket, not '{s}'"
            ))),
        }
    }
}

impl Durability {
    pub fn as_str(self) -> &'static str {
        match self {
            Durability::Sync => "sync",
            Durability::Group => "group",
            Durability::None => "none",
            Durability::Bucket => "bucket",
        }
    }
}

impl TryFrom<String> for Durability {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        s.parse()
    }
}

impl From<Durability> for String {
    fn from(d: Durability) -> String {
        d.as_str().to_string()
    }
}

/// The DRAM tier's eviction policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum HotPolicy {
    Lru,
    /// Frequency-weighted aging (`strata_hot::PolicyKind::Strata`): keeps reused keys through
    /// scans.
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

impl TryFrom<String> for HotPolicy {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        s.parse()
    }
}

impl From<HotPolicy> for String {
    fn from(p: HotPolicy) -> String {
        match p {
            HotPolicy::Lru => "lru",
            HotPolicy::Strata => "strata",
        }
        .to_string()
    }
}

/// The DRAM tier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HotSettings {
    /// DRAM budget: keys, values and [`crate::HOT_ENTRY_OVERHEAD_BYTES`] per entry.
    #[serde(with = "strata_settings::size")]
    pub hot_bytes_max: u64,
    /// DRAM eviction: `strata` (frequency-weighted aging; keeps reused keys through scans)
    /// or `lru`.
    pub hot_policy: HotPolicy,
    /// Shards of the DRAM tier (each with its own lock and policy).
    pub hot_shard_count: usize,
    /// Write-back: the share of `hot_bytes_max` that values written to DRAM and its log,
    /// and not yet to the warm store, may hold (a plain `SET` of a small value goes there;
    /// the warm store is filled behind in batches), and at most half of `warm_bytes_max`.
    /// 0 sends every write to the warm store.
    pub hot_dirty_fraction: f64,
}

impl Default for HotSettings {
    fn default() -> Self {
        HotSettings {
            hot_bytes_max: 1 << 30,
            hot_policy: HotPolicy::Strata,
            hot_shard_count: 16,
            hot_dirty_fraction: 0.5,
        }
    }
}

/// The warm tier's budget and what the coordinator does with it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WarmSettings {
    /// Past this many warm bytes, keys are demoted to the cold tier.
    #[serde(with = "strata_settings::size")]
    pub warm_bytes_max: u64,
    /// Demotion stops once warm holds this fraction of `warm_bytes_max`.
    pub warm_demote_to_fraction: f64,
    /// Past this many warm bytes (demotion is behind, or the object store is down), writes
    /// that add bytes wait for demotion to make room. 0 means 1.5 × `warm_bytes_max`.
    #[serde(with = "strata_settings::size")]
    pub warm_bytes_hard_max: u64,
    /// Longest a write waits at the hard limit for room before it fails with the reason
    /// demotion could not make it (0 fails at once).
    pub write_stall_ms_max: u64,
    /// When a write is acknowledged: `sync` (after its own fsync), `group` (after a shared
    /// fsync that covers it), `none` (once the OS has it; a SIGKILL loses at most the last
    /// `none_flush_ms` of acknowledged writes).
    pub durability: Durability,
    /// With `durability = none`, acknowledged writes are handed to the operating system at
    /// least this often: a killed process loses at most this long of them (a crash of the
    /// machine, more).
    pub none_flush_ms: u64,
    /// A value read from the object store is written back to the warm tier (a read says it
    /// is in use again) while the warm tier holds less than halfway from `warm_bytes_max`
    /// to its hard limit.
    pub cold_reads_return_to_warm: bool,
    /// Most value bytes that pins may hold in the warm tier.
    #[serde(with = "strata_settings::size")]
    pub pinned_bytes_max: u64,
    /// Writes are refused while less than this many bytes are free on the warm tier's disk
    /// (0 turns the check off).
    #[serde(with = "strata_settings::size")]
    pub disk_free_min_bytes: u64,
    /// Period of the background task (expiry, demotion, collection).
    pub background_interval_ms: u64,
    /// Most expired keys removed per background round.
    pub expire_sweep_count_max: usize,
    /// A hash, set, sorted set or list whose stored form is at least this large is stored as
    /// parts, one record per field, member or element: a change writes what changed, not
    /// the whole value. Such a value stays in the warm tier (demotion passes it over). 0 turns parts off. Below
    /// the default, whole folds measured faster (`reports/huge-hash-parts.md`).
    #[serde(with = "strata_settings::size")]
    pub parts_bytes_min: u64,
}

impl Default for WarmSettings {
    fn default() -> Self {
        WarmSettings {
            warm_bytes_max: 8 << 30,
            warm_demote_to_fraction: 0.9,
            warm_bytes_hard_max: 0,
            write_stall_ms_max: 5000,
            durability: Durability::Group,
            none_flush_ms: 1000,
            cold_reads_return_to_warm: true,
            pinned_bytes_max: 1 << 30,
            disk_free_min_bytes: 256 << 20,
            background_interval_ms: 1000,
            expire_sweep_count_max: 10_000,
            parts_bytes_min: 64 << 20,
        }
    }
}

impl WarmSettings {
    /// Whether a value of `kind` and `len` stored bytes is stored as parts.
    pub fn stores_parts(&self, kind: strata_format::Kind, len: usize) -> bool {
        self.parts_bytes_min > 0 && len as u64 >= self.parts_bytes_min && kind.has_parts()
    }

    /// The warm tier's hard limit in bytes (`warm_bytes_hard_max`, or its default).
    pub fn warm_hard_limit(&self) -> u64 {
        if self.warm_bytes_hard_max == 0 {
            self.warm_bytes_max.saturating_add(self.warm_bytes_max / 2)
        } else {
            self.warm_bytes_hard_max
        }
    }
}

/// The value log: large warm values beside RocksDB.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct VlogSettings {
    /// Values at least this large go to the value log (`<data_dir>/vlog`), read without a
    /// copy; 0 keeps every value in RocksDB.
    #[serde(with = "strata_settings::size")]
    pub vlog_value_bytes_min: u64,
    /// A value-log file is sealed once it holds this many bytes.
    #[serde(with = "strata_settings::size")]
    pub vlog_file_bytes: u64,
    /// Writeback of appended bytes starts each time this many accumulate (0 leaves it to
    /// the kernel).
    #[serde(with = "strata_settings::size")]
    pub vlog_writeback_bytes: u64,
    /// A sealed file at least this much garbage (bytes no record points at) is rewritten:
    /// its live entries move to the newest file and it is deleted.
    pub vlog_garbage_fraction_max: f64,
}

impl Default for VlogSettings {
    fn default() -> Self {
        VlogSettings {
            vlog_value_bytes_min: 64 << 10,
            vlog_file_bytes: 256 << 20,
            vlog_writeback_bytes: 8 << 20,
            vlog_garbage_fraction_max: 0.5,
        }
    }
}

/// The cold tier: where the object store is, and how segments are cut and collected.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ColdSettings {
    /// `file:///path` or `s3://bucket/prefix`; empty means `<data_dir>/cold`.
    pub cold_url: String,
    /// S3-compatible endpoint; empty fields fall back to `AWS_*` variables.
    pub s3_endpoint: String,
    /// S3 region (empty: `AWS_REGION`, or `us-east-1`).
    pub s3_region: String,
    /// S3 access key (empty: `AWS_ACCESS_KEY_ID`).
    pub s3_access_key_id: String,
    /// S3 secret key (empty: `AWS_SECRET_ACCESS_KEY`).
    pub s3_secret_access_key: String,
    /// Allow `http://` endpoints (a local S3-compatible server).
    pub s3_allow_http: bool,
    /// Every object-store request gives up after this.
    pub cold_request_timeout_ms: u64,
    /// Most object-store reads in flight at once (others wait their turn).
    pub cold_reads_max: usize,
    /// Largest segment object demotion writes.
    #[serde(with = "strata_settings::size")]
    pub segment_bytes_max: u64,
    /// Bytes of values per block of a segment, before compression: a cold read fetches one
    /// block (512 B to 16 MiB).
    #[serde(with = "strata_settings::size")]
    pub block_bytes: usize,
    /// zstd level of segment blocks (1 to 22).
    pub zstd_level: i32,
    /// Segments with less than this fraction of their bytes still live are rewritten.
    pub segment_live_fraction_min: f64,
}

impl Default for ColdSettings {
    fn default() -> Self {
        ColdSettings {
            cold_url: String::new(),
            s3_endpoint: String::new(),
            s3_region: String::new(),
            s3_access_key_id: String::new(),
            s3_secret_access_key: String::new(),
            s3_allow_http: false,
            cold_request_timeout_ms: 10_000,
            cold_reads_max: 64,
            segment_bytes_max: 64 << 20,
            block_bytes: 64 << 10,
            zstd_level: 3,
            segment_live_fraction_min: 0.5,
        }
    }
}

/// The bucket log: what a node ships to the bucket (`cold_url`) so that the loss of the
/// node loses no write it acknowledged (`durability = bucket`), or none older than a lag
/// (a cluster's nodes sharing the bucket, in the other modes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BucketSettings {
    /// With `durability = bucket`, the longest a round of the bucket log waits before it
    /// ships what changed: one object PUT per round at most, carrying every client's writes
    /// since the last.
    pub bucket_flush_ms: u64,
    /// In a cluster sharing its bucket, with another `durability`: writes reach the bucket
    /// log at most this long after they are acknowledged (and the log makes at most one PUT
    /// per this long).
    pub bucket_lag_ms_max: u64,
    /// Ship KV-cache chunks (`kvc:` keys) too; off by default: they can be recomputed.
    pub bucket_kvcache: bool,
    /// The bucket log is snapshotted (every key the node holds written to the bucket, and
    /// the log objects before it deleted) once it has grown by as much as the last
    /// snapshot held, and by this much at least: a lost node's new owners read at most a
    /// snapshot and about as much log again.
    #[serde(with = "strata_settings::size")]
    pub bucket_snapshot_bytes_min: u64,
}

impl Default for BucketSettings {
    fn default() -> Self {
        BucketSettings {
            bucket_flush_ms: 10,
            bucket_lag_ms_max: 1000,
            bucket_kvcache: false,
            bucket_snapshot_bytes_min: 64 << 20,
        }
    }
}

/// Speculative prefetch after cold reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PrefetchSettings {
    /// Block neighbours and Markov-predicted keys into DRAM after a cold read.
    pub prefetch: bool,
    /// Most bytes one cold read may prefetch.
    #[serde(with = "strata_settings::size")]
    pub prefetch_bytes_max: u64,
    /// Most predicted keys followed after a cold read or the first read of a prefetched
    /// value: a stream's window, narrowed to what `prefetch_bytes_max` covers of the keys
    /// still to fetch. Its cold keys are asked for once half of the window is missing, or
    /// the next existing key is.
    pub prefetch_keys_max: usize,
    /// Most prefetch jobs running at once.
    pub prefetch_tasks_max: usize,
    /// Most object-store GETs prefetch has in flight at once, over all jobs (one per run
    /// of blocks; two when a client's read is fetching a block in the middle of the run):
    /// a read that misses waits behind few guesses at the object store.
    pub prefetch_fetches_max: usize,
}

impl Default for PrefetchSettings {
    fn default() -> Self {
        PrefetchSettings {
            prefetch: true,
            prefetch_bytes_max: 4 << 20,
            prefetch_keys_max: 8,
            prefetch_tasks_max: 4,
            prefetch_fetches_max: 4,
        }
    }
}

/// Everything the engine is told, by component.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Settings {
    #[serde(flatten)]
    pub hot: HotSettings,
    #[serde(flatten)]
    pub warm: WarmSettings,
    #[serde(flatten)]
    pub vlog: VlogSettings,
    #[serde(flatten)]
    pub cold: ColdSettings,
    #[serde(flatten)]
    pub prefetch: PrefetchSettings,
    #[serde(flatten)]
    pub bucket: BucketSettings,
    /// Keys carry their Redis Cluster slot (cluster mode), so a slot is one key range of
    /// every family. Not a setting of its own: the binary sets it when the node joins a
    /// cluster. A store keeps the mode it was created in.
    #[serde(skip)]
    pub key_slots: bool,
    /// The epoch this node writes segments under (`strata_format::segment_ids`): 0 for a store that
    /// shares its bucket with no one; in a cluster, one the cluster gives each start, so the
    /// nodes sharing a bucket never reuse or collect each other's segments. Not a setting of
    /// its own: the binary sets it when the node joins a cluster.
    #[serde(skip)]
    pub writer_epoch: u64,
    /// This node's earlier writer epochs whose data its store holds (it was not lost in
    /// them): its first snapshot in `writer_epoch` holds what their logs say, and deletes
    /// them. Set by the binary, as `writer_epoch`.
    #[serde(skip)]
    pub earlier_epochs: Vec<u64>,
}

impl Settings {
    /// Whether this node ships its changes to the bucket log: with `durability = bucket`,
    /// and in a cluster (its nodes share their bucket).
    pub fn ships_to_bucket(&self) -> bool {
        self.warm.durability == Durability::Bucket || self.writer_epoch > 0
    }

    /// Checks for values that cannot work.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::Invalid(m.to_string()));
        let (h, w, v, c) = (&self.hot, &self.warm, &self.vlog, &self.cold);
        if h.hot_shard_count == 0 || h.hot_shard_count > 1024 {
            return bad("hot_shard_count must be between 1 and 1024");
        }
        if w.warm_bytes_hard_max != 0 && w.warm_bytes_hard_max < w.warm_bytes_max {
            return bad("warm_bytes_hard_max must be 0 (automatic) or at least warm_bytes_max");
        }
        if !(0.0..=0.75).contains(&self.hot.hot_dirty_fraction) {
            return bad("hot_dirty_fraction must be between 0 and 0.75");
        }
        if !(1..=60_000).contains(&w.none_flush_ms) {
            return bad("none_flush_ms must be between 1 and 60000");
        }
        if !(0.1..=1.0).contains(&w.warm_demote_to_fraction) {
            return bad("warm_demote_to_fraction must be between 0.1 and 1.0");
        }
        if c.block_bytes < 512 || c.block_bytes > 16 << 20 {
            return bad("block_bytes must be between 512 and 16 MiB");
        }
        if !(1..=4096).contains(&c.cold_reads_max) {
            return bad("cold_reads_max must be between 1 and 4096");
        }
        if !(1..=22).contains(&c.zstd_level) {
            return bad("zstd_level must be between 1 and 22");
        }
        let url = &c.cold_url;
        if !(url.is_empty() || url.starts_with("file://") || url.starts_with("s3://")) {
            let scheme = c.cold_url.split("://").next().unwrap_or(&c.cold_url);
            return Err(Error::Invalid(format!(
                "cold_url scheme '{scheme}' is not supported; use file:///path or s3://bucket/prefix"
            )));
        }
        if !(0.05..=1.0).contains(&v.vlog_garbage_fraction_max) {
            return bad("vlog_garbage_fraction_max must be between 0.05 and 1");
        }
        if v.vlog_file_bytes < 1 << 20 {
            return bad("vlog_file_bytes must be at least 1 MiB");
        }
        if self.writer_epoch > strata_format::segment_ids::WRITER_EPOCH_MAX {
            return bad("writer_epoch is past the most a segment id holds");
        }
        let b = &self.bucket;
        if !(1..=10_000).contains(&b.bucket_flush_ms)
            || !(1..=60_000).contains(&b.bucket_lag_ms_max)
        {
            return bad("bucket_flush_ms must be between 1 and 10000, bucket_lag_ms_max between 1 and 60000");
        }
        if b.bucket_snapshot_bytes_min < 4096 {
            return bad("bucket_snapshot_bytes_min must be at least 4 KiB");
        }
        if !(0.0..=1.0).contains(&c.segment_live_fraction_min) {
            return bad("segment_live_fraction_min must be between 0 and 1");
        }
        Ok(())
    }
}
