//! Strata's own commands: `TIER`, `STRATA.STATS`, pinning, and `STRATA.BACKUP`.

use bytes::Bytes;
use strata_resp::Reply;

use super::{engine_error, Ctx};

pub(crate) async fn run(ctx: &mut Ctx<'_>, name: &str, a: &[Bytes]) -> Reply {
    let engine = &ctx.shared.engine;
    match name {
        "tier" => match engine.tier_of(&a[1]).await {
            Ok(Some(t)) => Reply::bulk(t.as_str()),
            Ok(None) => Reply::Null,
            Err(e) => engine_error(&e),
        },
        "strata.stats" => {
            let st = engine.stats();
            let n = |k: &str, v: u64| (Reply::bulk(k.to_string()), Reply::Integer(v as i64));
            let c = &st.cold_requests;
            Reply::Map(vec![
                n("hot_entries", st.hot.entries),
                n("hot_bytes", st.hot.bytes),
                n("hot_bytes_max", st.hot.bytes_max),
                n("hot_hits", st.hot.hits),
                n("warm_entries", st.warm.entries),
                n("warm_bytes", st.warm.bytes),
                n("warm_bytes_max", st.warm.bytes_max),
                n("warm_hits", st.warm.hits),
                n("cold_entries", st.cold.entries),
                n("cold_bytes", st.cold.bytes),
                n("cold_hits", st.cold.hits),
                n("misses", st.misses),
                n("demotions", st.demotions),
                n("promotions", st.promotions),
                n("returns_to_warm", st.returns_to_warm),
                n("expired", st.expired),
                n("checksum_errors", st.checksum_errors),
                n("segments_written", st.segments_written),
                n("segments_deleted", st.segments_deleted),
                n("object_store_gets", c.gets),
                n("object_store_puts", c.puts),
                n("object_store_errors", c.errors),
                n("demotion_errors", st.demotion_errors),
                n("warm_bytes_hard_max", st.warm_bytes_hard_max),
                n("writes_refused_full", st.writes_refused_full),
                n("wal_bytes_dropped", st.wal_bytes_dropped),
                n("prefetch_issued", st.prefetch_issued),
                n("prefetch_used", st.prefetch_used),
                n("prefetch_dropped", st.prefetch_dropped),
                n("warm_batches_split", st.warm_batches_split),
                n("vlog_files", st.vlog_files),
                n("vlog_bytes", st.vlog_bytes),
                n("vlog_files_collected", st.vlog_files_collected),
            ])
        }
        "pin" | "unpin" | "pins" => pins(ctx, name, a).await,
        "strata.backup" => start_backup(ctx, &a[1]),
        _ => Reply::err(format!("ERR unknown command '{name}'")),
    }
}

async fn pins(ctx: &mut Ctx<'_>, name: &str, a: &[Bytes]) -> Reply {
    let engine = &ctx.shared.engine;
    match name {
        "pin" => match engine.pin(&a[1]).await {
            Ok(bytes) => Reply::Integer(bytes as i64),
            Err(e) => engine_error(&e),
        },
        "unpin" => match engine.unpin(&a[1]) {
            Ok(existed) => Reply::Integer(existed as i64),
            Err(e) => engine_error(&e),
        },
        _ => Reply::Array(engine.pins().into_iter().map(Reply::Bulk).collect()),
    }
}

/// `STRATA.BACKUP url`: starts a backup in the background, like `BGSAVE`; `INFO persistence`
/// shows its progress and outcome.
fn start_backup(ctx: &mut Ctx<'_>, url: &Bytes) -> Reply {
    let url = String::from_utf8_lossy(url).into_owned();
    {
        let mut st = ctx.shared.backup.lock();
        if st.running {
            return Reply::err("ERR a backup is already in progress");
        }
        *st = crate::BackupState {
            running: true,
            url: url.clone(),
            ..Default::default()
        };
    }
    let shared = std::sync::Arc::clone(ctx.shared);
    tokio::spawn(async move {
        let progress = |done: u64, total: u64| {
            let mut st = shared.backup.lock();
            st.done_bytes = done;
            st.total_bytes = total;
        };
        let result = shared.engine.backup(&url, &progress).await;
        let mut st = shared.backup.lock();
        st.running = false;
        st.status = match result {
            Ok(sum) => {
                tracing::info!(
                    url,
                    bytes = sum.bytes,
                    segments = sum.segments,
                    "backup done"
                );
                "ok".into()
            }
            Err(e) => {
                tracing::error!(url, error = %e, "backup failed");
                format!("err: {e}")
            }
        };
    });
    Reply::Simple("Background backup started".into())
}
