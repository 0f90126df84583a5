"""Session 8 fidecode A/B table: per (mode, case, variant) the median us and % of the same
process's copy ceiling over the rounds of fidecode_s8.sh; the fp8 / bf16 tokens/s ratio (b16 p16);
and the full decode targets once per mode."""
import glob
import json
import os
import sys
from collections import defaultdict

out = sys.argv[1]


def load(path):
    d = json.load(open(path))
    rows = {}
    for r in d["results"]:
        n = r["case"].replace("decode_", "").replace("_h32x8_d128", "")
        rows[(r["backend"], n)] = (r.get("ms_median", 0) * 1e3, 100 * r.get("ceiling_ratio", 0),
                                   r["status"])
    ceil = [round(c["gbs"]) for c in d.get("ceilings", []) if "gbs" in c]
    return rows, ceil


for m in ("eager", "b2b", "graph"):
    p = os.path.join(out, f"targets_{m}.json")
    if not os.path.exists(p):
        continue
    rows, ceil = load(p)
    print(f"=== targets {m} (copy {ceil})")
    for (be, n), (us, pct, st) in rows.items():
        print(f"{be:10s} {n:26s} {us:7.1f}us {pct:5.1f}% {st}")
ab = defaultdict(list)  # (mode, variant, case) -> [(us, pct)]
for p in sorted(glob.glob(os.path.join(out, "ab_*.json"))):
    _, rnd, m, v = os.path.basename(p)[:-5].split("_", 3)
    rows, ceil = load(p)
    for (be, n), (us, pct, st) in rows.items():
        ab[(m, v, n)].append((us, pct, int(rnd)))
cases = sorted({k[2] for k in ab})
variants = []
for k in ab:
    if k[1] not in variants:
        variants.append(k[1])
for m in ("eager", "b2b", "graph", "graph32"):
    if not any(k[0] == m for k in ab):
        continue
    print(f"=== A/B {m}: us (% of copy) per round")
    for n in cases:
        for v in variants:
            xs = sorted(ab.get((m, v, n), []), key=lambda x: x[2])
            print(f"{n:26s} {v:34s} " + "  ".join(f"{us:6.1f} ({pct:4.1f}%)" for us, pct, _ in xs))
    for v in variants:
        bf = {r: us for us, _, r in ab.get((m, v, "b16_kv4096_p16_kvbf16"), [])}
        f8 = {r: us for us, _, r in ab.get((m, v, "b16_kv4096_p16_kvfp8_e4m3"), [])}
        rs = [f"{bf[r] / f8[r]:.3f}" for r in sorted(bf) if r in f8 and f8[r] > 0]
        print(f"fp8/bf16 tokens/s b16 p16  {v:34s} {' '.join(rs)}")
