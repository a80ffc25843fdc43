"""Lua scripts and functions through redis-py against the real binary: EVAL and EVALSHA,
the script cache, redis-py's register_script and Lock (which run on EVALSHA), the sandbox,
errors as Redis words them, atomicity against another client, -BUSY past the busy
threshold, SCRIPT KILL, -UNKILLABLE and SHUTDOWN NOSAVE, FUNCTION and FCALL with libraries
that survive a restart, and cjson, cmsgpack, bit and struct."""

import threading
import time

import pytest
import redis


def test_eval_reaches_commands_and_converts_replies(strata):
    r = strata.client(decode_responses=True)
    assert r.eval("return redis.call('SET', KEYS[1], ARGV[1])", 1, "k", "v") == "OK"
    assert r.eval("return redis.call('GET', KEYS[1])", 1, "k") == "v"
    assert r.eval("return {1, 2.9, 'x', true, false, {3}}", 0) == [1, 2, "x", 1, None, [3]]
    assert r.eval("return redis.call('HSET', 'h', 'f', 1) + 41", 0) == 42
    assert r.eval("return redis.call('EXISTS', 'nope') == 0 and 'none' or 'some'", 0) == "none"
    assert r.eval("return redis.pcall('INCR', KEYS[1])['err']", 1, "k").startswith("ERR value is not an integer")
    with pytest.raises(redis.ResponseError, match="value is not an integer"):
        r.eval("return redis.call('INCR', KEYS[1])", 1, "k")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        r.eval("return redis.call('LPUSH', 'h', 'x')", 0)
    with pytest.raises(redis.ResponseError, match="^MY custom"):
        r.eval("return redis.error_reply('MY custom')", 0)
    assert r.eval("return redis.status_reply('FINE')", 0) == "FINE"
    with pytest.raises(redis.ResponseError, match="Error compiling script"):
        r.eval("return (", 0)
    with pytest.raises(redis.ResponseError, match="greater than number of args"):
        r.eval("return 1", 2, "a")
    # As in Redis: transactions, and the connection's and server's own commands.
    for call in ("'MULTI'", "'CONFIG', 'SET', 'timeout', '5'", "'CLIENT', 'LIST'",
                 "'CLUSTER', 'RESET', 'HARD'", "'WAIT', 0, 0", "'AUTH', 'x'"):
        with pytest.raises(redis.ResponseError, match="not allowed from script"):
            r.eval(f"return redis.call({call})", 0)
    assert r.config_get("timeout") == {"timeout": "0"}
    with pytest.raises(redis.ResponseError, match="Write commands are not allowed"):
        r.execute_command("EVAL_RO", "return redis.call('SET', 'x', 1)", 0)
    assert r.execute_command("EVAL_RO", "return redis.call('GET', 'k')", 0) == "v"


def test_the_script_cache_and_redis_py_register_script(strata):
    r = strata.client(decode_responses=True)
    sha = r.script_load("return ARGV[1] .. ARGV[1]")
    assert r.script_exists(sha, "0" * 40) == [True, False]
    assert r.evalsha(sha, 0, "ab") == "abab"
    incr_by = r.register_script("return redis.call('INCRBY', KEYS[1], ARGV[1])")
    assert incr_by(keys=["counter"], args=[5]) == 5
    assert incr_by(keys=["counter"], args=[2]) == 7
    assert r.script_flush() is True
    assert r.script_exists(sha) == [False]
    with pytest.raises(redis.exceptions.NoScriptError):
        r.evalsha(sha, 0, "ab")
    # register_script loads the script again after a flush.
    assert incr_by(keys=["counter"], args=[1]) == 8


def test_redis_py_lock_acquires_extends_releases_and_excludes(strata):
    a = strata.client()
    b = strata.client()
    lock_a = a.lock("resource", timeout=5, blocking_timeout=0.2)
    lock_b = b.lock("resource", timeout=5, blocking_timeout=0.2)
    assert lock_a.acquire()
    assert not lock_b.acquire(), "a held lock excludes the second client"
    assert lock_a.extend(10)
    assert 5000 < a.pttl("resource") <= 15000
    lock_a.release()
    assert lock_b.acquire()
    # Releasing with another's token runs the release script, which refuses.
    with pytest.raises(redis.exceptions.LockNotOwnedError):
        lock_a.do_release(b"not-the-token")
    assert a.exists("resource") == 1
    lock_b.release()
    assert a.exists("resource") == 0


def test_the_sandbox_refuses_os_io_files_and_new_globals(strata):
    r = strata.client()
    for body, why in [("return os.execute('touch /tmp/strata-pwned')", "variable 'os'"),
                      ("return io.open('/etc/passwd')", "variable 'io'"),
                      ("return dofile('/etc/passwd')", "variable 'dofile'"),
                      ("return require('os')", "variable 'require'"),
                      ("leak = 1", "readonly table"),
                      ("redis.call = nil", "readonly table")]:
        with pytest.raises(redis.ResponseError, match=why):
            r.eval(body, 0)
    assert r.eval("local x = 1 return x", 0) == 1


def test_a_script_is_atomic_to_other_clients_and_stopped_at_its_time_limit(strata):
    r = strata.client(decode_responses=True)
    r.set("n", 0)
    seen = []

    def other():
        c = strata.client(decode_responses=True)
        time.sleep(0.1)
        seen.append(c.get("n"))
    t = threading.Thread(target=other)
    t.start()
    # The script writes, spins 0.5 s, writes again: the other client sees neither or both.
    body = """
    redis.call('SET', 'n', 1)
    local t0 = redis.call('TIME')
    while true do
      local t = redis.call('TIME')
      if (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) > 500000 then break end
    end
    redis.call('SET', 'n', 2)
    return 'done'
    """
    assert r.eval(body, 0) == "done"
    t.join(10)
    assert seen == ["2"]


def start_busy(strata, body, *args, command="EVAL"):
    """Runs a never-ending script on its own connection; returns the thread and what the
    script's client finally got."""
    got = []

    def run():
        c = strata.client(decode_responses=True)
        try:
            got.append(c.execute_command(command, body, *args))
        except redis.ResponseError as e:
            got.append(e)
        except redis.ConnectionError as e:
            got.append(e)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, got


def wait_busy(client):
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            client.ping()
        except redis.ResponseError as e:
            assert str(e).startswith("BUSY"), e
            return
        time.sleep(0.02)
    raise AssertionError("the script never turned busy")


def test_a_busy_script_answers_busy_to_others_and_script_kill_stops_it(strata):
    r = strata.client(decode_responses=True)
    assert r.config_set("busy-reply-threshold", 100)
    r.set("n", 0)
    # pcall does not save a killed script, as in Redis.
    t, got = start_busy(strata, "while true do pcall(function() redis.call('GET', 'n') end) end", 0)
    wait_busy(r)
    # A second client, blocked on its command before the threshold, is answered too.
    with pytest.raises(redis.ResponseError, match="^BUSY.*SCRIPT KILL"):
        strata.client().incr("n")
    with pytest.raises(redis.ResponseError, match="^BUSY.*SCRIPT KILL"):
        r.execute_command("FUNCTION", "KILL")
    assert r.script_kill() is True
    t.join(10)
    assert len(got) == 1 and "killed by user" in str(got[0])
    assert r.ping() and r.get("n") == "0"
    with pytest.raises(redis.ResponseError, match="^NOTBUSY"):
        r.script_kill()


def test_a_transaction_meeting_a_busy_script_is_discarded_whole(strata):
    """As in Redis: MULTI runs beside a busy script; a command refused with -BUSY inside
    the transaction makes EXEC fail with EXECABORT; an EXEC refused itself ends the
    transaction with the reason. Nothing of either transaction runs."""
    r = strata.client(decode_responses=True)
    assert r.config_set("busy-reply-threshold", 100)
    r.set("xx", 1)
    c = strata.client(decode_responses=True)
    t, _ = start_busy(strata, "while true do end", 0)
    wait_busy(r)
    assert c.execute_command("MULTI") == "OK"
    with pytest.raises(redis.ResponseError, match="^BUSY"):
        c.execute_command("INCR", "xx")
    assert r.script_kill() is True
    t.join(10)
    assert c.execute_command("INCR", "xx") == "QUEUED"
    # (redis-py takes the error's code, EXECABORT, as the exception's type.)
    with pytest.raises(redis.exceptions.ExecAbortError, match="previous errors"):
        c.execute_command("EXEC")
    # Queued before the script turned busy; EXEC arrives while it is busy.
    assert c.execute_command("MULTI") == "OK"
    assert c.execute_command("INCR", "xx") == "QUEUED"
    t, _ = start_busy(strata, "while true do end", 0)
    wait_busy(r)
    with pytest.raises(redis.exceptions.ExecAbortError, match="because of: BUSY"):
        c.execute_command("EXEC")
    assert r.script_kill() is True
    t.join(10)
    assert r.get("xx") == "1"
    assert c.echo("out of MULTI") == "out of MULTI"


def test_a_busy_script_that_wrote_is_unkillable_until_shutdown_nosave(strata):
    r = strata.client(decode_responses=True)
    assert r.config_set("busy-reply-threshold", 100)
    t, got = start_busy(strata, "redis.call('SET', KEYS[1], 'y') while true do end", 1, "x")
    wait_busy(r)
    with pytest.raises(redis.ResponseError, match="^UNKILLABLE"):
        r.script_kill()
    with pytest.raises(redis.ResponseError, match="^BUSY"):
        r.get("x")
    # SHUTDOWN NOSAVE stops it anyway, and the server exits.
    try:
        r.execute_command("SHUTDOWN", "NOSAVE")
    except redis.ConnectionError:
        pass
    assert strata.proc.wait(20) == 0
    t.join(10)


LIBRARY = """#!lua name=counters
local function bump(key, by)
  return redis.call('INCRBY', key, by)
end
redis.register_function('bump', function(keys, args) return bump(keys[1], args[1]) end)
redis.register_function{function_name='peek', callback=function(keys) return redis.call('GET', keys[1]) end,
                        flags={'no-writes'}, description='reads a counter'}
"""


def test_functions_load_call_list_and_survive_a_restart(tmp_path):
    from conftest import StrataProcess
    s = StrataProcess(data_dir=str(tmp_path))
    try:
        r = s.client(decode_responses=True)
        assert r.function_load(LIBRARY) == "counters"
        with pytest.raises(redis.ResponseError, match="already exists"):
            r.function_load(LIBRARY)
        assert r.fcall("bump", 1, "c", 5) == 5
        assert r.fcall_ro("peek", 1, "c") == "5"
        with pytest.raises(redis.ResponseError, match="write flag using \\*_ro"):
            r.fcall_ro("bump", 1, "c", 1)
        with pytest.raises(redis.ResponseError, match="Function not found"):
            r.fcall("nope", 0)
        def as_dict(flat):  # a RESP2 map is a flat list
            return dict(zip(flat[::2], flat[1::2]))
        [lib] = [as_dict(x) for x in r.function_list(withcode=True)]
        assert lib["library_name"] == "counters" and lib["library_code"] == LIBRARY
        flags = {f["name"]: f["flags"] for f in map(as_dict, lib["functions"])}
        assert flags == {"bump": [], "peek": ["no-writes"]}
        # Library code runs with the registration API only.
        with pytest.raises(redis.ResponseError, match="nonexistent global variable 'call'"):
            r.function_load("#!lua name=bad\nredis.call('SET', 'x', 1)")
        dump = r.function_dump()
        stats = r.execute_command("FUNCTION", "STATS")
        assert stats["engines"]["LUA"] == {"libraries_count": 1, "functions_count": 2}, stats
    finally:
        # SIGKILL: the libraries were saved when loaded.
        s.proc.kill()
        s.proc.wait()
    s = StrataProcess(data_dir=str(tmp_path))
    try:
        r = s.client(decode_responses=True)
        assert r.fcall("bump", 1, "c", 1) == 6
        assert r.function_flush() is True
        assert r.function_list() == []
        assert r.function_restore(dump) is True
        assert r.fcall_ro("peek", 1, "c") == "6"
        assert r.function_delete("counters") is True
    finally:
        s.stop()
    s = StrataProcess(data_dir=str(tmp_path))
    try:
        with pytest.raises(redis.ResponseError, match="Function not found"):
            s.client().fcall("bump", 1, "c", 1)
    finally:
        s.stop()


def test_the_libraries_scripts_expect(strata):
    r = strata.client(decode_responses=True)
    assert r.eval("return cjson.encode(cjson.decode('{\"a\":[1,2.5,\"x\"]}'))", 0) == '{"a":[1,2.5,"x"]}'
    assert r.eval("return cmsgpack.unpack(cmsgpack.pack({10, 'y'}))[2]", 0) == "y"
    assert r.eval("return bit.bxor(5, 3)", 0) == 6
    assert r.eval("return struct.unpack('<I2', struct.pack('<I2', 513))", 0) == 513


def test_error_replies_are_counted_by_code_until_resetstat(strata):
    r = strata.client(decode_responses=True)
    r.set("s", "x")
    with pytest.raises(redis.ResponseError):
        r.lpush("s", "y")
    with pytest.raises(redis.ResponseError, match="^MY_CODE"):
        r.eval("return redis.error_reply('MY_CODE custom')", 0)
    errors = r.info("errorstats")
    assert errors["errorstat_WRONGTYPE"] == {"count": 1}
    assert errors["errorstat_MY_CODE"] == {"count": 1}
    assert r.info("stats")["total_error_replies"] >= 2
    assert r.config_resetstat()
    assert r.info("errorstats") == {}
    with pytest.raises(redis.ResponseError):
        r.eval("return redis.error_reply('')", 0)
    assert r.info("errorstats") == {"errorstat_ERR": {"count": 1}}


def _answers(strata, redis_server, scripts):
    """Each script's answer (or its error, without the script's name) from Strata, and
    from redis-server."""
    answers = []
    for r in (strata.client(decode_responses=True),
              redis.Redis(port=redis_server, decode_responses=True)):
        seen = []
        for script in scripts:
            try:
                seen.append(r.eval(script, 0))
            except redis.ResponseError as e:
                seen.append(str(e).split(" script:")[0])
        answers.append(seen)
    return answers


def test_scripts_may_call_blmpop_and_bzmpop_once_but_not_the_other_blocking_pops(
        strata, redis_server):
    """As redis-server 7.0.15: inside a script BLMPOP and BZMPOP try once (nil when there is
    nothing to pop) while BLPOP, BRPOP, BLMOVE, BRPOPLPUSH and BZPOPMIN/MAX are refused."""
    scripts = [
        "return redis.call('blmpop', 0, 1, 'q', 'left')",
        "return redis.call('bzmpop', 0, 1, 'z', 'min')",
        "redis.call('rpush', 'q', 'a', 'b'); return redis.call('blmpop', 0, 1, 'q', 'left', 'count', 5)",
        "redis.call('zadd', 'z', 1, 'm'); return redis.call('bzmpop', 0, 1, 'z', 'min')",
        "return redis.call('blpop', 'q', 0)",
        "return redis.call('brpoplpush', 'q', 'p', 0)",
        "return redis.call('bzpopmin', 'z', 0)",
    ]
    answers = _answers(strata, redis_server, scripts)
    assert answers[0] == answers[1]
    assert answers[0][:4] == [None, None, ["q", ["a", "b"]], ["z", [["m", "1"]]]]
    assert answers[0][4] == "This Redis command is not allowed from script"


def test_a_script_s_call_is_held_to_the_subcommand_s_arity_before_anything_else(
        strata, redis_server):
    """As redis-server 7.0.15: `redis.call` checks the arity first, a subcommand's own
    (`CONFIG GET` needs a pattern), then whether scripts may call the command, so a
    short `BLPOP` or `CLIENT SETNAME` is refused for its arguments."""
    scripts = [
        "return redis.call('config', 'get')",
        "return redis.call('object', 'encoding')",
        "return redis.pcall('memory', 'usage')",
        "return redis.call('client', 'setname')",
        "return redis.call('client', 'setname', 'x')",
        "return redis.call('blpop')",
        "return redis.call('blpop', 'q', 0)",
        "return redis.call('object')",
        "redis.call('set', 'k', 'v'); return redis.call('object', 'refcount', 'k')",
    ]
    answers = _answers(strata, redis_server, scripts)
    assert answers[0] == answers[1]
    wrong = "Wrong number of args calling Redis command from script"
    assert answers[0][:4] == [wrong] * 4
    assert answers[0][4] == "This Redis command is not allowed from script"
