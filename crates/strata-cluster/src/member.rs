//! This node as a member of a cluster: its lease and key in etcd, kept alive; the fence
//! that stops it serving once the lease may have lapsed; the slot map, watched; the routing
//! of a slot to this node or another.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, EventType, GetOptions, PutOptions, WatchOptions};
use parking_lot::RwLock;

use crate::keys::{connect, Keys};
use crate::slots::{check_node_id, NodeAddr, SlotMap};
use crate::{ClusterSettings, Error, Result};

/// Where a command for a slot goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// This node serves the slot.
    Local,
    /// Another node does: `-MOVED slot endpoint`.
    Moved(String),
    /// A write to a slot whose keys are being copied: `-TRYAGAIN`.
    TryAgain,
    /// No node serves it, or this node cannot tell (`-CLUSTERDOWN`), with the reason.
    Down(&'static str),
}

/// Where this node is in moving a slot. The source serves it as usual, then copies its
/// keys to the target (writes wait: `-TRYAGAIN`), then hands it over (everything goes to
/// the target with `-MOVED`); the target, once handed the slot, serves it before the
/// controller's map says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    Serving = 0,
    Copying = 1,
    Handed = 2,
    /// On the target: the source handed the slot over.
    Taken = 3,
}

/// What this node last did in a move of a slot, and with which node: kept past the map's
/// change, so that when the other end is lost this node knows whose keys of the slot are
/// the newest (see `adopts_from`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MoveSeen {
    /// This node took the slot over from that node and served it since.
    TookFrom(String),
    /// This node was copying the slot to that node, and had not handed it over.
    CopyingTo(String),
    /// This node handed the slot over to that node, which served it since.
    HandedTo(String),
}

/// The map as this node last saw it, and this node's index in it.
struct View {
    map: Arc<SlotMap>,
    me: Option<usize>,
    /// The map's revision in etcd (0: no map yet).
    revision: i64,
}

/// A future of the bucket's answer.
pub type BucketFuture<T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = std::result::Result<T, String>> + Send>>;

/// The bucket the nodes share, as the controller acts on it. Handed to `Cluster::join` by
/// whoever holds the bucket (the binary, through its store).
pub trait SharedBucket: Send + Sync {
    /// Ends a lost node's writer epoch (a fence object at its log's first free number);
    /// gives that number.
    fn fence(&self, epoch: u64) -> BucketFuture<u64>;
    /// Deletes what a lost node wrote under `epoch` once its slots' new owners adopted it.
    fn retire(&self, epoch: u64) -> BucketFuture<()>;
}

pub(crate) struct Inner {
    /// Fences a lost node's epochs before its slots go to others; `None`: the nodes share
    /// no bucket, and a lost node's slots start empty.
    pub(crate) bucket: Option<Arc<dyn SharedBucket>>,
    pub(crate) settings: ClusterSettings,
    pub(crate) keys: Keys,
    pub(crate) id: String,
    pub(crate) addr: NodeAddr,
    view: RwLock<View>,
    /// Milliseconds since `base` until which the lease surely lives (the send time of the
    /// last renewal etcd answered, plus the TTL it gave).
    live_until_ms: AtomicU64,
    /// The lease this node's keys are bound to.
    pub(crate) lease: AtomicU64,
    base: Instant,
    pub(crate) etcd: Client,
    /// Per slot, a [`SlotState`] (only slots moving away from this node leave `Serving`).
    slot_states: Vec<AtomicU8>,
    /// Per slot, what this node last did in a move of it (forgotten once the slot leaves).
    moves_seen: parking_lot::Mutex<std::collections::HashMap<u16, MoveSeen>>,
    /// Bumped with every map this node takes: the slot mover waits on it.
    map_changed: tokio::sync::watch::Sender<u64>,
}

/// A handle to this node's membership; cheap to clone.
#[derive(Clone)]
pub struct Cluster {
    pub(crate) inner: Arc<Inner>,
}

/// How long a request to etcd may take: a quarter of the lease's TTL, so a renewal that
/// fails still leaves time for the next.
fn request_timeout(s: &ClusterSettings) -> Duration {
    Duration::from_millis(s.cluster_lease_ttl_s * 1000 / 4)
}

/// The file in the data directory that keeps the node's id across restarts.
const NODE_ID_FILE: &str = "cluster-node-id";

/// This node's id: read from the data directory, or made (40 random hex digits, as Redis
/// Cluster's) and written there the first time.
pub fn node_id(data_dir: &Path) -> Result<String> {
    let path = data_dir.join(NODE_ID_FILE);
    match std::fs::read_to_string(&path) {
        Ok(s) => {
            let id = s.trim().to_string();
            check_node_id(&id)?;
            Ok(id)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut bytes = [0u8; 20];
            use std::io::Read;
            std::fs::File::open("/dev/urandom")
                .and_then(|mut f| f.read_exact(&mut bytes))
                .map_err(|e| Error::Invalid(format!("cannot read /dev/urandom: {e}")))?;
            let id: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            std::fs::create_dir_all(data_dir)
                .and_then(|_| std::fs::write(&path, format!("{id}\n")))
                .map_err(|e| Error::Invalid(format!("cannot write {}: {e}", path.display())))?;
            Ok(id)
        }
        Err(e) => Err(Error::Invalid(format!(
            "cannot read {}: {e}",
            path.display()
        ))),
    }
}

impl Inner {
    /// Connects to etcd, takes a lease, registers this node's address and reads the slot
    /// map, then keeps the lease alive and watches the map in tasks of its own until the
    /// process ends.
    pub(crate) async fn start(
        settings: &ClusterSettings,
        id: String,
        addr: NodeAddr,
        bucket: Option<Arc<dyn SharedBucket>>,
    ) -> Result<Arc<Inner>> {
        settings.validate()?;
        check_node_id(&id)?;
        let etcd = connect(&settings.endpoints(), request_timeout(settings))
            .await
            .map_err(|e| {
                Error::Etcd(format!(
                    "cannot reach etcd at {} ({e}); is cluster_etcd right?",
                    settings.cluster_etcd
                ))
            })?;
        let inner = Arc::new(Inner {
            bucket,
            keys: Keys::new(&settings.cluster_name),
            settings: settings.clone(),
            id,
            addr,
            view: RwLock::new(View {
                map: Arc::new(SlotMap::default()),
                me: None,
                revision: 0,
            }),
            live_until_ms: AtomicU64::new(0),
            lease: AtomicU64::new(0),
            base: Instant::now(),
            etcd,
            slot_states: (0..strata_format::keys::SLOT_COUNT)
                .map(|_| AtomicU8::new(SlotState::Serving as u8))
                .collect(),
            moves_seen: Default::default(),
            map_changed: tokio::sync::watch::channel(0).0,
        });
        inner.register().await?;
        tokio::spawn(keep_alive(Arc::clone(&inner)));
        tokio::spawn(watch_map(Arc::clone(&inner)));
        Ok(inner)
    }
}

impl Cluster {
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    pub fn settings(&self) -> &ClusterSettings {
        &self.inner.settings
    }

    pub fn addr(&self) -> &NodeAddr {
        &self.inner.addr
    }

    /// The slot map as this node last saw it.
    pub fn map(&self) -> Arc<SlotMap> {
        Arc::clone(&self.inner.view.read().map)
    }

    /// This node's index in [`Cluster::map`]'s nodes, if the map names it.
    pub fn me(&self) -> Option<usize> {
        self.inner.view.read().me
    }

    /// Whether this node's lease surely still lives: it may serve.
    pub fn live(&self) -> bool {
        self.inner.live()
    }

    /// Where a command on `slot` goes: `write` if it may change the slot's keys, `asking`
    /// if the client sent `ASKING` just before (it follows an `-ASK`).
    pub fn route(&self, slot: u16, write: bool, asking: bool) -> Route {
        if !self.inner.live() {
            return Route::Down(
                "CLUSTERDOWN this node lost contact with etcd (its lease may have expired)",
            );
        }
        let v = self.inner.view.read();
        let target = v.map.moving_to(slot);
        match v.map.owner(slot) {
            None => Route::Down("CLUSTERDOWN Hash slot not served"),
            // Its keys are being adopted from a lost node's bucket log: not yet.
            Some(o) if Some(o) == v.me && v.map.adopting(slot).is_some() => Route::TryAgain,
            Some(o) if Some(o) == v.me => match (self.slot_state(slot), target) {
                (SlotState::Copying, Some(_)) if write => Route::TryAgain,
                (SlotState::Handed, Some(t)) => Route::Moved(v.map.addr(t).endpoint()),
                _ => Route::Local,
            },
            // A slot moving here: served once the source handed it over, or to a client
            // that says `ASKING`.
            Some(_)
                if target.is_some()
                    && target == v.me
                    && (asking || self.slot_state(slot) == SlotState::Taken) =>
            {
                Route::Local
            }
            Some(o) => Route::Moved(v.map.addr(o).endpoint()),
        }
    }

    /// Where this node is in moving `slot` away.
    pub fn slot_state(&self, slot: u16) -> SlotState {
        match self.inner.slot_states[slot as usize].load(Ordering::Acquire) {
            1 => SlotState::Copying,
            2 => SlotState::Handed,
            3 => SlotState::Taken,
            _ => SlotState::Serving,
        }
    }

    pub fn set_slot_state(&self, slot: u16, state: SlotState) {
        self.inner.slot_states[slot as usize].store(state as u8, Ordering::Release);
    }

    /// Notes what this node did in a move of `slot`; `None` forgets it.
    pub fn note_move(&self, slot: u16, seen: Option<MoveSeen>) {
        let mut m = self.inner.moves_seen.lock();
        match seen {
            Some(s) => m.insert(slot, s),
            None => m.remove(&slot),
        };
    }

    /// Whether this node, adopting `slot` from lost node `lost`, must take the lost node's
    /// keys of it: not if it took the slot over from that node; if it was moving the slot
    /// to that node (the map marks it kept), only if it had handed it over.
    pub fn adopts_from(&self, slot: u16, lost: &str) -> bool {
        let kept = self.inner.view.read().map.kept(slot);
        match self.inner.moves_seen.lock().get(&slot) {
            Some(MoveSeen::TookFrom(id)) if id == lost => false,
            Some(MoveSeen::HandedTo(id)) if id == lost => true,
            _ => !kept,
        }
    }

    /// Changes whenever this node takes a new map.
    pub fn map_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.map_changed.subscribe()
    }

    /// Tells the controller that slots `first..=last` are copied to the node they move to,
    /// so it can give them to it.
    pub async fn report_moved(&self, first: u16, last: u16) -> Result<()> {
        let key = self.inner.keys.moved(&self.inner.id, first, last);
        self.inner.etcd.clone().put(key, "", None).await?;
        Ok(())
    }

    /// The runs of this node's slots it must adopt from a lost node's bucket log, each with
    /// that node (they answer `-TRYAGAIN` until it reports them adopted).
    pub fn adoptions(&self) -> Vec<(u16, u16, crate::slots::LostNode)> {
        let v = self.inner.view.read();
        v.me.map_or_else(Vec::new, |me| v.map.adoptions_of(me))
    }

    /// Tells the controller that slots `first..=last` are adopted (this node holds what the
    /// lost node's log left them), so it clears their marks and they are served.
    pub async fn report_adopted(&self, first: u16, last: u16) -> Result<()> {
        let key = self.inner.keys.adopted(&self.inner.id, first, last);
        self.inner.etcd.clone().put(key, "", None).await?;
        Ok(())
    }

    /// Whether slot `slot` is moving to this node (it may take the owner's copies).
    pub fn importing(&self, slot: u16) -> bool {
        let v = self.inner.view.read();
        v.me.is_some() && v.map.moving_to(slot) == v.me
    }
}

impl Inner {
    fn now_ms(&self) -> u64 {
        self.base.elapsed().as_millis() as u64
    }

    pub(crate) fn live(&self) -> bool {
        self.now_ms() < self.live_until_ms.load(Ordering::Acquire)
    }

    fn ttl(&self) -> Duration {
        Duration::from_secs(self.settings.cluster_lease_ttl_s)
    }

    /// Takes a new lease, writes this node's key under it, and reads the map; only then
    /// does the node count as live (a node coming back must not serve from an old map).
    async fn register(&self) -> Result<()> {
        let sent = self.now_ms();
        let mut etcd = self.etcd.clone();
        let lease = etcd
            .lease_grant(self.settings.cluster_lease_ttl_s as i64, None)
            .await?;
        let addr = serde_json::to_vec(&self.addr).expect("an address encodes");
        etcd.put(
            self.keys.node(&self.id),
            addr,
            Some(PutOptions::new().with_lease(lease.id())),
        )
        .await?;
        self.lease.store(lease.id() as u64, Ordering::Release);
        self.reload_map().await?;
        self.live_until_ms
            .store(sent + lease.ttl() as u64 * 1000, Ordering::Release);
        tracing::info!(node = %self.id, lease = lease.id(), "registered in the cluster");
        Ok(())
    }

    /// Renews the lease once; `Ok(false)` if etcd no longer knows it.
    async fn renew(&self) -> Result<bool> {
        let sent = self.now_ms();
        let lease = self.lease.load(Ordering::Acquire) as i64;
        let mut etcd = self.etcd.clone();
        let answer = async {
            let (mut keeper, mut stream) = etcd.lease_keep_alive(lease).await?;
            keeper.keep_alive().await?;
            stream.message().await
        };
        let answer = match tokio::time::timeout(self.ttl() / 4, answer).await {
            Err(_) => return Err(Error::Etcd("lease renewal timed out".into())),
            // The client's word for a lease etcd no longer has.
            Ok(Err(etcd_client::Error::LeaseKeepAliveError(m))) if m.contains("not found") => {
                return Ok(false)
            }
            Ok(r) => r?,
        };
        match answer {
            Some(r) if r.ttl() > 0 => {
                self.live_until_ms
                    .store(sent + r.ttl() as u64 * 1000, Ordering::Release);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Reads the map from etcd and makes it this node's view.
    pub(crate) async fn reload_map(&self) -> Result<()> {
        let mut etcd = self.etcd.clone();
        let r = etcd.get(self.keys.slots(), None).await?;
        match r.kvs().first() {
            Some(kv) => self.apply(SlotMap::decode(kv.value())?, kv.mod_revision()),
            None => self.apply(SlotMap::default(), 0),
        }
        Ok(())
    }

    /// Makes `map` (at etcd revision `revision`) this node's view, unless it has a newer one.
    fn apply(&self, map: SlotMap, revision: i64) {
        let mut v = self.view.write();
        if revision != 0 && revision < v.revision {
            return;
        }
        if v.revision != revision {
            tracing::info!(epoch = map.epoch, revision, "slot map changed");
        }
        v.me = map.index_of(&self.id);
        v.map = Arc::new(map);
        v.revision = revision;
        drop(v);
        self.map_changed.send_modify(|n| *n += 1);
    }

    /// The live nodes (their keys in etcd), by id.
    pub(crate) async fn live_nodes(&self) -> Result<BTreeMap<String, NodeAddr>> {
        live_nodes(&self.etcd, &self.keys).await
    }
}

/// The live nodes of the cluster whose keys are `keys` (their keys in etcd), by id.
pub(crate) async fn live_nodes(etcd: &Client, keys: &Keys) -> Result<BTreeMap<String, NodeAddr>> {
    let prefix = keys.nodes();
    let r = etcd
        .clone()
        .get(prefix.as_str(), Some(GetOptions::new().with_prefix()))
        .await?;
    let mut out = BTreeMap::new();
    for kv in r.kvs() {
        let id = String::from_utf8_lossy(&kv.key()[prefix.len()..]).into_owned();
        let addr: NodeAddr = serde_json::from_slice(kv.value())
            .map_err(|e| Error::Corrupt(format!("node {id}'s address: {e}")))?;
        out.insert(id, addr);
    }
    Ok(out)
}

/// Renews the lease four times per TTL; if etcd has forgotten it (this node was cut off or
/// paused past the TTL), registers again with a new one.
async fn keep_alive(inner: Arc<Inner>) {
    let period = inner.ttl() / 4;
    loop {
        tokio::time::sleep(period).await;
        let renewed = match inner.renew().await {
            Ok(true) => continue,
            Ok(false) => {
                tracing::warn!(node = %inner.id, "the lease expired in etcd: registering again");
                inner.register().await
            }
            Err(e) => Err(e),
        };
        if let Err(e) = renewed {
            tracing::warn!(error = %e, live = inner.live(), "cannot renew the cluster lease");
        }
    }
}

/// Follows the map's key in etcd; after any break in the watch, reads the map again.
async fn watch_map(inner: Arc<Inner>) {
    loop {
        if let Err(e) = watch_once(&inner).await {
            tracing::warn!(error = %e, "watching the slot map failed; retrying");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        if let Err(e) = inner.reload_map().await {
            tracing::warn!(error = %e, "cannot read the slot map");
        }
    }
}

async fn watch_once(inner: &Inner) -> Result<()> {
    let from = inner.view.read().revision + 1;
    let mut etcd = inner.etcd.clone();
    let (_watcher, mut stream) = etcd
        .watch(
            inner.keys.slots(),
            Some(WatchOptions::new().with_start_revision(from)),
        )
        .await?;
    while let Some(resp) = stream.message().await? {
        if resp.canceled() {
            return Err(Error::Etcd("the watch was cancelled".into()));
        }
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            match ev.event_type() {
                EventType::Put => inner.apply(SlotMap::decode(kv.value())?, kv.mod_revision()),
                EventType::Delete => inner.apply(SlotMap::default(), kv.mod_revision()),
            }
        }
    }
    Ok(())
}
