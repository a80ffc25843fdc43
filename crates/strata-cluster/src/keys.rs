//! The cluster's keys in etcd, all under `/strata/<cluster_name>/`, and the connection to it.

use std::time::Duration;

use etcd_client::{Client, ConnectOptions};

use crate::Result;

/// The etcd keys of one cluster.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    root: String,
}

impl Keys {
    pub(crate) fn new(cluster_name: &str) -> Keys {
        Keys {
            root: format!("/strata/{cluster_name}/"),
        }
    }
    /// The slot map (JSON, [`crate::SlotMap`]); its revision versions it.
    pub(crate) fn slots(&self) -> String {
        format!("{}slots", self.root)
    }
    /// Live nodes: `nodes/<id>` → address (JSON), bound to the node's lease.
    pub(crate) fn nodes(&self) -> String {
        format!("{}nodes/", self.root)
    }
    pub(crate) fn node(&self, id: &str) -> String {
        format!("{}{id}", self.nodes())
    }
    /// The controller's id, bound to its lease.
    pub(crate) fn controller(&self) -> String {
        format!("{}controller", self.root)
    }
    /// A source node's report that it copied slots `first..=last` to their target:
    /// `moved/<from id>/<first>-<last>`.
    pub(crate) fn moved_prefix(&self) -> String {
        format!("{}moved/", self.root)
    }
    pub(crate) fn moved(&self, from: &str, first: u16, last: u16) -> String {
        format!("{}{from}/{first}-{last}", self.moved_prefix())
    }
    /// The last writer epoch taken (`epochs.rs`).
    pub(crate) fn epoch_counter(&self) -> String {
        format!("{}epoch", self.root)
    }
    /// Which node holds writer epoch `e`: `epochs/<e>` → node id (not bound to a lease).
    pub(crate) fn epoch(&self, e: u64) -> String {
        format!("{}epochs/{e:010}", self.root)
    }
    /// A node's report that it adopted slots `first..=last` from a lost node's bucket log:
    /// `adopted/<id>/<first>-<last>`.
    pub(crate) fn adopted_prefix(&self) -> String {
        format!("{}adopted/", self.root)
    }
    pub(crate) fn adopted(&self, by: &str, first: u16, last: u16) -> String {
        format!("{}{by}/{first}-{last}", self.adopted_prefix())
    }
    /// Every writer epoch taken, `epochs/<e>` → the node that holds it.
    pub(crate) fn epochs(&self) -> String {
        format!("{}epochs/", self.root)
    }
    /// An operator's request (`rebalance`), and the controller's answer.
    pub(crate) fn request(&self, what: &str) -> String {
        format!("{}requests/{what}", self.root)
    }
    pub(crate) fn answer(&self, what: &str) -> String {
        format!("{}answers/{what}", self.root)
    }
}

/// Connects to etcd; every request gives up after `timeout`.
pub(crate) async fn connect(endpoints: &[String], timeout: Duration) -> Result<Client> {
    let opts = ConnectOptions::new()
        .with_connect_timeout(timeout)
        .with_timeout(timeout);
    Ok(Client::connect(endpoints, Some(opts)).await?)
}

/// A report a node left under a prefix (`<prefix><node>/<first>-<last>`): its key, the
/// node, and the slot range (`None` where the key does not parse).
pub(crate) struct Report {
    pub(crate) key: String,
    pub(crate) from: Option<String>,
    pub(crate) range: Option<(u16, u16)>,
}

/// Every report under `prefix`.
pub(crate) async fn reports(etcd: &Client, prefix: &str) -> Result<Vec<Report>> {
    let r = etcd
        .clone()
        .get(prefix, Some(etcd_client::GetOptions::new().with_prefix()))
        .await?;
    Ok(r.kvs()
        .iter()
        .map(|kv| {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let split = key[prefix.len()..].split_once('/');
            let range = split
                .and_then(|(_, r)| r.split_once('-'))
                .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)));
            let from = split.map(|(f, _)| f.to_string());
            Report { key, from, range }
        })
        .collect())
}
