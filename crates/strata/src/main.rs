//! `strata`: run the server, inspect the configuration, and the operator's tools.

mod backup;
mod config;
mod namespaces;
mod runtime;
#[cfg(test)]
mod settings_page;
mod trace;

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

use crate::config::Config;
use crate::runtime::runtime;

/// jemalloc serves every allocation of the process, RocksDB's included (Redis's allocator:
/// size classes close to small entries' sizes, and freed pages handed back to the system).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read when it starts: freed pages go back to the system within a
/// second (by a background thread, not the threads serving clients), so `RssAnon`, which
/// `maxmemory` bounds, follows what is in use.
#[export_name = "malloc_conf"]
static MALLOC_CONF: &[u8; 85] =
    b"background_thread:true,max_background_threads:1,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

/// Strata: a tiered key-value store for AI inference (DRAM → RocksDB → object store) that
/// speaks the Redis protocol.
///
/// Configuration comes from defaults, then a TOML file (--config), then environment
/// variables STRATA_<KEY> (for example STRATA_PORT=6390, STRATA_DURABILITY=sync,
/// STRATA_COLD_URL=s3://bucket/prefix), then --set KEY=VALUE flags. `strata config`
/// prints every key with its effective value.
#[derive(Parser)]
#[command(name = "strata", version, about, long_about)]
struct Cli {
    /// TOML configuration file (also STRATA_CONFIG).
    #[arg(long, short = 'c', global = true, env = "STRATA_CONFIG")]
    config: Option<PathBuf>,
    /// Override one setting, e.g. --set warm_bytes_max=8GiB (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE", global = true)]
    set: Vec<String>,
    /// Data directory (the setting data_dir).
    #[arg(long, global = true)]
    data_dir: Option<PathBuf>,
    /// Redis protocol port (the setting port).
    #[arg(long, global = true)]
    port: Option<u16>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Open the store and serve the Redis protocol (and /metrics over HTTP) until SIGTERM,
    /// SIGINT or SHUTDOWN.
    Serve,
    /// Print the effective configuration as TOML.
    Config,
    /// Trace tools.
    #[command(subcommand)]
    Trace(TraceCommand),
    /// Write a consistent snapshot (RocksDB checkpoint, cold index, live segments) to a
    /// directory or object-store prefix, with progress. The store must not be open in a
    /// running server; for a live one use `redis-cli STRATA.BACKUP <url>`.
    Backup {
        /// Destination: file:///path or s3://bucket/prefix (S3 settings as for cold_url).
        #[arg(long)]
        to: String,
    },
    /// A cluster's state in etcd, and requests to its controller.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Restore a backup into an empty data directory and the configured cold tier.
    Restore {
        /// The backup: file:///path or s3://bucket/prefix.
        #[arg(long)]
        from: String,
    },
}

/// Which cluster: its etcd and its name (default: the settings cluster_etcd and
/// cluster_name).
#[derive(clap::Args)]
struct ClusterTarget {
    /// etcd endpoints, comma-separated (the setting cluster_etcd).
    #[arg(long)]
    etcd: Option<String>,
    /// The cluster's name (the setting cluster_name).
    #[arg(long)]
    name: Option<String>,
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Print the controller, the live nodes and each node's slots.
    Status(ClusterTarget),
    /// Spread the slots over the live nodes: the first time, create the slot map (every
    /// node started with the same cluster_etcd and cluster_name shares it); later, move
    /// slots with their keys until every node holds its share. Returns when done.
    Rebalance(ClusterTarget),
    /// Wait for the node at --addr (started with this cluster's cluster_etcd and
    /// cluster_name) to register, then rebalance so it gets its share.
    AddNode {
        #[command(flatten)]
        target: ClusterTarget,
        /// host:port of the new node.
        #[arg(long)]
        addr: String,
    },
    /// Move every slot of a node (by --node ID or --addr host:port) to the others, with
    /// their keys; then the node can be stopped.
    RemoveNode {
        #[command(flatten)]
        target: ClusterTarget,
        #[arg(long)]
        node: Option<String>,
        #[arg(long)]
        addr: Option<String>,
    },
}

#[derive(Subcommand)]
enum TraceCommand {
    /// Replay a trace (Mooncake JSON lines, or one key per line) against one cache per
    /// policy and capacity; a block hits only if every earlier block of its request hit.
    /// Prints a table and writes trace-replay.{md,json,png} under --out.
    Replay(trace::ReplayArgs),
}

fn load_config(cli: &Cli) -> Result<Config> {
    let env: BTreeMap<String, String> = std::env::vars()
        .filter(|(k, _)| k.starts_with("STRATA_"))
        .collect();
    let mut overrides = Vec::new();
    for kv in &cli.set {
        let (k, v) = kv
            .split_once('=')
            .with_context(|| format!("--set takes KEY=VALUE, got '{kv}'"))?;
        overrides.push((k.trim().to_string(), v.to_string()));
    }
    if let Some(d) = &cli.data_dir {
        overrides.push(("data_dir".into(), format!("\"{}\"", d.display())));
    }
    if let Some(p) = cli.port {
        overrides.push(("port".into(), p.to_string()));
    }
    Config::load(cli.config.as_ref(), &env, &overrides)
}

/// Runs the jemalloc control `name` (NUL-terminated) that takes no input and gives no output.
fn jemalloc_action(name: &[u8]) {
    debug_assert_eq!(name.last(), Some(&0));
    // SAFETY: such a control reads and writes no buffers; the name is NUL-terminated.
    unsafe {
        tikv_jemalloc_sys::mallctl(
            name.as_ptr().cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        );
    }
}

/// Hands every jemalloc arena's freed pages back to the system now (the memory governor
/// calls it when it lowers DRAM's budget; otherwise they go within a second).
fn purge_freed_pages() {
    // `MALLCTL_ARENAS_ALL` is 4096.
    jemalloc_action(b"arena.4096.purge\0");
}

/// Hands the calling thread's cache of freed jemalloc blocks back to their arena, so the
/// thread's next allocations come from the arena's pages, not from the holes it just freed.
fn flush_jemalloc_thread_cache() {
    jemalloc_action(b"thread.tcache.flush\0");
}

/// jemalloc's version, as `INFO` reports the allocator (`jemalloc-5.3.0`).
fn jemalloc_name() -> String {
    let mut version: *const std::ffi::c_char = std::ptr::null();
    let mut len = std::mem::size_of_val(&version);
    // SAFETY: `version` reads a `const char *` jemalloc keeps for the process's life; `len`
    // is that pointer's size.
    let read = unsafe {
        tikv_jemalloc_sys::mallctl(
            c"version".as_ptr(),
            (&raw mut version).cast(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    if read != 0 || version.is_null() {
        return "jemalloc".into();
    }
    // SAFETY: a NUL-terminated string jemalloc never frees.
    let full = unsafe { std::ffi::CStr::from_ptr(version) }.to_string_lossy();
    // "5.3.0-0-g54eaed1d8b56b1aa528be3bdd1877e59c56fa90c": the release, without the commit.
    format!("jemalloc-{}", full.split('-').next().unwrap_or(&full))
}

fn main() {
    strata_server::set_allocator(strata_server::Allocator {
        name: jemalloc_name(),
        release: purge_freed_pages,
        flush_thread_cache: flush_jemalloc_thread_cache,
    });
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        eprintln!("strata: {e:#}");
        // Without the exit handlers: RocksDB's static objects torn down beside threads of
        // a store that failed part way (its threads may outlive `Engine::close`) made the
        // exit die of SIGABRT ("terminate called without an active exception"). What the
        // store wrote is safe as after a kill; `eprintln!` is not buffered.
        // SAFETY: `_exit` ends the process; nothing runs after it.
        unsafe { libc::_exit(1) };
    }
}

fn run(cli: Cli) -> Result<()> {
    let cfg = load_config(&cli)?;
    if let Command::Trace(TraceCommand::Replay(args)) = &cli.command {
        return trace::replay(args, &cfg, &cli.set);
    }
    match cli.command {
        Command::Trace(_) => unreachable!("handled above"),
        Command::Config => {
            print!("{}", toml::to_string(&cfg)?);
            Ok(())
        }
        Command::Backup { to } => backup::backup(&cfg, &to),
        Command::Restore { from } => backup::restore(&cfg, &from),
        Command::Cluster(c) => runtime()?.block_on(cluster_command(&cfg, c)),
        Command::Serve => {
            let filter = tracing_subscriber::EnvFilter::try_new(&cfg.node.log_level)
                .context("bad log_level")?;
            use std::io::IsTerminal;
            tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_ansi(std::io::stderr().is_terminal())
                .with_writer(std::io::stderr)
                .init();
            crate::runtime::runtime_with(cfg.node.worker_threads)?.block_on(serve(cfg))
        }
    }
}

/// How long `strata cluster rebalance|add-node|remove-node` wait for the controller to
/// finish (moving slots takes as long as their bytes take at cluster_move_bytes_per_s).
const MOVE_WAIT: std::time::Duration = std::time::Duration::from_secs(3600);
/// How long `strata cluster add-node` waits for the node to register.
const NODE_REGISTER_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// The KV-cache namespaces of every live node, each one's figures summed (quotas are
/// per node: their sum is what the cluster may hold), one line per namespace.
async fn namespaces_summed(st: &strata_cluster::Status, password: &str) -> String {
    let mut sums: BTreeMap<Vec<u8>, [u64; 4]> = BTreeMap::new();
    let mut out = String::new();
    for addr in st.live.values() {
        match strata_server::node_namespaces(&addr.endpoint(), password).await {
            Ok(spaces) => {
                for f in spaces {
                    let s = sums.entry(f.namespace).or_default();
                    for (i, v) in [f.used_bytes, f.chunks, f.quota, f.dropped]
                        .into_iter()
                        .enumerate()
                    {
                        s[i] += v;
                    }
                }
            }
            Err(e) => out.push_str(&format!(
                "  (namespaces of {} not read: {e})\n",
                addr.endpoint()
            )),
        }
    }
    if sums.is_empty() {
        return out;
    }
    let mut head = format!(
        "KV-cache namespaces, summed over {} live nodes:\n",
        st.live.len()
    );
    for (ns, [used, chunks, quota, dropped]) in sums {
        let quota = if quota == 0 {
            "none".to_string()
        } else {
            quota.to_string()
        };
        head.push_str(&format!(
            "  {} {used} bytes in {chunks} chunks, quota {quota}, {dropped} dropped for it\n",
            String::from_utf8_lossy(&ns)
        ));
    }
    head + &out
}

async fn rebalance(etcd: &str, name: &str) -> Result<()> {
    eprintln!("rebalance: asking the controller of cluster '{name}'");
    let msg =
        strata_cluster::rebalance(etcd, name, MOVE_WAIT, |p| eprintln!("rebalance: {p}")).await?;
    println!("rebalanced: {msg}");
    Ok(())
}

async fn cluster_command(cfg: &Config, c: ClusterCommand) -> Result<()> {
    let target = |t: &ClusterTarget| -> Result<(String, String)> {
        let etcd = t
            .etcd
            .clone()
            .unwrap_or_else(|| cfg.cluster.cluster_etcd.clone());
        if etcd.trim().is_empty() {
            bail!("which etcd? pass --etcd URL or set cluster_etcd");
        }
        let name = t
            .name
            .clone()
            .unwrap_or_else(|| cfg.cluster.cluster_name.clone());
        Ok((etcd, name))
    };
    match c {
        ClusterCommand::Status(t) => {
            let (etcd, name) = target(&t)?;
            let st = strata_cluster::status(&etcd, &name).await?;
            println!("cluster '{name}' on {etcd}");
            print!("{st}");
            print!("{}", namespaces_summed(&st, &cfg.server.requirepass).await);
        }
        ClusterCommand::Rebalance(t) => {
            let (etcd, name) = target(&t)?;
            rebalance(&etcd, &name).await?;
        }
        ClusterCommand::AddNode { target: t, addr } => {
            let (etcd, name) = target(&t)?;
            let start = std::time::Instant::now();
            loop {
                let st = strata_cluster::status(&etcd, &name).await?;
                if st.live.values().any(|a| a.endpoint() == addr) {
                    break;
                }
                if start.elapsed() > NODE_REGISTER_WAIT {
                    bail!(
                        "no live node at {addr} in cluster '{name}' after {} s: start it with \
                         cluster_etcd and cluster_name set",
                        NODE_REGISTER_WAIT.as_secs()
                    );
                }
                eprintln!("add-node: waiting for {addr} to register");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            rebalance(&etcd, &name).await?;
        }
        ClusterCommand::RemoveNode {
            target: t,
            node,
            addr,
        } => {
            let (etcd, name) = target(&t)?;
            let id = match (node, addr) {
                (Some(id), None) => id,
                (None, Some(addr)) => {
                    let st = strata_cluster::status(&etcd, &name).await?;
                    let found = st.map.as_ref().and_then(|m| {
                        (0..m.node_count())
                            .find(|&i| m.addr(i).endpoint() == addr)
                            .map(|i| m.id(i).to_string())
                    });
                    found.with_context(|| format!("no node at {addr} in cluster '{name}'"))?
                }
                _ => bail!("name the node with --node ID or --addr host:port"),
            };
            eprintln!("remove-node: moving the slots of {id} to the other nodes");
            let msg = strata_cluster::remove_node(&etcd, &name, &id, MOVE_WAIT, |p| {
                eprintln!("remove-node: {p}")
            })
            .await?;
            println!("removed: {msg}");
        }
    }
    Ok(())
}

/// Raises the open-file limit so `maxclients` connections fit beside RocksDB's files (as
/// Redis does); warns when the hard limit is too low.
fn raise_fd_limit(maxclients: u64) {
    const RESERVED_FDS: u64 = 1024;
    let want = maxclients + RESERVED_FDS;
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return;
        }
        if lim.rlim_cur >= want {
            return;
        }
        let new = libc::rlimit {
            rlim_cur: want.min(lim.rlim_max),
            rlim_max: lim.rlim_max,
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &new) == 0 {
            lim.rlim_cur = new.rlim_cur;
        }
    }
    if lim.rlim_cur < want {
        tracing::warn!(
            open_files = lim.rlim_cur,
            maxclients,
            "the open-file limit is below maxclients + {RESERVED_FDS}; raise it (ulimit -n) or lower maxclients"
        );
    }
}

/// Listens on a Unix socket at `path` with permissions `mode`. A socket left there by an
/// earlier run is replaced; any other file is not touched.
fn bind_unix(path: &str, mode: u32) -> Result<tokio::net::UnixListener> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            bail!("cannot listen on unixsocket {path}: a file that is not a socket is there");
        }
        std::fs::remove_file(path)
            .with_context(|| format!("cannot replace the old socket {path}"))?;
    }
    let listener = tokio::net::UnixListener::bind(path)
        .with_context(|| format!("cannot listen on unixsocket {path}"))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set the permissions of {path}"))?;
    Ok(listener)
}

/// The bucket the cluster's nodes share, through this node's store, for the controller.
struct ClusterBucket {
    store: std::sync::Arc<dyn object_store::ObjectStore>,
    /// Who fences: this node as controller.
    by: String,
}

impl strata_cluster::SharedBucket for ClusterBucket {
    fn fence(&self, epoch: u64) -> strata_cluster::BucketFuture<u64> {
        let (store, by) = (std::sync::Arc::clone(&self.store), self.by.clone());
        Box::pin(async move {
            strata_engine::fence_bucket_log(store.as_ref(), epoch, &by)
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn retire(&self, epoch: u64) -> strata_cluster::BucketFuture<()> {
        let store = std::sync::Arc::clone(&self.store);
        Box::pin(async move {
            strata_engine::retire_bucket_epoch(store.as_ref(), epoch)
                .await
                .map_err(|e| e.to_string())
        })
    }
}

/// Takes this start's writer epoch from the cluster, before the store opens (its segments
/// go under it), and notes the node's earlier epochs.
async fn take_epoch(cfg: &mut Config) -> Result<()> {
    let id = strata_cluster::node_id(&cfg.node.data_dir)?;
    let epoch = strata_cluster::claim_epoch(&cfg.cluster, &id)
        .await
        .context("cannot take a writer epoch from the cluster")?;
    cfg.engine.writer_epoch = epoch;
    cfg.engine.earlier_epochs = strata_cluster::earlier_epochs(&cfg.cluster, &id, epoch)
        .await
        .context("cannot read this node's earlier writer epochs from the cluster")?;
    Ok(())
}

/// Binds every listener `cfg` asks for, `addr` first, and joins the cluster if it names one.
async fn bind(
    cfg: &Config,
    addr: &str,
    engine: &strata_engine::Engine,
) -> Result<(strata_server::Listeners, Option<strata_cluster::Cluster>)> {
    let tcp = tokio::net::TcpListener::bind(addr).await.with_context(|| {
        format!(
            "cannot listen on {addr} (is another server using the port? set port or STRATA_PORT)"
        )
    })?;
    let listen = |port: u16, what: &'static str| {
        let a = format!("{}:{}", cfg.node.bind, port);
        async move {
            tokio::net::TcpListener::bind(&a)
                .await
                .with_context(|| format!("cannot listen on {a} for {what}"))
        }
    };
    let metrics = match cfg.node.metrics_port {
        0 => None,
        port => Some(listen(port, "metrics (set metrics_port, 0 disables it)").await?),
    };
    let tls = match cfg.tls_config()? {
        Some(tls_cfg) => {
            let what = "TLS (set tls_port, 0 disables it)";
            Some((listen(cfg.node.tls_port, what).await?, tls_cfg))
        }
        None => None,
    };
    let unix = match cfg.node.unixsocket.as_str() {
        "" => None,
        path => Some(bind_unix(path, cfg.unixsocket_mode()?)?),
    };
    let cluster = match cfg.cluster.enabled() {
        true => Some(join(cfg, engine).await?),
        false => None,
    };
    let listeners = strata_server::Listeners {
        tcp,
        tls,
        unix,
        metrics,
    };
    Ok((listeners, cluster))
}

async fn join(cfg: &Config, engine: &strata_engine::Engine) -> Result<strata_cluster::Cluster> {
    let id = strata_cluster::node_id(&cfg.node.data_dir)?;
    let bucket = std::sync::Arc::new(ClusterBucket {
        store: engine.bucket(),
        by: format!("controller {id}"),
    });
    let c = strata_cluster::Cluster::join(&cfg.cluster, id, cfg.announce_addr(), Some(bucket))
        .await
        .context("cannot join the cluster")?;
    eprintln!(
        "Strata cluster node {} of '{}' (etcd {})",
        c.id(),
        cfg.cluster.cluster_name,
        cfg.cluster.cluster_etcd
    );
    Ok(c)
}

/// Shuts `server` down on SIGTERM or SIGINT.
fn stop_on_signals(server: strata_server::Server) {
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return;
        };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
        server.shutdown();
    });
}

async fn serve(mut cfg: Config) -> Result<()> {
    raise_fd_limit(cfg.server.maxclients);
    let server_cfg = cfg.server.clone();
    // Read the TLS files before opening the store, so a bad path fails fast.
    cfg.tls_config()?;
    if cfg.cluster.enabled() {
        take_epoch(&mut cfg).await?;
    }
    let engine = cfg
        .open_engine()
        .await
        .with_context(|| format!("cannot open the store in {}", cfg.node.data_dir.display()))?;
    // Past here an error closes the store before it ends the process: an open store's
    // threads would run on into the process's exit (which then died of a signal).
    let addr = format!("{}:{}", cfg.node.bind, cfg.node.port);
    let (listeners, cluster) = match bind(&cfg, &addr, &engine).await {
        Ok(b) => b,
        Err(e) => {
            let _ = engine.close().await;
            return Err(e);
        }
    };
    let feed = match strata_kvfeed::Feed::start(&cfg.kv_events) {
        Ok(f) => f,
        Err(e) => {
            let _ = engine.close().await;
            bail!("cannot start the KV event feed: {e}");
        }
    };
    let server = strata_server::Server::with_cluster(engine.clone(), server_cfg, cluster);
    if let Some(f) = feed {
        server.set_kv_feed(f);
    }
    stop_on_signals(server.clone());
    tracing::info!(
        addr = %addr,
        metrics_port = cfg.node.metrics_port,
        data_dir = %cfg.node.data_dir.display(),
        durability = cfg.engine.warm.durability.as_str(),
        "Strata ready"
    );
    let on_unix = match cfg.node.unixsocket.as_str() {
        "" => String::new(),
        path => format!(" and unix://{path}"),
    };
    eprintln!(
        "Strata ready: redis://{addr}{on_unix} (metrics on port {})",
        cfg.node.metrics_port
    );
    let served = server.serve(listeners).await;
    if !cfg.node.unixsocket.is_empty() {
        let _ = std::fs::remove_file(&cfg.node.unixsocket);
    }
    served?;
    engine.close().await.context("closing the store")?;
    tracing::info!("Strata stopped cleanly");
    Ok(())
}
