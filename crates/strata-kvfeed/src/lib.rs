//! The KV-cache pool's event feed: what chunks this node holds, announced to KV-aware
//! routers (llm-d, Dynamo, ...) in vLLM's KV-event format, over ZMQ.
//!
//! - [`event`]: the events (`BlockStored`, `BlockRemoved`, `AllBlocksCleared`) and their
//!   msgpack encoding, as positional arrays or maps.
//! - [`blocks`]: a chunk cut into blocks of `kv_events_block_size` tokens, with ids.
//! - `publisher`: the thread that owns the sockets: batches with consecutive sequence
//!   numbers on a PUB socket, the newest `kv_events_buffer_batches` kept for replay on a
//!   ROUTER socket.
//!
//! [`Feed::send`] never blocks: past `kv_events_queue_bytes_max` of waiting events it drops
//! the event, counts it, and the next batch's sequence number skips one.

pub mod blocks;
pub mod event;
mod listing;
mod publisher;
mod queue;
mod settings;

use std::sync::atomic::Ordering;
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;

use queue::Item;

pub use event::{Encoding, Event, Medium};
pub use listing::{Lister, ListingHook};
pub use publisher::END_SEQ;
pub use queue::FeedStats;
pub use settings::{binds, FeedSettings};

/// The sending side of the feed, shared by every connection. Its thread runs for as long
/// as the process.
#[derive(Clone)]
pub struct Feed {
    queue: Sender<Item>,
    hook: listing::HookSlot,
    stats: Arc<FeedStats>,
    queue_bytes_max: usize,
    block_size: u32,
}

impl Feed {
    /// Opens the sockets and starts the feed's thread; `None` when the feed is off.
    pub fn start(settings: &FeedSettings) -> Result<Option<Feed>, String> {
        if settings.kv_events_endpoint.is_empty() {
            return Ok(None);
        }
        settings.validate()?;
        let sockets = publisher::open(settings)?;
        let (queue, rx) = channel();
        let stats = Arc::new(FeedStats::default());
        let hook = listing::HookSlot::default();
        let p = publisher::Publisher::new(
            sockets,
            settings.clone(),
            (queue.clone(), rx),
            stats.clone(),
            hook.clone(),
        );
        std::thread::Builder::new()
            .name("strata-kvfeed".into())
            .spawn(move || p.run())
            .map_err(|e| format!("kv events thread: {e}"))?;
        Ok(Some(Feed {
            queue,
            hook,
            stats,
            queue_bytes_max: settings.kv_events_queue_bytes_max as usize,
            block_size: settings.kv_events_block_size,
        }))
    }

    /// Queues `event`; drops it (and counts the drop) when the queue is full.
    pub fn send(&self, event: Event) {
        let size = event.size();
        let st = &self.stats;
        if st.queued_bytes.fetch_add(size, Ordering::Relaxed) + size > self.queue_bytes_max {
            st.queued_bytes.fetch_sub(size, Ordering::Relaxed);
            st.dropped.fetch_add(1, Ordering::Relaxed);
            st.lost.store(true, Ordering::Relaxed);
            return;
        }
        if self.queue.send(Item::Event(event)).is_err() {
            st.queued_bytes.fetch_sub(size, Ordering::Relaxed);
        }
    }

    /// Announces chunk `chunk` (its hash as the client names it), whose parent chunk is
    /// `parent`, holding `tokens`, as stored in `medium`.
    pub fn stored(&self, chunk: &[u8], parent: Option<&[u8]>, tokens: Vec<u32>, medium: Medium) {
        self.send(self.stored_event(chunk, parent, tokens, medium));
    }

    /// The event [`Feed::stored`] sends (a listing sends it to one router).
    pub fn stored_event(
        &self,
        chunk: &[u8],
        parent: Option<&[u8]>,
        tokens: Vec<u32>,
        medium: Medium,
    ) -> Event {
        let n = blocks::block_count(tokens.len(), self.block_size);
        Event::Stored {
            block_hashes: blocks::block_ids(chunk, n),
            parent: blocks::parent_id(parent, n),
            token_ids: tokens,
            block_size: self.block_size,
            medium,
        }
    }

    /// Announces that chunk `chunk`, of `tokens` tokens, left each of `media`.
    pub fn removed(&self, chunk: &[u8], tokens: usize, media: &[Medium]) {
        let n = blocks::block_count(tokens, self.block_size);
        let ids = blocks::block_ids(chunk, n);
        for &medium in media {
            self.send(Event::Removed {
                block_hashes: ids.clone(),
                medium,
            });
        }
    }

    /// Sets what answers a `LIST` on the replay socket (once; without it a listing is
    /// empty).
    pub fn on_listing(&self, hook: ListingHook) {
        let _ = self.hook.set(hook);
    }

    pub fn stats(&self) -> &FeedStats {
        &self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn settings(dir: &std::path::Path) -> FeedSettings {
        FeedSettings {
            kv_events_endpoint: format!("ipc://{}/pub", dir.display()),
            kv_events_replay_endpoint: format!("ipc://{}/replay", dir.display()),
            kv_events_topics: vec!["kv@a@m".into(), "kv@b@m".into()],
            kv_events_buffer_batches: 3,
            ..FeedSettings::default()
        }
    }

    fn recv(sock: &zmq::Socket) -> Vec<Vec<u8>> {
        sock.set_rcvtimeo(5000).unwrap();
        sock.recv_multipart(0).expect("a message within 5 s")
    }

    #[test]
    fn batches_go_out_per_topic_in_sequence_and_replay_from_a_start() {
        let dir = tempfile::tempdir().unwrap();
        let s = settings(dir.path());
        let feed = Feed::start(&s).unwrap().unwrap();
        let ctx = zmq::Context::new();
        let sub = ctx.socket(zmq::SUB).unwrap();
        sub.connect(&s.kv_events_endpoint).unwrap();
        sub.set_subscribe(b"kv@a").unwrap();
        std::thread::sleep(Duration::from_millis(300)); // the slow joiner
        for i in 0..5u32 {
            feed.stored(
                format!("h{i}").as_bytes(),
                None,
                vec![1, 2, 3],
                Medium::Disk,
            );
            std::thread::sleep(Duration::from_millis(30)); // one batch each
        }
        for want in 0..5u64 {
            let m = recv(&sub);
            assert_eq!(m.len(), 3);
            assert_eq!(m[0], b"kv@a@m");
            assert_eq!(
                u64::from_be_bytes(m[1].as_slice().try_into().unwrap()),
                want
            );
        }
        // Three batches are kept: a replay from 1 returns 2, 3, 4, then the end.
        // A DEALER, as vLLM's replay clients use one: a REQ socket takes one reply only.
        let req = ctx.socket(zmq::DEALER).unwrap();
        req.connect(&s.kv_events_replay_endpoint).unwrap();
        let ask: [&[u8]; 2] = [b"", &1u64.to_be_bytes()];
        req.send_multipart(ask, 0).unwrap();
        let mut seqs = Vec::new();
        loop {
            req.set_rcvtimeo(5000).unwrap();
            let m = req.recv_multipart(0).unwrap();
            assert!(m[0].is_empty());
            if m[1] == END_SEQ {
                break;
            }
            seqs.push(u64::from_be_bytes(m[1].as_slice().try_into().unwrap()));
            assert!(!m[2].is_empty());
        }
        assert_eq!(seqs, [2, 3, 4]);
        assert_eq!(feed.stats().batches.load(Ordering::Relaxed), 5);
    }

    #[test]
    fn a_listing_goes_to_the_router_that_asked_with_the_live_sequence() {
        let dir = tempfile::tempdir().unwrap();
        let s = settings(dir.path());
        let feed = Feed::start(&s).unwrap().unwrap();
        feed.on_listing(Box::new(|lister: Lister| {
            std::thread::spawn(move || {
                for i in 0..2u8 {
                    assert!(lister.has_room());
                    let ev = Event::Removed {
                        block_hashes: vec![i as u64],
                        medium: Medium::Disk,
                    };
                    lister.send(vec![ev]);
                }
                lister.finish();
            });
        }));
        feed.removed(b"h", 16, &[Medium::Disk]); // batch 0 goes out live
        std::thread::sleep(Duration::from_millis(100));
        let ctx = zmq::Context::new();
        let req = ctx.socket(zmq::DEALER).unwrap();
        req.connect(&s.kv_events_replay_endpoint).unwrap();
        req.set_rcvtimeo(5000).unwrap();
        let ask: [&[u8]; 2] = [b"", b"LIST"];
        req.send_multipart(ask, 0).unwrap();
        let mut got = Vec::new();
        loop {
            let m = req.recv_multipart(0).unwrap();
            if m[1] == END_SEQ {
                break;
            }
            assert_eq!(u64::from_be_bytes(m[1].as_slice().try_into().unwrap()), 1);
            got.push(m[2].clone());
        }
        assert_eq!(got.len(), 2);
        assert_eq!(feed.stats().listings.load(Ordering::Relaxed), 1);
        assert_eq!(feed.stats().queued_bytes.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_full_queue_drops_and_the_sequence_skips() {
        let dir = tempfile::tempdir().unwrap();
        let s = FeedSettings {
            kv_events_queue_bytes_max: 0,
            ..settings(dir.path())
        };
        let feed = Feed::start(&s).unwrap().unwrap();
        feed.removed(b"h", 16, &[Medium::Disk]);
        assert_eq!(feed.stats().dropped.load(Ordering::Relaxed), 1);
        assert!(feed.stats().lost.load(Ordering::Relaxed));
    }

    #[test]
    fn settings_are_checked() {
        let bad = FeedSettings {
            kv_events_endpoint: "tcp://127.0.0.1:1".into(),
            kv_events_replay_endpoint: "tcp://127.0.0.1:2".into(),
            ..FeedSettings::default()
        };
        assert!(Feed::start(&bad).err().unwrap().contains("replay"));
        assert!(Feed::start(&FeedSettings::default())
            .ok()
            .unwrap()
            .is_none());
    }
}
