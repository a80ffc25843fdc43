//! The value log: large warm values live in append-only files beside RocksDB, and RocksDB
//! holds a small record that points at them (key-value separation, as in WiscKey).
//!
//! Why: RocksDB 7.8 copies a blob value into its result buffer on every read, and writes it
//! twice (WAL, then blob file at flush) with a software CRC in Debian's portable build. A
//! value here is written once, and read through a shared memory map with no copy: the
//! `Bytes` handed out own a reference to the map, and the server sends from it directly.
//!
//! Layout: `<data_dir>/vlog/<id as 16 hex digits>.vlog`, each a run of entries
//! `header | key | value` ([`strata_format::encode_log_header`]). Only the newest file is
//! written; a process start always begins a new one. Bytes once written are never
//! rewritten, files are never truncated, and a file is only deleted (by the collector, once
//! no record points into it): this is what makes the memory maps safe to share.
//!
//! Order of writes: a value is appended before the record that points at it is written, and
//! the file is synced before the WAL that holds that record ([`ValueLog::sync`] in group
//! commit and sync writes). A crash between the two leaves unreferenced bytes in a file,
//! never a record pointing at nothing.
//!
//! Garbage (bytes of entries no record points at any more) is counted per file in RocksDB's
//! meta family, in the same write batch that drops the pointer; the background task rewrites
//! the live entries of a file that is mostly garbage and deletes it
//! (`background::collect_value_log`).

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use memmap2::Mmap;
use parking_lot::{Mutex, RwLock};
use strata_format::{
    decode_log_header, encode_log_header, Key, LogHeader, ValuePointer, WarmRecord,
    LOG_HEADER_BYTES,
};

use crate::{Error, Result};

struct Active {
    id: u64,
    file: Arc<File>,
    len: u64,
    /// Where the bytes not yet handed to writeback start.
    writeback_from: u64,
}

pub(crate) struct ValueLog {
    dir: PathBuf,
    file_bytes_max: u64,
    writeback_bytes: u64,
    /// Requests to start writing a range of a file to disk, for [`writeback_thread`].
    writeback: Option<crate::offload::Lowered<(Arc<File>, u64, u64)>>,
    active: Mutex<Active>,
    /// The active file's id and the bytes appended to it, readable without waiting for an
    /// append in progress.
    active_id: std::sync::atomic::AtomicU64,
    active_len: std::sync::atomic::AtomicU64,
    /// Files written since the last [`ValueLog::sync`].
    dirty: Mutex<HashMap<u64, Arc<File>>>,
    /// Read-only maps, one per file, replaced by a longer one when a read reaches past the
    /// end of the current map (the newest file grows).
    maps: RwLock<HashMap<u64, Arc<Mmap>>>,
    /// Maps of deleted files, kept for [`RETIRED_MAP_GRACE`] so that a read which found a
    /// record pointing into the file just before its entries moved still gets its value.
    retired: Mutex<Vec<(std::time::Instant, u64)>>,
    /// The addresses of every map made of each file (the active file's at its planned size,
    /// then at its real length once sealed), until its map is released: what
    /// [`ValueLog::lies_in`] looks a value's bytes up in.
    mapped: Mutex<HashMap<u64, Vec<std::ops::Range<usize>>>>,
}

/// How long the map of a deleted file outlives it (its disk space is freed after that).
pub(crate) const RETIRED_MAP_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Writeback requests waiting for [`writeback_thread`] (each covers `writeback_bytes`).
const WRITEBACK_QUEUE_MAX: usize = 16;

/// Starts the thread that starts writeback of appended ranges, without waiting for it, as
/// RocksDB's `bytes_per_sync` does: the disk gets a steady stream instead of bursts. The
/// call does the file system's block allocation for the range, which costs about a tenth of
/// a large append, so it runs here (at the background work's priority), not on the thread
/// of the client that appended. The thread ends with the log (its sender dropped).
fn writeback_thread() -> crate::offload::Lowered<(Arc<File>, u64, u64)> {
    // Without the thread every request is dropped: the kernel writes the log's pages in
    // its own time.
    crate::offload::lowered_thread(
        "strata-vlog-wb",
        WRITEBACK_QUEUE_MAX,
        |(file, from, to): (Arc<File>, u64, u64)| {
            use std::os::fd::AsRawFd;
            // SAFETY: a plain syscall on a file descriptor the `Arc` keeps open.
            unsafe {
                libc::sync_file_range(
                    file.as_raw_fd(),
                    from as libc::off64_t,
                    (to - from) as libc::off64_t,
                    libc::SYNC_FILE_RANGE_WRITE,
                );
            }
        },
    )
}

/// A slice of a mapped file, owned by the `Bytes` that holds it.
struct Mapped(Arc<Mmap>);

impl AsRef<[u8]> for Mapped {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

fn io(what: String) -> impl Fn(std::io::Error) -> Error {
    move |e| Error::Storage(format!("value log: {what}: {e}"))
}

fn parse_name(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(".vlog")?;
    (hex.len() == 16).then(|| u64::from_str_radix(hex, 16).ok())?
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(format!("sync {}", dir.display())))
}

impl ValueLog {
    /// Opens the log in `dir` (created if missing) and starts a new file to append to.
    /// `writeback_bytes`: start writing appended bytes to disk each time this many have
    /// accumulated (0: leave it to the kernel, which writes them in bursts).
    pub(crate) fn open(dir: &Path, file_bytes_max: u64, writeback_bytes: u64) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(io(format!("create {}", dir.display())))?;
        let last = list(dir)?.last().map_or(0, |f| f.0);
        let active = create(dir, last + 1)?;
        Ok(ValueLog {
            active_id: std::sync::atomic::AtomicU64::new(active.id),
            active_len: std::sync::atomic::AtomicU64::new(0),
            // Absolute, so that locations handed to local readers do not depend on our
            // working directory.
            dir: std::path::absolute(dir).map_err(io(format!("resolve {}", dir.display())))?,
            file_bytes_max: file_bytes_max.max(1),
            writeback_bytes,
            writeback: (writeback_bytes > 0).then(writeback_thread),
            active: Mutex::new(active),
            dirty: Mutex::default(),
            maps: RwLock::default(),
            retired: Mutex::default(),
            mapped: Mutex::default(),
        })
    }

    pub(crate) fn path_of(&self, id: u64) -> PathBuf {
        path_of(&self.dir, id)
    }

    /// Every file, as (id, length), oldest first.
    pub(crate) fn files(&self) -> Result<Vec<(u64, u64)>> {
        list(&self.dir)
    }

    /// The file being appended to; every lower id is sealed.
    pub(crate) fn active_id(&self) -> u64 {
        self.active_id.load(std::sync::atomic::Ordering::Acquire)
    }

    fn set_active(&self, a: &mut Active, next: Active) {
        use std::sync::atomic::Ordering::Release;
        self.active_len.store(0, Release);
        self.active_id.store(next.id, Release);
        // The sealed file's map covers its whole planned size; map it again at its real
        // length when it is next read.
        self.maps.write().remove(&a.id);
        *a = next;
    }

    /// Bytes of file `id` that values may lie in, for a map that may extend past them.
    fn readable_len(&self, id: u64, map_len: u64) -> Result<u64> {
        use std::sync::atomic::Ordering::Acquire;
        if id == self.active_id.load(Acquire) {
            let len = self.active_len.load(Acquire);
            // Still the active file: `len` is what its appends wrote.
            if id == self.active_id.load(Acquire) {
                return Ok(len);
            }
        }
        if map_len < self.file_bytes_max {
            return Ok(map_len); // mapped at its real length, once sealed
        }
        let path = self.path_of(id);
        Ok(std::fs::metadata(&path)
            .map_err(io(format!("stat {}", path.display())))?
            .len())
    }

    /// Appends an entry for `key` and returns where its value is. Not durable until
    /// [`ValueLog::sync`].
    pub(crate) fn append(&self, key: &Key, value: &[u8]) -> Result<ValuePointer> {
        let key = key.stored();
        let entry = (LOG_HEADER_BYTES + key.len() + value.len()) as u64;
        let mut a = self.active.lock();
        if a.len > 0 && a.len + entry > self.file_bytes_max {
            let next = create(&self.dir, a.id + 1)?;
            sync_dir(&self.dir)?;
            self.set_active(&mut a, next);
        }
        let header = encode_log_header(key.len(), value.len());
        let mut at = a.len;
        let what = || format!("append to file {:016x}", a.id);
        // Positional writes: a failed write leaves `len` where it was, and the next append
        // writes over the partial entry (which nothing points at).
        a.file.write_all_at(&header, at).map_err(io(what()))?;
        at += LOG_HEADER_BYTES as u64;
        a.file.write_all_at(key, at).map_err(io(what()))?;
        at += key.len() as u64;
        a.file.write_all_at(value, at).map_err(io(what()))?;
        let p = ValuePointer {
            file: a.id,
            offset: at,
            len: value.len() as u64,
        };
        a.len += entry;
        if let Some(wb) = self.writeback.as_ref() {
            if a.len - a.writeback_from >= self.writeback_bytes {
                // A full queue drops the request: the kernel writes the bytes in its time.
                let _ = wb.try_send((Arc::clone(&a.file), a.writeback_from, a.len));
                a.writeback_from = a.len;
            }
        }
        self.active_len
            .store(a.len, std::sync::atomic::Ordering::Release);
        self.dirty.lock().insert(a.id, Arc::clone(&a.file));
        Ok(p)
    }

    /// Makes every append that returned before this call durable.
    pub(crate) fn sync(&self) -> Result<()> {
        let files: Vec<(u64, Arc<File>)> = self.dirty.lock().drain().collect();
        for (id, f) in &files {
            if let Err(e) = f.sync_data() {
                // Put them back: a later sync must not report success for these bytes.
                self.dirty.lock().extend(files.iter().cloned());
                return Err(io(format!("sync file {id:016x}"))(e));
            }
        }
        Ok(())
    }

    /// Makes file creations and deletions in the log's directory durable.
    pub(crate) fn sync_dir(&self) -> Result<()> {
        sync_dir(&self.dir)
    }

    /// Starts a new file, so that every existing one is sealed.
    pub(crate) fn roll(&self) -> Result<()> {
        let mut a = self.active.lock();
        if a.len > 0 {
            let next = create(&self.dir, a.id + 1)?;
            sync_dir(&self.dir)?;
            self.set_active(&mut a, next);
        }
        Ok(())
    }

    /// Lets go of the maps of files deleted more than [`RETIRED_MAP_GRACE`] ago.
    pub(crate) fn release_retired(&self) {
        let now = std::time::Instant::now();
        let mut retired = self.retired.lock();
        let mut maps = self.maps.write();
        retired.retain(|(at, id)| {
            let keep = now.duration_since(*at) < RETIRED_MAP_GRACE;
            if !keep {
                maps.remove(id);
                self.mapped.lock().remove(id);
            }
            keep
        });
    }

    /// The value at `at`, without a copy: the bytes are the file's pages, mapped.
    pub(crate) fn read(&self, at: ValuePointer) -> Result<Bytes> {
        let end = at.offset.checked_add(at.len).ok_or_else(|| {
            Error::Data(format!(
                "value pointer past the end of file {:016x}",
                at.file
            ))
        })?;
        let map = match self.maps.read().get(&at.file) {
            Some(m) if m.len() as u64 >= end => Some(Arc::clone(m)),
            _ => None,
        };
        let map = match map {
            Some(m) => m,
            None => self.map(at.file, end)?,
        };
        // A map may reach past the file's end (the active file's is made at its full size);
        // touching a page there would be SIGBUS, so a pointer past what was written (a
        // corrupt record) is refused here.
        if end > self.readable_len(at.file, map.len() as u64)? {
            return Err(Error::Data(format!(
                "value pointer to {end} past the written end of value log file {:016x}",
                at.file
            )));
        }
        Ok(Bytes::from_owner(Mapped(map)).slice(at.offset as usize..end as usize))
    }

    /// Whether `value`'s bytes are pages of file `id`, mapped ([`ValueLog::read`] hands such
    /// views out; DRAM keeps them).
    pub(crate) fn lies_in(&self, id: u64, value: &[u8]) -> bool {
        let at = value.as_ptr() as usize;
        self.mapped
            .lock()
            .get(&id)
            .is_some_and(|ranges| ranges.iter().any(|r| r.contains(&at)))
    }

    /// The value `rec` (the record stored under `key`) keeps at `at`, checked against the
    /// record's checksum.
    pub(crate) fn read_checked(
        &self,
        key: &[u8],
        rec: &WarmRecord<'_>,
        at: ValuePointer,
    ) -> Result<Bytes> {
        let v = self.read(at)?;
        rec.verify(key, &v)?;
        Ok(v)
    }

    fn map(&self, id: u64, end: u64) -> Result<Arc<Mmap>> {
        let path = self.path_of(id);
        let file = File::open(&path).map_err(|e| {
            Error::Data(format!(
                "value log file {} unreadable ({e}) where a record points",
                path.display()
            ))
        })?;
        let len = file
            .metadata()
            .map_err(io(format!("stat {id:016x}")))?
            .len();
        if len < end {
            return Err(Error::Data(format!(
                "value log file {id:016x} holds {len} bytes, a record points at {end}"
            )));
        }
        // The file being appended to is mapped at its full size ahead of its writes, so that
        // reads of values written later do not map it again (and unmap the old map, which
        // costs a TLB shootdown). Pages past the end of the file are never touched: a read
        // only covers bytes an append already wrote.
        let map_len = match id == self.active_id() {
            true => len.max(self.file_bytes_max),
            false => len,
        };
        // SAFETY: value-log files are append-only: bytes already written are never changed
        // and files are never truncated (a file is only unlinked, which leaves existing maps
        // intact), so the mapped bytes stay what they were while any `Bytes` refers to them.
        let map = unsafe { memmap2::MmapOptions::new().len(map_len as usize).map(&file) };
        let map = Arc::new(map.map_err(io(format!("map {id:016x}")))?);
        let at = map.as_ptr() as usize;
        self.mapped
            .lock()
            .entry(id)
            .or_default()
            .push(at..at + map.len());
        self.maps.write().insert(id, Arc::clone(&map));
        Ok(map)
    }

    /// The entries of file `id` in order, as (key, where its value is), up to the first
    /// entry that is torn or missing (the end of what a crashed writer got down).
    pub(crate) fn entries(&self, id: u64) -> Result<Vec<(Key, ValuePointer)>> {
        let path = self.path_of(id);
        let file = File::open(&path).map_err(io(format!("open {}", path.display())))?;
        let len = file
            .metadata()
            .map_err(io(format!("stat {id:016x}")))?
            .len();
        let mut out = Vec::new();
        let mut at = 0u64;
        let mut header = [0u8; LOG_HEADER_BYTES];
        while at + LOG_HEADER_BYTES as u64 <= len {
            file.read_exact_at(&mut header, at)
                .map_err(io(format!("read {id:016x}")))?;
            let Ok(LogHeader {
                key_len,
                value_len,
                layout,
            }) = decode_log_header(&header)
            else {
                break;
            };
            let key_at = at + LOG_HEADER_BYTES as u64;
            let value_at = key_at + key_len as u64;
            if value_at + value_len > len {
                break;
            }
            let mut key = vec![0u8; key_len];
            file.read_exact_at(&mut key, key_at)
                .map_err(io(format!("read {id:016x}")))?;
            // Entries of layout 1 carry the client's key (database 0, slot 0).
            let key = match layout {
                1 => Key::from_layout_1(&key),
                _ => match Key::from_stored(&key) {
                    Ok(k) => k,
                    Err(_) => break,
                },
            };
            out.push((
                key,
                ValuePointer {
                    file: id,
                    offset: value_at,
                    len: value_len,
                },
            ));
            at = value_at + value_len;
        }
        Ok(out)
    }

    /// Deletes sealed file `id` (no record points into it any more). Values already handed
    /// out keep their pages until dropped; the file's map serves reads for
    /// [`RETIRED_MAP_GRACE`] more (the caller mapped it while moving its entries).
    pub(crate) fn remove_file(&self, id: u64) -> Result<()> {
        debug_assert!(id < self.active_id(), "the active file is never removed");
        let len = std::fs::metadata(self.path_of(id)).map_or(0, |m| m.len());
        let mapped = self.maps.read().get(&id).map_or(0, |m| m.len() as u64);
        if len > mapped {
            self.map(id, len)?;
        }
        self.retired.lock().push((std::time::Instant::now(), id));
        self.dirty.lock().remove(&id);
        match std::fs::remove_file(self.path_of(id)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io(format!("delete {id:016x}"))(e)),
        }
    }
}

/// Bytes an entry for `key` and a value of `value_len` bytes takes in a file.
pub(crate) fn entry_bytes(key_len: usize, value_len: u64) -> u64 {
    (LOG_HEADER_BYTES + key_len) as u64 + value_len
}

pub(crate) fn path_of(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id:016x}.vlog"))
}

fn create(dir: &Path, id: u64) -> Result<Active> {
    let path = path_of(dir, id);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(io(format!("create {}", path.display())))?;
    Ok(Active {
        id,
        file: Arc::new(file),
        len: 0,
        writeback_from: 0,
    })
}

/// The value-log files in `dir`, as (id, length), oldest first.
pub(crate) fn list(dir: &Path) -> Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(io(format!("list {}", dir.display()))(e)),
    };
    for e in rd {
        let e = e.map_err(io(format!("list {}", dir.display())))?;
        if let Some(id) = e.file_name().to_str().and_then(parse_name) {
            let len = e.metadata().map_err(io(format!("stat {id:016x}")))?.len();
            out.push((id, len));
        }
    }
    out.sort_unstable();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_read_back_without_a_copy_across_files() {
        let dir = tempfile::tempdir().unwrap();
        let log = ValueLog::open(dir.path(), 1000, 500).unwrap();
        let k = |s: &[u8]| Key::new(0, 0, s);
        let a = log.append(&k(b"a"), &[1u8; 600]).unwrap();
        let b = log.append(&k(b"bb"), &[2u8; 600]).unwrap();
        assert_eq!(
            a.file + 1,
            b.file,
            "the second entry does not fit: a new file"
        );
        assert_eq!(log.read(a).unwrap(), vec![1u8; 600]);
        assert_eq!(log.read(b).unwrap(), vec![2u8; 600]);
        // A read after more appends to the same file maps it again, longer.
        let c = log.append(&k(b"c"), &[3u8; 100]).unwrap();
        assert_eq!(c.file, b.file);
        assert_eq!(log.read(c).unwrap(), vec![3u8; 100]);
        log.sync().unwrap();
        let keys: Vec<Key> = log
            .entries(b.file)
            .unwrap()
            .into_iter()
            .map(|e| e.0)
            .collect();
        assert_eq!(keys, vec![k(b"bb"), k(b"c")]);
        assert!(log
            .read(ValuePointer {
                file: c.file,
                offset: c.offset,
                len: 10_000
            })
            .is_err());
        // Inside the active file's map but past what was written: refused, not touched
        // (a page past the end of the file would be SIGBUS).
        let past = ValuePointer { len: 200, ..c };
        assert!(matches!(log.read(past), Err(Error::Data(_))));
        let past = ValuePointer { len: 900, ..a };
        assert!(matches!(log.read(past), Err(Error::Data(_))));
    }

    #[test]
    fn reopening_starts_a_new_file_and_a_torn_tail_ends_the_walk() {
        let dir = tempfile::tempdir().unwrap();
        let first = {
            let log = ValueLog::open(dir.path(), 1 << 20, 0).unwrap();
            log.append(&Key::new(0, 0, b"k1"), b"one").unwrap();
            log.append(&Key::new(0, 0, b"k2"), b"two").unwrap();
            log.active_id()
        };
        // A crash mid-append: half a header at the end.
        let path = path_of(dir.path(), first);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend_from_slice(&encode_log_header(2, 3)[..7]);
        std::fs::write(&path, bytes).unwrap();
        let log = ValueLog::open(dir.path(), 1 << 20, 0).unwrap();
        assert_eq!(log.active_id(), first + 1);
        let e = log.entries(first).unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(log.read(e[1].1).unwrap(), &b"two"[..]);
        // A value read out keeps its pages after its file is deleted.
        let v = log.read(e[0].1).unwrap();
        log.remove_file(first).unwrap();
        assert_eq!(v, &b"one"[..]);
        assert!(!path_of(dir.path(), first).exists());
        // A read that raced with the deletion still gets its value during the grace period.
        assert_eq!(log.read(e[1].1).unwrap(), &b"two"[..]);
    }
}
