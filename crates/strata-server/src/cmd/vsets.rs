//! Vector sets, Redis 8's commands: `VADD VREM VSIM VCARD VDIM VEMB VISMEMBER VGETATTR
//! VSETATTR VINFO VRANDMEMBER VLINKS`, with Redis's defaults (Q8, `M` 16, build `EF` 200,
//! search `EF` 100, `COUNT` 10, `FILTER-EF` `COUNT`×100) and replies. The set lives in
//! `vlive.rs`; the graph, filters and records in `strata_vector`. Not yet: `REDUCE`,
//! `VRANGE`; searches run on the client's task (`NOTHREAD` is the only way they run).

use bytes::Bytes;
use strata_resp::Reply;
use strata_vector::filter::Expr;
use strata_vector::set::{AddError, Found, Settings, DIM_MAX};
use strata_vector::{Quant, Query, VectorSet};

use super::ctx::{lower, not_integer, parse_int, syntax_error, Ctx};
use super::vlive::{read_set, write_set};

const M_DEFAULT: usize = 16;
const M_MAX: usize = 4096;
const EF_BUILD_DEFAULT: usize = 200;
const EF_SEARCH_DEFAULT: usize = 100;
const EF_MAX: usize = 1_000_000;
const COUNT_DEFAULT: usize = 10;

fn invalid_vector() -> Reply {
    Reply::err("ERR invalid vector specification")
}

/// A vector given as `FP32 blob` or `VALUES n x1 .. xn` at `a[at..]`: the vector and
/// where the arguments after it start.
fn vector_arg(a: &[Bytes], at: usize) -> Result<(Vec<f32>, usize), Reply> {
    match a.get(at).map(|x| lower(x)).as_deref() {
        Some("fp32") => {
            let blob = a.get(at + 1).ok_or_else(syntax_error)?;
            if blob.is_empty() || !blob.len().is_multiple_of(4) || blob.len() / 4 > DIM_MAX {
                return Err(invalid_vector());
            }
            let v = blob
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()));
            Ok((v.collect(), at + 2))
        }
        Some("values") => {
            let n = a
                .get(at + 1)
                .and_then(|n| parse_int(n))
                .ok_or_else(invalid_vector)?;
            if n < 1 || n as usize > DIM_MAX || a.len() < at + 2 + n as usize {
                return Err(invalid_vector());
            }
            let parse = |x: &Bytes| {
                std::str::from_utf8(x)
                    .ok()?
                    .parse::<f32>()
                    .ok()
                    .filter(|f| f.is_finite())
            };
            let v: Option<Vec<f32>> = a[at + 2..at + 2 + n as usize].iter().map(parse).collect();
            Ok((v.ok_or_else(invalid_vector)?, at + 2 + n as usize))
        }
        _ => Err(syntax_error()),
    }
}

/// A positive integer option's value, at most `max`.
fn count_arg(a: &[Bytes], at: usize, max: usize, what: &str) -> Result<usize, Reply> {
    match a.get(at).map(|v| parse_int(v)) {
        None => Err(syntax_error()),
        Some(None) => Err(not_integer()),
        Some(Some(n)) if n >= 1 && n as usize <= max => Ok(n as usize),
        Some(Some(_)) => Err(Reply::err(format!("ERR invalid {what}"))),
    }
}

/// What a `VADD` asks for after its element.
struct AddOptions {
    quant: Option<Quant>,
    m: usize,
    ef: usize,
    attrs: Option<Option<Vec<u8>>>,
}

fn add_options(a: &[Bytes]) -> Result<AddOptions, Reply> {
    let mut o = AddOptions {
        quant: None,
        m: M_DEFAULT,
        ef: EF_BUILD_DEFAULT,
        attrs: None,
    };
    let mut i = 0;
    while i < a.len() {
        let q = match lower(&a[i]).as_str() {
            "cas" => None,
            "noquant" => Some(Quant::NoQuant),
            "q8" => Some(Quant::Q8),
            "bin" => Some(Quant::Bin),
            "ef" => {
                o.ef = count_arg(a, i + 1, EF_MAX, "EF")?;
                i += 1;
                None
            }
            "m" => {
                o.m = count_arg(a, i + 1, M_MAX, "M")?.max(4);
                i += 1;
                None
            }
            "setattr" => {
                let json = a.get(i + 1).ok_or_else(syntax_error)?;
                o.attrs = Some((!json.is_empty()).then(|| json.to_vec()));
                i += 1;
                None
            }
            _ => return Err(syntax_error()),
        };
        if q.is_some() {
            if o.quant.is_some() {
                return Err(Reply::err(
                    "ERR only one of NOQUANT, Q8 or BIN may be given",
                ));
            }
            o.quant = q;
        }
        i += 1;
    }
    Ok(o)
}

/// `VADD key [REDUCE dim] (FP32 blob | VALUES n x..) element [CAS] [NOQUANT | Q8 | BIN]
/// [EF n] [SETATTR json] [M n]` → 1 if the element is new, 0 if its vector was replaced.
pub(crate) async fn vadd(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    if lower(&a[2]) == "reduce" {
        return Reply::err("ERR REDUCE is not supported by Strata yet");
    }
    let (vector, at) = match vector_arg(a, 2) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let Some(element) = a.get(at).cloned() else {
        return syntax_error();
    };
    let o = match add_options(&a[at + 1..]) {
        Ok(o) => o,
        Err(r) => return r,
    };
    let key = ctx.key(&a[1]);
    let r = write_set(ctx, &key, move |live| {
        let want = Settings {
            quant: o.quant.unwrap_or_default(),
            dim: vector.len(),
            m: o.m,
            ef_construction: o.ef,
        };
        let set = live.set.get_or_insert_with(|| VectorSet::new(want));
        if o.quant.is_some_and(|q| q != set.settings().quant) {
            return Err(strata_engine::Error::Invalid(
                "asked quantization mismatch with existing vector set".into(),
            ));
        }
        let added = set.add(&element, &vector, o.attrs).map_err(|e| {
            strata_engine::Error::Invalid(match e {
                AddError::Dim { set, got } => {
                    format!("Vector dimension mismatch - got {got} but set has {set}")
                }
                AddError::NotFinite => "invalid vector specification".into(),
            })
        })?;
        live.touch(&element);
        Ok((true, added))
    })
    .await;
    match r {
        Ok(added) => Reply::Integer(added as i64),
        Err(r) => r,
    }
}

/// `VREM key element` → 1 if it was removed (the set goes with its last element).
pub(crate) async fn vrem(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let (key, element) = (ctx.key(&a[1]), a[2].clone());
    let r = write_set(ctx, &key, move |live| {
        let removed = live.set.as_mut().is_some_and(|s| s.remove(&element));
        if removed {
            live.touch(&element);
        }
        Ok((removed, removed))
    })
    .await;
    r.map_or_else(|e| e, |removed| Reply::Integer(removed as i64))
}

/// Runs `f` on the set at `a[1]` and answers what it says (`missing` for no such key).
async fn read(
    ctx: &mut Ctx<'_>,
    a: &[Bytes],
    missing: Reply,
    f: impl FnOnce(&VectorSet) -> Reply + Send + 'static,
) -> Reply {
    let key = ctx.key(&a[1]);
    match read_set(ctx, &key, move |s| s.map(f)).await {
        Ok(Some(r)) => r,
        Ok(None) => missing,
        Err(e) => e,
    }
}

pub(crate) async fn vcard(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    read(
        ctx,
        a,
        Reply::Integer(0),
        |s| Reply::Integer(s.len() as i64),
    )
    .await
}

pub(crate) async fn vdim(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let missing = Reply::err("ERR key does not exist");
    read(ctx, a, missing, |s| Reply::Integer(s.settings().dim as i64)).await
}

pub(crate) async fn vismember(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let element = a[2].clone();
    read(ctx, a, Reply::Integer(0), move |s| {
        Reply::Integer(s.contains(&element) as i64)
    })
    .await
}

pub(crate) async fn vgetattr(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let element = a[2].clone();
    read(ctx, a, Reply::Null, move |s| {
        match s.attrs(&element).flatten() {
            Some(json) => Reply::bulk(Bytes::copy_from_slice(json)),
            None => Reply::Null,
        }
    })
    .await
}

/// `VSETATTR key element json` → 1 if the element exists (`""` removes its attributes).
pub(crate) async fn vsetattr(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let (key, element, json) = (ctx.key(&a[1]), a[2].clone(), a[3].clone());
    let r = write_set(ctx, &key, move |live| {
        let attrs = (!json.is_empty()).then(|| json.to_vec());
        let set = live
            .set
            .as_mut()
            .is_some_and(|s| s.set_attrs(&element, attrs));
        if set {
            live.touch(&element);
        }
        Ok((set, set))
    })
    .await;
    r.map_or_else(|e| e, |set| Reply::Integer(set as i64))
}

/// `VEMB key element [RAW]`: the element's vector at its own scale (approximate when
/// quantized); with `RAW`, its form, its bytes as kept, its norm and (int8) its scale.
pub(crate) async fn vemb(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let raw = match a.get(3).map(|x| lower(x)).as_deref() {
        None => false,
        Some("raw") if a.len() == 4 => true,
        _ => return syntax_error(),
    };
    let element = a[2].clone();
    read(ctx, a, Reply::Null, move |s| {
        let Some(v) = s.vector(&element) else {
            return Reply::Null;
        };
        if !raw {
            return Reply::Array(v.into_iter().map(|x| Reply::Double(x as f64)).collect());
        }
        let rec = s.record(&element).expect("present");
        let r = strata_vector::set::decode_element(&rec).expect("its own record");
        let (bytes, scale) = match &r.vector {
            strata_vector::Stored::F32(x) => {
                (x.iter().flat_map(|f| f.to_le_bytes()).collect(), None)
            }
            strata_vector::Stored::Q8(q, sc) => {
                (q.iter().map(|&b| b as u8).collect(), Some(*sc * 127.0))
            }
            strata_vector::Stored::Bin(w) => (
                w.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>(),
                None,
            ),
        };
        let mut out = vec![
            Reply::Simple(s.settings().quant.name().into()),
            Reply::bulk(bytes),
            Reply::Double(r.norm as f64),
        ];
        out.extend(scale.map(|sc| Reply::Double(sc as f64)));
        Reply::Array(out)
    })
    .await
}

/// `VINFO key`: the set's settings and size, as Redis names them.
pub(crate) async fn vinfo(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    read(ctx, a, Reply::Null, |s| {
        let st = s.settings();
        let int = |n: usize| Reply::Integer(n as i64);
        let attributes = s
            .names()
            .keys()
            .filter(|n| s.attrs(n).flatten().is_some())
            .count();
        Reply::Map(vec![
            (
                Reply::bulk("quant-type"),
                Reply::Simple(st.quant.name().into()),
            ),
            (Reply::bulk("hnsw-m"), int(st.m)),
            (Reply::bulk("vector-dim"), int(st.dim)),
            (Reply::bulk("projection-input-dim"), int(0)),
            (Reply::bulk("size"), int(s.len())),
            (Reply::bulk("max-level"), int(s.graph().max_level())),
            (Reply::bulk("attributes-count"), int(attributes)),
        ])
    })
    .await
}

/// `VRANDMEMBER key [count]`: as `SRANDMEMBER` does for sets.
pub(crate) async fn vrandmember(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let count = match super::typed::random_args(a, None) {
        Ok((c, _)) => c,
        Err(r) => return r,
    };
    let missing = if count.is_some() {
        Reply::Array(vec![])
    } else {
        Reply::Null
    };
    read(ctx, a, missing, move |s| {
        let names: Vec<&[u8]> = s.names().into_keys().collect();
        let pick = super::typed::random_positions(names.len(), count.unwrap_or(1));
        let mut out: Vec<Reply> = pick
            .into_iter()
            .map(|i| Reply::bulk(Bytes::copy_from_slice(names[i])))
            .collect();
        match count {
            Some(_) => Reply::Array(out),
            None => out.pop().unwrap_or(Reply::Null),
        }
    })
    .await
}

/// `VLINKS key element [WITHSCORES]`: the element's neighbours on each layer, from 0 up.
pub(crate) async fn vlinks(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let scores = match a.get(3).map(|x| lower(x)).as_deref() {
        None => false,
        Some("withscores") if a.len() == 4 => true,
        _ => return syntax_error(),
    };
    let element = a[2].clone();
    read(ctx, a, Reply::Null, move |s| {
        let Some(me) = s.names().get(element.as_ref()).copied() else {
            return Reply::Null;
        };
        let g = s.graph();
        let layer = |links: &Vec<u32>| {
            let name = |n: u32| Reply::bulk(Bytes::copy_from_slice(s.name_of(n)));
            if !scores {
                return Reply::Array(links.iter().map(|&n| name(n)).collect());
            }
            let score = |n: u32| (1.0 + g.vector(me).similarity(g.vector(n), g.dim()) as f64) / 2.0;
            Reply::Map(
                links
                    .iter()
                    .map(|&n| (name(n), Reply::Double(score(n))))
                    .collect(),
            )
        };
        Reply::Array(g.links(me).iter().map(layer).collect())
    })
    .await
}

/// What a `VSIM` asks for.
struct SimOptions {
    scores: bool,
    attribs: bool,
    count: usize,
    epsilon: Option<f32>,
    ef: usize,
    filter: Option<Expr>,
    filter_ef: Option<usize>,
    truth: bool,
}

fn sim_options(a: &[Bytes]) -> Result<SimOptions, Reply> {
    let mut o = SimOptions {
        scores: false,
        attribs: false,
        count: COUNT_DEFAULT,
        epsilon: None,
        ef: EF_SEARCH_DEFAULT,
        filter: None,
        filter_ef: None,
        truth: false,
    };
    let mut i = 0;
    while i < a.len() {
        let value = a.get(i + 1);
        // Whether the option takes the next argument as its value.
        let valued = match lower(&a[i]).as_str() {
            "withscores" => {
                o.scores = true;
                false
            }
            "withattribs" => {
                o.attribs = true;
                false
            }
            "truth" => {
                o.truth = true;
                false
            }
            "nothread" => false,
            "count" => {
                o.count = count_arg(a, i + 1, usize::MAX >> 1, "COUNT")?;
                true
            }
            "ef" => {
                o.ef = count_arg(a, i + 1, EF_MAX, "EF")?;
                true
            }
            "filter-ef" => {
                o.filter_ef = Some(count_arg(a, i + 1, usize::MAX >> 1, "FILTER-EF")?);
                true
            }
            "epsilon" => {
                let e = value.and_then(|v| std::str::from_utf8(v).ok()?.parse::<f32>().ok());
                o.epsilon = Some(
                    e.filter(|e| (0.0..=1.0).contains(e))
                        .ok_or_else(|| Reply::err("ERR invalid EPSILON"))?,
                );
                true
            }
            "filter" => {
                let src = value
                    .and_then(|v| std::str::from_utf8(v).ok())
                    .ok_or_else(syntax_error)?;
                let e = strata_vector::filter::parse(src).map_err(|e| {
                    Reply::err(format!("ERR syntax error in FILTER expression: {}", e.0))
                })?;
                o.filter = Some(e);
                true
            }
            _ => return Err(syntax_error()),
        };
        i += 1 + valued as usize;
    }
    Ok(o)
}

/// `VSIM key (ELE element | FP32 blob | VALUES n x..) [WITHSCORES] [WITHATTRIBS] [COUNT n]
/// [EPSILON d] [EF n] [FILTER expr] [FILTER-EF n] [TRUTH] [NOTHREAD]`.
pub(crate) async fn vsim(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let (query, at) = if lower(&a[2]) == "ele" {
        match a.get(3) {
            Some(e) => (Err(e.clone()), 4),
            None => return syntax_error(),
        }
    } else {
        match vector_arg(a, 2) {
            Ok((v, at)) => (Ok(v), at),
            Err(r) => return r,
        }
    };
    let o = match sim_options(&a[at..]) {
        Ok(o) => o,
        Err(r) => return r,
    };
    let resp3 = ctx.conn.proto >= 3;
    read(ctx, a, Reply::Array(vec![]), move |s| {
        let q = match &query {
            Ok(v) if v.len() != s.settings().dim => {
                return Reply::err(format!(
                    "ERR Vector dimension mismatch - got {} but set has {}",
                    v.len(),
                    s.settings().dim
                ))
            }
            Ok(v) => Query::Vector(v),
            Err(name) => Query::Element(name),
        };
        let filter_ef = o.filter_ef.unwrap_or(o.count.saturating_mul(100));
        let filter = o.filter.as_ref().map(|e| (e, filter_ef));
        let found = if o.truth {
            s.similar_exact(q, o.count, filter.map(|f| f.0))
        } else {
            s.similar(q, o.count, o.ef, filter)
        };
        let Some(mut found) = found else {
            return Reply::err("ERR element not found in set");
        };
        if let Some(eps) = o.epsilon {
            found.retain(|f| f.score >= 1.0 - eps);
        }
        sim_reply(found, o.scores, o.attribs, resp3)
    })
    .await
}

/// `VSIM`'s reply: names; with scores or attributes a map of them (RESP2: flat); with
/// both, each name's `[score, attributes]` (RESP2: flat triples).
fn sim_reply(found: Vec<Found<'_>>, scores: bool, attribs: bool, resp3: bool) -> Reply {
    let name = |f: &Found<'_>| Reply::bulk(Bytes::copy_from_slice(f.name));
    let score = |f: &Found<'_>| Reply::Double(f.score as f64);
    let attr = |f: &Found<'_>| {
        f.attrs
            .map_or(Reply::Null, |j| Reply::bulk(Bytes::copy_from_slice(j)))
    };
    match (scores, attribs) {
        (false, false) => Reply::Array(found.iter().map(name).collect()),
        (true, false) => Reply::Map(found.iter().map(|f| (name(f), score(f))).collect()),
        (false, true) => Reply::Map(found.iter().map(|f| (name(f), attr(f))).collect()),
        (true, true) if resp3 => Reply::Map(
            found
                .iter()
                .map(|f| (name(f), Reply::Array(vec![score(f), attr(f)])))
                .collect(),
        ),
        (true, true) => Reply::Array(
            found
                .iter()
                .flat_map(|f| [name(f), score(f), attr(f)])
                .collect(),
        ),
    }
}
