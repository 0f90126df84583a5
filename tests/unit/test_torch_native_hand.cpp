// The torch_native reference checked against numbers computed by hand: one head, head dim 2,
// scaling 1, f32 everywhere, keys/values chosen so the logits are 0, 1, 2 (two tests use scaling
// 0.5 and two q heads over the kv head: the order of scale and soft-cap, the GQA head mapping).
//
//   q = [1, 0];  k = [0,0], [1,0], [2,0]  ->  logits 0, 1, 2
//   v = [1,0], [0,1], [1,1]
//   p = e^i / (1 + e + e^2) = 0.0900306, 0.2447285, 0.6652410
//   out = [p0 + p2, p1 + p2] = [0.7552715289, 0.9099694268];  lse = ln(1 + e + e^2) = 2.4076059644
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <vector>

#include "backends/torch_native/torch_native_backend.h"
#include "harness/case_runner.h"

namespace attnkit {
namespace {

using harness::CaseSpec;
using harness::PreparedCase;

constexpr double kTol = 1e-6;  // f32 outputs of an fp64 computation
const std::vector<float> kQ = {1.f, 0.f};
const std::vector<std::vector<float>> kK = {{0.f, 0.f}, {1.f, 0.f}, {2.f, 0.f}};
const std::vector<std::vector<float>> kV = {{1.f, 0.f}, {0.f, 1.f}, {1.f, 1.f}};
// Hand-computed results (see the header comment).
constexpr double kOut0 = 0.7552715289452024, kOut1 = 0.9099694268296196, kLse = 2.40760596444438;
// A key/value that would dominate any softmax it joins: proves a key is masked out.
const std::vector<float> kLoudK = {9.f, 0.f};
const std::vector<float> kLoudV = {100.f, 100.f};

CaseSpec tiny(ForwardMode mode, std::vector<int> prefix, std::vector<int> fresh) {
  CaseSpec c;
  c.name = "tiny";
  c.mode = mode;
  c.page_size = 2;
  c.prefix_lens = std::move(prefix);
  c.new_lens = std::move(fresh);
  c.num_q_heads = 1;
  c.num_kv_heads = 1;
  c.head_dim = 2;
  c.v_head_dim = 2;
  c.q_dtype = DType::kF32;
  c.kv_dtype = DType::kF32;
  c.seed = 7;
  return c;
}

PreparedCase prepare(const CaseSpec& spec, int num_layers = 1) {
  harness::PrepareOptions options;
  options.num_layers = num_layers;
  Result<PreparedCase> pc = harness::prepare_case(spec, Device::cpu(), options);
  EXPECT_TRUE(pc.is_ok()) << pc.status().to_string();
  PreparedCase out = std::move(pc).value();
  for (harness::LayerData& ld : out.layers) ld.layer.scaling = 1.f;
  return out;
}

// Writes k/v of decoder-or-encoder column `col` of request `r`'s row.
void put_kv(PreparedCase& pc, int layer, int r, int col, std::vector<float> k,
            std::vector<float> v) {
  int64_t slot = pc.req_to_token->host_row(pc.rows[static_cast<size_t>(r)])[col];
  const TensorView loc(&slot, DType::kI64, Device::cpu(), {1});
  const TensorView kt(k.data(), DType::kF32, Device::cpu(), {1, 1, 2});
  const TensorView vt(v.data(), DType::kF32, Device::cpu(), {1, 1, 2});
  const Status s = pc.kv_pool->set_kv(layer, loc, kt, vt, 1.f, 1.f, nullptr);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
}

void put_q(PreparedCase& pc, int layer, int token, const std::vector<float>& q) {
  const TensorView& t = pc.layers[static_cast<size_t>(layer)].q;
  for (size_t d = 0; d < q.size(); ++d) {
    store_from_float(t.data, t.dtype, token * t.stride(0) + static_cast<int64_t>(d), q[d]);
  }
}

// Runs one layer with everything read from the pool (save_kv off, no k/v).
void run_layer(PreparedCase& pc, int layer) {
  Result<std::unique_ptr<AttentionBackend>> b = create_torch_native_backend(pc.context());
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  ASSERT_TRUE((*b)->init_forward_metadata(pc.batch).is_ok());
  const harness::LayerData& ld = pc.layers[static_cast<size_t>(layer)];
  const Status s = (*b)->forward(ld.q, TensorView(), TensorView(), ld.out, ld.layer, pc.batch,
                                 /*save_kv=*/false, ld.lse);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
}

double out_at(const PreparedCase& pc, int layer, int token, int d) {
  const TensorView& t = pc.layers[static_cast<size_t>(layer)].out;
  return load_as_float(t.data, t.dtype, token * t.stride(0) + d);
}
double lse_at(const PreparedCase& pc, int layer, int token) {
  return pc.layers[static_cast<size_t>(layer)].lse.data_as<float>()[token];
}

// Decode: query at position 2 over the three hand keys in decoder columns 0..2.
PreparedCase three_key_decode() {
  PreparedCase pc = prepare(tiny(ForwardMode::kDecode, {2}, {1}));
  for (int j = 0; j < 3; ++j)
    put_kv(pc, 0, 0, j, kK[static_cast<size_t>(j)], kV[static_cast<size_t>(j)]);
  put_q(pc, 0, 0, kQ);
  return pc;
}

TEST(TorchNativeHand, ThreeKeys) {
  PreparedCase pc = three_key_decode();
  run_layer(pc, 0);
  EXPECT_NEAR(out_at(pc, 0, 0, 0), kOut0, kTol);
  EXPECT_NEAR(out_at(pc, 0, 0, 1), kOut1, kTol);
  EXPECT_NEAR(lse_at(pc, 0, 0), kLse, kTol);
}

TEST(TorchNativeHand, Sinks) {
  // A sink logit ln 2 adds 2 to the denominator only:
  //   out = [1 + e^2, e + e^2] / (3 + e + e^2) = [0.6400274522, 0.7711205726]
  //   lse = ln(3 + e + e^2) = 2.5731722205
  PreparedCase pc = three_key_decode();
  float sink = std::log(2.f);
  pc.layers[0].layer.sinks = TensorView(&sink, DType::kF32, Device::cpu(), {1});
  run_layer(pc, 0);
  EXPECT_NEAR(out_at(pc, 0, 0, 0), 0.6400274522106044, kTol);
  EXPECT_NEAR(out_at(pc, 0, 0, 1), 0.7711205725663742, kTol);
  EXPECT_NEAR(lse_at(pc, 0, 0), 2.5731722205122476, kTol);
}

TEST(TorchNativeHand, SlidingWindow) {
  // window 1 at q_pos 2: keys at positions 1 and 2 (2 - 1 <= 1), key 0 hidden:
  //   out = [e^2, e + e^2] / (e + e^2) = [0.7310585786, 1];  lse = ln(e + e^2) = 2.3132616875
  PreparedCase pc = three_key_decode();
  pc.layers[0].layer.sliding_window = 1;
  run_layer(pc, 0);
  EXPECT_NEAR(out_at(pc, 0, 0, 0), 0.7310585786300049, kTol);
  EXPECT_NEAR(out_at(pc, 0, 0, 1), 1.0, kTol);
  EXPECT_NEAR(lse_at(pc, 0, 0), 2.3132616875182226, kTol);
}

TEST(TorchNativeHand, WindowZeroSeesOnlyItself) {
  PreparedCase pc = three_key_decode();
  pc.layers[0].layer.sliding_window = 0;
  run_layer(pc, 0);
  EXPECT_NEAR(out_at(pc, 0, 0, 0), 1.0, kTol);  // v2 = [1, 1]
  EXPECT_NEAR(out_at(pc, 0, 0, 1), 1.0, kTol);
  EXPECT_NEAR(lse_at(pc, 0, 0), 2.0, kTol);  // the logit of key 2
}

TEST(TorchNativeHand, SoftCap) {
  // cap 1: logits tanh(0), tanh(1), tanh(2) = 0, 0.7615942, 0.9640276
  //   out = [0.6284323638, 0.8265070865];  lse = 1.7516185250
  PreparedCase pc = three_key_decode();
  pc.layers[0].layer.logit_cap = 1.f;
  run_layer(pc, 0);
  EXPECT_NEAR(out_at(pc, 0, 0, 0), 0.6284323638488731, kTol);
  EXPECT_NEAR(out_at(pc, 0, 0, 1), 0.8265070865388046, kTol);
  EXPECT_NEAR(lse_at(pc, 0, 0), 1.7516185250334477, kTol);
}

TEST(TorchNativeHand, SoftCapAppliesAfterScaling) {
  // scaling 0.5, cap 1: logits cap * tanh(scaling * qk / cap) = tanh(0), tanh(0.5), tanh(1)
  //   out = [0.6643283271, 0.7885441222];  lse = 1.5537389180
  // (the cap applied before the scale, 0.5 tanh(qk), gives other numbers; with the scaling of 1
  // of the test above the two orders agree)
  PreparedCase pc = three_key_decode();
  pc.layers[0].layer.scaling = 0.5f;
  pc.layers[0].layer.logit_cap = 1.f;
  run_layer(pc, 0);
  EXPECT_NEAR(out_at(pc, 0, 0, 0), 0.66432832708603, kTol);
  EXPECT_NEAR(out_at(pc, 0, 0, 1), 0.7885441222210375, kTol);
  EXPECT_NEAR(lse_at(pc, 0, 0), 1.5537389179613923, kTol);
}

TEST(TorchNativeHand, GroupedHeadsShareTheirKvHead) {
  // Two q heads over one kv head, scaling 0.5: head 0 q = [1, 0] (logits 0, 0.5, 1), head 1
  // q = [-1, 0] (logits 0, -0.5, -1), each its own softmax over the same keys and values:
  //   head 0: out = [0.6928041143, 0.8136762768], lse 1.6802696706
  //   head 1: out = [0.6928041143, 0.4935196089], lse 0.6802696706
  CaseSpec spec = tiny(ForwardMode::kDecode, {2}, {1});
  spec.num_q_heads = 2;
  PreparedCase pc = prepare(spec);
  pc.layers[0].layer.scaling = 0.5f;
  for (int j = 0; j < 3; ++j)
    put_kv(pc, 0, 0, j, kK[static_cast<size_t>(j)], kV[static_cast<size_t>(j)]);
  const TensorView& q = pc.layers[0].q;
  const float heads[2][2] = {{1.f, 0.f}, {-1.f, 0.f}};
  for (int h = 0; h < 2; ++h) {
    for (int d = 0; d < 2; ++d) store_from_float(q.data, q.dtype, h * q.stride(1) + d, heads[h][d]);
  }
  run_layer(pc, 0);
  const TensorView& out = pc.layers[0].out;
  const auto at = [&](int h, int d) {
    return load_as_float(out.data, out.dtype, h * out.stride(1) + d);
  };
  const float* lse = pc.layers[0].lse.data_as<float>();
  const int64_t lse_h = pc.layers[0].lse.stride(1);
  EXPECT_NEAR(at(0, 0), 0.6928041142815016, kTol);
  EXPECT_NEAR(at(0, 1), 0.8136762767741524, kTol);
  EXPECT_NEAR(lse[0], 1.6802696706417346, kTol);
  EXPECT_NEAR(at(1, 0), 0.6928041142815016, kTol);
  EXPECT_NEAR(at(1, 1), 0.493519608944346, kTol);
  EXPECT_NEAR(lse[lse_h], 0.6802696706417346, kTol);
}

TEST(TorchNativeHand, TreeMaskHidesSiblings) {
  // Verify: 1 committed token, 3 drafts; d1 and d2 are both children of d0. The mask block is
  // [N, prefix + N] = [3, 4]; d2 sees the prefix, d0 and itself but not its sibling d1.
  CaseSpec spec = tiny(ForwardMode::kTargetVerify, {1}, {});
  spec.spec_draft_tokens = 3;
  spec.spec_topk = 2;
  PreparedCase pc = prepare(spec);
  const uint8_t block[3][4] = {{1, 1, 0, 0}, {1, 1, 1, 0}, {1, 1, 0, 1}};
  ASSERT_EQ(pc.batch.spec.custom_mask.numel(), 12);
  std::memcpy(pc.batch.spec.custom_mask.data, block, sizeof(block));
  put_kv(pc, 0, 0, 0, kK[0], kV[0]);    // prefix
  put_kv(pc, 0, 0, 1, kK[1], kV[1]);    // d0
  put_kv(pc, 0, 0, 2, kLoudK, kLoudV);  // d1 (hidden from d2)
  put_kv(pc, 0, 0, 3, kK[2], kV[2]);    // d2
  put_q(pc, 0, 2, kQ);
  run_layer(pc, 0);
  EXPECT_NEAR(out_at(pc, 0, 2, 0), kOut0, kTol);
  EXPECT_NEAR(out_at(pc, 0, 2, 1), kOut1, kTol);
  EXPECT_NEAR(lse_at(pc, 0, 2), kLse, kTol);
  // d1 sees the loud key (itself): its output is dominated by [100, 100].
  EXPECT_GT(out_at(pc, 0, 1, 0), 50.0);
}

TEST(TorchNativeHand, CrossAttentionReadsOnlyEncoderTokens) {
  // Row layout: 3 encoder tokens, then 3 decoder tokens (prefix 2 + the decode token).
  CaseSpec spec = tiny(ForwardMode::kDecode, {2}, {1});
  spec.cross_attention = true;
  spec.encoder_lens = {3};
  PreparedCase pc = prepare(spec, /*num_layers=*/2);
  ASSERT_FALSE(pc.layers[0].layer.is_cross_attention);
  ASSERT_TRUE(pc.layers[1].layer.is_cross_attention);
  for (int j = 0; j < 3; ++j) {
    // Layer 0 (self): encoder loud, decoder = the hand keys. Layer 1 (cross): the reverse.
    put_kv(pc, 0, 0, j, kLoudK, kLoudV);
    put_kv(pc, 0, 0, 3 + j, kK[static_cast<size_t>(j)], kV[static_cast<size_t>(j)]);
    put_kv(pc, 1, 0, j, kK[static_cast<size_t>(j)], kV[static_cast<size_t>(j)]);
    put_kv(pc, 1, 0, 3 + j, kLoudK, kLoudV);
  }
  for (int l = 0; l < 2; ++l) {
    put_q(pc, l, 0, kQ);
    run_layer(pc, l);
    EXPECT_NEAR(out_at(pc, l, 0, 0), kOut0, kTol) << "layer " << l;
    EXPECT_NEAR(out_at(pc, l, 0, 1), kOut1, kTol) << "layer " << l;
    EXPECT_NEAR(lse_at(pc, l, 0), kLse, kTol) << "layer " << l;
  }
}

TEST(TorchNativeHand, EncoderOnlyIsBidirectionalDecoderIsCausal) {
  PreparedCase pc = prepare(tiny(ForwardMode::kExtend, {0}, {3}));
  for (int j = 0; j < 3; ++j)
    put_kv(pc, 0, 0, j, kK[static_cast<size_t>(j)], kV[static_cast<size_t>(j)]);
  put_q(pc, 0, 0, kQ);
  pc.layers[0].layer.type = AttentionType::kEncoderOnly;
  run_layer(pc, 0);
  EXPECT_NEAR(out_at(pc, 0, 0, 0), kOut0, kTol);
  EXPECT_NEAR(out_at(pc, 0, 0, 1), kOut1, kTol);
  pc.layers[0].layer.type = AttentionType::kDecoder;
  run_layer(pc, 0);
  // Causal: token 0 sees only key 0 (logit 0, value [1, 0]).
  EXPECT_NEAR(out_at(pc, 0, 0, 0), 1.0, kTol);
  EXPECT_NEAR(out_at(pc, 0, 0, 1), 0.0, kTol);
  EXPECT_NEAR(lse_at(pc, 0, 0), 0.0, kTol);
}

TEST(TorchNativeHand, Fp8ScaleFolding) {
  // fp8 e4m3 stores x / k_scale; the hand keys and values are exact in e4m3 after scaling by 2,
  // so the result equals the unquantised hand result.
  CaseSpec spec = tiny(ForwardMode::kDecode, {2}, {1});
  spec.kv_dtype = DType::kFP8E4M3;
  PreparedCase pc = prepare(spec);
  const float scale = 2.f;
  pc.layers[0].layer.k_scale = scale;
  pc.layers[0].layer.v_scale = scale;
  for (int j = 0; j < 3; ++j) {
    int64_t slot = pc.req_to_token->host_row(pc.rows[0])[j];
    std::vector<float> k = kK[static_cast<size_t>(j)], v = kV[static_cast<size_t>(j)];
    const TensorView loc(&slot, DType::kI64, Device::cpu(), {1});
    const TensorView kt(k.data(), DType::kF32, Device::cpu(), {1, 1, 2});
    const TensorView vt(v.data(), DType::kF32, Device::cpu(), {1, 1, 2});
    ASSERT_TRUE(pc.kv_pool->set_kv(0, loc, kt, vt, scale, scale, nullptr).is_ok());
  }
  put_q(pc, 0, 0, kQ);
  run_layer(pc, 0);
  EXPECT_NEAR(out_at(pc, 0, 0, 0), kOut0, kTol);
  EXPECT_NEAR(out_at(pc, 0, 0, 1), kOut1, kTol);
  EXPECT_NEAR(lse_at(pc, 0, 0), kLse, kTol);
}

// ---- MLA non-absorbed prefill: prefix chunks merged by LSE ----

std::vector<float> randn(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& f : v) {
    // Box-Muller on a xorshift stream: deterministic, never exactly zero in practice.
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    const double u1 = (static_cast<double>(x >> 11) + 1.0) / 9007199254740993.0;
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    const double u2 = static_cast<double>(x >> 11) / 9007199254740992.0;
    f = static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
  }
  return v;
}

TEST(TorchNativeMerge, PrefixChunksMergeToFullAttention) {
  constexpr int64_t kTq = 5, kLp = 7, kH = 2, kD = 8, kDv = 4;
  std::vector<float> q = randn(kTq * kH * kD, 1), kp = randn(kLp * kH * kD, 2),
                     vp = randn(kLp * kH * kDv, 3), kn = randn(kTq * kH * kD, 4),
                     vn = randn(kTq * kH * kDv, 5);
  const Device cpu = Device::cpu();
  // Full attention: keys = [prefix; new], bottom-right causal (query i sees j <= i + kLp).
  std::vector<float> kf = kp, vf = vp;
  kf.insert(kf.end(), kn.begin(), kn.end());
  vf.insert(vf.end(), vn.begin(), vn.end());
  const double scaling = 1.0 / std::sqrt(static_cast<double>(kD));
  const std::vector<int32_t> cu_q = {0, kTq}, cu_full = {0, kTq + kLp}, cu_p = {0, kLp};
  std::vector<double> full_out, full_lse, new_out, new_lse, pre_out, pre_lse;
  const TensorView tq(q.data(), DType::kF32, cpu, {kTq, kH, kD});
  ASSERT_TRUE(
      reference::mha_varlen_fp64(tq, TensorView(kf.data(), DType::kF32, cpu, {kTq + kLp, kH, kD}),
                                 TensorView(vf.data(), DType::kF32, cpu, {kTq + kLp, kH, kDv}),
                                 cu_q, cu_full, true, scaling, 0.0, &full_out, &full_lse)
          .is_ok());
  ASSERT_TRUE(reference::mha_varlen_fp64(tq, TensorView(kn.data(), DType::kF32, cpu, {kTq, kH, kD}),
                                         TensorView(vn.data(), DType::kF32, cpu, {kTq, kH, kDv}),
                                         cu_q, cu_q, true, scaling, 0.0, &new_out, &new_lse)
                  .is_ok());
  ASSERT_TRUE(reference::mha_varlen_fp64(tq, TensorView(kp.data(), DType::kF32, cpu, {kLp, kH, kD}),
                                         TensorView(vp.data(), DType::kF32, cpu, {kLp, kH, kDv}),
                                         cu_q, cu_p, false, scaling, 0.0, &pre_out, &pre_lse)
                  .is_ok());
  std::vector<float> a(new_out.begin(), new_out.end()), la(new_lse.begin(), new_lse.end());
  std::vector<float> b(pre_out.begin(), pre_out.end()), lb(pre_lse.begin(), pre_lse.end());
  std::vector<float> m(a.size(), std::nanf("")), lm(la.size(), std::nanf(""));
  ASSERT_TRUE(
      harness::merge_attention_states(TensorView(a.data(), DType::kF32, cpu, {kTq, kH, kDv}),
                                      TensorView(la.data(), DType::kF32, cpu, {kTq, kH}),
                                      TensorView(b.data(), DType::kF32, cpu, {kTq, kH, kDv}),
                                      TensorView(lb.data(), DType::kF32, cpu, {kTq, kH}),
                                      TensorView(m.data(), DType::kF32, cpu, {kTq, kH, kDv}),
                                      TensorView(lm.data(), DType::kF32, cpu, {kTq, kH}))
          .is_ok());
  for (size_t i = 0; i < m.size(); ++i) EXPECT_NEAR(m[i], full_out[i], 1e-5) << i;
  for (size_t i = 0; i < lm.size(); ++i) EXPECT_NEAR(lm[i], full_lse[i], 1e-5) << i;
}

TEST(TorchNativeMerge, EmptyPartContributesNothing) {
  const Device cpu = Device::cpu();
  std::vector<float> a = {0.5f, -1.5f}, la = {1.25f}, b = {7.f, 7.f},
                     lb = {-std::numeric_limits<float>::infinity()};
  std::vector<float> m(2, std::nanf("")), lm(1, std::nanf(""));
  ASSERT_TRUE(harness::merge_attention_states(TensorView(a.data(), DType::kF32, cpu, {1, 1, 2}),
                                              TensorView(la.data(), DType::kF32, cpu, {1, 1}),
                                              TensorView(b.data(), DType::kF32, cpu, {1, 1, 2}),
                                              TensorView(lb.data(), DType::kF32, cpu, {1, 1}),
                                              TensorView(m.data(), DType::kF32, cpu, {1, 1, 2}),
                                              TensorView(lm.data(), DType::kF32, cpu, {1, 1}))
                  .is_ok());
  EXPECT_FLOAT_EQ(m[0], 0.5f);
  EXPECT_FLOAT_EQ(m[1], -1.5f);
  EXPECT_FLOAT_EQ(lm[0], 1.25f);
  // Shape errors name the argument.
  const Status bad =
      harness::merge_attention_states(TensorView(a.data(), DType::kF32, cpu, {1, 1, 2}),
                                      TensorView(la.data(), DType::kF32, cpu, {1, 1}),
                                      TensorView(b.data(), DType::kF32, cpu, {1, 2, 1}),
                                      TensorView(lb.data(), DType::kF32, cpu, {1, 1}),
                                      TensorView(m.data(), DType::kF32, cpu, {1, 1, 2}),
                                      TensorView(lm.data(), DType::kF32, cpu, {1, 1}));
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("out_b"), std::string::npos) << bad.message();
}

}  // namespace
}  // namespace attnkit
