//! Keyspace commands: deletion, expiry, renames, scans.

use bytes::Bytes;
use strata_engine::glob::{glob_match, literal_prefix};
use strata_engine::{Change, Key, Kind};
use strata_resp::Reply;

use super::ctx::{engine_error, lower, not_integer, parse_int, syntax_error, Ctx};

/// Keys read per page while `KEYS` walks the keyspace.
const KEYS_PAGE: usize = 10_000;
/// Most keys one `SCAN` page may ask for.
const SCAN_COUNT_MAX: usize = 100_000;

pub(crate) async fn del(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let mut n = 0;
    for k in &a[1..] {
        let key = ctx.key(k);
        match ctx.shared.engine.delete(&key).await {
            Ok(w) => n += ctx.defer(w) as i64,
            Err(e) => return engine_error(&e),
        }
    }
    Reply::Integer(n)
}

pub(crate) async fn exists(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let mut n = 0;
    for k in &a[1..] {
        match ctx.shared.engine.exists(&ctx.key(k)).await {
            Ok(true) => n += 1,
            Ok(false) => {}
            Err(e) => return engine_error(&e),
        }
    }
    Reply::Integer(n)
}

/// The unit and base of an expiry command's time.
#[derive(Clone, Copy, PartialEq)]
enum When {
    Seconds,
    Millis,
    UnixSeconds,
    UnixMillis,
}

pub(crate) async fn expire(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    set_expiry(ctx, a, When::Seconds, "expire").await
}

pub(crate) async fn pexpire(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    set_expiry(ctx, a, When::Millis, "pexpire").await
}

pub(crate) async fn expireat(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    set_expiry(ctx, a, When::UnixSeconds, "expireat").await
}

pub(crate) async fn pexpireat(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    set_expiry(ctx, a, When::UnixMillis, "pexpireat").await
}

pub(crate) async fn ttl(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    time_left(ctx, a, When::Seconds).await
}

pub(crate) async fn pttl(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    time_left(ctx, a, When::Millis).await
}

pub(crate) async fn expiretime(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    time_left(ctx, a, When::UnixSeconds).await
}

pub(crate) async fn pexpiretime(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    time_left(ctx, a, When::UnixMillis).await
}

/// `TTL`, `PTTL`, `EXPIRETIME`, `PEXPIRETIME`: -2 absent, -1 no expiry.
async fn time_left(ctx: &mut Ctx<'_>, a: &[Bytes], as_: When) -> Reply {
    let engine = &ctx.shared.engine;
    match engine.expire_time_ms(&ctx.key(&a[1])).await {
        Ok(None) => Reply::Integer(-2),
        Ok(Some(0)) => Reply::Integer(-1),
        Ok(Some(at)) => {
            let left = at.saturating_sub(engine.now_ms()) as i64;
            Reply::Integer(match as_ {
                When::Seconds => (left + 500) / 1000,
                When::Millis => left,
                When::UnixSeconds => (at / 1000) as i64,
                When::UnixMillis => at as i64,
            })
        }
        Err(e) => engine_error(&e),
    }
}

pub(crate) async fn persist(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let key = ctx.key(&a[1]);
    let r = ctx
        .shared
        .engine
        .update_expiry(&key, |cur| match cur {
            Some(e) if e != 0 => (Some(0), 1),
            _ => (None, 0),
        })
        .await;
    match r {
        Ok(w) => Reply::Integer(ctx.defer(w)),
        Err(e) => engine_error(&e),
    }
}

pub(crate) async fn type_of(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    match ctx.shared.engine.kind_of(&ctx.key(&a[1])).await {
        Ok(Some(kind)) => Reply::Simple(kind.name().into()),
        Ok(None) => Reply::Simple("none".into()),
        Err(e) => engine_error(&e),
    }
}

/// `MEMORY USAGE key [SAMPLES n]`: the bytes the key's entry counts against its tier's
/// budget (stored key, record header, value), or nil.
pub(crate) async fn memory(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    if lower(&a[1]) != "usage" || !(a.len() == 3 || a.len() == 5) {
        return Reply::err(
            "ERR MEMORY USAGE <key> [SAMPLES <count>] is the MEMORY subcommand Strata has",
        );
    }
    let key = ctx.key(&a[2]);
    match ctx.shared.engine.locate(&key).await {
        Ok(Some((_, len))) => Reply::Integer(
            (key.stored().len() + strata_format::WARM_HEADER_BYTES) as i64 + len as i64,
        ),
        Ok(None) => Reply::Null,
        Err(e) => engine_error(&e),
    }
}

/// `OBJECT ENCODING key`: Strata's own name for how the value is kept (one encoding per
/// kind, `strata-<kind>`), not one of Redis's; `REFCOUNT` is 1. Others are refused.
pub(crate) async fn object(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    match (lower(&a[1]).as_str(), a.len()) {
        ("encoding", 3) => match ctx.shared.engine.kind_of(&ctx.key(&a[2])).await {
            Ok(Some(kind)) => Reply::bulk(format!("strata-{}", kind.name())),
            Ok(None) => Reply::Null,
            Err(e) => engine_error(&e),
        },
        // One reference: the key's (Strata shares no values between keys).
        ("refcount", 3) => match ctx.shared.engine.exists(&ctx.key(&a[2])).await {
            Ok(true) => Reply::Integer(1),
            Ok(false) => Reply::Null,
            Err(e) => engine_error(&e),
        },
        (sub, _) => Reply::err(format!(
            "ERR OBJECT {} is not supported by Strata; OBJECT ENCODING and REFCOUNT are",
            sub.to_ascii_uppercase()
        )),
    }
}

pub(crate) async fn keys(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let pattern = &a[1];
    let prefix = literal_prefix(pattern);
    let mut out = Vec::new();
    let mut cursor: Option<Bytes> = None;
    let bytes_max = ctx.reply_bytes_max();
    let mut bytes = 0u64;
    ctx.shared.engine.settle_beside().await;
    loop {
        let page =
            match ctx
                .shared
                .engine
                .scan_prefix(ctx.conn.db, &prefix, cursor.as_deref(), KEYS_PAGE)
            {
                Ok(p) => p,
                Err(e) => return engine_error(&e),
            };
        for i in page.items {
            if glob_match(pattern, &i.key) {
                bytes += i.key.len() as u64;
                out.push(Reply::Bulk(i.key));
            }
        }
        if bytes > bytes_max {
            return Reply::err(format!(
                "ERR KEYS would reply with more than {bytes_max} bytes \
                 (client-output-buffer-limit); use SCAN"
            ));
        }
        match page.next {
            Some(n) => cursor = Some(n),
            None => break,
        }
    }
    Reply::Array(out)
}

pub(crate) async fn dbsize(ctx: &mut Ctx<'_>, _a: &[Bytes]) -> Reply {
    ctx.shared.engine.settle_beside().await;
    Reply::Integer(ctx.shared.engine.keys_in(ctx.conn.db) as i64)
}

/// A database of at most this many keys gives `RANDOMKEY` all of them to draw from; a
/// larger one, this many from a random point of the key order.
const RANDOMKEY_DRAW_KEYS: usize = 64;

/// `RANDOMKEY`: a live key of the database, drawn uniformly from all of them in a small
/// database; in a larger one, from a window of keys after a random point drawn between its
/// first and last keys ([`point_between`]), wrapping to the start. Keys spread evenly over
/// that stretch come up about evenly; a dense run of keys among sparse ones comes up less
/// than its share (its keys share windows).
pub(crate) async fn randomkey(ctx: &mut Ctx<'_>, _a: &[Bytes]) -> Reply {
    use super::typed::random_u64;
    let engine = &ctx.shared.engine;
    engine.settle_beside().await;
    let small = engine.keys_in(ctx.conn.db) <= RANDOMKEY_DRAW_KEYS as u64;
    let start = if small {
        Vec::new()
    } else {
        match engine.key_ends(ctx.conn.db) {
            Ok(Some((first, last))) => point_between(&first, &last, random_u64(0)),
            Ok(None) => random_u64(0).to_be_bytes().to_vec(),
            Err(e) => return engine_error(&e),
        }
    };
    let mut keys = Vec::with_capacity(RANDOMKEY_DRAW_KEYS);
    for (from, to) in [(&start[..], None), (&b""[..], Some(&start[..]))] {
        let want = RANDOMKEY_DRAW_KEYS - keys.len();
        if want == 0 || (to.is_some() && start.is_empty()) {
            break;
        }
        match engine.scan(ctx.conn.db, from, to, want) {
            Ok(p) => keys.extend(p.items.into_iter().map(|it| it.key)),
            Err(e) => return engine_error(&e),
        }
    }
    if keys.is_empty() {
        return Reply::Null;
    }
    let pick = (random_u64(1) % keys.len() as u64) as usize;
    Reply::Bulk(keys.swap_remove(pick))
}

/// A key between `first` and `last` (`first` < `last` in byte order) at the fraction `r`
/// of 2^64 of the way: their common prefix, then the eight bytes after it read as numbers
/// (missing bytes as zeros) and a number drawn between them.
fn point_between(first: &[u8], last: &[u8], r: u64) -> Vec<u8> {
    let common = first.iter().zip(last).take_while(|(a, b)| a == b).count();
    let word = |k: &[u8]| {
        let mut w = [0u8; 8];
        let tail = &k[common.min(k.len())..];
        let n = tail.len().min(8);
        w[..n].copy_from_slice(&tail[..n]);
        u64::from_be_bytes(w)
    };
    let (lo, hi) = (word(first), word(last));
    let span = u128::from(hi.saturating_sub(lo)) + 1;
    let at = lo + ((u128::from(r) * span) >> 64) as u64;
    let mut point = first[..common].to_vec();
    point.extend_from_slice(&at.to_be_bytes());
    point
}

/// Whether `FLUSHDB`'s or `FLUSHALL`'s arguments are valid (`ASYNC` or `SYNC`, accepted).
fn flush_args_ok(a: &[Bytes]) -> bool {
    a.len() == 1
        || (a.len() == 2 && matches!(a[1].to_ascii_lowercase().as_slice(), b"async" | b"sync"))
}

/// `FLUSHDB`: every key of the client's database, in every tier.
pub(crate) async fn flushdb(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    if !flush_args_ok(a) {
        return syntax_error();
    }
    let db = ctx.key(b"").db();
    let watched = match watched_existing(ctx, Some(db)).await {
        Ok(w) => w,
        Err(e) => return engine_error(&e),
    };
    match ctx.shared.engine.flush_db(ctx.conn.db).await {
        Ok(w) => {
            touch_each(ctx, &watched);
            ctx.shared.kvc_quotas.forget(|k| k.db() == db);
            ctx.defer(w);
            Reply::ok()
        }
        Err(e) => engine_error(&e),
    }
}

/// The watched keys of stored database `db` (all: `None`) that exist: a flush changes
/// those, as Redis has it, and leaves a watch of an absent key alone.
async fn watched_existing(ctx: &Ctx<'_>, db: Option<u8>) -> strata_engine::Result<Vec<Key>> {
    let mut out = Vec::new();
    for k in ctx.shared.watches.watched_in(db) {
        if ctx.shared.engine.exists(&k).await? {
            out.push(k);
        }
    }
    Ok(out)
}

fn touch_each(ctx: &Ctx<'_>, keys: &[Key]) {
    for k in keys {
        ctx.shared.watches.touch(k);
    }
}

/// `SWAPDB index1 index2`: the two databases trade contents at once (a durable map from
/// client to stored database changes; no key moves). Watchers' transactions fail, and
/// clients blocked in either database look again under the new map.
pub(crate) async fn swapdb(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let first = match parse_int(&a[1]) {
        Some(n) => n,
        None => return Reply::err("ERR invalid first DB index"),
    };
    let second = match parse_int(&a[2]) {
        Some(n) => n,
        None => return Reply::err("ERR invalid second DB index"),
    };
    let (first, second) = match (
        super::ctx::db_index(ctx, first),
        super::ctx::db_index(ctx, second),
    ) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(r), _) | (_, Err(r)) => return r,
    };
    if first != second {
        // Every watched key of either database: present in one, it changes (absent from
        // both it would not, but that is not worth a look-up of each).
        let stored = |db| ctx.shared.engine.key(db, b"").db();
        let mut watched = ctx.shared.watches.watched_in(Some(stored(first)));
        watched.extend(ctx.shared.watches.watched_in(Some(stored(second))));
        if let Err(e) = ctx.shared.engine.swap_dbs(first, second) {
            return engine_error(&e);
        }
        touch_each(ctx, &watched);
        ctx.shared.blocked.rekey();
    }
    Reply::ok()
}

/// `FLUSHALL`: every key of every database.
pub(crate) async fn flush(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    if !flush_args_ok(a) {
        return syntax_error();
    }
    let watched = match watched_existing(ctx, None).await {
        Ok(w) => w,
        Err(e) => return engine_error(&e),
    };
    match ctx.shared.engine.flush_all().await {
        Ok(w) => {
            touch_each(ctx, &watched);
            ctx.shared.kvc_quotas.forget(|_| true);
            if let Some(feed) = ctx.shared.kv_feed.get() {
                feed.send(strata_kvfeed::Event::AllCleared);
            }
            ctx.defer(w);
            Reply::ok()
        }
        Err(e) => engine_error(&e),
    }
}

async fn set_expiry(ctx: &mut Ctx<'_>, a: &[Bytes], when: When, name: &str) -> Reply {
    let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
    for opt in &a[3..] {
        match opt.to_ascii_lowercase().as_slice() {
            b"nx" => nx = true,
            b"xx" => xx = true,
            b"gt" => gt = true,
            b"lt" => lt = true,
            _ => {
                return Reply::err(format!(
                    "ERR Unsupported option {}",
                    String::from_utf8_lossy(opt)
                ))
            }
        }
    }
    if nx && (xx || gt || lt) {
        return Reply::err("ERR NX and XX, GT or LT options at the same time are not compatible");
    }
    if gt && lt {
        return Reply::err("ERR GT and LT options at the same time are not compatible");
    }
    let Some(n) = parse_int(&a[2]) else {
        return not_integer();
    };
    let now = ctx.shared.engine.now_ms() as i64;
    let at = match when {
        When::Seconds => n.checked_mul(1000).and_then(|ms| ms.checked_add(now)),
        When::Millis => n.checked_add(now),
        When::UnixSeconds => n.checked_mul(1000),
        When::UnixMillis => Some(n),
    };
    let Some(at) = at else {
        return Reply::err(format!("ERR invalid expire time in '{name}' command"));
    };
    // A time in the past deletes the key; 0 means "no expiry" to the engine, so use 1.
    let at = at.max(1) as u64;
    let key = ctx.key(&a[1]);
    let r = ctx
        .shared
        .engine
        .update_expiry(&key, move |cur| {
            let Some(e) = cur else { return (None, 0) };
            let current = if e == 0 { u64::MAX } else { e };
            let ok = (!nx || e == 0)
                && (!xx || e != 0)
                && (!gt || at > current)
                && (!lt || at < current);
            match ok {
                true => (Some(at), 1),
                false => (None, 0),
            }
        })
        .await;
    match r {
        Ok(w) => Reply::Integer(ctx.defer(w)),
        Err(e) => engine_error(&e),
    }
}

pub(crate) async fn rename(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    move_key(ctx, a, false).await
}

pub(crate) async fn renamenx(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    move_key(ctx, a, true).await
}

/// A key's whole entry, for a copy of it under another name (`RENAME`, `MOVE`).
struct Whole {
    kind: Kind,
    value: Bytes,
    expire_ms: u64,
}

async fn read_whole(ctx: &mut Ctx<'_>, key: &Key) -> Result<Option<Whole>, Reply> {
    let engine = &ctx.shared.engine;
    let got = engine
        .update(key, true, |cur| {
            let whole = cur.and_then(|c| {
                Some(Whole {
                    kind: c.kind,
                    value: c.value?.clone(),
                    expire_ms: c.expire_ms,
                })
            });
            Ok((None, whole))
        })
        .await;
    match got {
        Ok(w) => Ok(ctx.defer(w)),
        Err(e) => Err(engine_error(&e)),
    }
}

/// Writes `whole` under `to` (with `if_absent`, only if `to` holds nothing); says whether
/// it was written.
async fn write_whole(
    ctx: &mut Ctx<'_>,
    to: &Key,
    whole: Whole,
    if_absent: bool,
) -> Result<bool, Reply> {
    let kind = whole.kind;
    let got = ctx
        .shared
        .engine
        .update(to, false, move |cur| {
            if if_absent && cur.is_some() {
                return Ok((None, false));
            }
            let change = Change::Put {
                kind: whole.kind,
                value: whole.value,
                expire_ms: whole.expire_ms,
            };
            Ok((Some(change), true))
        })
        .await;
    match got {
        Ok(w) => {
            let written = ctx.defer(w);
            if written {
                // Also: a list or sorted set under a new name may be what a blocked pop
                // waits for.
                super::typed::changed(ctx, to, kind);
            } else {
                ctx.shared.watches.touch(to);
            }
            Ok(written)
        }
        Err(e) => Err(engine_error(&e)),
    }
}

/// Writes `whole` under `to` (see [`write_whole`]) and, once it is written, deletes `from`
/// (`RENAME`, `MOVE`); says whether it moved.
async fn relocate(
    ctx: &mut Ctx<'_>,
    from: &Key,
    to: &Key,
    whole: Whole,
    if_absent: bool,
) -> Result<bool, Reply> {
    if !write_whole(ctx, to, whole, if_absent).await? {
        return Ok(false);
    }
    match ctx.shared.engine.delete(from).await {
        Ok(w) => {
            ctx.defer(w);
            Ok(true)
        }
        Err(e) => Err(engine_error(&e)),
    }
}

/// `RENAME` (and with `nx`, `RENAMENX`): the value and its expiry under the new name, then
/// the old name deleted; atomic to other clients (the command holds the gate).
async fn move_key(ctx: &mut Ctx<'_>, a: &[Bytes], nx: bool) -> Reply {
    let (from, to) = (ctx.key(&a[1]), ctx.key(&a[2]));
    let whole = match read_whole(ctx, &from).await {
        Ok(Some(w)) => w,
        Ok(None) => return Reply::err("ERR no such key"),
        Err(r) => return r,
    };
    if from == to {
        return if nx { Reply::Integer(0) } else { Reply::ok() };
    }
    match relocate(ctx, &from, &to, whole, nx).await {
        Ok(false) => Reply::Integer(0),
        Ok(true) if nx => Reply::Integer(1),
        Ok(true) => Reply::ok(),
        Err(r) => r,
    }
}

/// `MOVE key db`: the value and its expiry into database `db` if no key there has the
/// name, then the source deleted; atomic to other clients (the command holds the gate).
pub(crate) async fn move_to_db(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let db = match super::ctx::parse_db(ctx, &a[2]) {
        Ok(db) => db,
        Err(r) => return r,
    };
    if db == ctx.conn.db {
        return Reply::err("ERR source and destination objects are the same");
    }
    let (from, to) = (ctx.key(&a[1]), ctx.key_in(db, &a[1]));
    let whole = match read_whole(ctx, &from).await {
        Ok(Some(w)) => w,
        Ok(None) => return Reply::Integer(0),
        Err(r) => return r,
    };
    match relocate(ctx, &from, &to, whole, true).await {
        Ok(moved) => Reply::Integer(moved as i64),
        Err(r) => r,
    }
}

/// `DUMP key`: the value of any kind as a payload `RESTORE` takes back
/// ([`strata_format::dump`], Strata's own, not Redis's RDB encoding); nil for no key.
pub(crate) async fn dump(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let key = ctx.key(&a[1]);
    match read_whole(ctx, &key).await {
        Ok(Some(w)) => Reply::Bulk(Bytes::from(strata_format::dump::encode_dump(
            w.kind, &w.value,
        ))),
        Ok(None) => Reply::Null,
        Err(r) => r,
    }
}

/// `RESTORE key ttl payload [REPLACE] [ABSTTL] [IDLETIME seconds] [FREQ frequency]`: the
/// value `DUMP` gave, with `ttl` milliseconds to live (0: none; with `ABSTTL` a Unix time
/// in milliseconds). `IDLETIME` and `FREQ` are checked and have no effect (Strata keeps
/// its own access counts).
pub(crate) async fn restore(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let Some(ttl) = parse_int(&a[2]) else {
        return not_integer();
    };
    let (mut replace, mut absttl, mut idle, mut freq) = (false, false, false, false);
    let mut i = 4;
    while i < a.len() {
        let opt = lower(&a[i]);
        let arg = a.get(i + 1);
        match (opt.as_str(), arg) {
            ("replace", _) => replace = true,
            ("absttl", _) => absttl = true,
            ("idletime", Some(v)) if !freq => {
                match parse_int(v) {
                    Some(n) if n >= 0 => {}
                    Some(_) => return Reply::err("ERR Invalid IDLETIME value, must be >= 0"),
                    None => return not_integer(),
                }
                idle = true;
                i += 1;
            }
            ("freq", Some(v)) if !idle => {
                match parse_int(v) {
                    Some(n) if (0..=255).contains(&n) => {}
                    Some(_) => {
                        return Reply::err("ERR Invalid FREQ value, must be >= 0 and <= 255")
                    }
                    None => return not_integer(),
                }
                freq = true;
                i += 1;
            }
            _ => return syntax_error(),
        }
        i += 1;
    }
    if ttl < 0 {
        return Reply::err("ERR Invalid TTL value, must be >= 0");
    }
    let (kind, value) = match strata_format::dump::decode_dump(&a[3]) {
        Ok((kind, value)) => (kind, a[3].slice_ref(value)),
        Err(_) => return Reply::err("ERR DUMP payload version or checksum are wrong"),
    };
    let now = ctx.shared.engine.now_ms();
    let expire_ms = match (ttl, absttl) {
        (0, _) => 0,
        (t, true) => t as u64,
        (t, false) => now.saturating_add(t as u64),
    };
    let key = ctx.key(&a[1]);
    if !strata_format::is_live(expire_ms, now) {
        // Already past its time: nothing is created (with REPLACE, what was there goes).
        if !replace {
            match ctx.shared.engine.get_value(&key).await {
                Ok(Some(_)) => return busy_key(),
                Ok(None) => return Reply::ok(),
                Err(e) => return engine_error(&e),
            }
        }
        return match ctx.shared.engine.delete(&key).await {
            Ok(w) => {
                ctx.defer(w);
                Reply::ok()
            }
            Err(e) => engine_error(&e),
        };
    }
    let whole = Whole {
        kind,
        value,
        expire_ms,
    };
    match write_whole(ctx, &key, whole, !replace).await {
        Ok(true) => Reply::ok(),
        Ok(false) => busy_key(),
        Err(r) => r,
    }
}

fn busy_key() -> Reply {
    Reply::err("BUSYKEY Target key name already exists.")
}

/// `COPY source destination [DB db] [REPLACE]`: the value (of any kind) and its expiry
/// under the new name; atomic to other clients (the command holds the gate).
pub(crate) async fn copy(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let (mut db, mut replace) = (ctx.conn.db, false);
    let mut i = 3;
    while i < a.len() {
        match lower(&a[i]).as_str() {
            "replace" => replace = true,
            "db" if i + 1 < a.len() => {
                db = match super::ctx::parse_db(ctx, &a[i + 1]) {
                    Ok(db) => db,
                    Err(r) => return r,
                };
                i += 1;
            }
            _ => return syntax_error(),
        }
        i += 1;
    }
    let (from, to) = (ctx.key(&a[1]), ctx.key_in(db, &a[2]));
    if from == to {
        return Reply::err("ERR source and destination objects are the same");
    }
    let whole = match read_whole(ctx, &from).await {
        Ok(Some(w)) => w,
        Ok(None) => return Reply::Integer(0),
        Err(r) => return r,
    };
    match write_whole(ctx, &to, whole, !replace).await {
        Ok(written) => Reply::Integer(written as i64),
        Err(r) => r,
    }
}

pub(crate) async fn scan(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let cursor: u64 = match std::str::from_utf8(&a[1]).ok().and_then(|s| s.parse().ok()) {
        Some(c) => c,
        None => return Reply::err("ERR invalid cursor"),
    };
    let mut pattern: Option<Bytes> = None;
    let mut count = 10usize;
    let mut type_name: Option<String> = None;
    let mut i = 2;
    while i < a.len() {
        if i + 1 >= a.len() {
            return syntax_error();
        }
        match a[i].to_ascii_lowercase().as_slice() {
            b"match" => pattern = Some(a[i + 1].clone()),
            b"count" => match parse_int(&a[i + 1]) {
                Some(n) if n >= 1 => count = (n as usize).min(SCAN_COUNT_MAX),
                Some(_) => return syntax_error(),
                None => return not_integer(),
            },
            b"type" => type_name = Some(lower(&a[i + 1])),
            _ => return syntax_error(),
        }
        i += 2;
    }
    let prefix = pattern.as_deref().map(literal_prefix).unwrap_or_default();
    let start = if cursor == 0 {
        None
    } else {
        match ctx.conn.scan_cursors.remove(&cursor) {
            Some(k) => Some(k),
            None => return Reply::Array(vec![Reply::bulk("0"), Reply::Array(vec![])]),
        }
    };
    ctx.shared.engine.settle_beside().await;
    let page = match ctx
        .shared
        .engine
        .scan_prefix(ctx.conn.db, &prefix, start.as_deref(), count)
    {
        Ok(p) => p,
        Err(e) => return engine_error(&e),
    };
    let keys = page
        .items
        .into_iter()
        .filter(|it| type_name.as_ref().is_none_or(|t| t == it.kind.name()))
        .filter(|it| pattern.as_ref().is_none_or(|p| glob_match(p, &it.key)))
        .map(|it| Reply::Bulk(it.key))
        .collect();
    let next = match page.next {
        Some(k) => ctx.conn.save_cursor(k),
        None => 0,
    };
    Reply::Array(vec![Reply::bulk(next.to_string()), Reply::Array(keys)])
}

#[cfg(test)]
mod tests {
    use super::point_between;

    /// Points fall between the ends, spread over the stretch after their common prefix.
    #[test]
    fn random_points_fall_between_the_first_and_last_keys() {
        let (first, last) = (b"user:0000".as_slice(), b"user:0999".as_slice());
        let mut upper = 0;
        for i in 0..1000u64 {
            let p = point_between(first, last, i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            assert!(
                p.as_slice() >= &first[..5] && p.as_slice() <= b"user:1".as_slice(),
                "{p:?}"
            );
            upper += usize::from(p.as_slice() >= b"user:05".as_slice());
        }
        assert!(
            (300..700).contains(&upper),
            "{upper} of 1000 in the upper half"
        );
        assert_eq!(point_between(b"a", b"b", 0), b"a\0\0\0\0\0\0\0".to_vec());
        assert_eq!(point_between(b"a", b"b", u64::MAX)[0], b'b');
    }
}
