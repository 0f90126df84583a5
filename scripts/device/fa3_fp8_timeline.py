#!/usr/bin/env python3
"""Summarises the FP8 three-warpgroup loop's per-block timeline (a -DATTNKIT_FA3_TIMELINE build,
ATTNKIT_FA3_TIMELINE=FILE; layout kFp8Tl* in fa3_params.h, stamps fp8_stamp in
prefill_sm90_fp8.cuh): where a key block's cycles go in each consumer warpgroup, and how the three
warpgroups' GEMMs and softmaxes overlap on the SM.

  python3 scripts/device/fa3_fp8_timeline.py FILE.bin [FILE.bin ...]

Per key block of one warpgroup (events 0..6; event 7 of blocks 0..6 holds the unit start, Q ready,
O stored, the block count, the speculation failures, the loop end and the q_full wait's end):
  wait_k   block start -> its K stage full      qk      -> S = Q K^T complete (issue + GEMM + wait)
  softmax  -> P packed, O rescaled               wait_vt -> its V^T stage full
  pv0      -> P V chunk 0 complete and added     pv1     -> chunk 1 complete and added
  gap      -> the next block's start (stage release, loop)
Across the three warpgroups of a CTA's unit (blocks 1.. of the loop, where all three have stamps):
  gemm_any   share of the time at least one warpgroup has a GEMM issued and not yet waited for
             (qk, pv0, pv1): the tensor pipe has work queued
  softmax_k  share of the time exactly k warpgroups are between S complete and P packed
and each softmax's duration by the share of it that the other two warpgroups' softmaxes cover.
"""
import statistics
import struct
import sys

UNITS, WGS, BLOCKS, EVENTS = 4, 3, 16, 8


def load(path):
    with open(path, "rb") as f:
        grid, rounds, events, causal = struct.unpack("4i", f.read(16))
        n = grid * rounds * events
        words = struct.unpack(f"{n}Q", f.read(8 * n))
    assert rounds * events == UNITS * WGS * BLOCKS * EVENTS, "layout"
    per_cta = rounds * events
    return grid, causal, words, per_cta


def ev(words, per_cta, b, r, g, blk, e):
    return words[b * per_cta + ((r * WGS + g) * BLOCKS + blk) * EVENTS + e]


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def union_len(intervals):
    total, end = 0, None
    start = None
    for a, z in sorted(intervals):
        if start is None or a > end:
            if start is not None:
                total += end - start
            start, end = a, z
        else:
            end = max(end, z)
    if start is not None:
        total += end - start
    return total


def summarise(path):
    grid, causal, words, per_cta = load(path)
    names = ["wait_k", "qk", "softmax", "wait_vt", "pv0", "pv1", "gap"]
    parts = {n: [] for n in names}
    period = []
    unit_rows = []
    gemm_any, sm_hist = [], [[] for _ in range(4)]
    # Softmax durations by how much of them other warpgroups' softmaxes cover (summed over the
    # other two, as a fraction of the duration): < 1/8, 1/8-3/8, 3/8-5/8, 5/8-7/8, >= 7/8.
    by_overlap = [[] for _ in range(5)]
    boundary = {"q": [], "epilogue": [], "first_block": [], "q_wait": [], "spread_start": [],
                "spread_landed": [], "q_wait_later": []}
    bad = 0
    for b in range(grid):
        for r in range(UNITS):
            nblk = ev(words, per_cta, b, r, 0, 3, 7)
            if nblk == 0 or ev(words, per_cta, b, r, 0, 0, 7) == 0:
                continue
            unit_rows.append(nblk)
            # How far apart the three warpgroups start the unit and see its Q land.
            for key, blk in (("spread_start", 0), ("spread_landed", 6)):
                ts = [ev(words, per_cta, b, r, g, blk, 7) for g in range(WGS)]
                if all(ts) and r > 0:
                    boundary[key].append(max(ts) - min(ts))
            bad += sum(ev(words, per_cta, b, r, g, 4, 7) for g in range(WGS))
            usable = min(nblk, BLOCKS)
            for g in range(WGS):
                start = ev(words, per_cta, b, r, g, 0, 7)
                qdone = ev(words, per_cta, b, r, g, 1, 7)
                stored = ev(words, per_cta, b, r, g, 2, 7)
                if qdone and start:
                    boundary["q"].append(qdone - start)
                landed = ev(words, per_cta, b, r, g, 6, 7)
                if landed and start:
                    boundary["q_wait"].append(landed - start)
                    if r > 0:  # not the CTA's first unit, whose Q load starts with the kernel
                        boundary["q_wait_later"].append(landed - start)
                first = ev(words, per_cta, b, r, g, 0, 0)
                if first and qdone:
                    boundary["first_block"].append(ev(words, per_cta, b, r, g, 0, 6) - qdone)
                loop_end = ev(words, per_cta, b, r, g, 5, 7)
                if stored and loop_end:
                    boundary["epilogue"].append(stored - loop_end)
                for blk in range(1, usable):
                    e = [ev(words, per_cta, b, r, g, blk, i) for i in range(7)]
                    if not all(e):
                        continue
                    for i in range(6):
                        parts[names[i]].append(e[i + 1] - e[i])
                    if blk + 1 < usable:
                        nxt = ev(words, per_cta, b, r, g, blk + 1, 0)
                        if nxt:
                            parts["gap"].append(nxt - e[6])
                            period.append(nxt - e[0])
            # Overlap across warpgroups over blocks 1 .. usable - 1.
            if usable < 3:
                continue
            gemms, sms = [], []
            lo, hi = None, None
            ok = True
            for g in range(WGS):
                a = ev(words, per_cta, b, r, g, 1, 0)
                z = ev(words, per_cta, b, r, g, usable - 1, 6)
                if not a or not z:
                    ok = False
                    break
                lo = a if lo is None else max(lo, a)
                hi = z if hi is None else min(hi, z)
                for blk in range(1, usable):
                    e = [ev(words, per_cta, b, r, g, blk, i) for i in range(7)]
                    gemms += [(e[1], e[2]), (e[4], e[6])]
                    sms.append((e[2], e[3]))
            if not ok or hi is None or hi <= lo:
                continue
            per_wg = [[(ev(words, per_cta, b, r, g, blk, 2), ev(words, per_cta, b, r, g, blk, 3))
                       for blk in range(1, usable)] for g in range(WGS)]
            for g in range(WGS):
                for a, z in per_wg[g]:
                    if z <= a:
                        continue
                    ov = sum(max(0, min(z, d) - max(a, c)) for h in range(WGS) if h != g
                             for c, d in per_wg[h])
                    f = ov / (z - a)
                    by_overlap[0 if f < 0.125 else 1 if f < 0.375 else 2 if f < 0.625 else
                               3 if f < 0.875 else 4].append(z - a)
            clip = lambda iv: [(max(a, lo), min(z, hi)) for a, z in iv if min(z, hi) > max(a, lo)]
            span = hi - lo
            gemm_any.append(union_len(clip(gemms)) / span)
            # Softmax concurrency histogram by sweeping the clipped intervals.
            pts = []
            for a, z in clip(sms):
                pts += [(a, 1), (z, -1)]
            pts.sort()
            cur, last_t = 0, lo
            acc = [0, 0, 0, 0]
            for t, d in pts:
                acc[min(cur, 3)] += t - last_t
                cur += d
                last_t = t
            acc[min(cur, 3)] += hi - last_t
            for k in range(4):
                sm_hist[k].append(acc[k] / span)
    print(f"== {path}: grid {grid}, causal {causal}, {len(unit_rows)} units recorded, "
          f"median {med(unit_rows)} key blocks, speculation failures {bad}")
    if not period:
        print("  no steady blocks recorded")
        return
    print(f"  block period (one warpgroup, block start to next): median {med(period):.0f} cycles, "
          f"{len(period)} blocks")
    print("  " + "  ".join(f"{n} {med(parts[n]):.0f}" for n in names) + "  (medians, cycles)")
    tot = sum(med(parts[n]) for n in names)
    print("  " + "  ".join(f"{n} {100 * med(parts[n]) / tot:.0f}%" for n in names))
    print(f"  gemm_any {100 * med(gemm_any):.1f}%  softmax_0/1/2/3 " +
          " / ".join(f"{100 * med(h):.1f}%" for h in sm_hist))
    print("  softmax by the share other softmaxes cover (<1/8, 1/8-3/8, 3/8-5/8, 5/8-7/8, >=7/8): " +
          ", ".join(f"{med(x):.0f} ({len(x)})" for x in by_overlap) + " cycles (medians, count)")
    print(f"  boundary: Q quantise {med(boundary['q']):.0f}, first block {med(boundary['first_block']):.0f}, "
          f"loop end -> O stored {med(boundary['epilogue']):.0f} cycles (medians)")
    if boundary["q_wait"]:
        print(f"  unit start -> Q landed (q_full) {med(boundary['q_wait']):.0f}, units after the "
              f"first {med(boundary['q_wait_later']):.0f}; warpgroup spread (max - min, units after "
              f"the first) at the start {med(boundary['spread_start']):.0f}, when Q landed "
              f"{med(boundary['spread_landed']):.0f} cycles (medians)")
        later = boundary["q_wait_later"]
        if later:
            late = sum(1 for x in later if x > 500) / len(later)
            print(f"  units after the first whose warpgroup waited > 500 cycles for Q: "
                  f"{100 * late:.0f}% of {len(later)}")


if __name__ == "__main__":
    for path in sys.argv[1:]:
        summarise(path)
