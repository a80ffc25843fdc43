"""Vector sets (Redis 8's VADD, VSIM, ...) through redis-py's own vector-set commands, in
RESP2 and RESP3: replies, recall against an exact search, filters, persistence across
SIGKILL, and the type's place among the others (TYPE, WRONGTYPE, DUMP/RESTORE, scripts)."""

import json

import numpy as np
import pytest
import redis

from conftest import StrataProcess


def clustered(n, dim, centres, seed):
    """`n` vectors around `centres` random centres (spread 0.3 of a centre's components)."""
    rng = np.random.default_rng(seed)
    c = rng.uniform(-1, 1, size=(centres, dim))
    return (c[np.arange(n) % centres] + 0.3 * rng.uniform(-1, 1, size=(n, dim))).astype(np.float32)


@pytest.mark.parametrize("protocol", [2, 3])
def test_every_command_answers_as_redis_does(strata, protocol):
    r = strata.client(protocol=protocol)
    vs = r.vset()
    assert vs.vadd("v", [1.0, 2.0, 3.0], "a") == 1
    assert vs.vadd("v", [1.0, 2.0, 4.0], "b", attributes={"year": 1990}) == 1
    assert vs.vadd("v", np.array([-1, 0, 0], dtype=np.float32).tobytes(), "c") == 1
    assert vs.vadd("v", [1.0, 2.0, 3.5], "a") == 0, "a replaced vector"
    assert (vs.vcard("v"), vs.vdim("v"), r.type("v")) == (3, 3, b"vectorset")
    assert vs.vsim("v", [1.0, 2.0, 3.0], count=2) == [b"a", b"b"]
    scored = vs.vsim("v", "a", with_scores=True)
    assert list(scored)[0] == b"a" and abs(scored[b"a"] - 1.0) < 0.01
    assert 0 <= min(scored.values()) and max(scored.values()) <= 1
    assert vs.vsim("v", "a", filter=".year > 1980") == [b"b"]
    assert vs.vsim("v", "a", filter=".year > 1980", truth=True) == [b"b"]
    assert vs.vgetattr("v", "b") == {"year": 1990}
    assert vs.vgetattr("v", "a") is None and vs.vgetattr("nokey", "a") is None
    emb = vs.vemb("v", "b")
    assert np.allclose(emb, [1, 2, 4], atol=0.05), emb
    info = {k.decode() if isinstance(k, bytes) else k: v for k, v in vs.vinfo("v").items()}
    assert info["quant-type"] in (b"int8", "int8") and (info["vector-dim"], info["size"]) == (3, 3)
    assert vs.vsetattr("v", "a", {"year": 1970}) == 1 and vs.vsetattr("v", "zz", {"x": 1}) == 0
    assert sorted(vs.vsim("v", "b", filter=".year < 2000")) == [b"a", b"b"]
    assert vs.vsetattr("v", "a", "") == 1 and vs.vgetattr("v", "a") is None
    assert r.execute_command("VISMEMBER", "v", "a") == 1
    assert vs.vrandmember("v") in (b"a", b"b", b"c")
    assert sorted(vs.vrandmember("v", 5)) == [b"a", b"b", b"c"]
    links = vs.vlinks("v", "a")
    assert {n for layer in links for n in layer} <= {b"b", b"c"} and links[0]
    assert vs.vrem("v", "c") == 1 and vs.vrem("v", "c") == 0
    assert vs.vrem("v", "a") == 1 and vs.vrem("v", "b") == 1
    assert r.exists("v") == 0, "a set goes with its last element"
    assert vs.vsim("nokey", [1.0, 2.0, 3.0]) == [] and vs.vcard("nokey") == 0


def test_bad_input_gets_redis_style_errors(strata):
    r = strata.client()
    r.vset().vadd("v", [1.0, 2.0, 3.0], "a")
    cases = [
        (["VADD", "v", "VALUES", "2", "1", "2", "x"], "dimension mismatch - got 2 but set has 3"),
        (["VADD", "v", "VALUES", "3", "1", "nan-ish", "3", "x"], "invalid vector"),
        (["VADD", "v", "FP32", "abc", "x"], "invalid vector"),
        (["VADD", "v", "VALUES", "3", "1", "2", "3", "x", "BIN"], "quantization mismatch"),
        (["VADD", "v", "VALUES", "3", "1", "2", "3", "x", "M", "0"], "invalid M"),
        (["VADD", "v", "REDUCE", "2", "VALUES", "3", "1", "2", "3", "x"], "REDUCE"),
        (["VSIM", "v", "ELE", "missing"], "element not found"),
        (["VSIM", "v", "VALUES", "2", "1", "2"], "dimension mismatch"),
        (["VSIM", "v", "ELE", "a", "FILTER", ".year >"], "syntax error in FILTER"),
        (["VSIM", "v", "ELE", "a", "COUNT", "x"], "not an integer"),
        (["VSIM", "v", "ELE", "a", "BOGUS"], "syntax error"),
        (["VDIM", "nokey"], "key does not exist"),
        (["HGET", "v", "a"], "WRONGTYPE"),
    ]
    for args, message in cases:
        with pytest.raises(redis.ResponseError, match=message):
            r.execute_command(*args)
    r.set("s", "x")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        r.vset().vadd("s", [1.0], "a")


def test_recall_at_10_against_an_exact_search_and_filters_that_keep_few(strata):
    r = strata.client()
    data = clustered(3000, 32, 30, seed=11)
    pipe = r.pipeline(transaction=False)
    for i, v in enumerate(data):
        pipe.execute_command("VADD", "emb", "FP32", v.tobytes(), f"e{i}", "SETATTR",
                             json.dumps({"i": i, "tag": "rare" if i % 100 == 0 else "common"}))
    pipe.execute()
    unit = data / np.linalg.norm(data, axis=1, keepdims=True)
    hits = 0
    queries = range(0, 3000, 60)
    for q in queries:
        truth = {f"e{j}".encode() for j in np.argsort(-unit @ unit[q])[:10]}
        got = r.execute_command("VSIM", "emb", "FP32", data[q].tobytes(), "COUNT", 10)
        hits += len(truth & set(got))
    recall = hits / (10 * len(queries))
    assert recall >= 0.9, recall
    # A filter keeping 1% of the set: the walk goes on until it finds them.
    got = r.execute_command("VSIM", "emb", "ELE", "e5", "COUNT", 10, "FILTER", '.tag == "rare"', "FILTER-EF", 3000)
    rare = [j for j in range(3000) if j % 100 == 0]
    truth = {f"e{j}".encode() for j in sorted(rare, key=lambda j: -unit[j] @ unit[5])[:10]}
    assert set(got) <= {f"e{j}".encode() for j in rare} and len(truth & set(got)) >= 9
    # Bad attributes never match, and never fail the search.
    r.execute_command("VSETATTR", "emb", "e0", "not json")
    assert b"e0" not in r.execute_command("VSIM", "emb", "ELE", "e0", "FILTER", ".i >= 0", "COUNT", 5)


def test_a_vector_set_survives_sigkill_and_restart(tmp_path):
    s = StrataProcess(data_dir=str(tmp_path))
    data = clustered(500, 16, 10, seed=3)
    try:
        r = s.client()
        for i, v in enumerate(data):
            r.execute_command("VADD", "v", "FP32", v.tobytes(), f"e{i}", "NOQUANT")
        r.execute_command("VSETATTR", "v", "e7", '{"k": 1}')
        r.execute_command("VREM", "v", "e8")
        before = r.execute_command("VSIM", "v", "ELE", "e1", "COUNT", 5)
    finally:
        s.kill()
    s = StrataProcess(data_dir=str(tmp_path))
    try:
        r = s.client()
        assert r.execute_command("VCARD", "v") == 499
        assert r.execute_command("VISMEMBER", "v", "e8") == 0
        assert r.execute_command("VGETATTR", "v", "e7") == b'{"k": 1}'
        assert r.execute_command("VSIM", "v", "ELE", "e1", "COUNT", 5) == before
        emb = np.array([float(x) for x in r.execute_command("VEMB", "v", "e3")], dtype=np.float32)
        assert np.allclose(emb, data[3], atol=1e-5), "NOQUANT keeps the vector"
        info = {k.decode() if isinstance(k, bytes) else k: v for k, v in r.vset().vinfo("v").items()}
        assert info["quant-type"] in (b"f32", "f32") and info["size"] == 499
    finally:
        s.stop()


def test_a_vector_set_moves_like_any_key_and_works_in_scripts_and_transactions(strata):
    r = strata.client()
    r.vset().vadd("v", [1.0, 0.0], "a", attributes={"x": 1})
    r.vset().vadd("v", [0.0, 1.0], "b")
    dumped = r.dump("v")
    r.restore("copy", 0, dumped)
    assert r.execute_command("VSIM", "copy", "VALUES", 2, 1, 0, "COUNT", 1) == [b"a"]
    assert r.copy("v", "v2") and r.rename("v2", "v3")
    assert r.execute_command("VCARD", "v3") == 2 and r.type("v3") == b"vectorset"
    assert r.eval("redis.call('VADD', KEYS[1], 'VALUES', 2, 1, 1, 'c'); return redis.call('VCARD', KEYS[1])", 1, "v") == 3
    with r.pipeline(transaction=True) as p:
        p.execute_command("VADD", "v", "VALUES", 2, -1, 0, "d")
        p.execute_command("VSIM", "v", "VALUES", 2, -1, 0, "COUNT", 1)
        assert p.execute() == [1, [b"d"]]
