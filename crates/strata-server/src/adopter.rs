//! A lost node's slots, on their new owner: the map marks them adopted from the lost node
//! (the controller fenced its bucket log first), and until this node reports them adopted
//! they answer `-TRYAGAIN`. This task reads the lost node's log (from its last snapshot,
//! through every later writer epoch of it, each up to its fence), writes what it leaves
//! the slots' keys holding into the store as this node's own writes, and reports the
//! slots adopted; the controller clears their marks and they are served.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use strata_cluster::{Cluster, LostNode};

use crate::shared::Shared;

/// How long a failed adoption waits before it tries again.
const RETRY: Duration = Duration::from_secs(1);

pub(crate) async fn run(shared: Arc<Shared>, cluster: Cluster) {
    let mut changes = cluster.map_changes();
    // Runs adopted and reported, until the map stops marking them.
    let mut reported: HashSet<(u16, u16, String)> = HashSet::new();
    loop {
        let due = cluster.adoptions();
        reported.retain(|r| {
            due.iter()
                .any(|(f, l, n)| (*f, *l, &n.id) == (r.0, r.1, &r.2))
        });
        let mut by_node: BTreeMap<String, (LostNode, Vec<(u16, u16)>)> = BTreeMap::new();
        for (first, last, node) in due {
            if reported.contains(&(first, last, node.id.clone())) {
                continue;
            }
            let entry = by_node
                .entry(node.id.clone())
                .or_insert_with(|| (node, Vec::new()));
            entry.1.push((first, last));
        }
        let mut failed = false;
        for (id, (node, runs)) in by_node {
            match adopt(&shared, &cluster, &node, &runs).await {
                Ok(()) => reported.extend(runs.iter().map(|&(f, l)| (f, l, id.clone()))),
                Err(e) => {
                    failed = true;
                    tracing::warn!(lost = id, error = %e, "adopting a lost node's slots failed; retrying");
                }
            }
        }
        tokio::select! {
            r = changes.changed() => if r.is_err() { return },
            _ = tokio::time::sleep(RETRY), if failed || !reported.is_empty() => {}
        }
    }
}

/// Adopts `runs` of slots from lost node `node`'s bucket log, and reports them. A slot
/// whose newest keys are this node's own (it was moving between the two) keeps them; every
/// other is cleared of what this node held of it (copies of an earlier move), then takes
/// what the log leaves it.
async fn adopt(
    shared: &Arc<Shared>,
    cluster: &Cluster,
    node: &LostNode,
    runs: &[(u16, u16)],
) -> Result<(), String> {
    let mut slots: Vec<u16> = runs
        .iter()
        .flat_map(|&(f, l)| f..=l)
        .filter(|&s| cluster.adopts_from(s, &node.id))
        .collect();
    slots.sort_unstable();
    let keys = if slots.is_empty() {
        0
    } else {
        replay_into(shared, node, &slots).await?
    };
    tracing::info!(
        lost = node.id,
        keys,
        slots = slots.len(),
        "adopted a lost node's slots"
    );
    crate::kvchunks::announce_slots(shared, slots);
    for &(first, last) in runs {
        cluster
            .report_adopted(first, last)
            .await
            .map_err(|e| e.to_string())?;
        for slot in first..=last {
            cluster.note_move(slot, None);
        }
    }
    Ok(())
}

/// Clears `slots` (sorted) here, then writes what lost node `node`'s log leaves their keys
/// holding; how many keys it wrote or deleted.
async fn replay_into(shared: &Shared, node: &LostNode, slots: &[u16]) -> Result<u64, String> {
    for &slot in slots {
        crate::cmd::clear_slot(&shared.engine, slot)
            .await
            .map_err(|e| format!("cannot clear slot {slot} before adopting it: {e}"))?;
    }
    let store = shared.engine.bucket();
    let epochs: Vec<u64> = node.epochs.iter().map(|&(e, _)| e).collect();
    let objects = strata_engine::bucket_replay(store.as_ref(), &epochs)
        .await
        .map_err(|e| e.to_string())?;
    let wanted = |slot: u16| slots.binary_search(&slot).is_ok();
    shared
        .engine
        .adopt(&objects, &wanted)
        .await
        .map_err(|e| e.to_string())
}
