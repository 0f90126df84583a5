#!/usr/bin/env python3
"""Numerics of the seesaw pair (mla_decode_wgmma.cuh, kVariant 3) and of the phantom-skip pair
(kVariant 6 / 7: an odd segment's last tile alone: scale1 = 1, m1 = m0, no P1) against an fp64
softmax, per segment (rows = heads x s_q with the s_q causal limits, several segments of one
request merged by LSE as the combine kernel does). P is rounded to bf16 as the kernel does (A
operand); S, O, l in fp32. Small head dims (the algebra does not depend on them).
Usage: python3 seesaw_numerics.py   (exit status 0 iff every case is within tolerance)
"""
import sys

import numpy as np

NEG = -np.inf


def bf16(x):
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(np.float32)


def exp2(x):
    with np.errstate(invalid="ignore"):
        return np.exp2(x).astype(np.float32)


def segment(q, k, v, t0, t1, limit, scale, skip_phantom, mutation=False):
    """One segment [t0, t1) of 64-key tiles: returns O (normalised), lse2 (log2 domain)."""
    rows, dv = q.shape[0], v.shape[1]
    half = dv // 2
    o = np.zeros((rows, dv), np.float32)
    l0 = np.zeros(rows, np.float32)
    l1 = np.zeros(rows, np.float32)
    m = np.full(rows, NEG, np.float32)
    lim = np.minimum(limit, t1 * 64)

    def s_of(tile):
        keys = tile * 64 + np.arange(64)
        kk = k[keys] if tile < t1 else np.zeros((64, k.shape[1]), np.float32)  # phantom: zeros
        s = (q @ kk.T).astype(np.float32) * scale
        return np.where(keys[None, :] < lim[:, None], s, NEG).astype(np.float32)

    def v_of(tile):
        return v[tile * 64 + np.arange(64)] if tile < t1 else np.zeros((64, dv), np.float32)

    for a in range(t0, t1, 2):
        phantom = a + 1 >= t1
        s0 = s_of(a)
        m0 = np.maximum(m, s0.max(axis=1))
        mu0 = np.where(m0 == NEG, 0, m0).astype(np.float32)
        sc0 = exp2(m - mu0)
        p0 = exp2(s0 - mu0[:, None])
        sum0 = p0.sum(axis=1, dtype=np.float32)
        o[:, :half] = o[:, :half] * sc0[:, None] + bf16(p0) @ v_of(a)[:, :half]
        if phantom and skip_phantom:
            sc1 = np.ones(rows, np.float32)
            m1 = m0
            p1, sum1 = None, np.zeros(rows, np.float32)
        else:
            s1 = s_of(a + 1)
            m1 = np.maximum(m0, s1.max(axis=1))
            mu1 = np.where(m1 == NEG, 0, m1).astype(np.float32)
            sc1 = exp2(m0 - mu1)
            p1 = exp2(s1 - mu1[:, None])
            sum1 = p1.sum(axis=1, dtype=np.float32)
        # consumer 1: O_R = O_R scale0 scale1 + P1 V1R + (P0 scale1) V0R
        if not (mutation and phantom and skip_phantom):  # negative control: O_R not rescaled
            o[:, half:] = o[:, half:] * (sc0 * sc1)[:, None]
        if p1 is not None:
            o[:, half:] += bf16(p1) @ v_of(a + 1)[:, half:]
        o[:, half:] += bf16(p0 * sc1[:, None]) @ v_of(a)[:, half:]
        l1 = l1 * sc0 * sc1 + sum1
        # consumer 0: O_L = O_L scale1 + P1 V1L
        if not (phantom and skip_phantom):
            o[:, :half] = o[:, :half] * sc1[:, None] + bf16(p1) @ v_of(a + 1)[:, :half]
        l0 = (l0 * sc0 + sum0) * sc1
        m = m1
    den = l0 + l1
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(den[:, None] > 0, o / den[:, None], 0)
        lse2 = np.where(den > 0, m + np.log2(den), NEG)
    return out, lse2


def reference(q, k, v, limit, scale):
    s = (q.astype(np.float64) @ k.astype(np.float64).T) * scale
    keys = np.arange(k.shape[0])
    s = np.where(keys[None, :] < limit[:, None], s, -np.inf)
    mx = s.max(axis=1, keepdims=True)
    with np.errstate(invalid="ignore"):
        p = np.exp2(s - mx)
    return (p @ v.astype(np.float64)) / p.sum(axis=1, keepdims=True)


def main():
    rng = np.random.default_rng(7)
    worst = {3: 0.0, 6: 0.0, "6-mutated": 0.0}
    diff36 = 0.0
    cases = 0
    for trial in range(300):
        s_q = int(rng.integers(1, 3))
        heads = 32 if s_q == 2 else 64
        kv_len = int(rng.integers(1, 700))
        d, dv = 24, 16
        q = rng.standard_normal((heads * s_q, d)).astype(np.float32)
        k = rng.standard_normal((kv_len, d)).astype(np.float32)
        v = rng.standard_normal((kv_len, dv)).astype(np.float32)
        scale = np.float32(0.3 * 1.4426950408889634)
        row_i = np.arange(heads * s_q) // heads
        limit = kv_len - (s_q - 1 - row_i)
        tiles = -(-kv_len // 64)
        # random split into segments (as the plan does), merged by LSE
        cuts = sorted(set([0, tiles] + list(rng.integers(0, tiles + 1, int(rng.integers(0, 4))))))
        ref = reference(q, k, v, limit, scale)
        # the producer zero-fills keys >= kv_len of the last tile
        kp = np.zeros((tiles * 64, d), np.float32)
        vp = np.zeros((tiles * 64, dv), np.float32)
        kp[:kv_len], vp[:kv_len] = k, v
        outs = {}
        for variant in (3, 6, "6-mutated"):
            parts = [segment(q, kp, vp, t0, t1, limit, scale, variant != 3, variant == "6-mutated")
                     for t0, t1 in zip(cuts[:-1], cuts[1:]) if t1 > t0]
            lses = np.stack([p[1] for p in parts])
            lmax = lses.max(axis=0)
            w = np.where(lses == NEG, 0, np.exp2(lses - np.where(lmax == NEG, 0, lmax)))
            out = sum(wi[:, None] * p[0] for wi, p in zip(w, parts)) / np.maximum(
                w.sum(axis=0), 1e-30)[:, None]
            valid = limit > 0
            err = np.linalg.norm(out[valid] - ref[valid]) / max(np.linalg.norm(ref[valid]), 1e-30)
            worst[variant] = max(worst[variant], err)
            outs[variant] = out
        diff36 = max(diff36, float(np.abs(outs[3] - outs[6]).max()))
        cases += 1
    print(f"{cases} random cases (kv 1..699, s_q 1 / 2, 1-4 segments per request merged by LSE)")
    for variant, e in worst.items():
        print(f"kVariant {variant}: worst rel_l2 vs fp64 {e:.2e}")
    print(f"max |kVariant 3 - kVariant 6| = {diff36:.2e}")
    ok = worst[3] < 2e-2 and worst[6] < 2e-2 and diff36 < 1e-5 and worst["6-mutated"] > 5e-2
    print("(6-mutated: the phantom pair without O_R *= scale0, must exceed 5e-2)")
    print("RESULT:", "as expected" if ok else "UNEXPECTED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
