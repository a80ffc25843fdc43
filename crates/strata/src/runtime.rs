//! The tokio runtime every async command of the binary runs on.

use anyhow::Result;

/// A multi-threaded runtime whose threads serve clients before background work.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_start(strata_engine::serve_clients_promptly)
        .build()?)
}
