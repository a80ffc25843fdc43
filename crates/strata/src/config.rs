//! Strata's configuration: this node's own settings beside each component's settings struct,
//! read as they are from defaults, then a TOML file, then `STRATA_<KEY>` environment
//! variables, then command-line flags, each overriding the one before (`strata-settings`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// What this node listens on and where it keeps its data.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct NodeSettings {
    /// Root of all local state: RocksDB in `warm/`, large values in `vlog/`, the default cold
    /// tier in `cold/`.
    pub data_dir: PathBuf,
    /// Address the Redis protocol listens on (loopback by default).
    pub bind: String,
    /// Redis protocol port.
    pub port: u16,
    /// HTTP port for `/metrics` and `/healthz` (0 disables it).
    pub metrics_port: u16,
    /// Port for Redis protocol over TLS (0 disables it); needs `tls_cert_file` and `tls_key_file`.
    pub tls_port: u16,
    /// PEM certificate chain for TLS.
    pub tls_cert_file: String,
    /// PEM private key for TLS.
    pub tls_key_file: String,
    /// Path of a Unix socket that also serves the Redis protocol (empty disables it), for
    /// clients on this machine (`redis-cli -s PATH`, `unix://PATH`).
    pub unixsocket: String,
    /// Permissions of the Unix socket, in octal (who may connect: `700` the owner only).
    pub unixsocketperm: String,
    /// `error`, `warn`, `info`, `debug` or `trace`.
    pub log_level: String,
    /// Threads that serve clients (the async runtime's workers); 0 chooses by the cores
    /// the process may run on (`docs/configuration.md`, "Threads").
    pub worker_threads: usize,
}

impl Default for NodeSettings {
    fn default() -> Self {
        NodeSettings {
            data_dir: PathBuf::from("./strata-data"),
            bind: "127.0.0.1".into(),
            port: 6380,
            metrics_port: 9380,
            tls_port: 0,
            tls_cert_file: String::new(),
            tls_key_file: String::new(),
            unixsocket: String::new(),
            unixsocketperm: "700".into(),
            log_level: "info".into(),
            worker_threads: 0,
        }
    }
}

/// Most threads serving clients a node may be given.
const WORKER_THREADS_MAX: usize = 1024;

/// Every setting, by component.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Config {
    #[serde(flatten)]
    pub node: NodeSettings,
    #[serde(flatten)]
    pub engine: strata_engine::Settings,
    #[serde(flatten)]
    pub rocks: strata_rocks::RocksSettings,
    #[serde(flatten)]
    pub server: strata_server::ServerConfig,
    #[serde(flatten)]
    pub cluster: strata_cluster::ClusterSettings,
    #[serde(flatten)]
    pub kv_events: strata_kvfeed::FeedSettings,
}

impl Config {
    /// Builds the configuration from a file (if any), the environment, then `overrides`,
    /// and checks it.
    pub fn load(
        file: Option<&PathBuf>,
        env: &BTreeMap<String, String>,
        overrides: &[(String, String)],
    ) -> Result<Config> {
        let mut cfg: Config =
            strata_settings::load(file.map(|p| p.as_path()), env, "STRATA_", overrides)?;
        cfg.server
            .validate()
            .map_err(|e| anyhow::anyhow!("bad configuration: {e}"))?;
        cfg.apply_maxmemory();
        if cfg.cluster.enabled() {
            cfg.cluster
                .validate()
                .map_err(|e| anyhow::anyhow!("bad configuration: {e}"))?;
        }
        // In a cluster, every key carries its slot.
        cfg.engine.key_slots = cfg.cluster.enabled();
        cfg.engine
            .validate()
            .map_err(|e| anyhow::anyhow!("bad configuration: {e}"))?;
        let n = &cfg.node;
        if n.tls_port != 0 && (n.tls_cert_file.is_empty() || n.tls_key_file.is_empty()) {
            bail!("bad configuration: tls_port needs tls_cert_file and tls_key_file");
        }
        cfg.unixsocket_mode()?;
        cfg.kv_events
            .validate()
            .map_err(|e| anyhow::anyhow!("bad configuration: {e}"))?;
        if n.worker_threads > WORKER_THREADS_MAX {
            bail!("bad configuration: worker_threads must be at most {WORKER_THREADS_MAX} (0 chooses by the cores)");
        }
        Ok(cfg)
    }

    /// With `maxmemory` set, carves the process's memory up (`strata_server::split_memory`):
    /// RocksDB's memtables and block cache get their shares, and DRAM's budget
    /// (`hot_bytes_max`) is what remains; the server moves DRAM's budget below that at run
    /// time to hold the limit.
    fn apply_maxmemory(&mut self) {
        let limit = self.server.maxmemory;
        if limit == 0 {
            return;
        }
        let asked = strata_engine::MemoryShares {
            memtables_bytes_max: self.rocks.rocksdb_memtables_bytes_max,
            block_cache_bytes: self.rocks.rocksdb_block_cache_bytes,
        };
        let split = strata_server::split_memory(limit, asked);
        self.rocks.rocksdb_memtables_bytes_max = split.warm.memtables_bytes_max;
        self.rocks.rocksdb_block_cache_bytes = split.warm.block_cache_bytes;
        self.engine.hot.hot_bytes_max = split.dram;
    }

    /// The address this node announces to clients and other nodes in a cluster.
    pub fn announce_addr(&self) -> strata_cluster::NodeAddr {
        let host = match (
            self.cluster.cluster_announce_host.as_str(),
            self.node.bind.as_str(),
        ) {
            ("", "0.0.0.0" | "::" | "") => "127.0.0.1".to_string(),
            ("", bind) => bind.to_string(),
            (host, _) => host.to_string(),
        };
        strata_cluster::NodeAddr {
            host,
            port: self.node.port,
        }
    }

    /// The Unix socket's permission bits, from `unixsocketperm`.
    pub fn unixsocket_mode(&self) -> Result<u32> {
        let perm = &self.node.unixsocketperm;
        match u32::from_str_radix(perm.trim(), 8) {
            Ok(mode) if mode <= 0o777 => Ok(mode),
            _ => bail!(
                "bad configuration: unixsocketperm '{perm}' is not octal permissions such as 700 or 770"
            ),
        }
    }

    /// The TLS server configuration, when `tls_port` is set.
    pub fn tls_config(&self) -> Result<Option<std::sync::Arc<rustls::ServerConfig>>> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let n = &self.node;
        if n.tls_port == 0 {
            return Ok(None);
        }
        let certs = CertificateDer::pem_file_iter(&n.tls_cert_file)
            .and_then(|it| it.collect::<std::result::Result<Vec<_>, _>>())
            .map_err(|e| anyhow::anyhow!("cannot read tls_cert_file {}: {e}", n.tls_cert_file))?;
        let key = PrivateKeyDer::from_pem_file(&n.tls_key_file)
            .map_err(|e| anyhow::anyhow!("cannot read tls_key_file {}: {e}", n.tls_key_file))?;
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .context("TLS certificate and key do not form a usable pair")?;
        Ok(Some(std::sync::Arc::new(cfg)))
    }

    /// Opens the store this configuration describes: RocksDB as the warm store, then the
    /// engine over it.
    pub async fn open_engine(&self) -> Result<strata_engine::Engine> {
        let dir = &self.node.data_dir;
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create data directory {}", dir.display()))?;
        // Writes that are not durable anyway keep their log records in the process until
        // the engine flushes them (every `none_flush_ms`).
        let buffered = self.engine.warm.durability == strata_engine::Durability::None;
        let warm = strata_rocks::RocksWarm::open_with_log(
            &strata_engine::warm_dir(dir),
            &self.rocks,
            buffered,
        )
        .map_err(|e| anyhow::anyhow!("{e}"))?;
        let parts = strata_engine::Parts::new(dir, self.engine.clone(), std::sync::Arc::new(warm));
        Ok(strata_engine::Engine::open_with(parts).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn layers_override_in_order_into_each_component() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("strata.toml");
        std::fs::write(
            &file,
            "port = 7000\nwarm_bytes_max = \"2GiB\"\ndurability = \"none\"\nblob_bytes_min = 8192\n",
        )
        .unwrap();
        let e = env(&[
            ("STRATA_PORT", "7001"),
            ("STRATA_HOT_BYTES_MAX", "64MiB"),
            ("STRATA_MAXCLIENTS", "50"),
            ("STRATA_SEED", "1"),
        ]);
        let cfg = Config::load(Some(&file), &e, &[("durability".into(), "sync".into())]).unwrap();
        assert_eq!(cfg.node.port, 7001);
        assert_eq!(cfg.engine.warm.warm_bytes_max, 2 << 30);
        assert_eq!(cfg.engine.hot.hot_bytes_max, 64 << 20);
        assert_eq!(cfg.engine.warm.durability, strata_engine::Durability::Sync);
        assert_eq!(cfg.rocks.blob_bytes_min, 8192);
        assert_eq!(cfg.server.maxclients, 50);
        assert_eq!(cfg.node.data_dir, PathBuf::from("./strata-data"));
        // Every component's settings are keys of the one flat file.
        let keys = strata_settings::keys::<Config>();
        for k in [
            "port",
            "hot_bytes_max",
            "cold_url",
            "blob_bytes_min",
            "requirepass",
        ] {
            assert!(keys.iter().any(|x| x == k), "{k} in {keys:?}");
        }
    }

    #[test]
    fn bad_values_are_clear_errors() {
        let e = env(&[("STRATA_DURABILITY", "sometimes")]);
        let err = Config::load(None, &e, &[]).unwrap_err().to_string();
        assert!(
            err.contains("durability must be sync, group, none or bucket"),
            "{err}"
        );
        let err = Config::load(None, &env(&[("STRATA_PORT", "http")]), &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("port") || err.contains("invalid"), "{err}");
        let err = Config::load(None, &BTreeMap::new(), &[("nope".into(), "1".into())])
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown setting 'nope'"), "{err}");
        let err = Config::load(None, &env(&[("STRATA_WARM_BYTES_MAX", "lots")]), &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a size"), "{err}");
        let err = Config::load(None, &env(&[("STRATA_USERS", "[\"alice\"]")]), &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("name:password:role"), "{err}");
        let err = Config::load(None, &env(&[("STRATA_PROTO_MAX_BULK_LEN", "1GiB")]), &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("proto_max_bulk_len"), "{err}");
    }
}
