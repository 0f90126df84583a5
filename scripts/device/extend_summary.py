# Prints the extend bench results of one device run next to the prefill peers of the same run
# ($OUT/prefill_peers.json, from scripts/device/prefill_peers.py): TFLOP/s and the ratios to SDPA
# FlashAttention-2 and cuDNN at the same (batch, tokens, head dim) when there is no prefix. Reads
# $OUT/bench_extend.json and, when present, $OUT/bench_mmasync.json (flashinfer with
# ATTNKIT_FLASHINFER_SM90_PREFILL=0); then the cascade A/B ($OUT/bench_cascade_{off,on}.json).
import json
import os

out = os.environ.get("OUT", ".")


def load(name):
    try:
        return json.load(open(os.path.join(out, name)))
    except (OSError, ValueError) as ex:
        print(f"({name}: {ex})")
        return None


peers = {}
for r in load("prefill_peers.json") or []:
    peers[(r["name"], r["B"], r["S"], r["d"])] = r["tflops"]

print(f"{'backend':12s} {'case':52s} {'ms':>8s} {'TF/s':>7s} {'xFA2':>6s} {'xcuDNN':>6s}")
for fname, tag in [("bench_extend.json", ""), ("bench_mmasync.json", "/mma")]:
    bench = load(fname)
    if bench is None:
        continue
    for r in bench["results"]:
        p = r["params"]
        key = (p["batch"], p["new_tokens"], p["head_dim"])
        fa2 = peers.get(("sdpa_flash",) + key) if p["prefix_len"] == 0 else None
        cud = peers.get(("sdpa_cudnn",) + key) if p["prefix_len"] == 0 else None
        tf = r.get("tflops") or 0.0
        ms = r.get("ms_median") or 0.0
        f = lambda x: f"{tf / x:6.2f}" if x else "     -"
        line = f"{r['backend'] + tag:12s} {r['case']:52s} {ms:8.3f} {tf:7.1f} {f(fa2)} {f(cud)}"
        if r.get("status") != "ok":
            line += f"  [{r.get('status')}: {r.get('message', '')[:60]}]"
        print(line)

off, on = load("bench_cascade_off.json"), load("bench_cascade_on.json")
if off and on:
    print(f"\n{'cascade case':56s} {'off ms':>8s} {'on ms':>8s} {'off/on':>7s} {'on GB/s':>8s}")
    on_by_case = {r["case"]: r for r in on["results"]}
    for r in off["results"]:
        o = on_by_case.get(r["case"])
        if o is None:
            continue
        a, b = r.get("ms_median") or 0.0, o.get("ms_median") or 0.0
        ratio = f"{a / b:7.2f}" if a and b else "      -"
        bad = "" if r.get("status") == "ok" and o.get("status") == "ok" else \
            f"  [{r.get('status')}/{o.get('status')}]"
        print(f"{r['case']:56s} {a:8.4f} {b:8.4f} {ratio} {o.get('gbs') or 0:8.0f}{bad}")
