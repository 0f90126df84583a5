#!/usr/bin/env bash
# Session 78 (runs ON the device): the e4m3-q FP8 prefill read 0.685-0.692 ms at causal 4 x 4096
# on 4f5d55d's tree (00:58-01:05Z) against 0.610-0.623 in sessions 54-70, while the bf16-q FP8
# kernel read the same as then. A/B of prebuilt d-128 CLIs (built on the development machine for
# sm_90a, stripped, xz'd into the ignored .wt/ab/): `head` (this tree) against `base` (f22d29e,
# session 70's tree), and head with the Q TMA off; alternated rounds over fa3_prefill.json's fp8
# cases. Then the fp8 split mixed forwards (mixed_extend_fp8.json, the three whole forwards with
# bf16 / e4m3 q) with head's capped reserve against the model's uncapped 44.
#   run(carry=[".wt/ab"], command="bash scripts/device/s78_e4m3q_ab.sh")
#   ROUNDS / VARIANTS / MIXED_ROUNDS: the two parts' rounds and the first part's variants.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
for b in head base; do xz -dc ".wt/ab/ak_$b.xz" > "/tmp/ak_$b" && chmod +x "/tmp/ak_$b"; done
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$OUT/ab.txt"
for r in $(seq 1 "${ROUNDS:-2}"); do
  for v in ${VARIANTS:-head:X=1 base:X=1 head:ATTNKIT_FA3_Q_TMA=0}; do
    b=${v%%:*}
    e=${v#*:}
    echo "== round $r $b $e" >> "$OUT/ab.txt"
    env "$e" timeout 60 "/tmp/ak_$b" bench --backend fa3 --device cuda --filter kvfp8 \
      --cases bench/cases/fa3_prefill.json 2>>"$OUT/ab.err" | grep -E "^fa3 " |
      awk '{print $2, $3, $6}' >> "$OUT/ab.txt"
  done
done
for r in $(seq 1 "${MIXED_ROUNDS:-2}"); do
  for v in head:X=1 head:ATTNKIT_PARTITION_RESERVE=44; do
    b=${v%%:*}
    e=${v#*:}
    echo "== mixed round $r $b $e" >> "$OUT/ab.txt"
    env "$e" timeout 60 "/tmp/ak_$b" bench --backend fa3 --device cuda --filter new1- \
      --cases bench/cases/mixed_extend_fp8.json 2>>"$OUT/ab.err" | grep -E "^fa3 " |
      awk '{print $2, $3, $6}' >> "$OUT/ab.txt"
  done
done
cat "$OUT/ab.txt"
