//! Hash commands. A hash is one value of kind [`Kind::Hash`] (`strata_format::hash`): read
//! whole, changed by a read-modify-write under the key's lock, deleted when its last field
//! goes. It tiers like a string.

use bytes::Bytes;
use strata_engine::{Key, Kind, Source};
use strata_format::hash::{decode_hash, encode_hash, field_at, put_field, Field};
use strata_resp::Reply;

use super::ctx::{not_integer, parse_int, wrong_args, Ctx};
use super::packed::{Indexed, Named, Pack};
use super::strings::{float_plus, parse_float};
use super::typed::{
    corrupt, random_args, random_positions, read_live, read_named_with, reply, scan_options,
    scan_reply, write_items, write_items_whole, Codec, ScanOptions,
};

/// A field as the whole-value way holds it: name and value share the stored value they
/// were decoded from.
#[derive(Clone)]
struct Owned {
    name: Bytes,
    value: Bytes,
    expire_ms: u64,
}

impl Owned {
    fn field(&self) -> Field<'_> {
        Field {
            name: &self.name,
            value: &self.value,
            expire_ms: self.expire_ms,
        }
    }
}

impl<'a> Named<'a> for Field<'a> {
    fn name(self) -> &'a [u8] {
        self.name
    }
}

/// A live hash's fields packed as its value stores them.
struct FieldPack;

impl Pack for FieldPack {
    type Item = Owned;
    type Ref<'a> = Field<'a>;
    fn as_ref(item: &Owned) -> Field<'_> {
        item.field()
    }
    fn len(f: Field<'_>) -> usize {
        f.encoded_len()
    }
    fn put(out: &mut Vec<u8>, f: Field<'_>) {
        put_field(out, &f);
    }
    #[inline]
    fn try_at(b: &[u8]) -> strata_format::Result<(Field<'_>, usize)> {
        field_at(b)
    }
    fn timed(f: Field<'_>) -> bool {
        f.expire_ms != 0
    }
}

/// A hash's live fields, in the order they were first set.
struct HashCodec;

impl Codec for HashCodec {
    type Item = Owned;
    type Items = Indexed<FieldPack>;
    const KIND: Kind = Kind::Hash;
    fn decode(value: &Bytes, now_ms: u64) -> strata_format::Result<Vec<Owned>> {
        Ok(decode_hash(value)?
            .into_iter()
            .filter(|f| f.is_live(now_ms))
            .map(|f| Owned {
                name: value.slice_ref(f.name),
                value: value.slice_ref(f.value),
                expire_ms: f.expire_ms,
            })
            .collect())
    }
    fn encode(items: &[Owned]) -> Vec<u8> {
        let fields: Vec<Field<'_>> = items.iter().map(Owned::field).collect();
        encode_hash(&fields)
    }
    fn expires(item: &Owned) -> bool {
        item.expire_ms != 0
    }
}

/// Runs `f` over the live fields of the hash at `argument 1` (none if absent).
async fn with_fields<R>(
    ctx: &mut Ctx<'_>,
    a: &[Bytes],
    f: impl FnOnce(&[Field<'_>], &Source<'_>) -> R + Send,
) -> Result<R, Reply> {
    let key = ctx.key(&a[1]);
    with_fields_at(ctx, &key, None, f).await
}

/// [`with_fields`] of the hash at `key`; given `names`, `f` may see only those of its
/// fields (a hash stored as parts is read by name).
async fn with_fields_at<R>(
    ctx: &mut Ctx<'_>,
    key: &Key,
    names: Option<&[Bytes]>,
    f: impl FnOnce(&[Field<'_>], &Source<'_>) -> R + Send,
) -> Result<R, Reply> {
    let now = ctx.shared.engine.now_ms();
    read_named_with(ctx, key, Kind::Hash, names, |v| {
        let empty = Source::lent(&[]);
        let v = v.unwrap_or(&empty);
        // An absent key reads as an empty value; a stored hash is never empty (its header).
        let mut fields = if v.bytes().is_empty() {
            Vec::new()
        } else {
            decode_hash(v.bytes()).map_err(|e| corrupt(Kind::Hash, e))?
        };
        fields.retain(|f| f.is_live(now));
        Ok(f(&fields, v))
    })
    .await
}

/// The read-modify-write of a hash's live fields (see [`write_items`]).
async fn write_hash<R: Send + 'static>(
    ctx: &mut Ctx<'_>,
    key: &Key,
    f: impl FnOnce(&mut Indexed<FieldPack>) -> strata_engine::Result<(bool, R)> + Send,
) -> Result<R, Reply> {
    write_items::<HashCodec, R>(ctx, key, f).await
}

/// A field with no expiry.
fn plain<'a>(name: &'a [u8], value: &'a [u8]) -> Field<'a> {
    Field {
        name,
        value,
        expire_ms: 0,
    }
}

/// Sets `name` to `value` in `fields` (a new field goes last; an existing one keeps its
/// place, and loses any expiry, as `HSET` does). Says whether the field is new.
fn set_field(
    fields: &mut Indexed<FieldPack>,
    name: &[u8],
    value: &[u8],
) -> strata_engine::Result<bool> {
    match fields.position(name) {
        Some(i) => {
            fields.replace(i, |_, out| put_field(out, &plain(name, value)))?;
            Ok(false)
        }
        None => {
            fields.push(plain(name, value))?;
            Ok(true)
        }
    }
}

async fn hset_pairs(ctx: &mut Ctx<'_>, a: &[Bytes], name: &str) -> Result<i64, Reply> {
    if a.len() < 4 || !a.len().is_multiple_of(2) {
        return Err(wrong_args(name));
    }
    let pairs = &a[2..];
    let key = ctx.key(&a[1]);
    write_hash(ctx, &key, move |fields| {
        // Refused before any field is set if all of them could take the hash past its limit.
        let most: usize = pairs
            .chunks_exact(2)
            .map(|p| plain(&p[0], &p[1]).encoded_len())
            .sum();
        fields.room_for(most)?;
        let mut added = 0;
        for p in pairs.chunks_exact(2) {
            added += set_field(fields, &p[0], &p[1])? as i64;
        }
        Ok((true, added))
    })
    .await
}

pub(crate) async fn hset(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    reply(hset_pairs(ctx, a, "hset").await, Reply::Integer)
}

pub(crate) async fn hmset(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    reply(hset_pairs(ctx, a, "hmset").await, |_| Reply::ok())
}

pub(crate) async fn hsetnx(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let (name, value) = (a[2].clone(), a[3].clone());
    let key = ctx.key(&a[1]);
    let r = write_hash(ctx, &key, move |fields| {
        if fields.contains(&name) {
            return Ok((false, 0));
        }
        set_field(fields, &name, &value)?;
        Ok((true, 1))
    })
    .await;
    reply(r, Reply::Integer)
}

/// The field of `fields` named `name`.
fn find<'f, 'v>(fields: &'f [Field<'v>], name: &[u8]) -> Option<&'f Field<'v>> {
    fields.iter().find(|f| f.name == name)
}

/// The value of the field `name` of a live hash.
fn live_value(fields: &mut Indexed<FieldPack>, name: &[u8]) -> Reply {
    fields.index_when_due();
    let fields = &*fields;
    fields
        .lookup(name)
        .map_or(Reply::Null, |(_, f)| Reply::Bulk(fields.share(f.value)))
}

pub(crate) async fn hget(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let key = ctx.key(&a[1]);
    if let Some(r) = read_live::<HashCodec, _>(ctx, &key, |h| live_value(h, &a[2])) {
        return reply(r, |r| r);
    }
    let r = with_fields_at(ctx, &key, Some(&a[2..3]), |fields, v| {
        find(fields, &a[2]).map_or(Reply::Null, |f| Reply::Bulk(v.cut(f.value)))
    });
    reply(r.await, |r| r)
}

/// Asks for more than this many fields of a hash this large look names up in a map. A
/// comparison of two names is a length check and, rarely, a `memcmp`; building the map
/// hashes every field (an `HMGET` of 10 fields of a 100-field hash spent a third of the
/// server's time on the map at 256).
const LINEAR_LOOKUPS_MAX: usize = 4096;

pub(crate) async fn hmget(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let key = ctx.key(&a[1]);
    let live = read_live::<HashCodec, _>(ctx, &key, |h| {
        h.index_for(a.len() - 2);
        let h = &*h;
        let values = a[2..].iter().map(|n| h.lookup(n).map(|(_, f)| f.value));
        h.replies(values).collect()
    });
    if let Some(r) = live {
        return reply(r, Reply::Array);
    }
    let r = with_fields_at(ctx, &key, Some(&a[2..]), |fields, v| {
        let names = &a[2..];
        let value_of = |f: &Field<'_>| Reply::Bulk(v.cut(f.value));
        if names.len() * fields.len() <= LINEAR_LOOKUPS_MAX {
            return names
                .iter()
                .map(|n| find(fields, n).map_or(Reply::Null, value_of))
                .collect();
        }
        let by_name: std::collections::HashMap<&[u8], &Field<'_>> =
            fields.iter().map(|f| (f.name, f)).collect();
        names
            .iter()
            .map(|n| by_name.get(n.as_ref()).map_or(Reply::Null, |f| value_of(f)))
            .collect()
    })
    .await;
    reply(r, Reply::Array)
}

pub(crate) async fn hgetall(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let key = ctx.key(&a[1]);
    let live = read_live::<HashCodec, _>(ctx, &key, |h| {
        let c = h.cutter();
        let pair = |f: Field<'_>| (Reply::Bulk(c.cut(f.name)), Reply::Bulk(c.cut(f.value)));
        h.iter().map(pair).collect()
    });
    if let Some(r) = live {
        return reply(r, Reply::Map);
    }
    let r = with_fields_at(ctx, &key, None, |fields, v| {
        fields
            .iter()
            .map(|f| (Reply::Bulk(v.cut(f.name)), Reply::Bulk(v.cut(f.value))))
            .collect()
    })
    .await;
    reply(r, Reply::Map)
}

pub(crate) async fn hkeys(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    field_parts(ctx, a, true).await
}

pub(crate) async fn hvals(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    field_parts(ctx, a, false).await
}

/// Every field's name (`HKEYS`) or value (`HVALS`), in order.
async fn field_parts(ctx: &mut Ctx<'_>, a: &[Bytes], names: bool) -> Reply {
    let key = ctx.key(&a[1]);
    let live = read_live::<HashCodec, _>(ctx, &key, |h| {
        let c = h.cutter();
        let part = |f: Field<'_>| Reply::Bulk(c.cut(if names { f.name } else { f.value }));
        h.iter().map(part).collect()
    });
    if let Some(r) = live {
        return reply(r, Reply::Array);
    }
    let r = with_fields(ctx, a, |fields, v| {
        let part = |f: &Field<'_>| v.cut(if names { f.name } else { f.value });
        fields.iter().map(|f| Reply::Bulk(part(f))).collect()
    });
    reply(r.await, Reply::Array)
}

pub(crate) async fn hlen(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let key = ctx.key(&a[1]);
    if let Some(r) = read_live::<HashCodec, _>(ctx, &key, |h| h.len() as i64) {
        return reply(r, Reply::Integer);
    }
    let r = with_fields_at(ctx, &key, None, |fields, _| fields.len() as i64);
    reply(r.await, Reply::Integer)
}

pub(crate) async fn hexists(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let key = ctx.key(&a[1]);
    if let Some(r) = read_live::<HashCodec, _>(ctx, &key, |h| h.contains(&a[2]) as i64) {
        return reply(r, Reply::Integer);
    }
    let r = with_fields_at(ctx, &key, Some(&a[2..3]), |fields, _| {
        find(fields, &a[2]).is_some() as i64
    });
    reply(r.await, Reply::Integer)
}

pub(crate) async fn hstrlen(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let r = with_fields(ctx, a, |fields, _| {
        find(fields, &a[2]).map_or(0, |f| f.value.len() as i64)
    });
    reply(r.await, Reply::Integer)
}

pub(crate) async fn hdel(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let names: Vec<Bytes> = a[2..].to_vec();
    let key = ctx.key(&a[1]);
    let r = write_hash(ctx, &key, move |fields| {
        let removed = fields.remove_named(names.iter().map(|n| &n[..]));
        Ok((removed > 0, removed as i64))
    })
    .await;
    reply(r, Reply::Integer)
}

pub(crate) async fn hincrby(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let Some(delta) = parse_int(&a[3]) else {
        return not_integer();
    };
    let name = a[2].clone();
    let key = ctx.key(&a[1]);
    let r = write_hash(ctx, &key, move |fields| {
        let old = match fields.position(&name) {
            Some(i) => parse_int(fields.get(i).value).ok_or_else(|| {
                strata_engine::Error::Invalid("hash value is not an integer".into())
            })?,
            None => 0,
        };
        let new = old
            .checked_add(delta)
            .ok_or(strata_engine::Error::Overflow)?;
        replace_value(fields, &name, new.to_string().as_bytes())?;
        Ok((true, new))
    })
    .await;
    reply(r, Reply::Integer)
}

/// Sets field `name` to `value`, keeping its place and its expiry (as the increments do).
fn replace_value(
    fields: &mut Indexed<FieldPack>,
    name: &[u8],
    value: &[u8],
) -> strata_engine::Result<()> {
    match fields.position(name) {
        Some(i) => fields.replace(i, |f, out| put_field(out, &Field { value, ..f })),
        None => fields.push(plain(name, value)),
    }
}

pub(crate) async fn hincrbyfloat(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let delta = match parse_float(&a[3]) {
        Some(Ok(d)) => Some(Ok(d)),
        Some(Err(())) => return Reply::err("ERR value is NaN or Infinity"),
        None => return Reply::err("ERR value is not a valid float"),
    };
    let name = a[2].clone();
    let key = ctx.key(&a[1]);
    let r = write_hash(ctx, &key, move |fields| {
        let old = fields.position(&name).map(|i| fields.get(i).value);
        let text = float_plus(old, delta, "hash value is not a float")?;
        replace_value(fields, &name, &text)?;
        Ok((true, text))
    })
    .await;
    reply(r, Reply::Bulk)
}

pub(crate) async fn hrandfield(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let (count, with_values) = match random_args(a, Some("withvalues")) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let resp3 = ctx.conn.proto == 3;
    // The field at a position, as (name, value).
    let pick = |len: usize, at: &dyn Fn(usize) -> (Bytes, Bytes)| {
        let Some(count) = count else {
            return match len {
                0 => Reply::Null,
                n => Reply::Bulk(at(random_positions(n, -1)[0]).0),
            };
        };
        let items = random_positions(len, count).into_iter().map(at);
        match (with_values, resp3) {
            (false, _) => Reply::Array(items.map(|(n, _)| Reply::Bulk(n)).collect()),
            (true, false) => Reply::Array(
                items
                    .flat_map(|(n, v)| [Reply::Bulk(n), Reply::Bulk(v)])
                    .collect(),
            ),
            (true, true) => Reply::Array(
                items
                    .map(|(n, v)| Reply::Array(vec![Reply::Bulk(n), Reply::Bulk(v)]))
                    .collect(),
            ),
        }
    };
    let key = ctx.key(&a[1]);
    let live = read_live::<HashCodec, _>(ctx, &key, |h| {
        pick(h.len(), &|i| {
            let f = h.get(i);
            (h.share(f.name), h.share(f.value))
        })
    });
    if let Some(r) = live {
        return reply(r, |r| r);
    }
    let r = with_fields_at(ctx, &key, None, |fields, v| {
        pick(fields.len(), &|i| {
            (v.cut(fields[i].name), v.cut(fields[i].value))
        })
    });
    reply(r.await, |r| r)
}

/// `HSCAN key cursor [MATCH pattern] [COUNT n] [NOVALUES]`: a page of fields, from the live
/// hash when there is one (a scan reads its key again and again, which makes it live).
pub(crate) async fn hscan(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let o = match scan_options(a, true) {
        Ok(o) => o,
        Err(r) => return r,
    };
    let now = ctx.shared.engine.now_ms();
    let key = ctx.key(&a[1]);
    let live = read_live::<HashCodec, _>(ctx, &key, |h| {
        let h = &*h;
        let (page, next) = o.page_of(h.len(), |i| h.get(i).name);
        let fields = page.map(|i| h.get(i)).filter(|f| f.is_live(now));
        hscan_page(
            &o,
            next,
            fields.map(|f| (h.share(f.name), h.share(f.value))),
        )
    });
    if let Some(r) = live {
        return reply(r, |r| r);
    }
    let r = with_fields_at(ctx, &key, None, |fields, v| {
        let (page, next) = o.page(fields, |f| f.name);
        hscan_page(
            &o,
            next,
            page.iter().map(|f| (v.cut(f.name), v.cut(f.value))),
        )
    });
    reply(r.await, |r| r)
}

/// An `HSCAN` reply: the page's fields that pass the pattern, then the cursor to go on with.
fn hscan_page(o: &ScanOptions, next: u64, fields: impl Iterator<Item = (Bytes, Bytes)>) -> Reply {
    let mut out = Vec::new();
    for (name, value) in fields.filter(|(name, _)| o.matches(name)) {
        out.push(Reply::Bulk(name));
        if o.values {
            out.push(Reply::Bulk(value));
        }
    }
    scan_reply(next, out)
}

// Field expiry (Redis 7.4's `HEXPIRE` family): each field carries its own expiry in the
// hash's value, so it moves with the hash through every tier. An expired field is never
// answered; it is dropped from the value at the hash's next write.

/// The field-expiry readers' and `HPERSIST`'s error for a bad field count.
const POSITIVE_FIELDS: &str = "Number of fields must be a positive integer";

/// Latest field expiry Redis accepts (2^48 - 1 ms).
const FIELD_EXPIRE_MS_MAX: u64 = (1 << 48) - 1;

/// The field names after `FIELDS numfields` at argument `at`; `bad_count` is the error
/// for a count that is not a positive integer (Redis words it per command).
fn field_names<'a>(a: &'a [Bytes], at: usize, bad_count: &str) -> Result<&'a [Bytes], Reply> {
    if a.len() <= at + 1 || !super::ctx::lower(&a[at]).eq("fields") {
        return Err(Reply::err(
            "ERR Mandatory argument FIELDS is missing or not at the right position",
        ));
    }
    let n = match parse_int(&a[at + 1]) {
        Some(n) if n > 0 => n as usize,
        _ => return Err(Reply::err(format!("ERR {bad_count}"))),
    };
    if n != a.len() - at - 2 {
        return Err(Reply::err(
            "ERR The `numfields` parameter must match the number of arguments",
        ));
    }
    Ok(&a[at + 2..])
}

/// `HEXPIRE`, `HPEXPIRE`, `HEXPIREAT`, `HPEXPIREAT key time [NX|XX|GT|LT] FIELDS n field...`:
/// per field -2 (no such field), 0 (the condition kept it), 1 (set), 2 (a time already
/// past: the field is deleted).
async fn hexpire_generic(ctx: &mut Ctx<'_>, a: &[Bytes], unit_ms: u64, absolute: bool) -> Reply {
    let name = super::ctx::lower(&a[0]);
    let Some(t) = parse_int(&a[2]) else {
        return not_integer();
    };
    let (cond, at) = match a.get(3).map(|c| super::ctx::lower(c)) {
        Some(c) if ["nx", "xx", "gt", "lt"].contains(&c.as_str()) => (Some(c), 4),
        _ => (None, 3),
    };
    let names = match field_names(a, at, "Parameter `numFields` should be greater than 0") {
        Ok(n) => n.to_vec(),
        Err(r) => return r,
    };
    let now = ctx.shared.engine.now_ms();
    if t < 0 {
        return Reply::err("ERR invalid expire time, must be >= 0");
    }
    let when = (t as i128) * (unit_ms as i128) + if absolute { 0 } else { now as i128 };
    if when > FIELD_EXPIRE_MS_MAX as i128 {
        return Reply::err(format!("ERR invalid expire time in '{name}' command"));
    }
    let when = when as u64;
    let key = ctx.key(&a[1]);
    // Fields with a TTL of their own are not kept live: the whole-value way.
    let r = write_items_whole::<HashCodec, _>(ctx, &key, move |fields| {
        let mut out = Vec::with_capacity(names.len());
        let mut changed = false;
        for n in &names {
            let Some(i) = fields.iter().position(|f| f.name == *n) else {
                out.push(Reply::Integer(-2));
                continue;
            };
            let cur = fields[i].expire_ms;
            // No expiry counts as forever.
            let ok = match cond.as_deref() {
                Some("nx") => cur == 0,
                Some("xx") => cur != 0,
                Some("gt") => cur != 0 && when > cur,
                Some("lt") => cur == 0 || when < cur,
                _ => true,
            };
            if !ok {
                out.push(Reply::Integer(0));
            } else if when <= now {
                fields.remove(i);
                changed = true;
                out.push(Reply::Integer(2));
            } else {
                fields[i].expire_ms = when;
                changed = true;
                out.push(Reply::Integer(1));
            }
        }
        Ok((changed, out))
    })
    .await;
    reply(r, Reply::Array)
}

pub(crate) async fn hexpire(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    hexpire_generic(ctx, a, 1000, false).await
}

pub(crate) async fn hpexpire(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    hexpire_generic(ctx, a, 1, false).await
}

pub(crate) async fn hexpireat(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    hexpire_generic(ctx, a, 1000, true).await
}

pub(crate) async fn hpexpireat(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    hexpire_generic(ctx, a, 1, true).await
}

/// What the field-expiry readers answer for a field with an expiry: from its absolute
/// expiry in ms and now.
type ExpiryView = fn(u64, u64) -> i64;

/// `HTTL`, `HPTTL`, `HEXPIRETIME`, `HPEXPIRETIME key FIELDS n field...`: per field -2 (no
/// such field), -1 (no expiry), else `view` of its expiry.
async fn field_expiry(ctx: &mut Ctx<'_>, a: &[Bytes], view: ExpiryView) -> Reply {
    let names = match field_names(a, 2, POSITIVE_FIELDS) {
        Ok(n) => n,
        Err(r) => return r,
    };
    let now = ctx.shared.engine.now_ms();
    let r = with_fields(ctx, a, |fields, _| {
        names
            .iter()
            .map(|n| {
                Reply::Integer(match find(fields, n) {
                    None => -2,
                    Some(f) if f.expire_ms == 0 => -1,
                    Some(f) => view(f.expire_ms, now),
                })
            })
            .collect()
    });
    reply(r.await, Reply::Array)
}

pub(crate) async fn httl(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    field_expiry(ctx, a, |at, now| {
        (at.saturating_sub(now) + 999) as i64 / 1000
    })
    .await
}

pub(crate) async fn hpttl(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    field_expiry(ctx, a, |at, now| at.saturating_sub(now) as i64).await
}

pub(crate) async fn hexpiretime(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    field_expiry(ctx, a, |at, _| (at / 1000) as i64).await
}

pub(crate) async fn hpexpiretime(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    field_expiry(ctx, a, |at, _| at as i64).await
}

/// `HPERSIST key FIELDS n field...`: per field -2 (no such field), -1 (no expiry), 1
/// (its expiry removed).
pub(crate) async fn hpersist(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let names = match field_names(a, 2, POSITIVE_FIELDS) {
        Ok(n) => n.to_vec(),
        Err(r) => return r,
    };
    let key = ctx.key(&a[1]);
    let r = write_hash(ctx, &key, move |fields| {
        let mut changed = false;
        let mut out = Vec::with_capacity(names.len());
        for n in &names {
            out.push(Reply::Integer(match fields.position(n) {
                None => -2,
                Some(i) if fields.get(i).expire_ms == 0 => -1,
                Some(i) => {
                    let persist = |f: Field<'_>, out: &mut Vec<u8>| {
                        put_field(out, &Field { expire_ms: 0, ..f })
                    };
                    fields.replace(i, persist)?;
                    changed = true;
                    1
                }
            }));
        }
        Ok((changed, out))
    })
    .await;
    reply(r, Reply::Array)
}

#[cfg(test)]
mod tests {
    use super::super::items::Items;
    use super::*;

    #[test]
    fn set_field_keeps_the_place_of_an_existing_field_and_appends_new_ones() {
        let mut fields = <Indexed<FieldPack> as Items<Owned>>::from_vec(Vec::new());
        assert!(set_field(&mut fields, b"a", b"1").unwrap());
        assert!(set_field(&mut fields, b"b", b"2").unwrap());
        let timed = |f: Field<'_>, out: &mut Vec<u8>| put_field(out, &Field { expire_ms: 5, ..f });
        fields.replace(0, timed).unwrap();
        assert_eq!(fields.get(0).expire_ms, 5);
        assert!(!set_field(&mut fields, b"a", b"3").unwrap());
        let got: Vec<(&[u8], &[u8], u64)> = fields
            .iter()
            .map(|f| (f.name, f.value, f.expire_ms))
            .collect();
        assert_eq!(
            got,
            vec![(&b"a"[..], &b"3"[..], 0), (&b"b"[..], &b"2"[..], 0)]
        );
    }
}
