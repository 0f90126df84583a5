// The triton backend's tensor-core split-KV decode (SM80+, bf16/f16 activations, pool of the
// activation dtype or fp8). Triton's own grouped decode kernel runs its q-head group through
// tl.dot; this is the CUDA C++ counterpart: one CTA per (split, kv head, 16-head tile of its GQA
// group, request), the keys streamed by the shared ring core (cuda/common/ring_decode.cuh:
// per-warp cp.async rings, mma.sync). What stays the triton backend's own: the split-KV heuristic
// (split_plan.h: a per-forward chunk floor, then per request from its own length), the flattened
// token indices of the plan (kv_indices: any page size), the decode variant (sliding window,
// soft-cap) and the epilogue (finalize(): sinks, v_scale, LSE; or the partial + log2 LSE, merged by
// the request's last split CTA of the head block: no second launch). SM75 and the other dtypes keep
// the SIMT kernel (simt_attention.cuh) and its merge kernel.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "backends/triton/kernels/attention_params.h"
#include "backends/triton/kernels/attention_variant.cuh"
#include "backends/triton/kernels/split_kv_merge.cuh"
#include "backends/triton/kernels/split_plan.h"
#include "backends/triton/kernels/triton_kernels.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/dtype_convert.cuh"
#include "cuda/common/online_softmax.cuh"
#include "cuda/common/per_device_once.h"
#include "cuda/common/ring_decode.cuh"
#include "cuda/common/smem_fit.h"

namespace attnkit::triton {

static_assert(kMmaDecodeGroupTile == cuda::ring::kRows, "the host plans the ring core's tile");

// The fused split-KV merge of one head block (q heads head0 .. head0 + rows - 1 of decode token
// `token`), by every thread of the CTA that counted itself last: one thread per (row, 4 columns)
// runs the shared core cuda::ring::merge_partials4 (the row's partial LSEs and its 4 columns of up
// to 16 partials in flight at once, the columns staged in `stage`, the CTA's shared memory, free
// after attend; then merged online: max, weights 2^(lse - max), 0 for a split that saw no key),
// one L2 round trip per 16 splits; finalize() adds the sink.
template <typename Tr>
__device__ __forceinline__ void merge_head_block(const AttentionParams& p, int token, int head0,
                                                 int rows, int num_splits, float4* stage) {
  using QT = typename Tr::QT;
  constexpr int kVec4 = Tr::kHeadDim / 4;
  const int64_t split_stride = static_cast<int64_t>(p.num_tokens) * p.num_q_heads;
  const int64_t th0 = static_cast<int64_t>(token) * p.num_q_heads + head0;
#pragma unroll 1
  for (int c = threadIdx.x; c < rows * kVec4; c += Tr::kThreads) {
    const int r = c / kVec4;
    const int col = (c % kVec4) * 4;
    const float* lse_src = p.partial_lse + th0 + r;
    const float* src = p.partial_out + (th0 + r) * Tr::kHeadDim + col;
    const int64_t step = split_stride * Tr::kHeadDim;
    const cuda::ring::Merged4 m = cuda::ring::merge_partials4<Tr>(
        num_splits, -INFINITY, [&](int s) { return __ldcg(lse_src + s * split_stride); },
        [&](int s) { return src + s * step; }, stage);
    const int qh = head0 + r;
    const Finalized f = finalize(p, qh, m.max, m.sum);
    const uint2 packed = make_uint2(cuda::pack2<QT>(m.acc[0] * f.inv, m.acc[1] * f.inv),
                                    cuda::pack2<QT>(m.acc[2] * f.inv, m.acc[3] * f.inv));
    *reinterpret_cast<uint2*>(static_cast<QT*>(p.out) + token * p.o_stride_token +
                              qh * p.o_stride_head + col) = packed;
    if (col == 0 && p.lse != nullptr) p.lse[token * p.lse_stride_token + qh] = f.lse;
  }
}

// One split [k_begin, k_end) of decode token `token`'s keys for q heads head0 .. head0 + rows - 1
// (kv head
// `kv_head`): streams it through the ring core, then writes the output (one split) or the partial
// and, in the CTA that counts itself last, the fused merge.
template <typename Tr>
__device__ __forceinline__ void decode_split(const AttentionParams& p, uint8_t* smem,
                                             const AttentionVariant<false>& var, int token,
                                             int kv_head, int head0, int rows, int split,
                                             int num_splits, int k_begin, int k_end) {
  using QT = typename Tr::QT;
  cuda::ring::Work w;
  w.rows = rows;
  w.kv_begin = k_begin;
  w.kv_end = k_end;
  w.k_base = static_cast<const uint8_t*>(p.k_pool) +
             static_cast<int64_t>(kv_head) * p.k_stride_head * Tr::kKvElemBytes;
  w.v_base = static_cast<const uint8_t*>(p.v_pool) +
             static_cast<int64_t>(kv_head) * p.v_stride_head * Tr::kKvElemBytes;
  w.k_row_bytes = static_cast<uint32_t>(p.k_stride_row * Tr::kKvElemBytes);  // < 2^32: host check
  w.v_row_bytes = static_cast<uint32_t>(p.v_stride_row * Tr::kKvElemBytes);
  w.scale_log2 = var.scale_log2;
  w.scale = var.sm_scale;
  w.logit_cap = var.cap;

  const QT* q = static_cast<const QT*>(p.q) + token * p.q_stride_token;
  const int32_t* indices = p.kv_indices + p.kv_indptr[token];
  const auto q_row = [&](int r) { return q + (head0 + r) * p.q_stride_head; };
  const auto slot_of = [&](int key) { return cuda::ring::SlotRef{indices + key, 0}; };
  const auto write = [&](int r, int col, float(&acc)[8], float mx, float dsum) {
    const int qh = head0 + r;
    if (num_splits == 1) {
      const Finalized f = finalize(p, qh, mx, dsum);
      cuda::ring::store8<QT>(
          static_cast<QT*>(p.out) + token * p.o_stride_token + qh * p.o_stride_head + col, acc,
          f.inv);
      if (col == 0 && p.lse != nullptr) p.lse[token * p.lse_stride_token + qh] = f.lse;
      return;
    }
    const int64_t row = (static_cast<int64_t>(split) * p.num_tokens + token) * p.num_q_heads + qh;
    const float inv = cuda::row_inv(dsum);
    float4* dst = reinterpret_cast<float4*>(p.partial_out + row * Tr::kHeadDim + col);
    dst[0] = make_float4(acc[0] * inv, acc[1] * inv, acc[2] * inv, acc[3] * inv);
    dst[1] = make_float4(acc[4] * inv, acc[5] * inv, acc[6] * inv, acc[7] * inv);
    if (col == 0) p.partial_lse[row] = cuda::row_log2_lse(mx, dsum);
  };
  cuda::ring::attend<Tr>(w, smem, q_row, slot_of, write);
  if (num_splits == 1) return;
  // Fused merge: the last of the request's split CTAs of this head block merges the partials.
  int* counter = p.split_counters + static_cast<int64_t>(token) * gridDim.x + blockIdx.x;
  const bool last = p.split_sync_fence_all != 0
                        ? cuda::ring::last_split_cta(counter, num_splits)
                        : cuda::ring::last_split_cta_acq_rel(counter, num_splits);
  if (!last) return;
  merge_head_block<Tr>(p, token, head0, w.rows, num_splits, reinterpret_cast<float4*>(smem));
}

// grid: (num_kv_heads * group_tiles, grid_splits, T) block: (Tr::kThreads); smem Tr::kSmemBytes.
// The kv heads of one (request, split) are adjacent in launch order, so they stream the same pool
// rows (one slot holds all heads) at about the same time.
template <typename Tr>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocks)
    mma_decode_kernel(const __grid_constant__ AttentionParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int token = p.token_base + static_cast<int>(blockIdx.z);  // decode: request b owns token b
  const int kv_head = blockIdx.x / p.group_tiles;
  const int tile = blockIdx.x % p.group_tiles;
  const int num_prefix = p.kv_indptr[token + 1] - p.kv_indptr[token];
  const AttentionVariant<false> var = AttentionVariant<false>::make(p, token, num_prefix, 0, 0);
  int num_splits = 1;
  int chunk = 0;
  if (p.max_splits > 1) {
    const int n = max(0, var.hi - var.lo);
    const int min_chunk = forward_min_chunk(p);
    chunk = split_chunk(n, p.max_splits, min_chunk);
    num_splits = split_count(n, p.max_splits, min_chunk);
  }
  const int head0 = kv_head * p.group_size + tile * cuda::ring::kRows;
  const int rows = min(cuda::ring::kRows, p.group_size - tile * cuda::ring::kRows);
  // Splits blockIdx.y, blockIdx.y + gridDim.y, ...: eager launches size gridDim.y to the plan's
  // largest split count (one pass); a CUDA graph, whose grid is fixed at capture, launches only
  // as many as its batch size needs to fill the GPU (launch_mma_decode's caller), so that large
  // batches do not pay for thousands of CTAs that find no split.
  for (int split = blockIdx.y; split < num_splits; split += gridDim.y) {
    if (split != static_cast<int>(blockIdx.y)) __syncthreads();  // smem of the previous split
    const int k_begin = var.lo + split * chunk;
    const int k_end = num_splits > 1 ? min(var.hi, k_begin + chunk) : var.hi;
    decode_split<Tr>(p, smem, var, token, kv_head, head0, rows, split, num_splits, k_begin, k_end);
  }
}

// p.split_counters: [T, num_kv_heads * ceil(group / 16)] zeros when p.max_splits > 1.
template <typename Tr>
Status launch_ring_decode(AttentionParams p, int grid_splits, StreamHandle stream) {
  ATTNKIT_RETURN_IF_ERROR(cuda::check_smem_fits(Tr::kSmemBytes, "triton: the decode CTA"));
  static cuda::PerDeviceOnce attributes;  // per instantiation and device (per_device_once.h)
  ATTNKIT_CUDA_TRY(attributes.run([] {
    cudaError_t e = cudaFuncSetAttribute(
        mma_decode_kernel<Tr>, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes);
    if (e == cudaSuccess) {
      e = cudaFuncSetAttribute(mma_decode_kernel<Tr>,
                               cudaFuncAttributePreferredSharedMemoryCarveout,
                               cudaSharedmemCarveoutMaxShared);
    }
    return e;
  }));
  p.group_tiles = (p.group_size + cuda::ring::kRows - 1) / cuda::ring::kRows;
  if (p.num_tokens == 0) return Status::ok();
  cudaStream_t s = cuda::to_stream(stream);
  for (int base = 0; base < p.num_tokens; base += kMaxGridTokens) {
    AttentionParams slice = p;
    slice.token_base = base;
    const dim3 grid(p.num_kv_heads * p.group_tiles, grid_splits,
                    std::min(kMaxGridTokens, p.num_tokens - base));
    mma_decode_kernel<Tr><<<grid, Tr::kThreads, Tr::kSmemBytes, s>>>(slice);
    ATTNKIT_CUDA_TRY(cudaGetLastError());
  }
  return Status::ok();
}

// The CTA shape (MmaDecodeRing): one CTA of 8 warps for pools of the activation dtype at head dims
// <= kMmaDecodeOneCtaMaxDim when asked, else 2 CTAs of 4 warps.
template <int kD, DType kQ, DType kKV>
Status launch_mma_decode(const AttentionParams& p, int grid_splits, MmaDecodeRing ring,
                         StreamHandle stream) {
  using QT = typename cuda::ActivationType<kQ>::type;
  if constexpr (kKV == kQ && kD <= kMmaDecodeOneCtaMaxDim) {
    if (ring == MmaDecodeRing::k1x8) {
      return launch_ring_decode<cuda::ring::Traits<kD, QT, kKV, 8, kMmaDecodeOneCtaSmem, 1>>(
          p, grid_splits, stream);
    }
  }
  // The default 2 x 4-warp CTA, or the ring core's compact one where the device cannot opt in to
  // it (smem_fit.h: sm_86 / sm_89).
  using Tr = cuda::ring::Traits<kD, QT, kKV>;
  using Compact = cuda::ring::CompactShape<
      Tr, cuda::ring::Traits<kD, QT, kKV, cuda::ring::compact_warps(kD),
                             cuda::ring::kCompactCtaSmemBudget, cuda::ring::kCompactCtasPerSm>>;
  return cuda::launch_fitting<Tr, Compact>(Tr::kSmemBytes, [&]<typename Shape>() -> Status {
    return launch_ring_decode<Shape>(p, grid_splits, stream);
  });
}

template <int kD, DType kQ>
Status launch_mma_decode_kv(const AttentionParams& p, DType kv_dtype, int grid_splits,
                            MmaDecodeRing ring, StreamHandle stream) {
  switch (kv_dtype) {
    case kQ:
      return launch_mma_decode<kD, kQ, kQ>(p, grid_splits, ring, stream);
    case DType::kFP8E4M3:
      return launch_mma_decode<kD, kQ, DType::kFP8E4M3>(p, grid_splits, ring, stream);
    case DType::kFP8E5M2:
      return launch_mma_decode<kD, kQ, DType::kFP8E5M2>(p, grid_splits, ring, stream);
    default:
      return Status::unsupported(std::string("triton: the tensor-core decode takes a KV pool of ") +
                                 dtype_name(kQ) + ", fp8_e4m3 or fp8_e5m2, not " +
                                 dtype_name(kv_dtype));
  }
}

template <int kD>
Status run_mma_decode(AttentionParams p, DType q_dtype, DType kv_dtype, int grid_splits,
                      MmaDecodeRing ring, StreamHandle stream) {
  switch (q_dtype) {
    case DType::kBF16:
      return launch_mma_decode_kv<kD, DType::kBF16>(p, kv_dtype, grid_splits, ring, stream);
    case DType::kF16:
      return launch_mma_decode_kv<kD, DType::kF16>(p, kv_dtype, grid_splits, ring, stream);
    default:
      return Status::unsupported(
          std::string("triton: the tensor-core decode takes bf16/f16, not ") + dtype_name(q_dtype));
  }
}

}  // namespace attnkit::triton
