// The triton backend's tensor-core extend kernel (SM80+, bf16/f16 activations): FlashAttention-2
// structure over token indices.
//
// One block = kBlockM query rows of one request x one q head; 4 warps, each owning 16 rows.
// The mainloop walks key tiles of kBlockN keys over the request's key index space (pool prefix
// through kv_indices, then the new tokens from the contiguous inputs or the pool), double-buffered
// in shared memory: native-dtype tiles arrive by cp.async while the previous tile is computed;
// fp8/fp4 tiles are dequantised in registers on the way in. S = Q K^T and O += P V run on
// mma.sync m16n8k16 with f32 accumulators; the online softmax keeps two rows per thread.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "backends/triton/kernels/attention_params.h"
#include "backends/triton/kernels/attention_variant.cuh"
#include "cuda/common/dtype_convert.cuh"
#include "cuda/common/mma_sm80.cuh"
#include "cuda/common/online_softmax.cuh"

namespace attnkit::triton {

template <int kHeadDim, DType kQ, DType kKV>
struct MmaExtendTraits {
  static constexpr int kD = kHeadDim;
  static constexpr DType kQDType = kQ;
  static constexpr DType kKVDType = kKV;
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockM = kWarps * cuda::kMmaM;  // 64 query rows
  static constexpr int kBlockN = kD > 128 ? 32 : 64;    // keys per tile (register budget)
  static constexpr int kPad = 8;                        // elements: conflict-free ldmatrix rows
  static constexpr int kRowStride = kD + kPad;          // smem row stride (elements)
  static constexpr int kNTilesS = kBlockN / cuda::kMmaN;
  static constexpr int kNTilesO = kD / cuda::kMmaN;
  static constexpr int kKStepsQK = kD / cuda::kMmaK;
  static constexpr int kKStepsPV = kBlockN / cuda::kMmaK;
  static constexpr int kChunksPerRow = kD / cuda::kVecElems;  // 16-byte chunks
  static constexpr bool kNativeKV = kKV == kQ;
  static constexpr int kStages = 2;
  static constexpr int kSmemElems = (kBlockM + 2 * kStages * kBlockN) * kRowStride;

  static_assert(kQ == DType::kBF16 || kQ == DType::kF16, "tensor cores take bf16/f16");
  static_assert(kD % cuda::kMmaK == 0, "head dim must be a multiple of 16");
  static_assert(kBlockN % (2 * cuda::kMmaN) == 0, "key tile must hold whole ldmatrix_x4 pairs");
  static_assert(kNTilesO % 2 == 0, "P.V loads V fragments in pairs of n-tiles");
};

template <typename Traits>
struct MmaExtendKernel {
  using T = typename cuda::ActivationType<Traits::kQDType>::type;
  using PoolElem = cuda::ElemTraits<Traits::kKVDType>;
  using Variant = AttentionVariant<true>;
  static constexpr int kD = Traits::kD;
  static constexpr int kBM = Traits::kBlockM;
  static constexpr int kBN = Traits::kBlockN;
  static constexpr int kRS = Traits::kRowStride;

  static size_t smem_bytes() {
    return Traits::kSmemElems * sizeof(T) + Traits::kStages * sizeof(TileRows);
  }

  struct Ctx {
    const AttentionParams* p;
    int b, q_begin, num_q, num_prefix, num_new, kv_head;
    const int32_t* indices;    // this request's pool-key slots
    const int64_t* new_slots;  // [num_new] when the new keys come from the pool
  };

  // Global address of row `j` of K (is_v = false) or V for this request and kv head; nullptr for
  // keys outside [0, total). Pool rows in the pool dtype, new rows in the activation dtype.
  __device__ __forceinline__ static const char* key_row(const Ctx& c, int j, bool is_v,
                                                        bool& from_pool, int64_t& slot) {
    const AttentionParams& p = *c.p;
    from_pool = true;
    slot = 0;
    if (j < c.num_prefix) {
      slot = c.indices[j];
    } else if (p.k_new != nullptr) {
      from_pool = false;
      const int t = c.q_begin + j - c.num_prefix;
      const T* base = static_cast<const T*>(is_v ? p.v_new : p.k_new);
      return reinterpret_cast<const char*>(
          base + t * (is_v ? p.vn_stride_token : p.kn_stride_token) +
          c.kv_head * (is_v ? p.vn_stride_head : p.kn_stride_head));
    } else {
      slot = c.new_slots[j - c.num_prefix];
    }
    const int64_t elems = slot * (is_v ? p.v_stride_row : p.k_stride_row) +
                          c.kv_head * (is_v ? p.v_stride_head : p.k_stride_head);
    const char* base = static_cast<const char*>(is_v ? p.v_pool : p.k_pool);
    if constexpr (Traits::kKVDType == DType::kFP4E2M1) {
      return base + elems / 2;
    } else {
      return base + elems * static_cast<int64_t>(sizeof(typename PoolElem::Storage));
    }
  }

  // Where the rows of one key tile live: computed once per key (not once per 16-byte chunk).
  struct TileRows {
    const char* row[2][kBN];       // [K | V][key] global row address; nullptr = outside the keys
    const uint8_t* scale[2][kBN];  // fp4 block scales of the row (pool rows only)
    bool pool[2][kBN];             // row in the pool dtype (else the activation dtype)
  };

  // Loads keys [n0, n0 + kBN) of K and V into smem (zero rows outside [0, total)). Called by the
  // whole block (it synchronises once after publishing the row addresses).
  __device__ __forceinline__ static void load_kv_tile(const Ctx& c, int n0, int total, T* ks, T* vs,
                                                      TileRows& rows) {
    if (threadIdx.x < 2 * kBN) {
      const bool is_v = threadIdx.x >= kBN;
      const int r = threadIdx.x % kBN;
      const int j = n0 + r;
      const char* row = nullptr;
      const uint8_t* scale = nullptr;
      bool from_pool = true;
      if (j < total) {
        int64_t slot;
        row = key_row(c, j, is_v, from_pool, slot);
        if constexpr (Traits::kKVDType == DType::kFP4E2M1) {
          const AttentionParams& p = *c.p;
          scale = is_v ? p.v_scales + slot * p.vs_stride_row + c.kv_head * p.vs_stride_head
                       : p.k_scales + slot * p.ks_stride_row + c.kv_head * p.ks_stride_head;
        }
      }
      rows.row[is_v][r] = row;
      rows.scale[is_v][r] = scale;
      rows.pool[is_v][r] = from_pool;
    }
    __syncthreads();
    constexpr int kChunks = kBN * Traits::kChunksPerRow;
    for (int idx = threadIdx.x; idx < 2 * kChunks; idx += Traits::kThreads) {
      const int is_v = idx >= kChunks;
      const int local = is_v ? idx - kChunks : idx;
      const int r = local / Traits::kChunksPerRow;
      const int e = (local % Traits::kChunksPerRow) * cuda::kVecElems;
      T* dst = (is_v ? vs : ks) + r * kRS + e;
      const char* row = rows.row[is_v][r];
      if (row == nullptr) {
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
      } else if (Traits::kNativeKV || !rows.pool[is_v][r]) {
        cuda::cp_async_16(cuda::smem_addr(dst), row + e * sizeof(T), 16);
      } else {
        float f[cuda::kVecElems];
        PoolElem::convert(PoolElem::load(row, e), rows.scale[is_v][r], e, f);
        cuda::store8(dst, f);
      }
    }
    cuda::cp_async_commit();
  }

  __device__ static void run(const AttentionParams& p, T* smem) {
    const int m_tiles = (p.num_tokens > 0 ? gridDim.x / p.bs : 0);
    const int b = blockIdx.x / m_tiles;
    const int m_tile = blockIdx.x % m_tiles;
    const int q_head = blockIdx.y;
    Ctx c;
    c.p = &p;
    c.b = b;
    c.q_begin = p.q_start[b];
    c.num_q = p.q_len[b];
    const int m0 = m_tile * kBM;
    if (m0 >= c.num_q) return;
    c.num_prefix = p.kv_indptr[b + 1] - p.kv_indptr[b];
    c.num_new = p.has_new_keys ? c.num_q : 0;
    c.kv_head = q_head / p.group_size;
    c.indices = p.kv_indices + p.kv_indptr[b];
    c.new_slots = p.new_slots + c.q_begin;
    const int total = c.num_prefix + c.num_new;
    const int rows_here = min(kBM, c.num_q - m0);

    // Key range of the whole tile: union of its rows' visible ranges.
    const Variant first = Variant::make(p, b, c.num_prefix, c.num_new, m0);
    const Variant last = Variant::make(p, b, c.num_prefix, c.num_new, m0 + rows_here - 1);
    const int k_lo = first.lo;
    const int k_hi = max(first.hi, last.hi);

    T* qs = smem;
    T* kv_base = smem + kBM * kRS;
    TileRows* tile_rows = reinterpret_cast<TileRows*>(smem + Traits::kSmemElems);
    auto ks = [&](int stage) { return kv_base + stage * 2 * kBN * kRS; };
    auto vs = [&](int stage) { return kv_base + stage * 2 * kBN * kRS + kBN * kRS; };

    // Q tile.
    const T* q_base = static_cast<const T*>(p.q);
    for (int idx = threadIdx.x; idx < kBM * Traits::kChunksPerRow; idx += Traits::kThreads) {
      const int r = idx / Traits::kChunksPerRow;
      const int e = (idx % Traits::kChunksPerRow) * cuda::kVecElems;
      T* dst = qs + r * kRS + e;
      if (r < rows_here) {
        const T* src =
            q_base + (c.q_begin + m0 + r) * p.q_stride_token + q_head * p.q_stride_head + e;
        cuda::cp_async_16(cuda::smem_addr(dst), src, 16);
      } else {
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
      }
    }
    const int n_begin = (k_lo / kBN) * kBN;
    if (n_begin < k_hi)
      load_kv_tile(c, n_begin, total, ks(0), vs(0), tile_rows[0]);
    else
      cuda::cp_async_commit();

    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int g = lane / 4;
    const int t4 = lane % 4;
    // Rows of this thread (within the request): r0 = warp rows + g, r1 = r0 + 8.
    const int row0 = m0 + warp * cuda::kMmaM + g;
    const int row1 = row0 + 8;
    const Variant var0 = Variant::make(p, b, c.num_prefix, c.num_new, min(row0, c.num_q - 1));
    const Variant var1 = Variant::make(p, b, c.num_prefix, c.num_new, min(row1, c.num_q - 1));
    const bool valid0 = row0 < c.num_q, valid1 = row1 < c.num_q;
    // Keys every row of the block sees: [lo_max, hi_min) (the last row has the largest lo, the
    // first row the smallest hi).
    const bool has_mask = first.mask_row != nullptr;
    const int lo_max = last.lo;
    const int hi_min = min(first.hi, last.hi);

    float o[Traits::kNTilesO][4];
#pragma unroll
    for (int n = 0; n < Traits::kNTilesO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    cuda::SoftmaxState st0, st1;
    uint32_t qf[Traits::kKStepsQK][4];

    int stage = 0;
    bool q_loaded = false;
    for (int n0 = n_begin; n0 < k_hi; n0 += kBN, stage ^= 1) {
      cuda::cp_async_wait<0>();
      __syncthreads();
      if (!q_loaded) {
#pragma unroll
        for (int kk = 0; kk < Traits::kKStepsQK; ++kk) {
          const int i = lane / 8, r = lane % 8;
          const T* src =
              qs + (warp * cuda::kMmaM + r + (i & 1) * 8) * kRS + kk * cuda::kMmaK + (i >> 1) * 8;
          cuda::ldmatrix_x4(qf[kk], cuda::smem_addr(src));
        }
        q_loaded = true;
      }
      // Prefetch the next tile into the other stage (its last readers passed the barrier above).
      if (n0 + kBN < k_hi) {
        load_kv_tile(c, n0 + kBN, total, ks(stage ^ 1), vs(stage ^ 1), tile_rows[stage ^ 1]);
      }

      // S = Q K^T.
      float s[Traits::kNTilesS][4];
#pragma unroll
      for (int n = 0; n < Traits::kNTilesS; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
      const T* kt = ks(stage);
#pragma unroll
      for (int kk = 0; kk < Traits::kKStepsQK; ++kk) {
#pragma unroll
        for (int n = 0; n < Traits::kNTilesS; n += 2) {
          const int i = lane / 8, r = lane % 8;
          const T* src =
              kt + (n * cuda::kMmaN + r + (i >> 1) * 8) * kRS + kk * cuda::kMmaK + (i & 1) * 8;
          uint32_t bf[4];
          cuda::ldmatrix_x4(bf, cuda::smem_addr(src));
          const uint32_t b0[2] = {bf[0], bf[1]};
          const uint32_t b1[2] = {bf[2], bf[3]};
          cuda::mma_m16n8k16<T>(s[n], qf[kk], b0);
          cuda::mma_m16n8k16<T>(s[n + 1], qf[kk], b1);
        }
      }
      // Logits, masks, online softmax (two rows per thread). A tile inside every row's visible
      // range (no tree mask) needs no per-element checks.
      float mx0 = -INFINITY, mx1 = -INFINITY;
      const bool full_tile = !has_mask && n0 >= lo_max && n0 + kBN <= hi_min;
      if (full_tile) {
#pragma unroll
        for (int n = 0; n < Traits::kNTilesS; ++n) {
#pragma unroll
          for (int x = 0; x < 4; ++x) s[n][x] = var0.logit(s[n][x]);
          mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
          mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
        }
      } else {
#pragma unroll
        for (int n = 0; n < Traits::kNTilesS; ++n) {
#pragma unroll
          for (int x = 0; x < 4; ++x) {
            const int j = n0 + n * cuda::kMmaN + 2 * t4 + (x & 1);
            const bool upper = x < 2;
            const Variant& v = upper ? var0 : var1;
            const bool ok = (upper ? valid0 : valid1) && j >= v.lo && j < v.hi && v.key_visible(j);
            s[n][x] = ok ? v.logit(s[n][x]) : -INFINITY;
            if (upper)
              mx0 = fmaxf(mx0, s[n][x]);
            else
              mx1 = fmaxf(mx1, s[n][x]);
          }
        }
      }
#pragma unroll
      for (int off = 1; off < 4; off *= 2) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
      }
      const float f0 = st0.rescale_to(mx0);
      const float f1 = st1.rescale_to(mx1);
#pragma unroll
      for (int n = 0; n < Traits::kNTilesO; ++n) {
        o[n][0] *= f0, o[n][1] *= f0, o[n][2] *= f1, o[n][3] *= f1;
      }
      float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
      for (int n = 0; n < Traits::kNTilesS; ++n) {
        s[n][0] = exp2f(s[n][0] - st0.m), s[n][1] = exp2f(s[n][1] - st0.m);
        s[n][2] = exp2f(s[n][2] - st1.m), s[n][3] = exp2f(s[n][3] - st1.m);
        sum0 += s[n][0] + s[n][1];
        sum1 += s[n][2] + s[n][3];
      }
      st0.d += sum0;  // per-thread partial sums; reduced across the quad at the end
      st1.d += sum1;
      // O += P V.
      const T* vt = vs(stage);
#pragma unroll
      for (int kk = 0; kk < Traits::kKStepsPV; ++kk) {
        uint32_t pa[4];
        pa[0] = cuda::pack2<T>(s[2 * kk][0], s[2 * kk][1]);
        pa[1] = cuda::pack2<T>(s[2 * kk][2], s[2 * kk][3]);
        pa[2] = cuda::pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        pa[3] = cuda::pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
        for (int n = 0; n < Traits::kNTilesO; n += 2) {
          const int i = lane / 8, r = lane % 8;
          const T* src =
              vt + (kk * cuda::kMmaK + r + (i & 1) * 8) * kRS + n * cuda::kMmaN + (i >> 1) * 8;
          uint32_t bf[4];
          cuda::ldmatrix_x4_trans(bf, cuda::smem_addr(src));
          const uint32_t b0[2] = {bf[0], bf[1]};
          const uint32_t b1[2] = {bf[2], bf[3]};
          cuda::mma_m16n8k16<T>(o[n], pa, b0);
          cuda::mma_m16n8k16<T>(o[n + 1], pa, b1);
        }
      }
      __syncthreads();  // everyone is done with this stage before it is refilled
    }
    cuda::cp_async_wait<0>();

    // Epilogue: quad-reduce the denominators, finalize (sinks, v_scale), store.
#pragma unroll
    for (int off = 1; off < 4; off *= 2) {
      st0.d += __shfl_xor_sync(0xffffffffu, st0.d, off);
      st1.d += __shfl_xor_sync(0xffffffffu, st1.d, off);
    }
    const Finalized fin0 = finalize(p, q_head, st0.m, st0.d);
    const Finalized fin1 = finalize(p, q_head, st1.m, st1.d);
    T* out = static_cast<T*>(p.out);
#pragma unroll
    for (int n = 0; n < Traits::kNTilesO; ++n) {
      const int e = n * cuda::kMmaN + 2 * t4;
      if (valid0) {
        T* dst = out + (c.q_begin + row0) * p.o_stride_token + q_head * p.o_stride_head + e;
        *reinterpret_cast<uint32_t*>(dst) = cuda::pack2<T>(o[n][0] * fin0.inv, o[n][1] * fin0.inv);
      }
      if (valid1) {
        T* dst = out + (c.q_begin + row1) * p.o_stride_token + q_head * p.o_stride_head + e;
        *reinterpret_cast<uint32_t*>(dst) = cuda::pack2<T>(o[n][2] * fin1.inv, o[n][3] * fin1.inv);
      }
    }
    if (p.lse != nullptr && t4 == 0) {
      if (valid0) p.lse[(c.q_begin + row0) * p.lse_stride_token + q_head] = fin0.lse;
      if (valid1) p.lse[(c.q_begin + row1) * p.lse_stride_token + q_head] = fin1.lse;
    }
  }
};

// grid: (bs * ceil(max_q_len / kBlockM), num_q_heads) block: (Traits::kThreads)
template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads)
    mma_extend_kernel(const __grid_constant__ AttentionParams params) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  using T = typename cuda::ActivationType<Traits::kQDType>::type;
  MmaExtendKernel<Traits>::run(params, reinterpret_cast<T*>(smem_raw));
}

}  // namespace attnkit::triton
