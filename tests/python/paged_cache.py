"""Test helpers: a paged KV cache held in NumPy arrays (wrapped zero-copy by attnkit), batch
construction, and an independent fp64 NumPy attention oracle over the gathered K/V history.

The oracle never reads the attnkit pool: every request's K/V history is recorded here as the
values the pool stores (rounded to the storage dtype), so a wrong slot, a stray read or a wrong
mask in the library shows up as a mismatch.
"""

import numpy as np

import attnkit as ak

# Unit roundoff of each storage / output dtype (half an ulp at 1.0).
UNIT_ROUNDOFF = {"f32": 2.0**-24, "f16": 2.0**-11, "bf16": 2.0**-8, "fp8_e4m3": 2.0**-4}
NUMPY_DTYPE = {"f32": np.float32, "f16": np.float16}


def round_to_bf16(x):
    """Round-to-nearest-even to bfloat16, returned as float64 (independent of attnkit)."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return (rounded << 16).astype(np.uint32).view(np.float32).astype(np.float64)


def bf16_storage(x):
    """The uint16 bit patterns of round_to_bf16(x)."""
    return (round_to_bf16(x).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def decode_e4m3(codes):
    """OCP float8 e4m3fn bytes -> float64 (bias 7, no infinities, S.1111.111 = NaN)."""
    codes = np.asarray(codes, dtype=np.uint8).astype(np.int64)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exponent = (codes >> 3) & 0xF
    mantissa = codes & 0x7
    normal = (1.0 + mantissa / 8.0) * np.exp2(exponent - 7.0)
    subnormal = (mantissa / 8.0) * 2.0**-6
    value = sign * np.where(exponent == 0, subnormal, normal)
    return np.where((codes & 0x7F) == 0x7F, np.nan, value)


def round_to_storage(x, dtype):
    """Values a pool of `dtype` keeps for x (f32/f16/bf16), as float64."""
    if dtype == "bf16":
        return round_to_bf16(x)
    return np.asarray(x, dtype=NUMPY_DTYPE[dtype]).astype(np.float64)


class PagedCache:
    """Caller-owned per-layer K/V buffers in NumPy, a request table and a page allocator.

    Unused pool rows are NaN-poisoned (for float storage), so any read of a slot that does not
    belong to the batch turns the output into NaN.
    """

    def __init__(self, *, num_layers, num_kv_heads, head_dim, v_head_dim, page_size, num_pages,
                 kv_dtype, max_reqs=8, max_context_len=256, rng):
        self.kv_dtype = kv_dtype
        self.page_size = page_size
        self.rows = (num_pages + 1) * page_size
        self.num_layers = num_layers
        self.rng = rng
        self.k_store, self.v_store = [], []
        for _ in range(num_layers):
            self.k_store.append(self._poisoned((self.rows, num_kv_heads, head_dim)))
            self.v_store.append(self._poisoned((self.rows, num_kv_heads, v_head_dim)))
        wrap_dtype = None if kv_dtype in NUMPY_DTYPE else kv_dtype
        self.pool = ak.MHAKVPool.wrap(self.k_store, self.v_store, page_size=page_size,
                                      dtype=wrap_dtype)
        self.req_to_token = ak.ReqToTokenPool(max_reqs, max_context_len)
        self.allocator = ak.PageAllocator(num_pages, page_size)
        # Per request row: list over layers of (k history, v history) in float64 as stored.
        self.history = {}
        self.lengths = {}

    def _poisoned(self, shape):
        if self.kv_dtype in NUMPY_DTYPE:
            return np.full(shape, np.nan, dtype=NUMPY_DTYPE[self.kv_dtype])
        if self.kv_dtype == "bf16":
            return np.full(shape, 0x7FC0, dtype=np.uint16)  # bf16 quiet NaN
        return np.full(shape, 0x7F, dtype=np.uint8)  # fp8 e4m3 NaN

    def new_request(self):
        row = self.req_to_token.alloc()
        self.lengths[row] = 0
        self.history[row] = [(None, None) for _ in range(self.num_layers)]
        return row

    def plan(self, rows, new_lens):
        """Allocate slots for new_lens[i] tokens of request rows[i]; returns out_cache_loc."""
        prefix = np.array([self.lengths[r] for r in rows], dtype=np.int32)
        seq = prefix + np.array(new_lens, dtype=np.int32)
        last = ak.last_locs(self.req_to_token, np.array(rows, dtype=np.int32), prefix)
        slots = self.allocator.alloc_extend(prefix, seq, last)
        start = 0
        for r, p, n in zip(rows, prefix, new_lens):
            self.req_to_token.write(r, int(p), slots[start:start + n])
            start += n
        return prefix, seq, slots

    def record(self, layer, rows, new_lens, slots, k, v, k_scale=1.0, v_scale=1.0):
        """Append the stored values of new k/v ([T, H, D]) to each request's history.

        Float storage: k/v rounded to the storage dtype here. fp8: the bytes set_kv wrote into
        the caller-owned buffer, decoded by decode_e4m3 and multiplied by the layer scale (the
        quantisation itself is checked separately against k / k_scale).
        """
        if self.kv_dtype == "fp8_e4m3":
            k_stored = decode_e4m3(self.k_store[layer][slots]) * k_scale
            v_stored = decode_e4m3(self.v_store[layer][slots]) * v_scale
        else:
            k_stored = round_to_storage(k, self.kv_dtype)
            v_stored = round_to_storage(v, self.kv_dtype)
        start = 0
        for r, n in zip(rows, new_lens):
            old_k, old_v = self.history[r][layer]
            new_k = k_stored[start:start + n]
            new_v = v_stored[start:start + n]
            self.history[r][layer] = (
                new_k if old_k is None else np.concatenate([old_k, new_k]),
                new_v if old_v is None else np.concatenate([old_v, new_v]),
            )
            start += n

    def commit(self, rows, new_lens):
        for r, n in zip(rows, new_lens):
            self.lengths[r] += n


def make_batch(cache, mode, rows, prefix, seq, slots):
    """An attnkit.ForwardBatch over NumPy arrays (host copies are read from them)."""
    rows_arr = np.array(rows, dtype=np.int32)
    seq_arr = np.asarray(seq, dtype=np.int32)
    kwargs = {}
    if mode != "decode":
        new_lens = (seq_arr - prefix).astype(np.int32)
        kwargs = dict(
            extend_prefix_lens=np.asarray(prefix, dtype=np.int32),
            extend_seq_lens=new_lens,
            extend_start_loc=np.concatenate([[0], np.cumsum(new_lens)[:-1]]).astype(np.int32),
        )
    positions = np.concatenate(
        [np.arange(p, s, dtype=np.int64) for p, s in zip(prefix, seq_arr)])
    return ak.ForwardBatch(mode, rows_arr, seq_arr, np.asarray(slots, dtype=np.int64),
                           cache.req_to_token, cache.pool, positions=positions, **kwargs)


def attention_fp64(q, k_hist, v_hist, prefix, scaling, window=-1, logit_cap=0.0):
    """Causal attention of q [n, Hq, D] (positions prefix..prefix+n-1) over k/v [L, Hkv, D]."""
    n, hq, _ = q.shape
    kv_len, hkv, dv = v_hist.shape
    group = hq // hkv
    out = np.zeros((n, hq, dv))
    q64 = q.astype(np.float64)
    for i in range(n):
        q_pos = prefix + i
        keys = np.arange(kv_len)
        visible = keys <= q_pos
        if window >= 0:
            visible &= q_pos - keys <= window
        for h in range(hq):
            kh = h // group
            logits = scaling * (k_hist[:, kh, :] @ q64[i, h])
            if logit_cap > 0:
                logits = logit_cap * np.tanh(logits / logit_cap)
            logits = np.where(visible, logits, -np.inf)
            if not visible.any():
                continue
            w = np.exp(logits - logits.max())
            out[i, h] = (w / w.sum()) @ v_hist[:, kh, :]
    return out


def rel_l2(actual, expected):
    actual = np.asarray(actual, dtype=np.float64)
    return np.linalg.norm(actual - expected) / max(np.linalg.norm(expected), 1e-30)
