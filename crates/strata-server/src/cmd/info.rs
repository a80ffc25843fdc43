//! `INFO`: Redis's sections, with the names Redis clients parse, and `# Strata` with every
//! figure of the engine's table (`strata_engine::stats::STATS`), as `STRATA.STATS` and
//! `/metrics` show them.

use std::fmt::Write as _;

use bytes::Bytes;
use strata_resp::Reply;

use super::connection::REDIS_VERSION;
use super::ctx::{lower, Ctx};

/// The process's user and system CPU seconds (from `/proc/self/stat`; 0 where there is
/// none).
fn cpu_seconds() -> (f64, f64) {
    // Linux reports both in clock ticks of 1/100 s (USER_HZ).
    const TICKS_PER_SECOND: f64 = 100.0;
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    let at = |i: usize| f.get(i).copied().unwrap_or(0.0) / TICKS_PER_SECOND;
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    (at(11), at(12))
}

pub(crate) async fn info(ctx: &mut Ctx<'_>, a: &[Bytes]) -> Reply {
    Reply::Verbatim(text(ctx, a))
}

/// Writes `# title`, then `name:value` for each row, then a blank line.
fn section<V: std::fmt::Display>(
    o: &mut String,
    title: &str,
    rows: impl IntoIterator<Item = (&'static str, V)>,
) {
    let _ = write!(o, "# {title}\r\n");
    for (k, v) in rows {
        let _ = write!(o, "{k}:{v}\r\n");
    }
    o.push_str("\r\n");
}

fn text(ctx: &Ctx<'_>, a: &[Bytes]) -> String {
    let want: Vec<String> = a[1..].iter().map(|s| lower(s)).collect();
    // As Redis: no argument or `default` is every section but the command statistics;
    // `all` and `everything` are every section.
    let default = want.is_empty() || want.iter().any(|w| w == "default");
    let all = want.iter().any(|w| w == "all" || w == "everything");
    let show = |s: &str| all || default && s != "commandstats" || want.iter().any(|w| w == s);
    let sh = ctx.shared;
    let st = sh.engine.stats_now();
    let server = sh.stats();
    let mut o = String::new();
    if show("server") {
        let rows: [(&str, String); 8] = [
            ("redis_version", REDIS_VERSION.into()),
            ("strata_version", env!("CARGO_PKG_VERSION").into()),
            ("redis_mode", "standalone".into()),
            ("os", std::env::consts::OS.into()),
            ("arch_bits", "64".into()),
            ("process_id", std::process::id().to_string()),
            ("tcp_port", "0".into()),
            (
                "uptime_in_seconds",
                sh.started.elapsed().as_secs().to_string(),
            ),
        ];
        section(&mut o, "Server", rows);
    }
    if show("clients") {
        let rows = [
            ("connected_clients", server.connected_clients),
            ("maxclients", sh.cfg.read().maxclients),
            ("blocked_clients", sh.blocked.waiting() as u64),
        ];
        section(&mut o, "Clients", rows);
    }
    if show("replication") {
        // No replication: a primary with no replicas.
        section(
            &mut o,
            "Replication",
            [
                ("role", "master"),
                ("connected_slaves", "0"),
                ("master_repl_offset", "0"),
            ],
        );
    }
    if show("cpu") {
        let (user, sys) = cpu_seconds();
        section(
            &mut o,
            "CPU",
            [
                ("used_cpu_sys", format!("{sys:.6}")),
                ("used_cpu_user", format!("{user:.6}")),
            ],
        );
    }
    if show("memory") {
        // The process's memory is what `maxmemory` limits; the dataset is DRAM's tier.
        let rss = crate::memory::rss_anon_bytes();
        let mut rows = vec![
            ("used_memory", rss.to_string()),
            ("used_memory_rss", rss.to_string()),
            ("used_memory_dataset", st.hot_bytes.to_string()),
            ("mem_allocator", crate::memory::allocator_name().into()),
            ("maxmemory", sh.cfg.read().maxmemory.to_string()),
            ("maxmemory_policy", "strata-tiered".into()),
        ];
        // Not while a script runs (it holds its VM: `INFO` called from that script).
        if let Some(vm) = sh.scripts.try_lock() {
            rows.push(("number_of_cached_scripts", vm.len().to_string()));
        }
        section(&mut o, "Memory", rows);
    }
    if show("stats") {
        // Redis's names for what the engine counts, then the server's own figures.
        let redis = [
            ("keyspace_hits", st.hot_hits + st.warm_hits + st.cold_hits),
            ("keyspace_misses", st.misses),
            ("expired_keys", st.expired),
            ("evicted_keys", 0),
            (
                "total_error_replies",
                sh.metrics.error_codes().iter().map(|(_, n)| n).sum(),
            ),
        ];
        let own = server
            .rows()
            .into_iter()
            .filter(|(s, _)| s.name != "connected_clients" && !s.name.starts_with("cluster_"))
            .map(|(s, v)| (s.name, v));
        section(&mut o, "Stats", own.chain(redis));
    }
    if show("errorstats") {
        o.push_str("# Errorstats\r\n");
        for (code, n) in sh.metrics.error_codes() {
            let _ = write!(o, "errorstat_{code}:count={n}\r\n");
        }
        o.push_str("\r\n");
    }
    if show("commandstats") {
        o.push_str("# Commandstats\r\n");
        for (name, calls, errors, us) in sh.metrics.command_totals() {
            let per = if calls > 0 {
                us as f64 / calls as f64
            } else {
                0.0
            };
            let _ = write!(o, "cmdstat_{name}:calls={calls},usec={us},usec_per_call={per:.2},rejected_calls=0,failed_calls={errors}\r\n");
        }
        o.push_str("\r\n");
    }
    if show("keyspace") {
        o.push_str("# Keyspace\r\n");
        let databases = sh.cfg.read().databases;
        // Counted as they stand: a monitor's `INFO` must not write out what write-back
        // holds (seconds, for a few hundred megabytes of dirty values).
        for (db, keys) in sh
            .engine
            .keys_by_db_now(databases as usize)
            .into_iter()
            .enumerate()
        {
            if keys > 0 {
                let _ = write!(o, "db{db}:keys={keys},expires=0,avg_ttl=0\r\n");
            }
        }
        o.push_str("\r\n");
    }
    if show("cluster") {
        let mut rows = vec![("cluster_enabled", (sh.cluster.is_some() as u8).to_string())];
        if let Some(c) = &sh.cluster {
            rows.push(("cluster_node_id", c.id().to_string()));
            rows.extend(
                server
                    .rows()
                    .into_iter()
                    .filter(|(s, _)| s.name.starts_with("cluster_"))
                    .map(|(s, v)| (s.name, v.to_string())),
            );
        }
        section(&mut o, "Cluster", rows);
    }
    if show("persistence") {
        let b = sh.backup.lock();
        let status = if b.status.is_empty() {
            "none"
        } else {
            &b.status
        };
        let rows: [(&str, String); 6] = [
            ("loading", "0".into()),
            ("backup_in_progress", (b.running as u8).to_string()),
            ("backup_url", b.url.clone()),
            ("backup_done_bytes", b.done_bytes.to_string()),
            ("backup_total_bytes", b.total_bytes.to_string()),
            ("last_backup_status", status.to_string()),
        ];
        section(&mut o, "Persistence", rows);
    }
    if show("strata") {
        let settings = sh.engine.settings();
        let mut rows: Vec<(&str, String)> = st
            .rows()
            .into_iter()
            .map(|(s, v)| (s.name, v.to_string()))
            .collect();
        rows.push((
            "prefetch_precision",
            format!("{:.3}", st.prefetch_precision()),
        ));
        rows.push((
            "prefetch_coverage",
            format!("{:.3}", st.prefetch_coverage()),
        ));
        rows.push(("cold_url", sh.engine.cold_url().to_string()));
        rows.push(("durability", settings.warm.durability.as_str().to_string()));
        section(&mut o, "Strata", rows);
    }
    if show("kvcache") {
        kvcache_section(&mut o, sh);
    }
    o
}

/// `# KVCache`: each namespace the pool holds chunks of or has a quota for (`KVC.QUOTA`),
/// as `ns_<namespace>:quota=..,used_bytes=..,chunks=..,dropped=..`.
fn kvcache_section(o: &mut String, sh: &crate::shared::Shared) {
    o.push_str("# KVCache\r\n");
    for f in sh.kvc_quotas.figures() {
        let _ = write!(
            o,
            "ns_{}:quota={},used_bytes={},chunks={},dropped={}\r\n",
            f.label(),
            f.quota,
            f.used_bytes,
            f.chunks,
            f.dropped
        );
    }
    o.push_str("\r\n");
}
