//! Strata's own commands: `TIER`, `STRATA.STATS`, pinning, `STRATA.BACKUP` and
//! `STRATA.RANGE`.

use bytes::Bytes;
use strata_engine::RangeBound;
use strata_resp::Reply;

use super::ctx::{engine_error, lower, not_integer, parse_int, syntax_error, Ctx};
use super::zsets::{parse_lex_bound, LexBound};

/// Most keys one `STRATA.RANGE` answers; a range that holds more needs `LIMIT`.
const RANGE_KEYS_MAX: usize = 100_000;

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

/// `STRATA.RANGE start end [LIMIT n] [REV]`: the string keys of the connection's database
/// from `start` to `end`, each followed by its value (`key value key value ...`), in key
/// order from every tier. Bounds are written as in `ZRANGEBYLEX`: `[a` includes `a`, `(a`
/// excludes it, `-` and `+` are the ends. With `REV` the order is reversed and, as in
/// `ZRANGE ... BYLEX REV`, `start` is the upper bound. Keys of other kinds are passed over.
/// Without `LIMIT`, a range holding more than [`RANGE_KEYS_MAX`] keys is refused.
pub(crate) async fn range(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let (Some(first), Some(second)) = (parse_lex_bound(&a[1]), parse_lex_bound(&a[2])) else {
        return Reply::err("ERR min or max not valid string range item");
    };
    let mut limit = None;
    let mut rev = false;
    let mut i = 3;
    while i < a.len() {
        match lower(&a[i]).as_str() {
            "rev" => {
                rev = true;
                i += 1;
            }
            "limit" if i + 1 < a.len() => {
                match parse_int(&a[i + 1]) {
                    Some(n) if (0..=RANGE_KEYS_MAX as i64).contains(&n) => limit = Some(n as usize),
                    Some(_) => {
                        return Reply::err(format!("ERR LIMIT must be 0 to {RANGE_KEYS_MAX}"))
                    }
                    None => return not_integer(),
                }
                i += 2;
            }
            _ => return syntax_error(),
        }
    }
    let (lo, hi) = if rev {
        (second, first)
    } else {
        (first, second)
    };
    let lo: RangeBound<'_> = match &lo {
        LexBound::Min => None,
        LexBound::Incl(k) => Some((k, true)),
        LexBound::Excl(k) => Some((k, false)),
        LexBound::Max => return Reply::Array(Vec::new()),
    };
    let hi: RangeBound<'_> = match &hi {
        LexBound::Max => None,
        LexBound::Incl(k) => Some((k, true)),
        LexBound::Excl(k) => Some((k, false)),
        LexBound::Min => return Reply::Array(Vec::new()),
    };
    let want = limit.unwrap_or(RANGE_KEYS_MAX + 1);
    let engine = &ctx.shared.engine;
    let bytes_max = ctx.reply_bytes_max();
    match engine
        .range(ctx.conn.db, lo, hi, want, rev, bytes_max)
        .await
    {
        Ok(pairs) if pairs.len() > RANGE_KEYS_MAX => Reply::err(format!(
            "ERR the range holds more than {RANGE_KEYS_MAX} string keys: add LIMIT"
        )),
        Ok(pairs) => Reply::Array(
            pairs
                .into_iter()
                .flat_map(|(k, v)| [Reply::Bulk(k), Reply::Bulk(v)])
                .collect(),
        ),
        Err(e) => engine_error(&e),
    }
}
