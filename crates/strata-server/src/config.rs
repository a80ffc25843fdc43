//! The server's settings ([`ServerConfig`]), as the configuration file names them, and
//! their limits.

use serde::{Deserialize, Serialize};

use crate::auth::AclUser;

/// Settings of the server, as the configuration file names them; the live ones can be
/// changed with `CONFIG SET`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ServerConfig {
    /// Password of the `default` user; empty means none.
    pub requirepass: String,
    /// Named users, each `name:password:role` with role `readonly`, `readwrite` or `admin`.
    pub users: Vec<AclUser>,
    /// Most clients connected at once; more are refused.
    pub maxclients: u64,
    /// Idle seconds before a client is disconnected (0 = never).
    #[serde(rename = "timeout")]
    pub timeout_secs: u64,
    /// Largest bulk string accepted on the wire, and so the largest value (Redis's name).
    #[serde(with = "strata_settings::size")]
    pub proto_max_bulk_len: u64,
    /// Bytes a client may have buffered in unparsed requests, and in its `MULTI` queue.
    #[serde(with = "strata_settings::size")]
    pub client_query_buffer_limit: u64,
    /// Bytes of values one reply may carry.
    #[serde(with = "strata_settings::size")]
    pub client_output_buffer_limit: u64,
    /// Seconds a request may take to arrive once its first byte is in (slowloris guard);
    /// 0 = no limit.
    #[serde(rename = "client_request_timeout")]
    pub client_request_timeout_secs: u64,
    /// Seconds a reply may wait for a client that does not read; 0 = no limit.
    #[serde(rename = "client_write_timeout")]
    pub client_write_timeout_secs: u64,
    /// Refuse clients from other than 127.0.0.1 / ::1 while no password is set.
    pub protected_mode: bool,
    /// Failed `AUTH` attempts per client address per minute before `AUTH` is refused (0 = no
    /// limit).
    pub auth_failures_per_minute_max: u32,
    /// Logical databases (`SELECT 0` to `databases - 1`), each its own keyspace in every
    /// tier; at most [`DATABASES_MAX`].
    pub databases: u32,
    /// Milliseconds a Lua script may run (Redis's `busy-reply-threshold`); past it the
    /// script is stopped with an error (0 = no limit).
    #[serde(rename = "busy_reply_threshold")]
    pub busy_reply_threshold_ms: u64,
    /// The most anonymous memory the process may hold (Redis's name; 0 = no limit). RocksDB's
    /// budgets are carved out of it (`memory::split`), DRAM's budget is what remains and
    /// moves at run time to keep the process within it (`memory.rs`). `CONFIG SET` changes
    /// the limit while the server runs, and RocksDB's budgets with it (never past what they
    /// were at start, `memory::shares_at`).
    #[serde(with = "strata_settings::size")]
    pub maxmemory: u64,
}

/// The settings `CONFIG GET` answers by Redis's name: the key in the configuration file,
/// the `CONFIG` name, and whether `CONFIG SET` changes it while the server runs.
/// (`appendfsync` reports `durability`: `sync`, `group` or `none`.)
pub const CONFIG_NAMES: &[(&str, &str, bool)] = &[
    ("maxclients", "maxclients", true),
    ("timeout", "timeout", true),
    ("requirepass", "requirepass", true),
    ("protected_mode", "protected-mode", true),
    ("proto_max_bulk_len", "proto-max-bulk-len", true),
    (
        "client_query_buffer_limit",
        "client-query-buffer-limit",
        true,
    ),
    (
        "client_output_buffer_limit",
        "client-output-buffer-limit",
        true,
    ),
    ("maxmemory", "maxmemory", true),
    ("busy_reply_threshold", "busy-reply-threshold", true),
    ("databases", "databases", false),
    ("durability", "appendfsync", false),
];

/// The most databases the key layout holds (its first byte).
pub const DATABASES_MAX: u32 = 256;

/// The least `maxmemory` other than 0: below it the process's fixed needs (RocksDB's
/// tables, the runtime, the Lua VM) leave DRAM nothing.
pub const MAXMEMORY_MIN: u64 = 64 << 20;

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            requirepass: String::new(),
            users: Vec::new(),
            maxclients: 10_000,
            timeout_secs: 0,
            proto_max_bulk_len: strata_format::VALUE_BYTES_MAX as u64,
            client_query_buffer_limit: 1 << 30,
            client_output_buffer_limit: 1 << 30,
            client_request_timeout_secs: 60,
            client_write_timeout_secs: 60,
            protected_mode: true,
            auth_failures_per_minute_max: 10,
            databases: 16,
            busy_reply_threshold_ms: 5000,
            maxmemory: 0,
        }
    }
}

impl ServerConfig {
    /// Whether no password is set (neither `requirepass` nor any user): clients start
    /// authenticated, and protected mode admits only local ones.
    pub fn is_open(&self) -> bool {
        self.requirepass.is_empty() && self.users.is_empty()
    }

    /// Checks for values that cannot work.
    pub fn validate(&self) -> Result<(), String> {
        if self.proto_max_bulk_len > strata_format::VALUE_BYTES_MAX as u64 {
            return Err(format!(
                "proto_max_bulk_len may not exceed {} (the largest value Strata stores)",
                strata_format::VALUE_BYTES_MAX
            ));
        }
        if self.maxclients == 0 {
            return Err("maxclients must be at least 1".into());
        }
        if self.databases == 0 || self.databases > DATABASES_MAX {
            return Err(format!("databases must be between 1 and {DATABASES_MAX}"));
        }
        check_maxmemory(self.maxmemory)?;
        Ok(())
    }
}

/// Checks a `maxmemory` (at start, or from `CONFIG SET`).
pub(crate) fn check_maxmemory(bytes: u64) -> Result<(), String> {
    if bytes != 0 && bytes < MAXMEMORY_MIN {
        return Err(format!(
            "maxmemory must be 0 (no limit) or at least {} MiB",
            MAXMEMORY_MIN >> 20
        ));
    }
    Ok(())
}
