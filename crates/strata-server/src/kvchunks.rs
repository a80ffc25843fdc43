//! What follows a KV-cache chunk's moves: the engine hands over each chunk (`kvc:` key)
//! deleted, demoted to the object store or returned from it ([`strata_engine::TierChange`]);
//! this task announces the move on the KV event feed (when there is one) from the tokens
//! kept beside the chunk, deletes those tokens once the chunk is gone, and takes a chunk
//! gone off its namespace's ledger of quotas ([`strata_kvcache::Quotas`]). Chunks a
//! namespace gives up for its quota are deleted here (the deletion is then followed like
//! any other). At start every chunk held is counted in its namespace's ledger. Listings
//! (every chunk this node holds, for a router that asks the replay socket) are made here
//! too.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use strata_engine::{Key, Move, Saved, TierChange, Written};
use strata_kvfeed::{Event, Feed, Lister, ListingHook, Medium};

use crate::shared::Shared;

/// Chunk moves waiting for this task before the engine drops them (and counts them).
const WAITING_MAX: usize = 65_536;

/// Starts following the chunks' moves (once per engine), and counts the chunks held in
/// their namespaces' ledgers (in the background) after loading the quotas saved.
pub(crate) fn start(shared: &Arc<Shared>) {
    if let Err(e) = load_quotas(shared) {
        tracing::error!(error = %e, "the KV-cache quotas saved were not loaded");
    }
    let Some(mut rx) = shared
        .engine
        .watch_tiers(strata_kvcache::CHUNK_PREFIX, WAITING_MAX)
    else {
        return;
    };
    let counting = Arc::clone(shared);
    tokio::spawn(async move {
        if let Err(e) = count_held(&counting).await {
            tracing::warn!(error = %e, "the KV-cache chunks held were not all counted");
        }
    });
    let shared = Arc::downgrade(shared);
    tokio::spawn(async move {
        while let Some(change) = rx.recv().await {
            let Some(shared) = shared.upgrade() else {
                return;
            };
            if let Err(e) = follow(&shared, &change).await {
                tracing::debug!(error = %e, "a KV chunk's move not followed");
            }
        }
    });
}

/// The quotas [`save_quotas`] left, into the ledger.
fn load_quotas(shared: &Shared) -> Result<(), String> {
    let Some(saved) = shared
        .engine
        .saved(Saved::KvcQuotas)
        .map_err(|e| e.to_string())?
    else {
        return Ok(());
    };
    let quotas = strata_kvcache::quota::decode_quotas(&saved).ok_or("not in their form")?;
    for (ns, bytes) in quotas {
        shared.kvc_quotas.set_quota(&ns, bytes);
    }
    Ok(())
}

/// Saves every quota of the ledger durably.
pub(crate) fn save_quotas(shared: &Shared) -> strata_engine::Result<()> {
    let quotas = shared.kvc_quotas.quotas();
    let payload = (!quotas.is_empty()).then(|| strata_kvcache::quota::encode_quotas(&quotas));
    shared
        .engine
        .save_server(Saved::KvcQuotas, payload.as_deref())
}

/// The namespace of chunk `key` (empty for a key that is not a chunk's).
fn namespace_of(key: &Key) -> &[u8] {
    strata_kvcache::split_chunk_key(key.client()).map_or(&[], |c| c.ns)
}

/// Deletes `chunks`, given up by their namespace for its quota (already off its ledger), in
/// one batch (`None`: there were none).
pub(crate) fn drop_over_quota(
    shared: &Shared,
    chunks: &[Key],
) -> strata_engine::Result<Option<Written<usize>>> {
    if chunks.is_empty() {
        return Ok(None);
    }
    let refs: Vec<&Key> = chunks.iter().collect();
    let deleted = shared.engine.delete_many(&refs)?;
    for k in chunks {
        shared.watches.touch(k);
    }
    shared
        .counters
        .kvc_chunks_over_quota
        .fetch_add(chunks.len() as u64, Ordering::Relaxed);
    Ok(Some(deleted))
}

/// Counts chunks found by a scan of database `db` in their namespaces' ledgers (before
/// any use: they are their namespaces' least recently used), dropping what takes a
/// namespace past its quota.
fn count_found(shared: &Shared, db: u8, items: &[strata_engine::ScanItem]) {
    for item in items {
        let key = shared.engine.key(db, &item.key);
        let ns = namespace_of(&key).to_vec();
        let over = shared.kvc_quotas.stored(&ns, [(key, item.value_len)]);
        if let Err(e) = drop_over_quota(shared, &over) {
            tracing::warn!(error = %e, "KV-cache chunks over their quota not dropped");
        }
    }
}

/// Every chunk of every database, counted in its namespace's ledger.
async fn count_held(shared: &Shared) -> strata_engine::Result<()> {
    shared.engine.settle_beside().await;
    let mut pages = ChunkPages::new(shared);
    while let Some((db, items)) = pages.next(&shared.engine)? {
        count_found(shared, db, &items);
    }
    Ok(())
}

/// The pages of every chunk this node holds, database after database.
struct ChunkPages {
    db: u8,
    databases: u8,
    cursor: Option<Bytes>,
}

impl ChunkPages {
    fn new(shared: &Shared) -> Self {
        ChunkPages {
            db: 0,
            databases: shared.cfg.read().databases as u8,
            cursor: None,
        }
    }

    /// The next page (`None` after the last database's last page).
    fn next(
        &mut self,
        engine: &strata_engine::Engine,
    ) -> strata_engine::Result<Option<(u8, Vec<strata_engine::ScanItem>)>> {
        while self.db < self.databases {
            let db = self.db;
            let page = engine.scan_prefix(
                db,
                strata_kvcache::CHUNK_PREFIX,
                self.cursor.as_deref(),
                LISTED_PER_BATCH,
            )?;
            self.cursor = page.next;
            if self.cursor.is_none() {
                self.db += 1;
            }
            if !page.items.is_empty() || self.cursor.is_some() {
                return Ok(Some((db, page.items)));
            }
        }
        Ok(None)
    }
}

/// The key of the tokens kept beside chunk `key`.
fn tokens_key(key: &Key) -> Key {
    Key::new(
        key.db(),
        key.slot(),
        &strata_kvcache::tokens_key_of(key.client()),
    )
}

async fn follow(shared: &Shared, change: &TierChange) -> strata_engine::Result<()> {
    let engine = &shared.engine;
    let tk = tokens_key(&change.key);
    let tokens = engine.get(&tk).await?;
    if let (Some(feed), Some(rec), Some(chunk)) = (
        shared.kv_feed.get(),
        tokens
            .as_deref()
            .and_then(strata_kvcache::ChunkTokens::decode),
        strata_kvcache::split_chunk_key(change.key.client()),
    ) {
        let (hash, n) = (chunk.hash, rec.tokens.len());
        let parent = strata_kvcache::parent_hash(&rec.parent);
        match change.what {
            Move::Deleted => feed.removed(hash, n, &[Medium::Disk, Medium::External]),
            Move::Demoted => {
                feed.stored(hash, parent, rec.tokens, Medium::External);
                feed.removed(hash, n, &[Medium::Disk]);
            }
            Move::Returned => {
                feed.stored(hash, parent, rec.tokens, Medium::Disk);
                feed.removed(hash, n, &[Medium::External]);
            }
        }
    }
    // Unless the chunk is back already (a write since its deletion).
    if change.what == Move::Deleted && !engine.exists(&change.key).await? {
        shared
            .kvc_quotas
            .removed(namespace_of(&change.key), &change.key);
        if tokens.is_some() {
            let _ = engine.delete(&tk).await?;
            shared.watches.touch(&tk);
        }
    }
    Ok(())
}

/// Chunks per batch of a listing.
const LISTED_PER_BATCH: usize = 256;

/// What answers a router's `LIST`: a task that lists every chunk of every database.
pub(crate) fn listing_hook(shared: &Arc<Shared>) -> ListingHook {
    let shared = Arc::downgrade(shared);
    let runtime = tokio::runtime::Handle::current();
    Box::new(move |lister: Lister| {
        let shared = shared.clone();
        runtime.spawn(async move {
            if let Some(shared) = shared.upgrade() {
                if let Err(e) = list(&shared, &lister).await {
                    tracing::warn!(error = %e, "a KV event listing stopped early");
                }
            }
            lister.finish();
        });
    })
}

/// Sends `lister` every chunk held with its tokens, in its tier, a batch at a time.
async fn list(shared: &Shared, lister: &Lister) -> strata_engine::Result<()> {
    let Some(feed) = shared.kv_feed.get() else {
        return Ok(());
    };
    let engine = &shared.engine;
    engine.settle_beside().await;
    let mut pages = ChunkPages::new(shared);
    while let Some((db, items)) = pages.next(engine)? {
        let mut batch = Vec::with_capacity(items.len());
        for item in &items {
            let key = engine.key(db, &item.key);
            batch.extend(listed(engine, feed, &key, medium_of(item.tier)).await?);
        }
        while !lister.has_room() {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        if !batch.is_empty() {
            lister.send(batch);
        }
    }
    Ok(())
}

/// Chunk `key`'s `BlockStored` in `medium`, if its tokens are kept.
async fn listed(
    engine: &strata_engine::Engine,
    feed: &Feed,
    key: &Key,
    medium: Medium,
) -> strata_engine::Result<Option<Event>> {
    let tokens = engine.get(&tokens_key(key)).await?;
    let rec = tokens
        .as_deref()
        .and_then(strata_kvcache::ChunkTokens::decode);
    let chunk = strata_kvcache::split_chunk_key(key.client());
    Ok(rec.zip(chunk).map(|(rec, chunk)| {
        let parent = strata_kvcache::parent_hash(&rec.parent);
        feed.stored_event(chunk.hash, parent, rec.tokens, medium)
    }))
}

/// Counts the chunks of `slots`, now served here (taken over in a move or adopted from a
/// lost node), in their namespaces' ledgers and announces them, in the background.
pub(crate) fn announce_slots(shared: &Arc<Shared>, slots: Vec<u16>) {
    let shared = Arc::clone(shared);
    tokio::spawn(async move {
        if let Err(e) = announce_slots_now(&shared, &slots).await {
            tracing::warn!(error = %e, "the chunks of slots taken over were not all announced");
        }
    });
}

async fn announce_slots_now(shared: &Shared, slots: &[u16]) -> strata_engine::Result<()> {
    let engine = &shared.engine;
    let databases = shared.cfg.read().databases;
    for db in 0..databases as u8 {
        for &slot in slots {
            let mut cursor: Option<Bytes> = None;
            loop {
                let page = engine.scan_slot(db, slot, cursor.as_deref(), LISTED_PER_BATCH)?;
                let chunks: Vec<_> = page
                    .items
                    .into_iter()
                    .filter(|i| i.key.starts_with(strata_kvcache::CHUNK_PREFIX))
                    .collect();
                count_found(shared, db, &chunks);
                if let Some(feed) = shared.kv_feed.get() {
                    for item in &chunks {
                        let key = engine.key(db, &item.key);
                        if let Some(e) = listed(engine, feed, &key, medium_of(item.tier)).await? {
                            feed.send(e);
                        }
                    }
                }
                match page.next {
                    Some(n) => cursor = Some(n),
                    None => break,
                }
            }
        }
    }
    Ok(())
}

/// Where the feed says a chunk whose durable copy is in `tier` lies.
fn medium_of(tier: strata_engine::Tier) -> Medium {
    match tier {
        strata_engine::Tier::Cold => Medium::External,
        _ => Medium::Disk,
    }
}
