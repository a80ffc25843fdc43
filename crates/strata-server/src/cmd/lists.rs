//! List commands. A list is one value of kind [`Kind::List`] (`strata_format::members`, head
//! first): read whole, changed under the key's lock, deleted when left empty. The blocking
//! forms (`BLPOP`, `BRPOP`, `BLMOVE`, `BRPOPLPUSH`, `BLMPOP`) run outside the server's gate
//! and take it for each attempt; every write to a list wakes them to try again.

use bytes::Bytes;
use strata_engine::{Answer, Asked, Kind, Source};
use strata_format::members::decode_members;
use strata_resp::Reply;

use super::ctx::{lower, not_integer, parse_int, syntax_error, wrong_type, Ctx};
use super::typed::{
    block_on, blocking_mpop_args, corrupt, keys_then_timeout, mpop_args, parse_timeout, pop_count,
    read_asked, read_count, read_items, read_kind, read_live, read_members, reply, write_items,
    Deque, ListCodec,
};

/// Changes the list at client key `key` (any change wakes blocked pops: `write_kind`).
async fn write_list<R: Send + 'static>(
    ctx: &mut Ctx<'_>,
    key: &[u8],
    f: impl FnOnce(&mut Deque) -> strata_engine::Result<(bool, R)> + Send,
) -> Result<R, Reply> {
    let key = ctx.key(key);
    write_items::<ListCodec, R>(ctx, &key, f).await
}

async fn push(ctx: &mut Ctx<'_>, a: &[Bytes], left: bool, only_if_exists: bool) -> Reply {
    let new = &a[2..];
    let r = write_list(ctx, &a[1], move |list| {
        if only_if_exists && list.is_empty() {
            return Ok((false, 0));
        }
        for e in new {
            match left {
                true => list.push_front(e),
                false => list.push_back(e),
            }
        }
        Ok((true, list.len() as i64))
    });
    reply(r.await, Reply::Integer)
}

pub(crate) async fn lpush(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    push(ctx, a, true, false).await
}

pub(crate) async fn rpush(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    push(ctx, a, false, false).await
}

pub(crate) async fn lpushx(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    push(ctx, a, true, true).await
}

pub(crate) async fn rpushx(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    push(ctx, a, false, true).await
}

/// Takes up to `n` elements off one end of `list`, in the order they come off.
fn take(list: &mut Deque, left: bool, n: usize) -> Vec<Bytes> {
    match left {
        true => list.take_front(n),
        false => list.take_back(n),
    }
}

async fn pop(ctx: &mut Ctx<'_>, a: &[Bytes], left: bool) -> Reply {
    let count = match pop_count(a) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let Some(count) = count else {
        // One element, no count: no vector for it.
        let r = write_list(ctx, &a[1], move |list| {
            let e = list.pop(left);
            Ok((e.is_some(), e))
        });
        return reply(r.await, |e| e.map_or(Reply::Null, Reply::Bulk));
    };
    let r = write_list(ctx, &a[1], move |list| {
        let existed = !list.is_empty();
        let popped = take(list, left, count);
        Ok((!popped.is_empty(), (existed, popped)))
    });
    reply(r.await, |(existed, popped)| match existed {
        false => Reply::NullArray,
        true => Reply::Array(popped.into_iter().map(Reply::Bulk).collect()),
    })
}

pub(crate) async fn lpop(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    pop(ctx, a, true).await
}

pub(crate) async fn rpop(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    pop(ctx, a, false).await
}

pub(crate) async fn llen(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let key = ctx.key(&a[1]);
    if let Some(r) = read_live::<ListCodec, _>(ctx, &key, |l| l.len() as i64) {
        return reply(r, Reply::Integer);
    }
    read_count(ctx, &key, Kind::List, |v| Ok(decode_members(v)?.len())).await
}

/// A read of the elements `start..=stop` (negative from the end) of the list at `key`
/// past its live value: of a list stored as parts (and not in memory), `parted` answers
/// from those elements, read alone; of any other, `whole` answers from its elements and
/// the value they are cut from.
async fn read_span(
    ctx: &mut Ctx<'_>,
    key: &strata_engine::Key,
    (start, stop): (i64, i64),
    whole: impl FnOnce(&[&[u8]], &Source<'_>) -> Reply + Send,
    parted: impl FnOnce(Vec<Bytes>) -> Reply,
) -> Reply {
    let whole = |v: Option<&Source<'_>>| match v {
        Some(v) => {
            let l = decode_members(v.bytes()).map_err(|e| corrupt(Kind::List, e))?;
            Ok(whole(&l, v))
        }
        // Absent: what an empty list answers.
        None => Ok(whole(&[], &Source::lent(&[]))),
    };
    read_asked(
        ctx,
        key,
        Kind::List,
        Asked::Span(start, stop),
        whole,
        |a| match a {
            Answer::Elements(_, elements) => parted(elements),
            _ => wrong_type(),
        },
    )
    .await
}

/// Redis's range of `start..=stop` (negative from the end) over `len` elements.
fn index_range(len: usize, start: i64, stop: i64) -> std::ops::Range<usize> {
    strata_format::zset::rank_window(len, start, stop).map_or(0..0, |(s, e)| s..e + 1)
}

fn two_ints(a: &[Bytes]) -> Result<(i64, i64), Reply> {
    match (parse_int(&a[2]), parse_int(&a[3])) {
        (Some(x), Some(y)) => Ok((x, y)),
        _ => Err(not_integer()),
    }
}

pub(crate) async fn lrange(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let (start, stop) = match two_ints(a) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let key = ctx.key(&a[1]);
    let live = read_live::<ListCodec, _>(ctx, &key, |l| {
        let range = index_range(l.len(), start, stop);
        l.range(range).map(|m| Reply::Bulk(m.clone())).collect()
    });
    if let Some(r) = live {
        return reply(r, Reply::Array);
    }
    let whole = |l: &[&[u8]], v: &Source<'_>| {
        let range = index_range(l.len(), start, stop);
        Reply::Array(l[range].iter().map(|m| Reply::Bulk(v.cut(m))).collect())
    };
    read_span(ctx, &key, (start, stop), whole, |elements| {
        Reply::Array(elements.into_iter().map(Reply::Bulk).collect())
    })
    .await
}

pub(crate) async fn ltrim(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let (start, stop) = match two_ints(a) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let r = write_list(ctx, &a[1], move |list| {
        let range = index_range(list.len(), start, stop);
        let before = list.len();
        list.take_back(before - range.end.min(before));
        list.take_front(range.start);
        Ok((list.len() != before, ()))
    });
    reply(r.await, |_| Reply::ok())
}

/// The position of `index` (negative from the end) in `len` elements, if inside.
fn position(len: usize, index: i64) -> Option<usize> {
    let i = if index < 0 { len as i64 + index } else { index };
    (0..len as i64).contains(&i).then_some(i as usize)
}

pub(crate) async fn lindex(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let Some(index) = parse_int(&a[2]) else {
        return not_integer();
    };
    let key = ctx.key(&a[1]);
    let live = read_live::<ListCodec, _>(ctx, &key, |l| {
        position(l.len(), index).map_or(Reply::Null, |i| Reply::Bulk(l[i].clone()))
    });
    if let Some(r) = live {
        return reply(r, |r| r);
    }
    let whole = |l: &[&[u8]], v: &Source<'_>| {
        position(l.len(), index).map_or(Reply::Null, |i| Reply::Bulk(v.cut(l[i])))
    };
    read_span(ctx, &key, (index, index), whole, |elements| {
        elements.into_iter().next().map_or(Reply::Null, Reply::Bulk)
    })
    .await
}

pub(crate) async fn lset(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let Some(index) = parse_int(&a[2]) else {
        return not_integer();
    };
    let value = &a[3];
    let r = write_list(ctx, &a[1], move |list| {
        if list.is_empty() {
            return Err(strata_engine::Error::Invalid("no such key".into()));
        }
        let i = position(list.len(), index)
            .ok_or_else(|| strata_engine::Error::Invalid("index out of range".into()))?;
        list.set(i, value);
        Ok((true, ()))
    });
    reply(r.await, |_| Reply::ok())
}

pub(crate) async fn linsert(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let after = match lower(&a[2]).as_str() {
        "before" => false,
        "after" => true,
        _ => return syntax_error(),
    };
    let (pivot, value) = (&a[3], &a[4]);
    let r = write_list(ctx, &a[1], move |list| {
        if list.is_empty() {
            return Ok((false, 0));
        }
        let at = list.iter().position(|e| e == pivot);
        match at {
            None => Ok((false, -1)),
            Some(i) => {
                list.insert(if after { i + 1 } else { i }, value);
                Ok((true, list.len() as i64))
            }
        }
    });
    reply(r.await, Reply::Integer)
}

pub(crate) async fn lrem(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let Some(count) = parse_int(&a[2]) else {
        return not_integer();
    };
    let value = a[3].clone();
    let r = write_list(ctx, &a[1], move |list| {
        let limit = if count == 0 {
            usize::MAX
        } else {
            count.unsigned_abs() as usize
        };
        let mut removed = 0;
        let mut keep = vec![true; list.len()];
        let order: Box<dyn Iterator<Item = usize>> = if count < 0 {
            Box::new((0..list.len()).rev())
        } else {
            Box::new(0..list.len())
        };
        for i in order {
            if removed == limit {
                break;
            }
            if list[i] == value {
                keep[i] = false;
                removed += 1;
            }
        }
        if removed > 0 {
            list.remove_flagged(&keep);
        }
        Ok((removed > 0, removed as i64))
    });
    reply(r.await, Reply::Integer)
}

/// `LPOS key element [RANK rank] [COUNT num] [MAXLEN len]`.
pub(crate) async fn lpos(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let (mut rank, mut count, mut maxlen) = (1i64, None::<i64>, 0i64);
    let mut i = 3;
    while i < a.len() {
        let Some(v) = a.get(i + 1) else {
            return syntax_error();
        };
        let Some(n) = parse_int(v) else {
            return not_integer();
        };
        match lower(&a[i]).as_str() {
            "rank" if n == i64::MIN => return Reply::err("ERR value is out of range"),
            "rank" if n == 0 => {
                return Reply::err(
                    "ERR RANK can't be zero: use 1 to start from the first match, 2 from the \
                     second ... or use negative to start from the end of the list",
                )
            }
            "rank" => rank = n,
            "count" if n < 0 => return Reply::err("ERR COUNT can't be negative"),
            "count" => count = Some(n),
            "maxlen" if n < 0 => return Reply::err("ERR MAXLEN can't be negative"),
            "maxlen" => maxlen = n,
            _ => return syntax_error(),
        }
        i += 2;
    }
    let element = a[2].clone();
    // Positions of the element among the list's `len` elements (`is`: whether the one at a
    // position is it).
    let find = |len: usize, is: &dyn Fn(usize) -> bool| {
        let scan = if maxlen == 0 {
            len
        } else {
            (maxlen as usize).min(len)
        };
        let order: Box<dyn Iterator<Item = usize>> = if rank < 0 {
            Box::new((len - scan..len).rev())
        } else {
            Box::new(0..scan)
        };
        let want = match count {
            Some(0) => usize::MAX,
            Some(n) => n as usize,
            None => 1,
        };
        let found: Vec<usize> = order
            .filter(|&j| is(j))
            .skip(rank.unsigned_abs() as usize - 1)
            .take(want)
            .collect();
        match count {
            None => found
                .first()
                .map_or(Reply::Null, |&j| Reply::Integer(j as i64)),
            Some(_) => Reply::Array(
                found
                    .into_iter()
                    .map(|j| Reply::Integer(j as i64))
                    .collect(),
            ),
        }
    };
    let key = ctx.key(&a[1]);
    let live = read_live::<ListCodec, _>(ctx, &key, |l| find(l.len(), &|j| l[j] == element));
    if let Some(r) = live {
        return reply(r, |r| r);
    }
    read_members::<true>(ctx, &a[1], |l, _| find(l.len(), &|j| l[j] == &element[..])).await
}

fn side(b: &[u8]) -> Option<bool> {
    match lower(b).as_str() {
        "left" => Some(true),
        "right" => Some(false),
        _ => None,
    }
}

/// One attempt of a move: the element taken off `src` (at the `from_left` end) and put on
/// `dst` (at the `to_left` end), or `None` if `src` holds nothing. `src` is checked first;
/// `dst` only once `src` has an element (as Redis does).
async fn move_once(
    ctx: &mut Ctx<'_>,
    src: &Bytes,
    dst: &Bytes,
    from_left: bool,
    to_left: bool,
) -> Result<Option<Bytes>, Moved> {
    let src_list = read_items::<ListCodec>(ctx, src)
        .await
        .map_err(Moved::Source)?;
    if src_list.is_empty() {
        return Ok(None);
    }
    let dst_key = ctx.key(dst);
    read_kind(ctx, &dst_key, Kind::List)
        .await
        .map_err(Moved::Destination)?;
    let Some(element) = write_list(ctx, src, move |list| {
        let e = list.pop(from_left);
        Ok((e.is_some(), e))
    })
    .await
    .map_err(Moved::Source)?
    else {
        return Ok(None);
    };
    let e = element.clone();
    write_list(ctx, dst, move |list| {
        if to_left {
            list.push_front(&e);
        } else {
            list.push_back(&e);
        }
        Ok((true, ()))
    })
    .await
    .map_err(Moved::Destination)?;
    Ok(Some(element))
}

/// Why a move failed: at its source (a blocked move that finds the source turned into
/// another kind waits on, as in Redis) or at its destination (answered at once).
enum Moved {
    Source(Reply),
    Destination(Reply),
}

impl Moved {
    fn reply(self) -> Reply {
        match self {
            Moved::Source(r) | Moved::Destination(r) => r,
        }
    }
}

pub(crate) async fn lmove(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let (Some(from), Some(to)) = (side(&a[3]), side(&a[4])) else {
        return syntax_error();
    };
    let r = move_once(ctx, &a[1], &a[2], from, to).await;
    reply(r.map_err(Moved::reply), |e| {
        e.map_or(Reply::Null, Reply::Bulk)
    })
}

pub(crate) async fn rpoplpush(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let r = move_once(ctx, &a[1], &a[2], false, true).await;
    reply(r.map_err(Moved::reply), |e| {
        e.map_or(Reply::Null, Reply::Bulk)
    })
}

async fn blocking_pop(ctx: &mut Ctx<'_>, a: &[Bytes], left: bool) -> Reply {
    let (keys, timeout) = match keys_then_timeout(a) {
        Ok(x) => x,
        Err(r) => return r,
    };
    block_on(ctx, &keys, &[], timeout, false, Reply::NullArray, |ctx| {
        let keys = keys.clone();
        Box::pin(async move {
            for k in &keys {
                let popped = write_list(ctx, k, move |list| {
                    let e = list.pop(left);
                    Ok((e.is_some(), e))
                })
                .await?;
                if let Some(e) = popped {
                    return Ok(Some(Reply::Array(vec![
                        Reply::Bulk(k.clone()),
                        Reply::Bulk(e),
                    ])));
                }
            }
            Ok(None)
        })
    })
    .await
}

/// One attempt of an `LMPOP`: up to `count` elements off the first of `keys` that has any,
/// as `[key, [elements]]`.
async fn mpop_once(
    ctx: &mut Ctx<'_>,
    keys: &[Bytes],
    left: bool,
    count: usize,
) -> Result<Option<Reply>, Reply> {
    for k in keys {
        let popped = write_list(ctx, k, move |list| {
            let e = take(list, left, count);
            Ok((!e.is_empty(), e))
        })
        .await?;
        if !popped.is_empty() {
            let items = popped.into_iter().map(Reply::Bulk).collect();
            return Ok(Some(Reply::Array(vec![
                Reply::Bulk(k.clone()),
                Reply::Array(items),
            ])));
        }
    }
    Ok(None)
}

/// `LMPOP numkeys key [key ...] LEFT|RIGHT [COUNT count]`.
pub(crate) async fn lmpop(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let (keys, left, count) = match mpop_args(a, 1, ["left", "right"]) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let r = mpop_once(ctx, &keys, left, count).await;
    reply(r, |r| r.unwrap_or(Reply::NullArray))
}

/// `BLMPOP timeout numkeys key [key ...] LEFT|RIGHT [COUNT count]`.
pub(crate) async fn blmpop(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let (timeout, keys, left, count) = match blocking_mpop_args(a, ["left", "right"]) {
        Ok(x) => x,
        Err(r) => return r,
    };
    block_on(ctx, &keys, &[], timeout, false, Reply::NullArray, |ctx| {
        let keys = keys.clone();
        Box::pin(async move { mpop_once(ctx, &keys, left, count).await })
    })
    .await
}

pub(crate) async fn blpop(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    blocking_pop(ctx, a, true).await
}

pub(crate) async fn brpop(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    blocking_pop(ctx, a, false).await
}

async fn blocking_move(ctx: &mut Ctx<'_>, a: &[Bytes], from: bool, to: bool, t: &Bytes) -> Reply {
    let timeout = match parse_timeout(t) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let (src, dst) = (a[1].clone(), a[2].clone());
    if !ctx.conn.may_block {
        // Inside MULTI: one attempt, answered as LMOVE answers.
        let r = move_once(ctx, &src, &dst, from, to).await;
        return reply(r.map_err(Moved::reply), |e| {
            e.map_or(Reply::Null, Reply::Bulk)
        });
    }
    // As Redis: a timeout answers a null array.
    block_on(
        ctx,
        std::slice::from_ref(&src),
        std::slice::from_ref(&dst),
        timeout,
        true,
        Reply::NullArray,
        |ctx| {
            let (src, dst) = (src.clone(), dst.clone());
            Box::pin(async move {
                match move_once(ctx, &src, &dst, from, to).await {
                    Ok(e) => Ok(e.map(Reply::Bulk)),
                    Err(Moved::Source(r)) => Err(r),
                    // A destination of another kind is the answer, even after waiting.
                    Err(Moved::Destination(r)) => Ok(Some(r)),
                }
            })
        },
    )
    .await
}

pub(crate) async fn blmove(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let (Some(from), Some(to)) = (side(&a[3]), side(&a[4])) else {
        return syntax_error();
    };
    blocking_move(ctx, a, from, to, &a[5]).await
}

pub(crate) async fn brpoplpush(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    blocking_move(ctx, a, false, true, &a[3]).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_positions_follow_redis() {
        assert_eq!(index_range(5, 0, -1), 0..5);
        assert_eq!(index_range(5, -2, 100), 3..5);
        assert_eq!(index_range(5, 3, 1), 0..0);
        assert_eq!(index_range(5, -100, -6), 0..0);
        assert_eq!(index_range(0, 0, -1), 0..0);
        assert_eq!(position(3, -1), Some(2));
        assert_eq!(position(3, 3), None);
        assert_eq!(position(3, -4), None);
    }
}
