#!/usr/bin/env python3
"""Checks every GPU attention backend built into the attnkit Python package against
torch.nn.functional.scaled_dot_product_attention on K/V gathered from the paged cache.

Everything goes through the Python bindings the way an engine would use them: the paged KV cache
is a list of caller-owned torch CUDA tensors wrapped zero-copy (MHAKVPool.wrap), the request
table and page allocator come from attnkit, the work runs on torch's current stream, and each
case runs a prefill (extend), an extend over the cached prefix and a decode step, every layer
compared with SDPA over the gathered (dequantised) keys and values. Covered: MHA, GQA, MQA, page
sizes 1 / 16 / 64, a sliding window, fp8_e4m3 KV with layer scales, head dims 64 / 128 / 256, f16
activations, long sequences (split-KV decode) and, for backends whose descriptor says so,
CUDA-graph capture + replay of a decode step (bit-identical to eager, and right).
MLA backends (DeepSeek-style absorbed attention: q [T, H, 576] against one shared latent row of
576 = 512 + 64 per token, V = its first 512 columns) run the MLA cases on an MLAKVPool wrapped over
torch tensors: pages 1 / 64 / 128, 16 and 128 heads, bf16 and fp8_e4m3 latent caches.

Semantics of the reference (those of the library's torch_native oracle): every key, the new
tokens' included, is read back from the pool after the forward stored it, so fp8 caches are
compared against the dequantised stored values. Query i of request r sits at position prefix_r +
i; key j is visible when j <= q_pos and (window < 0 or q_pos - j <= window).

Tolerances are those of the C++ case harness: relative L2 <= 1e-2 for bf16 outputs (3e-3 f16),
max-abs <= 4 * tol * max(1, max |reference|), no NaN/Inf (outputs and unused cache rows start
as NaN, so a stray read shows).

Usage (device machine):  python scripts/device/python_gpu_check.py [--backends triton,...]
Exit status 0 when every case that ran passed. The last line reads "N passed, N failed, N skipped".
"""

import argparse
import dataclasses
import math
import os
import sys
import traceback

import torch
import torch.nn.functional as F

import attnkit as ak

DEVICE = "cuda"
# Relative L2 tolerance per output dtype (src/harness/case_runner.cpp tolerance_for) and the
# max-abs factor on top of it.
REL_L2_TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 3e-3}
MAX_ABS_FACTOR = 4.0
# fa3's FP8 prefill kernel (SM90, fp8_e4m3 KV with bf16 q at d 128) computes with e4m3 Q and P:
# its error is that of fp8 arithmetic (rel L2 about 3-4%), held to the tolerance
# tests/gpu/test_fa3_cases.cpp uses for it (the e4m3 round-trip figure). ATTNKIT_FA3_FP8=0 = exact.
FP8_COMPUTE_REL_L2 = 0.07
# fp8 e4m3: unit roundoff 2^-4, smallest subnormal step 2^-9 (half of it is the absolute bound).
E4M3_UNIT_ROUNDOFF = 2.0**-4
E4M3_HALF_SUBNORMAL = 2.0**-10
E4M3_NAN_CODE = 0x7F
TORCH_DTYPE = {"bf16": torch.bfloat16, "f16": torch.float16}
NUM_LAYERS = 2
MAX_CONTEXT = 2048


@dataclasses.dataclass
class Case:
    name: str
    q_heads: int
    kv_heads: int
    head_dim: int
    page_size: int
    kv_dtype: str = "bf16"  # bf16 / f16 (the activation dtype) or fp8_e4m3
    q_dtype: str = "bf16"
    window: int = -1
    k_scale: float = 1.0
    v_scale: float = 1.0
    prefill: tuple = (37, 1, 100, 64)
    extend: tuple = (5, 17, 1, 3)


CASES = [
    Case("mha_page1", 8, 8, 128, 1),
    Case("gqa4_page16", 32, 8, 128, 16),
    Case("gqa8_page64_window63", 16, 2, 64, 64, window=63),
    Case("mqa_page16_d256", 8, 1, 256, 16),
    Case("gqa4_page16_f16", 32, 8, 128, 16, kv_dtype="f16", q_dtype="f16"),
    Case("gqa4_page16_fp8", 32, 8, 128, 16, kv_dtype="fp8_e4m3", k_scale=0.25, v_scale=0.5),
    Case("gqa4_page64_fp8_window31", 16, 4, 128, 64, kv_dtype="fp8_e4m3", window=31,
         k_scale=0.5, v_scale=2.0),
    Case("gqa4_page16_long_split_kv", 32, 8, 128, 16, prefill=(1013, 1, 1900), extend=(3, 1, 1)),
]


class Results:
    def __init__(self):
        self.passed = self.failed = self.skipped = 0

    def report(self, status, label, detail=""):
        print(f"{status:4} {label}{': ' + detail if detail else ''}", flush=True)
        if status == "PASS":
            self.passed += 1
        elif status == "FAIL":
            self.failed += 1
        else:
            self.skipped += 1


def skip_reason(descriptor, case):
    """Why the descriptor says this backend cannot run the case ("" = it can): the MHA row for a
    Case, the MLA row for an MLACase."""
    is_mla = isinstance(case, MLACase)
    row = descriptor["mla" if is_mla else "mha"]
    if row is None:
        return "no MLA support" if is_mla else "no MHA support"
    sizes = row["native_page_sizes"]
    if isinstance(sizes, list) and case.page_size not in sizes:
        return f"page_size {case.page_size} not in {sizes}"
    if case.kv_dtype.startswith("fp8") and not row["fp8_kv"]:
        return "no fp8 KV cache"
    if is_mla:
        return ""
    if case.window >= 0 and not row["sliding_window"]:
        return "no sliding window"
    if row["head_dims"] and case.head_dim not in row["head_dims"]:
        return f"head_dim {case.head_dim} not compiled (compiled: {row['head_dims']})"
    return ""


def pages_needed(case):
    """Pages for every step of a case (prefill, extend, decode, graph decode) with slack."""
    total = sum(case.prefill) + sum(case.extend) + 4 * len(case.prefill)
    return total // case.page_size + 2 * len(case.prefill) + 2


class Cache:
    """Caller-owned paged KV cache in torch CUDA tensors, NaN-poisoned."""

    def __init__(self, case):
        self.case = case
        self.fp8_compute = False  # set per step (runs_fa3_fp8_kernel)
        self.num_pages = pages_needed(case)
        rows = (self.num_pages + 1) * case.page_size
        shape = (rows, case.kv_heads, case.head_dim)
        if case.kv_dtype == "fp8_e4m3":
            self.k = [torch.full(shape, E4M3_NAN_CODE, dtype=torch.uint8, device=DEVICE)
                      for _ in range(NUM_LAYERS)]
            self.v = [torch.full(shape, E4M3_NAN_CODE, dtype=torch.uint8, device=DEVICE)
                      for _ in range(NUM_LAYERS)]
            self.pool = ak.MHAKVPool.wrap(self.k, self.v, page_size=case.page_size,
                                          dtype="fp8_e4m3")
        else:
            kv_type = TORCH_DTYPE[case.kv_dtype]
            self.k = [torch.full(shape, math.nan, dtype=kv_type, device=DEVICE)
                      for _ in range(NUM_LAYERS)]
            self.v = [torch.full(shape, math.nan, dtype=kv_type, device=DEVICE)
                      for _ in range(NUM_LAYERS)]
            self.pool = ak.MHAKVPool.wrap(self.k, self.v, page_size=case.page_size)
        self.init_requests()

    def init_requests(self):
        """The request table and page allocator over the pool, one table row per request."""
        case = self.case
        self.table = ak.ReqToTokenPool(len(case.prefill) + 2, MAX_CONTEXT, device=DEVICE)
        self.pages = ak.PageAllocator(self.num_pages, case.page_size)
        self.rows = [self.table.alloc() for _ in case.prefill]
        self.lengths = [0] * len(case.prefill)

    def dequantised(self, layer, slots):
        """K and V of `slots` as float32 [n, kv_heads, dim], as the pool stores them."""
        k, v = self.k[layer][slots], self.v[layer][slots]
        if self.case.kv_dtype == "fp8_e4m3":
            k = k.view(torch.float8_e4m3fn).float() * self.case.k_scale
            v = v.view(torch.float8_e4m3fn).float() * self.case.v_scale
        return k.float(), v.float()

    def plan(self, new_lens, mode):
        """Allocates slots, fills the request table, returns (batch, slots tensor, prefix)."""
        prefix = list(self.lengths)
        seq = [p + n for p, n in zip(prefix, new_lens)]
        last = ak.last_locs(self.table, self.rows, prefix)
        if mode == "decode":
            slots = self.pages.alloc_decode(seq, last)
        else:
            slots = self.pages.alloc_extend(prefix, seq, last)
        start = 0
        for row, p, n in zip(self.rows, prefix, new_lens):
            self.table.write(row, p, slots[start:start + n])
            start += n
        i32 = dict(dtype=torch.int32, device=DEVICE)
        extend_args = {}
        if mode != "decode":
            starts = [sum(new_lens[:i]) for i in range(len(new_lens))]
            extend_args = dict(extend_prefix_lens=torch.tensor(prefix, **i32),
                               extend_seq_lens=torch.tensor(new_lens, **i32),
                               extend_start_loc=torch.tensor(starts, **i32),
                               extend_prefix_lens_host=prefix, extend_seq_lens_host=list(new_lens),
                               extend_start_loc_host=starts)
        positions = torch.cat([torch.arange(p, s, device=DEVICE) for p, s in zip(prefix, seq)])
        slots_t = torch.from_numpy(slots).to(DEVICE)
        batch = ak.ForwardBatch(mode, torch.tensor(self.rows, **i32), torch.tensor(seq, **i32),
                                slots_t, self.table, self.pool, positions=positions,
                                req_pool_indices_host=self.rows, seq_lens_host=seq,
                                stream=torch.cuda.current_stream().cuda_stream, **extend_args)
        return batch, slots_t, prefix

    def commit(self, new_lens):
        self.lengths = [p + n for p, n in zip(self.lengths, new_lens)]

    def layer(self, layer_id):
        case = self.case
        return ak.AttentionLayer(case.q_heads, case.kv_heads, case.head_dim, layer_id=layer_id,
                                 sliding_window=case.window, k_scale=case.k_scale,
                                 v_scale=case.v_scale)

    def inputs(self, tokens, gen):
        case = self.case
        dtype = TORCH_DTYPE[case.q_dtype]
        shape = dict(generator=gen, device=DEVICE, dtype=dtype)
        q = torch.randn(tokens, case.q_heads, case.head_dim, **shape)
        k = torch.randn(tokens, case.kv_heads, case.head_dim, **shape)
        v = torch.randn(tokens, case.kv_heads, case.head_dim, **shape)
        return q, k, v, torch.full_like(q, math.nan)

    def check_stored(self, layer, slots, k, v):
        """set_kv / save_kv stored the new rows in the caller's tensors (zero-copy)."""
        case = self.case
        if case.kv_dtype != "fp8_e4m3":
            ok = torch.equal(self.k[layer][slots], k) and torch.equal(self.v[layer][slots], v)
            return "" if ok else "stored k/v differ from the inputs"
        stored_k, stored_v = self.dequantised(layer, slots)
        for stored, x, scale in ((stored_k, k, case.k_scale), (stored_v, v, case.v_scale)):
            exact = x.float()
            bound = E4M3_UNIT_ROUNDOFF * exact.abs() + E4M3_HALF_SUBNORMAL * scale
            if not bool(((stored - exact).abs() <= bound).all()):
                return "fp8 stored values are not RNE(x / scale)"
        return ""

    def check_request(self, layer, row, prefix, q, out):
        """'' when out matches SDPA over the request's stored (dequantised) keys and values."""
        n = q.shape[0]
        row_slots = torch.from_numpy(self.table.host_row(row)[:prefix + n]).long().to(DEVICE)
        kk, vv = self.dequantised(layer.layer_id, row_slots)
        ref = sdpa_reference(q, kk, vv, prefix, layer.scaling, self.case.window)
        tol = FP8_COMPUTE_REL_L2 if self.fp8_compute else None
        return compare(out, ref, TORCH_DTYPE[self.case.q_dtype], tol)


def sdpa_reference(q, k, v, prefix, scaling, window):
    """q [n, Hq, D] at positions prefix..prefix+n-1 over k/v [L, Hkv, D] (float32)."""
    group = q.shape[1] // k.shape[1]
    kv_len = k.shape[0]
    q_pos = torch.arange(prefix, prefix + q.shape[0], device=DEVICE)[:, None]
    k_pos = torch.arange(kv_len, device=DEVICE)[None, :]
    mask = k_pos <= q_pos
    if window >= 0:
        mask &= (q_pos - k_pos) <= window
    out = F.scaled_dot_product_attention(
        q.float().transpose(0, 1), k.repeat_interleave(group, dim=1).transpose(0, 1),
        v.repeat_interleave(group, dim=1).transpose(0, 1), attn_mask=mask, scale=scaling)
    return out.transpose(0, 1)


def compare(out, ref, dtype, tol=None):
    """'' when out matches ref within the harness tolerances (rel L2 `tol` when given, else the
    output dtype's), else a description."""
    out = out.float()
    bad = (~torch.isfinite(out)).sum().item()
    diff = out - ref
    rel = (diff.norm() / ref.norm().clamp_min(1e-30)).item()
    max_abs = diff.abs().max().item()
    tol = REL_L2_TOLERANCE[dtype] if tol is None else tol
    abs_tol = MAX_ABS_FACTOR * tol * max(1.0, ref.abs().max().item())
    summary = f"rel_l2 {rel:.2e} (tol {tol:.0e}) max_abs {max_abs:.2e} (tol {abs_tol:.2e})"
    if bad or rel > tol or max_abs > abs_tol:
        return f"{summary}, nan/inf {bad}"
    return ""


# ---- MLA (absorbed 576 / 512 over one latent row per token) ----

MLA_LORA = 512
MLA_ROPE = 64
MLA_ROW = MLA_LORA + MLA_ROPE
MLA_SCALING = 192**-0.5  # DeepSeek: 1/sqrt(qk_nope 128 + qk_rope 64)


@dataclasses.dataclass
class MLACase:
    name: str
    q_heads: int
    page_size: int
    kv_dtype: str = "bf16"
    k_scale: float = 1.0
    prefill: tuple = (37, 1, 300, 64)
    extend: tuple = (5, 17, 1, 3)


MLA_CASES = [
    MLACase("mla_h16_page1", 16, 1),
    MLACase("mla_h16_page64", 16, 64),
    MLACase("mla_h128_page64", 128, 64, prefill=(200, 65), extend=(3, 1)),
    MLACase("mla_h16_page128", 16, 128),
    MLACase("mla_h16_page64_fp8", 16, 64, kv_dtype="fp8_e4m3", k_scale=0.5),
    MLACase("mla_h64_page64_long_split_kv", 64, 64, prefill=(1900, 3), extend=(2, 1)),
]


class MLACache(Cache):
    """Caller-owned latent cache [rows, 1, 576] per layer in torch CUDA tensors, NaN-poisoned."""

    def __init__(self, case):
        self.case = case
        self.fp8_compute = False  # set per step (runs_fa3_fp8_kernel)
        self.num_pages = pages_needed(case)
        shape = ((self.num_pages + 1) * case.page_size, 1, MLA_ROW)
        if case.kv_dtype == "fp8_e4m3":
            self.kv = [torch.full(shape, E4M3_NAN_CODE, dtype=torch.uint8, device=DEVICE)
                       for _ in range(NUM_LAYERS)]
            self.pool = ak.MLAKVPool.wrap(self.kv, page_size=case.page_size,
                                          kv_lora_rank=MLA_LORA, dtype="fp8_e4m3")
        else:
            self.kv = [torch.full(shape, math.nan, dtype=torch.bfloat16, device=DEVICE)
                       for _ in range(NUM_LAYERS)]
            self.pool = ak.MLAKVPool.wrap(self.kv, page_size=case.page_size,
                                          kv_lora_rank=MLA_LORA)
        self.init_requests()

    def latent(self, layer, slots):
        """The stored latent rows of `slots` as float32 [n, 576] (dequantised)."""
        kv = self.kv[layer][slots][:, 0]
        if self.case.kv_dtype == "fp8_e4m3":
            return kv.view(torch.float8_e4m3fn).float() * self.case.k_scale
        return kv.float()

    def layer(self, layer_id):
        case = self.case
        return ak.AttentionLayer(case.q_heads, 1, MLA_ROW, MLA_LORA, layer_id=layer_id,
                                 scaling=MLA_SCALING, is_mla=True, kv_lora_rank=MLA_LORA,
                                 qk_rope_head_dim=MLA_ROPE, k_scale=case.k_scale,
                                 v_scale=case.k_scale)

    def inputs(self, tokens, gen):
        case = self.case
        q = torch.randn(tokens, case.q_heads, MLA_ROW, generator=gen, device=DEVICE,
                        dtype=torch.bfloat16)
        k = torch.randn(tokens, 1, MLA_ROW, generator=gen, device=DEVICE, dtype=torch.bfloat16)
        v = k[..., :MLA_LORA].contiguous()  # V = the first kv_lora_rank columns of the row
        return q, k, v, torch.full((tokens, case.q_heads, MLA_LORA), math.nan, device=DEVICE,
                                   dtype=torch.bfloat16)

    def check_stored(self, layer_id, slots, k, v):
        """save_kv stored k as the latent row (fp8: RNE(k / k_scale)) in the caller's tensors."""
        if self.case.kv_dtype != "fp8_e4m3":
            ok = torch.equal(self.kv[layer_id][slots], k)
            return "" if ok else "stored latent rows differ from k"
        exact = k[:, 0].float()
        bound = E4M3_UNIT_ROUNDOFF * exact.abs() + E4M3_HALF_SUBNORMAL * self.case.k_scale
        if not bool(((self.latent(layer_id, slots) - exact).abs() <= bound).all()):
            return "fp8 stored latent rows are not RNE(k / k_scale)"
        return ""

    def check_request(self, layer, row, prefix, q, out):
        """'' when out [n, H, 512] matches SDPA over the request's stored latent rows."""
        n = q.shape[0]
        slots = torch.from_numpy(self.table.host_row(row)[:prefix + n]).long().to(DEVICE)
        latent = self.latent(layer.layer_id, slots)[:, None, :]
        ref = sdpa_reference(q, latent, latent[..., :MLA_LORA], prefix, layer.scaling, -1)
        return compare(out, ref, torch.bfloat16)


# ---- the steps every case runs (MHA or MLA through the cache's hooks) ----

def runs_fa3_fp8_kernel(name, case, mode):
    """Whether fa3 runs this step on its FP8 prefill kernel (fa3_backend: SM90, extend, fp8_e4m3
    KV with bf16 q at d 128, a sliding window too since the FP8 variants took window / sinks /
    soft-cap; ATTNKIT_FA3_FP8=0 turns it off). A step that runs elsewhere after all (few new
    tokens per request go to flashinfer's tiles) is then held to the FP8 bound, looser than its
    own."""
    return (name == "fa3" and mode == "extend" and not isinstance(case, MLACase)
            and case.kv_dtype == "fp8_e4m3" and case.q_dtype == "bf16" and case.head_dim == 128
            and torch.cuda.get_device_capability() == (9, 0)
            and os.environ.get("ATTNKIT_FA3_FP8") != "0")


def run_step(backend, cache, new_lens, mode, gen, results, label):
    batch, slots, prefix = cache.plan(new_lens, mode)
    cache.fp8_compute = runs_fa3_fp8_kernel(label.split("/")[0], cache.case, mode)
    backend.init_forward_metadata(batch)
    failures = []
    for layer_id in range(NUM_LAYERS):
        layer = cache.layer(layer_id)
        q, k, v, out = cache.inputs(sum(new_lens), gen)
        forward = backend.forward_decode if mode == "decode" else backend.forward_extend
        forward(q, k, v, out, layer, batch)
        torch.cuda.synchronize()
        stored = cache.check_stored(layer_id, slots, k, v)
        if stored:
            failures.append(f"layer {layer_id}: {stored}")
        start = 0
        for i, (row, p, n) in enumerate(zip(cache.rows, prefix, new_lens)):
            problem = cache.check_request(layer, row, p, q[start:start + n], out[start:start + n])
            if problem:
                failures.append(f"layer {layer_id} request {i} (prefix {p}, new {n}): {problem}")
            start += n
    cache.commit(new_lens)
    results.report("FAIL" if failures else "PASS", f"{label} {mode} {list(new_lens)}",
                   "; ".join(failures[:3]))


def run_graph_decode(backend, cache, gen, results, label):
    """Capture one decode step with placeholder metadata, replay it for the real batch, and
    compare with eager execution (bit-identical) and with SDPA."""
    bs = len(cache.rows)
    layer = cache.layer(0)
    i32 = dict(dtype=torch.int32, device=DEVICE)
    fill = backend.cuda_graph_seq_len_fill_value
    # Static graph inputs. At capture time the lengths are placeholders (the backend's fill
    # value); replay must refresh the metadata from the real lengths.
    static_rows = torch.tensor(cache.rows, **i32)
    static_seq = torch.full((bs,), fill, **i32)
    static_loc = torch.zeros(bs, dtype=torch.int64, device=DEVICE)
    q, k, v, out_graph = cache.inputs(bs, gen)
    backend.init_cuda_graph_state(bs, bs)
    backend.init_forward_metadata_capture_cuda_graph(bs, bs, static_rows, static_seq, None,
                                                     "decode", None)
    capture_batch = ak.ForwardBatch("decode", static_rows, static_seq, static_loc, cache.table,
                                    cache.pool, req_pool_indices_host=cache.rows,
                                    seq_lens_host=[fill] * bs)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        capture_batch.stream = torch.cuda.current_stream().cuda_stream
        backend.forward_decode(q, k, v, out_graph, layer, capture_batch)

    batch, slots, prefix = cache.plan([1] * bs, "decode")
    seq = [p + 1 for p in prefix]
    static_seq.copy_(torch.tensor(seq, **i32))
    static_loc.copy_(slots)
    backend.init_forward_metadata_replay_cuda_graph(bs, static_rows, static_seq, sum(seq), None,
                                                    "decode", None, seq_lens_host=seq)
    graph.replay()
    torch.cuda.synchronize()

    out_eager = torch.full_like(out_graph, math.nan)
    backend.init_forward_metadata(batch)
    backend.forward_decode(q, k, v, out_eager, layer, batch)
    torch.cuda.synchronize()
    failures = []
    if not torch.equal(out_graph, out_eager):
        diff = (out_graph.float() - out_eager.float()).abs().nan_to_num(math.inf).max().item()
        failures.append(f"graph replay differs from eager (max |diff| {diff:.2e})")
    for i, (row, p) in enumerate(zip(cache.rows, prefix)):
        problem = cache.check_request(layer, row, p, q[i:i + 1], out_graph[i:i + 1])
        if problem:
            failures.append(f"request {i}: {problem}")
    cache.commit([1] * bs)
    results.report("FAIL" if failures else "PASS", f"{label} cuda-graph decode",
                   "; ".join(failures[:3]))


def run_case(name, descriptor, case, results):
    label = f"{name}/{case.name}"
    is_mla = isinstance(case, MLACase)
    reason = skip_reason(descriptor, case)
    if reason:
        results.report("SKIP", label, f"descriptor: {reason}")
        return
    cache = MLACache(case) if is_mla else Cache(case)
    try:
        backend = ak.create_backend(name, kv_pool=cache.pool, req_to_token_pool=cache.table,
                                    num_q_heads=case.q_heads,
                                    q_dtype="bf16" if is_mla else case.q_dtype,
                                    stream=torch.cuda.current_stream().cuda_stream)
    except (ak.UnsupportedError, ak.NotBuiltError) as e:
        results.report("SKIP", label, f"{type(e).__name__}: {e}")
        return
    except ak.Error as e:
        results.report("FAIL", label, f"create_backend: {type(e).__name__}: {e}")
        return
    # Backend.device / KVPool.device: the wrapped tensors' GPU, as "cuda:N".
    want = f"cuda:{torch.cuda.current_device()}"
    if backend.device != want or cache.pool.device != want:
        results.report("FAIL", label, f"device: backend {backend.device!r}, pool "
                       f"{cache.pool.device!r}, expected {want!r}")
        return
    gen = torch.Generator(device=DEVICE)
    gen.manual_seed(sum(map(ord, label)))
    try:
        run_step(backend, cache, case.prefill, "extend", gen, results, label)
        run_step(backend, cache, case.extend, "extend", gen, results, label)
        run_step(backend, cache, [1] * len(case.prefill), "decode", gen, results, label)
        if descriptor["cuda_graph"]:
            run_graph_decode(backend, cache, gen, results, label)
    except ak.Error as e:
        results.report("FAIL", label, f"{type(e).__name__}: {e}")
    except Exception:  # a crash in one backend must not hide the others' results
        results.report("FAIL", label, traceback.format_exc(limit=3).replace("\n", " | "))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", help="comma-separated backend names (default: every GPU "
                        "backend built into the package)")
    parser.add_argument("--cases", help="comma-separated case names (default: all)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device visible to torch", file=sys.stderr)
        return 2
    print(f"device: {torch.cuda.get_device_name()} | torch {torch.__version__} | attnkit "
          f"{ak.__version__} (built_with_cuda={ak.built_with_cuda})")
    descriptors = {row["name"]: row for row in ak.matrix()}
    names = (args.backends.split(",") if args.backends
             else [n for n in ak.built_backends("cuda") if n != "torch_native"])
    if not names:
        print("no GPU backend is built into this attnkit package", file=sys.stderr)
        return 2
    wanted = args.cases.split(",") if args.cases else None
    cases = [c for c in CASES if not wanted or c.name in wanted]
    mla_cases = [c for c in MLA_CASES if not wanted or c.name in wanted]
    results = Results()
    for name in names:
        if name not in descriptors:
            results.report("FAIL", name, "unknown backend")
            continue
        for case in cases:
            run_case(name, descriptors[name], case, results)
        for case in mla_cases:
            run_case(name, descriptors[name], case, results)
    print(f"{results.passed} passed, {results.failed} failed, {results.skipped} skipped")
    return 1 if results.failed else 0


if __name__ == "__main__":
    sys.exit(main())
