//! One vector set: its elements by name, their attributes and their nodes in the graph,
//! and what the server stores for each element (a record: [`encode_element`]).
//!
//! The set's settings (quantization, dimension, `M`, build `EF`) are fixed by its first
//! `VADD` and kept in every element's record, so the set is rebuilt from its records
//! alone: the graph is built again, element by element, when the set is read back.

use std::collections::{BTreeMap, HashMap};

use crate::filter::Expr;
use crate::hnsw::{Hnsw, NodeId};
use crate::quant::{normalize, Quant, Stored};

/// Record format version.
const RECORD_VERSION: u8 = 1;
/// Largest dimension a set may have.
pub const DIM_MAX: usize = 65_536;

/// A set's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub quant: Quant,
    pub dim: usize,
    pub m: usize,
    pub ef_construction: usize,
}

struct Element {
    name: Vec<u8>,
    attrs: Option<Vec<u8>>,
    /// The vector's length before it was normalized (`VEMB` gives it back at that scale).
    norm: f32,
}

/// A vector set.
pub struct VectorSet {
    settings: Settings,
    graph: Hnsw,
    by_name: HashMap<Vec<u8>, NodeId>,
    elements: Vec<Option<Element>>,
}

/// Why an element cannot be added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddError {
    /// The vector's dimension is not the set's.
    Dim { set: usize, got: usize },
    /// A component is not a finite number.
    NotFinite,
}

/// One answer of [`VectorSet::similar`].
#[derive(Debug, Clone, PartialEq)]
pub struct Found<'a> {
    pub name: &'a [u8],
    /// `(1 + cosine) / 2`, in `[0, 1]`.
    pub score: f32,
    pub attrs: Option<&'a [u8]>,
}

impl VectorSet {
    pub fn new(settings: Settings) -> VectorSet {
        VectorSet {
            graph: Hnsw::new(settings.dim, settings.m, settings.ef_construction),
            settings,
            by_name: HashMap::new(),
            elements: Vec::new(),
        }
    }

    pub fn settings(&self) -> Settings {
        self.settings
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    pub fn contains(&self, name: &[u8]) -> bool {
        self.by_name.contains_key(name)
    }

    /// The graph (for `VINFO` and `VLINKS`).
    pub fn graph(&self) -> &Hnsw {
        &self.graph
    }

    fn element(&self, id: NodeId) -> &Element {
        self.elements[id as usize].as_ref().expect("a live element")
    }

    /// The name of node `id`.
    pub fn name_of(&self, id: NodeId) -> &[u8] {
        &self.element(id).name
    }

    /// Adds element `name` (or replaces its vector and, when given, its attributes).
    /// Returns whether it is new.
    pub fn add(
        &mut self,
        name: &[u8],
        vector: &[f32],
        attrs: Option<Option<Vec<u8>>>,
    ) -> Result<bool, AddError> {
        if vector.len() != self.settings.dim {
            return Err(AddError::Dim {
                set: self.settings.dim,
                got: vector.len(),
            });
        }
        if vector.iter().any(|x| !x.is_finite()) {
            return Err(AddError::NotFinite);
        }
        let (unit, norm) = normalize(vector);
        let stored = Stored::new(self.settings.quant, &unit);
        Ok(self.put(name, stored, norm, attrs))
    }

    /// Puts element `name` in with its vector as the set keeps it; `attrs` as in
    /// [`VectorSet::add`]. Whether it is new.
    fn put(
        &mut self,
        name: &[u8],
        stored: Stored,
        norm: f32,
        attrs: Option<Option<Vec<u8>>>,
    ) -> bool {
        let old = self.by_name.get(name).copied();
        let kept_attrs = old.and_then(|id| self.element(id).attrs.clone());
        if let Some(id) = old {
            self.remove_node(id);
        }
        let id = self.graph.insert(stored);
        let element = Element {
            name: name.to_vec(),
            attrs: attrs.unwrap_or(kept_attrs),
            norm,
        };
        if self.elements.len() <= id as usize {
            self.elements.resize_with(id as usize + 1, || None);
        }
        self.elements[id as usize] = Some(element);
        self.by_name.insert(name.to_vec(), id);
        old.is_none()
    }

    fn remove_node(&mut self, id: NodeId) {
        self.graph.remove(id);
        if let Some(e) = self.elements[id as usize].take() {
            self.by_name.remove(&e.name);
        }
    }

    /// Removes element `name`; whether it was there.
    pub fn remove(&mut self, name: &[u8]) -> bool {
        match self.by_name.get(name).copied() {
            Some(id) => {
                self.remove_node(id);
                true
            }
            None => false,
        }
    }

    /// Element `name`'s vector at its original scale (approximate when quantized).
    pub fn vector(&self, name: &[u8]) -> Option<Vec<f32>> {
        let id = *self.by_name.get(name)?;
        let norm = self.element(id).norm;
        let unit = self.graph.vector(id).to_f32(self.settings.dim);
        Some(unit.into_iter().map(|x| x * norm).collect())
    }

    /// Element `name`'s attributes (`None` inside: it has none).
    pub fn attrs(&self, name: &[u8]) -> Option<Option<&[u8]>> {
        let id = *self.by_name.get(name)?;
        Some(self.element(id).attrs.as_deref())
    }

    /// Sets (or with `None` removes) element `name`'s attributes; whether it exists.
    pub fn set_attrs(&mut self, name: &[u8], attrs: Option<Vec<u8>>) -> bool {
        let Some(&id) = self.by_name.get(name) else {
            return false;
        };
        self.elements[id as usize].as_mut().expect("live").attrs = attrs;
        true
    }

    /// The `count` elements most similar to `query` (a vector of the set's dimension, or
    /// an element's name), best first, looking at `ef` candidates; with `filter`, only the
    /// elements it matches, asking it at most `filter_ef` times. `None` if the element named
    /// is not in the set.
    pub fn similar(
        &self,
        query: Query<'_>,
        count: usize,
        ef: usize,
        filter: Option<(&Expr, usize)>,
    ) -> Option<Vec<Found<'_>>> {
        let q = self.query(query)?;
        let mut keep =
            |id: NodeId| filter.is_some_and(|(e, _)| e.matches(self.element(id).attrs.as_deref()));
        let walk_filter =
            filter.map(|(_, limit)| (&mut keep as &mut dyn FnMut(NodeId) -> bool, limit));
        let found = self.graph.search(&q, count, ef, walk_filter);
        Some(
            found
                .into_iter()
                .map(|(id, sim)| self.found(id, sim))
                .collect(),
        )
    }

    /// [`VectorSet::similar`] by comparing the query with every element (`TRUTH`): the
    /// exact answer, at the cost of the whole set.
    pub fn similar_exact(
        &self,
        query: Query<'_>,
        count: usize,
        filter: Option<&Expr>,
    ) -> Option<Vec<Found<'_>>> {
        let q = self.query(query)?;
        let mut all: Vec<Found<'_>> = self
            .by_name
            .values()
            .filter(|&&id| filter.is_none_or(|e| e.matches(self.element(id).attrs.as_deref())))
            .map(|&id| self.found(id, q.similarity(self.graph.vector(id), self.settings.dim)))
            .collect();
        all.sort_by(|x, y| y.score.total_cmp(&x.score).then(x.name.cmp(y.name)));
        all.truncate(count);
        Some(all)
    }

    fn query(&self, query: Query<'_>) -> Option<Stored> {
        Some(match query {
            Query::Vector(v) => Stored::new(self.settings.quant, &normalize(v).0),
            Query::Element(name) => self.graph.vector(*self.by_name.get(name)?).clone(),
        })
    }

    fn found(&self, id: NodeId, sim: f32) -> Found<'_> {
        let e = self.element(id);
        Found {
            name: &e.name,
            score: ((1.0 + sim) / 2.0).clamp(0.0, 1.0),
            attrs: e.attrs.as_deref(),
        }
    }

    /// Every element by name, in name order (`VRANGE`, and what the server stores).
    pub fn names(&self) -> BTreeMap<&[u8], NodeId> {
        self.by_name
            .iter()
            .map(|(n, &id)| (n.as_slice(), id))
            .collect()
    }

    /// The record the server stores for element `name` ([`encode_element`]).
    pub fn record(&self, name: &[u8]) -> Option<Vec<u8>> {
        let id = *self.by_name.get(name)?;
        let e = self.element(id);
        Some(encode_element(
            &self.settings,
            self.graph.vector(id),
            e.norm,
            e.attrs.as_deref(),
        ))
    }

    /// Puts element `name` back from its stored `record` (as the set is read back).
    pub fn restore(&mut self, name: &[u8], record: &[u8]) -> Option<()> {
        let r = decode_element(record)?;
        if r.settings != self.settings {
            return None;
        }
        self.put(name, r.vector, r.norm, Some(r.attrs.map(<[u8]>::to_vec)));
        Some(())
    }
}

/// What a search starts from.
#[derive(Debug, Clone, Copy)]
pub enum Query<'a> {
    Vector(&'a [f32]),
    Element(&'a [u8]),
}

/// An element's record, read back.
pub struct ElementRecord<'a> {
    pub settings: Settings,
    pub vector: Stored,
    pub norm: f32,
    pub attrs: Option<&'a [u8]>,
}

/// An element's stored form: `version u8 | quant u8 | m u16 | ef u32 | dim u32 | norm f32 |
/// attrs_len u32 (u32::MAX: none) | attrs | vector` (little-endian; the vector as the
/// set keeps it: `f32`s, or `i8`s then the scale as `f32`, or 64-bit words of sign bits).
pub fn encode_element(s: &Settings, v: &Stored, norm: f32, attrs: Option<&[u8]>) -> Vec<u8> {
    let mut out = Vec::with_capacity(24 + attrs.map_or(0, |a| a.len()) + v.bytes());
    out.push(RECORD_VERSION);
    out.push(match s.quant {
        Quant::NoQuant => 0,
        Quant::Q8 => 1,
        Quant::Bin => 2,
    });
    out.extend_from_slice(&(s.m as u16).to_le_bytes());
    out.extend_from_slice(&(s.ef_construction as u32).to_le_bytes());
    out.extend_from_slice(&(s.dim as u32).to_le_bytes());
    out.extend_from_slice(&norm.to_le_bytes());
    out.extend_from_slice(&attrs.map_or(u32::MAX, |a| a.len() as u32).to_le_bytes());
    out.extend_from_slice(attrs.unwrap_or_default());
    match v {
        Stored::F32(x) => x
            .iter()
            .for_each(|f| out.extend_from_slice(&f.to_le_bytes())),
        Stored::Q8(q, scale) => {
            out.extend(q.iter().map(|&b| b as u8));
            out.extend_from_slice(&scale.to_le_bytes());
        }
        Stored::Bin(words) => words
            .iter()
            .for_each(|w| out.extend_from_slice(&w.to_le_bytes())),
    }
    out
}

/// Reads an element's record; `None` if it is not one.
pub fn decode_element(b: &[u8]) -> Option<ElementRecord<'_>> {
    let u32_at = |at: usize| Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?));
    if *b.first()? != RECORD_VERSION {
        return None;
    }
    let quant = match *b.get(1)? {
        0 => Quant::NoQuant,
        1 => Quant::Q8,
        2 => Quant::Bin,
        _ => return None,
    };
    let m = u16::from_le_bytes(b.get(2..4)?.try_into().ok()?) as usize;
    let (ef, dim) = (u32_at(4)? as usize, u32_at(8)? as usize);
    let norm = f32::from_bits(u32_at(12)?);
    let attrs_len = u32_at(16)?;
    let (attrs, at) = match attrs_len {
        u32::MAX => (None, 20),
        n => (Some(b.get(20..20 + n as usize)?), 20 + n as usize),
    };
    let v = b.get(at..)?;
    if dim == 0 || dim > DIM_MAX || v.len() != quant.bytes(dim) {
        return None;
    }
    let vector = match quant {
        Quant::NoQuant => Stored::F32(
            v.chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        ),
        Quant::Q8 => Stored::Q8(
            v[..dim].iter().map(|&x| x as i8).collect(),
            f32::from_le_bytes(v[dim..].try_into().ok()?),
        ),
        Quant::Bin => Stored::Bin(
            v.chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        ),
    };
    let settings = Settings {
        quant,
        dim,
        m,
        ef_construction: ef,
    };
    Some(ElementRecord {
        settings,
        vector,
        norm,
        attrs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(quant: Quant) -> VectorSet {
        VectorSet::new(Settings {
            quant,
            dim: 3,
            m: 16,
            ef_construction: 200,
        })
    }

    #[test]
    fn elements_are_added_replaced_found_and_removed() {
        let mut s = set(Quant::NoQuant);
        assert_eq!(
            s.add(b"a", &[1.0, 0.0, 0.0], Some(Some(br#"{"y":1}"#.to_vec()))),
            Ok(true)
        );
        assert_eq!(s.add(b"b", &[0.0, 2.0, 0.0], None), Ok(true));
        assert_eq!(s.add(b"c", &[0.9, 0.1, 0.0], None), Ok(true));
        assert_eq!(s.add(b"a", &[2.0, 0.0, 0.0], None), Ok(false), "replaced");
        assert_eq!(
            s.attrs(b"a"),
            Some(Some(&br#"{"y":1}"#[..])),
            "kept across a replace"
        );
        assert_eq!(
            s.add(b"x", &[1.0, 0.0], None),
            Err(AddError::Dim { set: 3, got: 2 })
        );
        assert_eq!(
            s.add(b"x", &[f32::NAN, 0.0, 0.0], None),
            Err(AddError::NotFinite)
        );
        let found = s
            .similar(Query::Vector(&[1.0, 0.0, 0.0]), 2, 10, None)
            .unwrap();
        assert_eq!(
            found.iter().map(|f| f.name).collect::<Vec<_>>(),
            vec![&b"a"[..], &b"c"[..]]
        );
        assert!((found[0].score - 1.0).abs() < 1e-6);
        let f = crate::filter::parse(".y == 1").unwrap();
        let only = s
            .similar(Query::Element(b"b"), 3, 10, Some((&f, 100)))
            .unwrap();
        assert_eq!(
            only.iter().map(|f| f.name).collect::<Vec<_>>(),
            vec![&b"a"[..]]
        );
        assert!(s.similar(Query::Element(b"nope"), 3, 10, None).is_none());
        let exact = s
            .similar_exact(Query::Vector(&[1.0, 0.0, 0.0]), 2, None)
            .unwrap();
        assert_eq!(exact, found);
        let only_a = s.similar_exact(Query::Element(b"b"), 3, Some(&f)).unwrap();
        assert_eq!(only_a.len(), 1);
        assert_eq!(
            s.vector(b"b").unwrap(),
            vec![0.0, 2.0, 0.0],
            "back at its own scale"
        );
        assert!(s.remove(b"c") && !s.remove(b"c"));
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn records_rebuild_the_set_in_every_form() {
        for q in [Quant::NoQuant, Quant::Q8, Quant::Bin] {
            let mut s = set(q);
            s.add(b"a", &[3.0, 4.0, 0.0], Some(Some(b"{}".to_vec())))
                .unwrap();
            s.add(b"b", &[0.0, -1.0, 1.0], None).unwrap();
            let mut back = set(q);
            for (name, _) in s.names() {
                back.restore(name, &s.record(name).unwrap()).unwrap();
            }
            assert_eq!(back.len(), 2);
            assert_eq!(back.attrs(b"a"), Some(Some(&b"{}"[..])));
            assert_eq!(back.attrs(b"b"), Some(None));
            assert_eq!(
                back.record(b"a"),
                s.record(b"a"),
                "{q:?}: records read back the same"
            );
        }
        let rec = set(Quant::Q8).record(b"none");
        assert!(rec.is_none());
        assert!(decode_element(b"\x09junk").is_none());
    }
}
