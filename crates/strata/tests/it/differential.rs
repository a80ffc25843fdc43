//! The same random command stream goes to a real `redis-server` and to Strata; every reply
//! must be byte-for-byte the same.

use strata_testkit::Rng;

use crate::support::{Conn, RedisServer, Strata};

const KEYS: &[&str] = &["k0", "k1", "k2", "k3", "k4", "k5", "k6", "{tag}k7"];
const VALUES: &[&str] = &[
    "",
    "v",
    "hello",
    "10",
    "-7",
    "0",
    "-0",
    "007",
    " 1",
    "abc",
    "9223372036854775807",
    "-9223372036854775808",
    "99999999999999999999",
    "1.5",
    "3",
    "x y z",
];

const FIELDS: &[&str] = &["f0", "f1", "f2", "n", ""];
const MEMBERS: &[&str] = &["a", "b", "c", "1", "2", "10", ""];
const SCORES: &[&str] = &[
    "1", "2.5", "-1", "0", "0.1", "1e3", "inf", "-inf", "x", "nan",
];
const SCORE_BOUNDS: &[&str] = &["-inf", "+inf", "0", "(0", "1", "(2.5", "3", "x", "(nan"];
const LEX_BOUNDS: &[&str] = &["-", "+", "[a", "(a", "[c", "(10", "[", "a"];

/// Commands whose reply order Redis leaves to its hash table: sets, and `ZSCAN` (a sorted
/// set Redis keeps as a skiplist scans in dict order), so both replies are compared with their
/// elements sorted.
const UNORDERED: &[&str] = &["SMEMBERS", "SINTER", "SUNION", "SDIFF", "SSCAN", "ZSCAN"];

/// A reply with the elements of its (innermost) array of bulk strings sorted.
fn sorted(reply: &str) -> String {
    let Some(start) = reply.rfind('*') else {
        return reply.to_string();
    };
    let (head, body) = reply.split_at(start);
    let mut lines = body.split("\r\n");
    let count_line = lines.next().unwrap_or_default().to_string();
    let rest: Vec<&str> = lines.collect();
    let mut items: Vec<String> = rest
        .chunks(2)
        .filter(|c| c.len() == 2)
        .map(|c| format!("{}\r\n{}\r\n", c[0], c[1]))
        .collect();
    items.sort();
    format!("{head}{count_line}\r\n{}", items.concat())
}

fn command(rng: &mut Rng) -> Vec<String> {
    let k = |r: &mut Rng| r.pick(KEYS).to_string();
    let v = |r: &mut Rng| r.pick(VALUES).to_string();
    let f = |r: &mut Rng| r.pick(FIELDS).to_string();
    let m = |r: &mut Rng| r.pick(MEMBERS).to_string();
    let sc = |r: &mut Rng| r.pick(SCORES).to_string();
    let sb = |r: &mut Rng| r.pick(SCORE_BOUNDS).to_string();
    let lx = |r: &mut Rng| r.pick(LEX_BOUNDS).to_string();
    let n = |r: &mut Rng| (r.below(41) as i64 - 20).to_string();
    let c: Vec<String> = match rng.below(100) {
        0..=4 => {
            let mut c = vec!["SET".into(), k(rng), v(rng)];
            for opt in [
                ["NX", "XX", "", ""].as_slice(),
                &["GET", ""],
                &["EX", "KEEPTTL", "PX", "", "", ""],
            ] {
                let o = rng.pick(opt);
                if !o.is_empty() {
                    c.push(o.into());
                    if o == "EX" {
                        c.push("100000".into());
                    }
                    if o == "PX" {
                        c.push(rng.pick(&["100000000", "0", "-5", "abc"]).into());
                    }
                }
            }
            c
        }
        5..=7 => vec!["GET".into(), k(rng)],
        8 => vec!["MGET".into(), k(rng), k(rng), k(rng)],
        9 => vec!["DEL".into(), k(rng), k(rng)],
        10 => vec!["EXISTS".into(), k(rng), k(rng), k(rng)],
        11 => vec!["INCR".into(), k(rng)],
        12 => vec![
            "INCRBY".into(),
            k(rng),
            rng.pick(&["5", "-3", "x", "9223372036854775807", "1.0"])
                .into(),
        ],
        13 => vec!["DECRBY".into(), k(rng), n(rng)],
        14 => vec!["APPEND".into(), k(rng), v(rng)],
        15 => vec!["STRLEN".into(), k(rng)],
        16 => vec!["GETRANGE".into(), k(rng), n(rng), n(rng)],
        17 => vec!["SETRANGE".into(), k(rng), rng.below(8).to_string(), v(rng)],
        18 => vec!["SETNX".into(), k(rng), v(rng)],
        19 => vec!["GETSET".into(), k(rng), v(rng)],
        20 => vec!["GETDEL".into(), k(rng)],
        21 => vec!["MSET".into(), k(rng), v(rng), k(rng), v(rng)],
        22 => vec!["MSETNX".into(), k(rng), v(rng), k(rng), v(rng)],
        23 => {
            let mut c = vec![
                "EXPIRE".into(),
                k(rng),
                rng.pick(&["100000", "200000", "-1", "x"]).into(),
            ];
            let o = rng.pick(&["", "", "NX", "XX", "GT", "LT", "NX XX"]);
            c.extend(o.split_whitespace().map(String::from));
            c
        }
        24 => vec!["PERSIST".into(), k(rng)],
        25 => vec!["TTL".into(), k(rng)],
        26 => vec!["TYPE".into(), k(rng)],
        27 => vec!["RENAME".into(), k(rng), k(rng)],
        // Redis adds in long double (x87 80-bit) and prints with %.17Lf: so does Strata.
        28 => vec![
            "INCRBYFLOAT".into(),
            rng.pick(&["float", "k0", "k1"]).into(),
            rng.pick(&[
                "1.5", "-0.25", "abc", "2", "1e3", "0.1", "1e-17", "-1e300", "inf",
            ])
            .into(),
        ],
        29 => vec!["DBSIZE".into()],
        30 => vec![rng.pick(&["GET", "SET", "INCR", "EXPIRE"]).into()],
        31 => vec!["NOSUCHCMD".into(), k(rng)],
        32 => vec!["ECHO".into(), v(rng)],
        33 => vec!["PING".into()],
        34 => vec![
            "SELECT".into(),
            rng.pick(&["0", "1", "2", "0", "x", "16", "-1"]).into(),
        ],
        35 => vec![
            "GETEX".into(),
            k(rng),
            rng.pick(&["PERSIST", "EX", "PX"]).into(),
            "100000".into(),
        ],
        36 => vec!["DECR".into(), k(rng)],
        37 => vec!["RENAMENX".into(), k(rng), k(rng)],
        38 => vec!["PTTL".into(), k(rng)],
        39 => vec![
            "MOVE".into(),
            k(rng),
            rng.pick(&["0", "1", "2", "16", "x"]).into(),
        ],
        // Rarely, so the databases fill up between flushes.
        40 if rng.below(10) == 0 => vec!["FLUSHDB".into()],
        40 if rng.below(2) == 0 => vec![
            "SWAPDB".into(),
            rng.pick(&["0", "1", "2", "x"]).into(),
            rng.pick(&["0", "1", "2", "16"]).into(),
        ],
        41..=44 => {
            let mut c = vec![rng.pick(&["HSET", "HSET", "HMSET"]).into(), k(rng)];
            for _ in 0..=rng.below(3) {
                c.push(f(rng));
                c.push(v(rng));
            }
            c
        }
        45 => vec![
            rng.pick(&["HGET", "HEXISTS", "HSTRLEN"]).into(),
            k(rng),
            f(rng),
        ],
        46 => vec!["HMGET".into(), k(rng), f(rng), f(rng), f(rng)],
        47 => vec![
            rng.pick(&["HGETALL", "HKEYS", "HVALS", "HLEN"]).into(),
            k(rng),
        ],
        48 => vec!["HDEL".into(), k(rng), f(rng), f(rng)],
        49 => vec![
            "HINCRBY".into(),
            k(rng),
            f(rng),
            rng.pick(&["1", "-3", "x", "9223372036854775807"]).into(),
        ],
        50 => vec!["HSETNX".into(), k(rng), f(rng), v(rng)],
        51 => vec![
            "HINCRBYFLOAT".into(),
            rng.pick(&["hfloat", "k0"]).into(),
            f(rng),
            rng.pick(&["1.5", "-0.25", "abc", "2", "0.1", "inf", "7e-18"])
                .into(),
        ],
        52 => vec!["HSCAN".into(), k(rng), "0".into()],
        53 => vec![rng.pick(&["HSET", "HGET", "HDEL", "HMGET"]).into(), k(rng)],
        54..=56 => {
            let mut c = vec![rng.pick(&["SADD", "SADD", "SREM"]).into(), k(rng)];
            for _ in 0..=rng.below(3) {
                c.push(m(rng));
            }
            c
        }
        57 => vec![
            rng.pick(&["SMEMBERS", "SCARD", "SINTER", "SUNION", "SDIFF"])
                .into(),
            k(rng),
        ],
        58 => vec![
            rng.pick(&["SISMEMBER", "SMISMEMBER"]).into(),
            k(rng),
            m(rng),
            m(rng),
        ],
        59 => vec![
            rng.pick(&["SINTER", "SUNION", "SDIFF"]).into(),
            k(rng),
            k(rng),
            k(rng),
        ],
        60 => vec![
            rng.pick(&["SINTERSTORE", "SUNIONSTORE", "SDIFFSTORE"])
                .into(),
            k(rng),
            k(rng),
            k(rng),
        ],
        61 => vec!["SMOVE".into(), k(rng), k(rng), m(rng)],
        62 => {
            let mut c = vec![
                "SINTERCARD".into(),
                rng.pick(&["1", "2", "0", "5"]).into(),
                k(rng),
                k(rng),
            ];
            if rng.below(2) == 0 {
                c.extend(["LIMIT".to_string(), rng.pick(&["0", "1", "-1"]).to_string()]);
            }
            c
        }
        63 => vec!["SPOP".into(), k(rng), rng.pick(&["0", "-1", "x"]).into()],
        64 => vec![
            "SSCAN".into(),
            k(rng),
            "0".into(),
            "MATCH".into(),
            "*1*".into(),
        ],
        65..=68 => {
            let mut c = vec!["ZADD".into(), k(rng)];
            for o in [
                ["", "", "NX", "XX"].as_slice(),
                &["", "", "GT", "LT"],
                &["", "CH"],
                &["", "", "", "INCR"],
            ] {
                let o = rng.pick(o);
                if !o.is_empty() {
                    c.push(o.into());
                }
            }
            for _ in 0..=rng.below(2) {
                c.push(sc(rng));
                c.push(m(rng));
            }
            c
        }
        69 => vec!["ZINCRBY".into(), k(rng), sc(rng), m(rng)],
        70 => vec![
            rng.pick(&["ZSCORE", "ZRANK", "ZREVRANK", "ZREM"]).into(),
            k(rng),
            m(rng),
        ],
        71 => vec!["ZMSCORE".into(), k(rng), m(rng), m(rng)],
        72 => {
            let mut c = vec![
                rng.pick(&["ZRANGE", "ZREVRANGE"]).into(),
                k(rng),
                n(rng),
                n(rng),
            ];
            if rng.below(2) == 0 {
                c.push("WITHSCORES".into());
            }
            c
        }
        73 => {
            let by = rng.pick(&["BYSCORE", "BYLEX", ""]);
            let (lo, hi) = if by == "BYLEX" {
                (lx(rng), lx(rng))
            } else {
                (sb(rng), sb(rng))
            };
            let mut c = vec!["ZRANGE".into(), k(rng), lo, hi];
            for o in [by, rng.pick(&["", "REV"]), rng.pick(&["", "WITHSCORES"])] {
                if !o.is_empty() {
                    c.push(o.into());
                }
            }
            if rng.below(3) == 0 {
                c.push("LIMIT".into());
                c.push(rng.pick(&["0", "1", "-1"]).into());
                c.push(rng.pick(&["1", "2", "-1"]).into());
            }
            c
        }
        74 => {
            let cmd = rng.pick(&[
                "ZRANGEBYSCORE",
                "ZREVRANGEBYSCORE",
                "ZCOUNT",
                "ZREMRANGEBYSCORE",
            ]);
            let mut c = vec![cmd.into(), k(rng), sb(rng), sb(rng)];
            if cmd.contains("RANGEBY") && rng.below(2) == 0 {
                c.push("WITHSCORES".into());
            }
            c
        }
        75 => vec![
            rng.pick(&[
                "ZRANGEBYLEX",
                "ZREVRANGEBYLEX",
                "ZLEXCOUNT",
                "ZREMRANGEBYLEX",
            ])
            .into(),
            k(rng),
            lx(rng),
            lx(rng),
        ],
        76 => vec!["ZREMRANGEBYRANK".into(), k(rng), n(rng), n(rng)],
        77 => {
            let mut c = vec![rng.pick(&["ZPOPMIN", "ZPOPMAX"]).into(), k(rng)];
            if rng.below(2) == 0 {
                c.push(rng.pick(&["0", "1", "2", "-1"]).into());
            }
            c
        }
        78 => {
            let mut c = vec![
                rng.pick(&["ZUNIONSTORE", "ZINTERSTORE"]).into(),
                k(rng),
                rng.pick(&["1", "2", "0"]).into(),
                k(rng),
                k(rng),
            ];
            if rng.below(2) == 0 {
                c.extend(["WEIGHTS".to_string(), sc(rng), sc(rng)]);
            }
            if rng.below(2) == 0 {
                c.push("AGGREGATE".into());
                c.push(rng.pick(&["SUM", "MIN", "MAX"]).into());
            }
            c
        }
        79 => match rng.below(2) {
            0 => vec!["ZCARD".into(), k(rng)],
            _ => vec!["ZSCAN".into(), k(rng), "0".into()],
        },
        80..=82 => {
            let mut c = vec![
                rng.pick(&["LPUSH", "RPUSH", "LPUSHX", "RPUSHX"]).into(),
                k(rng),
            ];
            for _ in 0..=rng.below(3) {
                c.push(m(rng));
            }
            c
        }
        83 => {
            let mut c = vec![rng.pick(&["LPOP", "RPOP"]).into(), k(rng)];
            if rng.below(2) == 0 {
                c.push(rng.pick(&["0", "1", "3", "-1", "x"]).into());
            }
            c
        }
        84 => vec![
            rng.pick(&["LRANGE", "LTRIM"]).into(),
            k(rng),
            n(rng),
            n(rng),
        ],
        85 => match rng.below(3) {
            0 => vec!["LLEN".into(), k(rng)],
            1 => vec!["LINDEX".into(), k(rng), n(rng)],
            _ => vec!["LSET".into(), k(rng), n(rng), m(rng)],
        },
        86 => vec![
            "LINSERT".into(),
            k(rng),
            rng.pick(&["BEFORE", "AFTER", "x"]).into(),
            m(rng),
            m(rng),
        ],
        87 => vec![
            "LREM".into(),
            k(rng),
            rng.pick(&["0", "1", "-1", "2", "x"]).into(),
            m(rng),
        ],
        88 => {
            let mut c = vec!["LPOS".into(), k(rng), m(rng)];
            for (opt, vals) in [
                ("RANK", ["1", "-1", "2", "0"]),
                ("COUNT", ["0", "1", "2", "-1"]),
                ("MAXLEN", ["0", "2", "-1", "1"]),
            ] {
                if rng.below(3) == 0 {
                    c.push(opt.into());
                    c.push(rng.pick(&vals).into());
                }
            }
            c
        }
        89 => match rng.below(4) {
            0 => vec!["RPOPLPUSH".into(), k(rng), k(rng)],
            1 => vec![
                "LMOVE".into(),
                k(rng),
                k(rng),
                rng.pick(&["LEFT", "RIGHT", "UP"]).into(),
                rng.pick(&["LEFT", "RIGHT"]).into(),
            ],
            // An empty list waits its 10 ms on both servers.
            2 => vec![
                rng.pick(&["BLPOP", "BRPOP"]).into(),
                k(rng),
                k(rng),
                rng.pick(&["0.01", "-1", "x"]).into(),
            ],
            _ => vec![
                "BLMOVE".into(),
                k(rng),
                k(rng),
                "RIGHT".into(),
                "LEFT".into(),
                "0.01".into(),
            ],
        },
        90 => {
            let cmd = rng.pick(&["ZUNION", "ZINTER", "ZDIFF", "ZINTERCARD", "ZDIFFSTORE"]);
            let mut c = vec![cmd.to_string()];
            if cmd == "ZDIFFSTORE" {
                c.push(k(rng));
            }
            c.extend([rng.pick(&["1", "2", "0"]).to_string(), k(rng), k(rng)]);
            if rng.below(2) == 0 {
                c.push(rng.pick(&["WITHSCORES", "LIMIT", "AGGREGATE"]).into());
                if c.last().is_some_and(|o| o != "WITHSCORES") {
                    c.push(rng.pick(&["1", "MAX", "-1"]).into());
                }
            }
            c
        }
        91 => {
            let mut c = vec![
                "ZRANGESTORE".into(),
                k(rng),
                k(rng),
                sb(rng),
                sb(rng),
                "BYSCORE".into(),
            ];
            if rng.below(2) == 0 {
                c.push("REV".into());
            }
            c
        }
        92 => {
            let (cmd, ends) = match rng.below(2) {
                0 => ("ZMPOP", ["MIN", "MAX"]),
                _ => ("LMPOP", ["LEFT", "RIGHT"]),
            };
            let mut c = vec![
                cmd.to_string(),
                rng.pick(&["1", "2", "0"]).into(),
                k(rng),
                k(rng),
            ];
            c.push(rng.pick(&ends).to_string());
            if rng.below(2) == 0 {
                c.extend(["COUNT".to_string(), rng.pick(&["1", "3", "0"]).to_string()]);
            }
            c
        }
        93 => {
            let mut c = vec!["COPY".into(), k(rng), k(rng)];
            if rng.below(2) == 0 {
                c.push("REPLACE".into());
            }
            if rng.below(3) == 0 {
                c.extend(["DB".to_string(), rng.pick(&["1", "0", "16"]).to_string()]);
            }
            c
        }
        // An empty sorted set waits its 10 ms on both servers.
        94 => vec![
            rng.pick(&["BZPOPMIN", "BZPOPMAX"]).into(),
            k(rng),
            k(rng),
            "0.01".into(),
        ],
        95 => match rng.below(3) {
            0 => vec![
                "SETBIT".into(),
                k(rng),
                rng.pick(&["0", "7", "100", "-1", "x"]).into(),
                rng.pick(&["1", "0", "2"]).into(),
            ],
            1 => vec![
                "GETBIT".into(),
                k(rng),
                rng.pick(&["0", "7", "100", "-1"]).into(),
            ],
            _ => {
                let mut c = vec!["BITCOUNT".into(), k(rng)];
                if rng.below(2) == 0 {
                    c.extend([n(rng), n(rng)]);
                    if rng.below(2) == 0 {
                        c.push(rng.pick(&["BYTE", "BIT", "X"]).into());
                    }
                }
                c
            }
        },
        96 => {
            let mut c = vec![rng.pick(&["SORT", "SORT_RO"]).into(), k(rng)];
            for o in [rng.pick(&["", "ALPHA"]), rng.pick(&["", "DESC", "ASC"])] {
                if !o.is_empty() {
                    c.push(o.into());
                }
            }
            if rng.below(3) == 0 {
                c.extend([
                    "LIMIT".to_string(),
                    rng.pick(&["0", "1", "-1"]).to_string(),
                    rng.pick(&["2", "-1", "0"]).to_string(),
                ]);
            }
            if c[0] == "SORT" && rng.below(3) == 0 {
                c.extend(["STORE".to_string(), k(rng)]);
            }
            c
        }
        97 => vec!["APPEND".into(), k(rng), v(rng)],
        98 => {
            let mut c = vec!["LCS".into(), k(rng), k(rng)];
            for o in ["LEN", "IDX", "WITHMATCHLEN", "MINMATCHLEN"] {
                if rng.below(3) == 0 {
                    c.push(o.into());
                    if o == "MINMATCHLEN" {
                        c.push(rng.pick(&["0", "2", "-1", "x"]).into());
                    }
                }
            }
            c
        }
        99 => {
            let body = rng.pick(&[
                "return redis.call('GET', KEYS[1])",
                "return redis.call('INCR', KEYS[1])",
                "return redis.pcall('LPUSH', KEYS[1], ARGV[1])",
                "return {1, 2.5, ARGV[1], false, true, {KEYS[1]}}",
                "redis.call('SET', KEYS[1], ARGV[1]) return redis.call('STRLEN', KEYS[1])",
                "return redis.call('HGETALL', KEYS[1])",
                "return redis.error_reply('CUSTOM failure')",
                "return nosuch",
                "return (",
            ]);
            vec!["EVAL".into(), body.into(), "1".into(), k(rng), v(rng)]
        }
        _ => vec!["EXISTS".into(), k(rng)],
    };
    // GETEX PERSIST takes no argument.
    if c[0] == "GETEX" && c[2] == "PERSIST" {
        return c[..3].to_vec();
    }
    c
}

#[test]
fn random_command_streams_get_the_same_replies_as_redis() {
    same_replies_as_redis(&[], &[]);
}

/// The same with every hash, set and sorted set stored as parts (one RocksDB record per
/// item, and a score index) and no DRAM copies, so reads by name, counts and ranges of
/// values not live read the parts. A hash kept as parts lists its fields by name, not in
/// the order they came (as a large hash of Redis's keeps no order either).
#[test]
fn random_command_streams_get_the_same_replies_as_redis_with_every_collection_in_parts() {
    let strata = same_replies_as_redis(
        &[
            ("parts_bytes_min", "1"),
            ("hot_bytes_max", "0"),
            ("hot_dirty_fraction", "0"),
        ],
        &["HGETALL", "HKEYS", "HVALS", "HSCAN"],
    );
    let info = strata.cli(&["INFO", "strata"]);
    for counter in ["parts_written", "parts_read"] {
        let n: u64 = info
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{counter}:")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{counter} in INFO: {info}"));
        assert!(n > 0, "{counter} is {n}: the parts were not used");
    }
}

/// A seeded stream of commands to both servers: the same replies, but those of `UNORDERED`
/// and `unordered` commands (or scripts that call them) compared as sets.
fn same_replies_as_redis(settings: &[(&str, &str)], unordered: &[&str]) -> Strata {
    let redis = RedisServer::start();
    let strata = Strata::start(settings);
    let mut rng = Rng::from_env("differential");
    let mut r = Conn::connect(redis.port);
    let mut s = strata.conn();
    for step in 0..8000 {
        let cmd = command(&mut rng);
        let args: Vec<&str> = cmd.iter().map(|s| s.as_str()).collect();
        let want = r.cmd(&args);
        let got = s.cmd(&args);
        // PTTL counts milliseconds: compare to within a second.
        if cmd[0] == "PTTL" && want.starts_with(":") && !want.starts_with(":-") {
            let (a, b): (i64, i64) = (
                want[1..].trim().parse().unwrap(),
                got[1..].trim().parse().unwrap(),
            );
            assert!(
                (a - b).abs() < 1000,
                "step {step}: {cmd:?}: redis {want:?} strata {got:?}"
            );
            continue;
        }
        // (A script's body names the commands it calls.)
        let loose = cmd.iter().any(|a| unordered.iter().any(|u| a.contains(u)));
        if UNORDERED.contains(&cmd[0].as_str()) || loose {
            assert_eq!(sorted(&got), sorted(&want), "step {step}: {cmd:?}");
            continue;
        }
        assert_eq!(got, want, "step {step}: {cmd:?}");
    }
    strata
}
