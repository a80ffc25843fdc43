//! The KV-cache pool: chunk keys are `kvc:<ns>:<hash>`, or `kvc:<ns>:{<tag>}<hash>` when
//! a request names a group tag after the namespace (`KVC.PUT ns TAG t ...`, and so for
//! every command below): the chunks of one group then share the slot of `{<tag>}`, and in
//! a cluster (where the tag is required) the request goes to the node serving it. See
//! `strata-kvcache`.
//!
//! - `KVC.PUT ns h value [h value ...] [TTL seconds]` → number of chunks stored.
//! - `KVC.GET ns h1 .. hN` → the values of the leading chunks that are present, in order;
//!   it stops at the first missing chunk (a KV prefix is usable only contiguously), so the
//!   reply's length is the number of usable chunks. It also stops before the chunk that
//!   would take the reply past `client-output-buffer-limit` bytes (but always carries the
//!   first chunk present): a client that gets fewer chunks than it named asks again for the
//!   rest, and an empty reply means the next chunk is missing.
//! - `KVC.MATCH ns h1 .. hN [LEASE ms] [LOADTIME]` → `[count, [tier, ...]]`: how many
//!   leading chunks are present and where each one lives (`hot`, `warm`, `cold`). With
//!   `LEASE`, the matched chunks are not demoted to the object store for `ms` milliseconds.
//!   With `LOADTIME`, a third element: the expected microseconds to load the matched chunks,
//!   from measured per-tier costs (see `Engine::expected_load_us`).
//! - `KVC.LOCATE ns h1 .. hN` → one element per leading present chunk (as many as
//!   `KVC.MATCH` counts): `[path, offset, length, expire_ms, crc32c]` where the chunk lies in
//!   the value log, for a client on the same machine to map and read itself without the
//!   bytes crossing the socket (see `Engine::locate_local`), or nil for a chunk kept
//!   elsewhere (the object store, or small enough to live in its record: read it with
//!   `KVC.GET`).

use bytes::Bytes;
use strata_engine::Key;
use strata_resp::Reply;

use super::{engine_error, not_integer, parse_int, syntax_error, Ctx};

/// Most chunks one command may name.
const CHUNKS_MAX: usize = 65_536;

/// A request's chunks: the namespace, the group tag (`TAG t`, which puts every chunk of the
/// request in the slot of `{t}`), and the arguments after them.
struct Chunks<'a> {
    ns: &'a Bytes,
    tag: Option<&'a Bytes>,
    rest: &'a [Bytes],
}

/// Parses `ns [TAG t] ...`. In cluster mode the tag is required (chunks must group by slot)
/// and the request is redirected unless this node serves the tag's slot.
fn chunks<'a>(ctx: &Ctx<'_>, a: &'a [Bytes], write: bool) -> Result<Chunks<'a>, Reply> {
    let (tag, rest) = if a.len() >= 4 && a[2].eq_ignore_ascii_case(b"tag") {
        (Some(&a[3]), &a[4..])
    } else {
        (None, &a[2..])
    };
    if let Some(c) = ctx.shared.cluster.as_ref() {
        let Some(t) = tag else {
            return Err(Reply::err(
                "ERR in cluster mode KVC.* takes TAG <group tag> after the namespace (chunks \
                 are grouped by slot)",
            ));
        };
        let slot = strata_format::keys::slot_of(&strata_kvcache::group_key(t));
        if let Some(r) = super::cluster::route_reply(c, slot, write, ctx.conn.asking) {
            return Err(r);
        }
    }
    Ok(Chunks {
        ns: &a[1],
        tag,
        rest,
    })
}

/// The stored keys of the chunks `hashes` of request `c`.
fn keys(ctx: &Ctx<'_>, c: &Chunks<'_>, hashes: &[Bytes]) -> Vec<Key> {
    let tag = c.tag.map(|t| t.as_ref());
    hashes
        .iter()
        .map(|h| ctx.key(&strata_kvcache::key_for(c.ns, tag, h)))
        .collect()
}

pub(crate) async fn put(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let c = match chunks(ctx, a, true) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let shared = ctx.shared;
    let engine = &shared.engine;
    let mut rest = c.rest;
    let mut expire_ms = 0;
    if rest.len() >= 2 && rest[rest.len() - 2].eq_ignore_ascii_case(b"ttl") {
        let Some(secs) = parse_int(&rest[rest.len() - 1]) else {
            return not_integer();
        };
        if secs <= 0 {
            return Reply::err("ERR invalid expire time in 'kvc.put' command");
        }
        expire_ms = engine.now_ms() + secs as u64 * 1000;
        rest = &rest[..rest.len() - 2];
    }
    if rest.is_empty() || !rest.len().is_multiple_of(2) || rest.len() / 2 > CHUNKS_MAX {
        return syntax_error();
    }
    // All the chunks in one batch: stored together or not at all.
    let hashes: Vec<Bytes> = rest.iter().step_by(2).cloned().collect();
    let keys = keys(ctx, &c, &hashes);
    let pairs: Vec<(&Key, Bytes)> = keys
        .iter()
        .zip(rest.iter().skip(1).step_by(2))
        .map(|(k, v)| (k, v.clone()))
        .collect();
    match engine.put_many(&pairs, expire_ms).await {
        Ok(w) => ctx.defer(w),
        Err(e) => return engine_error(&e),
    }
    for k in &keys {
        shared.watches.touch(k);
    }
    Reply::Integer(pairs.len() as i64)
}

pub(crate) async fn get(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let c = match chunks(ctx, a, false) {
        Ok(c) => c,
        Err(r) => return r,
    };
    if c.rest.len() > CHUNKS_MAX {
        return syntax_error();
    }
    let ks = keys(ctx, &c, c.rest);
    let engine = &ctx.shared.engine;
    for k in &ks {
        engine.note_access(ctx.conn.id, k);
    }
    let refs: Vec<&Key> = ks.iter().collect();
    match engine.get_prefix(&refs, ctx.reply_bytes_max()).await {
        Ok(vals) => Reply::Array(vals.into_iter().map(Reply::Bulk).collect()),
        Err(e) => engine_error(&e),
    }
}

pub(crate) async fn match_prefix(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let c = match chunks(ctx, a, false) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let engine = &ctx.shared.engine;
    let mut hashes = c.rest;
    let mut lease_ms = None;
    let load_time = hashes
        .last()
        .is_some_and(|h| h.eq_ignore_ascii_case(b"loadtime"));
    if load_time {
        hashes = &hashes[..hashes.len() - 1];
    }
    if hashes.len() >= 2 && hashes[hashes.len() - 2].eq_ignore_ascii_case(b"lease") {
        match parse_int(&hashes[hashes.len() - 1]) {
            Some(ms) if ms > 0 => lease_ms = Some(ms as u64),
            _ => return Reply::err("ERR LEASE takes a positive number of milliseconds"),
        }
        hashes = &hashes[..hashes.len() - 2];
    }
    if hashes.is_empty() || hashes.len() > CHUNKS_MAX {
        return syntax_error();
    }
    let ks = keys(ctx, &c, hashes);
    let mut found = Vec::new();
    for k in &ks {
        match engine.locate(k).await {
            Ok(Some(loc)) => found.push(loc),
            Ok(None) => break,
            Err(e) => return engine_error(&e),
        }
    }
    let tiers: Vec<Reply> = found.iter().map(|(t, _)| Reply::bulk(t.as_str())).collect();
    if let Some(ms) = lease_ms {
        let matched: Vec<&Key> = ks[..tiers.len()].iter().collect();
        engine.lease(&matched, engine.now_ms() + ms);
    }
    let mut reply = vec![Reply::Integer(tiers.len() as i64), Reply::Array(tiers)];
    if load_time {
        reply.push(Reply::Integer(engine.expected_load_us(&found) as i64));
    }
    Reply::Array(reply)
}

pub(crate) async fn locate(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let c = match chunks(ctx, a, false) {
        Ok(c) => c,
        Err(r) => return r,
    };
    if c.rest.len() > CHUNKS_MAX {
        return syntax_error();
    }
    let ks = keys(ctx, &c, c.rest);
    let refs: Vec<&Key> = ks.iter().collect();
    match ctx.shared.engine.locate_local(&refs) {
        Ok(found) => Reply::Array(
            found
                .into_iter()
                .map(|l| {
                    let Some(l) = l else {
                        return Reply::Null;
                    };
                    Reply::Array(vec![
                        Reply::Bulk(Bytes::from(l.path.into_os_string().into_encoded_bytes())),
                        Reply::Integer(l.offset as i64),
                        Reply::Integer(l.len as i64),
                        Reply::Integer(l.expire_ms as i64),
                        Reply::Integer(l.checksum as i64),
                    ])
                })
                .collect(),
        ),
        Err(e) => engine_error(&e),
    }
}
