//! The controller's part in a failover: before a lost node's slots go to the live nodes,
//! each of its writer epochs is fenced in the bucket the nodes share (so nothing it writes
//! later can land where its slots' new owners read), and the slots are marked adopted from
//! it; each new owner reads the lost node's bucket log, writes it into its store, and
//! reports the slots adopted, which clears their marks. Once no slot is adopted from a
//! lost node any more, its epochs are retired: their records go with the map's commit (a
//! later loss of the node, back under a new epoch, never replays them) and what it wrote
//! under them is deleted from the bucket.

use std::collections::BTreeMap;

use strata_format::keys::SLOT_COUNT;

use crate::member::Inner;
use crate::slots::{LostNode, NodeAddr, SlotMap};
use crate::{Error, Result};

/// The nodes of `map` that own slots or are taking some and are not `live`, each fenced:
/// its index in `map` and what its slots' new owners adopt. Empty when the nodes share no
/// bucket.
pub(crate) async fn fence_lost(
    inner: &Inner,
    map: &SlotMap,
    live: &BTreeMap<String, NodeAddr>,
) -> Result<Vec<(usize, LostNode)>> {
    let Some(bucket) = &inner.bucket else {
        return Ok(Vec::new());
    };
    let counts = map.slot_counts();
    let targets: Vec<usize> = map.moves().iter().map(|m| m.to).collect();
    let mut out = Vec::new();
    for (i, &n) in counts.iter().enumerate() {
        let id = map.id(i);
        if (n == 0 && !targets.contains(&i)) || live.contains_key(id) {
            continue;
        }
        let mut epochs = Vec::new();
        for e in crate::epochs::epochs_of(&inner.etcd, &inner.keys, id).await? {
            let at = bucket.fence(e).await.map_err(|why| {
                Error::Etcd(format!("cannot fence epoch {e} of lost node {id}: {why}"))
            })?;
            epochs.push((e, at));
        }
        tracing::warn!(
            node = id,
            epochs = epochs.len(),
            "fenced a lost node's bucket log"
        );
        out.push((
            i,
            LostNode {
                id: id.to_string(),
                epochs,
            },
        ));
    }
    Ok(out)
}

/// `next` (the map repaired without the lost nodes of `map`) with the slots each of
/// `lost` owned, or was taking over (marked kept), marked adopted from it. Where a slot
/// was moving, only its two ends know whether it was handed over: the new owner decides
/// whether the lost node's keys of it are the newest (`Cluster::adopts_from`).
pub(crate) fn mark_adoptions(
    map: &SlotMap,
    mut next: SlotMap,
    lost: Vec<(usize, LostNode)>,
) -> SlotMap {
    for (i, node) in lost {
        let slots: Vec<u16> = (0..SLOT_COUNT)
            .filter(|&s| map.owner(s) == Some(i))
            .collect();
        let kept: Vec<u16> = (0..SLOT_COUNT)
            .filter(|&s| map.moving_to(s) == Some(i))
            .collect();
        next = next.adopting_from(node, &slots, &kept);
    }
    next
}

/// The map with the slots in adoption reports (`adopted/<node>/<first>-<last>`) cleared
/// of their marks; the report keys, to be deleted with the map's commit.
pub(crate) async fn apply_adopted(
    inner: &Inner,
    mut next: SlotMap,
) -> Result<(SlotMap, Vec<String>)> {
    let mut consumed = Vec::new();
    for report in crate::keys::reports(&inner.etcd, &inner.keys.adopted_prefix()).await? {
        if let Some((first, last)) = report.range {
            next = next.adopted(first, last);
        }
        consumed.push(report.key);
    }
    Ok((next, consumed))
}

/// The writer epochs of the lost nodes `map` adopts from and `next` no longer does (their
/// slots' new owners adopted everything), with the etcd keys that record them.
pub(crate) fn retired(inner: &Inner, map: &SlotMap, next: &SlotMap) -> (Vec<u64>, Vec<String>) {
    let epochs: Vec<u64> = map
        .lost_nodes()
        .iter()
        .filter(|n| !next.lost_nodes().iter().any(|m| m.id == n.id))
        .flat_map(|n| n.epochs.iter().map(|&(e, _)| e))
        .collect();
    let keys = epochs.iter().map(|&e| inner.keys.epoch(e)).collect();
    (epochs, keys)
}

/// Deletes from the bucket what retired `epochs` wrote, behind the controller's round (a
/// failure leaves objects no one reads, and says so).
pub(crate) fn delete_retired(inner: &Inner, epochs: Vec<u64>) {
    let Some(bucket) = inner.bucket.clone() else {
        return;
    };
    tokio::spawn(async move {
        for e in epochs {
            match bucket.retire(e).await {
                Ok(()) => tracing::info!(
                    epoch = e,
                    "deleted a lost node's adopted epoch from the bucket"
                ),
                Err(why) => tracing::warn!(
                    epoch = e,
                    error = why,
                    "cannot delete a lost node's adopted epoch from the bucket"
                ),
            }
        }
    });
}
