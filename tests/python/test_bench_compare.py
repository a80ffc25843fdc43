"""`strata-bench compare --quick`: the headline comparison runs end to end against the real
contenders (strata with moto as its cold tier, redis-server, files, the object store) and
writes its report. It asserts what the report holds, never a timing."""

import json
import subprocess

from conftest import ROOT, strata_bench_bin, strata_bin

CONTENDERS = [
    "object store direct",
    "redis-server cache-aside",
    "files cache-aside",
    "strata (prefetch on)",
    "strata (prefetch off)",
]


def test_compare_quick_measures_every_contender_and_writes_its_report(tmp_path):
    run = subprocess.run(
        [strata_bench_bin(), "--out", str(tmp_path), "compare", "--quick", "--strata", strata_bin()],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads((tmp_path / "compare.json").read_text())
    assert [r["contender"] for r in report["rows"]] == CONTENDERS
    assert "compare --quick" in report["command"] and "cores" in report["machine"]
    sizes = report["sizes"]
    for r in report["rows"]:
        # Every row was measured: reads counted, writes done in every stage, the trace replayed.
        assert r["hot"]["count"] == sizes["hot_reads"], r["contender"]
        assert r["cold"]["count"] == sizes["sessions"] * sizes["session_keys"], r["contender"]
        assert all(w > 0 for w in r["writes_per_sec"]), r["contender"]
        assert r["trace"]["requests"] == sizes["trace_requests"] and r["trace"]["blocks"] > 0
        assert r["held"]["object"] > 0, "every contender stands in front of the object store"
        assert r["cost_per_million_entries_month"] > 0
    by = {r["contender"]: r for r in report["rows"]}
    # The object store read directly has no memory; Strata's hot reads come from DRAM.
    assert by["object store direct"]["hot_from_memory"] == 0
    assert by["strata (prefetch on)"]["hot_from_memory"] > 0.5
    # Strata really used its cold tier: the oldest keys were read back from the object store
    # (or brought ahead of the read by prefetch, only when it is on).
    off = by["strata (prefetch off)"]
    assert off["cold_from_object_store"] > 0 and off["prefetch_used"] == 0
    assert by["strata (prefetch on)"]["held"]["object"] > 0
    refs = report["references"]
    assert all(refs[k] > 0 for k in refs), refs
    # The KV-cache rows ran in memory cgroups, or say why not.
    kv = report["kvcache"]
    if kv:
        assert [r["contender"].split()[0] for r in kv] == ["strata", "redis-server", "one"]
        assert all(r["working_set_bytes"] > r["memory_limit_bytes"] for r in kv)
        assert kv[0]["hit_rate"] > 0
    else:
        assert report["kvcache_skipped"]
    md = (tmp_path / "compare.md").read_text()
    for name in CONTENDERS:
        assert f"| {name} |" in md
    assert "## Physical references" in md and "$ per million entries" in md
    assert (tmp_path / "compare.png").stat().st_size > 0
    assert "[1/" in run.stderr and "KV-cache reads in a memory cgroup" in run.stderr, "progress is shown"
