// Definition of run_mma_extend<kD>: dtype dispatch and launch of the tensor-core extend kernel.
// Included by one small translation unit per head dim.
#pragma once

#include <cstdlib>
#include <string>

#include "backends/triton/kernels/mma_extend.cuh"
#include "backends/triton/kernels/triton_kernels.h"
#include "core/env_knob.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/per_device_once.h"
#include "cuda/common/smem_fit.h"

namespace attnkit::triton {

template <typename Traits>
Status launch_mma_extend_traits(const AttentionParams& p, int max_q_len, StreamHandle stream) {
  using Kernel = MmaExtendKernel<Traits>;
  constexpr int smem = static_cast<int>(Kernel::smem_bytes());
  static_assert(
      smem == mma_extend_smem_bytes(Traits::kD, {Traits::kBlockN, Traits::kSubN, Traits::kStages}),
      "the host's fit rule (triton_kernels.h) counts this block's bytes");
  ATTNKIT_RETURN_IF_ERROR(cuda::check_smem_fits(smem, "triton: the extend tile"));
  // Opting in to more than 48 KB of dynamic shared memory is a per-function attribute; setting
  // it is idempotent and not a stream operation, so it is done once per instantiation and
  // device (per_device_once.h). The shared-memory carveout is raised to its maximum so two blocks
  // share an SM.
  static cuda::PerDeviceOnce attributes;
  ATTNKIT_CUDA_TRY(attributes.run([smem] {
    const cudaError_t e = cudaFuncSetAttribute(mma_extend_kernel<Traits>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    return cudaFuncSetAttribute(mma_extend_kernel<Traits>,
                                cudaFuncAttributePreferredSharedMemoryCarveout,
                                cudaSharedmemCarveoutMaxShared);
  }));
  const int m_tiles = (max_q_len + Traits::kBlockM - 1) / Traits::kBlockM;
  if (m_tiles == 0 || p.bs == 0) return Status::ok();
  // One-dimensional grid, numbered heaviest query tile first (see mma_extend.cuh).
  ATTNKIT_RETURN_IF_ERROR(check_mma_extend_grid(p.bs, max_q_len, p.num_q_heads, Traits::kD));
  const int64_t blocks = static_cast<int64_t>(p.bs) * m_tiles * p.num_q_heads;
  mma_extend_kernel<Traits>
      <<<static_cast<unsigned>(blocks), Traits::kThreads, smem, cuda::to_stream(stream)>>>(p);
  ATTNKIT_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

// A/B knob (read once): ATTNKIT_TRITON_EXTEND_LEGACY=1 runs the native-KV kernels as before the
// QK^T unroll and the folded scale (QK^T loop not unrolled, scale multiplied into the logits).
inline bool extend_legacy() {
  static const bool legacy = env_flag("ATTNKIT_TRITON_EXTEND_LEGACY", false);
  return legacy;
}

template <int kD, DType kQ, DType kKV>
Status launch_mma_extend(const AttentionParams& p, int max_q_len, StreamHandle stream) {
  if constexpr (kQ == kKV) {
    using Tile = MmaExtendTile<kD, true>;
    // (Where the default tile fits the device; elsewhere the compact tile runs below.)
    if (extend_legacy() &&
        static_cast<int>(MmaExtendKernel<MmaExtendTraits<kD, kQ, kKV>>::smem_bytes()) <=
            cuda::current_device_smem_optin()) {
      return launch_mma_extend_traits<
          MmaExtendTraits<kD, kQ, kKV, Tile::kBlockN, Tile::kSubN, Tile::kStages, 1, false>>(
          p, max_q_len, stream);
    }
  }
  // The default tile, or the compact one where the device cannot opt in to it (smem_fit.h; the
  // backend runs the SIMT kernel where neither fits: mma_extend_fits).
  using Tr = MmaExtendTraits<kD, kQ, kKV>;
  constexpr MmaExtendKeyTile kCompact = mma_extend_tile_compact(kD, kQ == kKV);
  using Compact = MmaExtendTraits<kD, kQ, kKV, kCompact.block_n, kCompact.sub_n, kCompact.stages>;
  return cuda::launch_fitting<Tr, Compact>(
      static_cast<int>(MmaExtendKernel<Tr>::smem_bytes()), [&]<typename Shape>() -> Status {
        return launch_mma_extend_traits<Shape>(p, max_q_len, stream);
      });
}

template <int kD, DType kQ>
Status launch_mma_extend_kv(const AttentionParams& p, DType kv_dtype, int max_q_len,
                            StreamHandle stream) {
  switch (kv_dtype) {
    case kQ:
      return launch_mma_extend<kD, kQ, kQ>(p, max_q_len, stream);
    case DType::kFP8E4M3:
      return launch_mma_extend<kD, kQ, DType::kFP8E4M3>(p, max_q_len, stream);
    case DType::kFP8E5M2:
      return launch_mma_extend<kD, kQ, DType::kFP8E5M2>(p, max_q_len, stream);
    case DType::kFP4E2M1:
      return launch_mma_extend<kD, kQ, DType::kFP4E2M1>(p, max_q_len, stream);
    default:
      return Status::unsupported(std::string("triton: kv cache dtype ") + dtype_name(kv_dtype) +
                                 " with " + dtype_name(kQ) +
                                 " activations (accepted: the activation dtype, fp8_e4m3, "
                                 "fp8_e5m2, fp4_e2m1)");
  }
}

template <int kD>
Status run_mma_extend(AttentionParams p, DType q_dtype, DType kv_dtype, int max_q_len,
                      StreamHandle stream) {
  switch (q_dtype) {
    case DType::kBF16:
      return launch_mma_extend_kv<kD, DType::kBF16>(p, kv_dtype, max_q_len, stream);
    case DType::kF16:
      return launch_mma_extend_kv<kD, DType::kF16>(p, kv_dtype, max_q_len, stream);
    default:
      return Status::unsupported(
          std::string("triton: the tensor-core extend takes bf16/f16, not ") + dtype_name(q_dtype));
  }
}

}  // namespace attnkit::triton
