#!/usr/bin/env bash
# Nsight Compute profiles of chosen kernels of `attnkit bench` cases, on the device machine (from
# the repository root, .deps carried; ncu needs the Firecracker runtime, H200.md / KINDS.md):
#   run(carry=[".deps"], command="bash scripts/device/ncu_profile.sh")
# For each entry of PROFILES ("label|backend|case file|case filter|kernel regex"), ncu profiles the
# first launch of the kernel after 2 skipped ones (--set full, source counters, clocks left alone)
# and writes the details page (text) and the per-SASS-instruction source page (CSV: stall samples
# per instruction, -lineinfo is on in src/CMakeLists.txt) next to the report. Everything is packed
# into $OUT/ncu_profiles.tar.gz (the device returns only a few files).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. scripts/device/lib.sh
OUT="${OUT:-$root/out}"
W="${WORK:-/tmp/ncu_profiles}"
B="${BUILD_DIR:-build/device}"
rm -rf "$W"
mkdir -p "$W" "$OUT"
PROFILES="${PROFILES:-\
fi_b1_kv32k|flashinfer|scripts/device/decode_targets.json|decode_b1_kv32768_p16_h32x8_d128_kvbf16|paged_decode_ring_kernel
fi_b16_p1|flashinfer|scripts/device/decode_targets.json|decode_b16_kv4096_p1_h32x8_d128_kvbf16|paged_decode_ring_kernel
fi_b16_fp8|flashinfer|scripts/device/decode_targets.json|decode_b16_kv4096_p16_h32x8_d128_kvfp8_e4m3|paged_decode_ring_kernel
fa3_d128_causal|fa3|bench/cases/fa3_prefill.json|extend_b2_pre0_new8192_p16_h32x8_d128_kvbf16|prefill_sm90_kernel
fa3_d64_causal|fa3|bench/cases/fa3_prefill.json|extend_b2_pre0_new8192_p16_h32x8_d64_kvbf16|prefill_sm90_kernel
mla_16h|flashmla|scripts/device/mla_decode_16h.json|mla_decode_b128_kv4096_p64_h16_d576v512_kvbf16|mla_decode_kernel}"
t0=$(date +%s)
{ attnkit_configure "$B" 90a-real && ninja -C "$B" attnkit_cli; } > "$W/build.log" 2>&1
echo "build rc=$? in $(($(date +%s) - t0)) s" | tee "$W/summary.txt"
C="$B/tools/attnkit/attnkit"
NCU="$(attnkit_ncu_bin)"
echo "ncu: $NCU" >> "$W/summary.txt"
while IFS='|' read -r label backend cases filter kernel; do
  [ -n "$label" ] || continue
  t=$(date +%s)
  timeout "${PROFILE_TIMEOUT:-120}" "$NCU" --clock-control none --set full --import-source yes \
    -k "regex:$kernel" -s 2 -c 1 -f -o "$W/$label" \
    "$C" bench --backend "$backend" --cases "$cases" --filter "$filter" --device cuda \
    --warmup 2 --iters 1 > "$W/$label.log" 2>&1
  rc=$?
  if [ -f "$W/$label.ncu-rep" ]; then
    "$NCU" --import "$W/$label.ncu-rep" --page details > "$W/$label.details.txt" 2>&1
    "$NCU" --import "$W/$label.ncu-rep" --page source --csv --print-source sass \
      > "$W/$label.sass.csv" 2>&1
  fi
  echo "$label: rc=$rc in $(($(date +%s) - t)) s" | tee -a "$W/summary.txt"
  grep -E "^\s+(Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per Thread|Issue Slots Busy|Executed Ipc Active)\s" \
    "$W/$label.details.txt" 2>/dev/null | head -12 | tee -a "$W/summary.txt"
done <<< "$PROFILES"
tar -czf "$OUT/ncu_profiles.tar.gz" -C "$W" .
