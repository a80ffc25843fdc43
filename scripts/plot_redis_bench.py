#!/usr/bin/env python3
"""Draws reports/redis-benchmark.json as a bar chart of Strata/Redis throughput ratios."""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

rows = json.load(open(sys.argv[1]))
labels = [f"{r['test']}\n{r['value_bytes']}B c{r['clients']} P{r['pipeline']}" for r in rows]
ratios = [r["rps_ratio"] for r in rows]
fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.6), 4.5))
ax.bar(range(len(rows)), ratios, color=["tab:green" if x >= 1 else "tab:red" for x in ratios])
ax.axhline(1.0, color="black", linewidth=0.8)
ax.set_xticks(range(len(rows)))
ax.set_xticklabels(labels, rotation=90, fontsize=7)
ax.set_ylabel("Strata ops/s ÷ Redis ops/s")
ax.set_title("redis-benchmark: Strata beside Redis (same run)")
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
print(f"wrote {sys.argv[2]}")
