# Prints the extend bench results ($OUT/bench_extend.json) next to the prefill peers of the same
# run ($OUT/prefill_peers.json, from scripts/device/prefill_peers.py): TFLOP/s and the ratios to
# SDPA FlashAttention-2 and cuDNN at the same (batch, tokens, head dim) when there is no prefix.
import json
import os
import sys

out = os.environ.get("OUT", ".")
try:
    bench = json.load(open(os.path.join(out, "bench_extend.json")))
except OSError as ex:
    sys.exit(f"no bench_extend.json: {ex}")
peers = {}
try:
    for r in json.load(open(os.path.join(out, "prefill_peers.json"))):
        peers[(r["name"], r["B"], r["S"], r["d"])] = r["tflops"]
except OSError:
    pass
print(f"{'backend':10s} {'case':52s} {'ms':>8s} {'TF/s':>7s} {'xFA2':>6s} {'xcuDNN':>6s}")
for r in bench["results"]:
    p = r["params"]
    key = (p["batch"], p["new_tokens"], p["head_dim"])
    fa2 = peers.get(("sdpa_flash",) + key) if p["prefix_len"] == 0 else None
    cud = peers.get(("sdpa_cudnn",) + key) if p["prefix_len"] == 0 else None
    tf = r.get("tflops") or 0.0
    ms = r.get("ms_median") or 0.0
    f = lambda x: f"{tf / x:6.2f}" if x else "     -"
    line = f"{r['backend']:10s} {r['case']:52s} {ms:8.3f} {tf:7.1f} {f(fa2)} {f(cud)}"
    if r.get("status") != "ok":
        line += f"  [{r.get('status')}: {r.get('message', '')[:60]}]"
    print(line)
