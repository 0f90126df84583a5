#!/usr/bin/env python3
"""Summary of an MLA device script's bench JSONs (mla_session8.sh, mla_session8b.sh): the copy
ceiling of each bench_<variant>.json in DIR, then per flashmla case each variant's median ms and
% of that ceiling.  Usage: mla_bench_table.py DIR"""
import glob
import json
import os
import sys

rows, ceil = {}, {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "bench_*.json"))):
    name = os.path.basename(f)[6:-5]
    d = json.load(open(f))
    ceil[name] = d.get("ceilings", [{}])[0].get("gbs", 0)
    for r in d.get("results", []):
        if r.get("status") == "ok" and r.get("backend") == "flashmla":
            rows.setdefault(r["case"], {})[name] = (r["ms_median"], r.get("ceiling_ratio") or 0)
print("copy ceilings GB/s:", " ".join(f"{k}={v:.0f}" for k, v in ceil.items()))
for case, v in rows.items():
    print(case.replace("mla_decode_", "")[:44])
    print("   ", " ".join(f"{k}={ms:.4f}ms/{100*cr:.1f}%" for k, (ms, cr) in sorted(v.items())))
