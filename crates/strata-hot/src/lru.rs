//! Least-recently-used eviction: a doubly linked list over slot numbers.

use crate::Policy;

const NIL: u32 = u32::MAX;

/// The default policy: evicts the entry read or written least recently.
#[derive(Default)]
pub struct Lru {
    prev: Vec<u32>,
    next: Vec<u32>,
    linked: Vec<bool>,
    /// Most recently used end.
    head: Option<u32>,
    /// Least recently used end.
    tail: Option<u32>,
}

impl Lru {
    fn ensure(&mut self, slot: u32) {
        let n = slot as usize + 1;
        if self.prev.len() < n {
            self.prev.resize(n, NIL);
            self.next.resize(n, NIL);
            self.linked.resize(n, false);
        }
    }

    fn unlink(&mut self, slot: u32) {
        let i = slot as usize;
        if !self.linked.get(i).copied().unwrap_or(false) {
            return;
        }
        let (p, n) = (self.prev[i], self.next[i]);
        if p == NIL {
            self.head = (n != NIL).then_some(n);
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = (p != NIL).then_some(p);
        } else {
            self.prev[n as usize] = p;
        }
        self.linked[i] = false;
    }

    fn push_front(&mut self, slot: u32) {
        self.ensure(slot);
        let i = slot as usize;
        self.prev[i] = NIL;
        self.next[i] = self.head.unwrap_or(NIL);
        if let Some(h) = self.head {
            self.prev[h as usize] = slot;
        }
        self.head = Some(slot);
        if self.tail.is_none() {
            self.tail = Some(slot);
        }
        self.linked[i] = true;
    }
}

impl Policy for Lru {
    fn name(&self) -> &'static str {
        "lru"
    }
    fn on_insert(&mut self, slot: u32, _key_hash: u64) {
        self.unlink(slot);
        self.push_front(slot);
    }
    fn on_hit(&mut self, slot: u32) {
        self.unlink(slot);
        self.push_front(slot);
    }
    fn on_remove(&mut self, slot: u32) {
        self.unlink(slot);
    }
    fn victim(&mut self) -> Option<u32> {
        let t = self.tail?;
        self.unlink(t);
        Some(t)
    }
}
