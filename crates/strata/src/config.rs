//! Strata's configuration: defaults, then a TOML file, then `STRATA_<KEY>` environment
//! variables, then command-line flags, each overriding the one before.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Deserializer, Serialize};

/// Every setting, with its default. Sizes accept integers or strings such as `"256MiB"`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Root of all local state: RocksDB in `warm/`, the default cold tier in `cold/`.
    pub data_dir: PathBuf,
    /// Address the Redis protocol listens on (loopback by default).
    pub bind: String,
    /// Redis protocol port.
    pub port: u16,
    /// HTTP port for `/metrics` and `/healthz` (0 disables it).
    pub metrics_port: u16,
    /// Port for Redis protocol over TLS (0 disables it); needs `tls_cert_file` and `tls_key_file`.
    pub tls_port: u16,
    /// Path of a Unix socket that also serves the Redis protocol (empty disables it), for
    /// clients on this machine (`redis-cli -s PATH`, `unix://PATH`).
    pub unixsocket: String,
    /// Permissions of the Unix socket, in octal (who may connect: `700` the owner only).
    pub unixsocketperm: String,
    /// PEM certificate chain for TLS.
    pub tls_cert_file: String,
    /// PEM private key for TLS.
    pub tls_key_file: String,
    #[serde(deserialize_with = "de_size")]
    pub hot_bytes_max: u64,
    /// DRAM eviction policy: `lru` or `strata` (frequency-weighted aging).
    pub hot_policy: String,
    #[serde(deserialize_with = "de_size")]
    pub warm_bytes_max: u64,
    /// Warm bytes past which writes are refused while demotion cannot keep up (for
    /// example during an object-store outage); 0 means 1.5 × warm_bytes_max.
    #[serde(deserialize_with = "de_size")]
    pub warm_bytes_hard_max: u64,
    /// Writes are refused while less than this is free on the data directory's disk.
    #[serde(deserialize_with = "de_size")]
    pub disk_free_min_bytes: u64,
    /// Write a value read from the object store back to the warm tier.
    pub cold_reads_return_to_warm: bool,
    /// Speculative prefetch after cold reads: block neighbours and Markov predictions.
    pub prefetch: bool,
    /// Most bytes one cold read may prefetch.
    #[serde(deserialize_with = "de_size")]
    pub prefetch_bytes_max: u64,
    /// Most predicted keys followed after one cold read.
    pub prefetch_keys_max: usize,
    /// Most prefetch jobs running at once.
    pub prefetch_tasks_max: usize,
    /// `sync`, `group` or `none`.
    pub durability: String,
    /// `file:///path` or `s3://bucket/prefix`; empty means `<data_dir>/cold`.
    pub cold_url: String,
    pub s3_endpoint: String,
    pub s3_region: String,
    pub s3_access_key_id: String,
    pub s3_secret_access_key: String,
    pub s3_allow_http: bool,
    #[serde(deserialize_with = "de_size")]
    pub blob_bytes_min: u64,
    /// Values at least this large go to the value log; 0 keeps them all in RocksDB.
    #[serde(deserialize_with = "de_size")]
    pub vlog_value_bytes_min: u64,
    #[serde(deserialize_with = "de_size")]
    pub vlog_file_bytes: u64,
    #[serde(deserialize_with = "de_size")]
    pub vlog_writeback_bytes: u64,
    pub vlog_garbage_fraction_max: f64,
    #[serde(deserialize_with = "de_size")]
    pub compaction_bytes_per_sec: u64,
    #[serde(deserialize_with = "de_size")]
    pub segment_bytes_max: u64,
    #[serde(deserialize_with = "de_size")]
    pub block_bytes: u64,
    pub zstd_level: i32,
    pub segment_live_fraction_min: f64,
    pub background_interval_ms: u64,
    pub cold_request_timeout_ms: u64,
    /// Most object-store reads in flight at once.
    pub cold_reads_max: usize,
    /// Largest bulk string accepted on the wire, and so the largest value (Redis's name).
    #[serde(rename = "proto_max_bulk_len", deserialize_with = "de_size")]
    pub proto_max_bulk_len: u64,
    /// Password for the `default` user; empty means no password.
    pub requirepass: String,
    pub maxclients: u64,
    /// Idle seconds before a client is disconnected (0 = never).
    pub timeout: u64,
    /// Bytes a client may have buffered in unparsed requests.
    #[serde(deserialize_with = "de_size")]
    pub client_query_buffer_limit: u64,
    /// Bytes of replies a client may leave unread before it is disconnected.
    #[serde(deserialize_with = "de_size")]
    pub client_output_buffer_limit: u64,
    /// Seconds a request may take to arrive once it has started (cuts off slowloris
    /// clients); 0 = no limit.
    pub client_request_timeout: u64,
    /// Seconds a client may leave its replies unread before it is cut off; 0 = no limit.
    pub client_write_timeout: u64,
    /// Refuse clients from other than 127.0.0.1 and ::1 while no password is set.
    pub protected_mode: bool,
    /// Failed AUTH attempts per client address per minute before AUTH is refused (0 = off).
    pub auth_failures_per_minute_max: u32,
    /// Named users, each `name:password:role` with role `readonly`, `readwrite` or `admin`.
    pub users: Vec<String>,
    /// Most value bytes pinned keys may hold.
    #[serde(deserialize_with = "de_size")]
    pub pinned_bytes_max: u64,
    /// `error`, `warn`, `info`, `debug` or `trace`.
    pub log_level: String,
}

impl Default for Config {
    fn default() -> Self {
        let e = strata_engine::EngineOptions::new("./strata-data");
        Config {
            data_dir: e.data_dir.clone(),
            bind: "127.0.0.1".into(),
            port: 6380,
            metrics_port: 9380,
            tls_port: 0,
            unixsocket: String::new(),
            unixsocketperm: "700".into(),
            tls_cert_file: String::new(),
            tls_key_file: String::new(),
            hot_bytes_max: e.hot_bytes_max,
            hot_policy: "strata".into(),
            warm_bytes_max: e.warm_bytes_max,
            warm_bytes_hard_max: 0,
            disk_free_min_bytes: e.disk_free_min_bytes,
            cold_reads_return_to_warm: e.cold_reads_return_to_warm,
            prefetch: e.prefetch,
            prefetch_bytes_max: e.prefetch_bytes_max,
            prefetch_keys_max: e.prefetch_keys_max,
            prefetch_tasks_max: e.prefetch_tasks_max,
            durability: "group".into(),
            cold_url: String::new(),
            s3_endpoint: String::new(),
            s3_region: String::new(),
            s3_access_key_id: String::new(),
            s3_secret_access_key: String::new(),
            s3_allow_http: false,
            blob_bytes_min: e.blob_bytes_min,
            vlog_value_bytes_min: e.vlog_value_bytes_min,
            vlog_file_bytes: e.vlog_file_bytes,
            vlog_writeback_bytes: e.vlog_writeback_bytes,
            vlog_garbage_fraction_max: e.vlog_garbage_fraction_max,
            compaction_bytes_per_sec: e.compaction_bytes_per_sec as u64,
            segment_bytes_max: e.segment_bytes_max,
            block_bytes: e.block_bytes as u64,
            zstd_level: e.zstd_level,
            segment_live_fraction_min: e.segment_live_fraction_min,
            background_interval_ms: e.background_interval_ms,
            cold_request_timeout_ms: e.cold_request_timeout_ms,
            cold_reads_max: e.cold_reads_max,
            proto_max_bulk_len: 512 << 20,
            requirepass: String::new(),
            maxclients: 10_000,
            timeout: 0,
            client_query_buffer_limit: 1 << 30,
            client_output_buffer_limit: 1 << 30,
            client_request_timeout: 60,
            client_write_timeout: 60,
            protected_mode: true,
            auth_failures_per_minute_max: 10,
            users: Vec::new(),
            pinned_bytes_max: e.pinned_bytes_max,
            log_level: "info".into(),
        }
    }
}

/// Parses `"64MiB"`, `"1gb"`, `"4096"` or an integer into bytes.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(mult)
}

fn de_size<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Int(u64),
        Str(String),
    }
    match Raw::deserialize(d)? {
        Raw::Int(n) => Ok(n),
        Raw::Str(s) => parse_size(&s).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "'{s}' is not a size; use bytes or e.g. 64MiB, 1GiB"
            ))
        }),
    }
}

/// Reads a raw override (`6380`, `true`, `sync`) as the TOML value it looks like.
fn raw_value(raw: &str) -> toml::Value {
    toml::from_str::<toml::Table>(&format!("v = {raw}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()))
}

impl Config {
    /// The names of all settings.
    pub fn keys() -> Vec<String> {
        match toml::Value::try_from(Config::default()) {
            Ok(toml::Value::Table(t)) => t.keys().cloned().collect(),
            _ => Vec::new(),
        }
    }

    /// Builds the configuration from a file (if any), the environment, then `overrides`.
    pub fn load(
        file: Option<&PathBuf>,
        env: &BTreeMap<String, String>,
        overrides: &[(String, String)],
    ) -> Result<Config> {
        let mut table = toml::Table::new();
        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read config file {}", path.display()))?;
            table = toml::from_str(&text)
                .with_context(|| format!("config file {} is not valid TOML", path.display()))?;
        }
        let keys = Self::keys();
        for key in &keys {
            if let Some(raw) = env.get(&format!("STRATA_{}", key.to_ascii_uppercase())) {
                table.insert(key.clone(), raw_value(raw));
            }
        }
        for (k, v) in overrides {
            let key = k.replace('-', "_");
            if !keys.contains(&key) {
                bail!("unknown setting '{k}'; `strata config` lists them all");
            }
            table.insert(key, raw_value(v));
        }
        // Strings are accepted where the default is a string even if they look like numbers.
        let defaults = toml::Value::try_from(Config::default())?;
        for (k, v) in table.iter_mut() {
            if let (Some(toml::Value::String(_)), false) = (defaults.get(k), v.is_str()) {
                *v = toml::Value::String(v.to_string());
            }
        }
        let cfg: Config = toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| {
                anyhow::anyhow!("bad configuration: {}", e.to_string().trim())
            })?;
        cfg.engine_options()?;
        cfg.server_config()?;
        if cfg.tls_port != 0 && (cfg.tls_cert_file.is_empty() || cfg.tls_key_file.is_empty()) {
            bail!("bad configuration: tls_port needs tls_cert_file and tls_key_file");
        }
        cfg.unixsocket_mode()?;
        Ok(cfg)
    }

    /// The Unix socket's permission bits, from `unixsocketperm`.
    pub fn unixsocket_mode(&self) -> Result<u32> {
        match u32::from_str_radix(self.unixsocketperm.trim(), 8) {
            Ok(mode) if mode <= 0o777 => Ok(mode),
            _ => bail!(
                "bad configuration: unixsocketperm '{}' is not octal permissions such as 700 or 770",
                self.unixsocketperm
            ),
        }
    }

    /// The server's settings for this configuration.
    pub fn server_config(&self) -> Result<strata_server::ServerConfig> {
        let users = self
            .users
            .iter()
            .map(|u| {
                u.parse::<strata_server::AclUser>()
                    .map_err(|e| anyhow::anyhow!("bad configuration: {e}"))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(strata_server::ServerConfig {
            requirepass: self.requirepass.clone(),
            users,
            maxclients: self.maxclients,
            timeout_secs: self.timeout,
            proto_max_bulk_len: self.proto_max_bulk_len.min(512 << 20),
            client_query_buffer_limit: self.client_query_buffer_limit,
            client_output_buffer_limit: self.client_output_buffer_limit,
            client_request_timeout_secs: self.client_request_timeout,
            client_write_timeout_secs: self.client_write_timeout,
            protected_mode: self.protected_mode,
            auth_failures_per_minute_max: self.auth_failures_per_minute_max,
        })
    }

    /// The TLS server configuration, when `tls_port` is set.
    pub fn tls_config(&self) -> Result<Option<std::sync::Arc<rustls::ServerConfig>>> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        if self.tls_port == 0 {
            return Ok(None);
        }
        let certs = CertificateDer::pem_file_iter(&self.tls_cert_file)
            .and_then(|it| it.collect::<std::result::Result<Vec<_>, _>>())
            .map_err(|e| {
                anyhow::anyhow!("cannot read tls_cert_file {}: {e}", self.tls_cert_file)
            })?;
        let key = PrivateKeyDer::from_pem_file(&self.tls_key_file)
            .map_err(|e| anyhow::anyhow!("cannot read tls_key_file {}: {e}", self.tls_key_file))?;
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .context("TLS certificate and key do not form a usable pair")?;
        Ok(Some(std::sync::Arc::new(cfg)))
    }

    /// The engine's options for this configuration, validated.
    pub fn engine_options(&self) -> Result<strata_engine::EngineOptions> {
        let mut o = strata_engine::EngineOptions::new(&self.data_dir);
        let opt = |s: &str| (!s.is_empty()).then(|| s.to_string());
        o.cold_url = opt(&self.cold_url);
        o.s3 = strata_engine::S3Options {
            endpoint: opt(&self.s3_endpoint),
            region: opt(&self.s3_region),
            access_key_id: opt(&self.s3_access_key_id),
            secret_access_key: opt(&self.s3_secret_access_key),
            allow_http: self.s3_allow_http,
        };
        o.hot_bytes_max = self.hot_bytes_max;
        o.hot_policy = self
            .hot_policy
            .parse()
            .map_err(|e: strata_engine::Error| anyhow::anyhow!("{e}"))?;
        o.warm_bytes_max = self.warm_bytes_max;
        o.warm_bytes_hard_max = self.warm_bytes_hard_max;
        o.disk_free_min_bytes = self.disk_free_min_bytes;
        o.cold_reads_return_to_warm = self.cold_reads_return_to_warm;
        o.prefetch = self.prefetch;
        o.prefetch_bytes_max = self.prefetch_bytes_max;
        o.prefetch_keys_max = self.prefetch_keys_max;
        o.prefetch_tasks_max = self.prefetch_tasks_max;
        o.durability = self
            .durability
            .parse()
            .map_err(|e: strata_engine::Error| anyhow::anyhow!("{e}"))?;
        o.blob_bytes_min = self.blob_bytes_min;
        o.vlog_value_bytes_min = self.vlog_value_bytes_min;
        o.vlog_file_bytes = self.vlog_file_bytes;
        o.vlog_writeback_bytes = self.vlog_writeback_bytes;
        o.vlog_garbage_fraction_max = self.vlog_garbage_fraction_max;
        o.compaction_bytes_per_sec = i64::try_from(self.compaction_bytes_per_sec)
            .context("compaction_bytes_per_sec too large")?;
        o.segment_bytes_max = self.segment_bytes_max;
        o.block_bytes = usize::try_from(self.block_bytes)?;
        o.zstd_level = self.zstd_level;
        o.segment_live_fraction_min = self.segment_live_fraction_min;
        o.background_interval_ms = self.background_interval_ms;
        o.cold_request_timeout_ms = self.cold_request_timeout_ms;
        o.cold_reads_max = self.cold_reads_max;
        o.pinned_bytes_max = self.pinned_bytes_max;
        o.value_bytes_max = usize::try_from(self.proto_max_bulk_len)?
            .min(strata_engine::EngineOptions::new(".").value_bytes_max);
        o.validate()
            .map_err(|e| anyhow::anyhow!("bad configuration: {e}"))?;
        Ok(o)
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
    fn layers_override_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("strata.toml");
        std::fs::write(
            &file,
            "port = 7000\nwarm_bytes_max = \"2GiB\"\ndurability = \"none\"\n",
        )
        .unwrap();
        let e = env(&[
            ("STRATA_PORT", "7001"),
            ("STRATA_HOT_BYTES_MAX", "64MiB"),
            ("STRATA_SEED", "1"),
        ]);
        let cfg = Config::load(Some(&file), &e, &[("durability".into(), "sync".into())]).unwrap();
        assert_eq!(cfg.port, 7001);
        assert_eq!(cfg.warm_bytes_max, 2 << 30);
        assert_eq!(cfg.hot_bytes_max, 64 << 20);
        assert_eq!(cfg.durability, "sync");
        assert_eq!(cfg.data_dir, PathBuf::from("./strata-data"));
    }

    #[test]
    fn bad_values_are_clear_errors() {
        let e = env(&[("STRATA_DURABILITY", "sometimes")]);
        let err = Config::load(None, &e, &[]).unwrap_err().to_string();
        assert!(
            err.contains("durability must be sync, group or none"),
            "{err}"
        );
        let err = Config::load(None, &env(&[("STRATA_PORT", "http")]), &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("port"), "{err}");
        let err = Config::load(None, &BTreeMap::new(), &[("nope".into(), "1".into())])
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown setting 'nope'"), "{err}");
        let err = Config::load(None, &env(&[("STRATA_WARM_BYTES_MAX", "lots")]), &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a size"), "{err}");
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("64MiB"), Some(64 << 20));
        assert_eq!(parse_size("1gb"), Some(1 << 30));
        assert_eq!(parse_size("1.5GiB"), None);
    }
}
