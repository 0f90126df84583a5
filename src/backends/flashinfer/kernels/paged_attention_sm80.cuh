// Shared pieces of the flashinfer tensor-core kernels (SM80+): constants, plan accessors, the
// in-place page-table slot lookup, fp8 -> bf16/f16 widening, and the decode launch + dtype
// dispatch. The kernels themselves: paged_decode_sm80.cuh (decode and split-KV, on the shared
// cuda/common/ring_decode.cuh core) and paged_prefill_sm80.cuh (prefill/extend, verify and the
// cascade passes).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "attnkit/dtype.h"
#include "attnkit/status.h"
#include "backends/flashinfer/kernels/paged_decode_sm80.cuh"
#include "backends/flashinfer/kernels/paged_params.h"
#include "core/env_knob.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/mma_sm80.cuh"
#include "cuda/common/online_softmax.cuh"
#include "cuda/common/per_device_once.h"
#include "cuda/common/smem_fit.h"

namespace attnkit::flashinfer {

// ---- small device helpers ----
// 16 fp8 values -> 16 QT values (exact: e4m3 and e5m2 embed in f16 and bf16).
template <typename QT, DType kKv>
__device__ __forceinline__ void dequant16(const uint4& raw, uint4 (&out)[2]) {
  constexpr __nv_fp8_interpretation_t kInterp = kKv == DType::kFP8E4M3 ? __NV_E4M3 : __NV_E5M2;
  const __nv_fp8x2_storage_t* src = reinterpret_cast<const __nv_fp8x2_storage_t*>(&raw);
  uint32_t* dst = reinterpret_cast<uint32_t*>(out);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const __half2 h(__nv_cvt_fp8x2_to_halfraw2(src[i], kInterp));
    if constexpr (std::is_same_v<QT, __half>) {
      dst[i] = *reinterpret_cast<const uint32_t*>(&h);
    } else {
      const __nv_bfloat162 b = __float22bfloat162_rn(__half22float2(h));
      dst[i] = *reinterpret_cast<const uint32_t*>(&b);
    }
  }
}

// ---- launch ----
// Programmatic dependent launch of the decode kernel on SM90+ (PagedParams::decode_pdl, the most
// the backend allows): 0 (off), 1 (the CTA waits for the previous grid first thing, so only the
// launch and CTA start overlap it) or 2 (the wait after the plan item and the first page-table
// words, which the previous kernel of the stream must not write; with
// PagedParams::decode_pdl_early the next grid's CTAs do that part while this one streams). H200
// 2026-11-23 10:06Z, --launches 10, b16 kv 4k p16: mode 2 + the early trigger 69.9 us bf16 /
// 39.0 us fp8 vs mode 1 70.4 / 40.0 (fp8/bf16 1.79x vs 1.76x). ATTNKIT_FLASHINFER_PDL = 0 / 1 / 2
// lowers the mode (an A/B knob; it never raises it above what the backend allows).
inline int decode_pdl(int allowed) {
  // Per device (the current one is the backend's): a process may mix GPU generations.
  static cuda::PerDeviceValue limit;
  const int mode = limit.get([] {
    const int m = env_int("ATTNKIT_FLASHINFER_PDL", 2, {0, 1, 2});
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return -1;  // not kept: asked again at the next launch
    }
    return major >= 9 ? m : 0;
  });
  return std::min(allowed, std::max(mode, 0));
}

// The decode kernels: paged_decode_balanced_kernel over a balanced plan (p.balance_slots > 0;
// grid_items = its slots), paged_decode_ring_kernel over WorkItems, and its target-verify form
// (p.decode_verify).
enum class DecodeKernel { kItems, kBalanced, kVerify };

template <typename Tr, DecodeKernel kKind>
Status launch_paged(const PagedParams& p, int grid_items, StreamHandle stream) {
  if (grid_items <= 0) return Status::ok();
  constexpr bool kBalanced = kKind == DecodeKernel::kBalanced;
  // Only the kernel of kKind is instantiated (a ternary would instantiate all three for every
  // shape, the verify-only 32-row CTA included).
  const auto kernel = [] {
    if constexpr (kBalanced) {
      return paged_decode_balanced_kernel<Tr>;
    } else {
      return paged_decode_ring_kernel<Tr, kKind == DecodeKernel::kVerify>;
    }
  }();
  ATTNKIT_RETURN_IF_ERROR(cuda::check_smem_fits(Tr::kSmemBytes, "flashinfer: the decode CTA"));
  if (kBalanced && p.decode_overlap != 0) {  // only the ring kernel has the overlap's end wait
    return Status::internal("flashinfer: decode_overlap on the balanced decode kernel");
  }
  // Per-function attributes, set once per instantiation and device (not stream operations;
  // per_device_once.h): the dynamic shared memory and all of the unified L1/shared storage as
  // shared memory (two decode CTAs per SM need 2 x 107 KB).
  static cuda::PerDeviceOnce attributes;
  ATTNKIT_CUDA_TRY(attributes.run([&] {
    cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes);
    if (e == cudaSuccess) {
      e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                               cudaSharedmemCarveoutMaxShared);
    }
    return e;
  }));
  const auto items = static_cast<unsigned>(grid_items);
  const auto heads = static_cast<unsigned>(p.num_kv_heads);
  // kv heads fastest; a balanced plan's segments name their head.
  const dim3 grid = kBalanced ? dim3(items) : dim3(heads, items);
  // Programmatic dependent launch (SM90+, decode_pdl): the CTAs may start while the previous
  // kernel of the stream finishes (a decode of this kernel triggers right after each CTA's wait
  // with decode_pdl_early, the default, else once its CTAs have streamed their keys); they wait
  // for it (griddepcontrol.wait) before reading anything it may write.
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(Tr::kThreads);
  cfg.dynamicSmemBytes = Tr::kSmemBytes;
  cfg.stream = cuda::to_stream(stream);
  cudaLaunchAttribute attrs[1];
  attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attrs;
  PagedParams launch = p;
  launch.decode_pdl = decode_pdl(p.decode_pdl);
  // decode_overlap (the backend sets decode_pdl 0 with it: no wait at the CTAs' start): a
  // programmatic launch after the wgmma kernel unless ATTNKIT_FLASHINFER_PDL=0 (then a plain one,
  // after it; the kernel's skipped waits and its last CTA's wait hold either way).
  const bool overlap_pdl = p.decode_overlap != 0 && decode_pdl(2) != 0;
  cfg.numAttrs = launch.decode_pdl != 0 || overlap_pdl ? 1 : 0;
  ATTNKIT_CUDA_TRY(cudaLaunchKernelEx(&cfg, kernel, launch));
  ATTNKIT_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

// (The experiment knobs ATTNKIT_FLASHINFER_FP8_TILE, _DECODE_CTA and _SLOT_LOADS of sessions 4-5
// were removed in session 8: their A/Bs are recorded in docs/perf/fidecode_notes.md.)

// Picks the instantiation for (q dtype, kv dtype, tile shape); the default branches name the value.
template <int kD, TileShape kShape>
Status run_paged_impl(const PagedParams& p, DType q_dtype, DType kv_dtype, int grid_items,
                      StreamHandle stream) {
  const auto with_q = [&]<typename QT>() -> Status {
    const auto with_kv = [&]<DType kKv>() -> Status {
      static_assert(kShape == TileShape::kDecode,
                    "prefill runs paged_prefill_sm80.cuh (run_paged_prefill_sm80)");
      // Target verify of 32-row tiles (head dims <= 128): the two-M-tile CTA.
      if constexpr (kD <= 128) {
        if (p.decode_verify != 0 &&
            p.decode_tile_rows == RingVerify32Traits<kD, QT, kKv>::kCtaRows) {
          using Tr32 = RingVerify32Traits<kD, QT, kKv>;
          return cuda::launch_fitting<Tr32, RingVerify32Compact<kD, QT, kKv>>(
              Tr32::kSmemBytes, [&]<typename Shape>() -> Status {
                return launch_paged<Shape, DecodeKernel::kVerify>(p, grid_items, stream);
              });
        }
      }
      if (p.decode_verify != 0 && p.decode_tile_rows != cuda::ring::kRows) {
        return Status::internal("flashinfer: verify decode tiles of " +
                                std::to_string(p.decode_tile_rows) + " rows at head_dim " +
                                std::to_string(kD) + " (built: 16, and 32 at head dims <= 128)");
      }
      // The default CTA, or the compact one where the device cannot opt in to it (smem_fit.h).
      using Tr = RingDecodeTraits<kD, QT, kKv>;
      return cuda::launch_fitting<Tr, RingDecodeCompact<kD, QT, kKv>>(
          Tr::kSmemBytes, [&]<typename Shape>() -> Status {
            if (p.decode_verify != 0) {
              return launch_paged<Shape, DecodeKernel::kVerify>(p, grid_items, stream);
            }
            return p.balance_slots > 0
                       ? launch_paged<Shape, DecodeKernel::kBalanced>(p, grid_items, stream)
                       : launch_paged<Shape, DecodeKernel::kItems>(p, grid_items, stream);
          });
    };
    switch (kv_dtype) {
      case DType::kFP8E4M3:
        return with_kv.template operator()<DType::kFP8E4M3>();
      case DType::kFP8E5M2:
        return with_kv.template operator()<DType::kFP8E5M2>();
      default:
        if (kv_dtype != q_dtype) {
          return Status::unsupported(std::string("flashinfer: KV dtype ") + dtype_name(kv_dtype) +
                                     " with q dtype " + dtype_name(q_dtype) +
                                     " (tensor-core path: KV = q dtype, fp8_e4m3 or fp8_e5m2)");
        }
        return with_kv.template operator() < std::is_same_v<QT, __half> ? DType::kF16
                                                                        : DType::kBF16 > ();
    }
  };
  switch (q_dtype) {
    case DType::kBF16:
      return with_q.template operator()<__nv_bfloat16>();
    case DType::kF16:
      return with_q.template operator()<__half>();
    default:
      return Status::unsupported(std::string("flashinfer: q dtype ") + dtype_name(q_dtype) +
                                 " (tensor-core path: bf16, f16)");
  }
}

}  // namespace attnkit::flashinfer
