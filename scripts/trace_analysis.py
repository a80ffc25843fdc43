#!/usr/bin/env python3
"""How much of the LRU-to-OPT gap on a Mooncake trace can any online policy close?

Issue 4's evidence, reproducible: prints, for the capacities given,
  1. LRU with an admission oracle: a block is stored only if the trace uses it again
     (within a horizon): how much of OPT's hit rate is a matter of knowing what to admit;
  2. how often a newly stored block is used again, by what a policy can see when it stores
     it (position in its request, leading blocks seen before, access count);
  3. a hit-density policy (LHD, Beckmann et al., NSDI'18) whose per-class statistics are
     fitted on the whole trace in hindsight: the best ranking by (access count, last block
     of its request, turn of its conversation) and age, with no per-block foresight.
Same replay rule as `strata trace replay`: a block hits only if every earlier block of its
request hit; afterwards all the request's blocks are stored. Standard library only.

    python3 scripts/trace_analysis.py [--trace FILE] [--capacity 1000 --capacity 5859]
"""
import argparse
import bisect
import collections
import json
import math
import random
import sys


def load(path):
    with open(path) as f:
        return [json.loads(line)["hash_ids"] for line in f if line.strip()]


def next_use_table(reqs):
    uses = collections.defaultdict(list)
    for i, r in enumerate(reqs):
        for b in r:
            uses[b].append(i)

    def next_use(b, i):
        u = uses[b]
        j = bisect.bisect_right(u, i)
        return u[j] - i if j < len(u) else math.inf

    return next_use


def prefix_hits(request, cache):
    """The replay rule: a block hits only if it and every earlier block of its request are
    cached."""
    n = 0
    for b in request:
        if b not in cache:
            break
        n += 1
    return n


def lru_with_oracle(reqs, next_use, cap, horizon):
    """LRU; with a horizon, a block not used again within it is not stored."""
    cache = collections.OrderedDict()
    hits = 0
    for i, r in enumerate(reqs):
        hits += prefix_hits(r, cache)
        for b in r:
            if horizon is not None and next_use(b, i) > horizon:
                cache.pop(b, None)
                continue
            cache[b] = True
            cache.move_to_end(b)
            while len(cache) > cap:
                cache.popitem(last=False)
    return hits / sum(map(len, reqs))


def reuse_by_feature(reqs, next_use):
    seen = set()
    table = collections.defaultdict(lambda: [0, 0])
    for i, r in enumerate(reqs):
        leading = 0
        for b in r:
            if b not in seen:
                break
            leading += 1
        n = len(r)
        for pos, b in enumerate(r):
            if b in seen:
                continue
            reused = next_use(b, i) < math.inf
            for feature in (
                ("last block of its request", pos == n - 1),
                ("leading blocks seen before >= 5", leading >= 5),
            ):
                cell = table[feature]
                cell[0] += 1
                cell[1] += reused
        seen.update(r)
    return table


AGE_BUCKETS = 41


def age_bucket(age):
    return min(int(math.log2(age + 1) * 2), AGE_BUCKETS - 1)


def classes(reqs):
    """Yields (request index, position, block, class) for every access, in order."""
    count = collections.Counter()
    for i, r in enumerate(reqs):
        n = len(r)
        for pos, b in enumerate(r):
            count[b] += 1
            turn = min(count[r[1]], 6) if n > 1 else 0
            yield i, pos, b, (min(count[b], 4), pos == n - 1, turn)


def fit_hit_density(reqs, next_use, lifetime):
    ages = [0] + [2 ** (k / 2) for k in range(1, AGE_BUCKETS)]
    hits = collections.defaultdict(lambda: [0.0] * AGE_BUCKETS)
    life = collections.defaultdict(lambda: [0.0] * AGE_BUCKETS)
    for i, _, b, c in classes(reqs):
        d = next_use(b, i)
        for k, a in enumerate(ages):
            if a >= lifetime or d <= a:
                break
            if d <= lifetime:
                hits[c][k] += 1
            life[c][k] += min(d, lifetime) - a
    return {
        c: [h / l if l else 0.0 for h, l in zip(hits[c], life[c])] for c in life
    }


def replay_hit_density(reqs, density, cap, lifetime, samples=64, seed=1):
    rnd = random.Random(seed)
    cache = {}  # block -> (request of last access, class, position)
    keys, slot = [], {}
    hits = 0
    events = classes(reqs)
    for i, r in enumerate(reqs):
        hits += prefix_hits(r, cache)
        for _ in r:
            _, pos, b, c = next(events)
            if b not in cache:
                slot[b] = len(keys)
                keys.append(b)
            cache[b] = (i, c, pos)
        while len(cache) > cap:
            victim = None
            for _ in range(samples):
                k = keys[rnd.randrange(len(keys))]
                last, c, pos = cache[k]
                age = i - last
                d = density[c][age_bucket(age)] if age < lifetime else 0.0
                score = (d, -pos)  # among equals, the chain's tail first
                if victim is None or score < victim[0]:
                    victim = (score, k)
            k = victim[1]
            del cache[k]
            j = slot.pop(k)
            moved = keys.pop()
            if j < len(keys):
                keys[j] = moved
                slot[moved] = j
    return hits / sum(map(len, reqs))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trace", default="traces/conversation_trace.jsonl")
    p.add_argument("--capacity", type=int, action="append")
    p.add_argument("--lifetime", type=int, default=3000,
                   help="LHD: requests after which an unused block counts as evicted")
    args = p.parse_args()
    caps = args.capacity or [1000, 5859]
    reqs = load(args.trace)
    next_use = next_use_table(reqs)
    print(f"{args.trace}: {len(reqs)} requests, {sum(map(len, reqs))} blocks")

    print("\n1. LRU that stores a block only if it is used again within the horizon")
    print("| capacity | no oracle | any time | 2000 req | 1000 req | 500 req | 250 req |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for cap in caps:
        row = [lru_with_oracle(reqs, next_use, cap, h)
               for h in (None, len(reqs), 2000, 1000, 500, 250)]
        print(f"| {cap} | " + " | ".join(f"{100 * x:.1f}%" for x in row) + " |")

    print("\n2. New blocks used again later, by what is visible when they are stored")
    print("| feature | value | blocks | used again |")
    print("|---|---|---:|---:|")
    for (name, value), (n, reused) in sorted(reuse_by_feature(reqs, next_use).items()):
        print(f"| {name} | {value} | {n} | {100 * reused / n:.1f}% |")

    print("\n3. Hit-density eviction with per-class statistics fitted in hindsight")
    print("   (class: access count, last block of its request, conversation turn; and age)")
    print("   fitting the statistics on the whole trace...", file=sys.stderr, flush=True)
    density = fit_hit_density(reqs, next_use, args.lifetime)
    for cap in caps:
        print(f"   capacity {cap}: "
              f"{100 * replay_hit_density(reqs, density, cap, args.lifetime):.1f}%",
              flush=True)


if __name__ == "__main__":
    main()
