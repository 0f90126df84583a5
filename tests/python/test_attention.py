"""Extend and decode through the Python bindings on the CPU backends, checked against an
independent fp64 NumPy oracle over the gathered K/V history (GQA, MQA, sliding window, soft-cap,
page sizes 1 / 3 / 4 / 16, f32 / f16 / bf16 / fp8 KV, f32 / f16 activations)."""

import dataclasses
import zlib

import numpy as np
import pytest

import attnkit as ak
from paged_cache import (NUMPY_DTYPE, UNIT_ROUNDOFF, PagedCache, attention_fp64, bf16_storage,
                         decode_e4m3, make_batch, rel_l2, round_to_storage)

CPU_BACKENDS = [b for b in ("torch_native", "intel_amx") if b in ak.built_backends("cpu")]

# What each backend computes in: torch_native is an fp64 reference; intel_amx feeds bf16 dot
# products (AMX tiles / AVX512-BF16) with f32 accumulation.
COMPUTE_ROUNDOFF = {"torch_native": 0.0, "intel_amx": UNIT_ROUNDOFF["bf16"]}
# Relative L2 error allowed per unit roundoff of the coarsest rounding involved.
ERROR_PER_ROUNDOFF = 4.0
# Tokens per step for three requests: a prefill, an extend over the cached prefix (partial pages,
# a one-token extend), then one decode step.
PREFILL_LENS = [7, 1, 19]
EXTEND_LENS = [5, 3, 1]
DECODE_LENS = [1, 1, 1]
NUM_LAYERS = 2


@dataclasses.dataclass
class Case:
    name: str
    q_heads: int
    kv_heads: int
    head_dim: int
    page_size: int
    kv_dtype: str
    q_dtype: str = "f32"
    window: int = -1
    logit_cap: float = 0.0
    k_scale: float = 1.0
    v_scale: float = 1.0


CASES = [
    Case("mha_page1_f32", 4, 4, 64, 1, "f32"),
    Case("gqa4_page4_f16kv", 8, 2, 64, 4, "f16"),
    Case("mqa_page16_bf16kv_window5", 4, 1, 128, 16, "bf16", window=5),
    Case("gqa4_page3_f16_window7", 8, 2, 64, 3, "f16", q_dtype="f16", window=7),
    Case("gqa2_page4_softcap", 4, 2, 64, 4, "f32", logit_cap=2.0),
    Case("gqa4_page4_fp8kv_scaled", 8, 2, 64, 4, "fp8_e4m3", k_scale=0.5, v_scale=2.0),
]


def skip_reason(backend_name, case):
    """The descriptor's reason a case cannot run, or "" (read from attnkit.matrix())."""
    row = next(r for r in ak.matrix() if r["name"] == backend_name)["mha"]
    if case.kv_dtype.startswith("fp8") and not row["fp8_kv"]:
        return f"{backend_name}: descriptor says no fp8 KV cache"
    return ""


def tolerance(backend, case):
    worst = max(UNIT_ROUNDOFF[case.q_dtype], COMPUTE_ROUNDOFF[backend])
    return ERROR_PER_ROUNDOFF * worst


def check_stored(cache, layer, slots, k, v, case):
    """set_kv wrote into the caller's NumPy buffers (zero-copy), quantised as documented."""
    k_rows = cache.k_store[layer][slots]
    v_rows = cache.v_store[layer][slots]
    if case.kv_dtype in NUMPY_DTYPE:
        np.testing.assert_array_equal(k_rows.astype(np.float64), round_to_storage(k, case.kv_dtype))
        np.testing.assert_array_equal(v_rows.astype(np.float64), round_to_storage(v, case.kv_dtype))
    elif case.kv_dtype == "bf16":
        np.testing.assert_array_equal(k_rows, bf16_storage(k))
        np.testing.assert_array_equal(v_rows, bf16_storage(v))
    else:  # fp8_e4m3: stored = RNE(x / scale)
        for rows, x, scale in ((k_rows, k, case.k_scale), (v_rows, v, case.v_scale)):
            decoded = decode_e4m3(rows) * scale
            exact = x.astype(np.float64)
            bound = UNIT_ROUNDOFF["fp8_e4m3"] * np.abs(exact) + 2.0**-10 * scale
            assert np.all(np.abs(decoded - exact) <= bound)


def run_step(backend, cache, case, rows, new_lens, mode, rng):
    prefix, seq, slots = cache.plan(rows, new_lens)
    batch = make_batch(cache, mode, rows, prefix, seq, slots)
    assert batch.batch_size == len(rows) and batch.num_tokens == sum(new_lens)
    backend.init_forward_metadata(batch)
    tokens = sum(new_lens)
    q_type = NUMPY_DTYPE[case.q_dtype]
    for layer_id in range(NUM_LAYERS):
        layer = ak.AttentionLayer(case.q_heads, case.kv_heads, case.head_dim, layer_id=layer_id,
                                  sliding_window=case.window, logit_cap=case.logit_cap,
                                  k_scale=case.k_scale, v_scale=case.v_scale)
        q = rng.standard_normal((tokens, case.q_heads, case.head_dim)).astype(q_type)
        k = rng.standard_normal((tokens, case.kv_heads, case.head_dim)).astype(q_type)
        v = rng.standard_normal((tokens, case.kv_heads, case.head_dim)).astype(q_type)
        out = np.full((tokens, case.q_heads, case.head_dim), np.nan, dtype=q_type)
        forward = backend.forward_decode if mode == "decode" else backend.forward_extend
        forward(q, k, v, out, layer, batch)
        check_stored(cache, layer_id, slots, k, v, case)
        cache.record(layer_id, rows, new_lens, slots, k, v, case.k_scale, case.v_scale)

        assert np.isfinite(out.astype(np.float64)).all(), "NaN/Inf in the output"
        start = 0
        for r, p, n in zip(rows, prefix, new_lens):
            k_hist, v_hist = cache.history[r][layer_id]
            expected = attention_fp64(q[start:start + n], k_hist, v_hist, int(p), layer.scaling,
                                      case.window, case.logit_cap)
            err = rel_l2(out[start:start + n], expected)
            assert err <= tolerance(backend.name, case), (
                f"{mode} layer {layer_id} request row {r}: relative L2 error {err:.3g} > "
                f"{tolerance(backend.name, case):.3g}")
            start += n
    cache.commit(rows, new_lens)


@pytest.mark.parametrize("backend_name", CPU_BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_extend_then_decode_matches_fp64_oracle(backend_name, case):
    reason = skip_reason(backend_name, case)
    if reason:
        pytest.skip(reason)
    rng = np.random.default_rng(zlib.crc32(f"{backend_name}/{case.name}".encode()))
    cache = PagedCache(num_layers=NUM_LAYERS, num_kv_heads=case.kv_heads,
                       head_dim=case.head_dim, v_head_dim=case.head_dim,
                       page_size=case.page_size, num_pages=64 // case.page_size + 8,
                       kv_dtype=case.kv_dtype, rng=rng)
    backend = ak.create_backend(backend_name, kv_pool=cache.pool,
                                req_to_token_pool=cache.req_to_token,
                                num_q_heads=case.q_heads, q_dtype=case.q_dtype)
    assert backend.name == backend_name
    rows = [cache.new_request() for _ in PREFILL_LENS]
    run_step(backend, cache, case, rows, PREFILL_LENS, "extend", rng)
    run_step(backend, cache, case, rows, EXTEND_LENS, "extend", rng)
    run_step(backend, cache, case, rows, DECODE_LENS, "decode", rng)


@pytest.mark.parametrize("backend_name", CPU_BACKENDS)
def test_decode_reads_kv_from_the_pool_when_k_v_are_none(backend_name):
    """save_kv=False with k/v None: everything comes from the pool written earlier."""
    case = Case("pool_only", 4, 2, 64, 4, "f32")
    rng = np.random.default_rng(7)
    cache = PagedCache(num_layers=1, num_kv_heads=2, head_dim=64, v_head_dim=64, page_size=4,
                       num_pages=16, kv_dtype="f32", rng=rng)
    backend = ak.create_backend(backend_name, kv_pool=cache.pool,
                                req_to_token_pool=cache.req_to_token, num_q_heads=4,
                                q_dtype="f32")
    rows = [cache.new_request(), cache.new_request()]
    lens = [6, 9]
    prefix, seq, slots = cache.plan(rows, lens)
    k = rng.standard_normal((sum(lens), 2, 64)).astype(np.float32)
    v = rng.standard_normal((sum(lens), 2, 64)).astype(np.float32)
    cache.pool.set_kv(0, slots.astype(np.int64), k, v)
    cache.record(0, rows, lens, slots, k, v)
    cache.commit(rows, lens)
    # Decode the last cached token of each request again: seq_lens covers what is in the pool.
    q = rng.standard_normal((2, 4, 64)).astype(np.float32)
    out = np.full((2, 4, 64), np.nan, dtype=np.float32)
    last_slots = np.array([slots[lens[0] - 1], slots[-1]], dtype=np.int64)
    batch = ak.ForwardBatch("decode", np.array(rows, dtype=np.int32),
                            np.array(lens, dtype=np.int32), last_slots, cache.req_to_token,
                            cache.pool)
    backend.init_forward_metadata(batch)
    layer = ak.AttentionLayer(4, 2, 64)
    backend.forward_decode(q, None, None, out, layer, batch, save_kv=False)
    for i, r in enumerate(rows):
        k_hist, v_hist = cache.history[r][0]
        expected = attention_fp64(q[i:i + 1], k_hist, v_hist, lens[i] - 1, layer.scaling)
        assert rel_l2(out[i:i + 1], expected) <= tolerance(backend_name, case)


@pytest.mark.parametrize("backend_name", CPU_BACKENDS)
def test_forward_dispatch_by_mode_and_lse(backend_name):
    """Backend.forward picks extend / decode from the batch mode (enum or string) and fills the
    optional log-sum-exp output."""
    rng = np.random.default_rng(11)
    cache = PagedCache(num_layers=1, num_kv_heads=2, head_dim=64, v_head_dim=64, page_size=4,
                       num_pages=16, kv_dtype="f32", rng=rng)
    backend = ak.create_backend(backend_name, kv_pool=cache.pool,
                                req_to_token_pool=cache.req_to_token, num_q_heads=4,
                                q_dtype="f32")
    layer = ak.AttentionLayer(4, 2, 64)
    rows = [cache.new_request(), cache.new_request()]
    tol = tolerance(backend_name, Case("lse", 4, 2, 64, 4, "f32"))
    for mode, lens in ((ak.ForwardMode.EXTEND, [5, 11]), ("decode", [1, 1])):
        prefix, seq, slots = cache.plan(rows, lens)
        batch = make_batch(cache, mode, rows, prefix, seq, slots)
        assert batch.mode == (ak.ForwardMode.DECODE if mode == "decode" else mode)
        tokens = sum(lens)
        q = rng.standard_normal((tokens, 4, 64)).astype(np.float32)
        k = rng.standard_normal((tokens, 2, 64)).astype(np.float32)
        v = rng.standard_normal((tokens, 2, 64)).astype(np.float32)
        out = np.full((tokens, 4, 64), np.nan, dtype=np.float32)
        lse = np.full((tokens, 4), np.nan, dtype=np.float32)
        backend.init_forward_metadata(batch)
        backend.forward(q, k, v, out, layer, batch, lse=lse)
        cache.record(0, rows, lens, slots, k, v)
        start = 0
        for r, p, n in zip(rows, prefix, lens):
            k_hist, v_hist = cache.history[r][0]
            expected = attention_fp64(q[start:start + n], k_hist, v_hist, int(p), layer.scaling)
            assert rel_l2(out[start:start + n], expected) <= tol
            for i in range(n):
                for h in range(4):
                    logits = layer.scaling * (k_hist[:p + i + 1, h // 2] @ q[start + i, h])
                    expected_lse = np.log(np.exp(logits - logits.max()).sum()) + logits.max()
                    assert abs(lse[start + i, h] - expected_lse) <= tol * max(1, abs(expected_lse))
            start += n
        cache.commit(rows, lens)
