"""Model of what the balanced decode plan (src/backends/flashinfer/kernels/balanced_plan.h) can buy
on the H200 (132 SMs), from figures measured in earlier sessions (docs/perf/fidecode_notes.md).
Session 10 (fidec), no GPU: this is arithmetic on recorded measurements, not a measurement.

    python3 docs/perf/fidecode_s10/balance_model.py             # the model
    python3 docs/perf/fidecode_s10/balance_model.py --ab OUT     # + the next device run
                                                                 #   (OUT: its folder or all.tgz):
                                                                 #   the SM-count scan and the
                                                                 #   balanced plan's A/B

Question: the uniform targets (b16 kv 4k: 128 equal (request, kv head) items; b1 kv 32k: 16
splits x 8 heads = 128 CTAs) run 128 CTAs on 132 SMs, one per SM. Equal chunks on all 132 SMs
help only if the streaming rate still grows with the number of streaming SMs at 128 (elasticity
e = d ln R / d ln n > 0). Gain = stream time x (1 - (128 / 132) ** e).
"""
import argparse
import glob
import io
import json
import math
import os
import random
import tarfile

MB = 1e6
KEY_BYTES = 2 * 128 * 2  # K + V row of one kv head, d 128, bf16

# --- measurements (H200, b2b = --launches 10; docs/perf/fidecode_notes.md) ---
# Session 9 run 1 (09:57Z): b16 kv4k p16 bf16 70.3 us, fp8 39.8 us -> marginal B 4.4 TB/s, F 9.3.
B16_BF16, B16_FP8 = 70.3, 39.8
# Session 7 (b2b): b1 kv16k 28.0 us, kv32k 44.7 us (both 128 CTAs: 16 splits of 1024 / 2048).
B1_16K, B1_32K = 28.0, 44.7
# Session 7 SPLIT_CTAS scan, b1 kv32k b2b: CTAs (= streaming SMs) -> us.
SPLIT_SCAN = {64: 54.1, 96: 47.9, 128: 44.7}
# Session 5: one CTA of 8 warps per SM (DECODE_CTA=8x1: twice the warps and bytes in flight per SM)
# and one 4-warp CTA with twice the ring depth (4x1): b16 bf16 within 1% of the default, b1 kv32k
# (session 7) 44.2 vs 44.0-44.4 us.
DOUBLED_PER_SM_CHANGE = 0.01


def bytes_of(keys_heads):
    return keys_heads * KEY_BYTES


def fits():
    w16 = bytes_of(16 * 4096 * 8)  # 268 MB
    b_marg = (w16 - w16 / 2) / (B16_BF16 - B16_FP8) / 1e6  # TB/s (fp8 halves the bytes)
    f16 = B16_BF16 - w16 / (b_marg * 1e6)
    w1 = bytes_of(32768 * 8)
    b1_marg = (w1 / 2) / (B1_32K - B1_16K) / 1e6
    f1 = B1_32K - w1 / (b1_marg * 1e6)
    print(f"b16 kv4k: {w16 / MB:.0f} MB; marginal rate {b_marg:.2f} TB/s, fixed F {f16:.1f} us")
    print(f"b1 kv32k: {w1 / MB:.0f} MB; marginal rate {b1_marg:.2f} TB/s, fixed F {f1:.1f} us")
    # Rate against streaming SMs from the split scan (F of the 128-CTA plan for all three; fewer
    # splits merge less, so this overstates the slope, i.e. e is an upper estimate).
    rates = {n: w1 / ((t - f1) * 1e6) for n, t in SPLIT_SCAN.items()}
    print("b1 kv32k split scan: " + ", ".join(f"{n} SMs {r:.2f} TB/s" for n, r in rates.items()))
    # 1 / R = a + b / n (a per-SM latency term b, a shared term a), least squares on 3 points.
    xs = [1 / n for n in rates]
    ys = [1 / r for r in rates.values()]
    mx, my = sum(xs) / 3, sum(ys) / 3
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    a = my - b * mx
    e_fit = (b / 128) / (a + b / 128)
    print(f"  fit 1/R = {a:.4f} + {b:.3f} / n: elasticity at 128 SMs e = {e_fit:.2f}")
    # The same fit predicts what doubling the per-SM term's throughput (8x1) would have bought:
    r_double = 1 / (a + b / 2 / 128)
    r_now = 1 / (a + b / 128)
    print(f"  ... and predicts +{100 * (r_double / r_now - 1):.0f}% stream rate for twice the warps"
          f" / bytes in flight per SM, where session 5/7 measured < {100 * DOUBLED_PER_SM_CHANGE:.0f}%:"
          " the per-SM term is not what the scan measured (its slope is the split count's fixed"
          " cost or GPC-level limits); e = 0 is as consistent with the 8x1 / 4x1 A/Bs")
    return dict(w16=w16, f16=f16, w1=w1, f1=f1, e_fit=e_fit, b=b_marg)


def gain(stream_us, e, n_from=128, n_to=132):
    return stream_us * (1 - (n_from / n_to) ** e)


def targets(m):
    print("\n== uniform targets: 128 -> 132 streaming SMs ==")
    for name, t, f in (("b16 kv4k p16", B16_BF16, m["f16"]), ("b1 kv32k", B1_32K, m["f1"])):
        s = t - f
        for e in (0.0, 0.1, m["e_fit"]):
            g = gain(s, e)
            print(f"{name}: stream {s:.1f} us, e {e:.2f}: -{g:.2f} us ({100 * g / t:.2f}%)")
    # What the balanced plan adds at b16: all 128 items cut (256 segments, 256 partials): one
    # segment restart per CTA (the next segment's plan words -> page-table row -> slot words ->
    # first K/V: ~3 dependent memory round trips of ~0.6-0.8 us loaded, partly hidden by the other
    # CTAs' streaming) and one fused 2-way merge per item in the tail (counter atomic + partial
    # reads from L2: ~1 us on the critical path once). b1: 136 segments vs 128, 7 restarts.
    print("costs at b16: 1 restart per CTA (~1-2 us if not prefetched) + the merge tail (~1 us)")
    print("-> uniform targets: < 1% at best (b16 likely negative); the split of b1 already fills"
          " 128 SMs, the balanced plan would only add the last 4")


def today_plan(lens, heads=8, target=132, tile=64, min_chunk=256):
    """Python port of build_work_plan's decode split (work_plan.cpp): CTAs' key counts."""
    per_head = target // heads
    mx = max(lens)
    chunk = 0
    if len(lens) < per_head and mx > min_chunk:
        lo, hi = min_chunk // tile, -(-mx // tile)
        while lo < hi:
            mid = (lo + hi) // 2
            if sum(max(1, -(-n // (mid * tile))) for n in lens) <= per_head:
                hi = mid
            else:
                lo = mid + 1
        if lo * tile < mx:
            chunk = lo * tile
    ctas = []
    for n in lens:
        if chunk:
            ctas += [min(chunk, n - s * chunk) for s in range(max(1, -(-n // chunk)))]
        else:
            ctas.append(n)
    return [k for k in ctas for _ in range(heads)]


def fluid(cta_keys, r_max, b_total, slots=132):
    """Time to stream the CTAs' bytes when DRAM (b_total) is shared fairly among active CTAs, each
    capped at r_max (one CTA per SM; grids above `slots` start CTAs as others finish)."""
    rem = [bytes_of(k) for k in cta_keys]
    pending = list(range(len(rem)))
    active = [pending.pop(0) for _ in range(min(slots, len(pending)))]
    t = 0.0
    while active:
        rate = min(r_max, b_total / len(active))
        dt = min(rem[i] for i in active) / rate
        t += dt
        for i in active:
            rem[i] -= rate * dt
        done = [i for i in active if rem[i] <= 1e-3]
        active = [i for i in active if rem[i] > 1e-3]
        while done and pending:
            done.pop()
            active.append(pending.pop(0))
    return t * 1e6


def uneven(m):
    print("\n== uneven batches (8 kv heads): today's plan vs equal chunks on 132 SMs ==")
    # r_max: one CTA streaming alone on its SM (b1 kv32k split into 64 CTAs of 4096 keys, 54.1 us:
    # 2.1 MB per CTA in 54.1 - F).
    # A CTA streaming alone could do more (64 KB in flight at an unloaded ~0.8 us: ~80 GB/s), so
    # both are shown; today's grids above 132 CTAs run 2 per SM (264 resident).
    r_fit = bytes_of(4096) / ((SPLIT_SCAN[64] - m["f1"]) * 1e-6)
    b_total = m["b"] * 1e12
    print(f"fluid model: DRAM {b_total / 1e12:.2f} TB/s shared fairly, <= r_max per CTA (today:"
          f" {r_fit / 1e9:.0f} GB/s from the 64-CTA scan / 80 GB/s), F {m['f16']:.1f} us"
          " (+1.5 us restart / merge for the balanced plan)")
    rng = random.Random(10)
    cases = [("b16 uniform 4096", [4096] * 16),
             ("b16: 32768 + 15 x 1024", [32768] + [1024] * 15),
             ("b15: 32768 + 14 x 1024", [32768] + [1024] * 14),
             ("b32: 16384 + 31 x 2048", [16384] + [2048] * 31)]
    for bs, lo, hi in ((16, 512, 8192), (32, 256, 8192), (64, 256, 8192)):
        cases += [(f"b{bs} U[{lo},{hi}] #{k}", [rng.randint(lo, hi) for _ in range(bs)])
                  for k in range(2)]
    for name, lens in cases:
        ctas = today_plan(lens)
        slots = 264 if len(ctas) > 132 else 132
        t_today = [m["f16"] + fluid(ctas, r, b_total, slots) for r in (r_fit, 80e9)]
        total = sum(lens) * 8
        t_bal = m["f16"] + 1.5 + fluid([total / 132] * 132, r_fit, b_total)
        print(f"{name:26s} today {t_today[0]:6.1f} / {t_today[1]:6.1f} us   balanced {t_bal:6.1f} us"
              f"   x{t_today[0] / t_bal:.2f} / x{t_today[1] / t_bal:.2f}")


def read_ab(path):
    """(mode, variant, case) -> [us] from fidecode_s8.sh's ab_*.json (folder or all.tgz)."""
    files = []
    if os.path.isdir(path) and glob.glob(os.path.join(path, "ab_*.json")):
        files = [(os.path.basename(p), open(p).read()) for p in glob.glob(os.path.join(path, "ab_*.json"))]
    else:
        tgz = path if path.endswith(".tgz") else os.path.join(path, "all.tgz")
        with tarfile.open(tgz) as tf:
            for mem in tf.getmembers():
                if os.path.basename(mem.name).startswith("ab_") and mem.name.endswith(".json"):
                    files.append((os.path.basename(mem.name), tf.extractfile(mem).read().decode()))
    out = {}
    for name, text in files:
        _, _, mode, var = name[:-5].split("_", 3)
        for r in json.load(io.StringIO(text))["results"]:
            case = r["case"].replace("decode_", "").replace("_h32x8_d128", "")
            out.setdefault((mode, var, case), []).append(r["ms_median"] * 1e3)
    return out


def plain(var):
    """Variants that run today's plan: default and ATTNKIT_FLASHINFER_SPLIT_CTAS=n."""
    return var == "default" or "SPLIT_CTAS" in var


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else 0.5 * (xs[len(xs) // 2 - 1] + xs[len(xs) // 2])


def balance_ab(ab):
    print("\n== balanced plan A/B: median us over the rounds (default / DECODE_BALANCE=1) ==")
    for mode in sorted({k[0] for k in ab}):
        for case in sorted({k[2] for k in ab if k[0] == mode}):
            d = ab.get((mode, "default", case))
            b = next((v for (md, var, c), v in ab.items()
                      if md == mode and c == case and "DECODE_BALANCE" in var), None)
            if d and b:
                print(f"{mode:8s} {case:28s} {median(d):7.1f} / {median(b):7.1f} us"
                      f"  balanced x{median(d) / median(b):.3f}")


def scan(path, m):
    ab = read_ab(path)
    balance_ab(ab)
    print(f"\n== SM-count scan of {path} ==")
    for mode in sorted({k[0] for k in ab}):
        # bs scan at kv 4k p16 (unsplit: bs x 8 CTAs of 4096 keys on as many SMs), the plain
        # variants (SPLIT_CTAS does not change unsplit plans).
        pts = {}
        for (md, var, case), us in ab.items():
            if md == mode and plain(var) and case.endswith("kv4096_p16_kvbf16"):
                bs = int(case.split("_")[0][1:])
                pts.setdefault(bs, []).extend(us)
        pts = {bs: median(v) for bs, v in sorted(pts.items()) if bs <= 16}
        print(f"{mode}: kv4k p16 median us by bs: " + ", ".join(f"b{b} {t:.1f}" for b, t in pts.items()))
        if 16 in pts:
            for f in (m["f16"] - 3, m["f16"]):
                for bs, t in pts.items():
                    if bs == 16 or t <= f:
                        continue
                    # t - F = n W / R(n), R ~ n^e  ->  (t16 - F) / (t - F) = (16 / bs)^(1 - e)
                    e = 1 - math.log((pts[16] - f) / (t - f)) / math.log(16 / bs)
                    g = gain(pts[16] - f, e)
                    print(f"  F {f:.1f}: b{bs} vs b16 -> e {e:.2f}, 128 -> 132 SMs buys"
                          f" {g:.2f} us ({100 * g / pts[16]:.1f}%) at b16")
        b1 = {}
        for (md, var, case), us in ab.items():
            if md == mode and plain(var) and case.startswith("b1_kv32768"):
                n = 128 if var == "default" else int(var.rsplit("_", 1)[1])  # ..._SPLIT_CTAS_112
                b1[n] = median(us)
        if b1:
            print(f"{mode}: b1 kv32k median us by CTAs (SPLIT_CTAS): " +
                  ", ".join(f"{n} {t:.1f}" for n, t in sorted(b1.items())))
            if 128 in b1:
                for n, t in sorted(b1.items()):
                    if n < 128 and t > m["f1"]:
                        # same bytes on n SMs: (t_n - F) / (t_128 - F) = (128 / n)^e
                        e = math.log((t - m["f1"]) / (b1[128] - m["f1"])) / math.log(128 / n)
                        print(f"  {n} vs 128 CTAs -> e {e:.2f}, 132 SMs buy"
                              f" {gain(b1[128] - m['f1'], e):.2f} us at b1")
    print("reading: e > ~0.35 would mean 132 SMs can buy > 1% at b16 (the model expects ~0); the"
          " balanced plan's own A/B above includes its restart / merge costs")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ab", help="out folder or all.tgz of the scan run (scripts/device/fidecode_s8.sh)")
    args = ap.parse_args()
    m = fits()
    targets(m)
    uneven(m)
    if args.ab:
        scan(args.ab, m)


if __name__ == "__main__":
    main()
