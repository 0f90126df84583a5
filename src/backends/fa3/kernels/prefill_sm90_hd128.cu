// SM90 wgmma prefill kernel, head dim 128, bf16 and f16, and the FP8 (e4m3 KV, bf16 q) kernel
// (empty unless 128 is in ATTNKIT_HEAD_DIMS).
#include <string>

#include "backends/fa3/kernels/prefill_sm90_fp8.cuh"
#include "backends/fa3/kernels/prefill_sm90_launch.cuh"
#include "backends/fa3/kernels/tile_plan.h"
#include "cuda/common/per_device_once.h"

#ifdef ATTNKIT_HEAD_DIM_128
ATTNKIT_FA3_PREFILL_SM90(128)

namespace attnkit::fa3 {

bool prefill_sm90_fp8_available() {
  static cuda::PerDeviceValue ok;  // per device: a process may mix GPU generations
  return ok.get([] { return cuda::loads_as_sm90(prefill_sm90_fp8_kernel<true, true, false>); }) > 0;
}

namespace {

template <auto kKernel, int kN, int kWG = 2>
Status launch_fp8(const Fa3Params& p, int sm_count, StreamHandle stream, int max_kv_len) {
  using Tr = PrefillFp8Traits<kN, kWG>;
  if (p.block_m != Tr::kBlockM) {
    return Status::internal("fa3 fp8: plan rows per tile " + std::to_string(p.block_m) +
                            " != the kernel's " + std::to_string(Tr::kBlockM));
  }
  if (p.vt_pre != 0 && max_kv_len <= 0) {
    return Status::internal("fa3 fp8: vt_pre without max_kv_len (" + std::to_string(max_kv_len) +
                            ")");
  }
  // A per-function attribute (not a stream operation): set once per instantiation and device
  // (per_device_once.h).
  static cuda::PerDeviceOnce opt_in;
  ATTNKIT_CUDA_TRY(opt_in.run([] {
    return cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                Tr::kSmemBytes);
  }));
  const int64_t units = static_cast<int64_t>(p.num_tiles) * p.num_q_heads;
  if (units == 0) return Status::ok();
  if (p.vt_pre != 0) {
    const dim3 pre_grid(static_cast<unsigned>((max_kv_len + kN - 1) / kN),
                        static_cast<unsigned>(p.bs),
                        static_cast<unsigned>(p.num_q_heads / p.group));
    fp8_vt_pre_kernel<kN><<<pre_grid, 128, 0, cuda::to_stream(stream)>>>(p);
    ATTNKIT_CUDA_TRY(cudaGetLastError());
  }
  ATTNKIT_ASSIGN_OR_RETURN(const int grid, persistent_grid(p, sm_count));
  kKernel<<<grid, Tr::kThreads, Tr::kSmemBytes, cuda::to_stream(stream)>>>(p);
  ATTNKIT_CUDA_TRY(cudaGetLastError());
  return launch_tail_merge<Tr::kHeadDim, true>(p, stream);
}

}  // namespace

Status run_prefill_sm90_fp8(const Fa3Params& p, int sm_count, StreamHandle stream, int max_kv_len) {
  // uniform_wg 0 (the pre-session-7 kernel) keeps the row sum by FADD (no GEMM row sum) and the
  // in-kernel V transpose, without promotion; vt_pre: the GEMM row sum only; 192-key blocks:
  // vt_pre with the speculative softmax only, without promotion.
  const auto a = [&]<auto kKernel, int kN = 128>() {
    return launch_fp8<kKernel, kN>(p, sm_count, stream, max_kv_len);
  };
  // A combination with no kernel below is an error, not another kernel (the plan's TMA boxes and
  // the V^T workspace follow fp8_block_n / vt_pre); test_fa3_plan checks choose_fp8_variant never
  // gives one.
  if (const std::string why =
          fp8_kernel_missing(p.fp8_block_n, p.vt_pre != 0, p.fp8_spec != 0, p.fp8_gemm_sum != 0,
                             p.fp8_promote, p.uniform_wg != 0, p.block_m);
      !why.empty()) {
    return Status::internal("fa3 fp8: no kernel: " + why);
  }
  // A sliding window, sinks or a soft-cap: the kWindowSinks / kSoftcap instantiations (whole
  // units) of the three-warpgroup kernel and of the two-warpgroup plan of few queries per key (V^T
  // in the kernel, GEMM row sums, 128-key blocks, unpromoted or promoted late): the plans of
  // fp8_plan_takes_variants. The engine's why_not_layer sends such layers on other plans
  // elsewhere; a launch of one here would silently ignore the feature.
  if (uses_variant_features(p)) {
    // (uniform_wg 0 with GEMM row sums has no kernel: fp8_kernel_missing above.)
    const bool takes =
        fp8_fields_take_variants(p.block_m, p.fp8_block_n, p.vt_pre != 0, p.fp8_spec != 0,
                                 p.fp8_gemm_sum != 0, p.fp8_promote);
    if (!takes || p.split_units > 0) {
      return Status::internal(
          "fa3 fp8: a window / sinks / soft-cap layer needs the three-warpgroup plan, or the "
          "two-warpgroup one with V^T in the kernel, without a tail split (block_m " +
          std::to_string(p.block_m) + ", vt_pre " + std::to_string(p.vt_pre) + ", spec " +
          std::to_string(p.fp8_spec) + ", promote " + std::to_string(p.fp8_promote) +
          ", split units " + std::to_string(p.split_units) + ")");
    }
    if (p.block_m == 2 * 64) {
      const auto two = [&]<int kVariant>() {
        if (p.fp8_promote == 2) {
          return a.template operator()<
              prefill_sm90_fp8_kernel<true, true, false, false, 128, 2, 2, kQInEither, kVariant>>();
        }
        return a.template operator()<
            prefill_sm90_fp8_kernel<true, true, false, false, 128, 0, 2, kQInEither, kVariant>>();
      };
      return p.logit_cap > 0.f ? two.template operator()<kSoftcap>()
                               : two.template operator()<kWindowSinks>();
    }
  }
  if (p.block_m == 3 * 64) {  // three consumer warpgroups (vt_pre, spec, 128-key blocks)
    // One kernel per q dtype and variant; promoted: one for either chunk order (one chunk at a
    // time).
    const auto wg3 = [&]<int kPromote, int kVariant>() {
      if (p.q_fp8 != 0) {
        return launch_fp8<
            prefill_sm90_fp8_kernel<true, true, true, true, 128, kPromote, 3, kQInE4m3, kVariant>,
            128, 3>(p, sm_count, stream, max_kv_len);
      }
      return launch_fp8<
          prefill_sm90_fp8_kernel<true, true, true, true, 128, kPromote, 3, kQInBf16, kVariant>,
          128, 3>(p, sm_count, stream, max_kv_len);
    };
    const auto promoted = [&]<int kVariant>() {
      return p.fp8_promote != 0 ? wg3.template operator()<2, kVariant>()
                                : wg3.template operator()<0, kVariant>();
    };
    if (p.logit_cap > 0.f) return promoted.template operator()<kSoftcap>();
    return uses_variant_features(p) ? promoted.template operator()<kWindowSinks>()
                                    : promoted.template operator()<kPlain>();
  }
  if (p.uniform_wg == 0) {
    Fa3Params q = p;
    q.vt_pre = 0;
    return launch_fp8<prefill_sm90_fp8_kernel<false, false, false>, 128>(q, sm_count, stream, 0);
  }
  if (p.fp8_promote != 0) {  // 128-key blocks (choose_fp8_variant): kN 192 spills with it
    if (p.fp8_block_n != 128 || (p.fp8_promote != 1 && p.fp8_promote != 2)) {
      return Status::internal("fa3 fp8: promotion " + std::to_string(p.fp8_promote) + " with " +
                              std::to_string(p.fp8_block_n) + "-key blocks (1 or 2, 128 only)");
    }
    // 1 / 2: the two orders of the promoted P V's column chunks (prefill_sm90_fp8.cuh).
    return dispatch_value<
        ValueList<1, 2>>(p.fp8_promote, "fa3 fp8: promotion", [&]<int kPr>() -> Status {
      if (p.vt_pre != 0) {
        if (p.fp8_spec != 0)
          return a.template operator()<prefill_sm90_fp8_kernel<true, true, true, true, 128, kPr>>();
        return a.template operator()<prefill_sm90_fp8_kernel<true, true, true, false, 128, kPr>>();
      }
      if (p.fp8_gemm_sum != 0)
        return a.template operator()<prefill_sm90_fp8_kernel<true, true, false, false, 128, kPr>>();
      return a.template operator()<prefill_sm90_fp8_kernel<true, false, false, false, 128, kPr>>();
    });
  }
  if (p.vt_pre != 0 && p.fp8_spec != 0 && p.fp8_block_n == 192) {
    return a.template operator()<prefill_sm90_fp8_kernel<true, true, true, true, 192>, 192>();
  }
  if (p.vt_pre != 0) {
    if (p.fp8_spec != 0)
      return a.template operator()<prefill_sm90_fp8_kernel<true, true, true, true>>();
    return a.template operator()<prefill_sm90_fp8_kernel<true, true, true, false>>();
  }
  if (p.fp8_gemm_sum != 0)
    return a.template operator()<prefill_sm90_fp8_kernel<true, true, false>>();
  return a.template operator()<prefill_sm90_fp8_kernel<true, false, false>>();
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
