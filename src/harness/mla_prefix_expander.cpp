// Host side of the case table's MLA prefix expander (see mla_prefix_expander.h).
#include "harness/mla_prefix_expander.h"

#include <string>

namespace attnkit::harness {

Status expand_mla_prefix_for_tests(const TensorView& latent, const TensorView& k,
                                   const TensorView& v, int kv_lora_rank, StreamHandle stream) {
  if (latent.ndim != 2 || k.ndim != 3 || v.ndim != 3 || k.size(0) != latent.size(0) ||
      v.size(0) != latent.size(0) || k.size(1) != v.size(1) || !latent.is_contiguous() ||
      !k.is_contiguous() || !v.is_contiguous() || k.dtype != latent.dtype ||
      v.dtype != latent.dtype || k.device != latent.device || v.device != latent.device) {
    return Status::invalid_argument(
        "expand_mla_prefix_for_tests: expected contiguous latent [n, "
        "R + rope], k [n, H, Dqk], v [n, H, Dv] of one dtype and "
        "device, got latent " +
        latent.describe() + ", k " + k.describe() + ", v " + v.describe());
  }
  const int64_t rope = latent.size(1) - kv_lora_rank;
  if (kv_lora_rank < 1 || rope < 0 || k.size(2) <= rope) {
    return Status::invalid_argument("expand_mla_prefix_for_tests: kv_lora_rank " +
                                    std::to_string(kv_lora_rank) + " does not fit latent " +
                                    latent.describe() + " and k " + k.describe());
  }
  if (latent.device.is_cuda()) {
#ifdef ATTNKIT_WITH_CUDA
    return expand_mla_prefix_for_tests_cuda(latent, k, v, kv_lora_rank, stream);
#else
    return Status::unsupported("expand_mla_prefix_for_tests: built without CUDA");
#endif
  }
  (void)stream;
  const int64_t n = latent.size(0), h = k.size(1), dqk = k.size(2), dv = v.size(2);
  const int64_t w = latent.size(1), nope = dqk - rope, r = kv_lora_rank;
  const DType dt = latent.dtype;
  for (int64_t t = 0; t < n; ++t) {
    const auto x = [&](int64_t c) { return load_as_float(latent.data, dt, t * w + c); };
    for (int64_t hh = 0; hh < h; ++hh) {
      for (int64_t d = 0; d < dqk; ++d) {
        const float val = d < nope ? 0.5f * (x((d + 37 * hh) % r) - x((3 * d + 11 * hh + 5) % r))
                                   : x(r + d - nope);
        store_from_float(k.data, dt, (t * h + hh) * dqk + d, val);
      }
      for (int64_t d = 0; d < dv; ++d) {
        const float val = 0.5f * (x((5 * d + 7 * hh + 1) % r) + x((d + 101 * hh + 64) % r));
        store_from_float(v.data, dt, (t * h + hh) * dv + d, val);
      }
    }
  }
  return Status::ok();
}

MlaPrefixDecompressor make_test_mla_prefix_decompressor(int chunk_tokens, int kv_lora_rank) {
  MlaPrefixDecompressor d;
  d.chunk_tokens = chunk_tokens;
  d.expand = [kv_lora_rank](const TensorView& latent, const TensorView& k, const TensorView& v,
                            StreamHandle stream) {
    return expand_mla_prefix_for_tests(latent, k, v, kv_lora_rank, stream);
  };
  return d;
}

}  // namespace attnkit::harness
