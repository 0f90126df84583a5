#include "support/nan_key_check.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attnkit/dtype.h"
#include "attnkit/kv_cache.h"
#include "attnkit/tensor.h"
#include "support/gpu_test_helpers.h"

namespace attnkit::test_support {
namespace {

// The NaN encoding of one element of `dtype` (little-endian bytes), or empty if not covered.
std::vector<uint8_t> nan_bytes(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return {0xC0, 0x7F};
    case DType::kF16:
      return {0x00, 0x7E};
    case DType::kFP8E4M3:
      return {0x7F};
    default:
      return {};
  }
}

}  // namespace

void expect_nan_key_propagates(const harness::CaseSpec& spec, Device device, const NanKeySpot& spot,
                               bool any_nan, const CaseBackendMaker& make) {
  SCOPED_TRACE(spec.describe());
  Result<harness::PreparedCase> pc = harness::prepare_case(spec, device);
  ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
  // MHA: the K pool; absorbed MLA: the latent rows (K is the whole row, V its first
  // kv_lora_rank elements).
  auto* mha = dynamic_cast<MHAKVPool*>(pc->kv_pool.get());
  auto* mla = dynamic_cast<MLAKVPool*>(pc->kv_pool.get());
  ASSERT_TRUE(mha != nullptr || (mla != nullptr && spec.mla_absorbed()))
      << "MHA or absorbed MLA cases only";
  const auto r = static_cast<size_t>(spot.request);
  ASSERT_LT(r, spec.prefix_lens.size());
  const int prefix = spec.prefix_lens[r];
  ASSERT_LT(spot.position, prefix + spec.new_lens[r]);
  ASSERT_TRUE(!spot.in_v || mha != nullptr) << "a NaN V spot needs an MHA case";
  const bool cached = spot.position < prefix;
  // The request's new tokens are rows [req_begin, req_end) of the forward (and of its outputs).
  int64_t req_begin = 0;
  for (size_t i = 0; i < r; ++i) req_begin += spec.new_lens[i];
  const int64_t req_end = req_begin + spec.new_lens[r];
  const int64_t new_row = req_begin + spot.position - prefix;
  const int32_t slot = pc->req_to_token->host_row(pc->rows[r])[spot.position];
  for (harness::LayerData& ld : pc->layers) {
    const int layer = ld.layer.layer_id;
    const TensorView target = !cached          ? (spot.in_v ? ld.v : ld.k)
                              : spot.in_v      ? mha->v_buffer(layer)
                              : mha != nullptr ? mha->k_buffer(layer)
                                               : mla->kv_buffer(layer);
    const std::vector<uint8_t> nan = nan_bytes(target.dtype);
    ASSERT_FALSE(nan.empty()) << "K / V dtype " << dtype_name(target.dtype);
    const int64_t row = cached ? slot : new_row;
    const int64_t elem = row * target.strides[0] + spot.kv_head * target.strides[1] + spot.dim;
    auto* dst = static_cast<uint8_t*>(target.data) + elem * static_cast<int64_t>(nan.size());
    ASSERT_TRUE(
        copy_bytes(dst, target.device, nan.data(), Device::cpu(), static_cast<int64_t>(nan.size()))
            .is_ok());
  }
  Result<std::unique_ptr<AttentionBackend>> backend = make(*pc);
  ASSERT_TRUE(backend.is_ok()) << backend.status().to_string();
  const Status run = harness::run_backend(**backend, *pc, /*save_kv=*/true);
  ASSERT_TRUE(run.is_ok()) << run.to_string();
  for (const harness::LayerData& ld : pc->layers) {
    SCOPED_TRACE(ld.layer.layer_id);
    Result<harness::ReferenceResult> ref = harness::reference_for_layer(*pc, ld.layer.layer_id);
    ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
    ASSERT_TRUE(ld.out.dtype == DType::kBF16 || ld.out.dtype == DType::kF16);
    ASSERT_EQ(ld.out.ndim, 3);
    const int64_t tokens = ld.out.shape[0], heads = ld.out.shape[1], dv = ld.out.shape[2];
    ASSERT_TRUE(ld.out.is_contiguous());
    const std::vector<uint8_t> host = to_host_bytes(ld.out);
    int64_t nan_rows = 0, finite_rows = 0, lost_nan = 0, extra_nan = 0, wrong_value = 0;
    std::string first;  // the first mismatch
    const auto note = [&](int64_t t, int64_t h, int64_t d, double want, float got) {
      if (first.empty()) {
        first = "token " + std::to_string(t) + " head " + std::to_string(h) + " dim " +
                std::to_string(d) + ": got " + std::to_string(got) + ", reference " +
                std::to_string(want);
      }
    };
    // A NaN V element of a key some queries of a key block do not see (causal or window mask)
    // still reaches them in tiled kernels (probability 0 times NaN, as in FlashAttention): in
    // extend, an extra NaN is tolerated in the spot's column of its kv head's query heads of its
    // request; every NaN the reference has must be there.
    const int group = static_cast<int>(heads) / spec.num_kv_heads;
    const auto masked_v_leak = [&](int64_t t, int64_t h, int64_t d) {
      return spot.in_v && spec.mode != ForwardMode::kDecode && d == spot.dim &&
             h / group == spot.kv_head && t >= req_begin && t < req_end;
    };
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        bool ref_nan_row = false;
        for (int64_t d = 0; d < dv; ++d) {
          const double want = ref->out[static_cast<size_t>((t * heads + h) * dv + d)];
          const float got = load_as_float(host.data(), ld.out.dtype, (t * heads + h) * dv + d);
          ref_nan_row |= std::isnan(want);
          if (std::isnan(want) && !std::isnan(got)) {
            ++lost_nan;
            note(t, h, d, want, got);
          } else if (!std::isnan(want) && std::isnan(got)) {
            if (masked_v_leak(t, h, d)) continue;
            ++extra_nan;
            note(t, h, d, want, got);
          } else if (!std::isnan(want) && std::abs(got - want) > 0.05 + 0.02 * std::abs(want)) {
            ++wrong_value;
            note(t, h, d, want, got);
          }
        }
        (ref_nan_row ? nan_rows : finite_rows) += 1;
      }
    }
    EXPECT_EQ(nan_rows > 0, any_nan) << nan_rows << " NaN rows in the reference";
    EXPECT_GT(finite_rows, 0);
    EXPECT_EQ(lost_nan, 0) << "output elements finite where the reference is NaN; first: " << first;
    EXPECT_EQ(extra_nan, 0) << "output elements NaN where the reference is finite; first: "
                            << first;
    EXPECT_EQ(wrong_value, 0) << "finite output elements off the reference; first: " << first;
    // The LSE (natural log of the row's denominator) is NaN on exactly the same rows: an engine
    // that merges partial states by LSE must not read a NaN row as an empty one (-inf). Finite
    // values are only sanity-checked (fa3's FP8 prefill, Q in e4m3, is ~0.02 off at 500 keys; the
    // shared case table checks accuracy).
    if (ld.lse.defined()) {
      ASSERT_EQ(ld.lse.dtype, DType::kF32);
      ASSERT_TRUE(ld.lse.is_contiguous());
      const std::vector<uint8_t> lse = to_host_bytes(ld.lse);
      int64_t lse_wrong = 0;
      std::string lse_first;
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t h = 0; h < heads; ++h) {
          const double want = ref->lse[static_cast<size_t>(t * heads + h)];
          const float got = load_as_float(lse.data(), DType::kF32, t * heads + h);
          const bool bad =
              std::isnan(want) != std::isnan(got) ||
              (!std::isnan(want) && std::abs(got - want) > 0.05 + 0.01 * std::abs(want));
          if (bad && lse_first.empty()) {
            lse_first = "token " + std::to_string(t) + " head " + std::to_string(h) + ": got " +
                        std::to_string(got) + ", reference " + std::to_string(want);
          }
          lse_wrong += bad;
        }
      }
      EXPECT_EQ(lse_wrong, 0) << "lse rows off the reference (NaN-ness or value); first: "
                              << lse_first;
    }
  }
}

}  // namespace attnkit::test_support
