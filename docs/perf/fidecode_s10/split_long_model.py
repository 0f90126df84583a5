"""The split-long rule (work_plan.h, ATTNKIT_FLASHINFER_SPLIT_LONG=1) in balance_model.py's fluid
model, against today's plan and the balanced plan, on the batches of scripts/device/decode_s10.json.
Session 10, second wave (engineer fisplit), no GPU: arithmetic on recorded measurements (the fits
of balance_model.py), not a measurement.

    python3 docs/perf/fidecode_s10/split_long_model.py            # the model
    python3 docs/perf/fidecode_s10/split_long_model.py --ab OUT   # + the next device run's A/B
                                                                  #   (fidecode_s8.sh's folder or
                                                                  #   all.tgz): default /
                                                                  #   SPLIT_LONG=1 / BALANCE=1

Model (balance_model.py): DRAM at the marginal rate of b16 kv4k (4.40 TB/s) shared fairly among
the streaming CTAs, each capped at r_max (49 GB/s from the 64-CTA split scan, or 80 GB/s), grids
of more than 132 CTAs run 2 per SM (264 resident; the cap per CTA is kept, so 2 CTAs on one SM may
stream at 2 r_max: optimistic for split-long and today's big grids alike), CTAs start in grid order
(item-major, kv heads fastest), fixed cost F 9.3 us per forward. The balanced plan pays +1.5 us
(restart + 2-way merges, balance_model.py); split-long pays +1.0 us when it cut a request (the
fused merge of the cut request's last CTA in the tail: today's b1 split pays the same and its
measured 42.6 us includes it).
"""
import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import balance_model as bm  # noqa: E402

HEADS, SLOTS, TILE, MIN_CHUNK = 8, 132, 64, 256
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def cdiv(a, b):
    return -(-a // b)


def today_chunk(lens, heads=HEADS, target=SLOTS):
    """build_work_plan's uniform decode chunk (0 = no split), q_tiles 1 (group <= 16)."""
    per_head = target // heads
    mx = max(lens)
    if len(lens) < per_head and mx > MIN_CHUNK:
        lo, hi = MIN_CHUNK // TILE, cdiv(mx, TILE)
        while lo < hi:
            mid = (lo + hi) // 2
            if sum(max(1, cdiv(n, mid * TILE)) for n in lens) <= per_head:
                hi = mid
            else:
                lo = mid + 1
        if lo * TILE < mx:
            return lo * TILE
    return 0


def split_long_chunks(lens, pct=150, heads=HEADS, target=SLOTS):
    """Port of work_plan.cpp with split_long: per-request chunk (0 = whole), or None if today's
    plan is kept."""
    chunk = today_chunk(lens, heads, target)
    work = sum(lens)
    mx = max(lens)
    longest = min(chunk, mx) if chunk else mx

    def much_longer(n):
        return n * target * 100 > pct * work * heads

    if work == 0 or longest <= MIN_CHUNK or not much_longer(longest):
        return None
    share = max(1, cdiv(work * heads, target))
    out = []
    for n in lens:
        c = 0
        if much_longer(n):
            k = cdiv(n, share)
            c = max(MIN_CHUNK, cdiv(cdiv(n, k), TILE) * TILE)
            if c >= n:
                c = 0
        out.append(c)
    return out


def ctas_of(lens, chunks):
    """CTA key counts in grid order (item-major, kv heads fastest)."""
    ctas = []
    for n, c in zip(lens, chunks):
        parts = [min(c, n - s * c) for s in range(cdiv(n, c))] if c else [n]
        for p in parts:
            ctas += [p] * HEADS
    return ctas


def plans(lens, pct=150):
    today = bm.today_plan(lens)
    sl = split_long_chunks(lens, pct)
    split_long = ctas_of(lens, sl) if sl is not None else today
    return today, split_long, sl is not None and any(sl)


def run_plan(ctas, r_max, b_total, f):
    slots = 264 if len(ctas) > SLOTS else SLOTS
    return f + bm.fluid(ctas, r_max, b_total, slots)


def batches():
    cases = [("b16 uniform 4096", [4096] * 16), ("b1 32768", [32768])]
    path = os.path.join(ROOT, "scripts", "device", "decode_s10.json")
    names = {16: "b16 {}", 32: "b32 {}"}
    for c in json.load(open(path))["cases"]:
        lens = c.get("kv_lens")
        if not lens:
            continue
        if len(set(lens)) == 2 and max(lens) == 32768:
            name = f"b{len(lens)}: 32768 + {len(lens) - 1} x {min(lens)}"
        else:
            name = names.get(len(lens), "b{} {}").format(
                *( [len(lens)] if len(lens) not in names else [] ),
                f"U[{min(lens)}..{max(lens)}] (decode_s10.json)")
        cases.append((name, lens))
    rng = random.Random(10)
    cases += [("b15: 32768 + 14 x 1024", [32768] + [1024] * 14),
              ("b32: 16384 + 31 x 2048", [16384] + [2048] * 31),
              ("b16 8192 + 15 x 4096", [8192] + [4096] * 15),
              ("b64: 4 x 32768 + 60 x 2048", [32768] * 4 + [2048] * 60)]
    cases += [(f"b64 U[256,8192] #{k}", [rng.randint(256, 8192) for _ in range(64)]) for k in range(2)]
    return cases


def ab_table(path, model):
    """Median us per (mode, case): default / split-long / balanced, with the model's figures
    (r_max fit) for the uneven cases (matched by the bench name's _sum<total keys>)."""
    ab = bm.read_ab(path)
    print("\n== A/B: median us over the rounds (default / SPLIT_LONG=1 / DECODE_BALANCE=1) ==")
    for mode in sorted({k[0] for k in ab}):
        for case in sorted({k[2] for k in ab if k[0] == mode}):
            def pick(tag):
                v = [us for (md, var, c), us in ab.items() if md == mode and c == case and
                     (var == "default" if tag is None else tag in var)]
                return bm.median(v[0]) if v else float("nan")
            d, sl, bal = pick(None), pick("SPLIT_LONG"), pick("DECODE_BALANCE")
            pred = next((p for tot, p in model.items() if f"_sum{tot}_" in case), None)
            extra = (f"   model {pred[0]:.1f} / {pred[1]:.1f} / {pred[2]:.1f}" if pred else "")
            print(f"{mode:8s} {case:44s} {d:7.1f} / {sl:7.1f} / {bal:7.1f} us"
                  f"  split-long x{d / sl:.3f}{extra}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ab", help="out folder or all.tgz of fidecode_s8.sh")
    args = ap.parse_args()
    m = bm.fits()
    r_fit = bm.bytes_of(4096) / ((bm.SPLIT_SCAN[64] - m["f1"]) * 1e-6)
    b_total = m["b"] * 1e12
    f = m["f16"]
    print(f"\n== split-long (pct 150) vs today vs balanced; r_max {r_fit / 1e9:.0f} / 80 GB/s,"
          f" DRAM {b_total / 1e12:.2f} TB/s, F {f:.1f} us ==")
    hdr = ("batch", "today", "split-long", "balanced", "today/SL", "SL/bal", "CTAs today/SL",
           "longest CTA today/SL/share")
    print(" | ".join(hdr))
    model = {}
    for name, lens in batches():
        today, sl, cut = plans(lens)
        t = [run_plan(today, r, b_total, f) for r in (r_fit, 80e9)]
        s = [run_plan(sl, r, b_total, f) + (1.0 if cut else 0.0) for r in (r_fit, 80e9)]
        total = sum(lens) * HEADS
        bal = f + 1.5 + bm.fluid([total / SLOTS] * SLOTS, r_fit, b_total)
        share = total / SLOTS
        model[sum(lens)] = (t[0], s[0], bal)
        print(f"{name} | {t[0]:.1f} / {t[1]:.1f} | {s[0]:.1f} / {s[1]:.1f} | {bal:.1f} |"
              f" {t[0] / s[0]:.2f}x / {t[1] / s[1]:.2f}x | {s[0] / bal:.2f} / {s[1] / bal:.2f} |"
              f" {len(today)} / {len(sl)} | {max(today)} / {max(sl)} / {share:.0f}")
    print("\n== threshold (split_long_pct) on the uneven batches, r_max fit: us ==")
    for name, lens in batches()[2:]:
        row = []
        for pct in (110, 150, 200, 300):
            _, sl, cut = plans(lens, pct)
            row.append(f"{pct}%: {run_plan(sl, r_fit, b_total, f) + (1.0 if cut else 0.0):.1f}")
        print(f"{name:36s} " + "  ".join(row))
    if args.ab:
        ab_table(args.ab, model)


if __name__ == "__main__":
    main()
