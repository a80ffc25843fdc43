//! The real `redis-cli` against the real server.

use std::time::{Duration, Instant};

use crate::support::{redis_cli, redis_cli_output, Conn, Strata};

#[test]
fn redis_cli_basic_session() {
    let s = Strata::start(&[]);
    assert_eq!(s.cli(&["PING"]), "PONG\n");
    assert_eq!(s.cli(&["SET", "greeting", "hello world"]), "OK\n");
    assert_eq!(s.cli(&["GET", "greeting"]), "hello world\n");
    assert_eq!(s.cli(&["SET", "n", "41", "EX", "100"]), "OK\n");
    assert_eq!(s.cli(&["INCR", "n"]), "42\n");
    assert_eq!(s.cli(&["TTL", "n"]), "100\n");
    assert_eq!(
        s.cli(&["MGET", "greeting", "missing", "n"]),
        "hello world\n\n42\n"
    );
    assert_eq!(s.cli(&["EXISTS", "greeting", "n", "missing", "n"]), "3\n");
    assert_eq!(s.cli(&["DEL", "greeting", "missing"]), "1\n");
    assert_eq!(s.cli(&["TIER", "n"]), "hot\n");
    // INFO writes nothing: the key written back is in DRAM, not yet in the warm tier.
    let info = s.cli(&["INFO", "strata"]);
    assert!(
        info.contains("hot_entries:1") && info.contains("warm_entries:0"),
        "{info}"
    );
    assert!(s
        .cli(&["GET"])
        .contains("wrong number of arguments for 'get' command"));
}

#[test]
fn redis_cli_pipe_mass_insertion() {
    let s = Strata::start(&[]);
    let mut input = Vec::new();
    for i in 0..20_000 {
        input.extend(Conn::encode(&[
            b"SET",
            format!("key:{i:05}").as_bytes(),
            format!("value-{i}").as_bytes(),
        ]));
    }
    let out = redis_cli(s.port, &["--pipe"], Some(&input));
    assert!(out.contains("errors: 0, replies: 20000"), "{out}");
    assert_eq!(s.cli(&["GET", "key:12345"]), "value-12345\n");
    assert_eq!(s.cli(&["DBSIZE"]), "20000\n");
}

#[test]
fn values_of_several_mib_round_trip_through_redis_cli() {
    let s = Strata::start(&[]);
    let value: Vec<u8> = (0..6 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
        .collect();
    let out = redis_cli_output(s.port, &["-x", "SET", "big"], Some(&value));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "OK\n");
    let out = redis_cli_output(s.port, &["--raw", "GET", "big"], None);
    assert_eq!(out.stdout.len(), value.len() + 1);
    assert!(out.stdout[..value.len()] == value[..], "value bytes differ");
    assert_eq!(s.cli(&["STRLEN", "big"]), format!("{}\n", value.len()));
}

fn info_field(s: &Strata, field: &str) -> u64 {
    let info = s.cli(&["INFO", "strata"]);
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in INFO: {info}"))
}

#[test]
fn scan_covers_a_keyspace_spanning_all_three_tiers() {
    let s = Strata::start(&[
        ("hot_bytes_max", "65536"),
        ("warm_bytes_max", "131072"),
        // The pipelined burst outruns demotion; this test is not about the hard limit.
        ("warm_bytes_hard_max", "64MiB"),
        ("background_interval_ms", "50"),
        ("block_bytes", "4096"),
    ]);
    let mut input = Vec::new();
    for i in 0..600 {
        input.extend(Conn::encode(&[
            b"SET",
            format!("key:{i:04}").as_bytes(),
            &vec![b'x'; 1000],
        ]));
    }
    let out = redis_cli(s.port, &["--pipe"], Some(&input));
    assert!(out.contains("errors: 0, replies: 600"), "{out}");
    // Demotion runs every 50 ms; wait until it has brought warm back under its budget.
    let deadline = Instant::now() + Duration::from_secs(30);
    while info_field(&s, "cold_entries") == 0 || info_field(&s, "warm_bytes") > 131072 {
        assert!(
            Instant::now() < deadline,
            "warm never came under budget: {}",
            s.cli(&["INFO", "strata"])
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Which keys went cold depends on which stayed in DRAM as write-back's dirty values
    // while the burst ran: look at a spread of them.
    let tiers: std::collections::HashSet<String> = (0..600)
        .step_by(37)
        .map(|i| s.cli(&["TIER", &format!("key:{i:04}")]).trim().to_string())
        .collect();
    assert!(tiers.contains("cold"), "{tiers:?}");
    s.cli(&["GET", "key:0300"]);
    let keys = s.cli(&["--scan", "--pattern", "key:*"]);
    let mut got: Vec<&str> = keys.lines().collect();
    got.sort();
    got.dedup();
    assert_eq!(got.len(), 600, "SCAN returned {} distinct keys", got.len());
    assert_eq!(
        s.cli(&["--scan", "--pattern", "key:01[0-4]?"])
            .lines()
            .count(),
        50
    );
    assert_eq!(s.cli(&["KEYS", "key:059*"]).lines().count(), 10);
    // Cold keys read back exactly.
    assert_eq!(s.cli(&["STRLEN", "key:0000"]), "1000\n");
    assert_eq!(s.cli(&["GET", "key:0000"]).trim_end().len(), 1000);
}
