//! Writer epochs: every start of a node takes a number of its own from etcd, under which it
//! writes to the bucket the cluster's nodes share (its segments' ids and their prefix), so
//! two nodes, or two starts of one node, never write the same object name nor collect each
//! other's. The record of each epoch (`epochs/<e>` → the node that holds it) outlives the
//! node's lease, so the controller can find a lost node's epochs.

use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp};

use crate::keys::{connect, Keys};
use crate::slots::SlotMap;
use crate::{ClusterSettings, Error, Result};

/// Attempts at taking the next epoch before giving up (each loses only to another node
/// taking one at the same moment).
const CLAIM_ATTEMPTS_MAX: usize = 64;

/// Takes the cluster's next writer epoch for node `node_id` and records which node holds it.
pub async fn claim_epoch(settings: &ClusterSettings, node_id: &str) -> Result<u64> {
    let timeout = std::time::Duration::from_millis(settings.cluster_lease_ttl_s * 1000 / 4);
    let mut etcd = connect(&settings.endpoints(), timeout).await.map_err(|e| {
        Error::Etcd(format!(
            "cannot reach etcd at {} ({e}); is cluster_etcd right?",
            settings.cluster_etcd
        ))
    })?;
    let keys = Keys::new(&settings.cluster_name);
    let counter = keys.epoch_counter();
    for _ in 0..CLAIM_ATTEMPTS_MAX {
        let got = etcd.get(counter.as_str(), None).await?;
        let (last, version) = match got.kvs().first() {
            Some(kv) => (parse_epoch(kv.value())?, kv.version()),
            None => (0, 0),
        };
        let next = last + 1;
        let txn = Txn::new()
            .when([Compare::version(
                counter.as_str(),
                CompareOp::Equal,
                version,
            )])
            .and_then([
                TxnOp::put(counter.as_str(), next.to_string(), None),
                TxnOp::put(keys.epoch(next), node_id, None),
            ]);
        if etcd.txn(txn).await?.succeeded() {
            return Ok(next);
        }
    }
    Err(Error::Etcd(format!(
        "could not take a writer epoch in {CLAIM_ATTEMPTS_MAX} attempts (other nodes kept taking them)"
    )))
}

/// The node that holds writer epoch `epoch`, if the cluster recorded it.
pub async fn epoch_holder(settings: &ClusterSettings, epoch: u64) -> Result<Option<String>> {
    let timeout = std::time::Duration::from_millis(settings.cluster_lease_ttl_s * 1000 / 4);
    let mut etcd = connect(&settings.endpoints(), timeout).await?;
    let keys = Keys::new(&settings.cluster_name);
    let got = etcd.get(keys.epoch(epoch), None).await?;
    Ok(got
        .kvs()
        .first()
        .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()))
}

/// The writer epochs of node `node_id` before `current` whose data its store holds: every
/// one it took but those its slots' new owners adopt or adopted (a node the cluster lost
/// and that came back holds none of their slots' keys).
pub async fn earlier_epochs(
    settings: &ClusterSettings,
    node_id: &str,
    current: u64,
) -> Result<Vec<u64>> {
    let timeout = std::time::Duration::from_millis(settings.cluster_lease_ttl_s * 1000 / 4);
    let mut etcd = connect(&settings.endpoints(), timeout).await?;
    let keys = Keys::new(&settings.cluster_name);
    let adopted: Vec<u64> = match etcd.get(keys.slots(), None).await?.kvs().first() {
        Some(kv) => SlotMap::decode(kv.value())?
            .lost_nodes()
            .iter()
            .filter(|n| n.id == node_id)
            .flat_map(|n| n.epochs.iter().map(|&(e, _)| e))
            .collect(),
        None => Vec::new(),
    };
    let mut out = epochs_of(&etcd, &keys, node_id).await?;
    out.retain(|e| *e < current && !adopted.contains(e));
    Ok(out)
}

/// The writer epochs node `id` took, oldest first (those the cluster still records).
pub(crate) async fn epochs_of(etcd: &Client, keys: &Keys, id: &str) -> Result<Vec<u64>> {
    let prefix = keys.epochs();
    let r = etcd
        .clone()
        .get(prefix.as_str(), Some(GetOptions::new().with_prefix()))
        .await?;
    let mut out: Vec<u64> = r
        .kvs()
        .iter()
        .filter(|kv| kv.value() == id.as_bytes())
        .filter_map(|kv| {
            std::str::from_utf8(&kv.key()[prefix.len()..])
                .ok()?
                .parse()
                .ok()
        })
        .collect();
    out.sort_unstable();
    Ok(out)
}

fn parse_epoch(v: &[u8]) -> Result<u64> {
    std::str::from_utf8(v)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| Error::Corrupt("the writer epoch counter is not a number".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a real etcd: every claim, concurrent or not, gets an epoch no other got, and
    /// the cluster remembers whose it is.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_start_takes_an_epoch_of_its_own() {
        let etcd = strata_testkit::Etcd::start();
        let settings = ClusterSettings {
            cluster_etcd: etcd.url.clone(),
            cluster_name: "epochs".into(),
            ..Default::default()
        };
        let claims: Vec<_> = (0..8)
            .map(|i| {
                let s = settings.clone();
                tokio::spawn(async move { claim_epoch(&s, &format!("node-{i}")).await.unwrap() })
            })
            .collect();
        let mut got = Vec::new();
        for c in claims {
            got.push(c.await.unwrap());
        }
        got.sort_unstable();
        assert_eq!(got, (1..=8).collect::<Vec<_>>());
        let holder = epoch_holder(&settings, got[3]).await.unwrap().unwrap();
        assert!(holder.starts_with("node-"), "{holder}");
        assert_eq!(claim_epoch(&settings, "again").await.unwrap(), 9);
        assert_eq!(
            epoch_holder(&settings, 9).await.unwrap().as_deref(),
            Some("again")
        );
        assert_eq!(epoch_holder(&settings, 99).await.unwrap(), None);
    }
}
