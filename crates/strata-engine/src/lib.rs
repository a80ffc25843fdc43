//! Strata's tiered storage engine: DRAM (hot) → RocksDB (warm) → object store (cold).
//!
//! Every write lands in RocksDB first and is acknowledged once its [`Durability`] is met;
//! the hot tier caches copies. When the warm tier passes `warm_bytes_max`, a background
//! task packs victims into zstd-compressed segments, uploads them, and only then swaps the
//! warm records for index entries in one write batch. Reads go hot → warm → index → one
//! ranged GET of one block. Every value carries a checksum that covers its key.
//!
//! What this crate is not: a network server (see `strata-server`) or a byte format (see
//! `strata-format`). It is the only crate that links RocksDB.
//!
//! ```no_run
//! # async fn demo() -> strata_engine::Result<()> {
//! use strata_engine::{Engine, EngineOptions, PutOptions};
//! let engine = Engine::open(EngineOptions::new("./strata-data")).await?;
//! engine.put(b"feature:42", "0.5,0.7".into(), PutOptions::default()).await?;
//! assert_eq!(engine.get(b"feature:42").await?.unwrap(), "0.5,0.7");
//! engine.close().await?;
//! # Ok(()) }
//! ```

mod background;
mod backup;
mod clock;
mod cold;
mod disk;
mod durability;
mod engine;
mod error;
pub mod glob;
mod loadtime;
mod options;
mod pins;
mod prefetch;
mod scan;
mod stats;
mod vlog;
mod warm;
mod write;

pub use backup::{restore, BackupSummary, Progress};
pub use clock::{Clock, ManualClock, SystemClock};
pub use engine::{Engine, LocalValue, Tier};
pub use error::{Error, ErrorKind, Result};
pub use options::{Durability, EngineOptions, HotPolicy, S3Options};
pub use scan::{ScanItem, ScanPage};
pub use stats::{ColdRequestStats, EngineStats, TierStats};
/// Bytes the DRAM tier charges per entry on top of key and value.
pub const HOT_ENTRY_OVERHEAD_BYTES: usize = strata_hot::ENTRY_OVERHEAD_BYTES;
pub use write::{parse_i64, Change, Condition, Existing, Expire, PutOptions, PutResult};
