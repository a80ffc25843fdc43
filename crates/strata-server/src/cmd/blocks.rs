//! A double-ended queue kept in blocks of [`BLOCK`] slots: a list's elements. A queue in
//! one buffer (`VecDeque`) doubles it as it grows, copying every element into fresh
//! memory each time: a list `LPUSH`ed to millions of elements spent a tenth of the
//! server's time in those copies and the page faults of the new buffers. Here a push takes
//! a new block when the end one is full and nothing already held moves; an element is
//! still found by its index in one step, as Redis's lists of small blocks are walked in
//! few.

use std::collections::VecDeque;
use std::ops::Range;

/// Slots per block (8 KiB of 32-byte elements, the size of Redis's list nodes).
const BLOCK: usize = 256;

type Block<T> = Box<[Option<T>; BLOCK]>;

fn block<T>() -> Block<T> {
    Box::new(std::array::from_fn(|_| None))
}

/// The queue. Element `i` is in slot `head + i` counted across the blocks; the slots
/// before `head` in the first block and after the last element in the last block are
/// empty, and no block is wholly empty but a lone one kept for the next push.
pub(crate) struct BlockDeque<T> {
    blocks: VecDeque<Block<T>>,
    head: usize,
    len: usize,
}

impl<T> Default for BlockDeque<T> {
    fn default() -> Self {
        BlockDeque {
            blocks: VecDeque::new(),
            head: 0,
            len: 0,
        }
    }
}

impl<T> BlockDeque<T> {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn slot(&self, at: usize) -> &Option<T> {
        &self.blocks[at / BLOCK][at % BLOCK]
    }

    fn slot_mut(&mut self, at: usize) -> &mut Option<T> {
        &mut self.blocks[at / BLOCK][at % BLOCK]
    }

    /// Element `i`, if the queue has that many.
    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        if i >= self.len {
            return None;
        }
        self.slot(self.head + i).as_ref()
    }

    pub(crate) fn push_front(&mut self, v: T) {
        if self.head == 0 {
            self.blocks.push_front(block());
            self.head = BLOCK;
        }
        self.head -= 1;
        *self.slot_mut(self.head) = Some(v);
        self.len += 1;
    }

    pub(crate) fn push_back(&mut self, v: T) {
        let at = self.head + self.len;
        if at == self.blocks.len() * BLOCK {
            self.blocks.push_back(block());
        }
        *self.slot_mut(at) = Some(v);
        self.len += 1;
    }

    pub(crate) fn pop_front(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        let v = self.slot_mut(self.head).take();
        self.head += 1;
        self.len -= 1;
        if self.len == 0 {
            self.emptied();
        } else if self.head == BLOCK {
            self.blocks.pop_front();
            self.head = 0;
        }
        v
    }

    pub(crate) fn pop_back(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        let at = self.head + self.len;
        let v = self.slot_mut(at).take();
        if self.len == 0 {
            self.emptied();
        } else if at.is_multiple_of(BLOCK) {
            self.blocks.pop_back();
        }
        v
    }

    /// After the last element went: one block is kept, its middle the next push's place
    /// whichever end it is at (a queue that empties and fills again allocates nothing).
    fn emptied(&mut self) {
        self.blocks.truncate(1);
        self.head = BLOCK / 2;
    }

    /// Sets element `i` (inside the queue).
    pub(crate) fn set(&mut self, i: usize, v: T) {
        assert!(i < self.len, "index {i} past {}", self.len);
        *self.slot_mut(self.head + i) = Some(v);
    }

    fn swap(&mut self, i: usize, j: usize) {
        let (a, b) = (self.head + i, self.head + j);
        let x = self.slot_mut(a).take();
        let y = std::mem::replace(self.slot_mut(b), x);
        *self.slot_mut(a) = y;
    }

    /// Inserts `v` before element `i` (at the end if `i` is the length): the elements on
    /// the nearer side move by one.
    pub(crate) fn insert(&mut self, i: usize, v: T) {
        assert!(i <= self.len, "index {i} past {}", self.len);
        if i <= self.len / 2 {
            self.push_front(v);
            for k in 0..i {
                self.swap(k, k + 1);
            }
        } else {
            self.push_back(v);
            for k in (i..self.len - 1).rev() {
                self.swap(k, k + 1);
            }
        }
    }

    /// Keeps the elements whose flag in `keep` is true (one flag per element), in order.
    pub(crate) fn retain_flagged(&mut self, keep: &[bool]) {
        debug_assert_eq!(keep.len(), self.len);
        let mut kept = BlockDeque::default();
        let mut flags = keep.iter();
        while let Some(v) = self.pop_front() {
            if *flags.next().expect("one flag per element") {
                kept.push_back(v);
            }
        }
        *self = kept;
    }

    /// The elements in `r`, in order.
    pub(crate) fn range(
        &self,
        r: Range<usize>,
    ) -> impl DoubleEndedIterator<Item = &T> + ExactSizeIterator + Clone {
        assert!(r.end <= self.len, "range {r:?} past {}", self.len);
        r.map(move |i| self.slot(self.head + i).as_ref().expect("a held slot"))
    }

    /// Every element, head first.
    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = &T> + ExactSizeIterator + Clone {
        self.range(0..self.len)
    }
}

impl<T> std::ops::Index<usize> for BlockDeque<T> {
    type Output = T;
    fn index(&self, i: usize) -> &T {
        self.get(i)
            .unwrap_or_else(|| panic!("index {i} past {}", self.len))
    }
}

impl<T> FromIterator<T> for BlockDeque<T> {
    fn from_iter<I: IntoIterator<Item = T>>(items: I) -> Self {
        let mut q = BlockDeque::default();
        for v in items {
            q.push_back(v);
        }
        q
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every operation against a `VecDeque` doing the same, across block boundaries at
    /// both ends, emptying and filling again.
    #[test]
    fn blocks_behave_as_one_queue() {
        let mut q: BlockDeque<u64> = BlockDeque::default();
        let mut want: VecDeque<u64> = VecDeque::new();
        let mut x = 7u64;
        for step in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Long runs of pushes and of pops, so the queue grows past many blocks and
            // empties now and then.
            let phase = (step / 3000) % 4;
            match (x % 16, phase) {
                (0..=5, 0 | 1) | (0..=2, _) => {
                    q.push_front(step);
                    want.push_front(step);
                }
                (6..=11, 0 | 2) | (3..=5, _) => {
                    q.push_back(step);
                    want.push_back(step);
                }
                (12, _) => assert_eq!(q.pop_front(), want.pop_front()),
                (13, _) => assert_eq!(q.pop_back(), want.pop_back()),
                (14, _) if !want.is_empty() && step % 7 == 0 => {
                    let i = (x >> 20) as usize % (want.len() + 1);
                    q.insert(i, step);
                    want.insert(i, step);
                }
                (15, _) if !want.is_empty() => {
                    let i = (x >> 20) as usize % want.len();
                    q.set(i, step);
                    want[i] = step;
                }
                _ => {
                    for _ in 0..(x >> 40) % 400 {
                        assert_eq!(q.pop_front(), want.pop_front());
                        assert_eq!(q.pop_back(), want.pop_back());
                    }
                }
            }
            assert_eq!(q.len(), want.len());
            if step % 997 == 0 {
                assert!(q.iter().eq(want.iter()), "step {step}");
                assert!(q.iter().rev().eq(want.iter().rev()));
                if want.len() > 10 {
                    assert!(q.range(3..want.len() - 2).eq(want.range(3..want.len() - 2)));
                    let keep: Vec<bool> = (0..want.len()).map(|i| i % 3 != 1).collect();
                    q.retain_flagged(&keep);
                    let mut k = keep.iter();
                    want.retain(|_| *k.next().unwrap());
                    assert!(q.iter().eq(want.iter()));
                }
            }
            // No wholly empty block but the one kept.
            assert!(q.blocks.len() <= want.len().div_ceil(BLOCK) + 1);
        }
        assert_eq!(q.get(q.len()), None);
    }
}
