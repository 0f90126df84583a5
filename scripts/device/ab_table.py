#!/usr/bin/env python3
"""The table of an alternated A/B bench (fa3_patch_ab.sh, fa3_variants_ab.sh).

Input: lines "== round R VARIANT" followed by "CASE MS TFLOPS" rows (attnkit bench columns 2, 3
and 6). Output: per case, each variant's median ms with the rounds in brackets, and each variant's
median against the first variant's.
"""
import collections
import statistics
import sys


def main(path):
    rows = collections.defaultdict(lambda: collections.defaultdict(list))
    variants = []
    variant = None
    for line in open(path):
        f = line.split()
        if line.startswith("=="):
            variant = f[3]
            if variant not in variants:
                variants.append(variant)
        elif len(f) == 3 and variant is not None:
            rows[f[0]][variant].append(float(f[1]))
    if not variants:
        print("no rounds in", path)
        return
    print("case: median ms (per round) | " + " | ".join(variants) + " | median vs " + variants[0])
    for name, case in rows.items():
        base = statistics.median(case[variants[0]]) if case[variants[0]] else None
        cells = [f"{statistics.median(case[v]):.3f} ({','.join(f'{x:.3f}' for x in case[v])})"
                 if case[v] else "-" for v in variants]
        ratios = [f"{v} {100 * (statistics.median(case[v]) / base - 1):+.1f}%"
                  for v in variants[1:] if case[v] and base]
        print(name.replace("extend_", "").replace("_h32x8", ""), "|", " | ".join(cells), "|",
              ", ".join(ratios))


if __name__ == "__main__":
    main(sys.argv[1])
