// SM90 wgmma prefill kernel of non-absorbed MLA layers: q / k head dim 192, v / out 128, bf16 and
// f16, K / V read from the layer's new-token k / v (PrefillTraits::kContigKV; fa3_kernels.h).
#include "backends/fa3/kernels/prefill_sm90_launch.cuh"

namespace attnkit::fa3 {
namespace {

template <bool kBf16, bool kSplitEmpty>
Status launch_prefill_sm90_mla(const Fa3Params& p, int sm_count, StreamHandle stream) {
  constexpr int kDQK = kMlaPrefillDimQK, kDV = kMlaPrefillDimV, kN = kMlaPrefillBlockN;
  using Tr = PrefillTraits<kDQK, kN, kBf16, 2, kPlain, kDV, kSplitEmpty>;
  static_assert(Tr::kContigKV && Tr::kStages == 2);
  if (uses_variant_features(p)) {
    return Status::internal("fa3 MLA prefill: a window / soft-cap / sinks layer (plain only)");
  }
  if (p.block_m != Tr::kBlockM || p.group != 1 || (p.tma_rows != 0 && p.tma_rows != kN)) {
    return Status::internal("fa3 MLA prefill: rows per tile " + std::to_string(p.block_m) +
                            ", group " + std::to_string(p.group) + ", TMA rows " +
                            std::to_string(p.tma_rows) + " (needs 128, 1, 0 or 128)");
  }
  return launch_persistent<Tr, kBf16>(
      prefill_sm90_kernel<kDQK, kN, kBf16, true, 2, kPlain, kDV, kSplitEmpty>, p, sm_count, stream);
}

template <bool kBf16>
Status launch_prefill_sm90_mla(const Fa3Params& p, int sm_count, StreamHandle stream) {
  return p.split_empty != 0 ? launch_prefill_sm90_mla<kBf16, true>(p, sm_count, stream)
                            : launch_prefill_sm90_mla<kBf16, false>(p, sm_count, stream);
}

}  // namespace

bool prefill_sm90_mla_available() {
  static cuda::PerDeviceValue ok;  // per device: a process may mix GPU generations
  return ok.get([] {
    return cuda::loads_as_sm90(prefill_sm90_kernel<kMlaPrefillDimQK, kMlaPrefillBlockN, true, true,
                                                   2, kPlain, kMlaPrefillDimV>);
  }) > 0;
}

Status run_prefill_sm90_mla(const Fa3Params& p, DType q_dtype, int sm_count, StreamHandle stream) {
  if (q_dtype == DType::kBF16) return launch_prefill_sm90_mla<true>(p, sm_count, stream);
  if (q_dtype == DType::kF16) return launch_prefill_sm90_mla<false>(p, sm_count, stream);
  return Status::unsupported(std::string("fa3: MLA wgmma prefill q dtype ") + dtype_name(q_dtype) +
                             " (needs bf16 or f16)");
}

}  // namespace attnkit::fa3
