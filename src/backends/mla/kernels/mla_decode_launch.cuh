// Definition of run_decode_page<kPage>: row-tile and KV-dtype dispatch and launch of the MLA
// decode kernel (run_decode launches the combine after it). Included by one translation unit per
// page size.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backends/mla/kernels/mla_decode.h"
#include "backends/mla/kernels/mla_decode_mma.cuh"
#include "backends/mla/kernels/mla_decode_wgmma.cuh"
#include "cuda/common/cuda_check.cuh"

namespace attnkit::mla {

template <int kWarpsM, int kPage, bool kFp8, bool kF16 = false, bool kPtSmem = false>
Status launch_decode(const MlaDecodeParams& p, cudaStream_t s) {
  using Traits = MlaDecodeTraits<kWarpsM, kPage, kFp8, kF16, kPtSmem>;
  static bool attribute_set = false;  // per instantiation; the opt-in is process-wide
  if (!attribute_set) {
    ATTNKIT_CUDA_TRY(cudaFuncSetAttribute(mla_decode_kernel<Traits>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          Traits::kSmemBytes));
    attribute_set = true;
  }
  const dim3 grid(p.num_parts, (p.rows_per_req + Traits::kRows - 1) / Traits::kRows);
  mla_decode_kernel<Traits><<<grid, Traits::kThreads, Traits::kSmemBytes, s>>>(p);
  ATTNKIT_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

template <int kPage, int kVariant>
Status launch_decode_wgmma(const MlaDecodeParams& p, cudaStream_t s) {
  using Traits = MlaWgmmaTraits<kPage>;
  static bool attribute_set = false;  // per instantiation; the opt-in is process-wide
  if (!attribute_set) {
    ATTNKIT_CUDA_TRY(cudaFuncSetAttribute(mla_decode_wgmma_kernel<kPage, kVariant>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          Traits::kSmemBytes));
    attribute_set = true;
  }
  const dim3 grid(p.num_parts, (p.rows_per_req + Traits::kRows - 1) / Traits::kRows);
  mla_decode_wgmma_kernel<kPage, kVariant><<<grid, Traits::kThreads, Traits::kSmemBytes, s>>>(p);
  ATTNKIT_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

// The driver's cuTensorMapEncodeTiled through the runtime (no libcuda link); nullptr if absent.
inline PFN_cuTensorMapEncodeTiled_v12000 mla_tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// p->kv_tma = the bf16 pool [kv_rows, kRowDim] (row stride kv_stride_row) as a 2D map, box
// 64 columns x 64 rows, 128-byte swizzle (the K tile layout of the wgmma kernel). The last
// encoding is cached (the pool rarely moves). False if it cannot be encoded.
inline bool encode_kv_tma(MlaDecodeParams* p) {
  struct Cache {
    const void* kv = nullptr;
    int64_t stride = 0, rows = 0;
    MlaTmaDesc desc{};
  };
  static Cache cache;
  if (p->kv_rows <= 0 || reinterpret_cast<uintptr_t>(p->kv) % 16 != 0 ||
      (p->kv_stride_row * 2) % 16 != 0) {
    return false;
  }
  if (cache.kv != p->kv || cache.stride != p->kv_stride_row || cache.rows != p->kv_rows) {
    PFN_cuTensorMapEncodeTiled_v12000 encode = mla_tensor_map_encoder();
    if (encode == nullptr) return false;
    static_assert(sizeof(CUtensorMap) == sizeof(MlaTmaDesc), "TMA descriptor size");
    CUtensorMap map;
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(kRowDim),
                                static_cast<cuuint64_t>(p->kv_rows)};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(p->kv_stride_row * 2)};
    const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(kBlockN)};
    const cuuint32_t elem_strides[2] = {1, 1};
    const CUresult r =
        encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(p->kv), dims, strides,
               box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) return false;
    cache.kv = p->kv;
    cache.stride = p->kv_stride_row;
    cache.rows = p->kv_rows;
    std::memcpy(cache.desc.words, &map, sizeof(map));
  }
  p->kv_tma = cache.desc;
  return true;
}

// The seesaw with TMA K tiles (kVariant 4): a 2-CTA cluster per pair of row tiles when `mcast`,
// the grid has an even number of row tiles and every cluster is resident at once (else one CTA
// per row tile loads its own tiles); falls back to the cp.async seesaw (3) where the pool cannot
// be mapped or the page is 1.
template <int kPage>
Status launch_decode_wgmma_tma(const MlaDecodeParams& p_in, bool mcast, cudaStream_t s) {
  if constexpr (kPage % kBlockN != 0) {
    return launch_decode_wgmma<kPage, 3>(p_in, s);
  } else {
    MlaDecodeParams p = p_in;
    if (!encode_kv_tma(&p)) return launch_decode_wgmma<kPage, 3>(p_in, s);
    using Traits = MlaWgmmaTraits<kPage>;
    auto* kernel = mla_decode_wgmma_kernel<kPage, 4>;
    static int max_clusters = -1;  // per instantiation
    if (max_clusters < 0) {
      ATTNKIT_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            Traits::kSmemBytes));
      cudaLaunchConfig_t cfg{};
      cudaLaunchAttribute attr{};
      attr.id = cudaLaunchAttributeClusterDimension;
      attr.val.clusterDim.x = 1;
      attr.val.clusterDim.y = 2;
      attr.val.clusterDim.z = 1;
      cfg.gridDim = dim3(132, 2);
      cfg.blockDim = dim3(Traits::kThreads);
      cfg.dynamicSmemBytes = Traits::kSmemBytes;
      cfg.attrs = &attr;
      cfg.numAttrs = 1;
      int n = 0;
      if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) {
        (void)cudaGetLastError();
        n = 0;
      }
      max_clusters = n;
      if (std::getenv("ATTNKIT_MLA_DEBUG") != nullptr) {
        std::fprintf(stderr, "mla wgmma tma: max active 2-CTA clusters %d\n", n);
      }
    }
    const dim3 grid(p.num_parts, (p.rows_per_req + Traits::kRows - 1) / Traits::kRows);
    p.wgmma_mcast =
        mcast && grid.y % 2 == 0 && static_cast<int64_t>(grid.x) * grid.y / 2 <= max_clusters ? 1
                                                                                              : 0;
    cudaLaunchConfig_t cfg{};
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = 1;
    attr.val.clusterDim.y = p.wgmma_mcast != 0 ? 2 : 1;
    attr.val.clusterDim.z = 1;
    cfg.gridDim = grid;
    cfg.blockDim = dim3(Traits::kThreads);
    cfg.dynamicSmemBytes = Traits::kSmemBytes;
    cfg.stream = s;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    ATTNKIT_CUDA_TRY(cudaLaunchKernelEx(&cfg, kernel, p));
    return Status::ok();
  }
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
    if (p.use_wgmma != 0 && rows_per_cta(p.rows_per_req) == 64) {
      if (p.use_wgmma == 1) return launch_decode_wgmma<kPage, 0>(p, s);
      if (p.use_wgmma == 2) return launch_decode_wgmma<kPage, 1>(p, s);
      if (p.use_wgmma == 3) return launch_decode_wgmma<kPage, 2>(p, s);
      if (p.use_wgmma == 5 || p.use_wgmma == 6) {
        return launch_decode_wgmma_tma<kPage>(p, p.use_wgmma == 5, s);
      }
      return launch_decode_wgmma<kPage, 3>(p, s);  // 4: the seesaw (default)
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
