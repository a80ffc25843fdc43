//! The state of the running script that the server sees: busy, written, asked to stop.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use strata_resp::Reply;

/// The state of the script running now, shared between the VMs and the server: whether
/// it has passed the busy threshold (other clients get `-BUSY`), whether it has written
/// (then it cannot be killed), and a kill request.
pub struct Control {
    running: AtomicBool,
    function: AtomicBool,
    busy: AtomicBool,
    kill: AtomicBool,
    wrote: AtomicBool,
    /// Called once when a run passes the busy threshold (the server wakes the clients
    /// waiting for it, so they answer `-BUSY`).
    on_busy: Box<dyn Fn() + Send + Sync>,
}

impl Control {
    pub fn new(on_busy: impl Fn() + Send + Sync + 'static) -> Arc<Control> {
        Arc::new(Control {
            running: AtomicBool::new(false),
            function: AtomicBool::new(false),
            busy: AtomicBool::new(false),
            kill: AtomicBool::new(false),
            wrote: AtomicBool::new(false),
            on_busy: Box::new(on_busy),
        })
    }

    /// The error other clients get while a script runs past the busy threshold.
    pub fn busy_error(&self) -> Option<Reply> {
        if !self.busy.load(Ordering::Relaxed) {
            return None;
        }
        let kill = if self.function.load(Ordering::Relaxed) {
            "FUNCTION KILL"
        } else {
            "SCRIPT KILL"
        };
        Some(Reply::err(format!(
            "BUSY Redis is busy running a script. You can only call {kill} or SHUTDOWN NOSAVE."
        )))
    }

    /// Whether a script runs now.
    pub fn is_running(&self) -> bool {
        self.running.load(Ordering::Relaxed)
    }

    /// Whether the running script is past the busy threshold.
    pub fn is_busy(&self) -> bool {
        self.busy.load(Ordering::Relaxed)
    }

    /// The running script called a write command: from now on it cannot be killed.
    pub fn note_write(&self) {
        self.wrote.store(true, Ordering::Relaxed);
    }

    /// `SCRIPT KILL` / `FUNCTION KILL`: asks the running script to stop, if it has not
    /// written; the refusal otherwise.
    pub fn kill(&self, function: bool) -> Result<(), Reply> {
        if !self.busy.load(Ordering::Relaxed) {
            return Err(Reply::err("NOTBUSY No scripts in execution right now."));
        }
        if self.function.load(Ordering::Relaxed) != function {
            // SCRIPT KILL does not stop a function, nor FUNCTION KILL a script: the
            // caller is told what is busy and how to stop it.
            return Err(self.busy_error().expect("busy"));
        }
        if self.wrote.load(Ordering::Relaxed) {
            return Err(Reply::err(
                "UNKILLABLE Sorry the script already executed write commands against the \
                 dataset. You can either wait the script termination or kill the server in a \
                 hard way using the SHUTDOWN NOSAVE command.",
            ));
        }
        self.kill.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// The running script passed the busy threshold: other clients get `-BUSY` from now on
    /// (the server is told once).
    pub(crate) fn set_busy(&self) {
        if !self.busy.swap(true, Ordering::Relaxed) {
            (self.on_busy)();
        }
    }

    /// Whether the running script was asked to stop.
    pub(crate) fn killed(&self) -> bool {
        self.kill.load(Ordering::Relaxed)
    }

    /// Stops the running script whether or not it wrote (`SHUTDOWN NOSAVE`).
    pub fn stop(&self) {
        if self.running.load(Ordering::Relaxed) {
            self.kill.store(true, Ordering::Relaxed);
        }
    }

    pub(crate) fn begin(&self, function: bool) {
        self.function.store(function, Ordering::Relaxed);
        self.busy.store(false, Ordering::Relaxed);
        self.kill.store(false, Ordering::Relaxed);
        self.wrote.store(false, Ordering::Relaxed);
        self.running.store(true, Ordering::Relaxed);
    }

    pub(crate) fn end(&self) {
        self.running.store(false, Ordering::Relaxed);
        self.busy.store(false, Ordering::Relaxed);
        self.kill.store(false, Ordering::Relaxed);
    }
}
