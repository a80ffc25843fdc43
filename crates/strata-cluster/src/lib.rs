//! A Strata cluster on etcd, with no consensus of its own:
//!
//! - etcd holds the slot map (16384 slots → node; [`SlotMap`]), one key per live node bound
//!   to a lease the node keeps alive, and the controller's key (an election: the first
//!   node to create it while it is absent). Keys live under `/strata/<cluster_name>/`
//!   (`keys.rs`).
//! - Every node watches the map and routes by it ([`Cluster::route`]); a node whose lease
//!   may have lapsed (no renewal for a TTL) refuses commands on its own ([`Cluster::live`]),
//!   so a paused or cut-off node never serves slots that may have moved.
//! - The controller (`controller.rs`) changes the map, each change one etcd transaction that
//!   compares the controller key with its own id and the map's revision with the one it
//!   read, so a stale controller cannot commit: it hands the slots of a node whose lease
//!   expired to the live nodes, and answers operators' requests (`admin.rs`).

mod admin;
mod controller;
mod epochs;
mod failover;
mod join;
mod keys;
mod member;
mod slots;

use serde::{Deserialize, Serialize};

pub use admin::{rebalance, remove_node, status, Status};
pub use epochs::{claim_epoch, earlier_epochs, epoch_holder};
pub use member::{node_id, BucketFuture, Cluster, MoveSeen, Route, SharedBucket, SlotState};
pub use slots::{check_node_id, LostNode, Move, NodeAddr, SlotMap, SlotRange};

/// The cluster settings of a node (flattened into the binary's configuration).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct ClusterSettings {
    /// etcd endpoints, comma-separated (`http://127.0.0.1:2379`). Empty: a single node, no
    /// cluster.
    pub cluster_etcd: String,
    /// The cluster's name: its keys in etcd live under `/strata/<name>/`.
    pub cluster_name: String,
    /// Seconds a node's lease lives without renewal. A node that cannot renew it for this
    /// long refuses commands (`-CLUSTERDOWN`); once it has expired in etcd, the
    /// controller gives the node's slots to the live nodes.
    pub cluster_lease_ttl_s: u64,
    /// Most bytes per second a node sends while it moves slots to another (each slot's
    /// writes wait meanwhile, so a lower rate makes a move gentler, not shorter for them).
    #[serde(with = "strata_settings::size")]
    pub cluster_move_bytes_per_s: u64,
    /// The host clients and other nodes reach this node at (in `-MOVED` and `CLUSTER
    /// SLOTS`); empty: the bind address (127.0.0.1 if that is a wildcard).
    pub cluster_announce_host: String,
    /// KV-cache chunks per group (`strata_kvcache::GROUP_CHUNKS_DEFAULT`): a group's chunks
    /// share one slot, and `KVC.WHERE` groups the chunks it is asked about this way. Clients
    /// must group the same way.
    pub kvc_group_chunks: usize,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        ClusterSettings {
            cluster_etcd: String::new(),
            cluster_name: "strata".into(),
            cluster_lease_ttl_s: 10,
            cluster_move_bytes_per_s: 64 << 20,
            cluster_announce_host: String::new(),
            kvc_group_chunks: strata_kvcache::GROUP_CHUNKS_DEFAULT,
        }
    }
}

/// Most KV-cache chunks per group.
const GROUP_CHUNKS_MAX: usize = 4096;

/// Longest lease TTL accepted, in seconds.
const LEASE_TTL_S_MAX: u64 = 3600;

impl ClusterSettings {
    /// Whether this node joins a cluster.
    pub fn enabled(&self) -> bool {
        !self.cluster_etcd.trim().is_empty()
    }

    /// The etcd endpoints.
    pub fn endpoints(&self) -> Vec<String> {
        split_endpoints(&self.cluster_etcd)
    }

    pub fn validate(&self) -> Result<()> {
        if !(1..=GROUP_CHUNKS_MAX).contains(&self.kvc_group_chunks) {
            return Err(Error::Invalid(format!(
                "kvc_group_chunks must be between 1 and {GROUP_CHUNKS_MAX}"
            )));
        }
        if !(2..=LEASE_TTL_S_MAX).contains(&self.cluster_lease_ttl_s) {
            return Err(Error::Invalid(format!(
                "cluster_lease_ttl_s must be between 2 and {LEASE_TTL_S_MAX}"
            )));
        }
        let name = &self.cluster_name;
        if name.is_empty()
            || name.len() > 64
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(Error::Invalid(format!(
                "cluster_name '{name}' must be 1 to 64 letters, digits, '-' or '_'"
            )));
        }
        Ok(())
    }
}

/// Endpoints from a comma-separated list, each with `http://` unless it names a scheme.
pub fn split_endpoints(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| {
            if e.contains("://") {
                e.to_string()
            } else {
                format!("http://{e}")
            }
        })
        .collect()
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Invalid(String),
    #[error("etcd: {0}")]
    Etcd(String),
    #[error("corrupt cluster state in etcd: {0}")]
    Corrupt(String),
}

impl From<etcd_client::Error> for Error {
    fn from(e: etcd_client::Error) -> Self {
        Error::Etcd(e.to_string())
    }
}

pub type Result<T> = std::result::Result<T, Error>;
