//! Per-command counters and latency histograms, and the Prometheus text of them and of any
//! figures (`strata_engine::stats`) handed in. Served over HTTP by `http`.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use strata_engine::stats::Stat;

/// Upper bounds of the latency buckets, in microseconds.
const BUCKETS_US: [u64; 12] = [
    25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 50_000, 250_000, 1_000_000,
];

/// The latency bucket of a call of `us` whole microseconds (none past the last bound).
fn bucket_of(us: u64) -> Option<usize> {
    BUCKETS_US.iter().position(|&b| us <= b)
}

/// One connection's calls of one command in a row, not yet in the shared counters: a
/// pipeline of one command moves each shared counter once ([`Metrics::flush`]), not at
/// every call. The connection flushes it before a call of another command (one that reads
/// the counters, `INFO`, sees every call before it) and before its replies go out.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    cmd: Option<usize>,
    calls: u64,
    errors: u64,
    nanos: u64,
    buckets: [u64; BUCKETS_US.len()],
}

impl Tally {
    /// The command counted, if any.
    pub(crate) fn command(&self) -> Option<usize> {
        self.cmd
    }

    /// Counts a call of `cmd`, the command counted ([`Metrics::flush`] first otherwise).
    pub(crate) fn add(&mut self, cmd: usize, took: Duration, error: bool) {
        debug_assert!(self.cmd.is_none_or(|c| c == cmd), "flushed before");
        self.cmd = Some(cmd);
        self.calls += 1;
        self.errors += error as u64;
        let nanos = took.as_nanos() as u64;
        self.nanos += nanos;
        if let Some(i) = bucket_of(nanos / 1000) {
            self.buckets[i] += 1;
        }
    }
}

#[derive(Default)]
struct CommandStats {
    calls: AtomicU64,
    errors: AtomicU64,
    micros_total: AtomicU64,
    buckets: [AtomicU64; BUCKETS_US.len()],
}

/// Most distinct error codes counted, as Redis counts them; replies with a code first seen
/// past this many are not counted.
const ERROR_CODES_MAX: usize = 128;

/// Counters of every command, by its place in the command table, and of the error replies
/// clients got, by code (`INFO errorstats`).
pub(crate) struct Metrics {
    names: Vec<&'static str>,
    commands: Vec<CommandStats>,
    error_codes: parking_lot::Mutex<std::collections::BTreeMap<String, u64>>,
}

impl Metrics {
    /// Counters for the commands `names` (in table order).
    pub(crate) fn new(names: Vec<&'static str>) -> Self {
        crate::stopwatch::start();
        Metrics {
            commands: names.iter().map(|_| CommandStats::default()).collect(),
            names,
            error_codes: Default::default(),
        }
    }

    /// Counts an error reply a client got, by its code (the first word: `ERR`,
    /// `WRONGTYPE`, a script's own).
    pub(crate) fn record_error_reply(&self, line: &str) {
        let code = line.split(' ').next().unwrap_or("ERR");
        let mut codes = self.error_codes.lock();
        if let Some(n) = codes.get_mut(code) {
            *n += 1;
        } else if codes.len() < ERROR_CODES_MAX {
            codes.insert(code.to_string(), 1);
        }
    }

    /// Error replies by code, in code order.
    pub(crate) fn error_codes(&self) -> Vec<(String, u64)> {
        self.error_codes
            .lock()
            .iter()
            .map(|(c, n)| (c.clone(), *n))
            .collect()
    }

    /// Forgets the error counts (`CONFIG RESETSTAT`).
    pub(crate) fn reset_error_codes(&self) {
        self.error_codes.lock().clear();
    }

    /// Moves what `t` counted to the shared counters (see [`Tally`]); returns how many
    /// calls it held.
    pub(crate) fn flush(&self, t: &mut Tally) -> u64 {
        let Some(cmd) = t.cmd.take() else {
            return 0;
        };
        let s = &self.commands[cmd];
        s.calls.fetch_add(t.calls, Ordering::Relaxed);
        s.micros_total.fetch_add(t.nanos / 1000, Ordering::Relaxed);
        if t.errors > 0 {
            s.errors.fetch_add(t.errors, Ordering::Relaxed);
        }
        for (b, n) in s.buckets.iter().zip(&mut t.buckets) {
            if *n > 0 {
                b.fetch_add(std::mem::take(n), Ordering::Relaxed);
            }
        }
        let calls = t.calls;
        (t.calls, t.errors, t.nanos) = (0, 0, 0);
        calls
    }

    /// Counts `calls` calls of command `cmd` that took `each` apiece, `errors` of them
    /// answered with an error (a pipelined run's: one move of each counter for all).
    pub(crate) fn record_calls(&self, cmd: usize, calls: u64, each: Duration, errors: u64) {
        let s = &self.commands[cmd];
        let us = each.as_micros() as u64;
        s.calls.fetch_add(calls, Ordering::Relaxed);
        s.micros_total.fetch_add(us * calls, Ordering::Relaxed);
        if errors > 0 {
            s.errors.fetch_add(errors, Ordering::Relaxed);
        }
        if let Some(i) = bucket_of(us) {
            s.buckets[i].fetch_add(calls, Ordering::Relaxed);
        }
    }

    /// `(name, calls, errors, total µs)` of every command called at least once.
    pub(crate) fn command_totals(&self) -> Vec<(&'static str, u64, u64, u64)> {
        self.names
            .iter()
            .zip(&self.commands)
            .filter_map(|(&name, s)| {
                let calls = s.calls.load(Ordering::Relaxed);
                (calls > 0).then(|| {
                    (
                        name,
                        calls,
                        s.errors.load(Ordering::Relaxed),
                        s.micros_total.load(Ordering::Relaxed),
                    )
                })
            })
            .collect()
    }
}

/// Renders the command metrics and `figures` in Prometheus text format.
pub(crate) fn render(m: &Metrics, figures: impl Iterator<Item = (&'static Stat, u64)>) -> String {
    let mut o = String::new();
    o.push_str("# HELP strata_command_calls_total Commands run, by command.\n# TYPE strata_command_calls_total counter\n");
    for (name, calls, _, _) in m.command_totals() {
        let _ = writeln!(o, "strata_command_calls_total{{cmd=\"{name}\"}} {calls}");
    }
    o.push_str("# HELP strata_command_errors_total Commands that replied with an error.\n# TYPE strata_command_errors_total counter\n");
    for (name, _, errors, _) in m.command_totals() {
        let _ = writeln!(o, "strata_command_errors_total{{cmd=\"{name}\"}} {errors}");
    }
    o.push_str("# HELP strata_command_duration_seconds Command latency.\n# TYPE strata_command_duration_seconds histogram\n");
    for (name, s) in m.names.iter().zip(&m.commands) {
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
                name,
                *b as f64 / 1e6
            );
        }
        let _ = writeln!(
            o,
            "strata_command_duration_seconds_bucket{{cmd=\"{}\",le=\"+Inf\"}} {calls}",
            name
        );
        let sum = s.micros_total.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(
            o,
            "strata_command_duration_seconds_sum{{cmd=\"{}\"}} {sum}",
            name
        );
        let _ = writeln!(
            o,
            "strata_command_duration_seconds_count{{cmd=\"{}\"}} {calls}",
            name
        );
    }
    write_figures(&mut o, figures);
    o
}

/// Renders figures in Prometheus text, each metric family once (HELP and TYPE from its
/// first figure), its figures in the order given.
fn write_figures(o: &mut String, rows: impl Iterator<Item = (&'static Stat, u64)>) {
    let mut families: Vec<(&'static Stat, Vec<(&'static str, u64)>)> = Vec::new();
    for (stat, v) in rows {
        match families.iter_mut().find(|f| f.0.metric == stat.metric) {
            Some(f) => f.1.push((stat.labels, v)),
            None => families.push((stat, vec![(stat.labels, v)])),
        }
    }
    for (first, values) in families {
        let name = first.metric;
        let _ = writeln!(o, "# HELP {name} {}", first.help);
        let _ = writeln!(o, "# TYPE {name} {}", first.kind.as_str());
        for (labels, v) in values {
            if labels.is_empty() {
                let _ = writeln!(o, "{name} {v}");
            } else {
                let _ = writeln!(o, "{name}{{{labels}}} {v}");
            }
        }
    }
}

/// Writes each KV-cache namespace's figures (`KVC.QUOTA`), labelled by namespace.
pub(crate) fn write_namespaces(o: &mut String, spaces: &[strata_kvcache::SpaceFigures]) {
    type Figure = fn(&strata_kvcache::SpaceFigures) -> u64;
    let families: [(&str, &str, &str, Figure); 4] = [
        (
            "strata_kvc_namespace_bytes",
            "gauge",
            "Bytes of a KV-cache namespace's chunks on this node, every tier counted.",
            |f| f.used_bytes,
        ),
        (
            "strata_kvc_namespace_chunks",
            "gauge",
            "Chunks of a KV-cache namespace on this node.",
            |f| f.chunks,
        ),
        (
            "strata_kvc_namespace_quota_bytes",
            "gauge",
            "A KV-cache namespace's quota on this node (0: none).",
            |f| f.quota,
        ),
        (
            "strata_kvc_namespace_dropped_total",
            "counter",
            "Chunks a KV-cache namespace dropped for its quota since the start.",
            |f| f.dropped,
        ),
    ];
    for (name, kind, help, figure) in families {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for f in spaces {
            let _ = writeln!(o, "{name}{{namespace=\"{}\"}} {}", f.label(), figure(f));
        }
    }
}
