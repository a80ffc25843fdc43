//! Listings: a router that lost more than the replay buffer holds asks the replay socket for
//! `LIST` and gets every chunk this node holds, as `BlockStored` batches, then the end
//! marker. The feed's thread only forwards them; whoever knows the chunks (the server) is
//! handed a [`Lister`] and sends them through it, at its own pace.

use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::sync::{Arc, OnceLock};

use crate::event::Event;
use crate::queue::{FeedStats, Item};

/// What makes a listing: called on the feed's thread with the listing's [`Lister`]; it
/// must return at once (start the work elsewhere).
pub type ListingHook = Box<dyn Fn(Lister) + Send + Sync>;

/// Where the hook is set once the server is up.
pub(crate) type HookSlot = Arc<OnceLock<ListingHook>>;

/// One listing under way: its batches go to the router that asked.
pub struct Lister {
    pub(crate) to: Vec<u8>,
    pub(crate) seq: u64,
    pub(crate) queue: Sender<Item>,
    pub(crate) stats: Arc<FeedStats>,
    pub(crate) room: usize,
}

impl Lister {
    /// Sends one batch of the listing.
    pub fn send(&self, events: Vec<Event>) {
        let size = events.iter().map(Event::size).sum::<usize>();
        self.stats.queued_bytes.fetch_add(size, Ordering::Relaxed);
        let _ = self.queue.send(Item::Listed {
            to: self.to.clone(),
            seq: self.seq,
            events,
        });
    }

    /// Whether the queue has room for another batch (a lister waits while it has not).
    pub fn has_room(&self) -> bool {
        self.stats.queued_bytes.load(Ordering::Relaxed) < self.room / 2
    }

    /// Ends the listing: the router gets the end marker.
    pub fn finish(self) {
        let _ = self.queue.send(Item::ListedEnd { to: self.to });
    }
}
