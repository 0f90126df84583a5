#!/usr/bin/env python3
"""Least-squares fits of fa3 prefill times (ms, H200) per kernel (FP8 e4m3 q, bf16), with the work
units as build_tile_plan makes them (192-row tiles anchored at the request end, 128-key blocks,
32 q heads) and 132 CTAs. docs/perf/fa3_notes.md "Session 53" / "Session 54".

  python3 scripts/fa3_cost_fit.py
      session 53: c x key blocks of all units / 132 + a fixed cost, over session 52's causal
      4k / 8k / 16k and session 53's bidirectional 4k / 8k times (the unit counts barely differ,
      so per unit and per forward cannot be told apart).
  python3 scripts/fa3_cost_fit.py docs/perf/s54/h200_0718_fixed_cost.txt
      session 54: the output of scripts/device/fa3_fixed_cost.sh (equal causal FLOPs over 1x to
      ~8x the units, --launches 1 and 10), median per case, fitted per --launches value as key
      blocks / 132, units / 132 and a per-forward constant."""
import collections
import math
import re
import statistics
import sys

import numpy as np

G = 132


def units(L, B, causal, bm=192, bn=128, H=32):
    us = []
    for _ in range(B):
        t = 0
        while L - bm * t > 0:
            end = L - bm * t
            nb = math.ceil(end / bn) if causal else math.ceil(L / bn)
            us += [nb] * H
            t += 1
    return us


def fit(rows, label):
    """rows: (L, B, causal, ms). Prints the fits with each subset of the three terms."""
    A = np.array([[sum(u) / G, len(u) / G, 1.0] for u in (units(L, B, c) for L, B, c, _ in rows)])
    y = np.array([r[3] for r in rows])
    for cols, name in [([0, 2], "blocks + per forward"), ([0, 1], "blocks + per unit"),
                       ([0, 1, 2], "all three")]:
        sol, *_ = np.linalg.lstsq(A[:, cols], y, rcond=None)
        err = max(abs(A[:, cols] @ sol - y) / y)
        terms = ", ".join(f"{n} {v * 1000:.3f} us" for n, v in
                          zip([["block", "unit", "forward"][c] for c in cols], sol))
        print(f"{label}: {name}: {terms}; max rel err {100 * err:.2f}%")


def session53():
    fp8 = {('c', 4096, 4): 0.6162, ('c', 8192, 2): 1.116, ('c', 16384, 1): 2.103,
           ('b', 4096, 4): 1.1301, ('b', 8192, 2): 2.1374}
    bf = {('c', 4096, 4): 0.8744, ('c', 8192, 2): 1.627, ('c', 16384, 1): 3.120,
          ('b', 4096, 4): 1.6537, ('b', 8192, 2): 3.1384}
    for name, data in [('fp8', fp8), ('bf16', bf)]:
        fit([(L, B, m == 'c', t) for (m, L, B), t in data.items()], name)


def session54(path):
    times = collections.defaultdict(list)
    launches = None
    for line in open(path):
        if line.startswith("=="):  # "== round R launches L FILE"
            launches = int(line.split()[4])
            continue
        fields = line.split()
        if len(fields) != 3 or launches is None or not fields[0].startswith("extend_b"):
            continue  # blank or foreign lines
        times[(fields[0], launches)].append(float(fields[1]))
    for la in sorted({k[1] for k in times}):
        for kind in ("bf16", "fp8"):
            rows = []
            for (name, l), v in times.items():
                if l != la or ("qfp8" in name) != (kind == "fp8"):
                    continue
                m = re.match(r"extend_b(\d+)_pre0_new(\d+)", name)
                if m is None:  # only prefills without a prefix fit this model
                    continue
                rows.append((int(m[2]), int(m[1]), "bidir" not in name, statistics.median(v)))
            fit(rows, f"--launches {la} {kind}")


if __name__ == "__main__":
    session54(sys.argv[1]) if len(sys.argv) > 1 else session53()
