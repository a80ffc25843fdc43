//! What follows a KV-cache chunk's moves: the engine hands over each chunk (`kvc:` key)
//! deleted, demoted to the object store or returned from it ([`strata_engine::TierChange`]);
//! this task announces the move on the KV event feed (when there is one) from the tokens
//! kept beside the chunk, and deletes those tokens once the chunk is gone. Listings (every
//! chunk this node holds, for a router that asks the replay socket) are made here too.

use std::sync::Arc;

use bytes::Bytes;
use strata_engine::{Key, Move, TierChange};
use strata_kvfeed::{Event, Feed, Lister, ListingHook, Medium};

use crate::shared::Shared;

/// Chunk moves waiting for this task before the engine drops them (and counts them).
const WAITING_MAX: usize = 65_536;

/// Starts following the chunks' moves (once per engine).
pub(crate) fn start(shared: &Arc<Shared>) {
    let Some(mut rx) = shared
        .engine
        .watch_tiers(strata_kvcache::CHUNK_PREFIX, WAITING_MAX)
    else {
        return;
    };
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
    if change.what == Move::Deleted && tokens.is_some() {
        // Unless the chunk is back already (a write since its deletion).
        if !engine.exists(&change.key).await? {
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
    let databases = shared.cfg.read().databases;
    for db in 0..databases as u8 {
        let mut cursor: Option<Bytes> = None;
        loop {
            let page = engine.scan_prefix(
                db,
                strata_kvcache::CHUNK_PREFIX,
                cursor.as_deref(),
                LISTED_PER_BATCH,
            )?;
            let mut batch = Vec::with_capacity(page.items.len());
            for item in &page.items {
                let key = engine.key(db, &item.key);
                let medium = medium_of(item.tier);
                batch.extend(listed(engine, feed, &key, medium).await?);
            }
            while !lister.has_room() {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            if !batch.is_empty() {
                lister.send(batch);
            }
            match page.next {
                Some(n) => cursor = Some(n),
                None => break,
            }
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

/// Announces the chunks of `slots`, now served here (taken over in a move or adopted from a
/// lost node), in the background.
pub(crate) fn announce_slots(shared: &Arc<Shared>, slots: Vec<u16>) {
    if shared.kv_feed.get().is_none() {
        return;
    }
    let shared = Arc::clone(shared);
    tokio::spawn(async move {
        if let Err(e) = announce_slots_now(&shared, &slots).await {
            tracing::warn!(error = %e, "the chunks of slots taken over were not all announced");
        }
    });
}

async fn announce_slots_now(shared: &Shared, slots: &[u16]) -> strata_engine::Result<()> {
    let Some(feed) = shared.kv_feed.get() else {
        return Ok(());
    };
    let engine = &shared.engine;
    let databases = shared.cfg.read().databases;
    for db in 0..databases as u8 {
        for &slot in slots {
            let mut cursor: Option<Bytes> = None;
            loop {
                let page = engine.scan_slot(db, slot, cursor.as_deref(), LISTED_PER_BATCH)?;
                for item in page
                    .items
                    .iter()
                    .filter(|i| i.key.starts_with(strata_kvcache::CHUNK_PREFIX))
                {
                    let key = engine.key(db, &item.key);
                    let medium = medium_of(item.tier);
                    if let Some(e) = listed(engine, feed, &key, medium).await? {
                        feed.send(e);
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
