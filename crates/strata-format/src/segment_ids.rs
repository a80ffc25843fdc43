//! A segment's id: the writer epoch it was allocated in, above [`EPOCH_SHIFT`], and its
//! number within the epoch below: `id = epoch << EPOCH_SHIFT | n`. A node that shares its
//! bucket with others writes under an epoch of its own (the cluster gives each start
//! one), so ids never collide and each writer's segments have a prefix of their own; epoch
//! 0 is a store that shares its bucket with no one (every store before epochs).
//!
//! ```
//! use strata_format::segment_ids::{epoch_of, first_segment_id};
//! assert_eq!(epoch_of(first_segment_id(7)), 7);
//! assert_eq!(first_segment_id(0), 1);
//! ```

/// Bits of a segment id below its writer's epoch.
pub const EPOCH_SHIFT: u32 = 40;

/// Most writer epochs: those that fit above [`EPOCH_SHIFT`] in a segment id.
pub const WRITER_EPOCH_MAX: u64 = (1 << (64 - EPOCH_SHIFT)) - 1;

/// The writer epoch a segment id was allocated in.
pub fn epoch_of(id: u64) -> u64 {
    id >> EPOCH_SHIFT
}

/// The first segment id of writer epoch `epoch`.
pub fn first_segment_id(epoch: u64) -> u64 {
    (epoch << EPOCH_SHIFT) | 1
}
