//! The slot map: which node serves each of Redis Cluster's 16384 slots, and where each node
//! listens. Pure data and the controller's arithmetic on it (even splits, handing a lost
//! node's slots to the live ones); stored in etcd as JSON, one key per cluster.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use strata_format::keys::SLOT_COUNT;

use crate::{Error, Result};

/// A node as clients reach it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAddr {
    pub host: String,
    pub port: u16,
}

impl NodeAddr {
    /// `host:port`, as `-MOVED` and `CLUSTER SLOTS` name it.
    pub fn endpoint(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// A node's slots, in the map's stored form: `[first, last, node id]`, both ends included.
type StoredRange = (u16, u16, String);

/// The map as etcd holds it.
#[derive(Serialize, Deserialize)]
struct Stored {
    epoch: u64,
    nodes: BTreeMap<String, NodeAddr>,
    ranges: Vec<StoredRange>,
    /// Slots being moved: `[first, last, id of the node they move to]`.
    #[serde(default)]
    moving: Vec<StoredRange>,
    /// Nodes the cluster lost whose slots' new owners adopt their bucket logs.
    #[serde(default)]
    lost: Vec<LostNode>,
    /// Slots their owners adopt: `[first, last, id of the lost node]`.
    #[serde(default)]
    adopting: Vec<StoredRange>,
    /// Of those, the slots whose owners keep their own keys unless they had handed them
    /// over to the lost node: `[first, last]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    kept: Vec<(u16, u16)>,
}

/// A node the cluster lost: its writer epochs, oldest first, each with the number its
/// bucket log was fenced at, so no write of it lands after what its slots' new owners read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostNode {
    pub id: String,
    pub epochs: Vec<(u64, u64)>,
}

/// No node serves the slot.
const UNASSIGNED: u16 = u16::MAX;

/// Which node serves each slot, and the addresses of the nodes the map names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotMap {
    /// Raised by every change; `CLUSTER NODES` shows it as the config epoch.
    pub epoch: u64,
    /// Node ids, in order; `owner` indexes this.
    ids: Vec<String>,
    addrs: Vec<NodeAddr>,
    /// Per slot, the index of its node in `ids`, or [`UNASSIGNED`].
    owner: Vec<u16>,
    /// Per slot, the index of the node it is moving to, or [`UNASSIGNED`].
    target: Vec<u16>,
    /// Lost nodes whose logs slots are adopted from.
    lost: Vec<LostNode>,
    /// Per slot, the index in `lost` of the node its owner adopts it from, or
    /// [`UNASSIGNED`]: until its owner reports it adopted, the slot answers `-TRYAGAIN`.
    adopt: Vec<u16>,
    /// Per slot adopted, whether its owner was moving it to the lost node: it keeps its
    /// own keys unless it had handed the slot over.
    kept: Vec<bool>,
}

impl Default for SlotMap {
    fn default() -> Self {
        SlotMap {
            epoch: 0,
            ids: Vec::new(),
            addrs: Vec::new(),
            owner: vec![UNASSIGNED; SLOT_COUNT as usize],
            target: vec![UNASSIGNED; SLOT_COUNT as usize],
            lost: Vec::new(),
            adopt: vec![UNASSIGNED; SLOT_COUNT as usize],
            kept: vec![false; SLOT_COUNT as usize],
        }
    }
}

/// Slots `first..=last` moving from node `from` to node `to` (indexes in the map).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    pub first: u16,
    pub last: u16,
    pub from: usize,
    pub to: usize,
}

/// One run of consecutive slots served by one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotRange {
    pub first: u16,
    pub last: u16,
    pub node: usize,
}

impl SlotMap {
    /// A map that splits the slots evenly over `nodes` (sorted by id), in contiguous
    /// ranges, as `redis-cli --cluster create` does.
    pub fn even(epoch: u64, nodes: &BTreeMap<String, NodeAddr>) -> SlotMap {
        let mut m = SlotMap {
            epoch,
            ..SlotMap::default()
        };
        for (id, addr) in nodes {
            m.ids.push(id.clone());
            m.addrs.push(addr.clone());
        }
        let n = m.ids.len();
        if n == 0 {
            return m;
        }
        // As redis-cli: node i ends at round((i + 1) × 16384 / n − 1).
        let per = SLOT_COUNT as f64 / n as f64;
        let mut first = 0usize;
        for i in 0..n {
            let last = if i + 1 == n {
                SLOT_COUNT as usize - 1
            } else {
                ((i + 1) as f64 * per - 1.0).round() as usize
            };
            for slot in first..=last {
                m.owner[slot] = i as u16;
            }
            first = last + 1;
        }
        m
    }

    pub fn decode(b: &[u8]) -> Result<SlotMap> {
        let s: Stored = serde_json::from_slice(b)
            .map_err(|e| Error::Corrupt(format!("slot map is not valid JSON: {e}")))?;
        let mut m = SlotMap {
            epoch: s.epoch,
            ..SlotMap::default()
        };
        for (id, addr) in s.nodes {
            m.ids.push(id);
            m.addrs.push(addr);
        }
        for (first, last, id) in s.ranges {
            let Some(i) = m.ids.iter().position(|x| *x == id) else {
                return Err(Error::Corrupt(format!("slot map names unknown node {id}")));
            };
            if first > last || last >= SLOT_COUNT {
                return Err(Error::Corrupt(format!("slot map has range {first}-{last}")));
            }
            for slot in first..=last {
                m.owner[slot as usize] = i as u16;
            }
        }
        for (first, last, id) in s.moving {
            let Some(i) = m.ids.iter().position(|x| *x == id) else {
                return Err(Error::Corrupt(format!(
                    "slot map moves slots to unknown node {id}"
                )));
            };
            if first > last || last >= SLOT_COUNT {
                return Err(Error::Corrupt(format!(
                    "slot map moves range {first}-{last}"
                )));
            }
            for slot in first..=last {
                m.target[slot as usize] = i as u16;
            }
        }
        m.lost = s.lost;
        for (first, last, id) in s.adopting {
            let Some(i) = m.lost.iter().position(|n| n.id == id) else {
                return Err(Error::Corrupt(format!(
                    "slot map adopts from unknown node {id}"
                )));
            };
            if first > last || last >= SLOT_COUNT {
                return Err(Error::Corrupt(format!(
                    "slot map adopts range {first}-{last}"
                )));
            }
            for slot in first..=last {
                m.adopt[slot as usize] = i as u16;
            }
        }
        for (first, last) in s.kept {
            for slot in first..=last.min(SLOT_COUNT - 1) {
                m.kept[slot as usize] = m.adopt[slot as usize] != UNASSIGNED;
            }
        }
        Ok(m)
    }

    pub fn encode(&self) -> Vec<u8> {
        let s = Stored {
            epoch: self.epoch,
            nodes: self
                .ids
                .iter()
                .cloned()
                .zip(self.addrs.iter().cloned())
                .collect(),
            ranges: self
                .ranges()
                .into_iter()
                .map(|r| (r.first, r.last, self.ids[r.node].clone()))
                .collect(),
            moving: self
                .moves()
                .into_iter()
                .map(|m| (m.first, m.last, self.ids[m.to].clone()))
                .collect(),
            lost: self.lost.clone(),
            adopting: runs(&self.adopt)
                .into_iter()
                .map(|(first, last, i)| (first, last, self.lost[i].id.clone()))
                .collect(),
            kept: runs(
                &self
                    .kept
                    .iter()
                    .map(|&k| if k { 0 } else { UNASSIGNED })
                    .collect::<Vec<_>>(),
            )
            .into_iter()
            .map(|(first, last, _)| (first, last))
            .collect(),
        };
        serde_json::to_vec(&s).expect("a slot map encodes")
    }

    /// The index of the node that serves `slot`.
    pub fn owner(&self, slot: u16) -> Option<usize> {
        match self.owner[slot as usize] {
            UNASSIGNED => None,
            i => Some(i as usize),
        }
    }

    /// The index of node `id`, if the map names it.
    pub fn index_of(&self, id: &str) -> Option<usize> {
        self.ids.iter().position(|x| x == id)
    }

    pub fn id(&self, node: usize) -> &str {
        &self.ids[node]
    }

    pub fn addr(&self, node: usize) -> &NodeAddr {
        &self.addrs[node]
    }

    /// How many nodes the map names.
    pub fn node_count(&self) -> usize {
        self.ids.len()
    }

    /// The runs of consecutive slots of one node, in slot order.
    pub fn ranges(&self) -> Vec<SlotRange> {
        let mut out: Vec<SlotRange> = Vec::new();
        for slot in 0..SLOT_COUNT {
            let Some(node) = self.owner(slot) else {
                continue;
            };
            match out.last_mut() {
                Some(r) if r.node == node && r.last + 1 == slot => r.last = slot,
                _ => out.push(SlotRange {
                    first: slot,
                    last: slot,
                    node,
                }),
            }
        }
        out
    }

    /// Slots each node serves, by node index.
    pub fn slot_counts(&self) -> Vec<usize> {
        let mut n = vec![0; self.ids.len()];
        for &o in &self.owner {
            if o != UNASSIGNED {
                n[o as usize] += 1;
            }
        }
        n
    }

    /// Slots no node serves.
    pub fn unassigned(&self) -> usize {
        self.owner.iter().filter(|&&o| o == UNASSIGNED).count()
    }

    /// Whether `other` says the same as this map, epochs aside.
    pub(crate) fn same_as(&self, other: &SlotMap) -> bool {
        let mut a = self.clone();
        a.epoch = other.epoch;
        a.encode() == other.encode()
    }

    /// The node slot `slot` is moving to, if it is moving.
    pub fn moving_to(&self, slot: u16) -> Option<usize> {
        match self.target[slot as usize] {
            UNASSIGNED => None,
            i => Some(i as usize),
        }
    }

    /// The runs of consecutive slots moving between the same two nodes, in slot order.
    pub fn moves(&self) -> Vec<Move> {
        let mut out: Vec<Move> = Vec::new();
        for slot in 0..SLOT_COUNT {
            let (Some(from), Some(to)) = (self.owner(slot), self.moving_to(slot)) else {
                continue;
            };
            match out.last_mut() {
                Some(m) if m.from == from && m.to == to && m.last + 1 == slot => m.last = slot,
                _ => out.push(Move {
                    first: slot,
                    last: slot,
                    from,
                    to,
                }),
            }
        }
        out
    }

    /// Whether any slot is moving.
    pub fn is_moving(&self) -> bool {
        self.target.iter().any(|&t| t != UNASSIGNED)
    }

    /// Whether each node holds its even share, give or take one slot.
    pub fn is_even(&self) -> bool {
        let c = self.slot_counts();
        let (lo, hi) = (c.iter().min(), c.iter().max());
        self.unassigned() == 0 && hi.zip(lo).is_none_or(|(h, l)| h - l <= 1)
    }

    /// The map with moves that even out the slots over its nodes (taken, as runs, from the
    /// end of the nodes that hold too many); `None` if it is even or a move is under way.
    pub fn plan_even(&self) -> Option<SlotMap> {
        if self.is_moving() || self.is_even() {
            return None;
        }
        let everyone: Vec<usize> = (0..self.ids.len()).collect();
        self.plan_over(&everyone)
    }

    /// The map with moves that take every slot of node `node` to the others, evenly;
    /// `None` if it holds none, is the only node, or a move is under way.
    pub fn plan_remove(&self, node: usize) -> Option<SlotMap> {
        if self.is_moving() || self.ids.len() < 2 {
            return None;
        }
        let others: Vec<usize> = (0..self.ids.len()).filter(|&i| i != node).collect();
        self.plan_over(&others)
    }

    /// Moves that leave the slots evenly over `keep` (and none on the other nodes).
    fn plan_over(&self, keep: &[usize]) -> Option<SlotMap> {
        let mut next = self.clone();
        next.epoch = self.epoch + 1;
        let load = self.slot_counts();
        let n = keep.len();
        let share = |k: usize| SLOT_COUNT as usize / n + usize::from(k < SLOT_COUNT as usize % n);
        // Heaviest first get the larger shares, so the fewest slots move.
        let mut order = keep.to_vec();
        order.sort_by_key(|&i| std::cmp::Reverse(load[i]));
        let mut want = vec![0usize; self.ids.len()];
        for (k, &i) in order.iter().enumerate() {
            want[i] = share(k);
        }
        let mut pool: Vec<u16> = Vec::new();
        for i in 0..self.ids.len() {
            let excess = load[i].saturating_sub(want[i]);
            let mut slots: Vec<u16> = (0..SLOT_COUNT)
                .rev()
                .filter(|&s| self.owner(s) == Some(i))
                .take(excess)
                .collect();
            pool.append(&mut slots);
        }
        if pool.is_empty() {
            return None;
        }
        pool.sort_unstable();
        let mut slots = pool.into_iter();
        for &i in keep {
            for _ in load[i]..want[i] {
                let Some(s) = slots.next() else { break };
                next.target[s as usize] = i as u16;
            }
        }
        Some(next)
    }

    /// The map once slots `first..=last` that were moving away from node `from` belong to
    /// their targets.
    pub fn flipped(&self, from: usize, first: u16, last: u16) -> SlotMap {
        let mut next = self.clone();
        next.epoch = self.epoch + 1;
        for slot in first..=last.min(SLOT_COUNT - 1) {
            let s = slot as usize;
            if self.owner(slot) == Some(from) && self.target[s] != UNASSIGNED {
                next.owner[s] = self.target[s];
                next.target[s] = UNASSIGNED;
            }
        }
        next
    }

    /// The lost nodes some slot's owner adopts from.
    pub fn lost_nodes(&self) -> &[LostNode] {
        &self.lost
    }

    /// The lost node whose bucket log `slot`'s owner adopts the slot from, while it does.
    pub fn adopting(&self, slot: u16) -> Option<&LostNode> {
        match self.adopt[slot as usize] {
            UNASSIGNED => None,
            i => self.lost.get(i as usize),
        }
    }

    /// Whether any slot is still adopted from a lost node.
    pub fn is_adopting(&self) -> bool {
        self.adopt.iter().any(|&a| a != UNASSIGNED)
    }

    /// Whether `slot`, adopted, was moving from its owner to the lost node: the owner keeps
    /// its own keys unless it had handed the slot over.
    pub fn kept(&self, slot: u16) -> bool {
        self.kept[slot as usize]
    }

    /// The runs of node `node`'s slots it adopts, each with the lost node it adopts from.
    pub fn adoptions_of(&self, node: usize) -> Vec<(u16, u16, LostNode)> {
        runs(&self.adopt)
            .into_iter()
            .flat_map(|(first, last, i)| {
                // A run of one lost node may span owners: cut it by owner.
                let mut out = Vec::new();
                let mut start = None;
                for slot in first..=last {
                    match (self.owner(slot) == Some(node), start) {
                        (true, None) => start = Some(slot),
                        (false, Some(s)) => {
                            out.push((s, slot - 1, self.lost[i].clone()));
                            start = None;
                        }
                        _ => {}
                    }
                }
                if let Some(s) = start {
                    out.push((s, last, self.lost[i].clone()));
                }
                out
            })
            .collect()
    }

    /// The map with `slots` adopted from `lost` by their owners; `kept`: those of them
    /// that were moving from their owners to the lost node.
    pub(crate) fn adopting_from(&self, lost: LostNode, slots: &[u16], kept: &[u16]) -> SlotMap {
        let mut next = self.clone();
        let i = match next.lost.iter().position(|n| n.id == lost.id) {
            Some(i) => i,
            None => {
                next.lost.push(lost);
                next.lost.len() - 1
            }
        };
        for &slot in slots {
            next.adopt[slot as usize] = i as u16;
            next.kept[slot as usize] = false;
        }
        for &slot in kept {
            next.adopt[slot as usize] = i as u16;
            next.kept[slot as usize] = true;
        }
        next
    }

    /// The map once slots `first..=last` are adopted (their owners serve them); lost nodes
    /// no slot adopts from any more leave it.
    pub(crate) fn adopted(&self, first: u16, last: u16) -> SlotMap {
        let mut next = self.clone();
        for slot in first..=last.min(SLOT_COUNT - 1) {
            next.adopt[slot as usize] = UNASSIGNED;
            next.kept[slot as usize] = false;
        }
        next.drop_unadopted();
        next
    }

    /// Drops the lost nodes no slot adopts from, renumbering the others.
    fn drop_unadopted(&mut self) {
        let used: Vec<bool> = (0..self.lost.len())
            .map(|i| self.adopt.contains(&(i as u16)))
            .collect();
        let mut renumber = vec![UNASSIGNED; self.lost.len()];
        let mut kept = Vec::new();
        for (i, n) in std::mem::take(&mut self.lost).into_iter().enumerate() {
            if used[i] {
                renumber[i] = kept.len() as u16;
                kept.push(n);
            }
        }
        self.lost = kept;
        for a in self.adopt.iter_mut().filter(|a| **a != UNASSIGNED) {
            *a = renumber[*a as usize];
        }
    }

    /// The map after the controller's repair: every slot of a node not in `live` (and
    /// every unassigned slot) goes to the live nodes, in runs, so they stay even; moves to
    /// or from a node not in `live` are dropped; live nodes' addresses are brought up to
    /// date, live nodes the map lacks join it (without slots), and other nodes leave it. `None` if nothing changes or no node is live.
    pub fn repaired(&self, live: &BTreeMap<String, NodeAddr>) -> Option<SlotMap> {
        if live.is_empty() {
            return None;
        }
        let mut next = SlotMap {
            epoch: self.epoch + 1,
            ..SlotMap::default()
        };
        for (id, addr) in live {
            next.ids.push(id.clone());
            next.addrs.push(addr.clone());
        }
        let mut load = vec![0usize; next.ids.len()];
        let mut orphans = Vec::new();
        for slot in 0..SLOT_COUNT {
            // A slot moving away from a lost node goes to the node it was moving to (which
            // may hold its newest keys already).
            let to = self
                .owner(slot)
                .and_then(|o| next.index_of(&self.ids[o]))
                .or_else(|| {
                    self.moving_to(slot)
                        .and_then(|t| next.index_of(&self.ids[t]))
                });
            match to {
                Some(i) => {
                    next.owner[slot as usize] = i as u16;
                    load[i] += 1;
                    // A move goes on only while both ends live (a target that took the
                    // slot from a lost source owns it: nothing moves).
                    if let Some(t) = self
                        .moving_to(slot)
                        .and_then(|t| next.index_of(&self.ids[t]))
                        .filter(|&t| t != i)
                    {
                        next.target[slot as usize] = t as u16;
                    }
                }
                None => orphans.push(slot),
            }
        }
        // Orphans go out in contiguous runs: each live node takes the next ones until it
        // holds its even share; whatever is left goes to the least loaded.
        let n = load.len();
        let share = |i: usize| SLOT_COUNT as usize / n + usize::from(i < SLOT_COUNT as usize % n);
        let mut node = 0;
        for slot in orphans {
            while node < n && load[node] >= share(node) {
                node += 1;
            }
            let to = if node < n {
                node
            } else {
                (0..n).min_by_key(|&i| (load[i], i)).expect("a live node")
            };
            next.owner[slot as usize] = to as u16;
            load[to] += 1;
        }
        next.lost = self.lost.clone();
        next.adopt = self.adopt.clone();
        next.kept = self.kept.clone();
        let changed = !next.same_as(self);
        changed.then_some(next)
    }
}

/// The runs of consecutive slots with the same index in `per_slot` (not [`UNASSIGNED`]).
fn runs(per_slot: &[u16]) -> Vec<(u16, u16, usize)> {
    let mut out: Vec<(u16, u16, usize)> = Vec::new();
    for (slot, &i) in per_slot.iter().enumerate() {
        if i == UNASSIGNED {
            continue;
        }
        let slot = slot as u16;
        match out.last_mut() {
            Some(r) if r.2 == i as usize && r.1 + 1 == slot => r.1 = slot,
            _ => out.push((slot, slot, i as usize)),
        }
    }
    out
}

/// Parses a node id: 40 lowercase hex digits, as Redis Cluster's.
pub fn check_node_id(id: &str) -> Result<()> {
    if id.len() == 40
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "node id '{id}' is not 40 lowercase hex digits"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: usize) -> BTreeMap<String, NodeAddr> {
        (0..n)
            .map(|i| {
                (
                    format!("{i:040x}"),
                    NodeAddr {
                        host: "127.0.0.1".into(),
                        port: 7000 + i as u16,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn an_even_map_of_three_nodes_matches_redis_cli_cluster_create() {
        let m = SlotMap::even(1, &nodes(3));
        let r: Vec<(u16, u16, usize)> = m
            .ranges()
            .iter()
            .map(|r| (r.first, r.last, r.node))
            .collect();
        // redis-cli --cluster create with three masters: 0-5460, 5461-10922, 10923-16383.
        assert_eq!(r, vec![(0, 5460, 0), (5461, 10922, 1), (10923, 16383, 2)]);
        assert_eq!(m.unassigned(), 0);
        assert_eq!(SlotMap::decode(&m.encode()).unwrap(), m);
    }

    #[test]
    fn a_lost_nodes_slots_go_evenly_to_the_live_ones_and_others_stay() {
        let all = nodes(3);
        let m = SlotMap::even(4, &all);
        let mut live = all.clone();
        let lost = live.keys().nth(1).unwrap().clone();
        live.remove(&lost);
        let next = m.repaired(&live).unwrap();
        assert_eq!(next.epoch, 5);
        assert_eq!(next.unassigned(), 0);
        assert_eq!(next.node_count(), 2);
        assert_eq!(next.slot_counts(), vec![8192, 8192]);
        // Handed out in runs, not slot by slot.
        assert!(next.ranges().len() <= 4, "{:?}", next.ranges());
        // Slots of live nodes did not move.
        for slot in 0..SLOT_COUNT {
            let before = m.id(m.owner(slot).unwrap());
            if before != lost {
                assert_eq!(next.id(next.owner(slot).unwrap()), before);
            }
        }
        assert_eq!(next.repaired(&live), None, "nothing left to repair");
    }

    #[test]
    fn a_moved_address_is_a_change_and_an_empty_live_set_changes_nothing() {
        let all = nodes(2);
        let m = SlotMap::even(1, &all);
        let mut moved = all.clone();
        moved.values_mut().next().unwrap().port = 9999;
        let next = m.repaired(&moved).unwrap();
        assert_eq!(next.addr(0).port, 9999);
        assert_eq!(next.ranges(), m.ranges());
        assert_eq!(m.repaired(&BTreeMap::new()), None);
    }

    #[test]
    fn a_new_node_gets_its_share_in_runs_from_the_others_and_a_removed_node_gives_all() {
        let three = nodes(3);
        let m = SlotMap::even(1, &three);
        assert_eq!(m.plan_even(), None, "even already");
        // A fourth node joins the map without slots (a repair adds live nodes).
        let four = nodes(4);
        let joined = m.repaired(&four).unwrap();
        assert_eq!(joined.slot_counts(), vec![5461, 5462, 5461, 0]);
        let plan = joined.plan_even().unwrap();
        let moves = plan.moves();
        assert!(moves.iter().all(|mv| mv.to == 3), "{moves:?}");
        assert_eq!(moves.len(), 3, "one run from each old node: {moves:?}");
        let moved: usize = moves
            .iter()
            .map(|mv| (mv.last - mv.first + 1) as usize)
            .sum();
        assert_eq!(moved, 4096);
        assert_eq!(SlotMap::decode(&plan.encode()).unwrap(), plan);
        assert_eq!(plan.plan_even(), None, "one move at a time");
        let mut done = plan.clone();
        for mv in &moves {
            done = done.flipped(mv.from, mv.first, mv.last);
        }
        assert!(!done.is_moving());
        assert!(done.is_even(), "{:?}", done.slot_counts());
        assert_eq!(done.slot_counts().iter().sum::<usize>(), 16384);

        // Node 1 leaves: its slots go to the other three, evenly.
        let leave = done.plan_remove(1).unwrap();
        assert!(leave.moves().iter().all(|mv| mv.from == 1 && mv.to != 1));
        let mut left = leave.clone();
        for mv in leave.moves() {
            left = left.flipped(mv.from, mv.first, mv.last);
        }
        let c = left.slot_counts();
        assert_eq!(c[1], 0);
        assert!(
            c.iter()
                .filter(|&&n| n > 0)
                .all(|&n| (5461..=5462).contains(&n)),
            "{c:?}"
        );
        // A move whose target stops living is dropped; the slots stay with their owner.
        let mut without_new = four.clone();
        without_new.remove(&format!("{:040x}", 3));
        let repaired = plan.repaired(&without_new).unwrap();
        assert!(!repaired.is_moving());
        assert_eq!(repaired.slot_counts(), vec![5461, 5462, 5461]);
        // A move whose source stops living ends too: its target owns the slots.
        let mover = plan.moves()[0].clone();
        let mut without_source = four.clone();
        without_source.remove(plan.id(mover.from));
        let repaired = plan.repaired(&without_source).unwrap();
        let target = repaired.index_of(plan.id(mover.to)).unwrap();
        assert!((mover.first..=mover.last)
            .all(|s| repaired.owner(s) == Some(target) && repaired.moving_to(s).is_none()));
        assert_eq!(repaired.moves().len(), 2, "the other sources' moves go on");
    }

    #[test]
    fn bad_maps_and_ids_are_refused() {
        assert!(SlotMap::decode(b"{").is_err());
        assert!(SlotMap::decode(br#"{"epoch":1,"nodes":{},"ranges":[[0,5,"x"]]}"#).is_err());
        assert!(check_node_id(&"a".repeat(40)).is_ok());
        assert!(check_node_id("xyz").is_err());
    }

    /// A lost node's slots, marked adopted from it, survive the map's JSON, split by
    /// their new owners, carry through a later repair, and leave the map once reported.
    #[test]
    fn adoptions_mark_a_lost_nodes_slots_until_reported() {
        let three = nodes(3);
        let m = SlotMap::even(1, &three);
        let lost_id = m.id(2).to_string();
        let mut live = three.clone();
        live.remove(&lost_id);
        let lost = LostNode {
            id: lost_id.clone(),
            epochs: vec![(4, 17), (9, 2)],
        };
        let slots: Vec<u16> = (0..SLOT_COUNT).filter(|&s| m.owner(s) == Some(2)).collect();
        let next = m
            .repaired(&live)
            .unwrap()
            .adopting_from(lost.clone(), &slots, &[]);
        let back = SlotMap::decode(&next.encode()).unwrap();
        assert!(back.same_as(&next));
        assert_eq!(back.adopting(slots[0]), Some(&lost));
        assert_eq!(back.adopting(0), None, "a live node's own slot");
        let runs: Vec<(u16, u16)> = (0..2)
            .flat_map(|n| back.adoptions_of(n))
            .map(|(f, l, node)| {
                assert_eq!(node, lost);
                (f, l)
            })
            .collect();
        let covered: usize = runs.iter().map(|(f, l)| (l - f + 1) as usize).sum();
        assert_eq!(covered, slots.len());
        for &(f, l) in &runs {
            assert!((f..=l).all(|s| back.owner(s).is_some()));
        }
        // Still marked after another repair; gone once every run is reported.
        let again = back.repaired(&live).unwrap_or_else(|| back.clone());
        assert_eq!(again.adopting(slots[0]), Some(&lost));
        let done = runs.iter().fold(again, |m, &(f, l)| m.adopted(f, l));
        assert!(slots.iter().all(|&s| done.adopting(s).is_none()));
        assert!(!String::from_utf8(done.encode()).unwrap().contains(&lost_id));
        // Slots that were moving to the lost node are marked kept, and stay so through
        // the JSON until reported.
        let own: Vec<u16> = (0..SLOT_COUNT)
            .filter(|&s| m.owner(s) == Some(0))
            .take(10)
            .collect();
        let with_kept = m
            .repaired(&live)
            .unwrap()
            .adopting_from(lost.clone(), &slots, &own);
        let back = SlotMap::decode(&with_kept.encode()).unwrap();
        assert!(back.same_as(&with_kept));
        assert!(own
            .iter()
            .all(|&s| back.kept(s) && back.adopting(s) == Some(&lost)));
        assert!(!back.kept(slots[0]));
        let done = back.adopted(own[0], own[9]);
        assert!(!done.kept(own[0]));
    }
}
