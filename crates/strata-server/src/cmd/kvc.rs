//! The KV-cache pool: chunk keys are `kvc:<ns>:<hash>`, or `kvc:<ns>:{<tag>}<hash>` when
//! a request names a group tag after the namespace (`KVC.PUT ns TAG t ...`, and so for
//! every command below): the chunks of one group then share the slot of `{<tag>}`, and in
//! a cluster (where the tag is required) the request goes to the node serving it. See
//! `strata-kvcache`.
//!
//! - `KVC.PUT ns h value [h value ...] [TTL seconds]` → number of chunks stored. With
//!   `KVC.PUT ns TOKENS parent h value tokens [h value tokens ...] [TTL seconds]` each chunk
//!   carries its tokens (32-bit little-endian integers) and `parent` is the hash of the
//!   chunk before the first (empty for a prompt's first chunk): they are kept beside the
//!   chunk (`strata_kvcache::tokens_key_for`), and announced on the KV event feed.
//!   A namespace with a quota (`KVC.QUOTA`) that the chunks take past it drops its least
//!   recently used chunks (`kvchunks.rs`) before the reply.
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
//! - `KVC.WHERE ns [GROUP g] h1 .. hN`, or `KVC.WHERE NAMESPACE <canonical> [GROUP g]
//!   TOKENS t1 .. tN` (the server hashes the tokens) → `[count, load_us, [[node, n], ...],
//!   [tier, ...]]`: how many leading chunks are cached anywhere in the cluster, the expected
//!   microseconds to load them, the nodes that hold them in chunk order (each with its
//!   number of chunks; `node` is `host:port`, or `myself` on a server not in a cluster) and
//!   each chunk's tier. Chunks go in groups of `g` with their group tags (in a cluster, `g`
//!   is `kvc_group_chunks` unless given; on a single node 0, untagged keys); the node asks
//!   each group's node with `KVC.MATCH`, one group after another until one is not whole.

use bytes::Bytes;
use strata_engine::Key;
use strata_resp::Reply;

use super::ctx::{engine_error, not_integer, parse_int, syntax_error, Ctx};
use super::spec::tag_position;

/// Most chunks one command may name.
const CHUNKS_MAX: usize = 65_536;

/// A request's chunks: the namespace, the group tag (`TAG t`, which puts every chunk of the
/// request in the slot of `{t}`), and the arguments after them.
struct Chunks<'a> {
    ns: &'a Bytes,
    tag: Option<&'a Bytes>,
    rest: &'a [Bytes],
}

/// Parses `ns [TAG t] ...`. In cluster mode the tag is required (chunks must group by slot);
/// the request reached this node through routing on the tag ([`tag_position`]).
fn chunks<'a>(ctx: &Ctx<'_>, a: &'a [Bytes]) -> Result<Chunks<'a>, Reply> {
    let (tag, rest) = match tag_position(a) {
        Some(at) => (Some(&a[at]), &a[at + 1..]),
        None => (None, &a[2..]),
    };
    if let Some(t) = tag {
        if t.is_empty() || t.iter().any(|&b| b == b'{' || b == b'}') {
            return Err(Reply::err(
                "ERR a KVC group tag must be non-empty and hold no braces",
            ));
        }
    } else if ctx.shared.cluster.is_some() {
        return Err(Reply::err(
            "ERR in cluster mode KVC.* takes TAG <group tag> after the namespace (chunks are \
             grouped by slot)",
        ));
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

/// A `KVC.PUT`'s chunks: hashes and values, and with `TOKENS` each one's tokens (u32 LE
/// bytes) and the hash of the chunk before the first (empty: a prompt's first chunk).
struct PutChunks<'a> {
    hashes: Vec<Bytes>,
    values: Vec<&'a Bytes>,
    tokens: Option<(&'a Bytes, Vec<&'a Bytes>)>,
}

/// Parses what follows `ns [TAG t]` in a `KVC.PUT` (its `TTL` already taken off).
fn put_chunks(rest: &[Bytes]) -> Result<PutChunks<'_>, Reply> {
    let with_tokens = rest
        .first()
        .is_some_and(|a| a.eq_ignore_ascii_case(b"tokens"));
    let (step, items) = if with_tokens {
        (3, rest.get(2..).unwrap_or_default())
    } else {
        (2, rest)
    };
    if items.is_empty() || !items.len().is_multiple_of(step) || items.len() / step > CHUNKS_MAX {
        return Err(syntax_error());
    }
    let hashes = items.iter().step_by(step).cloned().collect();
    let values = items.iter().skip(1).step_by(step).collect();
    let tokens = if with_tokens {
        let t: Vec<&Bytes> = items.iter().skip(2).step_by(3).collect();
        if t.iter().any(|t| t.is_empty() || !t.len().is_multiple_of(4)) {
            return Err(Reply::err(
                "ERR KVC.PUT TOKENS takes each chunk's tokens as 32-bit little-endian integers \
                 (a non-empty multiple of 4 bytes)",
            ));
        }
        Some((&rest[1], t))
    } else {
        None
    };
    Ok(PutChunks {
        hashes,
        values,
        tokens,
    })
}

pub(crate) async fn put(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let c = match chunks(ctx, a) {
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
    let p = match put_chunks(rest) {
        Ok(p) => p,
        Err(r) => return r,
    };
    // All the chunks in one batch, their tokens with them: stored together or not at all.
    let keys = keys(ctx, &c, &p.hashes);
    let mut pairs: Vec<(&Key, Bytes)> = keys
        .iter()
        .zip(&p.values)
        .map(|(k, v)| (k, (*v).clone()))
        .collect();
    let token_keys = p
        .tokens
        .as_ref()
        .map(|(parent, t)| tokens_records(ctx, &c, &p.hashes, parent, t));
    if let Some(tk) = &token_keys {
        pairs.extend(tk.iter().map(|(k, v)| (k, v.clone())));
    }
    // The tokens outlive an expiring chunk: its removal is announced from them, and they go
    // after (`kvchunks.rs`).
    match engine.put_many_lasting(&pairs, expire_ms, keys.len()).await {
        Ok(w) => ctx.defer(w),
        Err(e) => return engine_error(&e),
    }
    for (k, _) in &pairs {
        shared.watches.touch(k);
    }
    if let (Some(feed), Some((parent, tokens))) = (shared.kv_feed.get(), &p.tokens) {
        announce_stored(feed, &p.hashes, parent, tokens);
    }
    let n = keys.len() as i64;
    let sizes = keys
        .into_iter()
        .zip(&p.values)
        .map(|(k, v)| (k, v.len() as u64));
    let over = shared.kvc_quotas.stored(c.ns, sizes);
    match crate::kvchunks::drop_over_quota(shared, &over) {
        Ok(Some(w)) => {
            ctx.defer(w);
        }
        Ok(None) => {}
        Err(e) => return engine_error(&e),
    }
    Reply::Integer(n)
}

/// The hash of the chunk before chunk `i` of a `KVC.PUT ... TOKENS parent ...`.
fn before<'a>(i: usize, parent: &'a Bytes, hashes: &'a [Bytes]) -> &'a Bytes {
    if i == 0 {
        parent
    } else {
        &hashes[i - 1]
    }
}

/// The records of each chunk's tokens and parent, under their [`strata_kvcache::
/// tokens_key_for`] keys.
fn tokens_records(
    ctx: &Ctx<'_>,
    c: &Chunks<'_>,
    hashes: &[Bytes],
    parent: &Bytes,
    tokens: &[&Bytes],
) -> Vec<(Key, Bytes)> {
    let tag = c.tag.map(|t| t.as_ref());
    hashes
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let key = ctx.key(&strata_kvcache::tokens_key_for(c.ns, tag, h));
            let record = strata_kvcache::ChunkTokens::encode(before(i, parent, hashes), tokens[i]);
            (key, Bytes::from(record))
        })
        .collect()
}

/// Announces the chunks just stored, on this node's disk (see [`strata_kvfeed::Medium`]).
fn announce_stored(
    feed: &strata_kvfeed::Feed,
    hashes: &[Bytes],
    parent: &Bytes,
    tokens: &[&Bytes],
) {
    for (i, h) in hashes.iter().enumerate() {
        let t = strata_kvcache::tokens_from_le(tokens[i]).unwrap_or_default();
        let parent = strata_kvcache::parent_hash(before(i, parent, hashes));
        feed.stored(h, parent, t, strata_kvfeed::Medium::Disk);
    }
}

pub(crate) async fn get(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let c = match chunks(ctx, a) {
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
        Ok(vals) => {
            ctx.shared.kvc_quotas.used(c.ns, &ks[..vals.len()]);
            Reply::Array(vals.into_iter().map(Reply::Bulk).collect())
        }
        Err(e) => engine_error(&e),
    }
}

pub(crate) async fn match_prefix(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let c = match chunks(ctx, a) {
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
    let found = match leading(engine, &ks).await {
        Ok(f) => f,
        Err(e) => return engine_error(&e),
    };
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

/// The leading present chunks of `keys`, until the first missing one: each one's tier and
/// value length.
async fn leading(
    engine: &strata_engine::Engine,
    keys: &[Key],
) -> Result<Vec<(strata_engine::Tier, u64)>, strata_engine::Error> {
    let mut found = Vec::new();
    for k in keys {
        match engine.locate(k).await? {
            Some(loc) => found.push(loc),
            None => break,
        }
    }
    Ok(found)
}

pub(crate) async fn locate(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let c = match chunks(ctx, a) {
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

/// One group of a `KVC.WHERE`: where its leading chunks are and what loading them costs.
struct GroupFound {
    node: String,
    tiers: Vec<Bytes>,
    load_us: u64,
}

/// `KVC.WHERE` (see the module's text).
pub(crate) async fn where_cached(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let shared = ctx.shared;
    let cluster = shared.cluster.as_ref();
    let named = a[1].eq_ignore_ascii_case(b"namespace");
    let (ns_id, canonical) = if named {
        let Some(ns) = a
            .get(2)
            .and_then(|c| std::str::from_utf8(c).ok())
            .and_then(strata_kvcache::Namespace::from_canonical)
        else {
            return Reply::err(
                "ERR NAMESPACE takes a namespace's canonical text (strata-kvc-v1|...|chunk=<tokens>)",
            );
        };
        (Bytes::from(ns.id()), Some(ns))
    } else {
        (a[1].clone(), None)
    };
    // What follows the namespace.
    let mut at = if named { 3 } else { 2 };
    let mut group = cluster.map_or(0, |c| c.settings().kvc_group_chunks);
    if a.get(at).is_some_and(|w| w.eq_ignore_ascii_case(b"group")) {
        match a.get(at + 1).and_then(|g| parse_int(g)) {
            Some(g) if (0..=CHUNKS_MAX as i64).contains(&g) => group = g as usize,
            _ => return Reply::err("ERR GROUP takes a number of chunks per group (0: untagged)"),
        }
        at += 2;
    }
    let hashes: Vec<Bytes> = match &canonical {
        Some(ns) => {
            if !a.get(at).is_some_and(|w| w.eq_ignore_ascii_case(b"tokens")) {
                return syntax_error();
            }
            let mut tokens = Vec::with_capacity(a.len() - at - 1);
            for t in &a[at + 1..] {
                match parse_int(t).and_then(|t| u32::try_from(t).ok()) {
                    Some(t) => tokens.push(t),
                    None => return Reply::err("ERR TOKENS takes token ids (0 to 4294967295)"),
                }
            }
            ns.chunk_hashes(&tokens)
                .into_iter()
                .map(Bytes::from)
                .collect()
        }
        None => a[at..].to_vec(),
    };
    if hashes.len() > CHUNKS_MAX || (canonical.is_none() && hashes.is_empty()) {
        return syntax_error();
    }
    if cluster.is_some() && group == 0 {
        return Reply::err("ERR in cluster mode chunks are grouped: GROUP must be at least 1");
    }
    let runs = if group == 0 {
        vec![(0, hashes.len())]
    } else {
        strata_kvcache::groups(hashes.len(), group)
    };
    let mut found = Vec::new();
    for (first, end) in runs {
        let tag = (group > 0).then(|| hashes[first].clone());
        let g = match where_group(ctx, &ns_id, tag, &hashes[first..end]).await {
            Ok(g) => g,
            Err(r) => return r,
        };
        let whole = g.tiers.len() == end - first;
        found.push(g);
        if !whole {
            break;
        }
    }
    let count: usize = found.iter().map(|g| g.tiers.len()).sum();
    let load_us: u64 = found.iter().map(|g| g.load_us).sum();
    let mut nodes: Vec<(String, usize)> = Vec::new();
    for g in found.iter().filter(|g| !g.tiers.is_empty()) {
        match nodes.last_mut() {
            Some((n, c)) if *n == g.node => *c += g.tiers.len(),
            _ => nodes.push((g.node.clone(), g.tiers.len())),
        }
    }
    Reply::Array(vec![
        Reply::Integer(count as i64),
        Reply::Integer(load_us as i64),
        Reply::Array(
            nodes
                .into_iter()
                .map(|(n, c)| Reply::Array(vec![Reply::bulk(n), Reply::Integer(c as i64)]))
                .collect(),
        ),
        Reply::Array(
            found
                .into_iter()
                .flat_map(|g| g.tiers)
                .map(Reply::Bulk)
                .collect(),
        ),
    ])
}

/// The leading cached chunks of one group (`tag`: its tag, `None` for untagged keys): from
/// this node's engine if it serves the group's slot, else from the node that does.
async fn where_group(
    ctx: &Ctx<'_>,
    ns: &Bytes,
    tag: Option<Bytes>,
    hashes: &[Bytes],
) -> Result<GroupFound, Reply> {
    let shared = ctx.shared;
    let elsewhere = match (shared.cluster.as_ref(), &tag) {
        (Some(c), Some(t)) => {
            let slot = strata_format::keys::slot_of(t);
            match c.route(slot, false, false) {
                strata_cluster::Route::Local => None,
                strata_cluster::Route::Moved(to) => Some(to),
                other => {
                    return Err(super::cluster::refusal_of(slot, other).expect("not local"));
                }
            }
        }
        _ => None,
    };
    let Some(to) = elsewhere else {
        let c = Chunks {
            ns,
            tag: tag.as_ref(),
            rest: hashes,
        };
        let engine = &shared.engine;
        let found = leading(engine, &keys(ctx, &c, hashes))
            .await
            .map_err(|e| engine_error(&e))?;
        let node = match shared.cluster.as_ref() {
            Some(c) => c
                .me()
                .map_or_else(|| "myself".to_string(), |i| c.map().addr(i).endpoint()),
            None => "myself".to_string(),
        };
        return Ok(GroupFound {
            node,
            tiers: found.iter().map(|(t, _)| Bytes::from(t.as_str())).collect(),
            load_us: engine.expected_load_us(&found),
        });
    };
    let tag = tag.expect("only tagged groups live elsewhere");
    let mut args: Vec<&[u8]> = vec![b"KVC.MATCH", ns, b"TAG", &tag];
    args.extend(hashes.iter().map(|h| h.as_ref()));
    args.push(b"LOADTIME");
    let password = shared.cfg.read().requirepass.clone();
    let reply = shared
        .links
        .call(&to, &password, &args)
        .await
        .map_err(|e| Reply::err(format!("ERR KVC.WHERE could not ask {to}: {e}")))?;
    match reply {
        Reply::Array(parts) => match parts.as_slice() {
            [Reply::Integer(_), Reply::Array(tiers), Reply::Integer(us)] => Ok(GroupFound {
                node: to,
                tiers: tiers
                    .iter()
                    .filter_map(|t| match t {
                        Reply::Bulk(b) => Some(b.clone()),
                        _ => None,
                    })
                    .collect(),
                load_us: (*us).max(0) as u64,
            }),
            _ => Err(Reply::err(format!(
                "ERR KVC.WHERE: {to} answered KVC.MATCH in an unknown shape"
            ))),
        },
        // A move or a map change between the nodes' views: the client asks again.
        Reply::Error(e) if e.starts_with("MOVED") || e.starts_with("TRYAGAIN") => Err(Reply::err(
            format!("TRYAGAIN the group's slot moved ({e}); retry"),
        )),
        Reply::Error(e) => Err(Reply::err(format!("ERR KVC.WHERE: {to} refused: {e}"))),
        _ => Err(Reply::err(format!(
            "ERR KVC.WHERE: {to} answered KVC.MATCH in an unknown shape"
        ))),
    }
}
