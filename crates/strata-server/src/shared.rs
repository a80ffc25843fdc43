//! What every connection shares: the engine, the live settings, the client list, the gate
//! that makes `EXEC` atomic, `WATCH` versions, and the server's own figures.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Mutex, RwLock};
use strata_engine::Engine;

use crate::config::ServerConfig;
use crate::session::Peer;

strata_engine::define_stats! {
    /// The server's counters (its defences, connections and commands).
    counters ServerCounters;
    /// A snapshot of the server's figures.
    snapshot ServerStats;
    table SERVER_STATS;
    counters {
        total_connections_received: "strata_connections_total" "" "Client connections accepted.",
        rejected_connections: "strata_rejected_connections_total" "" "Connections refused: maxclients were connected.",
        total_commands_processed: "strata_commands_total" "" "Commands run.",
        auth_failures: "strata_auth_failures_total" "" "AUTH attempts with a wrong password.",
        auth_refused: "strata_auth_refused_total" "" "AUTH attempts refused unchecked: the address had too many failures this minute.",
        protected_mode_denied: "strata_clients_cut_off_total" "reason=\"protected_mode\"" "Connections refused by protected mode.",
        clients_cut_off_slow_request: "strata_clients_cut_off_total" "reason=\"slow_request\"" "Clients cut off for a request that did not arrive in time.",
        clients_cut_off_not_reading: "strata_clients_cut_off_total" "reason=\"not_reading\"" "Clients cut off for not reading their replies.",
        kvc_chunks_dropped: "strata_kvc_chunks_dropped_total" "" "KV-cache chunks deleted by KVC.DROP.",
        kvc_chunks_over_quota: "strata_kvc_chunks_over_quota_total" "" "KV-cache chunks dropped because their namespace was over its quota (KVC.QUOTA).",
        clients_cut_off_protocol_error: "strata_clients_cut_off_total" "reason=\"protocol_error\"" "Clients cut off for a malformed or oversized request.",
    }
    gauges {
        connected_clients: "strata_connected_clients" "" "Open client connections.",
        kvc_drops_running: "strata_kvc_drops_running" "" "KVC.DROP namespaces still being deleted.",
        cluster_lease_live: "strata_cluster_lease_live" "" "1 while this cluster node's lease surely lives (0 outside a cluster).",
        cluster_epoch: "strata_cluster_epoch" "" "The epoch of the slot map this node last saw.",
        cluster_slots_served: "strata_cluster_slots" "state=\"served\"" "This node's slots: served, moving away, moving here.",
        cluster_slots_moving_out: "strata_cluster_slots" "state=\"moving_out\"" "This node's slots: served, moving away, moving here.",
        cluster_slots_moving_in: "strata_cluster_slots" "state=\"moving_in\"" "This node's slots: served, moving away, moving here.",
        cluster_slots_adopting: "strata_cluster_slots" "state=\"adopting\"" "This node's slots still adopted from a lost node's bucket log (they answer -TRYAGAIN until adopted).",
        kv_events_sent: "strata_kv_events_total" "" "Events sent on the KV event feed (kv_events_endpoint).",
        kv_events_batches: "strata_kv_event_batches_total" "" "Batches sent on the KV event feed, each with the next sequence number.",
        kv_events_dropped: "strata_kv_events_dropped_total" "" "KV events dropped because kv_events_queue_bytes_max of them were waiting.",
        kv_events_replays: "strata_kv_event_replays_total" "" "Replay requests answered on kv_events_replay_endpoint.",
        kv_events_listings: "strata_kv_event_listings_total" "" "Listings of every chunk asked for (LIST) on kv_events_replay_endpoint.",
        kv_chunk_moves_dropped: "strata_kv_chunk_moves_dropped_total" "" "KV chunks deleted, demoted or returned whose move was not followed (65,536 were waiting): not announced, their tokens kept.",
    }
}

/// What `CLIENT LIST` shows of a connection, and the switch `CLIENT KILL` flips.
pub(crate) struct ClientEntry {
    pub(crate) peer: Peer,
    /// The connection's name, user, database and protocol, as its session last published
    /// them (`cmd::connection::publish`).
    pub(crate) name: String,
    pub(crate) user: String,
    pub(crate) db: u8,
    pub(crate) proto: u8,
    pub(crate) created: Instant,
    /// The last command run: its index in the command table plus one (0: none yet).
    pub(crate) last_cmd: Arc<std::sync::atomic::AtomicUsize>,
    pub(crate) killed: Arc<AtomicBool>,
    pub(crate) kill_wake: Arc<tokio::sync::Notify>,
    pub(crate) unblock: Arc<crate::blocked::Unblock>,
}

/// The last `STRATA.BACKUP`: running or not, progress, outcome.
#[derive(Default)]
pub(crate) struct BackupState {
    pub(crate) running: bool,
    pub(crate) url: String,
    pub(crate) done_bytes: u64,
    pub(crate) total_bytes: u64,
    /// "" before the first backup, "ok", or "err: <reason>".
    pub(crate) status: String,
}

/// The script or function running now, as `FUNCTION STATS` shows it.
#[derive(Clone)]
pub(crate) struct RunningScript {
    pub(crate) name: String,
    pub(crate) command: Vec<bytes::Bytes>,
    pub(crate) started: Instant,
    /// Libraries and functions when a function's run started (its VM is locked meanwhile).
    pub(crate) counts: Option<(usize, usize)>,
}

/// State shared by all connections.
pub(crate) struct Shared {
    pub(crate) engine: Engine,
    pub(crate) cfg: RwLock<ServerConfig>,
    pub(crate) clients: Mutex<HashMap<u64, ClientEntry>>,
    /// `clients.len()`, read without the lock (a connection reads it per reply); stored
    /// only with `clients` locked, right after a change.
    pub(crate) clients_open: AtomicUsize,
    pub(crate) next_client_id: AtomicU64,
    /// Every command runs holding this for reading; `EXEC` and other commands that must
    /// appear atomic hold it for writing.
    pub(crate) gate: tokio::sync::RwLock<()>,
    pub(crate) watches: crate::watch::WatchRegistry,
    pub(crate) metrics: crate::metrics::Metrics,
    pub(crate) shutdown: tokio::sync::watch::Sender<bool>,
    pub(crate) started: Instant,
    /// Unix seconds of the last `SAVE` that finished (0: none since the start).
    pub(crate) last_save_secs: AtomicU64,
    /// Whether a `SAVE` or `BGSAVE` runs now (one at a time).
    pub(crate) saving: std::sync::atomic::AtomicBool,
    pub(crate) counters: ServerCounters,
    pub(crate) auth_limiter: crate::auth::AuthLimiter,
    pub(crate) backup: Mutex<BackupState>,
    /// Clients waiting in a blocking pop, in the order they blocked.
    pub(crate) blocked: crate::blocked::Blocked,
    /// The Lua VM of `EVAL` and its script cache (one script runs at a time: it holds the
    /// gate).
    pub(crate) scripts: Arc<Mutex<strata_script::Vm>>,
    /// Function libraries (`FUNCTION`, `FCALL`), in a VM of their own.
    pub(crate) functions: Arc<Mutex<strata_script::Functions>>,
    /// The running script's state: busy, killed, written.
    pub(crate) script: Arc<strata_script::Control>,
    /// Woken when a script passes the busy threshold: clients waiting for the gate answer
    /// `-BUSY` instead.
    pub(crate) script_busy: Arc<tokio::sync::Notify>,
    /// The running script or function, its command and its start (`FUNCTION STATS`).
    pub(crate) running_script: Mutex<Option<RunningScript>>,
    /// This node's membership of a cluster (`None`: a single node).
    pub(crate) cluster: Option<strata_cluster::Cluster>,
    /// The KV-cache pool's event feed, when `kv_events_endpoint` is set.
    pub(crate) kv_feed: std::sync::OnceLock<strata_kvfeed::Feed>,
    /// `KVC.DROP`s still deleting their namespace.
    pub(crate) kvc_drops_running: AtomicU64,
    /// The bytes each KV-cache namespace holds on this node, and its quota (`KVC.QUOTA`).
    pub(crate) kvc_quotas: strata_kvcache::Quotas<strata_engine::Key>,
    /// Idle connections to the other nodes of the cluster.
    pub(crate) links: crate::link::Links,
    /// Redis's encoding thresholds as `CONFIG SET` left them (no effect in Strata).
    pub(crate) encoding_params: Mutex<HashMap<&'static str, i64>>,
}

impl Shared {
    /// Every figure of the server.
    pub(crate) fn stats(&self) -> ServerStats {
        let mut s = ServerStats::default();
        self.counters.load_into(&mut s);
        s.connected_clients = self.clients_open.load(Ordering::Relaxed) as u64;
        s.kvc_drops_running = self.kvc_drops_running.load(Ordering::Relaxed);
        s.kv_chunk_moves_dropped = self.engine.tier_changes_dropped();
        if let Some(c) = &self.cluster {
            cluster_figures(c, &mut s);
        }
        if let Some(f) = self.kv_feed.get() {
            let f = f.stats();
            s.kv_events_sent = f.events.load(Ordering::Relaxed);
            s.kv_events_batches = f.batches.load(Ordering::Relaxed);
            s.kv_events_dropped = f.dropped.load(Ordering::Relaxed);
            s.kv_events_replays = f.replays.load(Ordering::Relaxed);
            s.kv_events_listings = f.listings.load(Ordering::Relaxed);
        }
        s
    }
}

/// This node's part of the cluster, in the server's figures (`INFO cluster`, `/metrics`).
/// The cluster's figures of this node, into `s`.
fn cluster_figures(cluster: &strata_cluster::Cluster, s: &mut ServerStats) {
    let map = cluster.map();
    let me = cluster.me();
    s.cluster_lease_live = cluster.live() as u64;
    s.cluster_epoch = map.epoch;
    s.cluster_slots_served = me.map_or(0, |i| map.slot_counts()[i]) as u64;
    s.cluster_slots_adopting = (0..strata_format::keys::SLOT_COUNT)
        .filter(|&slot| me.is_some() && map.owner(slot) == me && map.adopting(slot).is_some())
        .count() as u64;
    for m in map.moves() {
        let n = (m.last - m.first + 1) as u64;
        if Some(m.from) == me {
            s.cluster_slots_moving_out += n;
        }
        if Some(m.to) == me {
            s.cluster_slots_moving_in += n;
        }
    }
}
