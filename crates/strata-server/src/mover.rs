//! Slot moves, from the source node's side. When the map says slots move from this node to
//! another, each slot in turn: writes to it get `-TRYAGAIN` (and the gate is taken once,
//! so no write that passed the routing check before is still running), the target drops
//! whatever it held of the slot (`STRATA.SLOTCLEAR`), every key goes over with `DUMP` →
//! `ASKING` + `RESTORE ... REPLACE ABSTTL`, the target takes the slot (`STRATA.SLOTTAKE`)
//! and from then on clients are sent to it with `-MOVED`. Each batch of copied slots is
//! reported to the controller, which gives them to the target in the map; the source then
//! deletes its copies. If the move is dropped (an end stopped living), the slots go back
//! to being served where the map says, and a node drops what it no longer serves. Before a
//! move's first slot, the target is given the source's pins (`PIN pattern`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use strata_cluster::{Cluster, MoveSeen, SlotState};
use strata_format::keys::SLOT_COUNT;
use strata_resp::Reply;

use crate::cmd::{self, Ctx};
use crate::link::Link;
use crate::session::{Conn, Peer};
use crate::shared::Shared;

/// Keys read and sent per round trip to the target.
const PAGE_KEYS: usize = 256;
/// Slots copied between two reports to the controller (and lines of progress in the log).
const REPORT_SLOTS: u16 = 64;

/// Runs as long as the server: carries out the moves away from this node.
pub(crate) async fn run(shared: Arc<Shared>, cluster: Cluster) {
    let mut changes = cluster.map_changes();
    let mut internal = Conn::new(0, Peer::Unix(Arc::from("slot-mover")), true);
    loop {
        if let Err(e) = round(&shared, &cluster, &mut internal).await {
            tracing::warn!(error = %e, "moving slots failed; retrying");
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), changes.changed()).await;
    }
}

async fn round(shared: &Arc<Shared>, cluster: &Cluster, internal: &mut Conn) -> Result<(), String> {
    let map = cluster.map();
    let me = cluster.me();
    // Slots whose move ended or changed: given away (drop the copies here), taken over
    // (serve them as this node's), or dropped (serve them again, or drop what was taken).
    for slot in 0..SLOT_COUNT {
        let state = cluster.slot_state(slot);
        let mine = me.is_some() && map.owner(slot) == me;
        let target = map.moving_to(slot);
        let goes_on = match state {
            SlotState::Serving => true,
            SlotState::Copying | SlotState::Handed => mine && target.is_some(),
            SlotState::Taken => !mine && target.is_some() && target == me,
        };
        if goes_on {
            continue;
        }
        if !mine {
            drop_slot(shared, slot).await?;
            cluster.note_move(slot, None);
        }
        cluster.set_slot_state(slot, SlotState::Serving);
    }
    let Some(me) = me else { return Ok(()) };
    for mv in map.moves().into_iter().filter(|m| m.from == me) {
        let pending: Vec<u16> = (mv.first..=mv.last)
            .filter(|&s| cluster.slot_state(s) != SlotState::Handed)
            .collect();
        if pending.is_empty() {
            continue;
        }
        let target = map.addr(mv.to).clone();
        tracing::info!(
            first = mv.first,
            last = mv.last,
            to = %target.endpoint(),
            "moving slots"
        );
        let password = shared.cfg.read().requirepass.clone();
        let mut link = Link::connect(&target.endpoint(), &password).await?;
        // Pins go with the keys: the target pins this node's patterns (where it has one
        // already, nothing changes), so keys held warm here stay warm there.
        for p in shared.engine.pins() {
            if let Err(e) = link.call(&[b"PIN", &p]).await {
                tracing::warn!(
                    pattern = %String::from_utf8_lossy(&p),
                    error = %e,
                    "the target did not take a pin; the pattern's keys move unpinned"
                );
            }
        }
        for chunk in pending.chunks(REPORT_SLOTS as usize) {
            // The map may have moved on meanwhile.
            let now = cluster.map();
            let still = |&s: &u16| now.owner(s) == Some(me) && now.moving_to(s) == Some(mv.to);
            if !chunk.iter().all(still) {
                return Ok(());
            }
            let started = Instant::now();
            let to = now.id(mv.to).to_string();
            let bytes = copy_slots(shared, cluster, internal, (&mut link, to), chunk).await?;
            // Chunks of consecutive slots: report each run of the chunk.
            for (a, b) in runs(chunk) {
                cluster
                    .report_moved(a, b)
                    .await
                    .map_err(|e| format!("cannot report slots {a}-{b} moved: {e}"))?;
            }
            tracing::info!(
                first = chunk[0],
                last = chunk[chunk.len() - 1],
                bytes,
                ms = started.elapsed().as_millis() as u64,
                "slots copied"
            );
        }
    }
    Ok(())
}

/// Consecutive runs in sorted `slots`.
fn runs(slots: &[u16]) -> Vec<(u16, u16)> {
    let mut out: Vec<(u16, u16)> = Vec::new();
    for &s in slots {
        match out.last_mut() {
            Some((_, b)) if *b + 1 == s => *b = s,
            _ => out.push((s, s)),
        }
    }
    out
}

/// Most bytes of values sent to the target in one round trip.
const FLUSH_BYTES: usize = 1 << 20;

/// Copies `slots` to the target of `link`, one after the other; the value bytes sent. Each
/// slot blocks its writes only from the start of its copy to the round trip that carries
/// its last key and `STRATA.SLOTTAKE`: commands for several slots share round trips. On
/// an error every slot not handed over is served here again. `target`: the link to the
/// node the slots move to, and its id.
async fn copy_slots(
    shared: &Arc<Shared>,
    cluster: &Cluster,
    internal: &mut Conn,
    target: (&mut Link, String),
    slots: &[u16],
) -> Result<u64, String> {
    let (link, to) = target;
    let mut out = Outbox {
        to,
        ..Outbox::default()
    };
    let result = async {
        let rate = cluster.settings().cluster_move_bytes_per_s.max(1);
        let started = Instant::now();
        let mut sent = 0u64;
        for &slot in slots {
            cluster.set_slot_state(slot, SlotState::Copying);
            cluster.note_move(slot, Some(MoveSeen::CopyingTo(out.to.clone())));
            // Commands that passed the routing check before the state changed run under
            // the gate: once it is ours, none is left, and later writes get -TRYAGAIN.
            drop(shared.gate.write().await);
            // Clients blocked on the slot's keys try again, and are redirected.
            shared.blocked.wake_slot(slot);
            out.push(
                cmd_of(&[b"STRATA.SLOTCLEAR", slot.to_string().as_bytes()]),
                0,
            );
            let mut cursor: Option<Bytes> = None;
            loop {
                let page = shared
                    .engine
                    .scan_slot(0, slot, cursor.as_deref(), PAGE_KEYS)
                    .map_err(|e| format!("cannot list slot {slot}: {e}"))?;
                for item in &page.items {
                    let Some((payload, expire_at)) = dump(shared, internal, &item.key).await?
                    else {
                        continue;
                    };
                    sent += payload.len() as u64;
                    let len = payload.len();
                    let mut restore = vec![
                        Bytes::from_static(b"RESTORE"),
                        item.key.clone(),
                        Bytes::from(expire_at.to_string()),
                        payload,
                        Bytes::from_static(b"REPLACE"),
                    ];
                    if expire_at > 0 {
                        restore.push(Bytes::from_static(b"ABSTTL"));
                    }
                    out.push(vec![Bytes::from_static(b"ASKING")], 0);
                    out.push(restore, len);
                    if out.full() {
                        out.flush(cluster, link).await?;
                        // The rate limit: no faster than cluster_move_bytes_per_s.
                        let due = Duration::from_secs_f64(sent as f64 / rate as f64);
                        if let Some(wait) = due.checked_sub(started.elapsed()) {
                            tokio::time::sleep(wait).await;
                        }
                    }
                }
                match page.next {
                    Some(n) => cursor = Some(n),
                    None => break,
                }
            }
            out.push(
                cmd_of(&[b"STRATA.SLOTTAKE", slot.to_string().as_bytes()]),
                0,
            );
            out.taking.push(slot);
        }
        out.flush(cluster, link).await?;
        Ok(sent)
    }
    .await;
    if result.is_err() {
        for &slot in slots {
            if cluster.slot_state(slot) == SlotState::Copying {
                cluster.set_slot_state(slot, SlotState::Serving);
            }
        }
    }
    result
}

fn cmd_of(args: &[&[u8]]) -> Vec<Bytes> {
    args.iter().map(|a| Bytes::copy_from_slice(a)).collect()
}

/// Commands waiting to go to the target, and the slots whose hand-over they carry.
#[derive(Default)]
struct Outbox {
    cmds: Vec<Vec<Bytes>>,
    bytes: usize,
    taking: Vec<u16>,
    /// The id of the node the slots move to.
    to: String,
}

impl Outbox {
    fn push(&mut self, cmd: Vec<Bytes>, bytes: usize) {
        self.cmds.push(cmd);
        self.bytes += bytes;
    }

    fn full(&self) -> bool {
        self.cmds.len() >= 2 * PAGE_KEYS || self.bytes >= FLUSH_BYTES
    }

    /// Sends what waits; once the target took them, the slots handed over send clients on.
    async fn flush(&mut self, cluster: &Cluster, link: &mut Link) -> Result<(), String> {
        link.pipeline(&self.cmds).await?;
        for &slot in &self.taking {
            cluster.set_slot_state(slot, SlotState::Handed);
            cluster.note_move(slot, Some(MoveSeen::HandedTo(self.to.clone())));
        }
        self.cmds.clear();
        self.bytes = 0;
        self.taking.clear();
        Ok(())
    }
}

/// `DUMP key` and `PEXPIRETIME key` as this server answers them: the payload and the
/// expiry (Unix ms, 0 for none); `None` if the key is gone.
async fn dump(
    shared: &Arc<Shared>,
    internal: &mut Conn,
    key: &Bytes,
) -> Result<Option<(Bytes, i64)>, String> {
    let mut ctx = cmd::ctx(shared, internal);
    let payload = match run_one(&mut ctx, "dump", key).await {
        Reply::Bulk(b) => b,
        Reply::Null => return Ok(None),
        other => return Err(format!("DUMP failed: {other:?}")),
    };
    let expire_at = match run_one(&mut ctx, "pexpiretime", key).await {
        Reply::Integer(n) if n >= 0 => n,
        Reply::Integer(-1) => 0,
        Reply::Integer(_) => return Ok(None),
        other => return Err(format!("PEXPIRETIME failed: {other:?}")),
    };
    Ok(Some((payload, expire_at)))
}

/// Runs command `name` on `key` through the command table, as a client's would run.
async fn run_one(ctx: &mut Ctx<'_>, name: &'static str, key: &Bytes) -> Reply {
    let args = [Bytes::from_static(name.as_bytes()), key.clone()];
    let idx = cmd::lookup(name.as_bytes()).expect("in the command table");
    cmd::dispatch(ctx, idx, &args).await
}

/// Deletes this node's keys of slot `slot` (it belongs to another node now).
async fn drop_slot(shared: &Arc<Shared>, slot: u16) -> Result<(), String> {
    // Not waited for: a copy a crash brings back is dropped again, or cleared before the
    // slot ever moves back here.
    let (n, _) = cmd::clear_slot(&shared.engine, slot)
        .await
        .map_err(|e| format!("cannot drop slot {slot}: {e}"))?;
    if n > 0 {
        tracing::info!(
            slot,
            keys = n,
            "dropped the copies of a slot that moved away"
        );
    }
    Ok(())
}
