//! Clients blocked in a pop (`BLPOP`, `BZPOPMIN`, `BLMOVE`, ...), served in the order they
//! blocked, as Redis serves them: a change to a key wakes the client that has waited longest
//! on it, and a client that leaves after being woken wakes the next one on its keys (what
//! it took may have left more, or it may have taken nothing).
//!
//! Redis serves blocked clients before the command that fed them replies. Here a woken
//! client tries on its own task, so a connection whose commands woke some waits, before
//! it replies, until the woken have tried ([`Blocked::settled`]), for at most
//! [`SETTLE_WAIT_MAX`]: what a client does after its push's reply sees the pops done. A
//! client that blocks meanwhile on one of their keys makes its first try after theirs
//! ([`Blocked::turn`]), as in Redis it would come after them, and any other command on
//! one of their keys, from any client, runs after their tries ([`Blocked::served`]): a
//! pop cannot take what a push gave a blocked client. The keys a woken client writes
//! without waiting on them (the list a `BLMOVE` moves to) are held back the same way.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use strata_format::keys::Key;
use tokio::sync::Notify;

/// Longest a reply waits for the clients its command woke to try.
pub(crate) const SETTLE_WAIT_MAX: Duration = Duration::from_millis(500);

/// How a client's blocking command is ended from outside: the client leaving, or another
/// client's `CLIENT UNBLOCK`.
#[derive(Default)]
pub(crate) struct Unblock {
    pub(crate) notify: Notify,
    /// The client waits in a blocking command now (`CLIENT UNBLOCK` answers 1 only then).
    pub(crate) waiting: AtomicBool,
    /// Answer `-UNBLOCKED` rather than the timeout's reply.
    pub(crate) as_error: AtomicBool,
}

#[derive(Default)]
pub(crate) struct Blocked {
    inner: Mutex<Inner>,
    /// Clients queued (changed under `inner`'s lock): with none, a change to a list or a
    /// sorted set wakes no one without taking the lock. A client queues before it first
    /// tries, and its tries and the writes that feed it take the key's stripe lock, so a
    /// write after a try sees it queued.
    queued: AtomicUsize,
    /// Woken clients that have not finished trying since.
    unsettled: AtomicUsize,
    /// Notified whenever a woken client's try ends.
    settled: Notify,
}

#[derive(Default)]
struct Inner {
    next: u64,
    waiters: HashMap<u64, Waiter>,
    /// For each key, its waiters' tickets: the order they blocked.
    by_key: HashMap<Key, BTreeSet<u64>>,
    /// For each key a waiter writes without waiting on it, the waiters' tickets.
    held: HashMap<Key, BTreeSet<u64>>,
    /// Moves on when client keys name other stored keys (`SWAPDB`).
    epoch: u64,
}

impl Inner {
    /// Queues ticket `ticket` under `keys` and as holding `holds`.
    fn enqueue(&mut self, ticket: u64, keys: &[Key], holds: &[Key]) {
        for k in keys {
            self.by_key.entry(k.clone()).or_default().insert(ticket);
        }
        for k in holds {
            self.held.entry(k.clone()).or_default().insert(ticket);
        }
    }

    /// [`Blocked::woken_on`], under the lock.
    fn woken_on(&self, keys: &[Key], before: u64) -> bool {
        let woken = |q: &BTreeSet<u64>| {
            q.range(..before).any(|t| {
                self.waiters
                    .get(t)
                    .is_some_and(|w| w.woken || w.trying_woken)
            })
        };
        keys.iter()
            .any(|k| self.by_key.get(k).is_some_and(woken) || self.held.get(k).is_some_and(woken))
    }
}

struct Waiter {
    wake: Arc<Notify>,
    /// Woken, and counted in `unsettled`, since its last try began.
    woken: bool,
    /// In a try it was woken for (counted in `unsettled` until it ends).
    trying_woken: bool,
}

/// One client's place in the queues of its keys; leaving drops it from them.
pub(crate) struct Place<'a> {
    blocked: &'a Blocked,
    ticket: u64,
    keys: Vec<Key>,
    /// Keys the client writes when served but does not wait on.
    holds: Vec<Key>,
    epoch: u64,
    /// A try under way that was woken for (counted in `unsettled` until it ends).
    trying_woken: bool,
    /// Woken (a permit is kept, so a wake between two attempts is not lost).
    pub(crate) wake: Arc<Notify>,
}

impl Blocked {
    /// Queues a client on `keys`, behind everyone already waiting on them; once woken,
    /// commands on `holds` (keys it will write, not wait on) also wait for its try.
    pub(crate) fn join(&self, keys: Vec<Key>, holds: Vec<Key>) -> Place<'_> {
        let wake = Arc::new(Notify::new());
        let mut g = self.inner.lock();
        let ticket = g.next;
        g.next += 1;
        self.queued.fetch_add(1, Ordering::SeqCst);
        g.waiters.insert(
            ticket,
            Waiter {
                wake: Arc::clone(&wake),
                woken: false,
                trying_woken: false,
            },
        );
        g.enqueue(ticket, &keys, &holds);
        let epoch = g.epoch;
        Place {
            blocked: self,
            ticket,
            keys,
            holds,
            epoch,
            trying_woken: false,
            wake,
        }
    }

    /// `key` changed: the longest waiter on it tries again.
    pub(crate) fn wake(&self, key: &Key) {
        if self.queued.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mut g = self.inner.lock();
        if let Some(&first) = g.by_key.get(key).and_then(|q| q.first()) {
            self.wake_one(&mut g, first);
        }
    }

    fn wake_one(&self, g: &mut Inner, ticket: u64) {
        if let Some(w) = g.waiters.get_mut(&ticket) {
            if !w.woken {
                w.woken = true;
                self.unsettled.fetch_add(1, Ordering::AcqRel);
            }
            w.wake.notify_one();
        }
    }

    /// Client keys name other stored keys now (`SWAPDB`): every waiter looks again, and
    /// [`Place::stale`] tells it to queue under its keys' new names.
    pub(crate) fn rekey(&self) {
        let mut g = self.inner.lock();
        g.epoch += 1;
        let all: Vec<u64> = g.waiters.keys().copied().collect();
        for t in all {
            self.wake_one(&mut g, t);
        }
    }

    /// Slot `slot` starts moving to another node (cluster mode): its waiters try again,
    /// and are redirected.
    pub(crate) fn wake_slot(&self, slot: u16) {
        let mut g = self.inner.lock();
        let tickets: Vec<u64> = g
            .by_key
            .iter()
            .filter(|(k, _)| k.slot() == slot)
            .flat_map(|(_, q)| q.iter().copied())
            .collect();
        for t in tickets {
            self.wake_one(&mut g, t);
        }
    }

    /// Returns when no client queued before `place` on one of its keys is woken and has
    /// yet to finish its try (at once when none is woken: one atomic load), or after
    /// [`SETTLE_WAIT_MAX`]: the first try of a client that blocks comes after theirs.
    pub(crate) async fn turn(&self, place: &Place<'_>) {
        self.until_tried(|| {
            let g = self.inner.lock();
            !g.woken_on(&place.keys, place.ticket) && !g.woken_on(&place.holds, place.ticket)
        })
        .await;
    }

    /// Whether some client is woken and has yet to finish its try (one atomic load).
    pub(crate) fn any_woken(&self) -> bool {
        self.unsettled.load(Ordering::Acquire) != 0
    }

    /// Returns when no client queued on one of `keys` is woken and has yet to finish its
    /// try, or after [`SETTLE_WAIT_MAX`]: a command on a key that fed a blocked client
    /// runs after the client took what it was fed, as in Redis, where the blocked are
    /// served before the next command runs.
    pub(crate) async fn served(&self, keys: &[Key]) {
        self.until_tried(|| !self.woken_on(keys, u64::MAX)).await;
    }

    /// Whether a client queued on (or holding) one of `keys` before ticket `before` is
    /// woken or trying.
    pub(crate) fn woken_on(&self, keys: &[Key], before: u64) -> bool {
        self.inner.lock().woken_on(keys, before)
    }

    /// Clients queued now (`INFO`'s `blocked_clients`).
    pub(crate) fn waiting(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }

    /// Returns once every woken client has tried (at once when none was woken: one atomic
    /// load), or after [`SETTLE_WAIT_MAX`].
    pub(crate) async fn settled(&self) {
        self.until_tried(|| self.unsettled.load(Ordering::Acquire) == 0)
            .await;
    }

    /// Returns when `done` holds, checked at once and after each woken client's try, or
    /// at once when no client is woken, or after [`SETTLE_WAIT_MAX`].
    async fn until_tried(&self, done: impl Fn() -> bool) {
        if self.unsettled.load(Ordering::Acquire) == 0 {
            return;
        }
        let _ = tokio::time::timeout(SETTLE_WAIT_MAX, async {
            loop {
                let n = self.settled.notified();
                tokio::pin!(n);
                n.as_mut().enable();
                if done() {
                    return;
                }
                n.await;
            }
        })
        .await;
    }

    fn settle(&self) {
        self.unsettled.fetch_sub(1, Ordering::AcqRel);
        self.settled.notify_waiters();
    }
}

impl Place<'_> {
    /// A try begins: the wakes so far are answered by it.
    pub(crate) fn trying(&mut self) {
        let mut g = self.blocked.inner.lock();
        if let Some(w) = g.waiters.get_mut(&self.ticket) {
            // A wake is counted once, and the previous try settled its own ([`Self::tried`]).
            self.trying_woken = std::mem::take(&mut w.woken);
            w.trying_woken = self.trying_woken;
        }
    }

    /// The try ended without a reply: the client waits on.
    pub(crate) fn tried(&mut self) {
        if std::mem::take(&mut self.trying_woken) {
            if let Some(w) = self.blocked.inner.lock().waiters.get_mut(&self.ticket) {
                w.trying_woken = false;
            }
            self.blocked.settle();
        }
    }

    /// The keys this place is queued under are named otherwise since (see
    /// [`Blocked::rekey`]).
    pub(crate) fn stale(&self) -> bool {
        self.blocked.inner.lock().epoch != self.epoch
    }

    /// Queues under `keys` and holds `holds` (the same client keys' new names), keeping
    /// its turn.
    pub(crate) fn rekey(&mut self, keys: Vec<Key>, holds: Vec<Key>) {
        let mut g = self.blocked.inner.lock();
        self.leave_queues(&mut g);
        g.enqueue(self.ticket, &keys, &holds);
        self.keys = keys;
        self.holds = holds;
        self.epoch = g.epoch;
    }

    fn leave_queues(&self, g: &mut Inner) {
        for k in &self.holds {
            if let Some(q) = g.held.get_mut(k) {
                q.remove(&self.ticket);
                if q.is_empty() {
                    g.held.remove(k);
                }
            }
        }
        for k in &self.keys {
            let Some(q) = g.by_key.get_mut(k) else {
                continue;
            };
            q.remove(&self.ticket);
            match q.first().copied() {
                None => {
                    g.by_key.remove(k);
                }
                // What this client left, or a wake it took and did not use, is for the
                // next in line.
                Some(next) => self.blocked.wake_one(g, next),
            }
        }
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let mut g = self.blocked.inner.lock();
        if let Some(w) = g.waiters.remove(&self.ticket) {
            self.blocked.queued.fetch_sub(1, Ordering::SeqCst);
            if w.woken {
                self.blocked.settle();
            }
        }
        self.leave_queues(&mut g);
        drop(g);
        self.tried();
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;

    fn key(s: &str) -> Key {
        Key::new(0, 0, s.as_bytes())
    }

    fn woken(p: &Place<'_>) -> bool {
        Box::pin(p.wake.notified()).now_or_never().is_some()
    }

    #[test]
    fn the_longest_waiter_is_woken_and_hands_on_and_all_settle() {
        let b = Blocked::default();
        let mut first = b.join(vec![key("a"), key("b")], vec![]);
        let mut second = b.join(vec![key("b")], vec![]);
        assert_eq!(b.waiting(), 2);
        b.wake(&key("b"));
        assert!(woken(&first) && !woken(&second));
        assert_eq!(b.unsettled.load(Ordering::Relaxed), 1);
        first.trying();
        first.tried();
        assert_eq!(b.unsettled.load(Ordering::Relaxed), 0);
        b.wake(&key("b"));
        first.trying();
        // It answers and leaves: the next in line is woken.
        drop(first);
        assert!(woken(&second));
        assert_eq!(b.unsettled.load(Ordering::Relaxed), 1);
        second.trying();
        second.tried();
        drop(second);
        assert_eq!(b.waiting(), 0);
        assert_eq!(b.unsettled.load(Ordering::Relaxed), 0);
        assert!(b.inner.lock().by_key.is_empty());
        assert!(b.settled().now_or_never().is_some());
    }

    #[tokio::test]
    async fn a_client_that_blocks_tries_after_the_woken_before_it() {
        let b = Blocked::default();
        let mut first = b.join(vec![key("a")], vec![]);
        // Nobody woken: the turn comes at once.
        assert!(b
            .turn(&b.join(vec![key("c")], vec![]))
            .now_or_never()
            .is_some());
        b.wake(&key("a"));
        let other = b.join(vec![key("b")], vec![]);
        assert!(
            b.turn(&other).now_or_never().is_some(),
            "no one woken on its keys"
        );
        let late = b.join(vec![key("b"), key("a")], vec![]);
        let mut turn = Box::pin(b.turn(&late));
        assert!(
            turn.as_mut().now_or_never().is_none(),
            "first was woken on a"
        );
        first.trying();
        assert!(
            turn.as_mut().now_or_never().is_none(),
            "first is still trying"
        );
        first.tried();
        assert!(turn.as_mut().now_or_never().is_some());
        drop(turn);
        drop((late, other));
        // Woken again, it answers and leaves: the next in line on a is woken, and the
        // client that queued after it waits for that one's try too.
        let mut second = b.join(vec![key("a")], vec![]);
        b.wake(&key("a"));
        first.trying();
        drop(first);
        let turn = Box::pin(b.turn(&second)).now_or_never();
        assert!(turn.is_some(), "second is next and woken itself");
        let third = b.join(vec![key("a")], vec![]);
        assert!(Box::pin(b.turn(&third)).now_or_never().is_none());
        second.trying();
        second.tried();
        assert!(Box::pin(b.turn(&third)).now_or_never().is_some());
    }

    #[tokio::test]
    async fn a_command_on_a_key_runs_after_the_clients_woken_on_it_tried() {
        let b = Blocked::default();
        let mut waiter = b.join(vec![key("a")], vec![]);
        assert!(!b.any_woken());
        assert!(b.served(&[key("a")]).now_or_never().is_some());
        b.wake(&key("a"));
        assert!(b.any_woken() && b.woken_on(&[key("a")], u64::MAX));
        assert!(
            b.served(&[key("b")]).now_or_never().is_some(),
            "no one woken on b"
        );
        let keys = [key("b"), key("a")];
        let mut served = Box::pin(b.served(&keys));
        assert!(served.as_mut().now_or_never().is_none());
        waiter.trying();
        assert!(
            served.as_mut().now_or_never().is_none(),
            "the waiter is still trying"
        );
        waiter.tried();
        assert!(served.as_mut().now_or_never().is_some());
        assert!(!b.any_woken());
    }

    #[tokio::test]
    async fn a_woken_client_holds_back_the_keys_it_writes_until_it_tried() {
        let b = Blocked::default();
        let mut mover = b.join(vec![key("src")], vec![key("dst")]);
        assert!(
            b.served(&[key("dst")]).now_or_never().is_some(),
            "not woken yet"
        );
        // Waking on the key it writes does nothing: it does not wait on it.
        b.wake(&key("dst"));
        assert!(!b.any_woken());
        b.wake(&key("src"));
        let dst = [key("dst")];
        let mut served = Box::pin(b.served(&dst));
        assert!(served.as_mut().now_or_never().is_none());
        // A client that blocks on the destination tries after the mover.
        let late = b.join(vec![key("dst")], vec![]);
        let mut turn = Box::pin(b.turn(&late));
        assert!(turn.as_mut().now_or_never().is_none());
        mover.trying();
        drop(mover);
        assert!(served.as_mut().now_or_never().is_some());
        assert!(turn.as_mut().now_or_never().is_some());
        assert!(b.inner.lock().held.is_empty(), "leaving drops what it held");
    }
}
