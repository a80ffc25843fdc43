//! The change log, read back from RocksDB's write-ahead log: every committed batch, with
//! its sequence number, as the list of changes it made.
//!
//! RocksDB hands each logged batch back in its own binary form (`WriteBatch::Rep`): a
//! sequence number (u64 LE), a count (u32 LE), then one record per change, a tag byte and
//! its fields (column family as a varint32, key and value as varint32-prefixed strings).
//! This module decodes the records Strata writes (put, delete, merge, range delete, in any
//! column family) and refuses any other, so a format it does not know is an error rather
//! than a silently wrong change.
//!
//! rocksdb 0.20's `DBWALIterator` moves past the batch it is positioned on before it
//! returns one, so the first batch asked for would be lost; the log is walked here with
//! RocksDB's C functions instead.

use std::collections::HashMap;

use librocksdb_sys as ffi;
use strata_warm::{Changes, Family, RawChange, Result, StoreError};

// The iterator's handle is its only field; taking it over relies on that.
const _: () = assert!(
    std::mem::size_of::<rocksdb::DBWALIterator>()
        == std::mem::size_of::<*mut ffi::rocksdb_wal_iterator_t>()
);

/// Walks the log from the batch that holds sequence `after + 1`.
struct LogWalk<'a> {
    iter: *mut ffi::rocksdb_wal_iterator_t,
    ids: &'a HashMap<u32, Family>,
    /// The sequence number the next batch must hold: `after + 1` for the first, then the
    /// one after the previous batch's last (the log has no gaps).
    next_sequence: u64,
    first: bool,
    done: bool,
}

impl Drop for LogWalk<'_> {
    fn drop(&mut self) {
        // SAFETY: `iter` came from RocksDB and is destroyed exactly once, here.
        unsafe { ffi::rocksdb_wal_iter_destroy(self.iter) }
    }
}

fn gone(why: String) -> StoreError {
    StoreError::Gone(format!(
        "{why}; the write-ahead log kept (change_log_bytes_max) no longer reaches that far"
    ))
}

/// The batches of `db`'s log after sequence `after`; `ids` names its column families.
pub(crate) fn after<'a>(
    db: &'a rocksdb::DB,
    ids: &'a HashMap<u32, Family>,
    after: u64,
) -> Result<Box<dyn Iterator<Item = Result<Changes>> + 'a>> {
    if after >= db.latest_sequence_number() {
        return Ok(Box::new(std::iter::empty()));
    }
    let it = db
        .get_updates_since(after + 1)
        .map_err(|e| gone(format!("changes after sequence {after}: {e}")))?;
    // SAFETY: see the assertion above: the iterator is its handle. Taking it over moves
    // its ownership here (`LogWalk` destroys it), so the wrapper must not run its own drop.
    let iter: *mut ffi::rocksdb_wal_iterator_t = unsafe { std::mem::transmute(it) };
    Ok(Box::new(LogWalk {
        iter,
        ids,
        next_sequence: after + 1,
        first: true,
        done: false,
    }))
}

impl Iterator for LogWalk<'_> {
    type Item = Result<Changes>;

    fn next(&mut self) -> Option<Result<Changes>> {
        if self.done {
            return None;
        }
        // SAFETY: `iter` is a live RocksDB log iterator owned by this walk.
        unsafe {
            if !self.first {
                ffi::rocksdb_wal_iter_next(self.iter);
            }
            if ffi::rocksdb_wal_iter_valid(self.iter) == 0 {
                self.done = true;
                let mut e: *mut libc::c_char = std::ptr::null_mut();
                ffi::rocksdb_wal_iter_status(self.iter, &mut e);
                if e.is_null() {
                    return None;
                }
                let msg = std::ffi::CStr::from_ptr(e).to_string_lossy().into_owned();
                ffi::rocksdb_free(e as *mut libc::c_void);
                return Some(Err(gone(format!("reading the log: {msg}"))));
            }
            let first = self.first;
            let mut seq = 0u64;
            let wb = ffi::rocksdb_wal_iter_get_batch(self.iter, &mut seq);
            let mut len = 0usize;
            let data = ffi::rocksdb_writebatch_data(wb, &mut len);
            let rep = std::slice::from_raw_parts(data as *const u8, len);
            let out = decode(rep, self.ids);
            ffi::rocksdb_writebatch_destroy(wb);
            let out = out.map(|changes| Changes {
                sequence: seq,
                changes,
            });
            self.first = false;
            if let Ok(c) = &out {
                // The first batch may begin before the sequence asked for (it holds it);
                // every other begins right after the one before.
                let gap = if first {
                    c.sequence > self.next_sequence
                } else {
                    c.sequence != self.next_sequence
                };
                if gap {
                    self.done = true;
                    return Some(Err(gone(format!(
                        "the log resumes at sequence {} where {} was due",
                        c.sequence, self.next_sequence
                    ))));
                }
                self.next_sequence = c.sequence + c.changes.len() as u64;
            }
            Some(out)
        }
    }
}

/// Reads a varint32 at `pos`.
fn varint32(b: &[u8], pos: &mut usize) -> Result<u32> {
    let mut v = 0u32;
    for shift in (0..35).step_by(7) {
        let byte = *b
            .get(*pos)
            .ok_or_else(|| bad("a varint runs past the batch"))?;
        *pos += 1;
        v |= ((byte & 0x7f) as u32) << shift;
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(bad("a varint longer than 5 bytes"))
}

/// Reads a varint32-prefixed string at `pos`.
fn slice<'a>(b: &'a [u8], pos: &mut usize) -> Result<&'a [u8]> {
    let n = varint32(b, pos)? as usize;
    let s = b
        .get(*pos..*pos + n)
        .ok_or_else(|| bad("a string runs past the batch"))?;
    *pos += n;
    Ok(s)
}

fn bad(what: &str) -> StoreError {
    StoreError::Corruption(format!("write-ahead log batch: {what}"))
}

// Record tags of RocksDB's `WriteBatch` format (db/dbformat.h, ValueType).
const DELETION: u8 = 0x0;
const VALUE: u8 = 0x1;
const MERGE: u8 = 0x2;
const LOG_DATA: u8 = 0x3;
const CF_DELETION: u8 = 0x4;
const CF_VALUE: u8 = 0x5;
const CF_MERGE: u8 = 0x6;
const SINGLE_DELETION: u8 = 0x7;
const CF_SINGLE_DELETION: u8 = 0x8;
const NOOP: u8 = 0xD;
const CF_RANGE_DELETION: u8 = 0xE;
const RANGE_DELETION: u8 = 0xF;

/// Decodes one batch's records into changes, mapping column family ids with `ids`.
pub(crate) fn decode(rep: &[u8], ids: &HashMap<u32, Family>) -> Result<Vec<RawChange>> {
    if rep.len() < 12 {
        return Err(bad("shorter than its header"));
    }
    let count = u32::from_le_bytes(rep[8..12].try_into().expect("4 bytes")) as usize;
    let mut out = Vec::with_capacity(count);
    let mut pos = 12;
    while pos < rep.len() {
        let tag = rep[pos];
        pos += 1;
        let cf = match tag {
            CF_DELETION | CF_VALUE | CF_MERGE | CF_SINGLE_DELETION | CF_RANGE_DELETION => {
                varint32(rep, &mut pos)?
            }
            _ => 0,
        };
        let family = || {
            ids.get(&cf)
                .copied()
                .ok_or_else(|| bad(&format!("column family id {cf} is unknown")))
        };
        match tag {
            VALUE | CF_VALUE => {
                let key = slice(rep, &mut pos)?.to_vec();
                let value = slice(rep, &mut pos)?.to_vec();
                out.push(RawChange::Put {
                    family: family()?,
                    key,
                    value,
                });
            }
            DELETION | CF_DELETION | SINGLE_DELETION | CF_SINGLE_DELETION => {
                let key = slice(rep, &mut pos)?.to_vec();
                out.push(RawChange::Delete {
                    family: family()?,
                    key,
                });
            }
            MERGE | CF_MERGE => {
                let key = slice(rep, &mut pos)?.to_vec();
                let operand = slice(rep, &mut pos)?.to_vec();
                out.push(RawChange::Merge {
                    family: family()?,
                    key,
                    operand,
                });
            }
            RANGE_DELETION | CF_RANGE_DELETION => {
                let from = slice(rep, &mut pos)?.to_vec();
                let to = slice(rep, &mut pos)?.to_vec();
                out.push(RawChange::DeleteRange {
                    family: family()?,
                    from,
                    to,
                });
            }
            LOG_DATA => {
                slice(rep, &mut pos)?;
            }
            NOOP => {}
            other => {
                return Err(bad(&format!(
                    "record tag {other:#x} is not one Strata writes"
                )))
            }
        }
    }
    if out.len() != count {
        return Err(bad(&format!(
            "{} records where the header counts {count}",
            out.len()
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
