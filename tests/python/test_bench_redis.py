"""`strata-bench redis`: the hot-path protocol's rows beside a real `redis-server`, run end to
end with `redis-benchmark` (tiny request counts: this checks the harness, not the figures)."""

import json
import subprocess

from conftest import strata_bench_bin, strata_bin

NONE_TESTS = {"get", "mget", "mget100", "set", "incr", "setwide"}
SHAPES = {(50, 1), (50, 16), (1, 1), (1, 16)}


def run_bench(tmp_path, *extra):
    done = subprocess.run(
        [strata_bench_bin(), "--out", str(tmp_path), "redis", "--strata", strata_bin(), *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=900)
    # A failure says why: the benchmark's own last words.
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]


def test_redis_rows_follow_the_protocol_with_rounds_medians_and_goals(tmp_path):
    run_bench(tmp_path, "--requests", "2000", "--rounds", "2")
    rows = json.loads((tmp_path / "redis-benchmark.json").read_text())
    seen = {(r["test"], r["value_bytes"], r["clients"], r["pipeline"]) for r in rows}
    # Every test at both sizes and every shape, but INCR's and the wide write's one size
    # and the wide write's one shape.
    for test in NONE_TESTS - {"incr", "setwide"}:
        for size in (3, 1024):
            assert {(c, p) for (t, s, c, p) in seen if t == test and s == size} == SHAPES
    assert {(s, c, p) for (t, s, c, p) in seen if t == "incr"} == {(3, c, p) for c, p in SHAPES}
    assert {(s, c, p) for (t, s, c, p) in seen if t == "setwide"} == {(3, 50, 16)}
    assert len(rows) == len(seen) == 37
    for r in rows:
        for side in ("redis", "strata"):
            f = r[side]
            assert f["rps"] > 0 and f["p50_ms"] >= 0 and f["p99_ms"] >= f["p50_ms"], r
            # Each server's own CPU time was counted: a test costs it something.
            assert f["cpu_us_per_op"] > 0, r
        assert abs(r["rps_ratio"] - r["strata"]["rps"] / r["redis"]["rps"]) < 1e-9
    md = (tmp_path / "redis-benchmark.md").read_text()
    assert "2 rounds" in md and "## Goals" in md
    assert "geometric mean" in md and "--rounds 2" in md


def test_redis_durable_rows_compare_group_commit_with_appendfsync_always(tmp_path):
    run_bench(tmp_path, "--requests", "500", "--rounds", "1", "--durable")
    rows = json.loads((tmp_path / "redis-benchmark-durable.json").read_text())
    assert {(r["test"], r["clients"], r["pipeline"]) for r in rows} == {
        (t, c, p) for t in ("set", "incr", "mset") for c, p in SHAPES}
    md = (tmp_path / "redis-benchmark-durable.md").read_text()
    assert "appendfsync always" in md and "durability=group" in md
