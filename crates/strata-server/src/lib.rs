//! Strata's Redis-protocol server: puts the engine on the wire for every Redis client.
//!
//! It accepts TCP, TLS and Unix-socket connections (tokio), parses RESP2/RESP3 requests with `strata-resp`,
//! runs commands against `strata-engine`, and serves `/metrics` and `/healthz` over HTTP.
//! What it is not: a storage engine (no byte of user data is kept here beyond a request's
//! life) or a RESP codec.
//!
//! ```no_run
//! # async fn demo(engine: strata_engine::Engine) -> std::io::Result<()> {
//! use strata_server::{Server, ServerConfig};
//! // `engine`: an open store (the `strata` binary opens one on RocksDB).
//! let server = Server::new(engine, ServerConfig::default());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:6380").await?;
//! server.serve(strata_server::Listeners::tcp(listener)).await?;
//! # Ok(()) }
//! ```

mod adopter;
mod auth;
mod blocked;
mod cmd;
mod config;
mod conn;
mod http;
mod kvchunks;
mod link;
mod longdouble;
mod memory;
mod metrics;
mod mover;
mod session;
mod shared;
mod stopwatch;
mod watch;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Mutex, RwLock};
use strata_engine::Engine;
use tokio::net::{TcpListener, UnixListener};

pub use auth::{AclUser, Role};
pub use config::{ServerConfig, CONFIG_NAMES, DATABASES_MAX, MAXMEMORY_MIN};
pub use link::node_namespaces;
pub use memory::{rss_anon_bytes_of, set_allocator, split as split_memory, Allocator};
pub use shared::{ServerStats, SERVER_STATS};

use shared::Shared;

/// Where the server accepts clients.
pub struct Listeners {
    /// Redis protocol over TCP.
    pub tcp: TcpListener,
    /// Redis protocol over TLS, with its configuration.
    pub tls: Option<(TcpListener, Arc<tokio_rustls::rustls::ServerConfig>)>,
    /// Redis protocol on a Unix socket, for clients on this machine.
    pub unix: Option<UnixListener>,
    /// `/metrics` and `/healthz` over HTTP.
    pub metrics: Option<TcpListener>,
}

impl Listeners {
    /// Plain TCP only.
    pub fn tcp(tcp: TcpListener) -> Listeners {
        Listeners {
            tcp,
            tls: None,
            unix: None,
            metrics: None,
        }
    }
}

/// The server: cheap to clone, all clones share one state.
#[derive(Clone)]
pub struct Server {
    shared: Arc<Shared>,
}

impl Server {
    /// Announces the KV-cache pool's chunks on `feed` from now on.
    pub fn set_kv_feed(&self, feed: strata_kvfeed::Feed) {
        feed.on_listing(kvchunks::listing_hook(&self.shared));
        let _ = self.shared.kv_feed.set(feed);
    }

    pub fn new(engine: Engine, cfg: ServerConfig) -> Server {
        Server::with_cluster(engine, cfg, None)
    }

    /// A server that is a node of `cluster` (if given): it serves the slots the cluster's
    /// map gives it and redirects the rest.
    pub fn with_cluster(
        engine: Engine,
        cfg: ServerConfig,
        cluster: Option<strata_cluster::Cluster>,
    ) -> Server {
        let (tx, _) = tokio::sync::watch::channel(false);
        let script_busy = Arc::new(tokio::sync::Notify::new());
        let notify = Arc::clone(&script_busy);
        // A script runs inside its client's task, on a worker that then polls neither I/O
        // nor timers. Once it is busy the worker's place goes to another thread
        // (`block_in_place`); the short sleep returns only when some thread polls the
        // runtime's timers again, so by then one does. The clients waiting for the gate are
        // woken from there, to answer `-BUSY`.
        let script = strata_script::Control::new(move || {
            tokio::task::block_in_place(|| {
                notify.notify_waiters();
                tokio::runtime::Handle::current()
                    .block_on(tokio::time::sleep(std::time::Duration::from_millis(1)));
            });
        });
        let server = Server {
            shared: Arc::new(Shared {
                engine,
                cfg: RwLock::new(cfg),
                clients: Mutex::new(HashMap::new()),
                clients_open: Default::default(),
                next_client_id: AtomicU64::new(1),
                gate: tokio::sync::RwLock::new(()),
                watches: watch::WatchRegistry::default(),
                metrics: metrics::Metrics::new(cmd::names()),
                shutdown: tx,
                started: Instant::now(),
                last_save_secs: AtomicU64::new(0),
                saving: Default::default(),
                counters: Default::default(),
                auth_limiter: auth::AuthLimiter::default(),
                backup: Mutex::new(Default::default()),
                blocked: Default::default(),
                scripts: Arc::new(parking_lot::Mutex::new(
                    strata_script::Vm::new(Arc::clone(&script)).expect("a Lua VM starts"),
                )),
                functions: Arc::new(parking_lot::Mutex::new(
                    strata_script::Functions::new(Arc::clone(&script)).expect("a Lua VM starts"),
                )),
                script,
                script_busy,
                running_script: Mutex::new(None),
                cluster,
                kv_feed: Default::default(),
                kvc_drops_running: Default::default(),
                kvc_quotas: Default::default(),
                links: Default::default(),
                encoding_params: Mutex::new(cmd::ENCODING_PARAMS.iter().copied().collect()),
            }),
        };
        if let Err(e) = cmd::scripting::restore_saved(&server.shared) {
            tracing::error!("{e}");
        }
        server
    }

    /// Asks the server to stop: no new connections, connections finish the requests they
    /// have read, then `serve` returns.
    pub fn shutdown(&self) {
        self.shared.shutdown.send_replace(true);
    }

    /// A receiver that turns true when shutdown starts (by signal, `SHUTDOWN` or `shutdown`).
    pub fn shutdown_signal(&self) -> tokio::sync::watch::Receiver<bool> {
        self.shared.shutdown.subscribe()
    }

    /// Accepts connections on each of `listeners` (and serves metrics, if given) until
    /// shutdown, then waits for open connections to finish their current requests.
    pub async fn serve(&self, listeners: Listeners) -> std::io::Result<()> {
        let Listeners {
            tcp: listener,
            tls,
            unix,
            metrics,
        } = listeners;
        if let Some(m) = metrics {
            tokio::spawn(http::serve_http(Arc::clone(&self.shared), m));
        }
        kvchunks::start(&self.shared);
        if let Some(c) = &self.shared.cluster {
            tokio::spawn(mover::run(Arc::clone(&self.shared), c.clone()));
            tokio::spawn(adopter::run(Arc::clone(&self.shared), c.clone()));
        }
        tokio::spawn(memory::govern(Arc::clone(&self.shared)));
        let (tls_listener, acceptor) = match tls {
            Some((l, cfg)) => (Some(l), Some(tokio_rustls::TlsAcceptor::from(cfg))),
            None => (None, None),
        };
        // What `CLIENT LIST` shows as the address of the Unix socket's clients.
        let unix_path: Arc<str> = match &unix {
            Some(l) => l
                .local_addr()?
                .as_pathname()
                .map(|p| p.to_string_lossy().into())
                .unwrap_or_else(|| "unix".into()),
            None => "".into(),
        };
        let mut stop = self.shared.shutdown.subscribe();
        let mut tasks = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                _ = stop.changed() => break,
                accepted = listener.accept() => {
                    let Some((sock, addr)) = accepted_or_pause(accepted).await else { continue };
                    let _ = sock.set_nodelay(true);
                    let peer = session::Peer::tcp(&sock, addr);
                    tasks.spawn(conn::handle(Arc::clone(&self.shared), sock, peer));
                }
                accepted = async { unix.as_ref().expect("guarded").accept().await }, if unix.is_some() => {
                    let Some((sock, _)) = accepted_or_pause(accepted).await else { continue };
                    let peer = session::Peer::Unix(Arc::clone(&unix_path));
                    tasks.spawn(conn::handle(Arc::clone(&self.shared), sock, peer));
                }
                accepted = async { tls_listener.as_ref().expect("guarded").accept().await }, if tls_listener.is_some() => {
                    let Some((sock, addr)) = accepted_or_pause(accepted).await else { continue };
                    let _ = sock.set_nodelay(true);
                    let peer = session::Peer::tcp(&sock, addr);
                    let acceptor = acceptor.clone().expect("TLS listener has an acceptor");
                    let shared = Arc::clone(&self.shared);
                    tasks.spawn(async move {
                        // The handshake gets ten seconds; a client that stalls it is dropped.
                        match tokio::time::timeout(std::time::Duration::from_secs(10), acceptor.accept(sock)).await {
                            Ok(Ok(tls)) => conn::handle(shared, tls, peer).await,
                            Ok(Err(e)) => tracing::debug!(%addr, error = %e, "TLS handshake failed"),
                            Err(_) => tracing::debug!(%addr, "TLS handshake timed out"),
                        }
                    });
                }
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            }
        }
        drop(listener);
        drop(unix);
        drop(tls_listener);
        let deadline = tokio::time::sleep(std::time::Duration::from_secs(10));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                next = tasks.join_next() => if next.is_none() { break },
                _ = &mut deadline => {
                    tracing::warn!(open = tasks.len(), "connections still open after 10 s; closing them");
                    tasks.abort_all();
                    break;
                }
            }
        }
        Ok(())
    }

    pub fn connected_clients(&self) -> usize {
        self.shared.clients_open.load(Ordering::Relaxed)
    }

    pub fn total_commands(&self) -> u64 {
        self.shared
            .counters
            .total_commands_processed
            .load(Ordering::Relaxed)
    }
}

/// Unwraps an accept result; on error (such as too many open files) logs and pauses briefly.
async fn accepted_or_pause<T>(accepted: std::io::Result<T>) -> Option<T> {
    match accepted {
        Ok(a) => Some(a),
        Err(e) => {
            tracing::warn!(error = %e, "accept failed");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            None
        }
    }
}
