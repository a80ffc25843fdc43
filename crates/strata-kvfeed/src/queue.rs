//! What passes from the senders to the feed's thread: the queue's items, and the figures
//! both sides keep.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};

use crate::event::Event;

/// What the feed has done, for `INFO` and `/metrics`.
#[derive(Debug, Default)]
pub struct FeedStats {
    pub batches: AtomicU64,
    pub events: AtomicU64,
    /// Events dropped because the queue was full (each drop skips a sequence number).
    pub dropped: AtomicU64,
    pub replays: AtomicU64,
    /// Listings asked for on the replay socket.
    pub listings: AtomicU64,
    /// Bytes of events waiting in the queue.
    pub queued_bytes: AtomicUsize,
    /// Whether events were dropped since the last batch went out.
    pub(crate) lost: AtomicBool,
}

/// What the feed's queue carries: events to publish, and listings' batches for the router
/// that asked.
pub(crate) enum Item {
    Event(Event),
    Listed {
        to: Vec<u8>,
        seq: u64,
        events: Vec<Event>,
    },
    ListedEnd {
        to: Vec<u8>,
    },
}
