#!/usr/bin/env bash
# Session 55 probes (one device call; builds attnkit_cli for head dim 128 in build/d128):
#  1. decode by kv length: `attnkit bench --backend flashinfer --graph --launches 32` over
#     scripts/device/decode_s55_kvlen.json, ROUNDS rounds (fit: scripts/decode_fixed_fit.py);
#  2. the SM clock and power while fa3 runs FP8 (e4m3 q) and bf16 causal 1 x 16384 and 4 x 4096,
#     eager (--launches 1, as the targets are timed) and back to back (--launches 20), sampled by
#     nvidia-smi every 20 ms: whether the FP8 kernel runs at a lower clock than bf16.
#   run(carry=[".deps"], command="bash scripts/device/s55_probe.sh")
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
OUT="${OUT:-$root/out}"
mkdir -p "$OUT"
attnkit_build_cli_d128 "$OUT" || exit 1
B=build/d128
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
ak="$B/tools/attnkit/attnkit"
if [[ " ${STAGES:-decode clocks} " == *" decode "* ]]; then
  for r in $(seq 1 "${ROUNDS:-2}"); do
    echo "== decode round $r"
    timeout 200 "$ak" bench --backend flashinfer --device cuda --cases scripts/device/decode_s55_kvlen.json \
      --graph --launches 32 --json "$OUT/decode_r$r.json" 2>/dev/null | grep -E "^flashinfer|copy|ceiling"
  done | tee "$OUT/decode.txt"
fi
if [[ " ${STAGES:-decode clocks} " == *" clocks "* ]]; then
  cat > /tmp/clk.json <<'J'
{"kind": "extend", "description": "s55 clock probe",
 "fixed": {"q_heads": 32, "kv_heads": 8, "dtype": "bf16", "kv_dtype": "bf16", "page_size": 16, "prefix_len": 0, "head_dim": 128, "causal": true},
 "cases": [{"batch": 1, "new_tokens": 16384}, {"batch": 4, "new_tokens": 4096}]}
J
  sed 's/"kv_dtype": "bf16", "page_size"/"kv_dtype": "fp8_e4m3", "fp8_q": true, "page_size"/' /tmp/clk.json > /tmp/clk_fp8.json
  for launches in 1 20; do
    for kind in bf16 fp8; do
      f=/tmp/clk.json; [ $kind = fp8 ] && f=/tmp/clk_fp8.json
      nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
        --format=csv,noheader -lms 20 > "$OUT/clk_${kind}_l$launches.csv" 2>&1 &
      smi=$!
      sleep 0.5
      echo "== clocks $kind launches $launches"
      timeout 120 "$ak" bench --backend fa3 --device cuda --cases $f --warmup 3 --iters 40 \
        --launches $launches 2>/dev/null | awk '$1=="fa3"{print $2, $3, $6}'
      kill $smi; wait $smi 2>/dev/null
      python3 - "$OUT/clk_${kind}_l$launches.csv" <<'P'
import sys
rows = [l.split(", ") for l in open(sys.argv[1]) if l.count(",") >= 4]
busy = [r for r in rows if float(r[2].split()[0]) > 200.0]
if busy:
    clk = sorted(int(r[1].split()[0]) for r in busy)
    pw = sorted(float(r[2].split()[0]) for r in busy)
    reasons = sorted({r[4].strip() for r in busy})
    print(f"  samples {len(rows)} busy(>200 W) {len(busy)}: sm MHz min/med/max {clk[0]}/{clk[len(clk)//2]}/{clk[-1]}, "
          f"power W med/max {pw[len(pw)//2]:.0f}/{pw[-1]:.0f}, reasons {reasons}")
else:
    print(f"  samples {len(rows)}, none above 200 W")
P
    done
  done 2>&1 | tee "$OUT/clocks.txt"
fi
