# Table of a triton extend A/B (scripts/device/triton_extend_ab.sh): one row per bench run and
# case (files v<i>_<variant>.json in the directory of argv[1], in run order), TFLOP/s and the ratio
# to SDPA FlashAttention-2 / cuDNN of the same run (argv[2], from prefill_peers.py). Writes every
# result into one JSON (argv[3]).
import glob
import json
import os
import re
import sys

bench_dir, peers_file, out_file = sys.argv[1:4]
peers = {}
try:
    for r in json.load(open(peers_file)):
        peers[(r["name"], r["B"], r["S"], r["d"])] = r["tflops"]
except (OSError, ValueError) as ex:
    print(f"(peers: {ex})")

runs = []
for f in glob.glob(os.path.join(bench_dir, "v*.json")):
    m = re.match(r"v(\d+)_(.*)\.json", os.path.basename(f))
    try:
        runs.append((int(m.group(1)), m.group(2), json.load(open(f))))
    except (OSError, ValueError) as ex:
        print(f"({f}: {ex})")
runs.sort()

print(f"{'#':>2s} {'variant':8s} {'case':44s} {'ms':>8s} {'TF/s':>7s} {'xFA2':>6s} {'xcuDNN':>6s}")
combined = []
for i, variant, bench in runs:
    for r in bench.get("results", []):
        p = r["params"]
        key = (p["batch"], p["new_tokens"], p["head_dim"])
        fa2 = peers.get(("sdpa_flash",) + key) if p.get("prefix_len", 0) == 0 else None
        cud = peers.get(("sdpa_cudnn",) + key) if p.get("prefix_len", 0) == 0 else None
        tf = r.get("tflops") or 0.0
        ms = r.get("ms_median") or 0.0
        fmt = lambda x: f"{tf / x:6.3f}" if x else "     -"
        line = f"{i:2d} {variant:8s} {r['case'][:44]:44s} {ms:8.3f} {tf:7.1f} {fmt(fa2)} {fmt(cud)}"
        if r.get("status") != "ok":
            line += f"  [{r.get('status')}: {r.get('message', '')[:60]}]"
        print(line)
        combined.append(dict(run=i, variant=variant, **r))
for (name, B, S, d), tf in sorted(peers.items()):
    print(f"peer {name} B{B} S{S} d{d}: {tf:.1f} TFLOP/s")
with open(out_file, "w") as f:
    json.dump(dict(peers=[dict(name=k[0], B=k[1], S=k[2], d=k[3], tflops=v)
                          for k, v in peers.items()], results=combined), f, indent=1)
