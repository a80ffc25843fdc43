//! The binary's configuration surface: help, bad configuration, env overrides.

use std::process::Command;

fn strata(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_strata"));
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

#[test]
fn help_documents_the_commands_and_configuration() {
    let out = strata(&["--help"], &[]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for word in ["serve", "config", "STRATA_", "--set", "--config"] {
        assert!(text.contains(word), "--help lacks {word}:\n{text}");
    }
}

/// Arguments, environment, and the words the error must contain.
type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);

#[test]
fn bad_configuration_is_a_clear_error_and_nonzero_exit() {
    let cases: &[Case] = &[
        (
            &["config"],
            &[("STRATA_DURABILITY", "sometimes")],
            "durability must be sync, group, none or bucket",
        ),
        (
            &["config", "--set", "warm_bytes_max=lots"],
            &[],
            "not a size",
        ),
        (
            &["config", "--set", "nonsense=1"],
            &[],
            "unknown setting 'nonsense'",
        ),
        (
            &["config", "--config", "/nonexistent/strata.toml"],
            &[],
            "cannot read config file",
        ),
        (
            &["config", "--set", "cold_url=ftp://x"],
            &[],
            "scheme 'ftp' is not supported",
        ),
        (
            &["config", "--set", "users=[\"bob\"]"],
            &[],
            "must be name:password:role",
        ),
        (
            &["config", "--set", "unixsocketperm=rw"],
            &[],
            "unixsocketperm 'rw' is not octal permissions",
        ),
        (
            &["config", "--set", "unixsocketperm=1777"],
            &[],
            "is not octal permissions",
        ),
    ];
    for (args, env, want) in cases {
        let out = strata(args, env);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: expected '{want}' in: {err}");
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    }
}

#[test]
fn environment_and_file_layers_show_in_config() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.toml");
    std::fs::write(&file, "port = 7001\nhot_bytes_max = \"1GiB\"\n").unwrap();
    let out = strata(
        &["config", "--config", file.to_str().unwrap()],
        &[
            ("STRATA_PORT", "7002"),
            ("STRATA_COLD_URL", "s3://bucket/prefix"),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("port = 7002"), "{text}");
    assert!(text.contains("hot_bytes_max = 1073741824"), "{text}");
    assert!(text.contains("cold_url = \"s3://bucket/prefix\""), "{text}");
}

/// A port in use ends the process with exit code 1 and says so (the store it opened first
/// is closed: left open, its threads ran on into the process's exit, which died of a
/// signal in 3 of 8 tries with `durability=none`; ten tries here).
#[test]
fn a_port_in_use_is_a_clear_error() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port().to_string();
    for durability in ["group"].into_iter().chain(["none"; 10]) {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let out = strata(
            &[
                "serve",
                "--data-dir",
                data.to_str().unwrap(),
                "--port",
                &port,
                "--set",
                "metrics_port=0",
                "--set",
                &format!("durability=\"{durability}\""),
            ],
            &[],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{durability}: {stderr}");
        assert!(stderr.contains("cannot listen on"), "{stderr}");
    }
}

/// The conversation trace the repository ships (`traces/`).
const TRACE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../traces/conversation_trace.jsonl"
);

/// Runs `strata trace replay <args> --json`, checks that it succeeded, and parses each line
/// of its output as one JSON object.
fn replay_json(args: &[&str]) -> Vec<serde_json::Value> {
    let mut all = vec!["trace", "replay", "--json"];
    all.extend_from_slice(args);
    let out = strata(&all, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn trace_replay_reproduces_the_reference_lru_figure_on_the_conversation_trace() {
    assert!(
        std::path::Path::new(TRACE).exists(),
        "the repository ships traces/conversation_trace.jsonl"
    );
    let v = &replay_json(&[
        "--trace",
        TRACE,
        "--policy",
        "lru",
        "--capacity-blocks",
        "5859",
    ])[0];
    assert_eq!(v["policy"], "lru");
    assert_eq!(v["capacity_blocks"], 5859);
    let rate = v["hit_rate"].as_f64().unwrap();
    assert!(
        (0.135..0.137).contains(&rate),
        "LRU at 5,859 blocks should be about 13.6%, got {rate}"
    );
    let v = &replay_json(&[
        "--trace",
        TRACE,
        "--policy",
        "opt",
        "--capacity-blocks",
        "1000",
    ])[0];
    assert!(
        v["hit_rate"].as_f64().unwrap() > 0.17,
        "OPT at 1,000 blocks: {v}"
    );
    let out = strata(
        &["trace", "replay", "--trace", "/nonexistent", "--json"],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot open trace"));
}

#[test]
fn strata_policy_beats_the_online_baselines_on_the_conversation_trace() {
    for cap in ["1000", "5859", "20000"] {
        let rates: std::collections::HashMap<String, f64> =
            replay_json(&["--trace", TRACE, "--capacity-blocks", cap])
                .into_iter()
                .map(|v| {
                    (
                        v["policy"].as_str().unwrap().to_string(),
                        v["hit_rate"].as_f64().unwrap(),
                    )
                })
                .collect();
        let s = rates["strata"];
        // W-TinyLFU's admission filter still wins at 1,000 blocks (see the issue note).
        let rivals: &[&str] = if cap == "1000" {
            &["lru", "s3fifo"]
        } else {
            &["lru", "s3fifo", "wtinylfu"]
        };
        for &other in rivals {
            assert!(
                s > rates[other],
                "capacity {cap}: strata {s} vs {other} {}",
                rates[other]
            );
        }
        assert!(s <= rates["opt"], "capacity {cap}: nothing beats OPT");
    }
}

#[test]
fn engine_trace_replay_serves_blocks_from_every_tier() {
    let dir = tempfile::tempdir().unwrap();
    let small = dir.path().join("head.jsonl");
    let text = std::fs::read_to_string(TRACE).unwrap();
    std::fs::write(
        &small,
        text.lines().take(400).collect::<Vec<_>>().join("\n"),
    )
    .unwrap();
    let small = small.to_str().unwrap();
    let args = [
        "--engine",
        "--trace",
        small,
        "--hot-blocks",
        "100",
        "--warm-blocks",
        "2000",
        "--value-bytes",
        "64",
    ];
    let v = &replay_json(&args)[0];
    let n = |k: &str| v[k].as_u64().unwrap();
    assert_eq!(
        n("hot") + n("warm") + n("cold") + n("miss"),
        n("blocks"),
        "{v}"
    );
    assert!(
        n("hot") > 0 && n("warm") > 0 && n("cold") > 0,
        "every tier should serve some blocks: {v}"
    );
    assert!(n("demotions") > 0, "{v}");
    assert!(
        n("returns_to_warm") > 0,
        "blocks read from the object store go back: {v}"
    );
    // Settings apply to the engine it replays against.
    let off = &replay_json(&[&args[..], &["--set", "cold_reads_return_to_warm=false"]].concat())[0];
    assert_eq!(off["returns_to_warm"].as_u64(), Some(0), "{off}");
    assert_eq!(
        off["settings"][0], "cold_reads_return_to_warm=false",
        "{off}"
    );
    // The engine's total hits match the single-cache ceiling, since nothing is ever lost.
    let s = &replay_json(&[
        "--trace",
        small,
        "--policy",
        "lru",
        "--capacity-blocks",
        "100000000",
    ])[0];
    assert_eq!(
        n("hot") + n("warm") + n("cold"),
        s["hits"].as_u64().unwrap()
    );
}

/// Every setting the configuration page names with a `CONFIG` name is answered by `CONFIG
/// GET` under that name, with the value the configuration file gave it; the settable ones
/// take `CONFIG SET` back to the same value.
#[test]
fn config_get_answers_every_setting_by_its_redis_name() {
    use crate::support::Strata;
    let s = Strata::start(&[("maxclients", "123"), ("busy_reply_threshold", "4321")]);
    for &(key, name, settable) in strata_server::CONFIG_NAMES {
        let got = s.cli(&["CONFIG", "GET", name]);
        let mut lines = got.lines();
        assert_eq!(lines.next(), Some(name), "{key}: {got}");
        let value = lines.next().unwrap_or_else(|| panic!("{key}: {got}"));
        match key {
            "maxclients" => assert_eq!(value, "123"),
            "busy_reply_threshold" => assert_eq!(value, "4321"),
            "durability" => assert_eq!(value, "group"),
            _ => {}
        }
        if settable {
            let set = s.cli(&["CONFIG", "SET", name, value]);
            assert_eq!(set.trim(), "OK", "CONFIG SET {name} {value}: {set}");
        }
    }
}
