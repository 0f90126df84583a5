// The fp64 reference of the MLA chunked prefix cache (AttentionLayer::mla_prefix) on the host: it
// must equal plain attention over [decompressed prefix; new tokens] built independently here
// (pool rows -> the test expander -> reference::mha_varlen_fp64, bottom-right causal), and the
// layer checks must name the field. The GPU runner is compared with this reference by
// tests/gpu/test_mla_prefix_cache.cpp and the case table's mla_prefill_prefix_* cases.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attnkit/kv_cache.h"
#include "backends/torch_native/torch_native_backend.h"
#include "harness/case_runner.h"
#include "harness/mla_prefix_expander.h"

namespace attnkit {
namespace {

harness::CaseSpec small_case(int chunk) {
  harness::CaseSpec c;
  c.name = "mla_prefix_small";
  c.mode = ForwardMode::kExtend;
  c.page_size = 4;
  c.prefix_lens = {9, 0, 4};
  c.new_lens = {3, 5, 2};
  c.mla = true;
  c.kv_lora_rank = 128;
  c.qk_rope_head_dim = 8;
  c.num_q_heads = 2;
  c.num_kv_heads = 2;
  c.head_dim = 24;  // 16 nope + 8 rope
  c.v_head_dim = 16;
  c.q_dtype = DType::kF32;
  c.kv_dtype = DType::kF32;
  c.mla_prefix_chunk = chunk;
  c.seed = 5;
  return c;
}

TEST(MlaPrefixReference, EqualsAttentionOverDecompressedPrefixAndNewTokens) {
  const harness::CaseSpec spec = small_case(2);
  Result<harness::PreparedCase> pc = harness::prepare_case(spec, Device::cpu());
  ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
  const int layer = 1;
  const harness::LayerData& ld = pc->layers[layer];
  ASSERT_NE(ld.layer.mla_prefix, nullptr);
  Result<harness::ReferenceResult> ref = harness::reference_for_layer(*pc, layer);
  ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();

  // Independent: per request, latent rows of the prefix straight from the pool, the expander,
  // then [prefix; new] keys with bottom-right causal attention.
  const auto& pool = static_cast<const MLAKVPool&>(*pc->kv_pool);
  const TensorView rows = pool.kv_buffer(layer);
  const int64_t w = spec.kv_lora_rank + spec.qk_rope_head_dim;
  const int64_t h = spec.num_q_heads, dqk = spec.head_dim, dv = spec.v_head_dim;
  std::vector<float> kall, vall;
  std::vector<int32_t> cu_q = {0}, cu_k = {0};
  int64_t tok = 0;
  for (int r = 0; r < spec.batch_size(); ++r) {
    const int n = spec.prefix_lens[static_cast<size_t>(r)];
    const int m = spec.new_lens[static_cast<size_t>(r)];
    std::vector<float> latent(static_cast<size_t>(n * w)), k(static_cast<size_t>(n * h * dqk)),
        v(static_cast<size_t>(n * h * dv));
    const int32_t* row = pc->req_to_token->host_row(pc->rows[static_cast<size_t>(r)]);
    for (int j = 0; j < n; ++j) {
      for (int64_t c = 0; c < w; ++c) {
        latent[static_cast<size_t>(j * w + c)] = static_cast<float>(
            load_as_float(rows.data, rows.dtype, row[j] * rows.stride(0) + c * rows.stride(2)));
      }
    }
    const Device cpu = Device::cpu();
    ASSERT_TRUE(harness::expand_mla_prefix_for_tests(
                    TensorView(latent.data(), DType::kF32, cpu, {n, w}),
                    TensorView(k.data(), DType::kF32, cpu, {n, h, dqk}),
                    TensorView(v.data(), DType::kF32, cpu, {n, h, dv}), spec.kv_lora_rank, nullptr)
                    .is_ok());
    kall.insert(kall.end(), k.begin(), k.end());
    vall.insert(vall.end(), v.begin(), v.end());
    for (int i = 0; i < m; ++i, ++tok) {
      for (int64_t x = 0; x < h * dqk; ++x) {
        kall.push_back(static_cast<float>(load_as_float(ld.k.data, ld.k.dtype, tok * h * dqk + x)));
      }
      for (int64_t x = 0; x < h * dv; ++x) {
        vall.push_back(static_cast<float>(load_as_float(ld.v.data, ld.v.dtype, tok * h * dv + x)));
      }
    }
    cu_q.push_back(cu_q.back() + m);
    cu_k.push_back(cu_k.back() + n + m);
  }
  const Device cpu = Device::cpu();
  const int64_t total_k = cu_k.back();
  std::vector<double> out, lse;
  ASSERT_TRUE(
      reference::mha_varlen_fp64(ld.q, TensorView(kall.data(), DType::kF32, cpu, {total_k, h, dqk}),
                                 TensorView(vall.data(), DType::kF32, cpu, {total_k, h, dv}), cu_q,
                                 cu_k, true, ld.layer.scaling, 0.0, &out, &lse)
          .is_ok());
  ASSERT_EQ(out.size(), ref->out.size());
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(ref->out[i], out[i], 1e-9) << i;
  for (size_t i = 0; i < lse.size(); ++i) EXPECT_NEAR(ref->lse[i], lse[i], 1e-9) << i;
  // And the prefix matters: without mla_prefix the reference differs.
  harness::PreparedCase& p = *pc;
  p.layers[layer].layer.mla_prefix = nullptr;
  Result<harness::ReferenceResult> plain = harness::reference_for_layer(p, layer);
  ASSERT_TRUE(plain.is_ok()) << plain.status().to_string();
  double diff = 0.0;
  for (size_t i = 0; i < out.size(); ++i) diff = std::max(diff, std::abs(plain->out[i] - out[i]));
  EXPECT_GT(diff, 1e-3);
}

TEST(MlaPrefixReference, LayerChecksNameTheField) {
  Result<harness::PreparedCase> pc = harness::prepare_case(small_case(3), Device::cpu());
  ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
  const harness::LayerData& ld = pc->layers[0];
  const auto check = [&](const AttentionLayer& layer, const std::string& needle) {
    const Status s = validate_forward_inputs(ld.q, ld.k, ld.v, ld.out, layer, pc->batch, false,
                                             ld.lse, Device::cpu());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.to_string();
  };
  MlaPrefixDecompressor no_expand;
  no_expand.chunk_tokens = 4;
  AttentionLayer layer = ld.layer;
  layer.mla_prefix = &no_expand;
  check(layer, "expand must be set");
  layer = ld.layer;
  layer.is_mla = false;
  check(layer, "not an MLA non-absorbed");
  ForwardBatch decode_like = pc->batch;
  decode_like.extend_prefix_lens_host.clear();
  const Status s = validate_forward_inputs(ld.q, ld.k, ld.v, ld.out, ld.layer, decode_like, false,
                                           ld.lse, Device::cpu());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  // A decode or target-verify batch that still carries extend lengths is refused by mode.
  for (ForwardMode mode : {ForwardMode::kDecode, ForwardMode::kTargetVerify}) {
    ForwardBatch other = pc->batch;
    other.mode = mode;
    const Status m = validate_forward_inputs(ld.q, ld.k, ld.v, ld.out, ld.layer, other, false,
                                             ld.lse, Device::cpu());
    EXPECT_EQ(m.code(), StatusCode::kInvalidArgument) << m.to_string();
    EXPECT_NE(m.message().find(std::string("mode ") + forward_mode_name(mode)), std::string::npos)
        << m.to_string();
  }
}

}  // namespace
}  // namespace attnkit
