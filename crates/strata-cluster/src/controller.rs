//! The controller: one node at a time (the one whose id the controller key holds, bound to
//! its lease) changes the slot map. Each change is one etcd transaction that compares the
//! controller key with this node's id and the map's revision with the one read, so a
//! controller that lost its key, or read an older map, commits nothing.
//!
//! Its duties, four times per lease TTL: the slots of nodes whose lease expired go to the
//! live nodes ([`SlotMap::repaired`]); slots a source node reports copied go to their
//! target ([`SlotMap::flipped`]); an operator's `rebalance` creates the first map (the
//! slots split evenly over the live nodes) or plans moves that even it out, and
//! `remove-node` plans moves that empty a node; each is answered once no slot moves.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use serde::{Deserialize, Serialize};

use crate::member::Inner;
use crate::slots::{NodeAddr, SlotMap};
use crate::Result;

/// An operator's request, and the controller's answer to it (same `id`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Request {
    pub(crate) id: String,
    /// The node a `remove-node` request names.
    #[serde(default)]
    pub(crate) node: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Answer {
    pub(crate) id: String,
    pub(crate) ok: bool,
    pub(crate) message: String,
}

pub(crate) async fn run(inner: Arc<Inner>) {
    let period = std::time::Duration::from_secs(inner.settings.cluster_lease_ttl_s) / 4;
    // A request or a source's report wakes the controller at once; otherwise it runs four
    // times per lease TTL (to notice lost nodes).
    let wake = Arc::new(tokio::sync::Notify::new());
    tokio::spawn(watch_work(Arc::clone(&inner), Arc::clone(&wake)));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = wake.notified() => {}
        }
        if !inner.live() {
            continue;
        }
        match campaign(&inner).await {
            Ok(true) => {
                if let Err(e) = duties(&inner).await {
                    tracing::warn!(error = %e, "controller round failed");
                }
            }
            Ok(false) => {}
            Err(e) => tracing::debug!(error = %e, "cannot stand for controller"),
        }
    }
}

/// Wakes the controller whenever a request or a report arrives in etcd.
async fn watch_work(inner: Arc<Inner>, wake: Arc<tokio::sync::Notify>) {
    let prefixes = [
        inner.keys.request(""),
        inner.keys.moved_prefix(),
        inner.keys.adopted_prefix(),
    ];
    loop {
        let watched = async {
            let mut etcd = inner.etcd.clone();
            let opts = || Some(etcd_client::WatchOptions::new().with_prefix());
            // The watchers live as long as their streams are read.
            let (_wa, mut a) = etcd.watch(prefixes[0].as_str(), opts()).await?;
            let (_wb, mut b) = etcd.watch(prefixes[1].as_str(), opts()).await?;
            let (_wc, mut c) = etcd.watch(prefixes[2].as_str(), opts()).await?;
            loop {
                let got = tokio::select! {
                    m = a.message() => m?,
                    m = b.message() => m?,
                    m = c.message() => m?,
                };
                if got.is_none() {
                    return Ok::<(), etcd_client::Error>(());
                }
                wake.notify_one();
            }
        };
        if let Err(e) = watched.await {
            tracing::debug!(error = %e, "watching for controller work failed; retrying");
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// Whether this node is the controller, taking the key if no node holds it.
async fn campaign(inner: &Inner) -> Result<bool> {
    let key = inner.keys.controller();
    let lease = inner.lease.load(Ordering::Acquire) as i64;
    let txn = Txn::new()
        .when([Compare::version(key.as_str(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            key.as_str(),
            inner.id.as_str(),
            Some(PutOptions::new().with_lease(lease)),
        )])
        .or_else([TxnOp::get(key.as_str(), None)]);
    let r = inner.etcd.clone().txn(txn).await?;
    if r.succeeded() {
        tracing::info!(node = %inner.id, "this node is the cluster's controller");
        return Ok(true);
    }
    for op in r.op_responses() {
        if let etcd_client::TxnOpResponse::Get(g) = op {
            if let Some(kv) = g.kvs().first() {
                return Ok(kv.value() == inner.id.as_bytes() && kv.lease() == lease);
            }
        }
    }
    Ok(false)
}

/// What one round read of a request: which request (`rebalance`, `remove-node`) and what
/// it asks.
struct Pending {
    what: &'static str,
    req: Request,
}

async fn pending(inner: &Inner, what: &'static str) -> Result<Option<Pending>> {
    let r = inner
        .etcd
        .clone()
        .get(inner.keys.request(what), None)
        .await?;
    Ok(r.kvs()
        .first()
        .and_then(|kv| serde_json::from_slice(kv.value()).ok())
        .map(|req| Pending { what, req }))
}

/// The condition of every write the controller makes: this node still holds the key.
fn still_controller(inner: &Inner) -> Compare {
    Compare::value(inner.keys.controller(), CompareOp::Equal, inner.id.as_str())
}

/// One round of the controller's work: repair, flip the slots sources reported copied,
/// start the moves a request asks for, answer the requests that are done.
async fn duties(inner: &Inner) -> Result<()> {
    let live = inner.live_nodes().await?;
    let mut etcd = inner.etcd.clone();
    let r = etcd.get(inner.keys.slots(), None).await?;
    let (map, revision) = match r.kvs().first() {
        Some(kv) => (Some(SlotMap::decode(kv.value())?), kv.mod_revision()),
        None => (None, 0),
    };
    let rebalance = pending(inner, "rebalance").await?;
    let remove = pending(inner, "remove-node").await?;
    let Some(map) = map else {
        return first_map(inner, &live, rebalance).await;
    };
    // A lost node's writer is fenced before any slot of it goes elsewhere.
    let lost = crate::failover::fence_lost(inner, &map, &live).await?;
    let repaired = map.repaired(&live).unwrap_or_else(|| map.clone());
    let next = crate::failover::mark_adoptions(&map, repaired, lost);
    let (next, mut consumed) = crate::failover::apply_adopted(inner, next).await?;
    let (retired, records) = crate::failover::retired(inner, &map, &next);
    consumed.extend(records);
    let mut next = apply_moved(inner, next, &mut consumed).await?;
    // No slot moves while one is adopted: a move would copy what its owner holds before
    // the adoption wrote the lost node's keys.
    if !next.is_moving() && !next.is_adopting() {
        next = plan(next, remove.as_ref(), rebalance.is_some());
    }
    // However many changes this round made, the map's epoch moves by one.
    next.epoch = map.epoch + 1;
    if !next.same_as(&map) || !consumed.is_empty() {
        if !commit(inner, &next, revision, &consumed).await? {
            // Another controller, or a newer map: the next round reads again.
            return Ok(());
        }
        crate::failover::delete_retired(inner, retired);
        tracing::info!(
            epoch = next.epoch,
            moving = next.moves().len(),
            "controller committed a new slot map"
        );
    }
    if next.is_moving() || next.is_adopting() {
        return Ok(());
    }
    answer_pending(inner, &next, remove, rebalance).await
}

/// No map yet: a pending rebalance creates it over the live nodes.
async fn first_map(
    inner: &Inner,
    live: &BTreeMap<String, NodeAddr>,
    rebalance: Option<Pending>,
) -> Result<()> {
    let Some(p) = rebalance else {
        return Ok(());
    };
    if live.is_empty() {
        return answer(inner, p, false, "no node is live to take the slots".into()).await;
    }
    let first = SlotMap::even(1, live);
    if commit(inner, &first, 0, &[]).await? {
        let msg = summary(&first);
        answer(inner, p, true, msg).await?;
    }
    Ok(())
}

/// `next` with the moves its sources reported done flipped to their targets; the reports'
/// keys go into `consumed`.
async fn apply_moved(
    inner: &Inner,
    mut next: SlotMap,
    consumed: &mut Vec<String>,
) -> Result<SlotMap> {
    for report in crate::keys::reports(&inner.etcd, &inner.keys.moved_prefix()).await? {
        let Some(from) = &report.from else {
            continue;
        };
        if let (Some(f), Some((first, last))) = (next.index_of(from), report.range) {
            next = next.flipped(f, first, last);
        }
        consumed.push(report.key);
    }
    Ok(next)
}

/// `next` (no slot moving) with the moves a pending removal or rebalance asks for planned.
fn plan(next: SlotMap, remove: Option<&Pending>, rebalance: bool) -> SlotMap {
    let planned = match remove {
        Some(p) => {
            let node = p.req.node.as_deref().unwrap_or_default();
            next.index_of(node).and_then(|i| next.plan_remove(i))
        }
        None if rebalance => next.plan_even(),
        None => None,
    };
    planned.unwrap_or(next)
}

/// Answers a pending removal or rebalance once `next` (no slot moving) settles it.
async fn answer_pending(
    inner: &Inner,
    next: &SlotMap,
    remove: Option<Pending>,
    rebalance: Option<Pending>,
) -> Result<()> {
    if let Some(p) = remove {
        let node = p.req.node.clone().unwrap_or_default();
        let (ok, msg) = match next.index_of(&node) {
            Some(i) if next.slot_counts()[i] > 0 => (
                false,
                format!("node {node} is the only node; its slots have nowhere to go"),
            ),
            _ => (
                true,
                format!("node {node} holds no slots: stop it now; {}", summary(next)),
            ),
        };
        answer(inner, p, ok, msg).await
    } else if let Some(p) = rebalance {
        if next.is_even() {
            answer(inner, p, true, summary(next)).await
        } else {
            let msg = format!("cannot even out the slots: {}", summary(next));
            answer(inner, p, false, msg).await
        }
    } else {
        Ok(())
    }
}

fn summary(m: &SlotMap) -> String {
    let counts = m.slot_counts();
    let serving = counts.iter().filter(|&&n| n > 0).count();
    format!(
        "{} slots over {serving} nodes, {} to {} each (epoch {})",
        16384 - m.unassigned(),
        counts
            .iter()
            .filter(|&&n| n > 0)
            .min()
            .copied()
            .unwrap_or(0),
        counts.iter().max().copied().unwrap_or(0),
        m.epoch
    )
}

/// Answers request `p` (if this node still is the controller) and removes it.
async fn answer(inner: &Inner, p: Pending, ok: bool, message: String) -> Result<()> {
    let a = Answer {
        id: p.req.id,
        ok,
        message,
    };
    let txn = Txn::new().when([still_controller(inner)]).and_then([
        TxnOp::put(
            inner.keys.answer(p.what),
            serde_json::to_vec(&a).expect("an answer encodes"),
            None,
        ),
        TxnOp::delete(inner.keys.request(p.what), None),
    ]);
    inner.etcd.clone().txn(txn).await?;
    Ok(())
}

/// Writes `next` (and deletes the reports `consumed`) if this node still holds the
/// controller key and the map is still at `revision` (0: absent); whether it did.
async fn commit(inner: &Inner, next: &SlotMap, revision: i64, consumed: &[String]) -> Result<bool> {
    let slots = inner.keys.slots();
    let map_unchanged = if revision == 0 {
        Compare::version(slots.as_str(), CompareOp::Equal, 0)
    } else {
        Compare::mod_revision(slots.as_str(), CompareOp::Equal, revision)
    };
    let txn = Txn::new()
        .when([still_controller(inner), map_unchanged])
        .and_then(
            std::iter::once(TxnOp::put(slots.as_str(), next.encode(), None))
                .chain(consumed.iter().map(|k| TxnOp::delete(k.as_str(), None)))
                .collect::<Vec<_>>(),
        );
    Ok(inner.etcd.clone().txn(txn).await?.succeeded())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::{Cluster, ClusterSettings, NodeAddr};

    /// Against a real etcd: the transaction guard, not just the election, keeps a stale
    /// controller from committing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_controller_commits_only_while_it_holds_the_key_and_has_read_the_current_map() {
        let etcd = strata_testkit::Etcd::start();
        let settings = ClusterSettings {
            cluster_etcd: etcd.url.clone(),
            cluster_name: "guard".into(),
            // The controller's own rounds come every 15 s: this test drives it alone.
            cluster_lease_ttl_s: 60,
            ..Default::default()
        };
        let addr = |port| NodeAddr {
            host: "127.0.0.1".into(),
            port,
        };
        let c = Cluster::join(&settings, "a".repeat(40), addr(7000), None)
            .await
            .unwrap();
        let inner = &c.inner;
        assert!(campaign(inner).await.unwrap());
        let live = inner.live_nodes().await.unwrap();
        let first = SlotMap::even(1, &live);
        assert!(commit(inner, &first, 0, &[]).await.unwrap());
        assert!(
            !commit(inner, &first, 0, &[]).await.unwrap(),
            "a map that exists is not created again"
        );
        let mut etcd_client = inner.etcd.clone();
        let rev = etcd_client
            .get(inner.keys.slots(), None)
            .await
            .unwrap()
            .kvs()[0]
            .mod_revision();
        let moved: BTreeMap<String, NodeAddr> = [("a".repeat(40), addr(7001))].into();
        let second = first.repaired(&moved).unwrap();

        // Another node took the controller key: nothing commits, and this node stands down.
        etcd_client
            .put(inner.keys.controller(), "b".repeat(40), None)
            .await
            .unwrap();
        assert!(!commit(inner, &second, rev, &[]).await.unwrap());
        assert!(!campaign(inner).await.unwrap());

        // Controller again, but with a map older than etcd's: nothing commits either.
        etcd_client
            .delete(inner.keys.controller(), None)
            .await
            .unwrap();
        assert!(campaign(inner).await.unwrap());
        assert!(!commit(inner, &second, rev - 1, &[]).await.unwrap());
        assert!(commit(inner, &second, rev, &[]).await.unwrap());

        // The node sees the committed map through its watch.
        let deadline = Instant::now() + Duration::from_secs(10);
        while c.map().epoch != second.epoch {
            assert!(
                Instant::now() < deadline,
                "the watch did not deliver the map"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(c.map().addr(0).port, 7001);
        assert_eq!(c.route(0, true, false), crate::Route::Local);
    }
}
