"""Compact table of an attnkit bench JSON (decode): backend, case, us, GB/s, % of copy."""
import json
import sys

d = json.load(open(sys.argv[1]))
for c in d.get("ceilings", []):
    if "gbs" in c:
        print("ceiling", c["name"], round(c["gbs"]))
for r in d["results"]:
    n = r["case"].replace("decode_", "").replace("_h32x8_d128", "")
    us = r.get("ms_median", 0) * 1e3
    pct = 100 * r.get("ceiling_ratio", 0)
    print(f"{r['backend']:10s} {n:26s} {us:7.1f}us {r.get('gbs', 0):6.0f} {pct:5.1f}% {r['status']}")
