//! Strata's tiered storage engine: DRAM (hot) → a warm store on local disk → an object
//! store (cold), coordinated.
//!
//! Each tier is a component with one job: the DRAM cache (`strata-hot`), the warm store
//! behind [`strata_warm::WarmStore`] (RocksDB in `strata-rocks`, the only crate that links
//! it) with the value log for large values beside it, and the cold store over any
//! [`object_store::ObjectStore`]. The coordinator here holds them and moves keys between
//! them: every write lands in the warm store and is acknowledged once its [`Durability`] is
//! met (the caller waits on the write's [`Ticket`]); reads go hot → warm → cold index → one
//! ranged GET of one block; what a read leaves behind (a copy in DRAM, a value returned to
//! the warm tier, prefetches) happens in one hook after it, the slow parts off its path.
//! When the warm tier passes its budget, a background task packs victims into segments,
//! uploads them, and only then swaps the warm records for index entries in one batch. Every
//! value carries a checksum that covers its key.
//!
//! What this crate is not: a network server (`strata-server`), a byte format
//! (`strata-format`), or a store of its own; it builds without RocksDB.
//!
//! ```no_run
//! # async fn demo(warm: std::sync::Arc<dyn strata_warm::WarmStore>) -> strata_engine::Result<()> {
//! use strata_engine::{Engine, Parts, PutOptions, Settings};
//! // `warm` is the store of the warm tier, e.g. strata_rocks::RocksWarm::open(...).
//! let engine = Engine::open_with(Parts::new("./strata-data", Settings::default(), warm)).await?;
//! let key = engine.key(0, b"feature:42");
//! engine.put(&key, "0.5,0.7".into(), PutOptions::default()).await?.durable(&engine).await?;
//! assert_eq!(engine.get(&key).await?.unwrap(), "0.5,0.7");
//! engine.close().await?;
//! # Ok(()) }
//! ```

mod access;
mod adopt;
mod background;
mod backup;
mod bucket;
mod changes;
mod clock;
mod cold;
mod commit;
mod core;
mod disk;
mod durability;
mod engine;
mod error;
mod fold;
pub mod glob;
mod hook;
mod keyfilter;
mod live;
mod loadtime;
mod locks;
mod migrate;
mod offload;
mod pins;
mod prefetch;
mod prefetcher;
mod queue;
mod read;
mod returns;
mod scan;
pub mod settings;
mod settle;
mod ship;
mod snapshot;
pub mod stats;
mod tier;
mod tierwatch;
mod vlog;
mod warm;
mod write;
mod writeback;

pub use backup::{restore, BackupSummary, Progress};
pub use bucket::{
    fence as fence_bucket_log, replay as bucket_replay, retire as retire_bucket_epoch,
};
pub use changes::{ChangeEvent, KeyChange};
pub use clock::{Clock, ManualClock, SystemClock};
pub use cold::open_store;
pub use commit::Change;
pub use durability::{Ticket, Written};
pub use engine::{Engine, Parts};
pub use error::{Error, ErrorKind, Result};
pub use live::state::LiveValue;
pub use offload::serve_clients_promptly;
pub use read::{Answer, Asked, LocalValue, Source};
pub use scan::{RangeBound, ScanItem, ScanPage};
pub use settings::{Durability, HotPolicy, Settings};
pub use stats::Stats;
pub use strata_format::{Key, Kind};
pub use strata_warm::MemoryShares;
pub use tier::Tier;
pub use tierwatch::{Move, TierChange};
pub use warm::{warm_dir, Saved};
pub use write::{parse_i64, Condition, Existing, Expire, PutOptions, PutResult};
/// Bytes the DRAM tier charges per entry on top of key and value.
pub const HOT_ENTRY_OVERHEAD_BYTES: usize = strata_hot::ENTRY_OVERHEAD_BYTES;
