//! One pool shared by namespaces (tenants), each replaying its own trace at its own rate,
//! with or without quotas: how much one namespace's traffic costs another's hit rate.
//!
//! The pool is one LRU over every namespace's blocks (what a pool without quotas does:
//! the least recently used block goes, whoever it belongs to). A namespace with a quota
//! keeps its blocks in its own order of use and, once past the quota, gives up its own
//! least recently used first (as the server's `KVC.QUOTA` does), so it never pushes out
//! another namespace's blocks beyond what the pool's capacity leaves.
//!
//! Rates: in each round a namespace sends `rate` requests, for as many rounds as asked
//! (usually until every namespace has sent its whole trace once). A namespace that reaches
//! the end of its trace before then starts it again with fresh blocks (another pass is
//! other users' prompts, not a repeat of the same ones).

use hashlink::LinkedHashMap;

use crate::{ReplayResult, Request};

/// One namespace of a shared replay.
#[derive(Debug, Clone)]
pub struct Tenant<'a> {
    pub trace: &'a [Request],
    /// Requests per round.
    pub rate: usize,
    /// Most blocks it may hold (`None`: no quota).
    pub quota_blocks: Option<usize>,
}

/// A block of a namespace: its pass over its trace and the trace's block id.
type Block = (u64, u64);

/// The pool: each namespace's blocks in its order of use, with the time of their last use.
struct Pool {
    spaces: Vec<LinkedHashMap<Block, u64>>,
    quotas: Vec<Option<usize>>,
    capacity: usize,
    held: usize,
    clock: u64,
}

impl Pool {
    fn contains(&self, t: usize, b: Block) -> bool {
        self.spaces[t].contains_key(&b)
    }

    /// Block `b` of namespace `t` used (stored, or read after the request).
    fn touch(&mut self, t: usize, b: Block) {
        self.clock += 1;
        if self.spaces[t].insert(b, self.clock).is_none() {
            self.held += 1;
        }
        while self.quotas[t].is_some_and(|q| self.spaces[t].len() > q) {
            self.spaces[t].pop_front();
            self.held -= 1;
        }
        while self.held > self.capacity {
            self.evict_oldest();
        }
    }

    /// The least recently used block of the whole pool goes.
    fn evict_oldest(&mut self) {
        let oldest = (0..self.spaces.len())
            .filter_map(|t| self.spaces[t].front().map(|(_, &at)| (at, t)))
            .min();
        if let Some((_, t)) = oldest {
            self.spaces[t].pop_front();
            self.held -= 1;
        }
    }
}

/// The rounds it takes every one of `tenants` to send its whole trace once.
pub fn rounds_to_send_all(tenants: &[Tenant<'_>]) -> usize {
    tenants
        .iter()
        .map(|t| t.trace.len().div_ceil(t.rate.max(1)))
        .max()
        .unwrap_or(0)
}

/// Replays `tenants` together against one pool of `capacity` blocks for `rounds` rounds
/// ([`rounds_to_send_all`]: until each has sent its trace once); one result per
/// namespace, in order. A block hits as in [`crate::replay_with`]: only if every earlier
/// block of its request hit.
pub fn replay_tenants(tenants: &[Tenant<'_>], capacity: usize, rounds: usize) -> Vec<ReplayResult> {
    let mut pool = Pool {
        spaces: vec![LinkedHashMap::new(); tenants.len()],
        quotas: tenants.iter().map(|t| t.quota_blocks).collect(),
        capacity: capacity.max(1),
        held: 0,
        clock: 0,
    };
    let mut out = vec![ReplayResult { blocks: 0, hits: 0 }; tenants.len()];
    let mut sent = vec![0usize; tenants.len()];
    for _ in 0..rounds {
        for (i, t) in tenants.iter().enumerate() {
            for _ in 0..t.rate.max(1) {
                if t.trace.is_empty() {
                    break;
                }
                let pass = (sent[i] / t.trace.len()) as u64;
                let req = &t.trace[sent[i] % t.trace.len()];
                request(&mut pool, i, pass, req, &mut out[i]);
                sent[i] += 1;
            }
        }
    }
    out
}

/// One request of namespace `t`: its blocks looked up, then all of them used.
fn request(pool: &mut Pool, t: usize, pass: u64, req: &Request, out: &mut ReplayResult) {
    let mut prefix = true;
    for &b in &req.blocks {
        prefix = prefix && pool.contains(t, (pass, b));
        out.blocks += 1;
        out.hits += prefix as u64;
    }
    for &b in &req.blocks {
        pool.touch(t, (pass, b));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{replay, PolicyKind};

    fn trace(sessions: u64, requests: u64) -> Vec<Request> {
        (0..requests)
            .map(|i| Request {
                blocks: (0..4).map(|j| (i % sessions) * 10 + j).collect(),
            })
            .collect()
    }

    #[test]
    fn one_tenant_alone_is_plain_lru() {
        let t = trace(50, 2000);
        let alone = [Tenant {
            trace: &t,
            rate: 1,
            quota_blocks: None,
        }];
        let alone = replay_tenants(&alone, 120, rounds_to_send_all(&alone));
        assert_eq!(alone[0], replay(&t, PolicyKind::Lru, 120));
    }

    #[test]
    fn a_quota_on_the_noisy_tenant_gives_the_quiet_one_its_hits_back() {
        let quiet = trace(25, 1000); // 100 blocks, all reused
        let noisy = trace(1000, 1000); // 4,000 blocks, reused only past the pool's size
        let run = |quota| {
            let both = [
                Tenant {
                    trace: &quiet,
                    rate: 1,
                    quota_blocks: None,
                },
                Tenant {
                    trace: &noisy,
                    rate: 10,
                    quota_blocks: quota,
                },
            ];
            replay_tenants(&both, 200, rounds_to_send_all(&both))[0].hit_rate()
        };
        let alone = replay(&quiet, PolicyKind::Lru, 200).hit_rate();
        let (shared, capped) = (run(None), run(Some(100)));
        assert!(
            shared < alone - 0.5,
            "the noisy tenant flushes the quiet one: {shared}"
        );
        assert!(
            capped > alone - 0.01,
            "with a quota it keeps its hits: {capped} vs {alone}"
        );
    }
}
