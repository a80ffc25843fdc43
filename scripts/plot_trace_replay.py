#!/usr/bin/env python3
"""Draws trace-replay.json: hit rate against capacity, one line per policy."""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

rows = json.load(open(sys.argv[1]))
fig, ax = plt.subplots(figsize=(7, 4.5))
for policy in sorted({r["policy"] for r in rows}):
    pts = sorted((r["capacity_blocks"], r["hit_rate"] * 100) for r in rows if r["policy"] == policy)
    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=policy, linestyle="--" if policy == "opt" else "-")
ax.set_xscale("log")
ax.set_xlabel("capacity (blocks)")
ax.set_ylabel("block hit rate (%)")
ax.set_title("Trace replay: hit rate by policy")
ax.grid(True, alpha=0.3)
ax.legend()
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
print(f"wrote {sys.argv[2]}")
