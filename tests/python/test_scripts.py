"""Lua scripts through redis-py against the real binary: EVAL and EVALSHA, the script
cache, redis-py's register_script and Lock (which run on EVALSHA), the sandbox, errors as
Redis words them, atomicity against another client, and the time limit."""

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
    with pytest.raises(redis.ResponseError, match="not allowed from script"):
        r.eval("return redis.call('MULTI')", 0)
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
    for body in ["return os.execute('touch /tmp/strata-pwned')", "return io.open('/etc/passwd')",
                 "return dofile('/etc/passwd')", "return require('os')", "leak = 1"]:
        with pytest.raises(redis.ResponseError):
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
    assert r.config_set("busy-reply-threshold", 200)
    t0 = time.time()
    with pytest.raises(redis.ResponseError, match="time limit"):
        r.eval("while true do end", 0)
    assert time.time() - t0 < 5
    assert r.ping()
