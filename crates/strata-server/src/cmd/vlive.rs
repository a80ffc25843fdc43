//! A vector set as the engine keeps it live ([`strata_engine::LiveValue`]): the set and its
//! graph (`strata_vector`), stored as a hash's fields are (each element's record under its
//! name, `docs/formats.md`), and the names changed since it was last stored, so a fold of a
//! large set writes the elements that changed alone (a hash delta). Reading a set back
//! builds its graph again, element by element.

use std::collections::HashSet;

use bytes::Bytes;
use strata_engine::{Key, Kind};
use strata_format::hash::{decode_hash, encode_hash, Field};
use strata_resp::Reply;
use strata_vector::VectorSet;

use super::ctx::{engine_error, Ctx};
use super::typed::written;

/// The live value: the set (`None` before its first element) and what changed.
pub(crate) struct LiveSet {
    pub(crate) set: Option<VectorSet>,
    changed: HashSet<Vec<u8>>,
}

fn corrupt(what: &str) -> strata_engine::Error {
    strata_engine::Error::Data(format!("vectorset value: {what}"))
}

impl LiveSet {
    fn decode(value: Option<&Bytes>) -> strata_engine::Result<LiveSet> {
        let mut live = LiveSet {
            set: None,
            changed: HashSet::new(),
        };
        let Some(v) = value else {
            return Ok(live);
        };
        let fields = decode_hash(v).map_err(|e| corrupt(&e.to_string()))?;
        for f in fields {
            let set = match &mut live.set {
                Some(s) => s,
                None => {
                    let r = strata_vector::set::decode_element(f.value)
                        .ok_or_else(|| corrupt("a bad element record"))?;
                    live.set.insert(VectorSet::new(r.settings))
                }
            };
            set.restore(f.name, f.value)
                .ok_or_else(|| corrupt("an element record of other settings"))?;
        }
        Ok(live)
    }

    /// Notes element `name` changed (added, replaced, removed, attributes set).
    pub(crate) fn touch(&mut self, name: &[u8]) {
        self.changed.insert(name.to_vec());
    }

    /// The fields of `names` that are in the set, as a hash's value.
    fn fields<'a>(&self, names: impl Iterator<Item = &'a [u8]>) -> Vec<u8> {
        let Some(set) = &self.set else {
            return encode_hash(&[]);
        };
        let records: Vec<(&[u8], Vec<u8>)> = names
            .filter_map(|n| set.record(n).map(|r| (n, r)))
            .collect();
        let fields: Vec<Field<'_>> = records
            .iter()
            .map(|(name, value)| Field {
                name,
                value,
                expire_ms: 0,
            })
            .collect();
        encode_hash(&fields)
    }
}

impl strata_engine::LiveValue for LiveSet {
    fn encode(&mut self) -> Bytes {
        self.changed.clear();
        let names: Vec<&[u8]> = self
            .set
            .as_ref()
            .map(|s| s.names().into_keys().collect())
            .unwrap_or_default();
        Bytes::from(self.fields(names.into_iter()))
    }

    fn delta(&mut self) -> Option<Vec<u8>> {
        let changed = std::mem::take(&mut self.changed);
        let set = self.set.as_ref()?;
        let (kept, gone): (Vec<&[u8]>, Vec<&[u8]>) = changed
            .iter()
            .map(Vec::as_slice)
            .partition(|n| set.contains(n));
        let puts = self.fields(kept.into_iter());
        Some(strata_format::delta::encode_delta(&puts, &gone))
    }

    fn bytes(&self) -> usize {
        self.set
            .as_ref()
            .map_or(64, |s| s.graph().bytes() + s.len() * 48)
    }

    fn is_empty(&self) -> bool {
        self.set.as_ref().is_none_or(VectorSet::is_empty)
    }

    fn items(&self) -> Option<usize> {
        Some(self.set.as_ref().map_or(0, VectorSet::len))
    }
}

fn downcast(live: &mut dyn strata_engine::LiveValue) -> &mut LiveSet {
    let any: &mut dyn std::any::Any = live;
    any.downcast_mut::<LiveSet>()
        .expect("a live vector set is a LiveSet")
}

/// Changes the vector set at `key` (made when absent): `f` says whether it changed it,
/// and answers. A set left empty is deleted.
pub(crate) async fn write_set<R: Send + 'static>(
    ctx: &mut Ctx<'_>,
    key: &Key,
    f: impl FnOnce(&mut LiveSet) -> strata_engine::Result<(bool, R)> + Send,
) -> Result<R, Reply> {
    let r = ctx
        .shared
        .engine
        .update_live(
            key,
            Kind::VectorSet,
            |v| Ok(Box::new(LiveSet::decode(v)?)),
            move |live| f(downcast(live)).map(|(c, out)| (c, (c, out))),
        )
        .await;
    written(ctx, key, Kind::VectorSet, r)
}

/// Reads the vector set at `key` (`None`: no such key) in place. The set is made live if
/// it was not (its graph built), for the reads after.
pub(crate) async fn read_set<R: Send + 'static>(
    ctx: &mut Ctx<'_>,
    key: &Key,
    f: impl FnOnce(Option<&VectorSet>) -> R + Send,
) -> Result<R, Reply> {
    let engine = &ctx.shared.engine;
    engine.note_access(ctx.conn.id, key);
    let mut f = Some(f);
    let live = engine.read_live(
        key,
        Kind::VectorSet,
        |v| Ok(Box::new(LiveSet::decode(v)?)),
        |live| (f.take().expect("once"))(downcast(live).set.as_ref()),
    );
    match live {
        Ok(Some(r)) => return Ok(r),
        Ok(None) => {}
        Err(e) => return Err(engine_error(&e)),
    }
    let f = f.take().expect("not run yet");
    write_set(ctx, key, move |live| Ok((false, f(live.set.as_ref())))).await
}
