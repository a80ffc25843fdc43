#!/usr/bin/env python3
"""Draws compare.json (`strata-bench compare`): hot and cold read latency distributions per
contender, and the trace's effective hit rate split by where the hits came from."""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

rep = json.load(open(sys.argv[1]))
rows = rep["rows"]
fig, axes = plt.subplots(1, 3, figsize=(16, 5))
for ax, which, title in ((axes[0], "hot_quantiles", "hot reads"), (axes[1], "cold_quantiles", "cold reads")):
    for r in rows:
        pts = r[which]
        if pts:
            ax.plot([ms for _, ms in pts], [q for q, _ in pts], marker="o", label=r["contender"])
    ax.set_xscale("log")
    ax.set_xlabel("latency, ms (log)")
    ax.set_ylabel("quantile")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
axes[0].legend(fontsize=7)
ax = axes[2]
names = [r["contender"] for r in rows]
bottom = [0.0] * len(rows)
colors = {"DRAM": "tab:red", "RocksDB": "tab:orange", "cache": "tab:red", "object store": "tab:blue"}
for source in ("DRAM", "cache", "RocksDB", "object store"):
    share = [r["trace"]["hit_rate"] * dict(map(tuple, r["trace"]["sources"])).get(source, 0.0) * 100 for r in rows]
    if any(share):
        ax.bar(names, share, bottom=bottom, label=source, color=colors[source])
        bottom = [b + s for b, s in zip(bottom, share)]
ax.set_ylabel("effective hit rate, % of block reads")
ax.set_title(f"conversation trace ({rows[0]['trace']['requests']} requests)")
ax.legend(fontsize=7)
plt.setp(ax.get_xticklabels(), rotation=30, ha="right", fontsize=7)
fig.suptitle(f"strata-bench compare ({rep['machine']})", fontsize=9)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
print(f"wrote {sys.argv[2]}")
