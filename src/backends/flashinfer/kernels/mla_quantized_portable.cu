// MLA (absorbed 576/512) over an fp4_e2m1 or fp8_e4m3 pool on the triton backend's portable SIMT
// kernels. The triton backend's own dispatch instantiates MLA for the activation dtype only; the
// flashinfer descriptor promises fp4 MLA, and `flashmla` / `cutlass_mla` (fp8_e4m3 latent caches,
// decoded natively by their engines) send fp8 extend and prefill here, so this translation unit
// instantiates the quantised variants of the same kernel template (fp4: the kernel reads V's block
// scales from the K row's scales, as MLA shares them).
#include <string>

#include "backends/flashinfer/kernels/mla_quantized_portable.h"
#include "backends/triton/kernels/simt_launch.cuh"

namespace attnkit::flashinfer {
namespace {

template <DType kKV>
Status launch_for_q(const triton::AttentionParams& p, DType q_dtype, bool extend, int grid_splits,
                    StreamHandle stream) {
  using triton::kMlaHeadDimQK;
  using triton::kMlaHeadDimV;
  switch (q_dtype) {
    case DType::kBF16:
      return triton::launch_simt<kMlaHeadDimQK, kMlaHeadDimV, DType::kBF16, kKV>(
          p, extend, grid_splits, stream);
    case DType::kF16:
      return triton::launch_simt<kMlaHeadDimQK, kMlaHeadDimV, DType::kF16, kKV>(
          p, extend, grid_splits, stream);
    default:
      return Status::unsupported(std::string("flashinfer: MLA with ") + dtype_name(kKV) +
                                 " KV needs bf16 or f16 activations, got " + dtype_name(q_dtype));
  }
}

}  // namespace

Status run_mla_quantized_portable(const triton::AttentionParams& p, DType q_dtype, DType kv_dtype,
                                  bool extend, int grid_splits, StreamHandle stream) {
  switch (kv_dtype) {
    case DType::kFP4E2M1:
      return launch_for_q<DType::kFP4E2M1>(p, q_dtype, extend, grid_splits, stream);
    case DType::kFP8E4M3:
      return launch_for_q<DType::kFP8E4M3>(p, q_dtype, extend, grid_splits, stream);
    default:
      return Status::unsupported(std::string("flashinfer: quantised MLA KV dtype ") +
                                 dtype_name(kv_dtype) + " (accepted: fp4_e2m1, fp8_e4m3)");
  }
}

}  // namespace attnkit::flashinfer
