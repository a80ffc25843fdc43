//! What an operator asks of a cluster from outside it (`strata cluster ...`): its status,
//! and requests the controller carries out (`rebalance`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::controller::{Answer, Request};
use crate::keys::{connect, Keys};
use crate::member::live_nodes;
use crate::slots::{NodeAddr, SlotMap};
use crate::{split_endpoints, Error, Result};

/// Timeout of each request to etcd from the operator's tools.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a request waits with no live node before it gives up.
const NO_NODE_WAIT: Duration = Duration::from_secs(10);

/// Most slot ranges `status` prints per node.
const RANGES_SHOWN_MAX: usize = 8;

/// A cluster as etcd describes it.
#[derive(Debug, Clone)]
pub struct Status {
    pub live: BTreeMap<String, NodeAddr>,
    pub controller: Option<String>,
    pub map: Option<SlotMap>,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "controller: {}",
            self.controller.as_deref().unwrap_or("(none)")
        )?;
        let Some(map) = &self.map else {
            writeln!(f, "slot map: none yet (run `strata cluster rebalance`)")?;
            for (id, a) in &self.live {
                writeln!(f, "  {id} {} live, no slots", a.endpoint())?;
            }
            return Ok(());
        };
        writeln!(
            f,
            "slot map: epoch {}, {} of 16384 slots served",
            map.epoch,
            16384 - map.unassigned()
        )?;
        let counts = map.slot_counts();
        for (i, n) in counts.iter().enumerate() {
            let id = map.id(i);
            let state = if self.live.contains_key(id) {
                "live"
            } else {
                "LEASE EXPIRED"
            };
            let ranges: Vec<String> = map
                .ranges()
                .iter()
                .filter(|r| r.node == i)
                .map(|r| format!("{}-{}", r.first, r.last))
                .collect();
            let shown = if ranges.len() > RANGES_SHOWN_MAX {
                format!(
                    "{} ... ({} ranges)",
                    ranges[..RANGES_SHOWN_MAX].join(" "),
                    ranges.len()
                )
            } else {
                ranges.join(" ")
            };
            writeln!(
                f,
                "  {id} {} {state}, {n} slots: {shown}",
                map.addr(i).endpoint()
            )?;
        }
        for lost in map.lost_nodes() {
            let n = (0..16384u16)
                .filter(|&s| map.adopting(s).is_some_and(|l| l.id == lost.id))
                .count();
            writeln!(
                f,
                "  adopting {n} slots from lost node {} (its bucket log; they answer -TRYAGAIN until adopted)",
                lost.id
            )?;
        }
        for mv in map.moves() {
            writeln!(
                f,
                "  moving {}-{} from {} to {}",
                mv.first,
                mv.last,
                map.addr(mv.from).endpoint(),
                map.addr(mv.to).endpoint()
            )?;
        }
        for (id, a) in &self.live {
            if map.index_of(id).is_none() {
                writeln!(f, "  {id} {} live, no slots", a.endpoint())?;
            }
        }
        Ok(())
    }
}

/// The status of cluster `name` on the etcd at `endpoints` (comma-separated).
pub async fn status(endpoints: &str, name: &str) -> Result<Status> {
    let etcd = connect(&split_endpoints(endpoints), REQUEST_TIMEOUT).await?;
    read_status(&etcd, &Keys::new(name)).await
}

async fn read_status(etcd: &etcd_client::Client, keys: &Keys) -> Result<Status> {
    let live = live_nodes(etcd, keys).await?;
    let mut c = etcd.clone();
    let controller = c
        .get(keys.controller(), None)
        .await?
        .kvs()
        .first()
        .map(|kv| String::from_utf8_lossy(kv.value()).into_owned());
    let map = match c.get(keys.slots(), None).await?.kvs().first() {
        Some(kv) => Some(SlotMap::decode(kv.value())?),
        None => None,
    };
    Ok(Status {
        live,
        controller,
        map,
    })
}

/// Asks the controller of cluster `name` to spread the slots over the live nodes: the first
/// time it creates the map; later it moves slots (with their keys) until each node holds
/// its share. Waits up to `wait` for the answer, calling `progress` about once a second
/// with what is moving. The answer's message on success.
pub async fn rebalance(
    endpoints: &str,
    name: &str,
    wait: Duration,
    progress: impl FnMut(&str),
) -> Result<String> {
    ask(endpoints, name, "rebalance", None, wait, progress).await
}

/// Asks the controller to move every slot of node `node` to the others; once it answers,
/// the node can be stopped.
pub async fn remove_node(
    endpoints: &str,
    name: &str,
    node: &str,
    wait: Duration,
    progress: impl FnMut(&str),
) -> Result<String> {
    crate::check_node_id(node)?;
    ask(
        endpoints,
        name,
        "remove-node",
        Some(node.to_string()),
        wait,
        progress,
    )
    .await
}

async fn ask(
    endpoints: &str,
    name: &str,
    what: &str,
    node: Option<String>,
    wait: Duration,
    mut progress: impl FnMut(&str),
) -> Result<String> {
    let etcd = connect(&split_endpoints(endpoints), REQUEST_TIMEOUT).await?;
    let keys = Keys::new(name);
    let id = format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    );
    let mut c = etcd.clone();
    let req = serde_json::to_vec(&Request {
        id: id.clone(),
        node,
    })
    .expect("a request encodes");
    c.put(keys.request(what), req, None).await?;
    let start = Instant::now();
    // The first progress line comes at the first poll, then one a second.
    let mut last_report: Option<Instant> = None;
    loop {
        if let Some(kv) = c.get(keys.answer(what), None).await?.kvs().first() {
            if let Ok(a) = serde_json::from_slice::<Answer>(kv.value()) {
                if a.id == id {
                    return if a.ok {
                        Ok(a.message)
                    } else {
                        Err(Error::Invalid(a.message))
                    };
                }
            }
        }
        if start.elapsed() > wait {
            return Err(Error::Invalid(format!(
                "no answer from the controller in {} s: is any node of cluster '{name}' running?",
                wait.as_secs()
            )));
        }
        if last_report.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
            let st = read_status(&etcd, &keys).await?;
            if st.live.is_empty() && start.elapsed() > NO_NODE_WAIT {
                return Err(Error::Invalid(format!(
                    "no node of cluster '{name}' is live to carry the request out"
                )));
            }
            let moving: usize = st
                .map
                .as_ref()
                .map(|m| {
                    m.moves()
                        .iter()
                        .map(|mv| (mv.last - mv.first + 1) as usize)
                        .sum()
                })
                .unwrap_or(0);
            progress(&format!(
                "{} s: {} live nodes, {moving} slots moving, map epoch {}",
                start.elapsed().as_secs(),
                st.live.len(),
                st.map.as_ref().map_or(0, |m| m.epoch)
            ));
            last_report = Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
