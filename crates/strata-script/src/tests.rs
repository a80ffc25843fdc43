use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strata_resp::Reply;

use super::*;

fn control() -> Arc<Control> {
    Control::new(|| {})
}

fn b(v: &[&str]) -> Vec<Bytes> {
    v.iter().map(|s| Bytes::from(s.to_string())).collect()
}

/// A stand-in for the server: echoes the command's arguments back as an array, fails on
/// "FAIL", answers a map to "MAP".
fn echo(args: &[Bytes]) -> Reply {
    match args[0].as_ref() {
        b"FAIL" => Reply::err("WRONGTYPE Operation against a key holding the wrong kind of value"),
        b"MAP" => Reply::Map(vec![(Reply::bulk("f"), Reply::bulk("v"))]),
        _ => Reply::Array(args.iter().cloned().map(Reply::Bulk).collect()),
    }
}

fn run(vm: &mut Vm, body: &str, keys: &[&str], argv: &[&str]) -> Reply {
    let sha = match vm.load(body.as_bytes()) {
        Ok(s) => s,
        Err(r) => return r,
    };
    vm.run(
        &sha,
        &b(keys),
        &b(argv),
        &mut echo,
        Some(Duration::from_secs(5)),
    )
}

fn err_of(r: Reply) -> String {
    match r {
        Reply::Error(e) => e,
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
fn call_arguments_convert_as_redis_converts_them() {
    // Numbers as C's `%.17g` writes them (what redis-server 7.0.15 sends for the same
    // script), strings as they are, embedded zeros kept.
    let mut vm = Vm::new(control()).unwrap();
    assert_eq!(
        run(
            &mut vm,
            "return redis.call('X', 1e17, 3.5, 2^53, -0.0, 0.1, -12, 'a\\0b')",
            &[],
            &[]
        ),
        Reply::Array(
            [
                "X",
                "1e+17",
                "3.5",
                "9007199254740992",
                "-0",
                "0.10000000000000001",
                "-12",
                "a\0b"
            ]
            .iter()
            .map(|s| Reply::bulk(s.as_bytes().to_vec()))
            .collect()
        )
    );
    // (Lua 5.1 keeps one constant for 0 and -0 in a chunk: 0 has its own.)
    assert_eq!(
        run(&mut vm, "return redis.call('X', 0)", &[], &[]),
        Reply::Array(vec![Reply::bulk("X"), Reply::bulk("0")])
    );
    // Anything else is refused as a command's error: `redis.call` raises it with the
    // script's line, `redis.pcall` returns it as a table.
    let refused = "ERR Lua redis lib command arguments must be strings or integers";
    let e = err_of(run(
        &mut vm,
        "\nreturn redis.call('SET', 'a', {})",
        &[],
        &[],
    ));
    assert!(
        e.starts_with(refused) && e.ends_with("on @user_script:2."),
        "{e}"
    );
    assert_eq!(
        run(&mut vm, "return redis.pcall('SET', 'a', true)", &[], &[]),
        Reply::err(refused)
    );
    let e = err_of(run(&mut vm, "\n\nreturn redis.call()", &[], &[]));
    assert!(e.ends_with("on @user_script:3."), "{e}");
}

#[test]
fn values_convert_as_redis_converts_them() {
    let mut vm = Vm::new(control()).unwrap();
    assert_eq!(run(&mut vm, "return 3.99", &[], &[]), Reply::Integer(3));
    assert_eq!(run(&mut vm, "return -3.99", &[], &[]), Reply::Integer(-3));
    // Out of an integer's range, as C's cast on x86-64: the lowest integer, both ways.
    for big in ["2^63", "-2^64", "1/0", "0/0"] {
        let body = format!("return {big}");
        assert_eq!(
            run(&mut vm, &body, &[], &[]),
            Reply::Integer(i64::MIN),
            "{big}"
        );
    }
    assert_eq!(
        run(&mut vm, "return -2^63", &[], &[]),
        Reply::Integer(i64::MIN)
    );
    assert_eq!(
        run(&mut vm, "return 2^62", &[], &[]),
        Reply::Integer(1 << 62)
    );
    assert_eq!(run(&mut vm, "return true", &[], &[]), Reply::Integer(1));
    assert_eq!(run(&mut vm, "return false", &[], &[]), Reply::Null);
    assert_eq!(
        run(&mut vm, "return {1, 'a', {2}, nil, 5}", &[], &[]),
        Reply::Array(vec![
            Reply::Integer(1),
            Reply::bulk("a"),
            Reply::Array(vec![Reply::Integer(2)])
        ])
    );
    assert_eq!(
        run(&mut vm, "return redis.status_reply('FINE')", &[], &[]),
        Reply::Simple("FINE".into())
    );
    assert_eq!(
        run(&mut vm, "return redis.error_reply('MYERR bad')", &[], &[]),
        Reply::err("MYERR bad")
    );
    assert_eq!(
        run(&mut vm, "return redis.error_reply('')", &[], &[]),
        Reply::err("ERR")
    );
    assert_eq!(
        run(&mut vm, "return {KEYS[1], ARGV[2]}", &["k"], &["a", "b"]),
        Reply::Array(vec![Reply::bulk("k"), Reply::bulk("b")])
    );
    assert_eq!(
        run(&mut vm, "return redis.call('GET', KEYS[1], 7)", &["k"], &[]),
        Reply::Array(vec![Reply::bulk("GET"), Reply::bulk("k"), Reply::bulk("7")])
    );
    assert_eq!(
        run(&mut vm, "return redis.sha1hex('')", &[], &[]),
        Reply::bulk("da39a3ee5e6b4b0d3255bfef95601890afd80709")
    );
    // RESP2: a map reply is a flat table; RESP3: {map=...}, and back again.
    assert_eq!(
        run(&mut vm, "return redis.call('MAP')", &[], &[]),
        Reply::Array(vec![Reply::bulk("f"), Reply::bulk("v")])
    );
    assert_eq!(
        run(
            &mut vm,
            "redis.setresp(3) local m = redis.call('MAP') return m.map.f",
            &[],
            &[]
        ),
        Reply::bulk("v")
    );
    assert_eq!(
        run(
            &mut vm,
            "redis.setresp(3) return redis.call('MAP')",
            &[],
            &[]
        ),
        Reply::Map(vec![(Reply::bulk("f"), Reply::bulk("v"))])
    );
    assert_eq!(
        run(&mut vm, "redis.setresp(3) return {double=1.5}", &[], &[]),
        Reply::Double(1.5)
    );
    assert_eq!(
        run(&mut vm, "redis.setresp(3) return false", &[], &[]),
        Reply::Bool(false)
    );
    // A reply nested past the limit ends in an error, not a crash.
    let deep = run(&mut vm, "local a = {} a[1] = a return a", &[], &[]);
    let mut r = &deep;
    while let Reply::Array(items) = r {
        r = &items[0];
    }
    assert_eq!(r, &Reply::err("ERR reached lua stack limit"));
}

#[test]
fn call_raises_pcall_returns_and_the_sandbox_holds() {
    let mut vm = Vm::new(control()).unwrap();
    // As Redis 7.0: the command's error, then which script and line raised it.
    let e = err_of(run(&mut vm, "\nredis.call('FAIL') return 1", &[], &[]));
    assert!(e.starts_with("WRONGTYPE Operation against"), "{e}");
    assert!(e.ends_with(", on @user_script:2."), "{e}");
    assert_eq!(
        run(
            &mut vm,
            "local r = redis.pcall('FAIL') return r.err",
            &[],
            &[]
        ),
        Reply::bulk("WRONGTYPE Operation against a key holding the wrong kind of value")
    );
    for (body, want) in [
        ("os.execute('true')", "nonexistent global variable 'os'"),
        ("io.open('/etc/passwd')", "nonexistent global variable 'io'"),
        ("dofile('/x')", "nonexistent global variable 'dofile'"),
        ("print('x')", "nonexistent global variable 'print'"),
        ("x = 1", "Attempt to modify a readonly table"),
        ("redis = 1", "Attempt to modify a readonly table"),
        ("_G = {}", "Attempt to modify a readonly table"),
        (
            "redis.call = function() end",
            "Attempt to modify a readonly table",
        ),
        ("cjson.encode = 1", "Attempt to modify a readonly table"),
        ("bit.band = 1", "Attempt to modify a readonly table"),
        ("setmetatable(_G, {})", "Attempt to modify a readonly table"),
        (
            "getmetatable(_G).__index = {}",
            "Attempt to modify a readonly table",
        ),
        ("rawset(_G, 'x', 1)", "Attempt to modify a readonly table"),
        (
            "return loadstring(string.dump(function() return 1 end))()",
            "attempt to call a nil value",
        ),
    ] {
        let e = err_of(run(&mut vm, body, &[], &[]));
        assert!(e.starts_with("ERR ") && e.contains(want), "{body}: {e}");
        assert!(!e.contains("traceback"), "{body}: {e}");
    }
    // pcall of a failing global read sees Lua's own message (a string).
    assert_eq!(
        run(
            &mut vm,
            "local ok, e = pcall(function() return foo end) return tostring(ok) .. ' ' .. e",
            &[],
            &[]
        ),
        Reply::bulk(
            "false user_script:1: Script attempted to access nonexistent global variable 'foo'"
        )
    );
    assert!(
        matches!(run(&mut vm, "return (", &[], &[]), Reply::Error(e) if e.contains("compiling"))
    );
    let sha = vm.load(b"return 1").unwrap();
    assert!(vm.exists(sha.as_bytes()));
    vm.flush();
    assert!(!vm.exists(sha.as_bytes()));
}

#[test]
fn a_shebang_declares_flags() {
    let mut vm = Vm::new(control()).unwrap();
    let sha = vm
        .load(b"#!lua flags=no-writes,allow-oom\nreturn 1")
        .unwrap();
    assert!(vm.flags(&sha).unwrap().contains(Flags::NO_WRITES));
    assert_eq!(run(&mut vm, "#!lua\nreturn 2", &[], &[]), Reply::Integer(2));
    assert!(err_of(run(&mut vm, "#!python\nreturn 1", &[], &[])).contains("Unexpected engine"));
    assert!(err_of(run(&mut vm, "#!lua x=1\nreturn 1", &[], &[]))
        .contains("Unknown lua shebang option"));
    assert!(err_of(run(&mut vm, "#!lua flags=what\nreturn 1", &[], &[]))
        .contains("Unexpected flag in script shebang"));
}

#[test]
fn the_libraries_redis_ships_are_there() {
    let mut vm = Vm::new(control()).unwrap();
    assert_eq!(
        run(
            &mut vm,
            "return table.concat(cjson.decode('[0.0, -5e3, -1, 0.3e-3, 1023.2, 0e10]'), ' ')",
            &[],
            &[]
        ),
        Reply::bulk("0 -5000 -1 0.0003 1023.2 0")
    );
    assert_eq!(
        run(
            &mut vm,
            "return cjson.encode({a={1, 2, 'x/y', cjson.null}})",
            &[],
            &[]
        ),
        Reply::bulk(r#"{"a":[1,2,"x\/y",null]}"#)
    );
    assert!(
        err_of(run(&mut vm, "return cjson.encode({[true]=1})", &[], &[]))
            .contains("table key must be a number or string")
    );
    let hex = "local e = ... local h = '' for i = 1, #e do h = h .. string.format('%02x', string.byte(e, i)) end return h";
    let packed = |what: &str| format!("return (function(...) {hex} end)(cmsgpack.pack({what}))");
    assert_eq!(
        run(&mut vm, &packed("0.1"), &[], &[]),
        Reply::bulk("cb3fb999999999999a")
    );
    assert_eq!(
        run(&mut vm, &packed("-1099511627776"), &[], &[]),
        Reply::bulk("d3ffffff0000000000")
    );
    assert_eq!(
        run(&mut vm, &packed("{1, 2, 'a'}"), &[], &[]),
        Reply::bulk("930102a161")
    );
    assert_eq!(
        run(
            &mut vm,
            "local t = cmsgpack.unpack(cmsgpack.pack({x={1,2}, y='z'})) return {t.x[2], t.y}",
            &[],
            &[]
        ),
        Reply::Array(vec![Reply::Integer(2), Reply::bulk("z")])
    );
    assert_eq!(
        run(&mut vm, "return {bit.band(7, 3), bit.bor(1, 2, 4), bit.bxor(1, 3), bit.tohex(255, 4), bit.lshift(1, 31)}", &[], &[]),
        Reply::Array(vec![
            Reply::Integer(3),
            Reply::Integer(7),
            Reply::Integer(2),
            Reply::bulk("00ff"),
            Reply::Integer(i32::MIN as i64)
        ])
    );
    assert_eq!(
        run(
            &mut vm,
            "local s = struct.pack('>HIs', 258, 7, 'ab') local a, b, c, n = struct.unpack('>HIs', s) return {#s, a, b, c, n, struct.size('<bhi')}",
            &[],
            &[]
        ),
        Reply::Array(vec![
            Reply::Integer(9),
            Reply::Integer(258),
            Reply::Integer(7),
            Reply::bulk("ab"),
            Reply::Integer(10),
            Reply::Integer(7)
        ])
    );
}

#[test]
fn a_busy_script_is_killed_unless_it_wrote() {
    let busy = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&busy);
    let control = Control::new(move || {
        seen.fetch_add(1, Ordering::Relaxed);
    });
    assert!(control.kill(false).is_err(), "nothing runs");
    let mut vm = Vm::new(Arc::clone(&control)).unwrap();
    // The script kills itself through the command it calls (a stand-in for another
    // client's SCRIPT KILL), and keeps looping inside pcall: pcall does not save it.
    let sha = vm
        .load(b"while true do pcall(function() redis.call('KILL') end) end")
        .unwrap();
    let c = Arc::clone(&control);
    let mut call = move |a: &[Bytes]| {
        if a[0].as_ref() == b"KILL" && c.busy_error().is_some() {
            c.kill(false).unwrap();
        }
        Reply::ok()
    };
    let r = vm.run(&sha, &[], &[], &mut call, Some(Duration::from_millis(20)));
    assert!(err_of(r).contains("killed by user"));
    assert_eq!(busy.load(Ordering::Relaxed), 1);
    assert!(control.busy_error().is_none(), "the run ended");
    // A script that wrote is not killed.
    let sha = vm
        .load(b"redis.call('W') while true do redis.call('KILL') end")
        .unwrap();
    let c = Arc::clone(&control);
    let mut refused = None;
    let mut call = |a: &[Bytes]| {
        match a[0].as_ref() {
            b"W" => c.note_write(),
            _ if c.busy_error().is_some() => {
                let r = c.kill(false);
                if refused.is_none() {
                    refused = r.err();
                    // Stop the test's loop the way SHUTDOWN NOSAVE does.
                    c.stop();
                }
            }
            _ => {}
        }
        Reply::ok()
    };
    vm.run(&sha, &[], &[], &mut call, Some(Duration::from_millis(20)));
    assert!(matches!(refused, Some(Reply::Error(e)) if e.starts_with("UNKILLABLE")));
}

const LIB: &str = "#!lua name=mylib\n\
    local function twice(x) return x .. x end\n\
    redis.register_function('echo2', function(keys, args) return twice(args[1]) end)\n\
    redis.register_function{function_name='ro', callback=function(keys) return redis.call('GET', keys[1]) end, flags={'no-writes'}, description='reads'}\n";

#[test]
fn functions_load_call_list_delete_dump_and_restore() {
    let mut f = Functions::new(control()).unwrap();
    assert_eq!(f.load(LIB.as_bytes(), false).unwrap(), "mylib");
    assert!(err_of(f.load(LIB.as_bytes(), false).unwrap_err()).contains("already exists"));
    assert_eq!(
        f.call(b"ECHO2", &[], &b(&["ab"]), &mut echo, None),
        Reply::bulk("abab")
    );
    assert_eq!(
        f.call(b"ro", &b(&["k"]), &[], &mut echo, None),
        Reply::Array(vec![Reply::bulk("GET"), Reply::bulk("k")])
    );
    let info = f.function(b"ro").unwrap();
    assert!(info.flags.contains(Flags::NO_WRITES));
    assert_eq!(info.description.as_deref(), Some("reads"));
    assert_eq!(f.counts(), (1, 2));
    // Load-time code sees only the registration API; functions cannot register later.
    for (code, want) in [
        (
            "#!lua name=x\nreturn math.random()",
            "nonexistent global variable 'math'",
        ),
        (
            "#!lua name=x\nreturn redis.call('ping')",
            "nonexistent global variable 'call'",
        ),
        ("#!lua name=x\nreturn 1", "No functions registered"),
        (
            "#!lua name=x\nredis.register_function('echo2', function() end)",
            "Function echo2 already exists",
        ),
        (
            "#!lua name=x\nredis.register_function('a', 'b')",
            "second argument to redis.register_function must be a function",
        ),
        ("#!lua name=x\nwhile true do end", "FUNCTION LOAD timeout"),
        (
            "#!lua name=x foo=bar\n",
            "Invalid metadata value given: foo=bar",
        ),
        ("#!js name=x\n", "Engine 'js' not found"),
        ("return 1", "Missing library metadata"),
        ("#!lua name=x\nreturn (", "Error compiling function"),
    ] {
        let e = err_of(f.load(code.as_bytes(), true).unwrap_err());
        assert!(e.contains(want), "{code}: {e}");
    }
    f.load(
        b"#!lua name=lib2\nlocal lib = redis\nredis.register_function('late', function() lib.register_function('z', function() end) end)",
        false,
    )
    .unwrap();
    assert!(err_of(f.call(b"late", &[], &[], &mut echo, None))
        .contains("can only be called on FUNCTION LOAD"));
    let dump = f.dump();
    f.flush();
    assert_eq!(
        f.call(b"echo2", &[], &b(&["x"]), &mut echo, None),
        Reply::err("ERR Function not found")
    );
    f.restore(&dump, RestorePolicy::Append).unwrap();
    assert_eq!(f.counts(), (2, 3));
    assert!(err_of(f.restore(&dump, RestorePolicy::Append).unwrap_err()).contains("already exists"));
    assert_eq!(f.counts(), (2, 3), "a failed restore changes nothing");
    f.restore(&dump, RestorePolicy::Replace).unwrap();
    let mut bad = dump.clone();
    bad[20] ^= 1;
    assert!(err_of(f.restore(&bad, RestorePolicy::Flush).unwrap_err()).contains("checksum"));
    f.delete(b"MYLIB").unwrap();
    assert_eq!(f.counts(), (1, 1));
    assert!(f.delete(b"mylib").is_err());
}
