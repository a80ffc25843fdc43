//! `KVC.DROP ns`: every chunk of namespace `ns` (a retired model version) deleted in the
//! background; `+OK` at once. `INFO` shows `kvc_drops_running` and `kvc_chunks_dropped`.
//! Each deletion is followed like any other (`kvchunks.rs`): announced on the KV event feed,
//! the tokens kept beside the chunk deleted after it.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use strata_resp::Reply;

use super::ctx::Ctx;
use crate::shared::Shared;

/// Chunks looked at and deleted per step.
const PAGE: usize = 256;

pub(crate) async fn drop_namespace(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    if a[1].is_empty() {
        return Reply::err("ERR KVC.DROP takes a namespace");
    }
    let shared = Arc::clone(ctx.shared);
    let (db, ns) = (ctx.conn.db, a[1].clone());
    shared.kvc_drops_running.fetch_add(1, Ordering::Relaxed);
    tokio::spawn(async move {
        if let Err(e) = drop_all(&shared, db, &ns).await {
            tracing::error!(error = %e, "KVC.DROP {} stopped", String::from_utf8_lossy(&ns));
        }
        shared.kvc_drops_running.fetch_sub(1, Ordering::Relaxed);
    });
    Reply::ok()
}

/// Deletes the chunks of `ns` in database `db` page by page.
async fn drop_all(shared: &Shared, db: u8, ns: &[u8]) -> strata_engine::Result<()> {
    let engine = &shared.engine;
    let prefix = strata_kvcache::key_for(ns, None, b"");
    let mut cursor: Option<Bytes> = None;
    engine.settle_beside().await;
    loop {
        let page = engine.scan_prefix(db, &prefix, cursor.as_deref(), PAGE)?;
        let mut pending = strata_engine::Ticket::default();
        for item in &page.items {
            let chunk = engine.key(db, &item.key);
            engine.delete(&chunk).await?.defer(&mut pending);
            shared.watches.touch(&chunk);
            shared
                .counters
                .kvc_chunks_dropped
                .fetch_add(1, Ordering::Relaxed);
        }
        engine.wait(pending).await?;
        match page.next {
            Some(n) => cursor = Some(n),
            None => return Ok(()),
        }
    }
}
