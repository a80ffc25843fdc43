#!/usr/bin/env python3
"""Writes three synthetic key-access traces (one key per line) that stress different cache
behaviours, so a policy tuned on the conversation trace is also checked elsewhere:

  zipf_scan.txt   Zipf(0.9) over 50,000 keys, with a burst of 2,000 one-off keys every 20,000
                  accesses (frequency matters, scans must not flush the cache)
  loop_drift.txt  half the accesses loop over 3,000 keys, half hit a hot set of 500 keys that
                  drifts every 30,000 accesses (LRU thrashes on the loop)
  recency.txt     new keys keep arriving and are reused while among the 200 newest, then never
                  again (only recency matters; frequency keeps stale keys)

Usage: scripts/synthetic_traces.py OUT_DIR   (then: strata trace replay --trace OUT_DIR/X.txt)
"""
import bisect
import itertools
import os
import random
import sys

ACCESSES = 300_000


def zipf_scan(rnd):
    weights = itertools.accumulate(1 / (i + 1) ** 0.9 for i in range(50_000))
    cum = list(weights)
    scan = 0
    for t in range(ACCESSES):
        if t % 20_000 < 2_000:
            scan += 1
            yield f"scan:{scan}"
        else:
            yield f"k:{bisect.bisect_left(cum, rnd.random() * cum[-1])}"


def loop_drift(rnd):
    for t in range(ACCESSES):
        if rnd.random() < 0.5:
            yield f"loop:{t % 3000}"
        else:
            yield f"hot:{(t // 30_000) * 100 + rnd.randrange(500)}"


def recency(rnd):
    newest = 0
    for _ in range(ACCESSES):
        if newest < 200 or rnd.random() < 0.3:
            newest += 1
            yield f"r:{newest}"
        else:
            yield f"r:{newest - rnd.randrange(200)}"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for gen in (zipf_scan, loop_drift, recency):
        path = os.path.join(out, gen.__name__ + ".txt")
        with open(path, "w") as f:
            f.writelines(k + "\n" for k in gen(random.Random(3)))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
