// The benchmark's workload description and the written formulas for the FLOPs and bytes of one
// attention call. Every rate `attnkit bench` prints (GB/s, TFLOP/s) comes from these functions;
// docs/PERF.md quotes them.
//
// Header-only so that tests/unit/test_bench_formulas.cpp can check them without the CLI.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "attnkit/dtype.h"

namespace attnkit::bench {

enum class BenchKind {
  kDecode,     // one query token per request over its whole cached sequence (MHA / GQA / MQA)
  kExtend,     // new tokens per request over a cached prefix plus themselves
  kMlaDecode,  // absorbed MLA decode: q [bs, H, rank + rope], one shared latent KV row per token
};

inline const char* bench_kind_name(BenchKind kind) {
  switch (kind) {
    case BenchKind::kDecode:
      return "decode";
    case BenchKind::kExtend:
      return "extend";
    case BenchKind::kMlaDecode:
      return "mla_decode";
  }
  return "unknown";
}

// One point of a sweep. Every request of the batch has the same lengths.
struct BenchCase {
  std::string name;
  BenchKind kind = BenchKind::kDecode;
  int batch = 1;
  // Decode / MLA decode: sequence length per request including the new token (ForwardBatch
  // seq_lens). Extend: unused.
  int kv_len = 0;
  // Decode / MLA decode, uneven batches: one sequence length per request (case files: "kv_lens");
  // then batch = kv_lens.size() and kv_len = the longest. Empty: every request has kv_len.
  std::vector<int> kv_lens;
  int prefix_len = 0;  // extend: cached tokens per request
  // Extend, uneven batches: one cached length per request (case files: "prefix_lens"); then batch
  // = prefix_lens.size() and prefix_len = the longest. Empty: every request has prefix_len.
  std::vector<int> prefix_lens;
  int new_tokens = 0;  // extend: new tokens per request
  // Extend, uneven batches: one new-token count per request (case files: "new_lens"); then batch =
  // new_lens.size() (prefix_lens, when given as well, has the same size) and new_tokens = the
  // largest. Empty: every request has new_tokens.
  std::vector<int> new_lens;
  // Extend: the forward runs as ForwardMode::kMixed (a chunked prefill with decode requests, the
  // batches of SGLang's --enable-mixed-chunk; case files: "mixed": true) instead of kExtend. The
  // formulas count the same either way.
  bool mixed = false;
  bool causal = true;  // extend: causal over the new tokens; false = bidirectional (encoder)
  int q_heads = 0;
  int kv_heads = 0;  // MLA: 1
  int head_dim = 0;  // qk head dim; MLA: kv_lora_rank + qk_rope_head_dim
  int v_head_dim = 0;
  int kv_lora_rank = 0;      // MLA only
  int qk_rope_head_dim = 0;  // MLA only
  // Extend: a non-absorbed MLA prefill layer (case files: "mla": true): q / k head_dim (192 =
  // nope 128 + rope 64), v_head_dim (128), kv_heads = q_heads, no prefix (the new tokens attend
  // each other; the pool holds latent rows of kv_lora_rank + qk_rope_head_dim, default 512 + 64,
  // which the layer does not read). Its k / v are the layer's inputs, counted below as K / V
  // of kv_heads x (head_dim + v_head_dim) per token at kv_dtype (= the activation dtype).
  bool mla_prefill = false;
  // Extend, mla_prefill only (case files: "mla_prefix_chunk"): the chunked prefix cache's token
  // budget per chunk (AttentionLayer::mla_prefix, BackendContext::mla_prefix_chunk_tokens): the
  // layer then attends prefix_len cached tokens per request as well, decompressed from the latent
  // pool chunk by chunk (the decompression's time counts, its FLOPs do not); 0: no prefix.
  int mla_prefix_chunk = 0;
  int page_size = 1;
  // Decode / extend: leading tokens every request shares with request 0 (the same pages, as a
  // radix cache hands out a common prompt); a multiple of page_size. Bytes and FLOPs below count
  // every request's keys as if private, so a shared case's GB/s is the effective rate.
  int shared_prefix = 0;
  // Pages of the pool and request rows in random order (the harness default); false: in order.
  bool shuffle_pages = true;
  DType dtype = DType::kBF16;     // q, new k/v and out
  DType kv_dtype = DType::kBF16;  // KV pool storage
  // Extend: q handed over in fp8_e4m3 with a per-layer q_scale (the fa3 FP8 prefill's e4m3
  // input; harness::CaseSpec::fp8_q); k / v / out stay `dtype`.
  bool fp8_q = false;
  // Extend: the layer's sliding window (AttentionLayer::sliding_window: a query at position q sees
  // key k when q - k <= sliding_window; -1 off), soft-cap (logit_cap; 0 off) and attention sinks.
  // The window shrinks the pairs and the keys counted below; the other two change neither.
  int sliding_window = -1;
  float logit_cap = 0.f;
  bool sinks = false;
  // Decode / MLA decode: query tokens per request. s_q > 1 is a speculative verify step
  // (TARGET_VERIFY): the last s_q of the kv_len keys are the drafts, every cached key is visible
  // to each of them, and among the drafts the tree mask of `topk` (1: a chain, draft i sees
  // kv_len - s_q + 1 + i keys; > 1: a random tree, draft i sees its ancestors and itself, the
  // harness's trees).
  int s_q = 1;
  int topk = 1;

  // Query tokens of the batch: batch x s_q (decode), batch x new_tokens or the sum of new_lens
  // (extend).
  int64_t num_tokens() const {
    if (kind != BenchKind::kExtend) return int64_t{batch} * s_q;
    if (new_lens.empty()) return int64_t{batch} * new_tokens;
    int64_t sum = 0;
    for (int n : new_lens) sum += n;
    return sum;
  }
};

// Bytes of n stored values of `dtype`, including the fp4 block scales: fp4_e2m1 packs two values
// per byte and adds one fp8_e4m3 scale byte per kFp4GroupSize (16) values.
inline int64_t stored_bytes(DType dtype, int64_t n) {
  const int64_t data = (n * dtype_bits(dtype) + 7) / 8;
  const int64_t scales = dtype == DType::kFP4E2M1 ? (n + kFp4GroupSize - 1) / kFp4GroupSize : 0;
  return data + scales;
}

// Bytes of one token's cached K and V (one layer):
//   MHA: kv_heads x head_dim (K) + kv_heads x v_head_dim (V), at the pool dtype incl. fp4 scales.
//   MLA: one latent row of kv_lora_rank + qk_rope_head_dim values; V is a view of its first
//        kv_lora_rank columns, so it is read once and counted once.
inline int64_t kv_bytes_per_token(const BenchCase& c) {
  if (c.kind == BenchKind::kMlaDecode) {
    return stored_bytes(c.kv_dtype, static_cast<int64_t>(c.kv_lora_rank + c.qk_rope_head_dim));
  }
  return stored_bytes(c.kv_dtype, static_cast<int64_t>(c.kv_heads) * c.head_dim) +
         stored_bytes(c.kv_dtype, static_cast<int64_t>(c.kv_heads) * c.v_head_dim);
}

// (query, key) pairs one request of sequence length `len` attends to, summed over its queries.
//   decode: 1 query x seq_len keys.
//   extend, causal: new token i (0-based) sees prefix + i + 1 keys, so the sum is
//     new * prefix + new * (new + 1) / 2; only visible pairs count.
//   extend, bidirectional: new * (prefix + new).
//   extend with a sliding window w: the query at position q (prefix <= q < prefix + new) sees
//     keys max(0, q - w) .. q (causal: min(q + 1, w + 1) of them) or max(0, q - w) ..
//     min(L - 1, q + w) (bidirectional, L = prefix + new: |q - k| <= w), summed over q. E.g.
//     prefix 0, new 4, w 1, causal: 1 + 2 + 2 + 2 = 7 (of the 10 without the window).
//   decode / MLA decode with s_q queries (verify): s_q * kv_len - s_q * (s_q - 1) / 2, a chain's
//     pairs. A tree (topk > 1) shows each draft only its ancestors among the drafts, fewer than
//     the chain's at most by s_q * (s_q - 1) / 2 (36 of the 32 K pairs of 8 drafts over 4 K keys):
//     the count is an upper bound there, the rates derived from it as well.
//   For an extend, len is the request's cached prefix and n its new tokens (decode: n unused).
inline int64_t attended_pairs_at(const BenchCase& c, int64_t len, int64_t n) {
  if (c.kind != BenchKind::kExtend) {
    const int64_t s = c.s_q;
    return s * len - s * (s - 1) / 2;
  }
  const int64_t p = len;
  if (c.sliding_window < 0) return c.causal ? n * p + n * (n + 1) / 2 : n * (p + n);
  // Sum over q in [p, p + n) of (the last key seen + 1) - max(0, q - w), in closed form: the
  // rows before q = w start at key 0, the rest at q - w; bidirectional rows from q = L - w on end
  // at L - 1, the rest at q + w.
  const int64_t w = c.sliding_window;
  const int64_t L = p + n;
  auto sum_range = [](int64_t a, int64_t b) {  // a + (a + 1) + ... + (b - 1), 0 when b <= a
    return b > a ? (a + b - 1) * (b - a) / 2 : int64_t{0};
  };
  const int64_t full = std::clamp<int64_t>(L - w, p, L);   // first q whose window reaches L - 1
  const int64_t ends = c.causal ? sum_range(p + 1, L + 1)  // sum of last key + 1
                                : sum_range(p + w + 1, full + w + 1) + (L - full) * L;
  const int64_t split = std::clamp<int64_t>(w, p, L);  // first q with q - w >= 0
  const int64_t starts = sum_range(split - w, L - w);  // sum of q - w, q >= split
  return ends - starts;
}
// The per-request count of a uniform batch (prefix_len / new_tokens, or kv_len).
inline int64_t attended_pairs_per_request(const BenchCase& c) {
  return c.kind == BenchKind::kExtend ? attended_pairs_at(c, c.prefix_len, c.new_tokens)
                                      : attended_pairs_at(c, c.kv_len, 0);
}

// The per-request lengths of an uneven batch (decode: kv_lens; extend: prefix_lens), else empty.
inline const std::vector<int>& uneven_lens(const BenchCase& c) {
  return c.kind == BenchKind::kExtend ? c.prefix_lens : c.kv_lens;
}

// The sum of f(len, fresh) over the batch's requests: len each request's own length (uneven_lens)
// or the uniform one (prefix_len for extend, kv_len otherwise); fresh its new tokens (extend:
// new_lens or new_tokens; 0 otherwise).
template <class F>
int64_t sum_over_requests(const BenchCase& c, F f) {
  const bool extend = c.kind == BenchKind::kExtend;
  const std::vector<int>& lens = uneven_lens(c);
  const int64_t uniform_len = extend ? c.prefix_len : c.kv_len;
  const int64_t uniform_new = extend ? c.new_tokens : 0;
  if (lens.empty() && (!extend || c.new_lens.empty())) {
    return static_cast<int64_t>(c.batch) * f(uniform_len, uniform_new);
  }
  int64_t sum = 0;
  for (size_t r = 0; r < static_cast<size_t>(c.batch); ++r) {
    const int64_t len = r < lens.size() ? lens[r] : uniform_len;
    const int64_t fresh = extend && r < c.new_lens.size() ? c.new_lens[r] : uniform_new;
    sum += f(len, fresh);
  }
  return sum;
}

// Pairs of the whole batch: batch x the per-request count, or the sum over the requests' own
// lengths (kv_lens / prefix_lens, new_lens).
inline int64_t attended_pairs_total(const BenchCase& c) {
  return sum_over_requests(
      c, [&](int64_t len, int64_t fresh) { return attended_pairs_at(c, len, fresh); });
}

// Tokens held in the KV pool over the batch: batch x seq_len, or the sum of kv_lens (decode) /
// of prefix + new tokens per request (extend).
inline int64_t kv_tokens_total(const BenchCase& c) {
  return sum_over_requests(c, [](int64_t len, int64_t fresh) { return len + fresh; });
}

// Tokens whose K / V some query reads: kv_tokens_total, or for an extend with a sliding window w
// the keys from max(0, prefix - w) on (the first query's window start) in every request.
inline int64_t kv_tokens_read(const BenchCase& c) {
  if (c.kind == BenchKind::kExtend && c.sliding_window >= 0) {
    return sum_over_requests(c, [&](int64_t prefix, int64_t fresh) {
      return prefix + fresh - std::max<int64_t>(0, prefix - c.sliding_window);
    });
  }
  return kv_tokens_total(c);
}

// FLOPs of one call: 2 * head_dim for the q.k dot product and 2 * v_head_dim for the p.V
// accumulation per attended pair and q head (softmax work is not counted):
//   FLOPs = 2 * (head_dim + v_head_dim) * q_heads * sum over requests of attended pairs.
// With head_dim == v_head_dim this is the usual 4 * pairs * heads * head_dim. MLA decode counts the
// 576-wide q.k and the 512-wide p.V of the absorbed form.
inline double attention_flops(const BenchCase& c) {
  return 2.0 * (c.head_dim + c.v_head_dim) * static_cast<double>(c.q_heads) *
         static_cast<double>(attended_pairs_total(c));
}

// Bytes of one call (the minimum traffic a kernel must move). The benchmark runs the way the shared
// harness does: the pool already holds every token (history and new), k/v are passed empty with
// save_kv = false, so every key and value is read from the pool (a non-absorbed MLA layer,
// mla_prefill: k / v are its inputs, read once, at the same count):
//   bytes = K+V of all seq_len tokens of every request (kv_bytes_per_token each, at the pool dtype;
//           with kv_lens, each request's own length; an extend with a sliding window: the tokens
//           its queries see, kv_tokens_read)
//         + q [T, q_heads, head_dim] read + out [T, q_heads, v_head_dim] written (activation dtype)
// with T = num_tokens() (batch x s_q for decode, the new tokens of every request for extend);
// seq_len = kv_len for decode and prefix + new tokens for extend. Page-table and index reads are
// not counted (4 bytes per page or token against >= 64 bytes of KV per token per head).
inline double attention_bytes(const BenchCase& c) {
  const int64_t act = dtype_bits(c.dtype) / 8;
  const int64_t t = c.num_tokens();
  const int64_t q_bytes = t * c.q_heads * c.head_dim * (c.fp8_q ? 1 : act);
  const int64_t out_bytes = t * c.q_heads * c.v_head_dim * act;
  const int64_t kv_bytes = kv_tokens_read(c) * kv_bytes_per_token(c);
  return static_cast<double>(kv_bytes + q_bytes + out_bytes);
}

// Which rate a case is judged by: GB/s against the copy ceiling (memory-bound) or TFLOP/s against
// the compute ceiling. With both ceilings of the run known, the case's arithmetic intensity
// (attention_flops / attention_bytes) against the machine's ridge point (compute FLOP/s over copy
// bytes/s) decides, for every kind: absorbed MLA decode at 128 heads is compute-bound at s_q 2
// (about 480 FLOP/B against an H100's ~250 from 760 TFLOP/s over 3000 GB/s) and sits just under
// it at s_q 1 (about 242); an extend of a few new tokens per request over a long prefix (GQA 32/8
// d 128: about 4 FLOP/B per new token) is memory-bound like the decode it nearly is, a prefill
// of thousands of tokens compute-bound. Without a ceiling the kind alone decides: extend
// compute-bound, decode and MLA decode memory-bound.
inline bool is_memory_bound(const BenchCase& c, double copy_gbs = 0, double compute_tflops = 0) {
  const double bytes = attention_bytes(c);
  if (copy_gbs <= 0 || compute_tflops <= 0 || bytes <= 0) return c.kind != BenchKind::kExtend;
  const double ridge = compute_tflops * 1e3 / copy_gbs;  // FLOP per byte
  return attention_flops(c) / bytes < ridge;
}

// The most the paired rounds' forwards of one case may take by default, estimated from its timed
// median (`attnkit bench --paired-max-seconds`).
inline constexpr double kPairedMaxSeconds = 60;
// Forwards per paired round for a case whose timed median is `ms_median`: `calls`, fewer where
// `rounds` rounds of them would take more than `max_seconds`, and 0 (no paired rounds) where even
// one forward per round would (a reference backend's long CPU prefill); `calls` as given when the
// median is not positive.
inline int paired_calls_per_round(double ms_median, int rounds, int calls,
                                  double max_seconds = kPairedMaxSeconds) {
  const double round_ms = ms_median * static_cast<double>(rounds > 1 ? rounds : 1);
  if (!(round_ms > 0)) return calls;
  const double fit = max_seconds * 1e3 / round_ms;
  return fit >= calls ? calls : static_cast<int>(fit);
}

// Rates from a time in milliseconds.
inline double gb_per_s(double bytes, double ms) { return ms > 0 ? bytes / (ms * 1e-3) / 1e9 : 0; }
inline double tflop_per_s(double flops, double ms) {
  return ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0;
}

// How many copies of the inputs (q, out and one KV layer each) rotate so that one pass over all of
// them touches at least `rotate_bytes`: ceil(rotate_bytes / attention_bytes), clamped to
// [1, max_copies]. Example: 768 MiB over a 16.8 MB case -> 48 copies.
inline int rotation_copies(const BenchCase& c, double rotate_bytes, int max_copies) {
  const double per_copy = attention_bytes(c);
  if (per_copy <= 0) return 1;
  // Clamp in double before converting so that huge ratios cannot overflow int.
  const double needed = std::ceil(rotate_bytes / per_copy);
  if (needed >= static_cast<double>(max_copies)) return max_copies;
  return needed < 1.0 ? 1 : static_cast<int>(needed);
}

// Median of a sample (the mean of the two middle values for an even count); 0 when empty.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  const double hi = v[mid];
  if (v.size() % 2 == 1) return hi;
  const double lo = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid));
  return 0.5 * (lo + hi);
}

}  // namespace attnkit::bench
