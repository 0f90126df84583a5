// The vector attention kernels (decode and the per-token extend), written once over an ISA traits
// type V (vec_scalar.h, vec_avx2.h, vec_avx512.h) and a KV storage tag S (storage_types.h).
//
// Include this only from a per-ISA translation unit, after its `#pragma GCC target` and its traits
// header: everything here has internal linkage, so each ISA gets its own copy and no inline
// function compiled for AVX-512 can be picked by the linker for a caller on an older CPU.
//
// Algorithm (one query token, the heads g of one GQA group, keys [k_begin, k_end)):
//   for each block of kKeyBlock keys (token rows read straight from the pool via req_to_token):
//     s[g][t] = log2(e) * cap(score_scale * q[g] . k[t])          (heads of the group share k[t])
//     m' = max(m, max_t s);  alpha = 2^(m - m');  p = 2^(s - m');  l = l * alpha + sum_t p
//     acc[g] = acc[g] * alpha + sum_t p[g][t] * v[t]
// Each K/V row is loaded once per block and used by every head of the group. With the bf16 pair
// dot product (kBf16Dot: AVX512-BF16, bf16 q, bf16 or fp8_e4m3 KV) q.k runs on bf16 pairs and
// p.v on (p[t], p[t + 1]) x (v[t][d], v[t + 1][d]) pairs, p rounded to bf16 (as on the AMX path).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "backends/intel_amx/kernels/cpu_attention_params.h"
#include "backends/intel_amx/kernels/storage_types.h"

#ifdef ATTNKIT_WITH_OPENMP
#include <omp.h>
#endif

namespace attnkit::cpu_attention {
namespace {

// Zeros standing in for a missing key row (the odd row of a block in pv_tile_pairs, the pair
// partner past n in qk_block_f32), any storage type.
alignas(64) constexpr float kZeroRow[kMaxHeadDim] = {};

// Heads of a GQA group whose dot products / accumulators are kept in registers together.
constexpr int kHeadTile = 4;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline int thread_id() {
#ifdef ATTNKIT_WITH_OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

struct VectorScratch {
  float* q;
  uint16_t* q_bf16;
  float* acc;
  float* scores;
  float* m;
  float* l;
  float* alpha;
};

inline VectorScratch carve_vector_scratch(const ThreadScratch& ts, int tid,
                                          const VectorScratchLayout& lay) {
  float* base = ts.base + tid * ts.stride;
  return {base + lay.q,    reinterpret_cast<uint16_t*>(base + lay.q_bf16),
          base + lay.acc,  base + lay.scores,
          base + lay.m,    base + lay.l,
          base + lay.alpha};
}

inline void reset_state(const VectorScratch& sc, int n_heads, int v_head_dim) {
  std::fill(sc.m, sc.m + n_heads, kNegInf);
  std::fill(sc.l, sc.l + n_heads, 0.f);
  std::fill(sc.acc, sc.acc + static_cast<int64_t>(n_heads) * v_head_dim, 0.f);
}

// Prefetches the cache lines of one pool row (the next key block's K/V rows are gathered through
// req_to_token, which the hardware prefetchers cannot follow).
inline void prefetch_row(const void* row, int64_t bytes) {
  constexpr int64_t kLineBytes = 64;
  const char* c = static_cast<const char*>(row);
  // Into L2 (locality 2, prefetcht1): a block ahead over all kv heads is 64 KiB of K/V at
  // 8 heads x d 128 bf16, more than L1 holds.
  for (int64_t off = 0; off < bytes; off += kLineBytes) __builtin_prefetch(c + off, 0, 2);
}

// The partial vectors of qk_block without the bf16 dot product (f32 FMAs): two keys per step, so
// each q load feeds both keys and 2 * kN independent FMA chains hide the FMA latency (a key past
// n reads a zero row); prefetches as qk_block.
template <class V, class S, int kN>
inline void qk_block_f32(const typename S::T* const* k_rows, int n, const float* q, int d_len,
                         const void* const* next_rows, const int64_t* row_bytes, bool prefetch_v,
                         typename V::F (&dots)[kN][kKeyBlock]) {
  using T = typename S::T;
  static_assert(kKeyBlock % 2 == 0);
  const T* zero = reinterpret_cast<const T*>(kZeroRow);
  for (int t = 0; t < kKeyBlock; t += 2) {
    typename V::F acc[kN][2];
    for (int j = 0; j < kN; ++j) acc[j][0] = acc[j][1] = V::zero();
    for (int u = t; u < t + 2 && next_rows != nullptr; ++u) {
      if (next_rows[2 * u] == nullptr) continue;
      prefetch_row(next_rows[2 * u], row_bytes[0]);
      if (prefetch_v) prefetch_row(next_rows[2 * u + 1], row_bytes[1]);
    }
    if (t < n) {
      const T* k0 = k_rows[t];
      const T* k1 = t + 1 < n ? k_rows[t + 1] : zero;
      for (int d = 0; d < d_len; d += V::kWidth) {
        const typename V::F kk0 = V::template load_as<S>(k0 + d);
        const typename V::F kk1 = V::template load_as<S>(k1 + d);
        for (int j = 0; j < kN; ++j) {
          const typename V::F qq = V::load(q + j * d_len + d);
          acc[j][0] = V::fma(qq, kk0, acc[j][0]);
          acc[j][1] = V::fma(qq, kk1, acc[j][1]);
        }
      }
    }
    for (int j = 0; j < kN; ++j) {
      dots[j][t] = acc[j][0];
      dots[j][t + 1] = acc[j][1];
    }
  }
}

// out[j * kKeyBlock + t] = q[j] . k_rows[t] for kN heads and the block's n keys (0 after n);
// q [kN, D] f32 (or q_bf16 [kN, D]). With key t it prefetches next_rows[t] (the K and V rows of
// a key of the next block, or null; row_bytes[2] bytes each; the V row only when prefetch_v),
// spreading the prefetches over the block's arithmetic instead of issuing them as one burst that
// stalls on the miss buffers.
template <class V, class S, bool kBf16Dot, int kN>
inline void qk_block(const typename S::T* const* k_rows, int n, const float* q,
                     const uint16_t* q_bf16, int d_len, const void* const* next_rows,
                     const int64_t* row_bytes, bool prefetch_v, float* out) {
  typename V::F dots[kN][kKeyBlock];
  if constexpr (!kBf16Dot) {
    qk_block_f32<V, S, kN>(k_rows, n, q, d_len, next_rows, row_bytes, prefetch_v, dots);
  } else {
    for (int t = 0; t < kKeyBlock; ++t) {
      typename V::F acc[kN];
      for (int j = 0; j < kN; ++j) acc[j] = V::zero();
      if (next_rows != nullptr && next_rows[2 * t] != nullptr) {
        prefetch_row(next_rows[2 * t], row_bytes[0]);
        if (prefetch_v) prefetch_row(next_rows[2 * t + 1], row_bytes[1]);
      }
      if (t < n) {
        const typename S::T* k = k_rows[t];
        int d = 0;
        for (; d + V::kBf16PerDot <= d_len; d += V::kBf16PerDot) {
          const auto kk = V::template load_k_pairs<S>(k + d);
          for (int j = 0; j < kN; ++j) {
            acc[j] = V::dot_bf16(acc[j],
                                 V::template load_k_pairs<StoreBf16>(q_bf16 + j * d_len + d), kk);
          }
        }
        if (d < d_len) {
          const auto kk = V::template load_k_half<S>(k + d);
          for (int j = 0; j < kN; ++j) {
            acc[j] =
                V::dot_bf16(acc[j], V::template load_k_half<StoreBf16>(q_bf16 + j * d_len + d), kk);
          }
        }
      }
      for (int j = 0; j < kN; ++j) dots[j][t] = acc[j];
    }
  }
  for (int j = 0; j < kN; ++j) {
    if constexpr (requires { V::reduce_add_16(dots[j], out); }) {
      static_assert(kKeyBlock == 16);
      V::reduce_add_16(dots[j], out + j * kKeyBlock);
    } else {
      for (int t = 0; t < kKeyBlock; ++t) out[j * kKeyBlock + t] = V::reduce_add(dots[j][t]);
    }
  }
}

// acc[j] = acc[j] * alpha[j] + sum_t p[j * kKeyBlock + t] * v_rows[t][d .. d + kC * kWidth): kC
// column vectors per pass, so each probability broadcast feeds kC FMAs and kN * kC chains hide
// the FMA latency.
template <class V, class S, int kN, int kC>
inline void pv_tile(const typename S::T* const* v_rows, int n, int d, const float* p,
                    const float* alpha, float* acc, int64_t acc_stride) {
  typename V::F a[kN][kC];
  for (int j = 0; j < kN; ++j) {
    for (int c = 0; c < kC; ++c) {
      a[j][c] = V::mul(V::load(acc + j * acc_stride + c * V::kWidth), V::set1(alpha[j]));
    }
  }
  for (int t = 0; t < n; ++t) {
    typename V::F vv[kC];
    for (int c = 0; c < kC; ++c) vv[c] = V::template load_as<S>(v_rows[t] + d + c * V::kWidth);
    for (int j = 0; j < kN; ++j) {
      const typename V::F pj = V::set1(p[j * kKeyBlock + t]);
      for (int c = 0; c < kC; ++c) a[j][c] = V::fma(pj, vv[c], a[j][c]);
    }
  }
  for (int j = 0; j < kN; ++j) {
    for (int c = 0; c < kC; ++c) V::store(acc + j * acc_stride + c * V::kWidth, a[j][c]);
  }
}

// acc[j] = acc[j] * alpha[j] + sum_t p[j][t] * v_rows[t][d .. d + kWidth), two keys per bf16 pair
// dot product; p_pairs [kN, kKeyBlock / 2] bf16 pairs (p[j][2i], p[j][2i + 1]); n is even (an odd
// block's last row points at zeros, its probability is 0).
template <class V, class S, int kN>
inline void pv_tile_pairs(const typename S::T* const* v_rows, int n, int d, const uint32_t* p_pairs,
                          const float* alpha, float* acc, int64_t acc_stride) {
  constexpr int kPairsPerHead = kKeyBlock / 2;
  typename V::F a[kN];
  for (int j = 0; j < kN; ++j) a[j] = V::mul(V::load(acc + j * acc_stride), V::set1(alpha[j]));
  for (int t = 0; t < n; t += 2) {
    const auto vv = V::template load_v_pairs<S>(v_rows[t] + d, v_rows[t + 1] + d);
    for (int j = 0; j < kN; ++j) {
      a[j] = V::dot_bf16(a[j], V::broadcast_pair(p_pairs[j * kPairsPerHead + t / 2]), vv);
    }
  }
  for (int j = 0; j < kN; ++j) V::store(acc + j * acc_stride, a[j]);
}

// Calls f.template operator()<kN>(g0) for head tiles of up to kHeadTile heads.
template <class F>
inline void for_head_tiles(int n_heads, F&& f) {
  int g0 = 0;
  for (; g0 + kHeadTile <= n_heads; g0 += kHeadTile) f.template operator()<kHeadTile>(g0);
  switch (n_heads - g0) {
    case 3:
      f.template operator()<3>(g0);
      break;
    case 2:
      f.template operator()<2>(g0);
      break;
    case 1:
      f.template operator()<1>(g0);
      break;
    default:
      break;
  }
}

// Loop-invariant pieces of one call: the soft-cap factors and the K/V row sizes in bytes.
template <class V, class T>
struct BlockConsts {
  bool capped;
  typename V::F pre_cap;
  typename V::F post_cap;
  int64_t row_bytes[2];

  explicit BlockConsts(const CpuAttentionParams& p)
      : capped(p.logit_cap > 0.f),
        pre_cap(V::set1(capped ? p.score_scale / p.logit_cap : p.score_scale)),
        post_cap(V::set1(capped ? p.logit_cap * kLog2e : kLog2e)),
        row_bytes{p.head_dim * static_cast<int64_t>(sizeof(T)),
                  p.v_head_dim * static_cast<int64_t>(sizeof(T))} {}
};

// One key block (n <= kKeyBlock keys, rows k_rows/v_rows of one kv head) for the n_heads query
// rows of sc (sc.q / sc.q_bf16 / sc.acc / sc.m / sc.l / sc.alpha point at that kv head's rows;
// sc.scores is [n_heads, kKeyBlock] scratch). next_rows (2 * kKeyBlock pointers or null) are
// prefetched by the first head tile's q.k. v_rows must have room for kKeyBlock entries.
template <class V, class S, bool kBf16Dot>
inline void attend_block(const CpuAttentionParams& p, const BlockConsts<V, typename S::T>& c,
                         const typename S::T** k_rows, const typename S::T** v_rows, int n,
                         const void* const* next_rows, int n_heads, const VectorScratch& sc) {
  using T = typename S::T;
  const int d_len = p.head_dim;
  const int dv_len = p.v_head_dim;
  bool first_tile = true;
  for_head_tiles(n_heads, [&]<int kN>(int g0) {
    qk_block<V, S, kBf16Dot, kN>(k_rows, n, sc.q + g0 * d_len, sc.q_bf16 + g0 * d_len, d_len,
                                 first_tile ? next_rows : nullptr, c.row_bytes, !kBf16Dot,
                                 sc.scores + g0 * kKeyBlock);
    first_tile = false;
  });
  for (int g = 0; g < n_heads; ++g) {
    float* s = sc.scores + g * kKeyBlock;
    for (int t = 0; t < kKeyBlock; t += V::kWidth) {
      typename V::F x = V::mul(V::load(s + t), c.pre_cap);
      if (c.capped) x = V::tanh(x);
      V::store(s + t, V::mul(x, c.post_cap));
    }
    std::fill(s + n, s + kKeyBlock, kNegInf);
    typename V::F mx = V::load(s);
    for (int t = V::kWidth; t < kKeyBlock; t += V::kWidth) mx = V::max(mx, V::load(s + t));
    const float m_new = std::max(sc.m[g], V::reduce_max(mx));
    const typename V::F m_vec = V::set1(m_new);
    typename V::F sum = V::zero();
    for (int t = 0; t < kKeyBlock; t += V::kWidth) {
      const typename V::F e = V::exp2(V::sub(V::load(s + t), m_vec));
      V::store(s + t, e);
      sum = V::add(sum, e);
    }
    const float alpha = sc.m[g] == kNegInf ? 0.f : std::exp2(sc.m[g] - m_new);
    sc.alpha[g] = alpha;
    sc.l[g] = sc.l[g] * alpha + V::reduce_add(sum);
    sc.m[g] = m_new;
  }
  if constexpr (kBf16Dot) {
    static_assert(kKeyBlock == V::kWidth, "one vector of probabilities per head and block");
    const int n_even = n + (n & 1);
    if (n_even != n) v_rows[n] = reinterpret_cast<const T*>(kZeroRow);
    for_head_tiles(n_heads, [&]<int kN>(int g0) {
      alignas(64) uint32_t p_pairs[kN * kKeyBlock / 2];
      for (int j = 0; j < kN; ++j) {
        V::store_bf16_pairs(sc.scores + (g0 + j) * kKeyBlock, p_pairs + j * kKeyBlock / 2);
      }
      // The first head tile prefetches the next block's V slices here (q.k did the K slices),
      // spread over the column chunks, so the P.V phase keeps memory requests in flight too.
      const int chunks = dv_len / V::kWidth;
      for (int dc = 0; dc < chunks; ++dc) {
        if (g0 == 0 && next_rows != nullptr) {
          for (int t = dc * kKeyBlock / chunks; t < (dc + 1) * kKeyBlock / chunks; ++t) {
            if (next_rows[2 * t + 1] != nullptr) prefetch_row(next_rows[2 * t + 1], c.row_bytes[1]);
          }
        }
        const int d = dc * V::kWidth;
        pv_tile_pairs<V, S, kN>(v_rows, n_even, d, p_pairs, sc.alpha + g0, sc.acc + g0 * dv_len + d,
                                dv_len);
      }
    });
  } else {
    // Two column vectors per pass with 8-lane vectors, one with 16 lanes (Zen 4 dev VM, one
    // thread, b8 kv4096 decode with the two-key q.k: AVX2 bf16 10.9-11.0 ms with two vs 11.6-11.7
    // with one; AVX-512F two were 3-8 % slower than one).
    constexpr int kC = V::kWidth == 8 ? 2 : 1;
    int d = 0;
    for (; kC > 1 && d + kC * V::kWidth <= dv_len; d += kC * V::kWidth) {
      for_head_tiles(n_heads, [&]<int kN>(int g0) {
        pv_tile<V, S, kN, kC>(v_rows, n, d, sc.scores + g0 * kKeyBlock, sc.alpha + g0,
                              sc.acc + g0 * dv_len + d, dv_len);
      });
    }
    for (; d < dv_len; d += V::kWidth) {
      for_head_tiles(n_heads, [&]<int kN>(int g0) {
        pv_tile<V, S, kN, 1>(v_rows, n, d, sc.scores + g0 * kKeyBlock, sc.alpha + g0,
                             sc.acc + g0 * dv_len + d, dv_len);
      });
    }
  }
}

// Online-softmax attention of n_heads query rows (sc.q / sc.q_bf16) of kv head `kv_head` over the
// keys [k_begin, k_end) of one request (slots: its req_to_token row). Updates sc.m/l/acc.
template <class V, class S, bool kBf16Dot>
void attend_span(const CpuAttentionParams& p, const int32_t* slots, int kv_head, int n_heads,
                 int k_begin, int k_end, const VectorScratch& sc) {
  using T = typename S::T;
  static_assert(kKeyBlock % V::kWidth == 0);
  const T* k_base = static_cast<const T*>(p.k_cache) + kv_head * p.k_head_stride;
  const T* v_base = static_cast<const T*>(p.v_cache) + kv_head * p.v_head_stride;
  const BlockConsts<V, T> c(p);
  const T* k_rows[kKeyBlock];
  const T* v_rows[kKeyBlock];
  for (int k0 = k_begin; k0 < k_end; k0 += kKeyBlock) {
    const int n = std::min(kKeyBlock, k_end - k0);
    for (int t = 0; t < n; ++t) {
      const int64_t slot = slots[k0 + t];
      k_rows[t] = k_base + slot * p.k_row_stride;
      v_rows[t] = v_base + slot * p.v_row_stride;
    }
    // The next block's rows, prefetched by the first head tile's q.k.
    const void* next_rows[2 * kKeyBlock];
    for (int t = 0; t < kKeyBlock; ++t) {
      const int j = k0 + kKeyBlock + t;
      const bool in = j < k_end;
      const int64_t slot = in ? slots[j] : 0;
      next_rows[2 * t] = in ? k_base + slot * p.k_row_stride : nullptr;
      next_rows[2 * t + 1] = in ? v_base + slot * p.v_row_stride : nullptr;
    }
    attend_block<V, S, kBf16Dot>(p, c, k_rows, v_rows, n, next_rows, n_heads, sc);
  }
}

// Decode of one request over the keys [k_begin, k_end) for ALL kv heads (sc holds the state of
// every q head: q/acc/m/l/alpha [Hq, ...]). The key blocks are the outer loop and the kv heads
// the inner one, so each block's pool rows (Hkv * D elements per token, contiguous; a page of
// tokens is one contiguous span) are consumed completely while they are in cache, instead of one
// head's 256-byte slice per row per pass. While head h works on a block it prefetches head h's
// slice of the next block's rows.
// Element offsets (slot * row stride) of the K and V pool rows of keys [k0, k0 + n) of `slots`:
// the current block and the prefetched block of attend_span_all_heads and the avx512_bf16 fast
// decode.
inline void key_row_offsets(const CpuAttentionParams& p, const int32_t* slots, int k0, int n,
                            int64_t* k_off, int64_t* v_off) {
  for (int t = 0; t < n; ++t) {
    const int64_t slot = slots[k0 + t];
    k_off[t] = slot * p.k_row_stride;
    v_off[t] = slot * p.v_row_stride;
  }
}

// How many key blocks ahead attend_span_all_heads prefetches (2 measured no better than 1 on the
// 2-core Zen 5 VM: the limit is the number of misses in flight, not the distance).
constexpr int kPrefetchBlocksAhead = 1;
template <class V, class S, bool kBf16Dot>
void attend_span_all_heads(const CpuAttentionParams& p, const int32_t* slots, int k_begin,
                           int k_end, const VectorScratch& sc) {
  using T = typename S::T;
  static_assert(kKeyBlock % V::kWidth == 0);
  const int group = p.group();
  const T* k_cache = static_cast<const T*>(p.k_cache);
  const T* v_cache = static_cast<const T*>(p.v_cache);
  const BlockConsts<V, T> c(p);
  const T* k_rows[kKeyBlock];
  const T* v_rows[kKeyBlock];
  const void* next_rows[2 * kKeyBlock];
  int64_t k_off[kKeyBlock];
  int64_t v_off[kKeyBlock];
  int64_t next_k_off[kKeyBlock];
  int64_t next_v_off[kKeyBlock];
  for (int k0 = k_begin; k0 < k_end; k0 += kKeyBlock) {
    const int n = std::min(kKeyBlock, k_end - k0);
    key_row_offsets(p, slots, k0, n, k_off, v_off);
    const int pf0 = k0 + kPrefetchBlocksAhead * kKeyBlock;
    const int n_next = std::clamp(k_end - pf0, 0, kKeyBlock);
    key_row_offsets(p, slots, pf0, n_next, next_k_off, next_v_off);
    for (int h = 0; h < p.num_kv_heads; ++h) {
      const T* k_base = k_cache + h * p.k_head_stride;
      const T* v_base = v_cache + h * p.v_head_stride;
      for (int t = 0; t < n; ++t) {
        k_rows[t] = k_base + k_off[t];
        v_rows[t] = v_base + v_off[t];
      }
      // Pass h prefetches the (key, head) slices h * kKeyBlock .. + kKeyBlock - 1 of the next
      // block in key-major order, so the prefetch stream walks each pool row (and page) in
      // address order, which the hardware prefetchers can follow; over the Hkv passes every slice
      // of the next block is prefetched once.
      for (int t = 0; t < kKeyBlock; ++t) {
        const int c = h * kKeyBlock + t;
        const int key = c / p.num_kv_heads;
        const int head = c - key * p.num_kv_heads;
        const bool in = key < n_next;
        next_rows[2 * t] = in ? k_cache + head * p.k_head_stride + next_k_off[key] : nullptr;
        next_rows[2 * t + 1] = in ? v_cache + head * p.v_head_stride + next_v_off[key] : nullptr;
      }
      const int hq0 = h * group;
      const VectorScratch head_sc{sc.q + hq0 * p.head_dim,
                                  sc.q_bf16 + hq0 * p.head_dim,
                                  sc.acc + hq0 * p.v_head_dim,
                                  sc.scores,
                                  sc.m + hq0,
                                  sc.l + hq0,
                                  sc.alpha + hq0};
      attend_block<V, S, kBf16Dot>(p, c, k_rows, v_rows, n, next_rows, group, head_sc);
    }
  }
}

// The partials of split decode item `it` from the running state of every q head (m, l: log2-domain
// max and sum; acc: unnormalised [hq, dv] output): head h goes to partial slot it.partial + h *
// it.partial_head_stride, as the normalised output and log2 LSE (kNegInf when the split saw no
// visible key). Shared by run_decode and the avx512_bf16 fast decode.
inline void store_decode_partials(const CpuAttentionParams& p, const DecodeWork& w,
                                  const DecodeItem& it, const float* m, const float* l,
                                  const float* acc, int dv) {
  const int group = p.group();
  for (int h = 0; h < p.num_kv_heads; ++h) {
    const int64_t slot = it.partial + static_cast<int64_t>(h) * it.partial_head_stride;
    float* po = w.partial_out + slot * group * dv;
    float* pl = w.partial_lse + slot * group;
    for (int g = 0; g < group; ++g) {
      const int q = h * group + g;
      const bool empty = l[q] == 0.f;
      const float inv_l = empty ? 0.f : 1.f / l[q];
      pl[g] = empty ? kNegInf : m[q] + std::log2(l[q]);
      for (int d = 0; d < dv; ++d) po[g * dv + d] = acc[q * dv + d] * inv_l;
    }
  }
}

// Decode: one item = one request's key range [k_begin, k_end) for every kv head (so the pool rows
// of those keys are streamed once, whole). Split items write per-head partials: head h of split s
// goes to partial slot it.partial + h * it.partial_head_stride.
template <class V, class S, bool kBf16Dot>
void run_decode(const CpuAttentionParams& p, const DecodeWork& w, const ThreadScratch& ts) {
  const int hq = p.num_q_heads;
  const int dv = p.v_head_dim;
  const VectorScratchLayout lay = vector_scratch_layout(hq, p.head_dim, dv);
  const std::vector<DecodeItem>& items = *w.items;
  const int num_items = static_cast<int>(items.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(ts.num_threads)
  for (int i = 0; i < num_items; ++i) {
    const VectorScratch sc = carve_vector_scratch(ts, thread_id(), lay);
    const DecodeItem& it = items[i];
    const CpuRequest& rq = (*w.requests)[it.request];
    load_query_rows(p, rq.q_start, 0, hq, sc.q, kBf16Dot ? sc.q_bf16 : nullptr);
    reset_state(sc, hq, dv);
    int lo = 0;
    int hi = 0;
    visible_keys(p, rq.first_q_pos, rq.seq_len, &lo, &hi);
    attend_span_all_heads<V, S, kBf16Dot>(p, rq.slots(p), std::max(lo, it.k_begin),
                                          std::min(hi, it.k_end), sc);
    if (it.partial < 0) {
      finalize_rows(p, rq.q_start, 0, hq, sc.m, sc.l, sc.acc, dv);
      continue;
    }
    store_decode_partials(p, w, it, sc.m, sc.l, sc.acc, dv);
  }
}

template <class V, class S, bool kBf16Dot>
void run_extend(const CpuAttentionParams& p, const ExtendWork& w, const ThreadScratch& ts) {
  const int group = p.group();
  const VectorScratchLayout lay = vector_scratch_layout(group, p.head_dim, p.v_head_dim);
  const std::vector<ExtendItem>& items = *w.items;
  const int num_items = static_cast<int>(items.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(ts.num_threads)
  for (int i = 0; i < num_items; ++i) {
    const VectorScratch sc = carve_vector_scratch(ts, thread_id(), lay);
    const ExtendItem& it = items[i];
    const CpuRequest& rq = (*w.requests)[it.request];
    const int32_t* slots = rq.slots(p);
    for (int row = it.row_begin; row < it.row_end;) {
      const int token = row / group;
      const int g_begin = row - token * group;
      const int g_end = std::min(group, it.row_end - token * group);
      const int n_heads = g_end - g_begin;
      const int hq0 = it.kv_head * group + g_begin;
      int lo = 0;
      int hi = 0;
      visible_keys(p, rq.first_q_pos + token, rq.seq_len, &lo, &hi);
      load_query_rows(p, rq.q_start + token, hq0, n_heads, sc.q, kBf16Dot ? sc.q_bf16 : nullptr);
      reset_state(sc, n_heads, p.v_head_dim);
      attend_span<V, S, kBf16Dot>(p, slots, it.kv_head, n_heads, lo, hi, sc);
      finalize_rows(p, rq.q_start + token, hq0, n_heads, sc.m, sc.l, sc.acc, p.v_head_dim);
      row += n_heads;
    }
  }
}

// Runtime KV dtype -> storage tag. The bf16 dot products apply when q is bf16 and K/V are bf16
// or fp8_e4m3 (widened to bf16 exactly).
template <class V, template <class, class, bool> class Run, class Work>
void dispatch_kv(const CpuAttentionParams& p, const Work& w, const ThreadScratch& ts) {
  switch (p.kv_dtype) {
    case DType::kBF16:
      if constexpr (V::kHasBf16Dot) {
        if (p.act_dtype == DType::kBF16) return Run<V, StoreBf16, true>::run(p, w, ts);
      }
      return Run<V, StoreBf16, false>::run(p, w, ts);
    case DType::kF16:
      return Run<V, StoreF16, false>::run(p, w, ts);
    case DType::kF32:
      return Run<V, StoreF32, false>::run(p, w, ts);
    case DType::kFP8E4M3:
      if constexpr (V::kHasBf16Dot) {
        if (p.act_dtype == DType::kBF16) return Run<V, StoreFp8E4M3, true>::run(p, w, ts);
      }
      return Run<V, StoreFp8E4M3, false>::run(p, w, ts);
    case DType::kFP8E5M2:
      return Run<V, StoreFp8E5M2, false>::run(p, w, ts);
    default:
      return;  // the backend rejects every other KV dtype before planning
  }
}

template <class V, class S, bool kBf16Dot>
struct DecodeRunner {
  static void run(const CpuAttentionParams& p, const DecodeWork& w, const ThreadScratch& ts) {
    run_decode<V, S, kBf16Dot>(p, w, ts);
  }
};

template <class V, class S, bool kBf16Dot>
struct ExtendRunner {
  static void run(const CpuAttentionParams& p, const ExtendWork& w, const ThreadScratch& ts) {
    run_extend<V, S, kBf16Dot>(p, w, ts);
  }
};

}  // namespace
}  // namespace attnkit::cpu_attention
