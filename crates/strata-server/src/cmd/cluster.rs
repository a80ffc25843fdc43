//! Redis Cluster's side of the protocol, on the slot map from etcd (`strata-cluster`; no
//! gossip, no bus): the redirection of every keyed command (`-MOVED`, `-CROSSSLOT`,
//! `-CLUSTERDOWN`), and `CLUSTER SLOTS|SHARDS|NODES|INFO|MYID|KEYSLOT|COUNTKEYSINSLOT|
//! GETKEYSINSLOT`, `READONLY`, `READWRITE`, `ASKING`.

use bytes::Bytes;
use strata_cluster::{Cluster, Route, SlotMap};
use strata_format::keys::{slot_of, SLOT_COUNT};
use strata_resp::Reply;

use super::ctx::{lower, parse_int, Ctx, Spec, NOQUEUE, WRITE};
use super::spec::key_positions;
use crate::session::Conn;

/// The reply that sends a command elsewhere or refuses it in cluster mode; `None` if it
/// runs here (always, outside cluster mode). Inside `MULTI`, every queued command must name
/// the slot the first one named.
pub(crate) fn redirect(
    cluster: Option<&Cluster>,
    conn: &mut Conn,
    spec: &Spec,
    a: &[Bytes],
) -> Option<Reply> {
    let cluster = cluster?;
    let asking = conn.asking;
    let Ok(at) = key_positions(spec, a) else {
        // The command's own checks answer a bad key count.
        return None;
    };
    let Some(&first) = at.first() else {
        if spec.flags & WRITE != 0 && !cluster.live() {
            return Some(down_reply(cluster));
        }
        return None;
    };
    let slot = slot_of(&a[first]);
    if at[1..].iter().any(|&i| slot_of(&a[i]) != slot) {
        return Some(cross_slot());
    }
    if conn.multi.is_some() && spec.flags & NOQUEUE == 0 {
        match conn.multi_slot {
            Some(s) if s != slot => {
                conn.multi_failed = true;
                return Some(cross_slot());
            }
            _ => conn.multi_slot = Some(slot),
        }
    }
    route_reply(cluster, slot, spec.flags & WRITE != 0, asking)
}

/// The refusal for a command on `slot` (`write`: it may change the slot's keys;
/// `asking`: it follows `ASKING`), if this node does not run it.
pub(crate) fn route_reply(
    cluster: &Cluster,
    slot: u16,
    write: bool,
    asking: bool,
) -> Option<Reply> {
    refusal_of(slot, cluster.route(slot, write, asking))
}

/// The reply that refuses a command on `slot` routed as `route` (`None`: it runs here).
pub(crate) fn refusal_of(slot: u16, route: Route) -> Option<Reply> {
    match route {
        Route::Local => None,
        Route::Moved(to) => Some(Reply::err(format!("MOVED {slot} {to}"))),
        Route::TryAgain => Some(Reply::err(format!(
            "TRYAGAIN slot {slot} is being moved to another node; retry"
        ))),
        Route::Down(why) => Some(Reply::err(why)),
    }
}

fn down_reply(cluster: &Cluster) -> Reply {
    match cluster.route(0, true, false) {
        Route::Down(why) => Reply::err(why),
        _ => Reply::err("CLUSTERDOWN The cluster is down"),
    }
}

/// A bulk string of `s`.
fn text(s: &str) -> Reply {
    Reply::Bulk(Bytes::copy_from_slice(s.as_bytes()))
}

fn cross_slot() -> Reply {
    Reply::err("CROSSSLOT Keys in request don't hash to the same slot")
}

fn disabled() -> Reply {
    Reply::err("ERR This instance has cluster support disabled")
}

/// `READONLY`, `READWRITE`: accepted in cluster mode (there are no replicas to read from).
pub(crate) async fn accept(ctx: &mut Ctx<'_>, _a: &[Bytes]) -> Reply {
    if ctx.shared.cluster.is_none() {
        return disabled();
    }
    Reply::ok()
}

/// `ASKING`: the next command may use a slot that is moving to this node.
pub(crate) async fn asking(ctx: &mut Ctx<'_>, _a: &[Bytes]) -> Reply {
    if ctx.shared.cluster.is_none() {
        return disabled();
    }
    ctx.conn.asking = true;
    Reply::ok()
}

/// `STRATA.SLOTTAKE slot`: the node a slot moves from has sent every key and hands it
/// over; this node serves it from now on (the controller's map follows).
pub(crate) async fn slottake(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    match incoming_slot(ctx, &a[1]) {
        Ok((cluster, slot)) => {
            cluster.set_slot_state(slot, strata_cluster::SlotState::Taken);
            crate::kvchunks::announce_slots(ctx.shared, vec![slot]);
            let map = cluster.map();
            if let Some(from) = map.owner(slot) {
                let from = map.id(from).to_string();
                cluster.note_move(slot, Some(strata_cluster::MoveSeen::TookFrom(from)));
            }
            Reply::ok()
        }
        Err(r) => r,
    }
}

/// The cluster and the slot argument `arg` of a command only the node a slot moves from
/// may send, if the slot is moving to this node.
fn incoming_slot(ctx: &Ctx<'_>, arg: &[u8]) -> Result<(Cluster, u16), Reply> {
    let cluster = ctx.shared.cluster.clone().ok_or_else(disabled)?;
    let slot = parse_slot(arg)?;
    if !cluster.importing(slot) {
        return Err(Reply::err(format!(
            "ERR slot {slot} is not moving to this node"
        )));
    }
    Ok((cluster, slot))
}

/// `STRATA.SLOTCLEAR slot`: the node a slot moves from asks the node it moves to to drop
/// whatever it holds of it (copies left by an earlier move) before it sends the keys.
pub(crate) async fn slotclear(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let slot = match incoming_slot(ctx, &a[1]) {
        Ok((cluster, slot)) => {
            cluster.note_move(slot, None);
            slot
        }
        Err(r) => return r,
    };
    match clear_slot(&ctx.shared.engine, slot).await {
        Ok((_, ticket)) => {
            ctx.conn.pending = ctx.conn.pending.max(ticket);
            Reply::ok()
        }
        Err(e) => super::ctx::engine_error(&e),
    }
}

/// Deletes this node's keys of slot `slot` (cluster mode keeps database 0 only): how many,
/// and the ticket that makes the deletes durable.
pub(crate) async fn clear_slot(
    engine: &strata_engine::Engine,
    slot: u16,
) -> strata_engine::Result<(u64, strata_engine::Ticket)> {
    let mut n = 0;
    let mut ticket = strata_engine::Ticket::NONE;
    loop {
        let page = engine.scan_slot(0, slot, None, SLOT_KEYS_PAGE)?;
        if page.items.is_empty() {
            return Ok((n, ticket));
        }
        for item in page.items {
            engine
                .delete(&engine.key(0, &item.key))
                .await?
                .defer(&mut ticket);
            n += 1;
        }
    }
}

/// A port for `CLUSTER NODES`' bus field: there is no bus, but tools parse the number.
fn bus_port(port: u16) -> u16 {
    if port <= 55535 {
        port + 10000
    } else {
        port - 10000
    }
}

/// Most keys `CLUSTER GETKEYSINSLOT` returns, and the page `COUNTKEYSINSLOT` counts by.
const SLOT_KEYS_PAGE: usize = 10_000;

pub(crate) async fn cluster(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    let sub = lower(&a[1]);
    if sub == "help" {
        return Reply::Array(
            [
                "CLUSTER <subcommand> [<arg> ...]. Subcommands are:",
                "INFO, MYID, SLOTS, SHARDS, NODES, KEYSLOT <key>,",
                "COUNTKEYSINSLOT <slot>, GETKEYSINSLOT <slot> <count>.",
                "The slot map lives in etcd; change it with `strata cluster`.",
            ]
            .into_iter()
            .map(|l| Reply::Simple(l.into()))
            .collect(),
        );
    }
    let Some(cluster) = ctx.shared.cluster.clone() else {
        return disabled();
    };
    let map = cluster.map();
    let me = cluster.me();
    let arity = |n: usize| a.len() == n;
    match sub.as_str() {
        "myid" if arity(2) => text(cluster.id()),
        "keyslot" if arity(3) => Reply::Integer(slot_of(&a[2]) as i64),
        "info" if arity(2) => Reply::Verbatim(info_text(&cluster, &map)),
        "slots" if arity(2) => slots(&map),
        "shards" if arity(2) => shards(&map),
        "nodes" if arity(2) => Reply::Verbatim(nodes_text(&cluster, &map, me)),
        "countkeysinslot" if arity(3) => match parse_slot(&a[2]) {
            Ok(slot) => count_in_slot(ctx, slot),
            Err(r) => r,
        },
        "getkeysinslot" if arity(4) => {
            let slot = match parse_slot(&a[2]) {
                Ok(s) => s,
                Err(r) => return r,
            };
            let count = match parse_int(&a[3]) {
                Some(n) if n >= 0 => (n as usize).min(SLOT_KEYS_PAGE),
                _ => return Reply::err("ERR Invalid number of keys"),
            };
            match ctx.shared.engine.scan_slot(ctx.conn.db, slot, None, count) {
                Ok(p) => Reply::Array(p.items.into_iter().map(|i| Reply::Bulk(i.key)).collect()),
                Err(e) => super::ctx::engine_error(&e),
            }
        }
        "myid" | "keyslot" | "info" | "slots" | "shards" | "nodes" | "countkeysinslot"
        | "getkeysinslot" => super::ctx::wrong_args(&format!("cluster|{sub}")),
        _ => Reply::err(format!("ERR unknown subcommand '{sub}'. Try CLUSTER HELP.")),
    }
}

fn parse_slot(b: &[u8]) -> Result<u16, Reply> {
    match parse_int(b) {
        Some(n) if (0..SLOT_COUNT as i64).contains(&n) => Ok(n as u16),
        _ => Err(Reply::err("ERR Invalid slot")),
    }
}

fn count_in_slot(ctx: &Ctx<'_>, slot: u16) -> Reply {
    let mut n = 0i64;
    let mut cursor: Option<Bytes> = None;
    loop {
        let page =
            match ctx
                .shared
                .engine
                .scan_slot(ctx.conn.db, slot, cursor.as_deref(), SLOT_KEYS_PAGE)
            {
                Ok(p) => p,
                Err(e) => return super::ctx::engine_error(&e),
            };
        n += page.items.len() as i64;
        match page.next {
            Some(c) => cursor = Some(c),
            None => return Reply::Integer(n),
        }
    }
}

/// The rows of `CLUSTER INFO` and `INFO cluster`'s state.
fn info_text(cluster: &Cluster, map: &SlotMap) -> String {
    let assigned = SLOT_COUNT as usize - map.unassigned();
    let ok = assigned == SLOT_COUNT as usize && cluster.live();
    let size = map.slot_counts().iter().filter(|&&n| n > 0).count();
    let rows: [(&str, String); 11] = [
        ("cluster_state", if ok { "ok" } else { "fail" }.into()),
        ("cluster_slots_assigned", assigned.to_string()),
        ("cluster_slots_ok", assigned.to_string()),
        ("cluster_slots_pfail", "0".into()),
        ("cluster_slots_fail", "0".into()),
        ("cluster_known_nodes", map.node_count().max(1).to_string()),
        ("cluster_size", size.to_string()),
        ("cluster_current_epoch", map.epoch.to_string()),
        ("cluster_my_epoch", map.epoch.to_string()),
        ("cluster_stats_messages_sent", "0".into()),
        ("cluster_stats_messages_received", "0".into()),
    ];
    rows.iter().map(|(k, v)| format!("{k}:{v}\r\n")).collect()
}

fn node_entry(map: &SlotMap, node: usize) -> Reply {
    let addr = map.addr(node);
    Reply::Array(vec![
        text(&addr.host),
        Reply::Integer(addr.port as i64),
        text(map.id(node)),
        Reply::Array(vec![]),
    ])
}

/// `CLUSTER SLOTS`: `[first, last, [host, port, id, {}]]` per range.
fn slots(map: &SlotMap) -> Reply {
    Reply::Array(
        map.ranges()
            .into_iter()
            .map(|r| {
                Reply::Array(vec![
                    Reply::Integer(r.first as i64),
                    Reply::Integer(r.last as i64),
                    node_entry(map, r.node),
                ])
            })
            .collect(),
    )
}

/// `CLUSTER SHARDS`: one shard per node (no replicas), its slots as a flat list of range
/// ends, and the node.
fn shards(map: &SlotMap) -> Reply {
    let ranges = map.ranges();
    Reply::Array(
        (0..map.node_count())
            .map(|n| {
                let slots: Vec<Reply> = ranges
                    .iter()
                    .filter(|r| r.node == n)
                    .flat_map(|r| {
                        [
                            Reply::Integer(r.first as i64),
                            Reply::Integer(r.last as i64),
                        ]
                    })
                    .collect();
                let addr = map.addr(n);
                let node = Reply::Map(vec![
                    (Reply::bulk("id"), text(map.id(n))),
                    (Reply::bulk("port"), Reply::Integer(addr.port as i64)),
                    (Reply::bulk("ip"), text(&addr.host)),
                    (Reply::bulk("endpoint"), text(&addr.host)),
                    (Reply::bulk("role"), Reply::bulk("master")),
                    (Reply::bulk("replication-offset"), Reply::Integer(0)),
                    (Reply::bulk("health"), Reply::bulk("online")),
                ]);
                Reply::Map(vec![
                    (Reply::bulk("slots"), Reply::Array(slots)),
                    (Reply::bulk("nodes"), Reply::Array(vec![node])),
                ])
            })
            .collect(),
    )
}

/// `CLUSTER NODES`: Redis's line per node (`id host:port@bus flags master ping pong epoch
/// link slots...`); this node first if the map does not name it yet.
fn nodes_text(cluster: &Cluster, map: &SlotMap, me: Option<usize>) -> String {
    let ranges = map.ranges();
    let line = |id: &str, host: &str, port: u16, myself: bool, slots: String| {
        let flags = if myself { "myself,master" } else { "master" };
        format!(
            "{id} {host}:{port}@{} {flags} - 0 0 {} connected{slots}\n",
            bus_port(port),
            map.epoch
        )
    };
    let mut out = String::new();
    if me.is_none() {
        let a = cluster.addr();
        out.push_str(&line(cluster.id(), &a.host, a.port, true, String::new()));
    }
    for n in 0..map.node_count() {
        let slots: String = ranges
            .iter()
            .filter(|r| r.node == n)
            .map(|r| {
                if r.first == r.last {
                    format!(" {}", r.first)
                } else {
                    format!(" {}-{}", r.first, r.last)
                }
            })
            .collect();
        let a = map.addr(n);
        out.push_str(&line(map.id(n), &a.host, a.port, me == Some(n), slots));
    }
    out
}
