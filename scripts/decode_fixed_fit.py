#!/usr/bin/env python3
"""Fits decode forward times to a fixed cost plus bytes at a streaming rate.

Input: `attnkit bench` table output (e.g. scripts/device/s55_probe.sh's decode.txt): rows
`flashinfer decode_b<B>_kv<K>_... ms GB/s %ceil ...`, and `# ceiling cuda_d2d_copy: X GB/s`
lines. Cases are grouped by batch and KV dtype; each group with >= 2 kv lengths is fitted by
least squares as time = a + bytes / rate (bytes = GB/s x ms, the bench's own byte count), and
printed with, per case, the share of the copy ceiling it would reach without the fixed cost.
Usage: python3 scripts/decode_fixed_fit.py FILE [FILE ...]
"""
import re
import sys
from collections import defaultdict

ROW = re.compile(r"^(\S+)\s+decode_b(\d+)_kv(\d+)_\S*_kv(\S+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)")
CEIL = re.compile(r"cuda_d2d_copy:\s*([0-9.]+) GB/s")


def main(paths):
    groups = defaultdict(list)  # (backend, batch, kv dtype) -> [(kv, ms, bytes)]
    ceilings = []
    for path in paths:
        for line in open(path):
            m = CEIL.search(line)
            if m:
                ceilings.append(float(m.group(1)))
                continue
            m = ROW.match(line)
            if not m:
                continue
            backend, batch, kv, kvdt, ms, gbs = m.group(1), int(m.group(2)), int(m.group(3)), \
                m.group(4), float(m.group(5)), float(m.group(6))
            groups[(backend, batch, kvdt)].append((kv, ms, gbs * 1e9 * ms * 1e-3))
    ceil = sorted(ceilings)[len(ceilings) // 2] if ceilings else None
    if ceil:
        print(f"copy ceiling (median of {len(ceilings)}): {ceil:.0f} GB/s")
    for (backend, batch, kvdt), pts in sorted(groups.items()):
        kvs = sorted({p[0] for p in pts})
        if len(kvs) < 2:
            continue
        n = len(pts)
        sx = sum(p[2] for p in pts)
        sy = sum(p[1] for p in pts)
        sxx = sum(p[2] ** 2 for p in pts)
        sxy = sum(p[2] * p[1] for p in pts)
        slope = (n * sxy - sx * sy) / (n * sxx - sx * sx)  # ms per byte
        a_us = (sy - slope * sx) / n * 1e3
        rate = 1.0 / slope * 1e-9 * 1e3  # GB/s
        worst = max(abs(a_us * 1e-3 + slope * p[2] - p[1]) / p[1] for p in pts)
        print(f"{backend} b{batch} kv {kvdt}: fixed {a_us:.2f} us per forward, streaming "
              f"{rate:.0f} GB/s" + (f" ({100 * rate / ceil:.1f}% of copy)" if ceil else "") +
              f", max error {100 * worst:.1f}%")
        for kv in kvs:
            sel = [p for p in pts if p[0] == kv]
            ms = sorted(p[1] for p in sel)[len(sel) // 2]
            b = sel[0][2]
            line = f"  kv {kv:>6}: {ms * 1e3:7.1f} us, {b / 1e6:7.1f} MB"
            if ceil:
                line += (f", {100 * b / (ms * 1e-3) / 1e9 / ceil:5.1f}% of copy, "
                         f"{100 * b / (ms * 1e-3 - a_us * 1e-6) / 1e9 / ceil:5.1f}% without "
                         "the fixed cost")
            print(line)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
