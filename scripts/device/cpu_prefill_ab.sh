#!/usr/bin/env bash
# Alternated A/B of intel_amx prefill knobs on the device machine's Xeon host (repository root,
# carry .deps): builds the CPU CLI, then ROUNDS rounds of every VARIANT ("label=ENV=V,ENV=V";
# label= for none) at each of THREADS, `attnkit bench --backend intel_amx --cases
# bench/cases/cpu_prefill.json --filter new2048` (pinned, spread over cores), one line per run:
# ms, TFLOP/s and the run's % of its median AMX pass, into $OUT/cpu_prefill_ab.txt.
#   run(carry=[".deps"], command="bash scripts/device/cpu_prefill_ab.sh")
#   VARIANTS="base= masked=ATTNKIT_AMX_MASKED_ROWS=1" THREADS="2 all" ROUNDS=4 ITERS=15
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
OUT=${OUT:-$root/out}
mkdir -p "$OUT"
. scripts/device/lib.sh
build=build/cpu-device
attnkit_configure_cpu "$build" > "$OUT/cpu_build.log" 2>&1 &&
  timeout 150 ninja -C "$build" -j16 attnkit_cli >> "$OUT/cpu_build.log" 2>&1
echo "cpu build rc $?"
export OMP_PROC_BIND=spread OMP_PLACES=cores
log="$OUT/cpu_prefill_ab.txt"
for r in $(seq 1 "${ROUNDS:-4}"); do
  for t in ${THREADS:-2 all}; do
    for v in ${VARIANTS:-base= masked=ATTNKIT_AMX_MASKED_ROWS=1}; do
      label=${v%%=*}
      envs=${v#*=}
      (
        [ "$t" = all ] || export OMP_NUM_THREADS=$t
        IFS=, ; for e in $envs; do [ -n "$e" ] && export "$e"; done; unset IFS
        line=$(timeout 60 "$build/tools/attnkit/attnkit" bench --device cpu --backend intel_amx \
          --cases bench/cases/cpu_prefill.json --filter new2048 --rotate-mib 64 \
          --iters "${ITERS:-15}" 2>/dev/null | grep -E "^intel_amx " | sed -E 's/ +/ /g')
        echo "round $r threads $t $label $line" | tee -a "$log"
      )
    done
  done
done
