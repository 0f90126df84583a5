// SM90 wgmma prefill kernel, head dim 128, bf16 and f16, and the FP8 (e4m3 KV, bf16 q) kernel
// (empty unless 128 is in ATTNKIT_HEAD_DIMS).
#include "backends/fa3/kernels/prefill_sm90_fp8.cuh"
#include "backends/fa3/kernels/prefill_sm90_launch.cuh"

#ifdef ATTNKIT_HEAD_DIM_128
ATTNKIT_FA3_PREFILL_SM90(128)

namespace attnkit::fa3 {

bool prefill_sm90_fp8_available() {
  static const bool ok = [] {
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(&attr, prefill_sm90_fp8_kernel<true, true, false>) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return attr.binaryVersion == 90;
  }();
  return ok;
}

Status run_prefill_sm90_fp8(const Fa3Params& p, int sm_count, StreamHandle stream,
                            int vt_max_blocks) {
  using Tr = PrefillFp8Traits;
  // uniform_wg 0 (the pre-session-7 kernel) keeps the row sum by FADD (no GEMM row sum) and the
  // in-kernel V transpose; vt_pre: the GEMM row sum only.
  auto kernel = p.uniform_wg == 0                  ? prefill_sm90_fp8_kernel<false, false, false>
                : p.vt_pre != 0 && p.fp8_spec == 4 ? prefill_sm90_fp8_kernel<true, true, true, 4>
                : p.vt_pre != 0 && p.fp8_spec >= 2 ? prefill_sm90_fp8_kernel<true, true, true, 2>
                : p.vt_pre != 0 && p.fp8_spec == 1 ? prefill_sm90_fp8_kernel<true, true, true, 1>
                : p.vt_pre != 0                    ? prefill_sm90_fp8_kernel<true, true, true>
                : p.fp8_gemm_sum != 0              ? prefill_sm90_fp8_kernel<true, true, false>
                                                   : prefill_sm90_fp8_kernel<true, false, false>;
  ATTNKIT_CUDA_TRY(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes));
  const int64_t units = static_cast<int64_t>(p.num_tiles) * p.num_q_heads;
  if (units == 0) return Status::ok();
  if (p.vt_pre != 0 && p.uniform_wg != 0 && vt_max_blocks > 0) {
    const dim3 pre_grid(static_cast<unsigned>(vt_max_blocks), static_cast<unsigned>(p.bs),
                        static_cast<unsigned>(p.num_q_heads / p.group));
    fp8_vt_pre_kernel<<<pre_grid, 128, 0, cuda::to_stream(stream)>>>(p);
    ATTNKIT_CUDA_TRY(cudaGetLastError());
  }
  const int grid = static_cast<int>(std::min<int64_t>(units, sm_count));
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, cuda::to_stream(stream)>>>(p);
  ATTNKIT_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

}  // namespace attnkit::fa3
#else
namespace attnkit::fa3 {
bool prefill_sm90_fp8_available() { return false; }
Status run_prefill_sm90_fp8(const Fa3Params&, int, StreamHandle, int) {
  return Status::unsupported("fa3: the FP8 wgmma kernel needs head dim 128 in ATTNKIT_HEAD_DIMS");
}
}  // namespace attnkit::fa3
#endif
