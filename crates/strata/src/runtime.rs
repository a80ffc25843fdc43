//! The tokio runtime every async command of the binary runs on, and how many threads serve
//! clients in it.

use anyhow::Result;

/// A multi-threaded runtime whose threads serve clients before background work, with the
/// number of workers the machine suggests.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    runtime_with(0)
}

/// [`runtime`] with `worker_threads` workers (0: [`auto_workers`]).
pub(crate) fn runtime_with(worker_threads: usize) -> Result<tokio::runtime::Runtime> {
    let workers = match worker_threads {
        0 => auto_workers(),
        n => n,
    };
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .on_thread_start(strata_engine::serve_clients_promptly)
        .build()?)
}

/// Workers when none are set: one per two cores the process may run on (its CPU affinity,
/// as `taskset` leaves it), at least one. The other half is left to the clients a small
/// machine runs beside the server and to the server's own background threads (RocksDB's
/// flushes and compactions, the log hand-off): on two cores shared with `redis-benchmark`,
/// two workers served 0.66–0.93× Redis's unpipelined `SET`s, `GET`s and `INCR`s per
/// second, one 0.94–1.13× (`reports/first-run.md`).
pub(crate) fn auto_workers() -> usize {
    workers_for(std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// [`auto_workers`] on a machine of `cores` cores.
fn workers_for(cores: usize) -> usize {
    (cores / 2).max(1)
}

#[cfg(test)]
mod tests {
    #[test]
    fn half_the_cores_serve_clients_and_never_none() {
        let got: Vec<usize> = [1, 2, 3, 4, 16, 64].map(super::workers_for).to_vec();
        assert_eq!(got, [1, 1, 1, 2, 8, 32]);
    }
}
