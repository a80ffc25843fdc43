//! Joining the cluster: the node's membership (`member`) and its candidacy for controller
//! (`controller`), which stands on the membership.

use std::sync::Arc;

use crate::controller;
use crate::member::{Cluster, Inner, SharedBucket};
use crate::slots::NodeAddr;
use crate::{ClusterSettings, Result};

impl Cluster {
    /// Joins the cluster: connects to etcd, takes a lease, registers this node's address,
    /// reads the slot map, then keeps the lease alive, watches the map and stands for
    /// controller in tasks of its own until the process ends. As controller it fences a
    /// lost node's writer epochs in `bucket` before its slots go to others, whose new
    /// owners then adopt them from its bucket log, and deletes them once they have.
    pub async fn join(
        settings: &ClusterSettings,
        id: String,
        addr: NodeAddr,
        bucket: Option<Arc<dyn SharedBucket>>,
    ) -> Result<Cluster> {
        let inner = Inner::start(settings, id, addr, bucket).await?;
        tokio::spawn(controller::run(Arc::clone(&inner)));
        Ok(Cluster { inner })
    }
}
