//! The feed's settings and their checks.

use serde::{Deserialize, Serialize};

use crate::event::Encoding;

/// Whether an endpoint is bound (a wildcard host or a local transport) or connected to,
/// as vLLM's publisher decides: a router that binds its own address receives from pools
/// that connect to it.
pub fn binds(endpoint: &str) -> bool {
    endpoint.contains('*')
        || endpoint.contains("::")
        || endpoint.starts_with("ipc://")
        || endpoint.starts_with("inproc://")
}

/// The feed's settings, as the configuration file names them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FeedSettings {
    /// ZMQ address the events are published on (empty: no feed). Bound when it has `*` or
    /// is `ipc://`, connected to otherwise (a router that binds receives from the pools
    /// that connect), as vLLM's publisher does.
    pub kv_events_endpoint: String,
    /// ZMQ address (bound) of the replay socket: an 8-byte big-endian start sequence gets
    /// every kept batch from it on, then an end marker (sequence -1). Empty: none.
    pub kv_events_replay_endpoint: String,
    /// `array` (tagged positional events, llm-d's decoder) or `map` (tagged by `type`,
    /// newer vLLM).
    pub kv_events_encoding: Encoding,
    /// Tokens per announced block (vLLM's default block size).
    pub kv_events_block_size: u32,
    /// Each batch goes out once per topic: llm-d expects `kv@<pod>@<model>`, one per pod
    /// that reads from this pool; the default is one empty topic.
    pub kv_events_topics: Vec<String>,
    /// Batches kept for replay.
    pub kv_events_buffer_batches: usize,
    /// Bytes of events waiting to be sent before new ones are dropped.
    #[serde(with = "strata_settings::size")]
    pub kv_events_queue_bytes_max: u64,
    /// Batches a slow subscriber may have queued before it misses some (ZMQ's high-water
    /// mark).
    pub kv_events_hwm: u32,
}

impl Default for FeedSettings {
    fn default() -> Self {
        FeedSettings {
            kv_events_endpoint: String::new(),
            kv_events_replay_endpoint: String::new(),
            kv_events_encoding: Encoding::Array,
            kv_events_block_size: 16,
            kv_events_topics: vec![String::new()],
            kv_events_buffer_batches: 10_000,
            kv_events_queue_bytes_max: 64 << 20,
            kv_events_hwm: 100_000,
        }
    }
}

impl FeedSettings {
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=65_536).contains(&self.kv_events_block_size) {
            return Err("kv_events_block_size must be between 1 and 65536".into());
        }
        if self.kv_events_topics.is_empty() {
            return Err("kv_events_topics needs at least one topic (\"\" for none)".into());
        }
        if self.kv_events_buffer_batches == 0 || self.kv_events_buffer_batches > 10_000_000 {
            return Err("kv_events_buffer_batches must be between 1 and 10000000".into());
        }
        if self.kv_events_replay_endpoint.is_empty() || binds(&self.kv_events_replay_endpoint) {
            Ok(())
        } else {
            Err(
                "kv_events_replay_endpoint is bound: give a `*` host (tcp://*:5558), an \
                 address of this machine with `*`, or ipc://"
                    .into(),
            )
        }
    }
}
