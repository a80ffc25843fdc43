//! The free-space guard: writes that add bytes are refused while the disk under the warm
//! tier has less than `disk_free_min_bytes` free. RocksDB must not meet ENOSPC inside a
//! synced WAL append: Debian's build (7.8.3, assertions on) aborts the process there, and
//! even without the abort it would stop all writes until its own recovery ran. Refusing
//! early keeps reads, deletes and the already-written data untouched; writes resume as soon
//! as space returns (the free figure is re-read at most every `REFRESH`).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::{Error, Result};

const REFRESH: Duration = Duration::from_millis(100);

pub(crate) struct DiskGuard {
    path: CString,
    reserve: u64,
    /// Free bytes at the last refresh, minus what writes claimed since.
    free: AtomicI64,
    /// Start of the guard's clock, and when (ms after it) the free figure was last read.
    born: Instant,
    refreshed_ms: AtomicU64,
}

/// Free bytes available to us on the filesystem holding `path`.
fn free_bytes(path: &CString) -> Option<u64> {
    // SAFETY: statvfs writes only into the zeroed struct we own; `path` is NUL-terminated.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        (libc::statvfs(path.as_ptr(), &mut st) == 0)
            .then(|| st.f_bavail as u64 * st.f_frsize as u64)
    }
}

impl DiskGuard {
    pub(crate) fn new(dir: &Path, reserve: u64) -> DiskGuard {
        let path = CString::new(dir.as_os_str().as_bytes()).unwrap_or_default();
        let free = free_bytes(&path).unwrap_or(u64::MAX / 2);
        DiskGuard {
            path,
            reserve,
            free: AtomicI64::new(free.min(i64::MAX as u64) as i64),
            born: Instant::now(),
            refreshed_ms: AtomicU64::new(0),
        }
    }

    /// Claims room for a write of about `bytes`; refuses when it would eat into the reserve.
    pub(crate) fn claim(&self, bytes: u64) -> Result<()> {
        if self.reserve == 0 {
            return Ok(());
        }
        // One writer per REFRESH re-reads the free figure; the others go on without waiting.
        let now = self.born.elapsed().as_millis() as u64;
        let last = self.refreshed_ms.load(Ordering::Relaxed);
        if now >= last + REFRESH.as_millis() as u64
            && self
                .refreshed_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            if let Some(f) = free_bytes(&self.path) {
                self.free
                    .store(f.min(i64::MAX as u64) as i64, Ordering::Relaxed);
            }
        }
        let b = bytes as i64;
        let left = self.free.fetch_sub(b, Ordering::Relaxed) - b;
        if left < self.reserve as i64 {
            self.free.fetch_add(b, Ordering::Relaxed);
            return Err(Error::DiskFull(format!(
                "disk full: less than disk_free_min_bytes ({}) would stay free under {}; writes are refused until space is freed, reads still work",
                self.reserve,
                self.path.to_string_lossy()
            )));
        }
        Ok(())
    }
}
