//! Commands on a whole KV-cache namespace.
//!
//! - `KVC.DROP ns`: every chunk of namespace `ns` (a retired model version) deleted in the
//!   background; `+OK` at once. `INFO` shows `kvc_drops_running` and `kvc_chunks_dropped`.
//!   Each deletion is followed like any other (`kvchunks.rs`): announced on the KV event
//!   feed, the tokens kept beside the chunk deleted after it.
//! - `KVC.QUOTA ns bytes`: namespace `ns` may hold at most `bytes` of chunks on this node,
//!   every tier counted (`0`: no quota; units as in the settings, `64mb`, `2gib`). Saved
//!   durably; `+OK` once it is and the namespace is within the quota: what it held past it,
//!   least recently used (stored or read by `KVC.GET`) first, is dropped first.
//!   `KVC.QUOTA ns` → `quota`, `used_bytes`, `chunks`, `dropped` (chunks dropped for the
//!   quota since the start), as a map (a flat array in RESP2).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use strata_resp::Reply;

use super::ctx::{engine_error, Ctx};
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

pub(crate) async fn quota(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let ns = &a[1];
    if ns.is_empty() || ns.len() > strata_kvcache::quota::NAMESPACE_BYTES_MAX {
        return Reply::err("ERR KVC.QUOTA takes a namespace of 1 to 1024 bytes");
    }
    let quotas = &ctx.shared.kvc_quotas;
    let Some(bytes) = a.get(2) else {
        let f = quotas.figures_of(ns);
        let field = |name: &'static str, v: u64| (Reply::bulk(name), Reply::Integer(v as i64));
        return Reply::Map(vec![
            field("quota", f.quota),
            field("used_bytes", f.used_bytes),
            field("chunks", f.chunks),
            field("dropped", f.dropped),
        ]);
    };
    if a.len() > 3 {
        return super::ctx::syntax_error();
    }
    let Some(bytes) = std::str::from_utf8(bytes)
        .ok()
        .and_then(strata_settings::parse_size)
        .filter(|&b| b <= i64::MAX as u64)
    else {
        return Reply::err(
            "ERR KVC.QUOTA takes a byte count (0: no quota), such as 1073741824 or 1gb",
        );
    };
    let over = quotas.set_quota(ns, bytes);
    if let Err(e) = crate::kvchunks::save_quotas(ctx.shared) {
        return engine_error(&e);
    }
    match crate::kvchunks::drop_over_quota(ctx.shared, &over) {
        Ok(Some(w)) => {
            ctx.defer(w);
        }
        Ok(None) => {}
        Err(e) => return engine_error(&e),
    }
    Reply::ok()
}
