//! Per-command counters and latency histograms, and the HTTP listener that serves them in
//! Prometheus text format at `/metrics` (with `/healthz` beside it).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::cmd::COMMANDS;
use crate::Shared;

/// Upper bounds of the latency buckets, in microseconds.
const BUCKETS_US: [u64; 12] = [
    25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 50_000, 250_000, 1_000_000,
];

#[derive(Default)]
struct CommandStats {
    calls: AtomicU64,
    errors: AtomicU64,
    micros_total: AtomicU64,
    buckets: [AtomicU64; BUCKETS_US.len()],
}

/// Counters of every command in the command table.
pub struct Metrics {
    commands: Vec<CommandStats>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        Metrics {
            commands: (0..COMMANDS.len())
                .map(|_| CommandStats::default())
                .collect(),
        }
    }

    pub(crate) fn record(&self, cmd: usize, took: Duration, error: bool) {
        let s = &self.commands[cmd];
        let us = took.as_micros() as u64;
        s.calls.fetch_add(1, Ordering::Relaxed);
        s.micros_total.fetch_add(us, Ordering::Relaxed);
        if error {
            s.errors.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(i) = BUCKETS_US.iter().position(|&b| us <= b) {
            s.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// `(name, calls, errors, total µs)` of every command called at least once.
    pub(crate) fn command_totals(&self) -> Vec<(&'static str, u64, u64, u64)> {
        COMMANDS
            .iter()
            .zip(&self.commands)
            .filter_map(|(spec, s)| {
                let calls = s.calls.load(Ordering::Relaxed);
                (calls > 0).then(|| {
                    (
                        spec.name,
                        calls,
                        s.errors.load(Ordering::Relaxed),
                        s.micros_total.load(Ordering::Relaxed),
                    )
                })
            })
            .collect()
    }
}

/// Renders every metric in Prometheus text format.
pub(crate) fn render(shared: &Shared) -> String {
    let mut o = String::new();
    let m = &shared.metrics;
    o.push_str("# HELP strata_command_calls_total Commands run, by command.\n# TYPE strata_command_calls_total counter\n");
    for (name, calls, _, _) in m.command_totals() {
        let _ = writeln!(o, "strata_command_calls_total{{cmd=\"{name}\"}} {calls}");
    }
    o.push_str("# HELP strata_command_errors_total Commands that replied with an error.\n# TYPE strata_command_errors_total counter\n");
    for (name, _, errors, _) in m.command_totals() {
        let _ = writeln!(o, "strata_command_errors_total{{cmd=\"{name}\"}} {errors}");
    }
    o.push_str("# HELP strata_command_duration_seconds Command latency.\n# TYPE strata_command_duration_seconds histogram\n");
    for (spec, s) in COMMANDS.iter().zip(&m.commands) {
        let calls = s.calls.load(Ordering::Relaxed);
        if calls == 0 {
            continue;
        }
        let mut cum = 0;
        for (b, c) in BUCKETS_US.iter().zip(&s.buckets) {
            cum += c.load(Ordering::Relaxed);
            let _ = writeln!(
                o,
                "strata_command_duration_seconds_bucket{{cmd=\"{}\",le=\"{}\"}} {cum}",
                spec.name,
                *b as f64 / 1e6
            );
        }
        let _ = writeln!(
            o,
            "strata_command_duration_seconds_bucket{{cmd=\"{}\",le=\"+Inf\"}} {calls}",
            spec.name
        );
        let sum = s.micros_total.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(
            o,
            "strata_command_duration_seconds_sum{{cmd=\"{}\"}} {sum}",
            spec.name
        );
        let _ = writeln!(
            o,
            "strata_command_duration_seconds_count{{cmd=\"{}\"}} {calls}",
            spec.name
        );
    }
    let st = shared.engine.stats();
    let gauge = |o: &mut String, name: &str, help: &str, kind: &str, rows: &[(&str, u64)]| {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, v) in rows {
            if labels.is_empty() {
                let _ = writeln!(o, "{name} {v}");
            } else {
                let _ = writeln!(o, "{name}{{{labels}}} {v}");
            }
        }
    };
    gauge(
        &mut o,
        "strata_tier_entries",
        "Entries per tier.",
        "gauge",
        &[
            ("tier=\"hot\"", st.hot.entries),
            ("tier=\"warm\"", st.warm.entries),
            ("tier=\"cold\"", st.cold.entries),
        ],
    );
    gauge(
        &mut o,
        "strata_tier_bytes",
        "Bytes per tier.",
        "gauge",
        &[
            ("tier=\"hot\"", st.hot.bytes),
            ("tier=\"warm\"", st.warm.bytes),
            ("tier=\"cold\"", st.cold.bytes),
        ],
    );
    gauge(
        &mut o,
        "strata_tier_bytes_max",
        "Byte budget per tier.",
        "gauge",
        &[
            ("tier=\"hot\"", st.hot.bytes_max),
            ("tier=\"warm\"", st.warm.bytes_max),
        ],
    );
    gauge(
        &mut o,
        "strata_warm_bytes_hard_max",
        "Warm bytes past which writes are refused.",
        "gauge",
        &[("", st.warm_bytes_hard_max)],
    );
    gauge(
        &mut o,
        "strata_writes_refused_full_total",
        "Writes refused because the warm tier was at its hard limit.",
        "counter",
        &[("", st.writes_refused_full)],
    );
    gauge(
        &mut o,
        "strata_wal_bytes_dropped",
        "WAL bytes dropped at the last open (a torn or truncated tail).",
        "gauge",
        &[("", st.wal_bytes_dropped)],
    );
    gauge(
        &mut o,
        "strata_vlog_bytes",
        "Bytes of the value-log files (large warm values, live and garbage).",
        "gauge",
        &[("", st.vlog_bytes)],
    );
    gauge(
        &mut o,
        "strata_vlog_files_collected_total",
        "Value-log files deleted after their live entries moved.",
        "counter",
        &[("", st.vlog_files_collected)],
    );
    let g = &shared.guard;
    let ld = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    gauge(
        &mut o,
        "strata_auth_failures_total",
        "AUTH attempts with a wrong password.",
        "counter",
        &[("", ld(&g.auth_failures))],
    );
    gauge(
        &mut o,
        "strata_auth_refused_total",
        "AUTH attempts refused unchecked: the address had too many failures this minute.",
        "counter",
        &[("", ld(&g.auth_refused))],
    );
    gauge(
        &mut o,
        "strata_clients_cut_off_total",
        "Clients disconnected by a defence.",
        "counter",
        &[
            ("reason=\"protected_mode\"", ld(&g.protected_denied)),
            ("reason=\"slow_request\"", ld(&g.slow_requests)),
            ("reason=\"not_reading\"", ld(&g.stalled_writes)),
            ("reason=\"protocol_error\"", ld(&g.protocol_errors)),
        ],
    );
    gauge(
        &mut o,
        "strata_tier_hits_total",
        "Reads served per tier.",
        "counter",
        &[
            ("tier=\"hot\"", st.hot.hits),
            ("tier=\"warm\"", st.warm.hits),
            ("tier=\"cold\"", st.cold.hits),
        ],
    );
    gauge(
        &mut o,
        "strata_misses_total",
        "Reads that found no key.",
        "counter",
        &[("", st.misses)],
    );
    gauge(
        &mut o,
        "strata_demotions_total",
        "Keys moved from warm to cold.",
        "counter",
        &[("", st.demotions)],
    );
    gauge(
        &mut o,
        "strata_promotions_total",
        "Keys copied into DRAM by reads.",
        "counter",
        &[("", st.promotions)],
    );
    gauge(
        &mut o,
        "strata_returns_to_warm_total",
        "Values read from the object store and written back to the warm tier.",
        "counter",
        &[("", st.returns_to_warm)],
    );
    gauge(
        &mut o,
        "strata_prefetches_total",
        "Values brought into DRAM by prefetch after cold reads.",
        "counter",
        &[("", st.prefetch_issued)],
    );
    gauge(
        &mut o,
        "strata_prefetch_used_total",
        "Prefetched values read from DRAM before eviction (cold reads avoided).",
        "counter",
        &[("", st.prefetch_used)],
    );
    gauge(
        &mut o,
        "strata_hot_evictions_total",
        "Entries evicted from DRAM.",
        "counter",
        &[("", st.hot_evictions)],
    );
    gauge(
        &mut o,
        "strata_expired_total",
        "Keys removed by expiry.",
        "counter",
        &[("", st.expired)],
    );
    gauge(
        &mut o,
        "strata_checksum_errors_total",
        "Stored bytes that failed verification.",
        "counter",
        &[("", st.checksum_errors)],
    );
    gauge(
        &mut o,
        "strata_segments_written_total",
        "Segments uploaded.",
        "counter",
        &[("", st.segments_written)],
    );
    gauge(
        &mut o,
        "strata_segments_deleted_total",
        "Segments deleted.",
        "counter",
        &[("", st.segments_deleted)],
    );
    let c = &st.cold_requests;
    gauge(
        &mut o,
        "strata_object_store_requests_total",
        "Object-store requests.",
        "counter",
        &[
            ("op=\"get\"", c.gets),
            ("op=\"put\"", c.puts),
            ("op=\"delete\"", c.deletes),
            ("op=\"list\"", c.lists),
        ],
    );
    gauge(
        &mut o,
        "strata_object_store_errors_total",
        "Failed object-store requests.",
        "counter",
        &[("", c.errors)],
    );
    gauge(
        &mut o,
        "strata_object_store_bytes_total",
        "Bytes moved to and from the object store.",
        "counter",
        &[("dir=\"get\"", c.get_bytes), ("dir=\"put\"", c.put_bytes)],
    );
    let _ = writeln!(o, "# HELP strata_object_store_get_seconds_sum Time spent in object-store GETs.\n# TYPE strata_object_store_get_seconds_sum counter\nstrata_object_store_get_seconds_sum {}", c.get_micros_total as f64 / 1e6);
    let clients = shared.clients.lock().len() as u64;
    gauge(
        &mut o,
        "strata_connected_clients",
        "Open client connections.",
        "gauge",
        &[("", clients)],
    );
    o
}

/// Serves `/metrics` and `/healthz` until the server shuts down.
pub(crate) async fn serve_http(shared: Arc<Shared>, listener: TcpListener) {
    let mut stop = shared.shutdown.subscribe();
    loop {
        let (mut sock, _) = tokio::select! {
            _ = stop.changed() => return,
            a = listener.accept() => match a { Ok(a) => a, Err(_) => continue },
        };
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            let mut n = 0;
            // Read the request head (bounded to 4 KiB, 5 s).
            let read = tokio::time::timeout(Duration::from_secs(5), async {
                while n < buf.len() {
                    let m = sock.read(&mut buf[n..]).await?;
                    if m == 0 {
                        break;
                    }
                    n += m;
                    if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
                Ok::<_, std::io::Error>(())
            })
            .await;
            if !matches!(read, Ok(Ok(()))) {
                return;
            }
            let head = String::from_utf8_lossy(&buf[..n]);
            let path = head.split_whitespace().nth(1).unwrap_or("/");
            let (status, ctype, body) = match path {
                "/metrics" => ("200 OK", "text/plain; version=0.0.4", render(&shared)),
                "/healthz" => ("200 OK", "text/plain", "ok\n".to_string()),
                _ => (
                    "404 Not Found",
                    "text/plain",
                    "not found; try /metrics or /healthz\n".to_string(),
                ),
            };
            let resp = format!("HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
            let _ = sock.write_all(resp.as_bytes()).await;
        });
    }
}
