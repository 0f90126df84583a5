// The triton backend's SIMT attention kernel: split-KV decode, and the universal extend path
// (SM75, f32 activations, MLA, and whatever the tensor-core kernel does not cover).
//
// One block = one query token x one kv head x one tile of its GQA group x one split of the keys.
// The block's threads form row groups of kThreadsPerRow lanes; a row group reads one key row at a
// time with 16-byte (8-element) vector loads, so every q head of the tile shares each K/V load.
// Each row group keeps its own online-softmax state over the keys it visits; the groups are
// merged through shared memory at the end. A split writes its normalised partial output and LSE
// for the merge kernel (split_kv_merge.cuh) unless the request has a single split.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "attnkit/dtype.h"
#include "backends/triton/kernels/attention_params.h"
#include "backends/triton/kernels/attention_variant.cuh"
#include "backends/triton/kernels/simt_layout.h"
#include "backends/triton/kernels/split_plan.h"
#include "cuda/common/dtype_convert.cuh"
#include "cuda/common/online_softmax.cuh"

namespace attnkit::triton {

using cuda::kVecElems;

// kQ: activation dtype of q/out (and of the contiguous new k/v); kKV: pool dtype.
template <int kHeadDimQK, int kHeadDimV, DType kQ, DType kKV>
struct SimtTraits {
  static constexpr int kDqk = kHeadDimQK;
  static constexpr int kDv = kHeadDimV;
  static constexpr DType kQDType = kQ;
  static constexpr DType kKVDType = kKV;
  static constexpr int kThreads = simt::kThreads;
  static constexpr int kThreadsPerRow = simt::threads_per_row(kDqk, kDv);
  static constexpr int kRowGroups = kThreads / kThreadsPerRow;
  static constexpr int kVecsK = simt::vecs_per_thread(kDqk, kThreadsPerRow);
  static constexpr int kVecsV = simt::vecs_per_thread(kDv, kThreadsPerRow);
  static constexpr int kGqaTile = simt::gqa_tile(kDqk, kDv);
  static constexpr int kRegisterFloats = simt::kRegisterFloats;
  // Register cap (65536 / (kThreads * kMinBlocksPerSm)): a memory-bound kernel needs warps in
  // flight more than it needs registers.
  static constexpr int kMinBlocksPerSm = 3;
  // Keys each row group loads before it computes (memory-level parallelism).
  static constexpr int kUnroll = (kVecsK + kVecsV) <= 2 ? 4 : 2;
  static constexpr int kKeysPerIter = kRowGroups * kUnroll;

  static_assert(kDqk % kVecElems == 0 && kDv % kVecElems == 0, "head dims must be multiples of 8");
  static_assert(kKV != DType::kFP4E2M1 || (kDqk % kFp4GroupSize == 0 && kDv % kFp4GroupSize == 0),
                "fp4 KV needs head dims that are multiples of the 16-value scale group");
  static_assert(kThreads % kThreadsPerRow == 0, "row groups must tile the block");
  static_assert(kGqaTile >= 1 && kGqaTile * kVecElems * (kVecsK + kVecsV) <= kRegisterFloats,
                "q + accumulators exceed the register budget");
};

// Per-request facts every block derives from the params.
struct RequestView {
  int b;
  int q_begin;     // first token of the request in [0, T)
  int num_q;       // its query tokens
  int num_prefix;  // pool keys
  int num_new;     // new-token keys
};

__device__ __forceinline__ int find_request(const AttentionParams& p, int token) {
  int lo = 0, hi = p.bs - 1;
  while (lo < hi) {  // last request whose start <= token
    const int mid = (lo + hi + 1) / 2;
    if (p.q_start[mid] <= token)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

__device__ __forceinline__ RequestView request_of_token(const AttentionParams& p, int token) {
  RequestView r;
  if (p.q_start == nullptr) {
    r.b = token;
    r.q_begin = token;
    r.num_q = 1;
  } else {
    r.b = find_request(p, token);
    r.q_begin = p.q_start[r.b];
    r.num_q = p.q_len[r.b];
  }
  r.num_prefix = p.kv_indptr[r.b + 1] - p.kv_indptr[r.b];
  r.num_new = p.has_new_keys ? r.num_q : 0;
  return r;
}

template <typename Traits, bool kExtend>
struct SimtKernel {
  using Variant = AttentionVariant<kExtend>;
  using QT = typename cuda::ActivationType<Traits::kQDType>::type;
  using PoolElem = cuda::ElemTraits<Traits::kKVDType>;
  using NewElem = cuda::ElemTraits<Traits::kQDType>;
  static constexpr int kTile = Traits::kGqaTile;
  static constexpr int kTPR = Traits::kThreadsPerRow;
  static constexpr int kVK = Traits::kVecsK;
  static constexpr int kVV = Traits::kVecsV;
  static constexpr int kUnroll = Traits::kUnroll;

  struct SharedStorage {
    float m[Traits::kRowGroups][kTile];
    float d[Traits::kRowGroups][kTile];
    float acc[Traits::kRowGroups][kTile][Traits::kDv];
  };

  // Per-thread state of one row group.
  struct State {
    float q[kTile][kVK * kVecElems];
    float acc[kTile][kVV * kVecElems];
    cuda::SoftmaxState sm[kTile];
  };

  // Where key rows come from: the pool (through slots) or the contiguous new-token inputs.
  struct RowSource {
    const void* k;
    const void* v;
    int64_t k_stride_row, v_stride_row;  // per slot (pool) or per token (inputs)
    const uint8_t* ks;                   // fp4 scales (pool only)
    const uint8_t* vs;
    int64_t ks_stride_row, vs_stride_row;
  };

  // Attends keys [k_begin, k_end) of the index space; key_slot(j) gives the row of key j.
  template <typename Elem, typename SlotFn>
  __device__ __forceinline__ static void attend(const AttentionParams& p, State& st,
                                                const RowSource& src, const Variant& var,
                                                int k_begin, int k_end, int num_heads_in_tile,
                                                SlotFn key_slot) {
    const int lane_in_row = threadIdx.x % kTPR;
    const int group = threadIdx.x / kTPR;
    for (int base = k_begin; base < k_end; base += Traits::kKeysPerIter) {
      typename Elem::Raw kraw[kUnroll][kVK];
      typename Elem::Raw vraw[kUnroll][kVV];
      const uint8_t* kscale_row[kUnroll];
      const uint8_t* vscale_row[kUnroll];
      bool valid[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int j = base + u * Traits::kRowGroups + group;
        valid[u] = j < k_end && var.key_visible(j);
        const int64_t row = valid[u] ? key_slot(j) : 0;
        const char* krow = static_cast<const char*>(src.k);
        const char* vrow = static_cast<const char*>(src.v);
        const int64_t k_off = row * src.k_stride_row;
        const int64_t v_off = row * src.v_stride_row;
        kscale_row[u] = src.ks ? src.ks + row * src.ks_stride_row : nullptr;
        vscale_row[u] = src.vs ? src.vs + row * src.vs_stride_row : nullptr;
#pragma unroll
        for (int i = 0; i < kVK; ++i) {
          const int e = (i * kTPR + lane_in_row) * kVecElems;
          if (valid[u] && e < Traits::kDqk) {
            kraw[u][i] = Elem::load(element_ptr<Elem>(krow, k_off), e);
          } else {
            kraw[u][i] = {};
          }
        }
#pragma unroll
        for (int i = 0; i < kVV; ++i) {
          const int e = (i * kTPR + lane_in_row) * kVecElems;
          if (valid[u] && e < Traits::kDv) {
            vraw[u][i] = Elem::load(element_ptr<Elem>(vrow, v_off), e);
          } else {
            vraw[u][i] = {};
          }
        }
      }
      // Scores of the kUnroll keys for every head of the tile.
      float s[kUnroll][kTile];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        float kf[kVK][kVecElems];
#pragma unroll
        for (int i = 0; i < kVK; ++i) {
          const int e = (i * kTPR + lane_in_row) * kVecElems;
          // Padding lanes past the row (e >= kDqk) and invisible keys hold zero codes, but their
          // fp4 block-scale bytes belong to the next slot (possibly unwritten NaN): never read
          // them.
          if (valid[u] && e < Traits::kDqk) {
            Elem::convert(kraw[u][i], kscale_row[u], e, kf[i]);
          } else {
#pragma unroll
            for (int x = 0; x < kVecElems; ++x) kf[i][x] = 0.f;
          }
        }
#pragma unroll
        for (int h = 0; h < kTile; ++h) {
          float dot = 0.f;
#pragma unroll
          for (int i = 0; i < kVK; ++i) {
#pragma unroll
            for (int x = 0; x < kVecElems; ++x)
              dot = fmaf(st.q[h][i * kVecElems + x], kf[i][x], dot);
          }
#pragma unroll
          for (int off = kTPR / 2; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
          s[u][h] = valid[u] ? var.logit(dot) : -INFINITY;
        }
      }
#pragma unroll
      for (int h = 0; h < kTile; ++h) {
        if (h >= num_heads_in_tile) break;
        float mx = s[0][h];
#pragma unroll
        for (int u = 1; u < kUnroll; ++u) mx = fmaxf(mx, s[u][h]);
        const float factor = st.sm[h].rescale_to(mx);
#pragma unroll
        for (int x = 0; x < kVV * kVecElems; ++x) st.acc[h][x] *= factor;
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        float vf[kVV][kVecElems];
#pragma unroll
        for (int i = 0; i < kVV; ++i) {
          const int e = (i * kTPR + lane_in_row) * kVecElems;
          // An invisible key has weight 0 and padding lanes (e >= kDv) are never stored, but
          // their zero codes times an unread (possibly NaN) fp4 block scale would still poison
          // the accumulator: clear them instead of converting.
          if (valid[u] && e < Traits::kDv) {
            Elem::convert(vraw[u][i], vscale_row[u], e, vf[i]);
          } else {
#pragma unroll
            for (int x = 0; x < kVecElems; ++x) vf[i][x] = 0.f;
          }
        }
#pragma unroll
        for (int h = 0; h < kTile; ++h) {
          const float pw = st.sm[h].add(s[u][h]);
#pragma unroll
          for (int i = 0; i < kVV; ++i) {
#pragma unroll
            for (int x = 0; x < kVecElems; ++x) {
              st.acc[h][i * kVecElems + x] = fmaf(pw, vf[i][x], st.acc[h][i * kVecElems + x]);
            }
          }
        }
      }
    }
  }

  template <typename Elem>
  __device__ __forceinline__ static const void* element_ptr(const char* base, int64_t elem_off) {
    // Byte offset of element elem_off for this storage (fp4: two per byte).
    if constexpr (Traits::kKVDType == DType::kFP4E2M1 && std::is_same_v<Elem, PoolElem>) {
      return base + elem_off / 2;
    } else {
      return base + elem_off * static_cast<int64_t>(sizeof(typename Elem::Storage));
    }
  }

  __device__ static void run(const AttentionParams& p, SharedStorage& smem) {
    const int token = p.token_base + static_cast<int>(blockIdx.z);
    const int kv_head = blockIdx.y / p.group_tiles;
    const int tile = blockIdx.y % p.group_tiles;
    const int split = blockIdx.x;
    const RequestView req = request_of_token(p, token);
    const int qi = token - req.q_begin;

    const Variant var = Variant::make(p, req.b, req.num_prefix, req.num_new, qi);
    int k_begin = var.lo, k_end = var.hi;
    // Split-KV: the block takes chunk `split` of the visible range.
    int num_splits = 1;
    if (p.max_splits > 1) {
      const int n = max(0, k_end - k_begin);
      const int min_chunk = forward_min_chunk(p);
      const int chunk = split_chunk(n, p.max_splits, min_chunk);
      num_splits = split_count(n, p.max_splits, min_chunk);
      if (split >= num_splits) return;
      k_begin += split * chunk;
      k_end = min(k_end, k_begin + chunk);
    }

    const int head0 = kv_head * p.group_size + tile * kTile;
    const int heads = min(kTile, p.group_size - tile * kTile);
    const int lane_in_row = threadIdx.x % kTPR;
    const int group = threadIdx.x / kTPR;

    State st;
    const QT* q_tok = static_cast<const QT*>(p.q) + token * p.q_stride_token;
#pragma unroll
    for (int h = 0; h < kTile; ++h) {
#pragma unroll
      for (int i = 0; i < kVK; ++i) {
        const int e = (i * kTPR + lane_in_row) * kVecElems;
        float f[kVecElems] = {};
        if (h < heads && e < Traits::kDqk) {
          NewElem::convert(NewElem::load(q_tok + (head0 + h) * p.q_stride_head, e), nullptr, e, f);
        }
#pragma unroll
        for (int x = 0; x < kVecElems; ++x) st.q[h][i * kVecElems + x] = f[x];
      }
#pragma unroll
      for (int x = 0; x < kVV * kVecElems; ++x) st.acc[h][x] = 0.f;
    }

    // Pool keys: [k_begin, min(k_end, num_prefix)).
    const int32_t* indices = p.kv_indices + p.kv_indptr[req.b];
    const RowSource pool{p.k_pool,
                         p.v_pool,
                         p.k_stride_row,
                         p.v_stride_row,
                         p.k_scales ? p.k_scales + kv_head * p.ks_stride_head : nullptr,
                         p.v_scales ? p.v_scales + kv_head * p.vs_stride_head : nullptr,
                         p.ks_stride_row,
                         p.vs_stride_row};
    RowSource pool_head = pool;
    pool_head.k =
        static_cast<const char*>(p.k_pool) + byte_offset<PoolElem>(kv_head * p.k_stride_head);
    pool_head.v =
        static_cast<const char*>(p.v_pool) + byte_offset<PoolElem>(kv_head * p.v_stride_head);
    attend<PoolElem>(p, st, pool_head, var, k_begin, min(k_end, req.num_prefix), heads,
                     [&](int j) -> int64_t { return indices[j]; });
    // New keys: [num_prefix, num_prefix + num_new) from the inputs or from the pool.
    const int n_begin = max(k_begin, req.num_prefix);
    if (n_begin < k_end) {
      if (p.k_new != nullptr) {
        const RowSource in{
            static_cast<const char*>(p.k_new) +
                byte_offset<NewElem>(kv_head * p.kn_stride_head + req.q_begin * p.kn_stride_token),
            static_cast<const char*>(p.v_new) +
                byte_offset<NewElem>(kv_head * p.vn_stride_head + req.q_begin * p.vn_stride_token),
            p.kn_stride_token,
            p.vn_stride_token,
            nullptr,
            nullptr,
            0,
            0};
        const int prefix = req.num_prefix;
        attend<NewElem>(p, st, in, var, n_begin, k_end, heads,
                        [&](int j) -> int64_t { return j - prefix; });
      } else {
        const int32_t* slots = p.new_slots + req.q_begin - req.num_prefix;
        attend<PoolElem>(p, st, pool_head, var, n_begin, k_end, heads,
                         [&](int j) -> int64_t { return slots[j]; });
      }
    }

    // Merge the row groups' states through shared memory.
    if (lane_in_row == 0) {
#pragma unroll
      for (int h = 0; h < kTile; ++h) {
        smem.m[group][h] = st.sm[h].m;
        smem.d[group][h] = st.sm[h].d;
      }
    }
#pragma unroll
    for (int h = 0; h < kTile; ++h) {
#pragma unroll
      for (int i = 0; i < kVV; ++i) {
        const int e = (i * kTPR + lane_in_row) * kVecElems;
        if (e < Traits::kDv) {
#pragma unroll
          for (int x = 0; x < kVecElems; ++x)
            smem.acc[group][h][e + x] = st.acc[h][i * kVecElems + x];
        }
      }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < heads * (Traits::kDv / kVecElems); idx += blockDim.x) {
      const int h = idx / (Traits::kDv / kVecElems);
      const int e = (idx % (Traits::kDv / kVecElems)) * kVecElems;
      float m = cuda::kNoKeyMax;
      for (int g = 0; g < Traits::kRowGroups; ++g) m = fmaxf(m, smem.m[g][h]);
      float d = 0.f;
      float o[kVecElems] = {};
      for (int g = 0; g < Traits::kRowGroups; ++g) {
        const float w = exp2f(smem.m[g][h] - m);
        d += smem.d[g][h] * w;
#pragma unroll
        for (int x = 0; x < kVecElems; ++x) o[x] += smem.acc[g][h][e + x] * w;
      }
      const int qh = head0 + h;
      if (num_splits == 1 && p.partial_single == 0) {
        const Finalized f = finalize(p, qh, m, d);
#pragma unroll
        for (int x = 0; x < kVecElems; ++x) o[x] *= f.inv;
        QT* dst = static_cast<QT*>(p.out) + token * p.o_stride_token + qh * p.o_stride_head + e;
        cuda::store8(dst, o);
        if (e == 0 && p.lse != nullptr) p.lse[token * p.lse_stride_token + qh] = f.lse;
      } else {
        const float inv = cuda::row_inv(d);
        float* dst = p.partial_out +
                     ((static_cast<int64_t>(split) * p.num_tokens + token) * p.num_q_heads + qh) *
                         Traits::kDv +
                     e;
#pragma unroll
        for (int x = 0; x < kVecElems; ++x) o[x] *= inv;
        cuda::store8(dst, o);
        if (e == 0) {
          p.partial_lse[(static_cast<int64_t>(split) * p.num_tokens + token) * p.num_q_heads + qh] =
              cuda::row_log2_lse(m, d);
        }
      }
    }
  }

  template <typename Elem>
  __device__ __forceinline__ static int64_t byte_offset(int64_t elems) {
    if constexpr (Traits::kKVDType == DType::kFP4E2M1 && std::is_same_v<Elem, PoolElem>) {
      return elems / 2;
    } else {
      return elems * static_cast<int64_t>(sizeof(typename Elem::Storage));
    }
  }
};

// grid: (max_splits, num_kv_heads * group_tiles, T) block: (Traits::kThreads)
template <typename Traits, bool kExtend>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kMinBlocksPerSm)
    simt_attention_kernel(const __grid_constant__ AttentionParams params) {
  __shared__ typename SimtKernel<Traits, kExtend>::SharedStorage smem;
  SimtKernel<Traits, kExtend>::run(params, smem);
}

}  // namespace attnkit::triton
