#!/usr/bin/env python3
"""Summarises a timeline of the MLA wgmma decode (build with -DATTNKIT_MLA_TIMELINE=ON; the engine
writes $ATTNKIT_MLA_TIMELINE_OUT after each launch; mla_decode_wgmma.cuh's MlaTlEvent names the
events). Usage: mla_timeline.py FILE.bin [--ctas N] [--words N]

Per CTA (the first --ctas, default 32) three records, consumer g (0, 1) and the producer (2): word 0
= words written, then (clock64, event | tile << 8) pairs. All records of a CTA share the SM's clock. For every pair
(a, a + 1) of a segment but its first and last, each event of either consumer stamped with tile a
is taken relative to consumer 0's pair entry (kTlPair, tile a); the table gives the median and the
quartiles over all such pairs and CTAs in cycles, and the pair period (consumer 0's entry to its
next entry)."""
import statistics
import struct
import sys
from collections import defaultdict

NAMES = {
    123: "next: Q issued", 124: "next: pair 1 issued",
    120: "next: seg head", 121: "next: Q in", 101: "next: segment", 103: "next: S issued",
    104: "next: S done",
    1: "segment", 2: "pair", 3: "S issued", 4: "S done", 5: "max out", 6: "max in",
    7: "own PV issued", 8: "own PV done", 9: "P stored", 10: "P in", 11: "other PV issued",
    12: "retired", 13: "early S0 lo", 14: "early S0 hi", 15: "segment end",
    16: "gtimer start", 17: "gtimer end", 18: "row sums", 19: "Q free",
    20: "segment head", 21: "Q in",
}


RECORDS = 3  # consumer 0, consumer 1, producer
WINDOW = 30000  # cycles: events of a pair lie within a few pair periods of its entry


def quart(v):
    v = sorted(v)
    n = len(v)
    return v[n // 4], statistics.median(v), v[(3 * n) // 4]


def main():
    args = sys.argv[1:]
    path = args[0]
    ctas = int(args[args.index("--ctas") + 1]) if "--ctas" in args else 32
    words = int(args[args.index("--words") + 1]) if "--words" in args else 8192
    raw = open(path, "rb").read()
    vals = struct.unpack("<%dQ" % (len(raw) // 8), raw)
    offs = defaultdict(list)   # (g, event) -> offsets
    periods, seg_pairs, seg_cycles, first_pair, tail = [], [], [], [], []
    ghz, gstart, gend = [], [], []
    bounds = defaultdict(list)  # (consumer, event) -> offsets from a segment's last pair entry
    for c in range(ctas):
        ev = {}
        for g in range(RECORDS):
            base = (RECORDS * c + g) * words
            n = vals[base]
            if n < 2 or n > words:
                ev[g] = []
                continue
            ev[g] = [(vals[base + i], vals[base + i + 1] & 0xFF, vals[base + i + 1] >> 8)
                     for i in range(2, n, 2)]
        ev.setdefault(2, [])
        if not ev[0] or not ev[1]:
            continue
        # segments of consumer 0: split at kTlGlobalStart (stamped right before kTlSegment)
        segs, cur = [], []
        for t, e, tile in ev[0]:
            if e == 16 and cur:
                segs.append(cur)
                cur = []
            cur.append((t, e, tile))
        if cur:
            segs.append(cur)
        for t, e, tile in ev[0]:
            if e == 16:
                gstart.append(t)
            elif e == 17:
                gend.append(t)
        for seg in segs:
            # clock rate: the segment's clock and globaltimer spans
            stamp = {e: t for t, e, _ in seg}
            if all(e in stamp for e in (1, 15, 16, 17)) and stamp[17] > stamp[16]:
                ghz.append((stamp[15] - stamp[1]) / (stamp[17] - stamp[16]))
            entries = [(t, tile) for t, e, tile in seg if e == 2]
            seg_pairs.append(len(entries))
            ends = [t for t, e, _ in seg if e == 15]
            starts = [t for t, e, _ in seg if e == 1]
            if ends and starts:
                seg_cycles.append(ends[-1] - starts[0])
            if entries and starts:
                first_pair.append(entries[0][0] - starts[0])
                if ends:
                    tail.append(ends[-1] - entries[-1][0])
            if entries and len(segs) > 1 and seg is not segs[-1]:
                # the last pair, the epilogue and the next segment's head, up to its first S
                t_l, a_l = entries[-1]
                nxt = segs[segs.index(seg) + 1]
                n_entries = [(t, tile) for t, e, tile in nxt if e == 2]
                for g in range(2):
                    for t, e, tile in ev[g]:
                        if t_l - 5000 <= t and (tile == a_l or (e in (15, 18) and tile >= a_l)):
                            if t - t_l < 60000:
                                bounds[(g, e)].append(t - t_l)
                        if n_entries and e in (20, 21, 1, 3, 4) and t_l < t and (
                                e in (20, 21, 1) or tile == n_entries[0][1]) and t - t_l < 60000:
                            bounds[(g, 100 + e)].append(t - t_l)
                # the producer's head / Q issue / first pair of the next segment: its last such
                # stamps before consumer 0's first S of that segment
                s_next = [t for t, e, tile in nxt if e == 3]
                if s_next and len(ev) > 2:
                    for e in (20, 23, 24):
                        ts = [t for t, ee, _ in ev[2] if ee == e and t < s_next[0]]
                        if ts:
                            bounds[(2, 100 + e)].append(ts[-1] - t_l)
            for k in range(1, len(entries) - 1):
                t_a, a = entries[k]
                periods.append(entries[k + 1][0] - t_a)
                for g in range(2):
                    for t, e, tile in ev[g]:
                        # the same tile of another segment (request) is far away in time
                        if tile == a and e not in (1, 15, 16, 17) and abs(t - t_a) < WINDOW:
                            offs[(g, e)].append(t - t_a)
    if bounds:
        print("segment boundary (cycles from the last pair's entry, consumer 0 / 1 medians):")
        for k in sorted(bounds, key=lambda k: statistics.median(bounds[k])):
            print(f"  {k[0]} {NAMES.get(k[1], k[1]):16s} {statistics.median(bounds[k]):9.0f} {len(bounds[k]):5d}")
    if not periods:
        print("no steady-state pairs found")
        return
    rate = statistics.median(ghz) if ghz else float("nan")
    print(f"CTAs {ctas}; pairs per segment {quart(seg_pairs)}; clock {rate:.3f} cycles/ns")
    p = quart(periods)
    print(f"pair period (cycles) p25 / median / p75: {p[0]} / {p[1]} / {p[2]}"
          f"  = {p[1] / rate:.0f} ns")
    if seg_cycles:
        print(f"segment cycles {quart(seg_cycles)}; segment start -> first pair {quart(first_pair)};"
              f" last pair entry -> segment end {quart(tail)}")
    if gstart and gend:
        print(f"globaltimer: first CTA start -> last CTA end {(max(gend) - min(gstart)) / 1e3:.1f} us;"
              f" starts spread {(max(gstart) - min(gstart)) / 1e3:.1f} us")
    print("offset from consumer 0's pair entry (cycles): consumer event  p25  median  p75  n")
    rows = sorted(offs.items(), key=lambda kv: statistics.median(kv[1]))
    for (g, e), v in rows:
        q = quart(v)
        print(f"  c{g} {NAMES.get(e, e):16s} {q[0]:7d} {q[1]:9.0f} {q[2]:7d} {len(v):6d}")


if __name__ == "__main__":
    main()
