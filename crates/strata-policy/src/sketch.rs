//! A count-min sketch of access frequencies with 4-bit counters and periodic halving, so
//! memory is bounded and old popularity fades. Shared by W-TinyLFU and Strata's policy.

/// Four rows of 4-bit saturating counters; conservative update; halves every
/// `10 × capacity` additions.
pub(crate) struct Sketch {
    rows: [Vec<u8>; 4],
    mask: usize,
    additions: usize,
    reset_at: usize,
}

/// Counters per row for `capacity` entries: `per_entry` each, a power of two, at least
/// `min_width`.
fn width(capacity: usize, per_entry: usize, min_width: usize) -> usize {
    (capacity * per_entry).next_power_of_two().max(min_width)
}

/// Counters per entry and row, and the fewest per row, of [`Sketch::new`].
pub(crate) const FULL_WIDTH: (usize, usize) = (16, 256);

impl Sketch {
    pub(crate) fn new(capacity: usize) -> Self {
        Self::with_width(capacity, FULL_WIDTH.0, FULL_WIDTH.1)
    }

    /// A sketch with `per_entry` counters per row for each of `capacity` entries, and at
    /// least `min_width` (fewer counters: more collisions, but a sketch that stays in the
    /// CPU cache).
    pub(crate) fn with_width(capacity: usize, per_entry: usize, min_width: usize) -> Self {
        let width = width(capacity, per_entry, min_width);
        Sketch {
            rows: std::array::from_fn(|_| vec![0; width]),
            mask: width - 1,
            additions: 0,
            reset_at: capacity.max(16) * 10,
        }
    }
    /// Ages over `10 × capacity` additions from now on; a capacity that wants at least
    /// twice the counters there are gets a new, empty sketch of the right width.
    pub(crate) fn resize(&mut self, capacity: usize, per_entry: usize, min_width: usize) {
        if width(capacity, per_entry, min_width) >= 2 * (self.mask + 1) {
            *self = Self::with_width(capacity, per_entry, min_width);
        } else {
            self.reset_at = capacity.max(16) * 10;
            self.additions = self.additions.min(self.reset_at);
        }
    }

    fn idx(&self, key: u64, row: usize) -> usize {
        let h = (key ^ (row as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .wrapping_mul(0xBF58_476D_1CE4_E5B9);
        (h ^ (h >> 31)) as usize & self.mask
    }
    /// Counts an access and returns the new estimate.
    pub(crate) fn add(&mut self, key: u64) -> u8 {
        let est = self.estimate(key);
        for r in 0..4 {
            let i = self.idx(key, r);
            // Conservative update: only the counters at the minimum grow.
            if self.rows[r][i] == est {
                self.rows[r][i] = est.saturating_add(1).min(15);
            }
        }
        self.additions += 1;
        if self.additions >= self.reset_at {
            self.additions = 0;
            self.rows
                .iter_mut()
                .for_each(|row| row.iter_mut().for_each(|c| *c /= 2));
        }
        self.estimate(key)
    }
    pub(crate) fn estimate(&self, key: u64) -> u8 {
        (0..4)
            .map(|r| self.rows[r][self.idx(key, r)])
            .min()
            .unwrap_or(0)
    }
}
