//! The feed's thread: it owns the ZMQ sockets (a PUB socket for the batches, a ROUTER
//! socket for replays), takes events off a bounded queue, sends them in batches with
//! consecutive sequence numbers, and keeps the newest batches for replay.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::event::{encode_batch, Event};
use crate::listing::{HookSlot, Lister};
use crate::queue::{FeedStats, Item};
use crate::settings::{binds, FeedSettings};

/// Most events one batch carries.
const BATCH_EVENTS_MAX: usize = 1024;
/// How long the thread sleeps between two looks at the queue and the replay socket while
/// events come, and while none do. It sleeps rather than waits on the queue: a sender then
/// never wakes it (a wake-up per event cost the server a third of its `KVC.PUT` rate on one
/// core), and what came meanwhile goes out as one batch.
const TICK_BUSY: Duration = Duration::from_millis(1);
const TICK_IDLE: Duration = Duration::from_millis(5);
/// The sequence a replay ends with: -1 as a signed 8-byte big-endian integer.
pub const END_SEQ: [u8; 8] = [0xff; 8];

pub(crate) struct Sockets {
    publish: zmq::Socket,
    replay: Option<zmq::Socket>,
    _ctx: zmq::Context,
}

/// Opens the sockets (in the caller's thread, so a bad address fails the start).
pub(crate) fn open(s: &FeedSettings) -> Result<Sockets, String> {
    let ctx = zmq::Context::new();
    let err = |what: &str, e: zmq::Error| format!("{what}: {e}");
    let publish = ctx.socket(zmq::PUB).map_err(|e| err("PUB socket", e))?;
    publish
        .set_sndhwm(s.kv_events_hwm as i32)
        .map_err(|e| err("kv_events_hwm", e))?;
    publish.set_linger(0).map_err(|e| err("linger", e))?;
    let ep = &s.kv_events_endpoint;
    if binds(ep) {
        publish.bind(ep)
    } else {
        publish.connect(ep)
    }
    .map_err(|e| err(&format!("kv_events_endpoint {ep}"), e))?;
    let replay = match s.kv_events_replay_endpoint.as_str() {
        "" => None,
        rep => {
            let r = ctx
                .socket(zmq::ROUTER)
                .map_err(|e| err("ROUTER socket", e))?;
            r.set_linger(0).map_err(|e| err("linger", e))?;
            r.bind(rep)
                .map_err(|e| err(&format!("kv_events_replay_endpoint {rep}"), e))?;
            Some(r)
        }
    };
    Ok(Sockets {
        publish,
        replay,
        _ctx: ctx,
    })
}

pub(crate) struct Publisher {
    pub sockets: Sockets,
    pub settings: FeedSettings,
    pub queue: Receiver<Item>,
    /// For the listers it hands out.
    pub sender: Sender<Item>,
    pub stats: Arc<FeedStats>,
    pub hook: HookSlot,
    next_seq: u64,
    kept: VecDeque<(u64, Arc<Vec<u8>>)>,
}

impl Publisher {
    pub fn new(
        sockets: Sockets,
        settings: FeedSettings,
        (sender, queue): (Sender<Item>, Receiver<Item>),
        stats: Arc<FeedStats>,
        hook: HookSlot,
    ) -> Self {
        Publisher {
            sockets,
            settings,
            queue,
            sender,
            stats,
            hook,
            next_seq: 0,
            kept: VecDeque::new(),
        }
    }

    /// Runs for as long as the process does.
    pub fn run(mut self) {
        loop {
            self.answer_requests();
            let mut events = Vec::new();
            let mut busy = false;
            // Never disconnected: this thread holds a sender for its listers.
            while let Ok(item) = self.queue.try_recv() {
                self.take(item, &mut events);
                busy = true;
                if events.len() >= BATCH_EVENTS_MAX {
                    self.publish(&std::mem::take(&mut events));
                }
            }
            if !events.is_empty() {
                self.publish(&events);
            }
            std::thread::sleep(if busy { TICK_BUSY } else { TICK_IDLE });
        }
    }

    fn take(&mut self, item: Item, events: &mut Vec<Event>) {
        let done = |st: &FeedStats, evs: &[Event]| {
            let size = evs.iter().map(Event::size).sum::<usize>();
            st.queued_bytes.fetch_sub(size, Ordering::Relaxed);
        };
        match item {
            Item::Event(e) => {
                done(&self.stats, std::slice::from_ref(&e));
                events.push(e);
            }
            Item::Listed {
                to,
                seq,
                events: listed,
            } => {
                done(&self.stats, &listed);
                let payload = encode_batch(now(), &listed, self.settings.kv_events_encoding, 0);
                self.reply(&to, &seq.to_be_bytes(), &payload);
            }
            Item::ListedEnd { to } => self.reply(&to, &END_SEQ, b""),
        }
    }

    /// Sends `[to, "", seq, payload]` on the replay socket.
    fn reply(&self, to: &[u8], seq: &[u8], payload: &[u8]) {
        if let Some(sock) = &self.sockets.replay {
            let frames: [&[u8]; 4] = [to, b"", seq, payload];
            let _ = sock.send_multipart(frames, 0);
        }
    }

    fn publish(&mut self, events: &[Event]) {
        let s = &self.settings;
        let payload = Arc::new(encode_batch(now(), events, s.kv_events_encoding, 0));
        if self.stats.lost.swap(false, Ordering::Relaxed) {
            // Events were dropped: skip a number, so subscribers see a gap that no replay
            // fills, and ask for a listing.
            self.next_seq += 1;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let seq8 = seq.to_be_bytes();
        for topic in &s.kv_events_topics {
            let frames: [&[u8]; 3] = [topic.as_bytes(), &seq8, &payload];
            // A subscriber past its high-water mark misses the batch (ZMQ's PUB drops);
            // it sees the gap and replays.
            if let Err(e) = self.sockets.publish.send_multipart(frames, zmq::DONTWAIT) {
                tracing::debug!("kv events: send: {e}");
            }
        }
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        self.stats
            .events
            .fetch_add(events.len() as u64, Ordering::Relaxed);
        self.kept.push_back((seq, payload));
        while self.kept.len() > s.kv_events_buffer_batches {
            self.kept.pop_front();
        }
    }

    /// Answers each waiting request on the replay socket: `[id, "", start seq]` gets every
    /// kept batch from `start` on as `[id, "", seq, payload]`, then `[id, "", -1, ""]`;
    /// `[id, "", "LIST"]` starts a listing (its batches carry the sequence number the live
    /// feed was at).
    fn answer_requests(&mut self) {
        let Some(sock) = &self.sockets.replay else {
            return;
        };
        while let Ok(frames) = sock.recv_multipart(zmq::DONTWAIT) {
            let [id, empty, start] = frames.as_slice() else {
                tracing::debug!("kv events: replay request of {} frames", frames.len());
                continue;
            };
            if start.eq_ignore_ascii_case(b"list") {
                self.start_listing(id);
                continue;
            }
            let Ok(start) = <[u8; 8]>::try_from(start.as_slice()) else {
                continue;
            };
            let start = u64::from_be_bytes(start);
            self.stats.replays.fetch_add(1, Ordering::Relaxed);
            for (seq, payload) in self.kept.iter().filter(|(s, _)| *s >= start) {
                let frames: [&[u8]; 4] = [id, empty, &seq.to_be_bytes(), payload];
                if sock.send_multipart(frames, 0).is_err() {
                    break;
                }
            }
            let end: [&[u8]; 4] = [id, empty, &END_SEQ, b""];
            let _ = sock.send_multipart(end, 0);
        }
    }

    fn start_listing(&self, to: &[u8]) {
        self.stats.listings.fetch_add(1, Ordering::Relaxed);
        let lister = Lister {
            to: to.to_vec(),
            seq: self.next_seq,
            queue: self.sender.clone(),
            stats: self.stats.clone(),
            room: self.settings.kv_events_queue_bytes_max as usize,
        };
        match self.hook.get() {
            Some(hook) => hook(lister),
            None => lister.finish(),
        }
    }
}

/// Seconds since the epoch, as batches carry them.
fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
