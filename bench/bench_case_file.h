// Benchmark case files (bench/cases/*.json): a sweep description expanded into BenchCase points.
//
//   {
//     "kind": "decode",                       // decode | extend | mla_decode
//     "description": "free text",
//     "fixed": {"q_heads": 32, "kv_heads": 8},  // applied to every point
//     "sweep": {                               // cartesian product, first key outermost
//       "batch": [1, 16], "kv_len": [1024, 4096], "page_size": [1, 16, 64],
//       "heads": [[32, 8], [32, 32]],          // [q_heads, kv_heads] pairs (GQA sweeps)
//       "head_dim": [128], "kv_dtype": ["bf16", "fp8_e4m3"]
//     },
//     "cases": [{"batch": 1, "kv_len": 16384}]  // optional explicit points (merged over "fixed")
//   }
//
// Parameters: batch, page_size, dtype (q/k/v/out: f32, f16, bf16), kv_dtype (bf16, f16, f32,
// fp8_e4m3, fp8_e5m2, fp4_e2m1, auto = dtype), q_heads, kv_heads, heads, head_dim, v_head_dim
// (default head_dim); decode and mla_decode: kv_len, or kv_lens (one length per request, for
// uneven batches: batch = its size, kv_len = its longest; "batch" may be given only if equal,
// "kv_len" not with it; in a sweep each value is a list, e.g. "kv_lens": [[4096, 128, 128]]);
// extend: prefix_len (default 0), or prefix_lens (one cached length per request, for uneven
// batches, as kv_lens: batch = its size, prefix_len = its longest; named "_pre<lo>-<hi>_sum<sum>_
// <hash>"), new_tokens, or new_lens (one new-token count per request, as prefix_lens: batch = its
// size, new_tokens = its largest, prefix_lens of the same size when both are given; named
// "_new<lo>-<hi>_sum<sum>_<hash>"), mixed (default false: true runs the batch as
// ForwardMode::kMixed, a chunked prefill with decode requests, "_mixed"), causal (default true),
// mla (default false: a
// non-absorbed MLA prefill layer, "_mla": head_dim / v_head_dim 192 / 128 as given, kv_heads =
// q_heads, no prefix unless mla_prefix_chunk, kv_lora_rank / qk_rope_head_dim of its pool default
// 512 / 64), mla_prefix_chunk (mla only, default 0: the chunked prefix cache's token budget per
// chunk, required with a prefix_len, "_pc<n>"), fp8_q (default
// false: q in fp8_e4m3 with a per-layer scale, the case named with "_qfp8"), sliding_window
// (default -1: off;
// "_win<w>"), logit_cap (default 0: off; "_cap<c>"), sinks (default false; "_sinks"); decode and
// extend: shared_prefix (default 0: leading tokens shared by every request, a multiple of
// page_size); decode and mla_decode: s_q (default 1; > 1: a speculative verify step, TARGET_VERIFY,
// of s_q draft tokens ending at kv_len, "_sq<s_q>") and topk (default 1: the drafts form a chain; >
// 1: a tree with its mask, "_topk<k>"; needs s_q > 1); mla_decode: kv_lora_rank (default 512),
// qk_rope_head_dim (default 64), no kv_heads / head_dim / v_head_dim (they follow from the
// rank); every kind: shuffle_pages (default true: the pool's pages and request
// rows in random order, as a serving pool's are after churn; false: each request's pages in
// order, the case named with "_inorder"). Errors name the file, the key and what is accepted. Each
// point once (two points of one name are refused), each key once per object; a file is a regular
// file of at most kMaxCaseFileBytes.
//
// Header-only so that tests/unit/test_bench_formulas.cpp can check the parser without the CLI.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/dtype.h"
#include "attnkit/status.h"
#include "bench_formulas.h"
#include "bench_json.h"
#include "harness/case_runner.h"

namespace attnkit::bench {

struct CaseFile {
  std::string source;  // path or "<inline>"
  BenchKind kind = BenchKind::kDecode;
  std::string description;
  std::vector<BenchCase> cases;
};

namespace case_file_detail {

using Json = nlohmann::ordered_json;

inline Result<BenchKind> parse_kind(std::string_view s) {
  if (s == "decode") return BenchKind::kDecode;
  if (s == "extend") return BenchKind::kExtend;
  if (s == "mla_decode") return BenchKind::kMlaDecode;
  return Status::invalid_argument("kind \"" + std::string(s) +
                                  "\" is not a benchmark kind (decode, extend, mla_decode)");
}

inline bool key_allowed(BenchKind kind, const std::string& key) {
  static const char* const kCommon[] = {"batch",    "page_size", "dtype",
                                        "kv_dtype", "q_heads",   "shuffle_pages"};
  for (const char* k : kCommon) {
    if (key == k) return true;
  }
  switch (kind) {
    case BenchKind::kDecode:
      return key == "kv_heads" || key == "heads" || key == "head_dim" || key == "v_head_dim" ||
             key == "kv_len" || key == "kv_lens" || key == "shared_prefix" || key == "s_q" ||
             key == "topk";
    case BenchKind::kExtend:
      return key == "kv_heads" || key == "heads" || key == "head_dim" || key == "v_head_dim" ||
             key == "prefix_len" || key == "prefix_lens" || key == "new_tokens" ||
             key == "new_lens" || key == "mixed" || key == "causal" || key == "shared_prefix" ||
             key == "fp8_q" || key == "sliding_window" || key == "logit_cap" || key == "sinks" ||
             key == "mla" || key == "kv_lora_rank" || key == "qk_rope_head_dim" ||
             key == "mla_prefix_chunk";
    case BenchKind::kMlaDecode:
      return key == "kv_len" || key == "kv_lens" || key == "kv_lora_rank" ||
             key == "qk_rope_head_dim" || key == "s_q" || key == "topk";
  }
  return false;
}

inline const char* allowed_keys(BenchKind kind) {
  switch (kind) {
    case BenchKind::kDecode:
      return "batch, page_size, dtype, kv_dtype, q_heads, kv_heads, heads, head_dim, v_head_dim, "
             "kv_len, kv_lens, shared_prefix, s_q, topk, shuffle_pages";
    case BenchKind::kExtend:
      return "batch, page_size, dtype, kv_dtype, q_heads, kv_heads, heads, head_dim, v_head_dim, "
             "prefix_len, prefix_lens, new_tokens, new_lens, mixed, causal, shared_prefix, fp8_q, "
             "sliding_window, logit_cap, sinks, mla, kv_lora_rank, qk_rope_head_dim, "
             "mla_prefix_chunk, shuffle_pages";
    case BenchKind::kMlaDecode:
      return "batch, page_size, dtype, kv_dtype, q_heads, kv_len, kv_lens, kv_lora_rank, "
             "qk_rope_head_dim, s_q, topk, shuffle_pages";
  }
  return "";
}

// Integer parameter >= min_value.
inline Status get_int(const Json& v, const std::string& where, int min_value, int* out,
                      int max_value = INT32_MAX) {
  if (!v.is_number_integer()) {
    return Status::invalid_argument(where + ": expected an integer >= " +
                                    std::to_string(min_value) + ", got " + json_excerpt(v));
  }
  // Unsigned values past INT64_MAX would wrap negative as int64 (2^64 - 1 -> -1).
  const bool huge = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT32_MAX);
  const int64_t x = huge ? int64_t{INT32_MAX} + 1 : v.get<int64_t>();
  if (x < min_value || x > max_value) {
    return Status::invalid_argument(where + ": " + json_excerpt(v) +
                                    " is out of range (accepted: " + std::to_string(min_value) +
                                    " to " + std::to_string(max_value) + ")");
  }
  *out = static_cast<int>(x);
  return Status::ok();
}

// Boolean parameter (true / false only).
inline Status get_bool(const Json& v, const std::string& where, bool* out) {
  if (!v.is_boolean()) {
    return Status::invalid_argument(where + ": expected true or false, got " + json_excerpt(v));
  }
  *out = v.get<bool>();
  return Status::ok();
}

// What a point's assignments said beyond the BenchCase fields.
struct ParseState {
  bool v_head_dim_set = false;  // else v_head_dim = head_dim
  bool kv_dtype_auto = false;   // kv_dtype "auto": the activation dtype, resolved at the end
  bool kv_dtype_set = false;    // kv_dtype given (mla cases default it to the activation dtype)
  bool batch_set = false;       // "batch" given (checked against kv_lens)
  bool kv_len_set = false;      // "kv_len" given (exclusive with kv_lens)
  bool prefix_len_set = false;  // "prefix_len" given (exclusive with prefix_lens)
  bool new_tokens_set = false;  // "new_tokens" given (exclusive with new_lens)
};

// The most requests a case-file point may hold: far above any serving batch, and small enough that
// its per-request lengths are built before the harness's memory guard sees the point.
inline constexpr int kMaxCaseFileBatch = 1 << 20;

// Sets one parameter of `c` from a JSON value; `where` names it for messages ("sweep.batch[2]").
inline Status apply_param(BenchCase* c, ParseState* state, const std::string& key, const Json& v,
                          const std::string& where) {
  if (key == "batch") {
    state->batch_set = true;
    // Bounded before the point's per-request vectors are built (2^31 requests took 16 GiB).
    return get_int(v, where, 1, &c->batch, kMaxCaseFileBatch);
  }
  if (key == "page_size") return get_int(v, where, 1, &c->page_size, harness::kMaxCasePageSize);
  if (key == "q_heads") return get_int(v, where, 1, &c->q_heads);
  if (key == "kv_heads") return get_int(v, where, 1, &c->kv_heads);
  if (key == "head_dim") return get_int(v, where, 1, &c->head_dim);
  if (key == "kv_len") {
    state->kv_len_set = true;
    return get_int(v, where, 1, &c->kv_len);
  }
  if (key == "kv_lens" || key == "prefix_lens" || key == "new_lens") {
    const bool prefix = key == "prefix_lens";
    const char* what = key == "kv_lens" ? "sequence lengths"
                       : prefix         ? "cached prefix lengths"
                                        : "new-token counts";
    if (!v.is_array() || v.empty()) {
      return Status::invalid_argument(where + ": expected a non-empty list of " + what +
                                      " (one per request), got " + json_excerpt(v));
    }
    std::vector<int>& lens = key == "kv_lens" ? c->kv_lens : prefix ? c->prefix_lens : c->new_lens;
    lens.assign(v.size(), 0);
    for (size_t i = 0; i < v.size(); ++i) {
      ATTNKIT_RETURN_IF_ERROR(
          get_int(v[i], where + "[" + std::to_string(i) + "]", prefix ? 0 : 1, &lens[i]));
    }
    return Status::ok();
  }
  if (key == "prefix_len") {
    state->prefix_len_set = true;
    return get_int(v, where, 0, &c->prefix_len);
  }
  if (key == "shared_prefix") return get_int(v, where, 0, &c->shared_prefix);
  if (key == "shuffle_pages") return get_bool(v, where, &c->shuffle_pages);
  if (key == "new_tokens") {
    state->new_tokens_set = true;
    return get_int(v, where, 1, &c->new_tokens);
  }
  if (key == "mixed") return get_bool(v, where, &c->mixed);
  if (key == "kv_lora_rank") return get_int(v, where, 1, &c->kv_lora_rank);
  if (key == "qk_rope_head_dim") return get_int(v, where, 1, &c->qk_rope_head_dim);
  if (key == "s_q") return get_int(v, where, 1, &c->s_q);
  if (key == "topk") return get_int(v, where, 1, &c->topk);
  if (key == "v_head_dim") {
    state->v_head_dim_set = true;
    return get_int(v, where, 1, &c->v_head_dim);
  }
  if (key == "heads") {
    if (!v.is_array() || v.size() != 2) {
      return Status::invalid_argument(where + ": expected a [q_heads, kv_heads] pair, got " +
                                      json_excerpt(v));
    }
    ATTNKIT_RETURN_IF_ERROR(get_int(v[0], where + "[0] (q_heads)", 1, &c->q_heads));
    return get_int(v[1], where + "[1] (kv_heads)", 1, &c->kv_heads);
  }
  if (key == "causal") return get_bool(v, where, &c->causal);
  if (key == "mla") return get_bool(v, where, &c->mla_prefill);
  if (key == "mla_prefix_chunk") return get_int(v, where, 1, &c->mla_prefix_chunk);
  if (key == "fp8_q") return get_bool(v, where, &c->fp8_q);
  if (key == "sliding_window") return get_int(v, where, -1, &c->sliding_window);
  if (key == "sinks") return get_bool(v, where, &c->sinks);
  if (key == "logit_cap") {
    switch (logit_cap_from_json(v, &c->logit_cap)) {
      case LogitCapJson::kNotACap:
        return Status::invalid_argument(where + ": expected a finite number >= 0 (0 = off), got " +
                                        json_excerpt(v));
      case LogitCapJson::kRoundsToZero:
        return Status::invalid_argument(where + ": " + json_excerpt(v) +
                                        " rounds to 0 in f32 (a soft-cap needs a cap of at least " +
                                        "the smallest f32; 0 = off)");
      case LogitCapJson::kOk:
        break;
    }
    return Status::ok();
  }
  if (key == "dtype" || key == "kv_dtype") {
    if (!v.is_string()) {
      return Status::invalid_argument(where + ": expected a dtype name string, got " +
                                      json_excerpt(v));
    }
    const std::string name = v.get<std::string>();
    if (key == "kv_dtype") state->kv_dtype_auto = name == "auto";
    if (key == "kv_dtype") state->kv_dtype_set = true;
    if (key == "kv_dtype" && name == "auto") return Status::ok();
    Result<DType> d = parse_dtype(name);
    const bool ok_act = d.is_ok() && dtype_is_activation(*d);
    const bool ok_kv = d.is_ok() && dtype_is_float(*d);
    if (key == "dtype" && !ok_act) {
      return Status::invalid_argument(where + ": \"" + name +
                                      "\" is not an activation dtype (f32, f16, bf16)");
    }
    if (key == "kv_dtype" && !ok_kv) {
      return Status::invalid_argument(
          where + ": \"" + name +
          "\" is not a KV dtype (auto, bf16, f16, f32, fp8_e4m3, fp8_e5m2, fp4_e2m1)");
    }
    (key == "dtype" ? c->dtype : c->kv_dtype) = *d;
    return Status::ok();
  }
  return Status::internal(where + ": parameter has no handler");
}

inline std::string case_name(const BenchCase& c) {
  std::ostringstream s;
  s << bench_kind_name(c.kind) << "_b" << c.batch;
  // Uneven batch: the length range, the total and the 32-bit FNV-1a hash of the list (two lists
  // with the same range and total still get different names; load_case_file refuses the rare
  // two whose hashes match as well).
  const auto uneven = [&s](const std::vector<int>& lens) {
    int lo = lens[0], hi = lens[0];
    int64_t sum = 0;
    uint32_t h = 2166136261u;
    for (int len : lens) {
      lo = std::min(lo, len);
      hi = std::max(hi, len);
      sum += len;
      h = (h ^ static_cast<uint32_t>(len)) * 16777619u;
    }
    s << lo << "-" << hi << "_sum" << sum << "_" << std::hex << h << std::dec;
  };
  if (c.kind == BenchKind::kExtend) {
    s << "_pre";
    if (c.prefix_lens.empty()) {
      s << c.prefix_len;
    } else {
      uneven(c.prefix_lens);
    }
    s << "_new";
    if (c.new_lens.empty()) {
      s << c.new_tokens;
    } else {
      uneven(c.new_lens);
    }
  } else if (!c.kv_lens.empty()) {
    s << "_kv";
    uneven(c.kv_lens);
  } else {
    s << "_kv" << c.kv_len;
  }
  if (c.s_q > 1) s << "_sq" << c.s_q;
  if (c.topk > 1) s << "_topk" << c.topk;
  s << "_p" << c.page_size << "_h" << c.q_heads;
  if (c.kind != BenchKind::kMlaDecode) s << "x" << c.kv_heads;
  s << "_d" << c.head_dim;
  if (c.v_head_dim != c.head_dim) s << "v" << c.v_head_dim;
  if (c.mla_prefill) s << "_mla";
  if (c.mla_prefix_chunk > 0) s << "_pc" << c.mla_prefix_chunk;
  s << "_kv" << dtype_name(c.kv_dtype);
  if (c.dtype != DType::kBF16) s << "_act" << dtype_name(c.dtype);
  if (c.kind == BenchKind::kExtend && !c.causal) s << "_bidir";
  if (c.mixed) s << "_mixed";
  if (c.fp8_q) s << "_qfp8";
  if (c.sliding_window >= 0) s << "_win" << c.sliding_window;
  if (c.logit_cap > 0.f) s << "_cap" << c.logit_cap;
  if (c.sinks) s << "_sinks";
  if (c.shared_prefix > 0) s << "_shared" << c.shared_prefix;
  if (!c.shuffle_pages) s << "_inorder";
  return s.str();
}

// An uneven batch's list (`list`: kv_lens, prefix_lens or new_lens; `single` the one-value key it
// replaces): exclusive with that key (single_set), batch its size (a given batch must match),
// *longest its largest value.
inline Status take_uneven_lens(BenchCase* c, const std::vector<int>& lens, bool single_set,
                               const std::string& single, const std::string& list,
                               const std::string& what, const ParseState& state,
                               const std::string& where, int* longest) {
  const int n = static_cast<int>(lens.size());
  if (single_set) {
    return Status::invalid_argument(where + ": \"" + single + "\" and \"" + list +
                                    "\" are exclusive (" + list + " gives every request's " + what +
                                    "; its longest becomes " + single + ")");
  }
  // The list names the batch: it has batch's bound (a list of 2 million lengths ran unchecked).
  if (lens.size() > static_cast<size_t>(kMaxCaseFileBatch)) {
    return Status::invalid_argument(where + ": " + list + " has " + std::to_string(lens.size()) +
                                    " lengths, one per request: out of range (accepted: 1 to " +
                                    std::to_string(kMaxCaseFileBatch) + " requests, as batch)");
  }
  if (state.batch_set && c->batch != n) {
    return Status::invalid_argument(where + ": batch " + std::to_string(c->batch) +
                                    " does not match the " + std::to_string(n) + " lengths of " +
                                    list + " (batch may be left out)");
  }
  c->batch = n;
  *longest = *std::max_element(lens.begin(), lens.end());
  return Status::ok();
}

// Checks a fully assigned point and fills derived fields.
inline Status finish_case(BenchCase* c, const ParseState& state, const std::string& where) {
  if (state.kv_dtype_auto) c->kv_dtype = c->dtype;
  if (!c->prefix_lens.empty()) {
    ATTNKIT_RETURN_IF_ERROR(take_uneven_lens(c, c->prefix_lens, state.prefix_len_set, "prefix_len",
                                             "prefix_lens", "cached length", state, where,
                                             &c->prefix_len));
  }
  if (!c->new_lens.empty()) {
    if (!c->prefix_lens.empty() && c->prefix_lens.size() != c->new_lens.size()) {
      return Status::invalid_argument(
          where + ": new_lens has " + std::to_string(c->new_lens.size()) + " counts, prefix_lens " +
          std::to_string(c->prefix_lens.size()) + " lengths (one of each per request)");
    }
    ATTNKIT_RETURN_IF_ERROR(take_uneven_lens(c, c->new_lens, state.new_tokens_set, "new_tokens",
                                             "new_lens", "new-token count", state, where,
                                             &c->new_tokens));
  }
  if (c->kind == BenchKind::kMlaDecode) {
    if (int64_t{c->kv_lora_rank} + c->qk_rope_head_dim > INT32_MAX) {
      return Status::invalid_argument(where + ": kv_lora_rank " + std::to_string(c->kv_lora_rank) +
                                      " + qk_rope_head_dim " + std::to_string(c->qk_rope_head_dim) +
                                      " exceeds " + std::to_string(INT32_MAX));
    }
    c->kv_heads = 1;
    c->head_dim = c->kv_lora_rank + c->qk_rope_head_dim;
    c->v_head_dim = c->kv_lora_rank;
  } else if (!state.v_head_dim_set) {
    c->v_head_dim = c->head_dim;
  }
  if (c->kind == BenchKind::kExtend && c->mla_prefill) {
    // The non-absorbed layer: one K / V head per q head, no cached prefix, k / v in the
    // activation dtype; the latent row only sizes the pool.
    if (c->kv_heads != 0 && c->kv_heads != c->q_heads) {
      return Status::invalid_argument(where + ": mla: kv_heads " + std::to_string(c->kv_heads) +
                                      " must equal q_heads " + std::to_string(c->q_heads) +
                                      " (or be left out)");
    }
    c->kv_heads = c->q_heads;
    if ((c->prefix_len != 0) != (c->mla_prefix_chunk > 0) || c->shared_prefix != 0 || c->fp8_q ||
        c->mixed) {
      return Status::invalid_argument(
          where +
          ": mla: a prefix_len needs mla_prefix_chunk (the chunked prefix cache) and "
          "mla_prefix_chunk a prefix_len; shared_prefix must be 0, fp8_q and mixed false");
    }
    if (!state.kv_dtype_set) c->kv_dtype = c->dtype;  // k / v are activations
    if (c->kv_dtype != c->dtype) {
      return Status::invalid_argument(where + ": mla: kv_dtype must be the activation dtype");
    }
    if (c->sliding_window >= 0 || c->logit_cap > 0.f || c->sinks) {
      return Status::invalid_argument(
          where +
          ": mla: no sliding_window / logit_cap / sinks (the MLA prefill cases time the "
          "plain layer)");
    }
    if (c->kv_lora_rank == 0) c->kv_lora_rank = 512;
    if (c->qk_rope_head_dim == 0) c->qk_rope_head_dim = 64;
  } else if (c->kind == BenchKind::kExtend &&
             (c->kv_lora_rank != 0 || c->qk_rope_head_dim != 0 || c->mla_prefix_chunk != 0)) {
    return Status::invalid_argument(where +
                                    ": kv_lora_rank / qk_rope_head_dim / mla_prefix_chunk need "
                                    "\"mla\": true");
  }
  auto missing = [&](const char* key) {
    return Status::invalid_argument(where + ": \"" + key + "\" is required for kind " +
                                    bench_kind_name(c->kind) +
                                    " (set it in fixed, sweep or cases)");
  };
  if (c->q_heads == 0) return missing("q_heads");
  if (c->kind != BenchKind::kMlaDecode) {
    if (c->kv_heads == 0) return missing("kv_heads");
    if (c->head_dim == 0) return missing("head_dim");
    if (c->q_heads % c->kv_heads != 0) {
      return Status::invalid_argument(where + ": q_heads " + std::to_string(c->q_heads) +
                                      " is not a multiple of kv_heads " +
                                      std::to_string(c->kv_heads));
    }
  }
  if (!c->kv_lens.empty()) {
    ATTNKIT_RETURN_IF_ERROR(take_uneven_lens(c, c->kv_lens, state.kv_len_set, "kv_len", "kv_lens",
                                             "length", state, where, &c->kv_len));
    if (c->kind != BenchKind::kExtend) {
      const int shortest = *std::min_element(c->kv_lens.begin(), c->kv_lens.end());
      if (c->s_q > shortest) {
        return Status::invalid_argument(where + ": s_q " + std::to_string(c->s_q) +
                                        " exceeds the shortest of kv_lens (" +
                                        std::to_string(shortest) + ")");
      }
    }
  }
  if (c->kind == BenchKind::kExtend) {
    if (c->new_tokens == 0) return missing("new_tokens");
  } else if (c->kv_len == 0) {
    return missing("kv_len");
  }
  if (c->kind != BenchKind::kExtend && c->s_q > c->kv_len) {
    return Status::invalid_argument(where + ": s_q " + std::to_string(c->s_q) + " exceeds kv_len " +
                                    std::to_string(c->kv_len));
  }
  if (c->topk > 1 && c->s_q == 1) {
    return Status::invalid_argument(where + ": topk " + std::to_string(c->topk) +
                                    " needs s_q > 1 (the draft tree of a verify step; s_q 1 is a "
                                    "plain decode)");
  }
  c->name = case_name(*c);
  return Status::ok();
}

}  // namespace case_file_detail

// The most points one file's sweep may expand to (bench/cases' largest has a few dozen).
inline constexpr uint64_t kMaxSweepPoints = 100000;
// The most per-request list entries (kv_lens, prefix_lens, new_lens) all of a file's points may
// hold together: every point copies the lists of "fixed", so a long list swept over many points
// would otherwise exhaust memory (4 bytes an entry) before any point ran.
inline constexpr uint64_t kMaxListEntries = uint64_t{1} << 24;

namespace case_file_detail {
// Adds c's list entries to *total; an error naming `where` past kMaxListEntries.
inline Status count_list_entries(const BenchCase& c, const std::string& source,
                                 const std::string& where, uint64_t* total) {
  *total += c.kv_lens.size() + c.prefix_lens.size() + c.new_lens.size();
  if (*total <= kMaxListEntries) return Status::ok();
  return Status::invalid_argument(
      source + ": the points hold more than " + std::to_string(kMaxListEntries) +
      " per-request list entries (kv_lens / prefix_lens / new_lens) together, reached at " + where +
      "; use fewer points or shorter lists (a point's batch is its list's length)");
}
}  // namespace case_file_detail

// Parses a case file's text; `source` names it in messages.
inline Result<CaseFile> parse_case_file_text(const std::string& text, const std::string& source) {
  using case_file_detail::Json;
  Json root;
  ATTNKIT_RETURN_IF_ERROR(parse_json_text(text, source, &root));
  if (!root.is_object()) {
    return Status::invalid_argument(source + ": expected a JSON object at the top level");
  }
  CaseFile file;
  file.source = source;
  for (const auto& [key, value] : root.items()) {
    if (key != "kind" && key != "description" && key != "fixed" && key != "sweep" &&
        key != "cases") {
      return Status::invalid_argument(source + ": unknown top-level key \"" + key +
                                      "\" (accepted: kind, description, fixed, sweep, cases)");
    }
  }
  if (!root.contains("kind") || !root["kind"].is_string()) {
    return Status::invalid_argument(source +
                                    ": \"kind\" must be a string (decode, extend, mla_decode)");
  }
  Result<BenchKind> kind = case_file_detail::parse_kind(root["kind"].get<std::string>());
  if (!kind) return Status::invalid_argument(source + ": " + kind.status().message());
  file.kind = *kind;
  if (root.contains("description")) {
    if (!root["description"].is_string()) {
      return Status::invalid_argument(source + ": \"description\" must be a string, got " +
                                      json_excerpt(root["description"]));
    }
    file.description = root["description"].get<std::string>();
  }
  if (!root.contains("sweep") && !root.contains("cases")) {
    return Status::invalid_argument(source + ": needs \"sweep\" or \"cases\" (or both)");
  }

  BenchCase base;
  base.kind = file.kind;
  if (file.kind == BenchKind::kMlaDecode) {
    base.kv_lora_rank = 512;
    base.qk_rope_head_dim = 64;
  }
  case_file_detail::ParseState base_state;
  std::vector<std::string> origins;  // per case: "sweep point {...}" or "cases[i]"
  auto check_object = [&](const Json& obj, const std::string& where) -> Status {
    if (!obj.is_object()) {
      return Status::invalid_argument(source + ": " + where + ": expected an object, got " +
                                      json_excerpt(obj));
    }
    for (const auto& [key, value] : obj.items()) {
      if (!case_file_detail::key_allowed(file.kind, key)) {
        return Status::invalid_argument(
            source + ": " + where + "." + key + ": unknown parameter for kind " +
            bench_kind_name(file.kind) +
            " (accepted: " + case_file_detail::allowed_keys(file.kind) + ")");
      }
    }
    // Within one object the last of them would win silently (a later object may override an
    // earlier one's, as a case does "fixed").
    for (const char* one : {"q_heads", "kv_heads"}) {
      if (obj.contains("heads") && obj.contains(one)) {
        return Status::invalid_argument(source + ": " + where + ": \"heads\" and \"" + one +
                                        "\" are exclusive in one object (heads gives the "
                                        "[q_heads, kv_heads] pair)");
      }
    }
    return Status::ok();
  };
  if (root.contains("fixed")) {
    ATTNKIT_RETURN_IF_ERROR(check_object(root["fixed"], "fixed"));
    for (const auto& [key, value] : root["fixed"].items()) {
      ATTNKIT_RETURN_IF_ERROR(
          case_file_detail::apply_param(&base, &base_state, key, value, source + ": fixed." + key));
    }
  }

  uint64_t entries = 0;  // count_list_entries over every point
  if (root.contains("sweep")) {
    const Json& sweep = root["sweep"];
    ATTNKIT_RETURN_IF_ERROR(check_object(sweep, "sweep"));
    std::vector<std::string> keys;
    uint64_t points = 1;
    for (const auto& [key, value] : sweep.items()) {
      if (!value.is_array() || value.empty()) {
        return Status::invalid_argument(source + ": sweep." + key +
                                        ": expected a non-empty array of values, got " +
                                        json_excerpt(value));
      }
      keys.push_back(key);
      // Counted before any point is built (at most kMaxSweepPoints x the next array's size, so
      // no overflow): 200 values in each of four keys would be 1.6 billion points.
      points *= value.size();
      if (points > kMaxSweepPoints) {
        return Status::invalid_argument(
            source + ": the sweep has more than " + std::to_string(kMaxSweepPoints) +
            " points (the product of its arrays' sizes, through sweep." + key +
            "); split it into several files or list the points under \"cases\"");
      }
    }
    // Odometer over the sweep keys; the last key varies fastest.
    std::vector<size_t> index(keys.size(), 0);
    bool done = false;
    while (!done) {
      BenchCase c = base;
      case_file_detail::ParseState state = base_state;
      std::string where = source + ": sweep point {";
      for (size_t k = 0; k < keys.size(); ++k) {
        where += (k ? ", " : "") + keys[k] + "=" + json_excerpt(sweep[keys[k]][index[k]]);
      }
      where += "}";
      for (size_t k = 0; k < keys.size(); ++k) {
        ATTNKIT_RETURN_IF_ERROR(case_file_detail::apply_param(
            &c, &state, keys[k], sweep[keys[k]][index[k]],
            source + ": sweep." + keys[k] + "[" + std::to_string(index[k]) + "]"));
      }
      ATTNKIT_RETURN_IF_ERROR(case_file_detail::finish_case(&c, state, where));
      ATTNKIT_RETURN_IF_ERROR(case_file_detail::count_list_entries(
          c, source, where.substr(source.size() + 2), &entries));
      file.cases.push_back(std::move(c));
      origins.push_back(where.substr(source.size() + 2));
      done = true;
      for (size_t k = keys.size(); k-- > 0;) {
        if (++index[k] < sweep[keys[k]].size()) {
          done = false;
          break;
        }
        index[k] = 0;
      }
    }
  }

  if (root.contains("cases")) {
    const Json& cases = root["cases"];
    if (!cases.is_array()) {
      return Status::invalid_argument(source + ": \"cases\" must be an array of objects");
    }
    for (size_t i = 0; i < cases.size(); ++i) {
      const std::string where = "cases[" + std::to_string(i) + "]";
      ATTNKIT_RETURN_IF_ERROR(check_object(cases[i], where));
      BenchCase c = base;
      case_file_detail::ParseState state = base_state;
      for (const auto& [key, value] : cases[i].items()) {
        ATTNKIT_RETURN_IF_ERROR(case_file_detail::apply_param(&c, &state, key, value,
                                                              source + ": " + where + "." + key));
      }
      ATTNKIT_RETURN_IF_ERROR(case_file_detail::finish_case(&c, state, source + ": " + where));
      ATTNKIT_RETURN_IF_ERROR(case_file_detail::count_list_entries(c, source, where, &entries));
      file.cases.push_back(std::move(c));
      origins.push_back(where);
    }
  }
  if (file.cases.empty()) {
    return Status::invalid_argument(source + ": the file describes no cases");
  }
  // The name is every parameter of a point (an uneven batch's list by its hash): two equal names
  // would run the same point twice and collide in the JSON / CSV rows.
  std::map<std::string, size_t> first;
  for (size_t i = 0; i < file.cases.size(); ++i) {
    const auto [at, fresh] = first.emplace(file.cases[i].name, i);
    if (fresh) continue;
    const BenchCase& a = file.cases[at->second];
    const BenchCase& b = file.cases[i];
    if (a.kv_lens != b.kv_lens || a.prefix_lens != b.prefix_lens) {
      return Status::invalid_argument(source + ": " + origins[i] + " and " + origins[at->second] +
                                      " are different uneven batches whose names match (" + b.name +
                                      ": the same range, total and list hash); change " +
                                      "one length of either");
    }
    return Status::invalid_argument(source + ": " + origins[i] + " repeats case " + b.name +
                                    " of " + origins[at->second] + " (each point once)");
  }
  return file;
}

// A case file is read whole; the largest in bench/cases is a few KiB.
inline constexpr int64_t kMaxCaseFileBytes = int64_t{16} << 20;

// Reads and parses a case file from disk: a regular file (a device such as /dev/zero or a FIFO
// would be read forever) of at most kMaxCaseFileBytes.
inline Result<CaseFile> load_case_file(const std::string& path) {
  if (path.empty()) {
    return Status::invalid_argument(
        "the case file path is empty (expected a JSON file such as bench/cases/decode.json)");
  }
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return Status::invalid_argument("case file " + path +
                                    " is a directory (expected a JSON file such as "
                                    "bench/cases/decode.json)");
  }
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec)) {
    return Status::invalid_argument("case file " + path +
                                    " is not a regular file (expected a JSON file such as "
                                    "bench/cases/decode.json)");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::not_found("case file " + path + " cannot be opened");
  // Read at most one byte past the cap: a regular file can still grow, or report size 0 (/proc).
  std::string text(static_cast<size_t>(kMaxCaseFileBytes) + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (static_cast<int64_t>(text.size()) > kMaxCaseFileBytes) {
    return Status::invalid_argument("case file " + path + " is larger than " +
                                    std::to_string(kMaxCaseFileBytes >> 20) +
                                    " MiB (a case file is a small JSON sweep description)");
  }
  return parse_case_file_text(text, path);
}

// Cases whose name contains `filter` (all when empty).
inline std::vector<BenchCase> filter_cases(const std::vector<BenchCase>& cases,
                                           std::string_view filter) {
  std::vector<BenchCase> out;
  for (const BenchCase& c : cases) {
    if (filter.empty() || c.name.find(filter) != std::string::npos) out.push_back(c);
  }
  return out;
}

}  // namespace attnkit::bench
