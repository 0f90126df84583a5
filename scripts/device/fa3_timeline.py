#!/usr/bin/env python3
"""Summarises fa3 timeline files (ATTNKIT_FA3_TIMELINE, a -DATTNKIT_FA3_TIMELINE build; see
fa3_params.h kTimelineEvents for the events): where a unit boundary's time goes, in SM clock cycles
and in key blocks of the same warpgroup's steady loop.

  python3 scripts/device/fa3_timeline.py FILE.bin [FILE.bin ...]

Per consumer warpgroup g and unit boundary (round r -> r + 1 of one CTA), the intervals between
the loop's end in round r and the first P of round r + 1:
  last_pv   loop done -> last P V complete        store   -> O stored
  next_q    O stored -> next unit's Q in registers (decode, q_full wait, ldmatrix)
  first_k   -> first K block full                  first_s -> first S complete (turn wait, GEMM)
  first_p   -> first softmax / P packed
block = the steady loop's cycles per key block ((loop done - first P) / (blocks - 1)); overhead =
boundary / block - 1 (the blocks a boundary costs beyond the one block of GEMMs it must hold).
Producer: q_wait (unit start -> q_empty), first_empty (Q issued -> first stage free),
issue_gap (last block issued in r -> first stage free in r + 1).
"""
import statistics
import struct
import sys

def load(path):
    with open(path, "rb") as f:
        grid, rounds, events, causal = struct.unpack("4i", f.read(16))
        n = grid * rounds * events
        words = struct.unpack(f"{n}Q", f.read(8 * n))
    rows = {}
    for b in range(grid):
        for r in range(rounds):
            ev = words[(b * rounds + r) * events:(b * rounds + r + 1) * events]
            if ev[16] != 0:  # the producer stamped this round
                rows[(b, r)] = ev
    return grid, rounds, causal, rows


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def pct(xs, q):
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def summarise(path):
    grid, rounds, causal, rows = load(path)
    print(f"== {path}: grid {grid}, causal {causal}, {len(rows)} CTA rounds recorded "
          f"(first {rounds} per CTA)")
    parts = {k: [] for k in ["last_pv", "store", "next_q", "first_k", "first_s", "first_p",
                             "boundary", "block", "overhead"]}
    prod = {k: [] for k in ["q_wait", "q_issue", "first_empty", "issue_gap", "k_lead"]}
    by_g = {0: [], 1: []}
    for (b, r), ev in rows.items():
        nxt = rows.get((b, r + 1))
        nblk = ev[22]
        if nxt is None:
            continue
        for g in (0, 1):
            c = ev[8 * g:8 * g + 8]
            cn = nxt[8 * g:8 * g + 8]
            if min(c) == 0 or min(cn) == 0 or nblk < 2:
                continue
            block = (c[5] - c[4]) / (nblk - 1)
            bnd = cn[4] - c[5]
            parts["last_pv"].append(c[6] - c[5])
            parts["store"].append(c[7] - c[6])
            parts["next_q"].append(cn[1] - c[7])
            parts["first_k"].append(cn[2] - cn[1])
            parts["first_s"].append(cn[3] - cn[2])
            parts["first_p"].append(cn[4] - cn[3])
            parts["boundary"].append(bnd)
            parts["block"].append(block)
            parts["overhead"].append(bnd / block - 1)
            by_g[g].append(bnd / block - 1)
        prod["q_wait"].append(ev[17] - ev[16])
        prod["q_issue"].append(ev[18] - ev[17])
        prod["first_empty"].append(nxt[19] - nxt[18])
        prod["issue_gap"].append(nxt[19] - ev[21])
        # How long before the consumers wanted the next unit's first K the producer could issue it.
        if nxt[2] and nxt[10]:
            prod["k_lead"].append(min(nxt[2], nxt[10]) - nxt[19])
    print("consumer boundary (cycles: median / p10 / p90):")
    for k, xs in parts.items():
        fmt = "{:9.2f}" if k == "overhead" else "{:9.0f}"
        print(f"  {k:12s}" + " ".join(fmt.format(v) for v in (med(xs), pct(xs, .1), pct(xs, .9))))
    for g in (0, 1):
        print(f"  overhead g{g}: median {med(by_g[g]):.2f} blocks over {len(by_g[g])} boundaries")
    print("producer (cycles: median / p10 / p90):")
    for k, xs in prod.items():
        print(f"  {k:12s}" + " ".join(f"{v:9.0f}" for v in (med(xs), pct(xs, .1), pct(xs, .9))))
    # Share of each CTA's recorded span spent between loops (both warpgroups' view, g 0).
    span, loops = 0, 0
    for b in range(grid):
        rs = sorted(r for (bb, r) in rows if bb == b)
        if not rs or min(rows[(b, rs[0])][0:8]) == 0:
            continue
        evs = [rows[(b, r)] for r in rs if min(rows[(b, r)][0:8]) != 0]
        if len(evs) < 2:
            continue
        span += evs[-1][7] - evs[0][0]
        loops += sum(e[5] - e[4] for e in evs)
    if span:
        print(f"g0: key-block loops {loops / span:.1%} of the recorded span "
              "(the rest: first / last blocks and boundaries)")


def main():
    for path in sys.argv[1:]:
        summarise(path)


if __name__ == "__main__":
    main()
