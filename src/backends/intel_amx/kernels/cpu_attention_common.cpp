// ISA-independent pieces of the intel_amx kernels: scratch layouts, query loading, the softmax
// epilogue (sinks, value scale, LSE) and the split-KV merge. Compiled for the baseline x86-64 ISA.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "backends/intel_amx/kernels/cpu_attention_params.h"
#include "backends/intel_amx/kernels/storage_types.h"

namespace attnkit::cpu_attention {
namespace {

// Floats per 64-byte cache line: every scratch piece starts on its own line.
constexpr int64_t kLineFloats = 16;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Appends a piece of `floats` floats to a layout cursor and returns its offset.
int64_t take(int64_t* cursor, int64_t floats) {
  const int64_t offset = *cursor;
  *cursor += round_up(floats, kLineFloats);
  return offset;
}

// Softmax denominator pieces in log2 units: (max, sum) -> with the sink of head hq folded in.
void fold_sink(const CpuAttentionParams& p, int hq, float* m, float* l, float* rescale) {
  *rescale = 1.f;
  if (p.sinks == nullptr) return;
  const float sink = p.sinks[hq] * kLog2e;
  // A -inf sink is no sink (exp2(-inf - -inf) was NaN for a row that sees no key).
  if (sink == kNegInf) return;
  const float m_new = std::max(*m, sink);
  *rescale = *m == kNegInf ? 0.f : std::exp2(*m - m_new);
  *l = *l * *rescale + std::exp2(sink - m_new);
  *m = m_new;
}

// f32 -> bf16 bits, round to nearest even (NaN stays NaN: its payload keeps a mantissa bit).
inline uint16_t bf16_bits_rne(float x) {
  constexpr uint32_t kRoundBias = 0x7FFF;
  constexpr uint32_t kNanBits = 0x7FC0;
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  if (std::isnan(x)) return static_cast<uint16_t>(kNanBits);
  return static_cast<uint16_t>((u + kRoundBias + ((u >> 16) & 1)) >> 16);
}

void store_row(const CpuAttentionParams& p, int token, int hq, const float* acc, float factor,
               float lse) {
  const int64_t base = token * p.out_token_stride + hq * p.out_head_stride;
  const int dv = p.v_head_dim;
  switch (p.act_dtype) {
    case DType::kBF16: {
      uint16_t* dst = static_cast<uint16_t*>(p.out) + base;
      for (int d = 0; d < dv; ++d) dst[d] = bf16_bits_rne(acc[d] * factor);
      break;
    }
    case DType::kF32: {
      float* dst = static_cast<float*>(p.out) + base;
      for (int d = 0; d < dv; ++d) dst[d] = acc[d] * factor;
      break;
    }
    default:
      for (int d = 0; d < dv; ++d) store_from_float(p.out, p.act_dtype, base + d, acc[d] * factor);
      break;
  }
  if (p.lse != nullptr) p.lse[token * p.lse_token_stride + hq * p.lse_head_stride] = lse;
}

}  // namespace

VectorScratchLayout vector_scratch_layout(int group, int head_dim, int v_head_dim) {
  VectorScratchLayout lay;
  int64_t cursor = 0;
  lay.q = take(&cursor, static_cast<int64_t>(group) * head_dim);
  lay.q_bf16 = take(&cursor, static_cast<int64_t>(group) * head_dim / 2);
  lay.acc = take(&cursor, static_cast<int64_t>(group) * v_head_dim);
  lay.scores = take(&cursor, static_cast<int64_t>(group) * kKeyBlock);
  lay.m = take(&cursor, group);
  lay.l = take(&cursor, group);
  lay.alpha = take(&cursor, group);
  lay.dots = take(&cursor, static_cast<int64_t>(group) * kKeyBlock * kLineFloats);
  lay.total = cursor;
  return lay;
}

AmxScratchLayout amx_scratch_layout(int head_dim, int v_head_dim) {
  // Q . K^T and P . V run on pairs of 16 x 16 result tiles: the depth of Q rows and the width of
  // V rows are both padded to 32 bf16 (one 64-byte tile row).
  constexpr int64_t kTileDepth = 32;  // bf16 elements along K in one tile row of 64 bytes
  constexpr int64_t kPairRows = 32;   // rows of the two row tiles that share each K/V tile load
  const int64_t dp = round_up(head_dim, kTileDepth);
  const int64_t dvp = round_up(v_head_dim, kTileDepth);
  AmxScratchLayout lay;
  int64_t cursor = 0;
  // bf16 pieces take half as many floats as elements.
  lay.q = take(&cursor, kAmxRowsPerItem * dp / 2);
  lay.k_stage = take(&cursor, kAmxKeyBlock * dp / 2);
  lay.k_packed = take(&cursor, kAmxKeyBlock * dp / 2);
  lay.v_stage = take(&cursor, kAmxKeyBlock * dvp / 2);
  lay.v_packed = take(&cursor, kAmxKeyBlock * dvp / 2);
  lay.s = take(&cursor, 2 * kPairRows * kAmxMaxKeyBlock);  // double-buffered
  lay.p = take(&cursor, kAmxRowsPerItem * kAmxPvKeys / 2);
  lay.o = take(&cursor, kAmxRowsPerItem * dvp);
  lay.m = take(&cursor, kAmxRowsPerItem);
  lay.l = take(&cursor, kAmxRowsPerItem);
  lay.total = cursor;
  return lay;
}

int64_t amx_packed_block_elems(int head_dim, int v_head_dim) {
  constexpr int64_t kTileDepth = 32;
  return kAmxKeyBlock * (round_up(head_dim, kTileDepth) + round_up(v_head_dim, kTileDepth));
}

void load_query_rows(const CpuAttentionParams& p, int token, int hq0, int n, float* q,
                     uint16_t* q_bf16) {
  for (int j = 0; j < n; ++j) {
    const int64_t base = token * p.q_token_stride + (hq0 + j) * p.q_head_stride;
    for (int d = 0; d < p.head_dim; ++d) {
      q[j * p.head_dim + d] = load_as_float(p.q, p.act_dtype, base + d);
    }
    if (q_bf16 != nullptr) {
      const uint16_t* src = static_cast<const uint16_t*>(p.q) + base;
      std::copy(src, src + p.head_dim, q_bf16 + j * p.head_dim);
    }
  }
}

void row_epilogue(const CpuAttentionParams& p, int hq, float m, float l, float* factor,
                  float* lse) {
  float rescale = 1.f;
  fold_sink(p, hq, &m, &l, &rescale);
  if (l == 0.f) {
    *factor = 0.f;
    *lse = kNegInf;
    return;
  }
  *factor = rescale * p.value_scale / l;
  *lse = (m + std::log2(l)) * kLn2;
}

void finalize_rows(const CpuAttentionParams& p, int token, int hq0, int n, const float* m,
                   const float* l, const float* acc, int64_t acc_stride) {
  for (int j = 0; j < n; ++j) {
    float factor = 0.f;
    float lse = 0.f;
    row_epilogue(p, hq0 + j, m[j], l[j], &factor, &lse);
    store_row(p, token, hq0 + j, acc + j * acc_stride, factor, lse);
  }
}

void merge_decode_partials(const CpuAttentionParams& p, const DecodeWork& w, int num_threads) {
  const int group = p.group();
  const int dv = p.v_head_dim;
  const std::vector<DecodeMerge>& merges = *w.merges;
  const int num_merges = static_cast<int>(merges.size());
#pragma omp parallel for schedule(static) num_threads(num_threads)
  for (int i = 0; i < num_merges; ++i) {
    const DecodeMerge& mg = merges[i];
    const CpuRequest& rq = (*w.requests)[mg.request];
    for (int g = 0; g < group; ++g) {
      const int hq = mg.kv_head * group + g;
      float m = kNegInf;
      for (int s = 0; s < mg.num_partials; ++s) {
        m = std::max(m, w.partial_lse[static_cast<int64_t>(mg.partial_begin + s) * group + g]);
      }
      float l = 0.f;
      float out[kMaxHeadDim] = {};
      for (int s = 0; s < mg.num_partials; ++s) {
        const int64_t part = mg.partial_begin + s;
        const float lse = w.partial_lse[part * group + g];
        if (lse == kNegInf) continue;
        const float weight = std::exp2(lse - m);
        l += weight;
        const float* po = w.partial_out + (part * group + g) * dv;
        for (int d = 0; d < dv; ++d) out[d] += weight * po[d];
      }
      float rescale = 1.f;
      fold_sink(p, hq, &m, &l, &rescale);
      if (l == 0.f) {
        store_row(p, rq.q_start, hq, out, 0.f, kNegInf);
        continue;
      }
      store_row(p, rq.q_start, hq, out, rescale * p.value_scale / l, (m + std::log2(l)) * kLn2);
    }
  }
}

}  // namespace attnkit::cpu_attention
