// Definition of run_decode_page<kPage>: row-tile and KV-dtype dispatch and launch of the MLA
// decode kernel (run_decode launches the combine after it). Included by one translation unit per
// page size.
#pragma once

#include <string>

#include "backends/mla/kernels/mla_decode.h"
#include "backends/mla/kernels/mla_decode_mma.cuh"
#include "backends/mla/kernels/mla_decode_wgmma.cuh"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/per_device_once.h"

namespace attnkit::mla {

// p with MlaDecodeParams::grid_rows_fastest resolved (resolved_grid_rows_fastest, mla_decode.h).
inline MlaDecodeParams decode_grid_order(const MlaDecodeParams& p, bool wgmma) {
  MlaDecodeParams r = p;
  r.grid_rows_fastest = resolved_grid_rows_fastest(p, wgmma);
  return r;
}

// (parts, row tiles), or (row tiles, parts) with MlaDecodeParams::grid_rows_fastest (resolved).
inline dim3 decode_grid(const MlaDecodeParams& p, int rows_per_cta) {
  const unsigned tiles = static_cast<unsigned>((p.rows_per_req + rows_per_cta - 1) / rows_per_cta);
  const unsigned parts = static_cast<unsigned>(p.num_parts);
  return p.grid_rows_fastest != 0 ? dim3(tiles, parts) : dim3(parts, tiles);
}

template <int kWarpsM, int kPage, bool kFp8, bool kF16 = false, bool kPtSmem = false>
Status launch_decode(const MlaDecodeParams& p_in, cudaStream_t s) {
  const MlaDecodeParams p = decode_grid_order(p_in, /*wgmma=*/false);
  using Traits = MlaDecodeTraits<kWarpsM, kPage, kFp8, kF16, kPtSmem>;
  static cuda::PerDeviceOnce opt_in;  // per instantiation and device (per_device_once.h)
  ATTNKIT_CUDA_TRY(opt_in.run([] {
    return cudaFuncSetAttribute(mla_decode_kernel<Traits>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes);
  }));
  const dim3 grid = decode_grid(p, Traits::kRows);
  mla_decode_kernel<Traits><<<grid, Traits::kThreads, Traits::kSmemBytes, s>>>(p);
  ATTNKIT_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

template <int kPage, int kVariant, bool kFp8 = false>
Status launch_decode_wgmma(const MlaDecodeParams& p_in, cudaStream_t s) {
  const MlaDecodeParams p = decode_grid_order(p_in, /*wgmma=*/true);
  using Traits = MlaWgmmaTraits<kPage>;
  static cuda::PerDeviceOnce opt_in;  // per instantiation and device (per_device_once.h)
  ATTNKIT_CUDA_TRY(opt_in.run([] {
    return cudaFuncSetAttribute(mla_decode_wgmma_kernel<kPage, kVariant, kFp8>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes);
  }));
  const dim3 grid = decode_grid(p, Traits::kRows);
  mla_decode_wgmma_kernel<kPage, kVariant, kFp8>
      <<<grid, Traits::kThreads, Traits::kSmemBytes, s>>>(p);
  ATTNKIT_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

// MlaDecodeParams::mma_prefetch 2 (default) -> 0 / 1 / 3 for a tile of `rows` rows, on only where
// an A/B measured a gain (H200, session 8): 16-row tiles at page 64 (flashmla) read the page table
// through the shared-memory ring (3; 07:39Z, two alternated rounds, 16 heads b128: bf16 kv 4k / 8k
// 0.1646-0.1672 / 0.3127-0.3132 ms vs 0.1942-0.1954 / 0.3667-0.3692 = 86.7-87.9 / 92.2% of copy
// vs 74.0-78.6%; fp8 0.1339-0.1348 / 0.2436-0.2472 vs 0.1745-0.1747 / 0.3280-0.3286 ms; every MLA
// GPU test 419/419 with it forced); bf16 32-row tiles (+10% on 16 heads x s_q 2) and the other
// pages' f16 fp8 16-row tiles read it one tile ahead in registers (1). Off for the other pages'
// bf16 16-row tiles (-13..-17% with the register prefetch; the ring was not timed there) and
// everything not measured (fp8 32-row, 64-row tiles).
inline MlaDecodeParams resolve_prefetch(const MlaDecodeParams& p, int rows, bool fp8, int page) {
  MlaDecodeParams r = p;
  if (r.mma_prefetch == 2) {
    if (rows == 16 && page == 64) {
      r.mma_prefetch = 3;
    } else {
      r.mma_prefetch = (rows == 32 && !fp8) || (rows == 16 && fp8 && p.mma_fp8_f16 != 0) ? 1 : 0;
    }
  }
  return r;
}

template <int kPage, bool kFp8>
Status launch_rows(const MlaDecodeParams& p_in, cudaStream_t s) {
  const MlaDecodeParams p = resolve_prefetch(p_in, rows_per_cta(p_in.rows_per_req), kFp8, kPage);
  if constexpr (!kFp8) {
    if (runs_wgmma(p, kPage, /*fp8=*/false)) {
      if (p.use_wgmma == 1) return launch_decode_wgmma<kPage, 0>(p, s);
      if (p.use_wgmma == 2) return launch_decode_wgmma<kPage, 1>(p, s);
      if (p.use_wgmma == 3) return launch_decode_wgmma<kPage, 2>(p, s);
      if (p.use_wgmma == 7) return launch_decode_wgmma<kPage, 6>(p, s);  // phantom skip
      if (p.use_wgmma == 8) return launch_decode_wgmma<kPage, 7>(p, s);  // + early S0
      if (p.use_wgmma == 9) return launch_decode_wgmma<kPage, 8>(p, s);  // + own P1 buffer
      return launch_decode_wgmma<kPage, 3>(p, s);                        // 4: the seesaw
    }
  } else {
    // fp8 cache: the seesaw without the phantom tile (variant 6), the consumers
    // converting the raw tiles (mla_decode_wgmma.cuh kFp8), whatever ATTNKIT_MLA_WGMMA_BLOCKS says;
    // ATTNKIT_MLA_WGMMA_FP8=0 (MlaDecodeParams::wgmma_fp8) keeps the mma.sync kernel.
    // Page 1 (flashinfer's MLA) has no fp8 cache (its descriptor), so no instantiation there.
    if constexpr (kPage != 1) {
      if (fp8_on_wgmma(p, kPage)) return launch_decode_wgmma<kPage, 6, true>(p, s);
    }
  }
  switch (rows_per_cta(p.rows_per_req)) {
    case 16:
      if (p.mma_prefetch == 3) {  // page-table ring in shared memory
        if constexpr (kFp8) {
          if (p.mma_fp8_f16 != 0) return launch_decode<1, kPage, true, true, true>(p, s);
        }
        return launch_decode<1, kPage, kFp8, false, true>(p, s);
      }
      if constexpr (kFp8) {
        if (p.mma_fp8_f16 != 0) return launch_decode<1, kPage, true, true>(p, s);
      }
      return launch_decode<1, kPage, kFp8>(p, s);
    case 32:
      return launch_decode<2, kPage, kFp8>(p, s);
    default:
      return launch_decode<4, kPage, kFp8>(p, s);
  }
}

template <int kPage>
Status run_decode_page(const MlaDecodeParams& p, DType kv_dtype, StreamHandle stream) {
  cudaStream_t s = cuda::to_stream(stream);
  if (kv_dtype == DType::kBF16) return launch_rows<kPage, false>(p, s);
  if (kv_dtype == DType::kFP8E4M3) return launch_rows<kPage, true>(p, s);
  return Status::unsupported(std::string("mla decode: kv cache dtype ") + dtype_name(kv_dtype) +
                             " is not supported (accepted: bf16, fp8_e4m3)");
}

}  // namespace attnkit::mla
