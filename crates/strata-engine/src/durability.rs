//! Group commit: writers append to the WAL without syncing, then wait for one shared fsync
//! that covers their write. A failed fsync poisons the engine; it is never retried.

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};
use rocksdb::DB;
use tokio::sync::watch;

use crate::vlog::ValueLog;
use crate::{Error, Result};

#[derive(Default)]
struct Requests {
    requested: u64,
    stop: bool,
}

pub(crate) struct GroupCommit {
    requests: Mutex<Requests>,
    wake: Condvar,
    /// (highest synced ticket, error of a failed sync).
    synced: watch::Sender<(u64, Option<String>)>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl GroupCommit {
    pub(crate) fn start(db: Arc<DB>, vlog: Arc<ValueLog>) -> Arc<Self> {
        let (tx, _rx) = watch::channel((0, None));
        let gc = Arc::new(GroupCommit {
            requests: Mutex::default(),
            wake: Condvar::new(),
            synced: tx,
            thread: Mutex::new(None),
        });
        let me = Arc::clone(&gc);
        let handle = std::thread::Builder::new()
            .name("strata-group-commit".into())
            .spawn(move || me.run(&db, &vlog))
            .expect("spawn group commit thread");
        *gc.thread.lock() = Some(handle);
        gc
    }

    fn run(&self, db: &DB, vlog: &ValueLog) {
        let mut synced = 0;
        loop {
            let target = {
                let mut r = self.requests.lock();
                while r.requested == synced && !r.stop {
                    self.wake.wait(&mut r);
                }
                if r.requested == synced && r.stop {
                    return;
                }
                r.requested
            };
            // Values before the records that point at them (see `vlog`).
            if let Err(e) = vlog
                .sync()
                .map_err(|e| e.to_string())
                .and_then(|()| db.flush_wal(true).map_err(|e| e.to_string()))
            {
                tracing::error!(error = %e, "WAL fsync failed; refusing further writes");
                self.synced.send_replace((synced, Some(e)));
                return;
            }
            synced = target;
            self.synced.send_replace((synced, None));
        }
    }

    /// Registers a write already in the WAL; returns the ticket to wait for.
    pub(crate) fn request(&self) -> u64 {
        let mut r = self.requests.lock();
        r.requested += 1;
        self.wake.notify_one();
        r.requested
    }

    pub(crate) async fn wait(&self, ticket: u64) -> Result<()> {
        let mut rx = self.synced.subscribe();
        let state = rx
            .wait_for(|(s, err)| *s >= ticket || err.is_some())
            .await
            .map_err(|_| Error::Closed)?;
        match &state.1 {
            Some(e) => Err(Error::Poisoned(e.clone())),
            None => Ok(()),
        }
    }

    /// Syncs what is pending, stops the thread and waits for it (it holds the database).
    pub(crate) fn stop(&self) {
        self.requests.lock().stop = true;
        self.wake.notify_one();
        if let Some(h) = self.thread.lock().take() {
            let _ = h.join();
        }
    }
}
