//! Set commands. A set is one value of kind [`Kind::Set`] (`strata_format::members`, members
//! in the order they were added): read whole, changed under the key's lock, deleted when it
//! is left empty. Commands over several sets read each; those that store a result, and
//! `SMOVE`, run alone (they hold the server's gate).

use std::collections::HashSet;

use bytes::Bytes;
use strata_engine::Kind;
use strata_format::members::decode_members;
use strata_resp::Reply;

use super::ctx::{engine_error, lower, parse_int, syntax_error, wrong_type, Ctx};
use super::packed::{MemberPack, Pack};
use super::typed::{
    pop_count, random_args, random_positions, read_count, read_items, read_live, read_members,
    read_named_members, reply, scan_options, scan_reply, store_items, write_items, SetCodec,
};

fn set_reply(members: impl IntoIterator<Item = Bytes>) -> Reply {
    Reply::Set(members.into_iter().map(Reply::Bulk).collect())
}

pub(crate) async fn sadd(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let new = &a[2..];
    let key = ctx.key(&a[1]);
    let r = write_items::<SetCodec, _>(ctx, &key, move |members| {
        let before = members.len();
        // Refused before any member is added if all of them could take the set past its limit.
        members.room_for(new.iter().map(|m| MemberPack::len(m)).sum())?;
        for m in new {
            if !members.contains(m) {
                members.push(m)?;
            }
        }
        let added = members.len() - before;
        Ok((added > 0, added as i64))
    });
    reply(r.await, Reply::Integer)
}

pub(crate) async fn srem(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let gone: HashSet<Bytes> = a[2..].iter().cloned().collect();
    let key = ctx.key(&a[1]);
    let r = write_items::<SetCodec, _>(ctx, &key, move |members| {
        let removed = members.remove_named(gone.iter().map(|m| &m[..]));
        Ok((removed > 0, removed as i64))
    });
    reply(r.await, Reply::Integer)
}

pub(crate) async fn smembers(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let key = ctx.key(&a[1]);
    if let Some(r) = read_live::<SetCodec, _>(ctx, &key, |m| {
        let c = m.cutter();
        Reply::Set(m.iter().map(|m| Reply::Bulk(c.cut(m))).collect())
    }) {
        return reply(r, |r| r);
    }
    reply(read_items::<SetCodec>(ctx, &a[1]).await, set_reply)
}

pub(crate) async fn scard(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let key = ctx.key(&a[1]);
    if let Some(r) = read_live::<SetCodec, _>(ctx, &key, |m| m.len() as i64) {
        return reply(r, Reply::Integer);
    }
    read_count(ctx, &key, Kind::Set, |v| Ok(decode_members(v)?.len())).await
}

pub(crate) async fn sismember(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let x = &a[2][..];
    let key = ctx.key(&a[1]);
    if let Some(r) = read_live::<SetCodec, _>(ctx, &key, |m| m.contains(x) as i64) {
        return reply(r, Reply::Integer);
    }
    let names = Some(&a[2..3]);
    read_named_members::<false>(ctx, &a[1], names, |m, _| {
        Reply::Integer(m.contains(&x) as i64)
    })
    .await
}

pub(crate) async fn smismember(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let key = ctx.key(&a[1]);
    let live = read_live::<SetCodec, _>(ctx, &key, |m| {
        let found = a[2..].iter().map(|x| Reply::Integer(m.contains(x) as i64));
        Reply::Array(found.collect())
    });
    if let Some(r) = live {
        return reply(r, |r| r);
    }
    read_named_members::<false>(ctx, &a[1], Some(&a[2..]), |m, _| {
        let set: HashSet<&[u8]> = m.iter().copied().collect();
        Reply::Array(
            a[2..]
                .iter()
                .map(|x| Reply::Integer(set.contains(&x[..]) as i64))
                .collect(),
        )
    })
    .await
}

pub(crate) async fn spop(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let count = match pop_count(a) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let key = ctx.key(&a[1]);
    let r = write_items::<SetCodec, _>(ctx, &key, move |members| {
        let n = count.unwrap_or(1).min(members.len());
        let mut picked = random_positions(members.len(), n as i64);
        picked.sort_unstable();
        let mut popped = Vec::with_capacity(n);
        members.index_when_due();
        for i in picked.into_iter().rev() {
            popped.push(members.share(members.get(i)));
            members.remove(i);
        }
        Ok((n > 0, popped))
    });
    reply(r.await, |popped| match count {
        None => popped.into_iter().next().map_or(Reply::Null, Reply::Bulk),
        Some(_) => set_reply(popped),
    })
}

pub(crate) async fn srandmember(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let (count, _) = match random_args(a, None) {
        Ok(c) => c,
        Err(r) => return r,
    };
    // The reply of a set of `len` members, the one at each position as `at` gives it.
    let pick = |len: usize, at: &dyn Fn(usize) -> Bytes| match count {
        None if len == 0 => Reply::Null,
        None => Reply::Bulk(at(random_positions(len, -1)[0])),
        Some(n) => Reply::Array(
            random_positions(len, n)
                .into_iter()
                .map(|i| Reply::Bulk(at(i)))
                .collect(),
        ),
    };
    let key = ctx.key(&a[1]);
    let live = read_live::<SetCodec, _>(ctx, &key, |m| pick(m.len(), &|i| m.share(m.get(i))));
    if let Some(r) = live {
        return reply(r, |r| r);
    }
    let r = read_items::<SetCodec>(ctx, &a[1]).await;
    reply(r, |members| pick(members.len(), &|i| members[i].clone()))
}

/// `SSCAN key cursor [MATCH pattern] [COUNT n]`: a page of members, from the live set when
/// there is one (a scan reads its key again and again, which makes it live).
pub(crate) async fn sscan(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let o = match scan_options(a, false) {
        Ok(o) => o,
        Err(r) => return r,
    };
    let page = |members: &mut dyn Iterator<Item = Bytes>, next: u64| {
        let out = members.filter(|m| o.matches(m)).map(Reply::Bulk).collect();
        scan_reply(next, out)
    };
    let key = ctx.key(&a[1]);
    let live = read_live::<SetCodec, _>(ctx, &key, |m| {
        let m = &*m;
        let (members, next) = o.page_of(m.len(), |i| m.get(i));
        page(&mut members.map(|i| m.share(m.get(i))), next)
    });
    if let Some(r) = live {
        return reply(r, |r| r);
    }
    read_members::<false>(ctx, &a[1], |m, v| {
        let (members, next) = o.page(m, |m| m);
        page(&mut members.iter().map(|m| v.cut(m)), next)
    })
    .await
}

/// How several sets combine.
#[derive(Clone, Copy)]
enum Op {
    Inter,
    Union,
    Diff,
}

/// Combines the sets at `keys` (every key is read first, so a key of another kind is
/// `WRONGTYPE` whatever the others hold); at most `limit` members of an intersection.
async fn combine(ctx: &mut Ctx<'_>, keys: &[Bytes], op: Op) -> Result<Vec<Bytes>, Reply> {
    let mut sets = Vec::with_capacity(keys.len());
    for k in keys {
        sets.push(read_items::<SetCodec>(ctx, k).await?);
    }
    let mut it = sets.into_iter();
    let first = it.next().unwrap_or_default();
    Ok(match op {
        Op::Union => {
            let mut seen: HashSet<Bytes> = first.iter().cloned().collect();
            let mut out = first;
            for s in it {
                for m in s {
                    if seen.insert(m.clone()) {
                        out.push(m);
                    }
                }
            }
            out
        }
        Op::Inter => {
            let mut out = first;
            for s in it {
                let s: HashSet<Bytes> = s.into_iter().collect();
                out.retain(|m| s.contains(m));
            }
            out
        }
        Op::Diff => {
            let mut out = first;
            for s in it {
                let s: HashSet<Bytes> = s.into_iter().collect();
                out.retain(|m| !s.contains(m));
            }
            out
        }
    })
}

async fn combine_reply(ctx: &mut Ctx<'_>, a: &[Bytes], op: Op) -> Reply {
    reply(combine(ctx, &a[1..], op).await, set_reply)
}

async fn combine_store(ctx: &mut Ctx<'_>, a: &[Bytes], op: Op) -> Reply {
    let members = match combine(ctx, &a[2..], op).await {
        Ok(m) => m,
        Err(r) => return r,
    };
    store_items::<SetCodec>(ctx, &a[1], &members).await
}

pub(crate) async fn sinter(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    combine_reply(ctx, a, Op::Inter).await
}

pub(crate) async fn sunion(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    combine_reply(ctx, a, Op::Union).await
}

pub(crate) async fn sdiff(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    combine_reply(ctx, a, Op::Diff).await
}

pub(crate) async fn sinterstore(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    combine_store(ctx, a, Op::Inter).await
}

pub(crate) async fn sunionstore(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    combine_store(ctx, a, Op::Union).await
}

pub(crate) async fn sdiffstore(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    combine_store(ctx, a, Op::Diff).await
}

/// `SINTERCARD numkeys key [key ...] [LIMIT limit]`.
pub(crate) async fn sintercard(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let n = match parse_int(&a[1]) {
        Some(n) if n > 0 => n as usize,
        Some(_) => return Reply::err("ERR numkeys should be greater than 0"),
        None => return Reply::err("ERR numkeys should be greater than 0"),
    };
    if n > a.len() - 2 {
        return Reply::err("ERR Number of keys can't be greater than number of args");
    }
    let mut limit = 0usize;
    let rest = &a[2 + n..];
    match rest {
        [] => {}
        [opt, l] if lower(opt) == "limit" => match parse_int(l) {
            Some(l) if l >= 0 => limit = l as usize,
            _ => return Reply::err("ERR LIMIT can't be negative"),
        },
        _ => return syntax_error(),
    }
    let r = combine(ctx, &a[2..2 + n], Op::Inter).await;
    reply(r, |m| {
        let len = if limit == 0 {
            m.len()
        } else {
            m.len().min(limit)
        };
        Reply::Integer(len as i64)
    })
}

/// `SMOVE source destination member`: 0 when the source holds nothing; then both keys are
/// checked (`WRONGTYPE`).
pub(crate) async fn smove(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let (src, dst, member) = (ctx.key(&a[1]), ctx.key(&a[2]), a[3].clone());
    // Both kinds, without reading either set (a large one is not decoded for this).
    let engine = &ctx.shared.engine;
    let kinds = match (engine.kind_of(&src).await, engine.kind_of(&dst).await) {
        (Ok(s), Ok(d)) => (s, d),
        (Err(e), _) | (_, Err(e)) => return engine_error(&e),
    };
    match kinds {
        (None, _) => return Reply::Integer(0),
        (Some(Kind::Set), None | Some(Kind::Set)) => {}
        _ => return wrong_type(),
    }
    if src == dst {
        return sismember(ctx, &[a[0].clone(), a[1].clone(), member]).await;
    }
    let m = member.clone();
    let moved = write_items::<SetCodec, _>(ctx, &src, move |members| {
        let removed = members.remove_named([&m[..]]) > 0;
        Ok((removed, removed))
    })
    .await;
    match moved {
        Ok(true) => {}
        Ok(false) => return Reply::Integer(0),
        Err(r) => return r,
    }
    let r = write_items::<SetCodec, _>(ctx, &dst, move |members| {
        let new = !members.contains(&member);
        if new {
            members.push(&member)?;
        }
        Ok((new, ()))
    });
    reply(r.await, |_| Reply::Integer(1))
}
