#!/usr/bin/env python3
"""Draws kvcache.json: read bandwidth per backend against the loopback ceiling."""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

rep = json.load(open(sys.argv[1]))
rows = rep["rows"]
fig, ax = plt.subplots(figsize=(9, 5))
ax.bar([r["backend"] for r in rows], [r["read_gib_per_sec"] for r in rows], color="tab:blue")
ax.axhline(rep["loopback_gib_per_sec"], color="tab:red", linestyle="--", label="loopback TCP (1 MiB, in cache)")
if "loopback_from_memory_gib_per_sec" in rep:
    ax.axhline(rep["loopback_from_memory_gib_per_sec"], color="tab:orange", linestyle=":",
               label="loopback TCP (from and to memory)")
ax.set_ylabel("read GiB/s")
ax.set_title("KV-cache prefix reads (same run)")
ax.legend()
plt.setp(ax.get_xticklabels(), rotation=30, ha="right", fontsize=7)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
print(f"wrote {sys.argv[2]}")
