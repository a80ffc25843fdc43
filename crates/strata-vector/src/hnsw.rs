//! A hierarchical navigable small-world graph (Malkov and Yashunin) over one set's vectors,
//! with two rules of Redis's vector sets: links are always both ways, so removing a node
//! finds every node that points at it and relinks its neighbours (no tombstones); and a
//! filtered search walks the whole graph but keeps only matching nodes, giving up after
//! `filter_ef` of them were checked.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use crate::quant::Stored;

/// The highest layer a node may reach.
const LEVEL_MAX: usize = 16;

/// A node's id: its place in the graph, reused after removal.
pub type NodeId = u32;

/// A similarity and a node, ordered by similarity (then id, so ties are total).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Near(f32, NodeId);

impl Eq for Near {}

impl Ord for Near {
    fn cmp(&self, o: &Self) -> Ordering {
        self.0.total_cmp(&o.0).then(self.1.cmp(&o.1))
    }
}

impl PartialOrd for Near {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

struct Node {
    vector: Stored,
    /// Links per layer, from 0 up to the node's level.
    links: Vec<Vec<NodeId>>,
}

/// The graph of one vector set.
pub struct Hnsw {
    dim: usize,
    /// Links per node above layer 0 (layer 0 has twice as many).
    m: usize,
    ef_construction: usize,
    nodes: Vec<Option<Node>>,
    free: Vec<NodeId>,
    entry: Option<NodeId>,
    len: usize,
    seed: u64,
}

impl Hnsw {
    /// An empty graph of vectors of `dim` dimensions with `m` links per node per layer
    /// (`2m` on layer 0), built looking at `ef_construction` candidates.
    pub fn new(dim: usize, m: usize, ef_construction: usize) -> Hnsw {
        Hnsw {
            dim,
            m: m.max(2),
            ef_construction: ef_construction.max(1),
            nodes: Vec::new(),
            free: Vec::new(),
            entry: None,
            len: 0,
            seed: 0x9e37_79b9_7f4a_7c15,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    pub fn m(&self) -> usize {
        self.m
    }

    /// The highest layer of the graph (0 for an empty one).
    pub fn max_level(&self) -> usize {
        self.entry.map_or(0, |e| self.node(e).links.len() - 1)
    }

    fn node(&self, id: NodeId) -> &Node {
        self.nodes[id as usize].as_ref().expect("a live node")
    }

    fn node_mut(&mut self, id: NodeId) -> &mut Node {
        self.nodes[id as usize].as_mut().expect("a live node")
    }

    /// The vector of node `id`.
    pub fn vector(&self, id: NodeId) -> &Stored {
        &self.node(id).vector
    }

    /// The links of node `id` on each of its layers, from layer 0 up.
    pub fn links(&self, id: NodeId) -> &[Vec<NodeId>] {
        &self.node(id).links
    }

    fn cap(&self, layer: usize) -> usize {
        if layer == 0 {
            self.m * 2
        } else {
            self.m
        }
    }

    fn sim(&self, q: &Stored, id: NodeId) -> f32 {
        q.similarity(&self.node(id).vector, self.dim)
    }

    /// A random level, each one up `1/m` as likely as the one below.
    fn random_level(&mut self) -> usize {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let u = ((self.seed >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        ((-u.ln() / (self.m as f64).ln()) as usize).min(LEVEL_MAX)
    }

    /// Adds `vector`; returns its node.
    pub fn insert(&mut self, vector: Stored) -> NodeId {
        let level = self.random_level();
        let node = Node {
            vector,
            links: vec![Vec::new(); level + 1],
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.nodes[id as usize] = Some(node);
                id
            }
            None => {
                self.nodes.push(Some(node));
                (self.nodes.len() - 1) as NodeId
            }
        };
        self.len += 1;
        let Some(entry) = self.entry else {
            self.entry = Some(id);
            return id;
        };
        let top = self.max_level();
        let q = self.node(id).vector.clone();
        let mut ep = Near(self.sim(&q, entry), entry);
        for layer in (level + 1..=top).rev() {
            ep = self.greedy(&q, ep, layer);
        }
        for layer in (0..=level.min(top)).rev() {
            let found = self.search_layer(&q, &[ep], self.ef_construction, layer, None);
            ep = found[0];
            let chosen = self.select(&found, self.cap(layer), Some(id));
            for &n in &chosen {
                self.link(id, n, layer);
            }
        }
        if level > top {
            self.entry = Some(id);
        }
        id
    }

    /// Links `a` and `b` on `layer` both ways; a node left with too many links keeps the
    /// best spread of them (and the ones it drops drop it).
    fn link(&mut self, a: NodeId, b: NodeId, layer: usize) {
        for (x, y) in [(a, b), (b, a)] {
            let links = &mut self.node_mut(x).links[layer];
            if !links.contains(&y) {
                links.push(y);
            }
        }
        for x in [a, b] {
            if self.node(x).links[layer].len() > self.cap(layer) {
                self.prune(x, layer);
            }
        }
    }

    /// Cuts `x`'s links on `layer` down to its cap by the selection heuristic.
    fn prune(&mut self, x: NodeId, layer: usize) {
        let q = self.node(x).vector.clone();
        let mut near: Vec<Near> = self.node(x).links[layer]
            .iter()
            .map(|&n| Near(self.sim(&q, n), n))
            .collect();
        near.sort_by(|a, b| b.cmp(a));
        let keep = self.select(&near, self.cap(layer), None);
        for Near(_, n) in near {
            if !keep.contains(&n) {
                self.node_mut(n).links[layer].retain(|&y| y != x);
            }
        }
        self.node_mut(x).links[layer] = keep;
    }

    /// Up to `cap` of `near` (best first): each one kept is nearer the query than any
    /// kept before it (the links spread out), then the best of the rest until `cap`.
    fn select(&self, near: &[Near], cap: usize, skip: Option<NodeId>) -> Vec<NodeId> {
        let mut kept: Vec<NodeId> = Vec::with_capacity(cap);
        let mut rest = Vec::new();
        for &Near(s, c) in near.iter().filter(|n| Some(n.1) != skip) {
            if kept.len() == cap {
                break;
            }
            let v = &self.node(c).vector;
            if kept
                .iter()
                .all(|&k| v.similarity(&self.node(k).vector, self.dim) < s)
            {
                kept.push(c);
            } else {
                rest.push(c);
            }
        }
        kept.extend(rest.into_iter().take(cap - kept.len()));
        kept
    }

    /// The nearest node to `q` on `layer`, walking from `ep` while a link is nearer.
    fn greedy(&self, q: &Stored, mut ep: Near, layer: usize) -> Near {
        loop {
            let best = self.node(ep.1).links[layer]
                .iter()
                .map(|&n| Near(self.sim(q, n), n))
                .max();
            match best {
                Some(b) if b > ep => ep = b,
                _ => return ep,
            }
        }
    }

    /// The `ef` nodes nearest `q` found on `layer` from `entry`, best first. With a filter,
    /// only nodes it keeps are found, and the walk stops after it was asked `limit` times.
    fn search_layer(
        &self,
        q: &Stored,
        entry: &[Near],
        ef: usize,
        layer: usize,
        filter: Option<(&mut dyn FnMut(NodeId) -> bool, usize)>,
    ) -> Vec<Near> {
        let mut seen = Seen(vec![0u64; self.nodes.len().div_ceil(64)]);
        let (mut filter, limit) = match filter {
            Some((f, limit)) => (Some(f), limit),
            None => (None, usize::MAX),
        };
        let mut asked = 0usize;
        let mut todo: BinaryHeap<Near> = BinaryHeap::new();
        let mut found: BinaryHeap<Reverse<Near>> = BinaryHeap::new();
        for &e in entry {
            seen.mark(e.1);
            todo.push(e);
            if ask(&mut filter, &mut asked, e.1) {
                found.push(Reverse(e));
            }
        }
        while let Some(c) = todo.pop() {
            let worst = found.peek().map(|r| r.0 .0);
            if found.len() >= ef && worst.is_some_and(|w| c.0 < w) {
                break;
            }
            if asked >= limit {
                break;
            }
            for &n in &self.node(c.1).links[layer] {
                if !seen.mark(n) {
                    continue;
                }
                let near = Near(self.sim(q, n), n);
                let better = found.len() < ef || found.peek().is_some_and(|w| near > w.0);
                if better || filter.is_some() {
                    todo.push(near);
                }
                if better && ask(&mut filter, &mut asked, n) {
                    found.push(Reverse(near));
                    if found.len() > ef {
                        found.pop();
                    }
                }
            }
        }
        let mut out: Vec<Near> = found.into_iter().map(|r| r.0).collect();
        out.sort_by(|a, b| b.cmp(a));
        out
    }

    /// The `count` nodes most similar to `q` (a vector of this graph's form), best first,
    /// with their similarity, looking at `ef` candidates. With `filter`, only nodes it keeps,
    /// asking it at most `filter_ef` times.
    pub fn search(
        &self,
        q: &Stored,
        count: usize,
        ef: usize,
        filter: Option<(&mut dyn FnMut(NodeId) -> bool, usize)>,
    ) -> Vec<(NodeId, f32)> {
        let Some(entry) = self.entry else {
            return Vec::new();
        };
        let mut ep = Near(self.sim(q, entry), entry);
        for layer in (1..=self.max_level()).rev() {
            ep = self.greedy(q, ep, layer);
        }
        let found = self.search_layer(q, &[ep], ef.max(count), 0, filter);
        found
            .into_iter()
            .take(count)
            .map(|Near(s, n)| (n, s))
            .collect()
    }

    /// Removes node `id`: every node linked to it drops the link, and its neighbours on
    /// each layer link among themselves where they have room, nearest first.
    pub fn remove(&mut self, id: NodeId) {
        let links = std::mem::take(&mut self.node_mut(id).links);
        for (layer, nbrs) in links.iter().enumerate() {
            for &n in nbrs {
                self.node_mut(n).links[layer].retain(|&y| y != id);
            }
            for &n in nbrs {
                self.relink(n, nbrs, layer);
            }
        }
        self.nodes[id as usize] = None;
        self.free.push(id);
        self.len -= 1;
        if self.entry == Some(id) {
            self.entry = self.highest_node(&links);
        }
    }

    /// Links `n` on `layer` to the nearest of `others` while both have room.
    fn relink(&mut self, n: NodeId, others: &[NodeId], layer: usize) {
        let q = self.node(n).vector.clone();
        let mut near: Vec<Near> = others
            .iter()
            .filter(|&&o| o != n && !self.node(n).links[layer].contains(&o))
            .map(|&o| Near(self.sim(&q, o), o))
            .collect();
        near.sort_by(|a, b| b.cmp(a));
        for Near(_, o) in near {
            if self.node(n).links[layer].len() >= self.cap(layer) {
                break;
            }
            if self.node(o).links[layer].len() < self.cap(layer) {
                self.node_mut(n).links[layer].push(o);
                self.node_mut(o).links[layer].push(n);
            }
        }
    }

    /// The new entry after removing the entry whose links were `links`: its highest
    /// neighbour if that one reaches the removed node's level (it is then as high as any
    /// node left), else the highest node of all (a scan, when it stood alone that high).
    fn highest_node(&self, links: &[Vec<NodeId>]) -> Option<NodeId> {
        let level = |id: &NodeId| self.node(*id).links.len();
        match links.iter().flatten().copied().max_by_key(level) {
            Some(n) if level(&n) == links.len() => Some(n),
            _ => (0..self.nodes.len() as NodeId)
                .filter(|&i| self.nodes[i as usize].is_some())
                .max_by_key(level),
        }
    }

    /// About the bytes the graph holds (vectors and links).
    pub fn bytes(&self) -> usize {
        self.nodes
            .iter()
            .flatten()
            .map(|n| {
                48 + n.vector.bytes() + n.links.iter().map(|l| 24 + l.len() * 4).sum::<usize>()
            })
            .sum()
    }
}

/// The nodes a walk has seen, a bit each.
struct Seen(Vec<u64>);

impl Seen {
    /// Marks `id` seen; whether it was not before.
    fn mark(&mut self, id: NodeId) -> bool {
        let (w, b) = (id as usize / 64, id % 64);
        let new = self.0[w] >> b & 1 == 0;
        self.0[w] |= 1 << b;
        new
    }
}

/// Whether `filter` keeps node `id` (no filter keeps all), counting each question.
fn ask(filter: &mut Option<&mut dyn FnMut(NodeId) -> bool>, asked: &mut usize, id: NodeId) -> bool {
    match filter {
        None => true,
        Some(f) => {
            *asked += 1;
            f(id)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{dot, normalize, Quant};

    /// `n` unit vectors of `dim` dimensions around `centres` clusters, from `seed`.
    pub(crate) fn clustered(n: usize, dim: usize, centres: usize, seed: u64) -> Vec<Vec<f32>> {
        let mut x = seed | 1;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 11) as f32 / (1u64 << 53) as f32 * 2.0 - 1.0
        };
        let cs: Vec<Vec<f32>> = (0..centres)
            .map(|_| (0..dim).map(|_| rnd()).collect())
            .collect();
        (0..n)
            .map(|i| {
                let c = &cs[i % centres];
                normalize(&c.iter().map(|v| v + 0.3 * rnd()).collect::<Vec<_>>()).0
            })
            .collect()
    }

    fn recall(q: Quant, m: usize) -> f64 {
        let data = clustered(3000, 32, 20, 7);
        let mut g = Hnsw::new(32, m, 200);
        for v in &data {
            g.insert(Stored::new(q, v));
        }
        let mut hits = 0;
        for qv in data.iter().step_by(60) {
            let mut exact: Vec<(usize, f32)> = data
                .iter()
                .enumerate()
                .map(|(i, v)| (i, dot(qv, v)))
                .collect();
            exact.sort_by(|a, b| b.1.total_cmp(&a.1));
            let truth: Vec<usize> = exact.iter().take(10).map(|e| e.0).collect();
            let got = g.search(&Stored::new(q, qv), 10, 100, None);
            hits += got
                .iter()
                .filter(|(n, _)| truth.contains(&(*n as usize)))
                .count();
        }
        hits as f64 / (50.0 * 10.0)
    }

    #[test]
    fn recall_at_10_is_high_for_floats_and_8_bit_vectors() {
        assert!(recall(Quant::NoQuant, 16) >= 0.95);
        assert!(recall(Quant::Q8, 16) >= 0.9);
    }

    #[test]
    fn removal_leaves_every_link_both_ways_and_the_rest_findable() {
        let data = clustered(1500, 16, 10, 3);
        let mut g = Hnsw::new(16, 8, 100);
        let ids: Vec<NodeId> = data
            .iter()
            .map(|v| g.insert(Stored::new(Quant::NoQuant, v)))
            .collect();
        for id in ids.iter().step_by(2) {
            g.remove(*id);
        }
        assert_eq!(g.len(), 750);
        for (i, v) in data.iter().enumerate().skip(1).step_by(2) {
            let id = ids[i];
            for (layer, links) in g.links(id).iter().enumerate() {
                for &n in links {
                    assert!(g.links(n)[layer].contains(&id), "a link one way only");
                }
            }
            let got = g.search(&Stored::new(Quant::NoQuant, v), 1, 50, None);
            assert_eq!(got[0].0, id, "a node left is its own nearest");
        }
        // Removed places are taken again.
        let again = g.insert(Stored::new(Quant::NoQuant, &data[0]));
        assert!(ids.iter().step_by(2).any(|&r| r == again));
    }

    #[test]
    fn a_filtered_search_finds_only_what_the_filter_keeps() {
        let data = clustered(2000, 16, 10, 5);
        let mut g = Hnsw::new(16, 16, 200);
        for v in &data {
            g.insert(Stored::new(Quant::NoQuant, v));
        }
        let mut keep = |id: NodeId| id.is_multiple_of(100);
        let got = g.search(
            &Stored::new(Quant::NoQuant, &data[5]),
            10,
            100,
            Some((&mut keep, 4000)),
        );
        assert_eq!(got.len(), 10);
        assert!(got.iter().all(|(n, _)| n.is_multiple_of(100)));
        let mut none = |_: NodeId| false;
        let got = g.search(
            &Stored::new(Quant::NoQuant, &data[5]),
            10,
            100,
            Some((&mut none, 50)),
        );
        assert!(got.is_empty());
    }
}
