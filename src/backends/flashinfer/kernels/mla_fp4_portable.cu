// MLA (absorbed 576/512) over an fp4_e2m1 pool on the triton backend's portable SIMT kernels. The
// triton backend's own dispatch instantiates MLA for the activation dtype only; the flashinfer
// descriptor promises fp4 MLA, so this translation unit instantiates the fp4 variant of the same
// kernel template (the kernel reads V's block scales from the K row's scales, as MLA shares them).
#include "backends/flashinfer/kernels/mla_fp4_portable.h"
#include "backends/triton/kernels/simt_launch.cuh"

namespace attnkit::flashinfer {

Status run_mla_fp4_portable(const triton::AttentionParams& p, DType q_dtype, bool extend,
                            int grid_splits, StreamHandle stream) {
  using triton::kMlaHeadDimQK;
  using triton::kMlaHeadDimV;
  switch (q_dtype) {
    case DType::kBF16:
      return triton::launch_simt<kMlaHeadDimQK, kMlaHeadDimV, DType::kBF16, DType::kFP4E2M1>(
          p, extend, grid_splits, stream);
    case DType::kF16:
      return triton::launch_simt<kMlaHeadDimQK, kMlaHeadDimV, DType::kF16, DType::kFP4E2M1>(
          p, extend, grid_splits, stream);
    default:
      return Status::unsupported(std::string("flashinfer: MLA with fp4_e2m1 KV needs bf16 or f16 "
                                             "activations, got ") +
                                 dtype_name(q_dtype));
  }
}

}  // namespace attnkit::flashinfer
