//! The hot log's files (`hotlog/<gen>.log`) and their records, as the module above
//! describes them: appended to a buffer in the process, written out (and synced) by
//! whoever makes writes durable, replayed at open. A component: it knows nothing of the
//! engine.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::{Error, Result};

pub(crate) const OP_PUT: u8 = 1;

pub(crate) const OP_SETTLED: u8 = 2;

pub(crate) const OP_FLUSHED: u8 = 3;

pub(crate) const OP_DELTA: u8 = 4;

/// Bytes of a record before its key: length, checksum, op, kind, expiry, key length.
const RECORD_HEAD_BYTES: usize = 4 + 4 + 1 + 1 + 8 + 4;

/// Bytes the hot log buffers in the process before it asks to be written out early (with
/// `durability = none` it is written out every `none_flush_ms` otherwise).
pub(crate) const LOG_BUFFER_BYTES_MAX: usize = 4 << 20;

pub(crate) struct Record<'a> {
    pub(crate) op: u8,
    pub(crate) kind: u8,
    pub(crate) expire_ms: u64,
    pub(crate) key: &'a [u8],
    pub(crate) value: &'a [u8],
}

fn encode(out: &mut Vec<u8>, op: u8, kind: u8, expire_ms: u64, key: &[u8], value: &[u8]) {
    let body_len = RECORD_HEAD_BYTES - 8 + key.len() + value.len();
    out.reserve(8 + body_len);
    out.extend_from_slice(&(body_len as u32).to_le_bytes());
    let crc_at = out.len();
    out.extend_from_slice(&[0; 4]);
    let body_at = out.len();
    out.push(op);
    out.push(kind);
    out.extend_from_slice(&expire_ms.to_le_bytes());
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(value);
    let crc = crc32c::crc32c(&out[body_at..]);
    out[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
}

/// The record at `at` of `bytes` and where the next one starts; `None` at the end, or at a
/// torn or damaged record.
pub(crate) fn decode(bytes: &[u8], at: usize) -> Option<(Record<'_>, usize)> {
    let u32_at = |i: usize| -> Option<u32> {
        Some(u32::from_le_bytes(bytes.get(i..i + 4)?.try_into().ok()?))
    };
    let body_len = u32_at(at)? as usize;
    let crc = u32_at(at + 4)?;
    let body = bytes.get(at + 8..(at + 8).checked_add(body_len)?)?;
    if body.len() < RECORD_HEAD_BYTES - 8 || crc32c::crc32c(body) != crc {
        return None;
    }
    let key_len = u32::from_le_bytes(body[10..14].try_into().ok()?) as usize;
    let key = body.get(14..14usize.checked_add(key_len)?)?;
    Some((
        Record {
            op: body[0],
            kind: body[1],
            expire_ms: u64::from_le_bytes(body[2..10].try_into().ok()?),
            key,
            value: &body[14 + key_len..],
        },
        at + 8 + body_len,
    ))
}

/// The hot log's files: records are appended to a buffer in the process, and written out
/// (and synced) by whoever makes writes durable.
pub(crate) struct HotLog {
    pub(crate) dir: PathBuf,
    pub(crate) state: Mutex<LogState>,
    /// Notified when the buffer passes [`LOG_BUFFER_BYTES_MAX`]: whoever writes the log out
    /// periodically does so now.
    pub(crate) full: tokio::sync::Notify,
    /// Held while writing to the current file, and while switching files.
    pub(crate) file: Mutex<LogFile>,
    pub(crate) file_bytes: AtomicU64,
    /// The generation of the file records go to now. Changed only by a rotation, under the
    /// state lock: a record pushed under that lock names the file it will be written to.
    pub(crate) gen: AtomicU64,
    /// Bytes of writes that left their records to the next tick (`durability = none`):
    /// every [`LOG_BUFFER_BYTES_MAX`] of them wake the task that writes the logs out, as
    /// records in the buffer would, so the warm store's own buffered log is handed to the
    /// OS as often as before.
    pub(crate) deferred_bytes: AtomicU64,
    /// Logs what DRAM holds unlogged: the live values' changes (`crate::fold::fold_all`) and the
    /// dirty values whose writes logged nothing ([`log_unlogged`]). Whoever writes the log
    /// out calls it first ([`HotLog::log_deferred`]), so what it writes covers every change
    /// before.
    pub(crate) deferred: std::sync::OnceLock<Box<dyn Fn() -> Result<bool> + Send + Sync>>,
    /// Set while a hand-off of the logs (`durability = none`) has run past half its period:
    /// clients' writes wait for it ([`HotLog::pace`]), so that it finishes within the
    /// period although it runs at the background work's priority. Set and cleared only by
    /// [`HotLog::begin_late`] and [`HotLog::end_late`].
    pub(crate) late: AtomicBool,
    /// Notified when a late hand-off ends.
    pub(crate) caught_up: tokio::sync::Notify,
}

pub(crate) struct LogState {
    pub(crate) buf: Vec<u8>,
    /// Bytes ever appended, and of those, taken out of `buf` to be written.
    pub(crate) appended: u64,
    pub(crate) taken: u64,
}

pub(crate) struct LogFile {
    pub(crate) file: File,
    /// Bytes were written to `file` since its last sync: a sync with none is skipped.
    pub(crate) unsynced: bool,
    /// Why a write or sync failed after its records left the buffer: those records may be
    /// lost, so no later write-out may report success (the group commit would acknowledge
    /// them); every one fails with this.
    pub(crate) broken: Option<String>,
}

impl LogFile {
    /// The error of an earlier failure, if any.
    pub(crate) fn check(&self) -> Result<()> {
        match &self.broken {
            Some(why) => Err(Error::Storage(why.clone())),
            None => Ok(()),
        }
    }

    /// Writes `chunk` (taken from the buffer) and, with `sync`, syncs the file; a failure
    /// breaks the log for good.
    pub(crate) fn write(&mut self, chunk: &[u8], sync: bool, dir: &Path) -> Result<()> {
        self.check()?;
        if !chunk.is_empty() {
            self.unsynced = true;
        }
        let done = self
            .file
            .write_all(chunk)
            .and_then(|()| match sync && self.unsynced {
                true => self.file.sync_data(),
                false => Ok(()),
            });
        match done {
            Ok(()) => {
                if sync {
                    self.unsynced = false;
                }
                Ok(())
            }
            Err(e) => {
                let e = io_error("write", dir, e);
                self.broken = Some(format!("the hot log failed earlier: {e}"));
                Err(e)
            }
        }
    }
}

fn file_name(gen: u64) -> String {
    format!("{gen:016x}.log")
}

fn io_error(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::Storage(format!("cannot {what} {}: {e}", path.display()))
}

impl HotLog {
    /// The running hand-off of the logs has passed half its period: clients' writes wait
    /// ([`HotLog::pace`]) until [`HotLog::end_late`].
    pub(crate) fn begin_late(&self) {
        self.late.store(true, Ordering::Release);
    }

    /// The hand-off ended: writes waiting in [`HotLog::pace`] go on.
    pub(crate) fn end_late(&self) {
        if self.late.swap(false, Ordering::AcqRel) {
            self.caught_up.notify_waiters();
        }
    }

    /// Waits, before a client's write, while the logs' hand-off is late ([`HotLog::late`]),
    /// at most `max`: the writes a late hand-off has yet to log stop growing, and it gets
    /// the CPU they would take.
    pub(crate) async fn pace(&self, max: std::time::Duration) -> bool {
        if !self.late.load(Ordering::Acquire) {
            return false;
        }
        let ended = self.caught_up.notified();
        tokio::pin!(ended);
        ended.as_mut().enable();
        if self.late.load(Ordering::Acquire) {
            let _ = tokio::time::timeout(max, ended).await;
        }
        true
    }

    pub(crate) fn open(dir: &Path) -> Result<HotLog> {
        std::fs::create_dir_all(dir).map_err(|e| io_error("create", dir, e))?;
        let mut log = HotLog {
            dir: dir.to_path_buf(),
            full: tokio::sync::Notify::new(),
            late: AtomicBool::new(false),
            caught_up: tokio::sync::Notify::new(),
            state: Mutex::new(LogState {
                buf: Vec::new(),
                appended: 0,
                taken: 0,
            }),
            file: Mutex::new(LogFile {
                file: File::open(dir).map_err(|e| io_error("open", dir, e))?,
                unsynced: false,
                broken: None,
            }),
            file_bytes: AtomicU64::new(0),
            gen: AtomicU64::new(0),
            deferred_bytes: AtomicU64::new(0),
            deferred: std::sync::OnceLock::new(),
        };
        let gen = log.files()?.last().map_or(0, |f| f.0) + 1;
        log.file.get_mut().file = log.create(gen)?;
        *log.gen.get_mut() = gen;
        Ok(log)
    }

    pub(crate) fn create(&self, gen: u64) -> Result<File> {
        let path = self.dir.join(file_name(gen));
        let f = File::options()
            .append(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| io_error("create", &path, e))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_error("sync", &self.dir, e))?;
        Ok(f)
    }

    /// The log files, oldest first.
    pub(crate) fn files(&self) -> Result<Vec<(u64, PathBuf)>> {
        let mut out = Vec::new();
        let dir = std::fs::read_dir(&self.dir).map_err(|e| io_error("list", &self.dir, e))?;
        for e in dir {
            let e = e.map_err(|e| io_error("list", &self.dir, e))?;
            let name = e.file_name();
            let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".log")) else {
                continue;
            };
            if let Ok(gen) = u64::from_str_radix(stem, 16) {
                out.push((gen, e.path()));
            }
        }
        out.sort();
        Ok(out)
    }

    /// Appends one record to the buffer; returns the generation of the file it goes to.
    pub(crate) fn append(&self, op: u8, kind: u8, expire_ms: u64, key: &[u8], value: &[u8]) -> u64 {
        self.push(op, kind, expire_ms, key, value).0
    }

    /// [`HotLog::append`], also returning how many bytes the buffer holds now.
    pub(crate) fn push(
        &self,
        op: u8,
        kind: u8,
        expire_ms: u64,
        key: &[u8],
        value: &[u8],
    ) -> (u64, usize) {
        let mut s = self.state.lock();
        let before = s.buf.len();
        encode(&mut s.buf, op, kind, expire_ms, key, value);
        s.appended += (s.buf.len() - before) as u64;
        if before < LOG_BUFFER_BYTES_MAX && s.buf.len() >= LOG_BUFFER_BYTES_MAX {
            self.full.notify_one();
        }
        (self.gen.load(Ordering::Relaxed), s.buf.len())
    }

    /// Counts `bytes` of a write whose record waits for the tick (see `deferred_bytes`).
    pub(crate) fn note_deferred(&self, bytes: usize) {
        let every = LOG_BUFFER_BYTES_MAX as u64;
        let before = self
            .deferred_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
        if before / every != (before + bytes as u64) / every {
            self.full.notify_one();
        }
    }

    /// The generation of the file records go to now.
    pub(crate) fn gen(&self) -> u64 {
        self.gen.load(Ordering::Acquire)
    }

    /// Sets what [`HotLog::log_deferred`] does (once, at open).
    pub(crate) fn set_deferred(&self, deferred: Box<dyn Fn() -> Result<bool> + Send + Sync>) {
        let _ = self.deferred.set(deferred);
    }

    /// Logs what DRAM holds unlogged (live values' changes, dirty values); call before
    /// [`HotLog::mark`] when writing the logs out for durability. False: it stopped with
    /// the buffer full; write the logs out (as always) and call it again.
    pub(crate) fn log_deferred(&self) -> Result<bool> {
        self.deferred.get().map_or(Ok(true), |f| f())
    }

    /// Where the log ends now: pass it to [`HotLog::write_out`] after the warm store's own
    /// log has been written out.
    pub(crate) fn mark(&self) -> u64 {
        self.state.lock().appended
    }

    /// Writes what was appended before `upto` to the current file, and with `sync` makes
    /// it durable.
    pub(crate) fn write_out(&self, upto: u64, sync: bool) -> Result<()> {
        let mut f = self.file.lock();
        let chunk = {
            let mut s = self.state.lock();
            let n = upto.saturating_sub(s.taken).min(s.buf.len() as u64) as usize;
            let rest = s.buf.split_off(n);
            s.taken += n as u64;
            std::mem::replace(&mut s.buf, rest)
        };
        f.write(&chunk, sync, &self.dir)?;
        self.file_bytes
            .fetch_add(chunk.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    pub(crate) fn file_bytes(&self) -> u64 {
        self.file_bytes.load(Ordering::Relaxed)
    }

    /// Writes out and syncs the current file, then starts the next one; returns the
    /// generation of the file it closed.
    pub(crate) fn rotate(&self) -> Result<u64> {
        let mut f = self.file.lock();
        // Before the buffer is taken: a broken log keeps its records there.
        f.check()?;
        // Only a rotation changes the generation, and rotations hold the file lock.
        let gen = self.gen.load(Ordering::Acquire);
        let next = self.create(gen + 1)?;
        // Records appended from here on name the new file, and are written to it.
        let chunk = {
            let mut s = self.state.lock();
            s.taken = s.appended;
            self.gen.store(gen + 1, Ordering::Release);
            std::mem::take(&mut s.buf)
        };
        f.unsynced = true;
        f.write(&chunk, true, &self.dir)?;
        f.file = next;
        f.unsynced = false;
        self.file_bytes.store(0, Ordering::Relaxed);
        Ok(gen)
    }

    /// Deletes the files of generations up to `gen`.
    pub(crate) fn delete_through(&self, gen: u64) -> Result<()> {
        for (g, path) in self.files()? {
            if g <= gen {
                std::fs::remove_file(&path).map_err(|e| io_error("delete", &path, e))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// A client's write waits while the hand-off is late and goes on when it ends (or after
    /// its longest wait); with the hand-off on time it does not wait at all.
    #[tokio::test]
    pub(crate) async fn writes_wait_while_the_log_hand_off_is_late() {
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(HotLog::open(dir.path()).unwrap());
        let long = std::time::Duration::from_secs(60);
        assert!(!log.pace(long).await, "on time: no wait");
        log.begin_late();
        let waiting = tokio::spawn({
            let log = Arc::clone(&log);
            async move { log.pace(long).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        assert!(
            !waiting.is_finished(),
            "a write waits while the hand-off is late"
        );
        log.end_late();
        let waited = tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
            .await
            .expect("the write goes on once the hand-off ends")
            .unwrap();
        assert!(waited);
        // A hand-off that never ends holds a write for the longest wait, no longer.
        log.begin_late();
        let short = std::time::Duration::from_millis(50);
        tokio::time::timeout(std::time::Duration::from_secs(10), log.pace(short))
            .await
            .expect("the wait is bounded");
    }

    #[test]
    pub(crate) fn records_read_back_and_a_torn_tail_ends_the_file() {
        let mut buf = Vec::new();
        encode(&mut buf, OP_PUT, 0, 42, b"key", b"value");
        encode(&mut buf, OP_SETTLED, 0, 0, b"key", b"");
        let (r, next) = decode(&buf, 0).unwrap();
        assert_eq!(
            (r.op, r.expire_ms, r.key, r.value),
            (OP_PUT, 42, &b"key"[..], &b"value"[..])
        );
        let (r, end) = decode(&buf, next).unwrap();
        assert_eq!((r.op, r.key), (OP_SETTLED, &b"key"[..]));
        assert_eq!(end, buf.len());
        assert!(decode(&buf, end).is_none());
        // A torn tail, and a flipped byte, each end the file.
        assert!(decode(&buf[..buf.len() - 1], next).is_none());
        let mut bad = buf.clone();
        bad[12] ^= 1;
        assert!(decode(&bad, 0).is_none());
    }

    /// A write-out that lost its records (taken from the buffer, then the write failed) may
    /// never be followed by one that reports success: the group commit would acknowledge
    /// the lost records. A write-out with nothing new skips the sync, and still fails.
    #[test]
    pub(crate) fn a_failed_write_out_fails_every_later_one() {
        let dir = tempfile::tempdir().unwrap();
        let log = HotLog::open(dir.path()).unwrap();
        log.append(OP_PUT, 0, 0, b"a", b"1");
        log.write_out(log.mark(), true).unwrap();
        log.write_out(log.mark(), true).unwrap();
        // The file's handle swapped for one that cannot be written.
        log.file.lock().file = File::open(dir.path().join(file_name(1))).unwrap();
        log.append(OP_PUT, 0, 0, b"b", b"2");
        assert!(log.write_out(log.mark(), true).is_err());
        let again = log.write_out(log.mark(), true).unwrap_err();
        assert!(again.to_string().contains("failed earlier"), "{again}");
        assert!(log.rotate().is_err());
    }
}
