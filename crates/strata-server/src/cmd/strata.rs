//! Strata's own commands: `TIER`, `STRATA.STATS`, pinning, and `STRATA.BACKUP`.

use bytes::Bytes;
use strata_resp::Reply;

use super::{engine_error, Ctx};

pub(crate) async fn tier(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    match ctx.shared.engine.tier_of(&ctx.key(&a[1])).await {
        Ok(Some(t)) => Reply::bulk(t.as_str()),
        Ok(None) => Reply::Null,
        Err(e) => engine_error(&e),
    }
}

/// `STRATA.STATS`: every figure of the engine, by name.
pub(crate) async fn stats(ctx: &mut Ctx<'_>, _a: &[Bytes]) -> Reply {
    let st = ctx.shared.engine.stats_now();
    Reply::Map(
        st.rows()
            .into_iter()
            .map(|(s, v)| (Reply::bulk(s.name), Reply::Integer(v as i64)))
            .collect(),
    )
}

pub(crate) async fn pin(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    match ctx.shared.engine.pin(&a[1]).await {
        Ok(bytes) => Reply::Integer(bytes as i64),
        Err(e) => engine_error(&e),
    }
}

pub(crate) async fn unpin(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    match ctx.shared.engine.unpin(&a[1]) {
        Ok(existed) => Reply::Integer(existed as i64),
        Err(e) => engine_error(&e),
    }
}

pub(crate) async fn pins(ctx: &mut Ctx<'_>, _a: &[Bytes]) -> Reply {
    Reply::Array(
        ctx.shared
            .engine
            .pins()
            .into_iter()
            .map(Reply::Bulk)
            .collect(),
    )
}

pub(crate) async fn backup(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    start_backup(ctx, &a[1])
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
        *st = crate::shared::BackupState {
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
