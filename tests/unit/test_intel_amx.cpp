// intel_amx against the fp64 reference: the shared case table on every instruction-set path
// (amx, avx512_bf16, avx512, avx2, scalar; paths this CPU lacks are skipped with the reason), plus
// targeted cases (split-KV of one long sequence, GQA 8, page sizes 1/16/64/24, window, soft-cap,
// sinks, fp8 KV, f16/f32 activations) and the rejection of unsupported inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "attnkit/backend.h"
#include "attnkit/device.h"
#include "attnkit/registry.h"
#include "backends/intel_amx/intel_amx_backend.h"
#include "harness/case_runner.h"
#include "support/nan_key_check.h"
#include "support/plan_check.h"
#include "support/scoped_env.h"

namespace attnkit {
namespace {

using harness::CaseSpec;
using harness::PreparedCase;

constexpr CpuIsa kIsas[] = {CpuIsa::kAmx, CpuIsa::kAvx512Bf16, CpuIsa::kAvx512, CpuIsa::kAvx2,
                            CpuIsa::kScalar};
// More threads than the CI machine's cores, so split-KV and dynamic scheduling are exercised.
constexpr int kTestThreads = 4;

const DeviceInfo& host_cpu() {
  static const DeviceInfo cpu = detect_cpu();
  return cpu;
}

std::string isa_skip_reason(CpuIsa isa) {
  if (cpu_isa_supported(isa, host_cpu())) return "";
  return std::string("this CPU (") + host_cpu().name + ") does not provide " + cpu_isa_name(isa) +
         " (best: " + cpu_isa_name(best_cpu_isa(host_cpu())) + ")";
}

Result<std::unique_ptr<AttentionBackend>> make_backend(const PreparedCase& pc, CpuIsa isa,
                                                       int threads = kTestThreads) {
  BackendContext ctx = pc.context();
  ctx.num_threads = threads;
  IntelAmxOptions options;
  options.isa = isa;
  return create_intel_amx_backend_with_options(ctx, options);
}

// Prepares `spec`, runs it on `isa` and compares every layer with the fp64 reference;
// extend_kernel (if not null) receives the extend kernel the backend ran last.
// `edit` (if set) changes the prepared case's layers first (a scaling, sink values the CaseSpec
// has no field for); the reference reads the same layers.
void expect_matches_reference(const CaseSpec& spec, CpuIsa isa, bool save_kv,
                              int threads = kTestThreads, std::string* extend_kernel = nullptr,
                              const std::function<void(PreparedCase&)>& edit = {}) {
  Result<PreparedCase> pc = harness::prepare_case(spec, Device::cpu());
  ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
  if (edit) edit(*pc);
  Result<std::unique_ptr<AttentionBackend>> backend = make_backend(*pc, isa, threads);
  ASSERT_TRUE(backend.is_ok()) << backend.status().to_string();
  Result<CpuIsa> used = intel_amx_backend_isa(**backend);
  ASSERT_TRUE(used.is_ok());
  ASSERT_EQ(*used, isa);
  const Status st = harness::run_backend(**backend, *pc, save_kv);
  ASSERT_TRUE(st.is_ok()) << spec.describe() << ": " << st.to_string();
  if (extend_kernel != nullptr) {
    Result<std::string> kernel = intel_amx_last_extend_kernel(**backend);
    ASSERT_TRUE(kernel.is_ok()) << kernel.status().to_string();
    *extend_kernel = *kernel;
  }
  Result<harness::Comparison> cmp = harness::compare_with_reference(*pc);
  ASSERT_TRUE(cmp.is_ok()) << cmp.status().to_string();
  EXPECT_TRUE(cmp->passed()) << cpu_isa_name(isa) << " " << spec.describe() << ": "
                             << cmp->summary();
}

// Scores x 4 (every layer's scaling 4): a sharp softmax, whose rows' maxima often rise past the
// kernels' rescale threshold inside a forward.
void sharpen_scores(PreparedCase& pc) {
  for (harness::LayerData& ld : pc.layers) ld.layer.scaling = 4.f;
}

std::string param_name(CpuIsa isa, const std::string& rest) {
  return std::string(cpu_isa_name(isa)) + "_" + rest;
}

// ---- the shared case table on every ISA path ----

class IntelAmxCaseTable : public ::testing::TestWithParam<std::tuple<CpuIsa, std::string>> {};

TEST_P(IntelAmxCaseTable, MatchesReference) {
  const auto& [isa, name] = GetParam();
  const std::string no_isa = isa_skip_reason(isa);
  if (!no_isa.empty()) GTEST_SKIP() << no_isa;
  const CaseSpec* spec = harness::find_case(name);
  ASSERT_NE(spec, nullptr);
  const BackendDescriptor* descriptor = builtin_registry().find("intel_amx");
  ASSERT_NE(descriptor, nullptr);
  const std::string reason = harness::skip_reason(*descriptor, *spec, host_cpu());
  if (!reason.empty()) GTEST_SKIP() << reason;
  expect_matches_reference(*spec, isa, /*save_kv=*/true);
}

std::vector<std::string> table_names() {
  std::vector<std::string> names;
  for (const CaseSpec& c : harness::shared_case_table()) names.push_back(c.name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(AllPaths, IntelAmxCaseTable,
                         ::testing::Combine(::testing::ValuesIn(kIsas),
                                            ::testing::ValuesIn(table_names())),
                         [](const auto& info) {
                           return param_name(std::get<0>(info.param), std::get<1>(info.param));
                         });

// ---- targeted cases, per ISA ----

class IntelAmxTargeted : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    const std::string no_isa = isa_skip_reason(GetParam());
    if (!no_isa.empty()) GTEST_SKIP() << no_isa;
  }
};

CaseSpec make_case(std::string name, ForwardMode mode, int page, std::vector<int> prefix,
                   std::vector<int> fresh, int hq = 8, int hkv = 2, int d = 128) {
  CaseSpec c;
  c.name = std::move(name);
  c.mode = mode;
  c.page_size = page;
  c.prefix_lens = std::move(prefix);
  c.new_lens = std::move(fresh);
  c.num_q_heads = hq;
  c.num_kv_heads = hkv;
  c.head_dim = d;
  c.v_head_dim = d;
  c.seed = 7;
  return c;
}

// One request of ~5k keys with few heads: the decode plan splits it into several chunks per
// head (merged by LSE), so every thread works on the one sequence.
TEST_P(IntelAmxTargeted, LongSingleSequenceDecodeSplitsAcrossThreads) {
  expect_matches_reference(make_case("long_decode", ForwardMode::kDecode, 16, {4999}, {1}),
                           GetParam(), true);
  CaseSpec windowed = make_case("long_decode_window", ForwardMode::kDecode, 16, {4999}, {1});
  windowed.sliding_window = 700;  // most split chunks see no key at all
  expect_matches_reference(windowed, GetParam(), true);
}

TEST_P(IntelAmxTargeted, Gqa8DecodeAndExtend) {
  expect_matches_reference(
      make_case("gqa8_decode", ForwardMode::kDecode, 16, {300, 77, 1}, {1, 1, 1}, 32, 4),
      GetParam(), true);
  expect_matches_reference(
      make_case("gqa8_extend", ForwardMode::kExtend, 16, {40, 0}, {70, 33}, 32, 4), GetParam(),
      true);
}

TEST_P(IntelAmxTargeted, PageSizes) {
  for (int page : {1, 16, 64, 24}) {
    SCOPED_TRACE(page);
    expect_matches_reference(
        make_case("pages_decode", ForwardMode::kDecode, page, {130, 63, 7}, {1, 1, 1}), GetParam(),
        true);
    expect_matches_reference(
        make_case("pages_extend", ForwardMode::kExtend, page, {65, 0, 24}, {40, 90, 1}), GetParam(),
        false);
  }
}

TEST_P(IntelAmxTargeted, SlidingWindow) {
  for (int window : {0, 1, 8, 100}) {
    SCOPED_TRACE(window);
    CaseSpec extend = make_case("window_extend", ForwardMode::kExtend, 16, {150, 0}, {90, 40});
    extend.sliding_window = window;
    expect_matches_reference(extend, GetParam(), true);
    CaseSpec decode = make_case("window_decode", ForwardMode::kDecode, 1, {150, 3}, {1, 1});
    decode.sliding_window = window;
    expect_matches_reference(decode, GetParam(), true);
  }
}

// A window past every request's length bounds nothing, INT32_MAX included (the API accepts any
// window >= 0): the kernels take it clipped to the page table's width
// (detail::kernel_sliding_window), as the position arithmetic q + window + 1 overflowed int32
// before, hiding every key. Causal and bidirectional extend, and decode.
TEST_P(IntelAmxTargeted, HugeWindowBoundsNothing) {
  for (int window :
       {std::numeric_limits<int>::max(), std::numeric_limits<int>::max() - 100, 5000}) {
    SCOPED_TRACE(window);
    CaseSpec extend = make_case("huge_window_extend", ForwardMode::kExtend, 16, {150, 0}, {90, 40});
    extend.sliding_window = window;
    expect_matches_reference(extend, GetParam(), true);
    extend.type = AttentionType::kEncoderOnly;
    expect_matches_reference(extend, GetParam(), true);
    CaseSpec decode = make_case("huge_window_decode", ForwardMode::kDecode, 1, {150, 3}, {1, 1});
    decode.sliding_window = window;
    expect_matches_reference(decode, GetParam(), true);
  }
}

TEST_P(IntelAmxTargeted, SoftCapAndSinks) {
  CaseSpec cap = make_case("softcap", ForwardMode::kExtend, 16, {50, 0}, {70, 20});
  cap.logit_cap = 1.5f;
  expect_matches_reference(cap, GetParam(), true);
  CaseSpec sinks = make_case("sinks", ForwardMode::kDecode, 16, {600, 5}, {1, 1});
  sinks.sinks = true;
  expect_matches_reference(sinks, GetParam(), true);
}

// Regressions from a review of the backend's inputs:
// - a sharp softmax (scaling 4) over f16 / f32 KV: the AMX extend had rounded the KV to bf16 (lse
//   off by 0.24); such KV now takes the f32 per-token kernel on every path;
// - a soft-cap far above the scores (1e6): tanh(s / cap) by 1 - 2 / (exp(2|y|) + 1) cancelled at
//   small |y| on the vector paths (rel L2 4.5e-2); the series takes over there;
// - a -inf sink on rows that see no key (cross-attention over an empty encoder): exp2(-inf -
//   -inf) was NaN; -inf is no sink.
TEST_P(IntelAmxTargeted, SharpSoftmaxLargeCapAndMinusInfSink) {
  for (DType kv : {DType::kF16, DType::kF32}) {
    SCOPED_TRACE(dtype_name(kv));
    CaseSpec sharp = make_case("sharp", ForwardMode::kExtend, 16, {300}, {150}, 8, 2, 80);
    sharp.kv_dtype = kv;
    expect_matches_reference(sharp, GetParam(), true, kTestThreads, nullptr, sharpen_scores);
  }
  for (ForwardMode mode : {ForwardMode::kDecode, ForwardMode::kExtend}) {
    SCOPED_TRACE(forward_mode_name(mode));
    CaseSpec cap = make_case(
        "big_cap", mode, 16, {400, 7},
        mode == ForwardMode::kDecode ? std::vector<int>{1, 1} : std::vector<int>{30, 9}, 8, 2, 64);
    cap.logit_cap = 1e6f;
    expect_matches_reference(cap, GetParam(), true);
  }
  CaseSpec sink = make_case("minus_inf_sink", ForwardMode::kExtend, 16, {0, 5}, {12, 30});
  sink.cross_attention = true;
  sink.encoder_lens = {0, 30};
  sink.sinks = true;
  expect_matches_reference(sink, GetParam(), false, kTestThreads, nullptr, [](PreparedCase& pc) {
    for (harness::LayerData& ld : pc.layers) {
      float* values = ld.layer.sinks.data_as<float>();
      for (int64_t h = 0; h < ld.layer.sinks.numel(); ++h) {
        values[h] = -std::numeric_limits<float>::infinity();
      }
    }
  });
}

// A +inf or NaN sink (head 3 of 8) is refused by name before the cache write; it had run and
// turned every row of that head into NaN (exp2(sink - max) with max = +inf is NaN).
TEST_P(IntelAmxTargeted, PlusInfAndNanSinksAreRefused) {
  constexpr int kHead = 3;
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (ForwardMode mode : {ForwardMode::kDecode, ForwardMode::kExtend}) {
    for (float bad : {inf, nan}) {
      SCOPED_TRACE(std::string(forward_mode_name(mode)) + " sink " + std::to_string(bad));
      CaseSpec spec = make_case(
          "bad_sink", mode, 16, {40, 3},
          mode == ForwardMode::kDecode ? std::vector<int>{1, 1} : std::vector<int>{9, 20});
      spec.sinks = true;
      Result<PreparedCase> pc = harness::prepare_case(spec, Device::cpu());
      ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
      for (harness::LayerData& ld : pc->layers) ld.layer.sinks.data_as<float>()[kHead] = bad;
      Result<std::unique_ptr<AttentionBackend>> backend = make_backend(*pc, GetParam());
      ASSERT_TRUE(backend.is_ok()) << backend.status().to_string();
      const Status st = harness::run_backend(**backend, *pc, /*save_kv=*/true);
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
      const std::string value = std::isnan(bad) ? "nan" : "inf";
      EXPECT_NE(st.message().find("layer.sinks[3] (q head 3) is " + value), std::string::npos)
          << st.message();
      EXPECT_NE(st.message().find("a sink must be finite, or -inf for no sink"), std::string::npos)
          << st.message();
      // Nothing was written: layer 0's pool bytes are still those of the snapshot.
      const auto* pool = dynamic_cast<const MHAKVPool*>(pc->kv_pool.get());
      ASSERT_NE(pool, nullptr);
      std::vector<uint8_t> bytes;
      for (const TensorView& b : {pool->k_buffer(0), pool->v_buffer(0)}) {
        const auto* p = static_cast<const uint8_t*>(b.data);
        bytes.insert(bytes.end(), p, p + b.storage_bytes());
      }
      EXPECT_EQ(bytes, pc->pool_snapshot[0]) << "the refused forward wrote the cache";
    }
  }
}

// A thread count past the limit is refused by name (it had failed as a 59 GB allocation).
TEST(IntelAmxThreads, HugeThreadCountIsRefusedByName) {
  Result<harness::PreparedCase> pc = harness::prepare_case(
      make_case("threads", ForwardMode::kDecode, 16, {60}, {1}), Device::cpu());
  ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
  BackendContext ctx = pc->context();
  ctx.num_threads = 100000;
  Result<std::unique_ptr<AttentionBackend>> b = create_intel_amx_backend(ctx);
  ASSERT_FALSE(b.is_ok());
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("100000 threads (BackendContext.num_threads 100000"),
            std::string::npos)
      << b.status().message();
}

TEST_P(IntelAmxTargeted, Fp8KvCache) {
  for (DType kv : {DType::kFP8E4M3, DType::kFP8E5M2}) {
    SCOPED_TRACE(dtype_name(kv));
    CaseSpec decode = make_case("fp8_decode", ForwardMode::kDecode, 16, {700, 40}, {1, 1});
    decode.kv_dtype = kv;
    expect_matches_reference(decode, GetParam(), true);
    CaseSpec extend = make_case("fp8_extend", ForwardMode::kExtend, 64, {100, 0}, {50, 77});
    extend.kv_dtype = kv;
    expect_matches_reference(extend, GetParam(), true);
  }
}

// fp8_e4m3 KV decode over the shapes of the vector decode's fast path (fp8 widened by table
// lookups, q stored in the widened order, the P.V columns restored per 64): d 64 / 128 / 256, GQA
// groups 1, 3, 4, 6 and 8 (tiles of 1-4 heads), key counts that end inside a 4-key q.k step and
// on an odd P.V pair, soft-cap, sinks, a window, and one long request split across threads.
TEST_P(IntelAmxTargeted, Fp8DecodeShapes) {
  std::vector<CaseSpec> cases;
  cases.push_back(make_case("fp8_d64_g8", ForwardMode::kDecode, 16, {301, 18}, {1, 1}, 16, 2, 64));
  cases.push_back(make_case("fp8_d256_g4", ForwardMode::kDecode, 16, {213, 6}, {1, 1}, 8, 2, 256));
  cases.push_back(make_case("fp8_g1", ForwardMode::kDecode, 1, {97, 2}, {1, 1}, 4, 4, 128));
  cases.push_back(make_case("fp8_g3", ForwardMode::kDecode, 16, {130, 33}, {1, 1}, 6, 2, 128));
  cases.push_back(make_case("fp8_g6", ForwardMode::kDecode, 24, {250, 1}, {1, 1}, 12, 2, 128));
  CaseSpec cap = make_case("fp8_cap", ForwardMode::kDecode, 16, {500, 9}, {1, 1});
  cap.logit_cap = 1.5f;
  cases.push_back(cap);
  CaseSpec sinks = make_case("fp8_sinks", ForwardMode::kDecode, 16, {300, 15}, {1, 1});
  sinks.sinks = true;
  cases.push_back(sinks);
  CaseSpec window = make_case("fp8_window", ForwardMode::kDecode, 16, {400, 40}, {1, 1});
  window.sliding_window = 137;
  cases.push_back(window);
  cases.push_back(make_case("fp8_long", ForwardMode::kDecode, 16, {4999}, {1}, 8, 2, 128));
  for (CaseSpec& c : cases) {
    SCOPED_TRACE(c.name);
    c.kv_dtype = DType::kFP8E4M3;
    expect_matches_reference(c, GetParam(), true);
    expect_matches_reference(c, GetParam(), true, 1);
  }
}

// An fp8_e4m3 V element holding the NaN code (0x7F / 0xFF; e4m3fn has no infinities) poisons the
// output column that reads it, as in the reference, on every path: the byte-table fast decode,
// the bit-move conversions of the other vector paths and the blocked extend's packing (they
// widened it to 480 before). V element (every row, kv head 1, dim 7) -> column 7 of kv head 1's q
// heads is NaN, everything else finite. (A NaN K element: NanKeyPropagates.)
TEST_P(IntelAmxTargeted, Fp8NanCodePropagates) {
  constexpr uint8_t kE4M3Nan = 0x7F;
  constexpr int kHq = 8;
  constexpr int kHkv = 2;
  constexpr int kD = 128;
  constexpr int kGroup = kHq / kHkv;
  constexpr int kNanDim = 7;
  for (const ForwardMode mode : {ForwardMode::kDecode, ForwardMode::kExtend}) {
    CaseSpec spec = mode == ForwardMode::kDecode
                        ? make_case("fp8_nan_decode", mode, 16, {300, 41}, {1, 1}, kHq, kHkv, kD)
                        : make_case("fp8_nan_extend", mode, 16, {200, 64}, {37, 20}, kHq, kHkv, kD);
    spec.kv_dtype = DType::kFP8E4M3;
    SCOPED_TRACE(spec.describe());
    Result<PreparedCase> pc = harness::prepare_case(spec, Device::cpu());
    ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
    auto* pool = dynamic_cast<MHAKVPool*>(pc->kv_pool.get());
    ASSERT_NE(pool, nullptr);
    for (const harness::LayerData& ld : pc->layers) {
      const TensorView v = pool->v_buffer(ld.layer.layer_id);
      ASSERT_EQ(v.dtype, DType::kFP8E4M3);
      for (int64_t row = 0; row < v.shape[0]; ++row) {
        static_cast<uint8_t*>(v.data)[row * v.strides[0] + v.strides[1] + kNanDim] =
            row % 2 == 0 ? kE4M3Nan : kE4M3Nan | 0x80;
      }
    }
    Result<std::unique_ptr<AttentionBackend>> backend = make_backend(*pc, GetParam());
    ASSERT_TRUE(backend.is_ok()) << backend.status().to_string();
    ASSERT_TRUE(harness::run_backend(**backend, *pc, /*save_kv=*/false).is_ok());
    for (const harness::LayerData& ld : pc->layers) {
      ASSERT_EQ(ld.out.dtype, DType::kBF16);
      const auto* out = static_cast<const uint16_t*>(ld.out.data);
      int64_t wrong = 0;
      for (int64_t t = 0; t < ld.out.shape[0]; ++t) {
        for (int h = 0; h < kHq; ++h) {
          for (int d = 0; d < kD; ++d) {
            const uint16_t x = out[t * ld.out.strides[0] + h * ld.out.strides[1] + d];
            const bool nan = (x & 0x7F80) == 0x7F80 && (x & 0x7F) != 0;
            const bool want_nan = h >= kGroup && d == kNanDim;
            wrong += nan != want_nan;
          }
        }
      }
      EXPECT_EQ(wrong, 0) << cpu_isa_name(GetParam()) << " layer " << ld.layer.layer_id;
    }
  }
}

// A NaN K element poisons exactly the rows that see its key, a NaN V element exactly their column,
// as in the reference (support/nan_key_check.h), on every path and KV dtype: decode and extend (the
// blocked extend included), with and without a window, soft-cap and split-KV, a cached and a new
// token's key. (The CPU exp2 mapped a NaN score to 0, dropping the key, and the vector tanh clamped
// it, before.)
TEST_P(IntelAmxTargeted, NanKeyPropagates) {
  struct Variant {
    ForwardMode mode;
    std::vector<int> prefix, fresh;
    int window;
    float cap;     // soft-cap (0: none)
    bool any_nan;  // some query sees the key
  };
  const Variant variants[] = {
      {ForwardMode::kDecode, {300, 41}, {1, 1}, -1, 0.f, true},
      {ForwardMode::kDecode, {300, 41}, {1, 1}, 5, 0.f, false},   // out of the window
      {ForwardMode::kDecode, {4000, 41}, {1, 1}, -1, 0.f, true},  // split-KV
      {ForwardMode::kDecode, {300, 41}, {1, 1}, -1, 1.5f, true},
      {ForwardMode::kExtend, {295, 64}, {37, 20}, -1, 0.f, true},
      {ForwardMode::kExtend, {295, 64}, {37, 20}, 20, 0.f, true},  // seen by the first queries
      {ForwardMode::kExtend, {0, 64}, {330, 20}, -1, 0.f, true},   // a new token's key
      {ForwardMode::kExtend, {295, 64}, {37, 20}, -1, 1.5f, true},
  };
  for (const bool in_v : {false, true}) {
    const test_support::NanKeySpot spot{/*request=*/0, /*position=*/290, /*kv_head=*/1, /*dim=*/7,
                                        in_v};
    for (const DType kv : {DType::kBF16, DType::kFP8E4M3}) {
      for (const Variant& var : variants) {
        CaseSpec spec =
            make_case(in_v ? "nan_value" : "nan_key", var.mode, 16, var.prefix, var.fresh);
        spec.kv_dtype = kv;
        spec.sliding_window = var.window;
        spec.logit_cap = var.cap;
        test_support::expect_nan_key_propagates(
            spec, Device::cpu(), spot, var.any_nan,
            [&](const PreparedCase& pc) { return make_backend(pc, GetParam()); });
      }
    }
  }
}

TEST_P(IntelAmxTargeted, ActivationAndKvDtypes) {
  for (DType act : {DType::kF16, DType::kF32}) {
    SCOPED_TRACE(dtype_name(act));
    CaseSpec extend = make_case("act_extend", ForwardMode::kExtend, 16, {30, 0}, {40, 17});
    extend.q_dtype = act;
    extend.kv_dtype = act;
    expect_matches_reference(extend, GetParam(), true);
    CaseSpec decode = make_case("act_decode", ForwardMode::kDecode, 16, {300, 9}, {1, 1});
    decode.q_dtype = act;
    decode.kv_dtype = act;
    expect_matches_reference(decode, GetParam(), true);
  }
  CaseSpec mixed = make_case("bf16_q_f16_kv", ForwardMode::kExtend, 16, {30, 0}, {40, 17});
  mixed.kv_dtype = DType::kF16;
  expect_matches_reference(mixed, GetParam(), true);
}

// Encoder-decoder batches: self-attention layers skip the encoder tokens at the start of each
// row, cross-attention layers attend to exactly those (non-causal, no window), also split-KV.
TEST_P(IntelAmxTargeted, CrossAttentionAndEncoderOnly) {
  for (ForwardMode mode : {ForwardMode::kExtend, ForwardMode::kDecode}) {
    SCOPED_TRACE(forward_mode_name(mode));
    const bool decode = mode == ForwardMode::kDecode;
    CaseSpec c = make_case("cross", mode, 16, {9, 0},
                           decode ? std::vector<int>{1, 1} : std::vector<int>{12, 30});
    c.cross_attention = true;
    c.encoder_lens = {1500, 33};
    c.sliding_window = 4;  // applies to the self-attention layers only
    expect_matches_reference(c, GetParam(), false);
  }
  CaseSpec enc = make_case("encoder_only", ForwardMode::kExtend, 1, {0, 0}, {70, 9});
  enc.type = AttentionType::kEncoderOnly;
  expect_matches_reference(enc, GetParam(), true);
  enc.sliding_window = 5;
  expect_matches_reference(enc, GetParam(), true);
}

TEST_P(IntelAmxTargeted, HeadDims) {
  // 16 (the descriptor's smallest, kAmxHeadDimStep): half a column pair; 32: one column pair of
  // P.V (the vdpbf16ps kernel's 2-vector remainder only); 48 / 80 / 96 / 192: 4-vector blocks
  // plus that remainder (48: one 32-dim tile chunk and a 16-dim one).
  for (int d : {16, 32, 48, 64, 80, 96, 192, 256}) {
    SCOPED_TRACE(d);
    expect_matches_reference(
        make_case("dims_extend", ForwardMode::kExtend, 16, {20, 0}, {33, 9}, 4, 2, d), GetParam(),
        true);
    expect_matches_reference(
        make_case("dims_decode", ForwardMode::kDecode, 16, {200, 9}, {1, 1}, 4, 2, d), GetParam(),
        true);
  }
}

// A value head dim other than the key head dim (padded separately in the blocked kernels).
TEST_P(IntelAmxTargeted, SplitHeadDims) {
  CaseSpec c = make_case("dims_split", ForwardMode::kExtend, 16, {70, 0}, {90, 33}, 4, 2, 192);
  c.v_head_dim = 128;
  expect_matches_reference(c, GetParam(), true);
  c.head_dim = 96;
  c.v_head_dim = 160;
  expect_matches_reference(c, GetParam(), true);
}

// Which extend kernel runs, by the backend's record of the call: the blocked one (AMX tiles; the
// register blocks of vdpbf16ps on avx512_bf16, of f32 FMAs on avx512) for bf16 q with KV it takes,
// else the ISA's per-token kernel (on amx the avx512_bf16 one); ATTNKIT_CPU_BLOCKED_EXTEND=0
// turns the register-block kernels off (not the tiles).
TEST_P(IntelAmxTargeted, ExtendKernelChoice) {
  const CpuIsa isa = GetParam();
  const bool amx = isa == CpuIsa::kAmx;
  const std::string per_token = cpu_isa_name(amx ? CpuIsa::kAvx512Bf16 : isa);
  const std::string blocked = amx                          ? "amx"
                              : isa == CpuIsa::kAvx512Bf16 ? "blocked_avx512_bf16"
                              : isa == CpuIsa::kAvx512     ? "blocked_avx512"
                                                           : per_token;
  struct KvCase {
    DType kv;
    bool blocked;
  };
  for (const KvCase& kc : {KvCase{DType::kBF16, true}, KvCase{DType::kFP8E4M3, true},
                           KvCase{DType::kFP8E5M2, true}, KvCase{DType::kF16, false}}) {
    SCOPED_TRACE(dtype_name(kc.kv));
    CaseSpec c = make_case("choice", ForwardMode::kExtend, 16, {30, 0}, {40, 17});
    c.kv_dtype = kc.kv;
    std::string used;
    expect_matches_reference(c, isa, true, kTestThreads, &used);
    EXPECT_EQ(used, kc.blocked ? blocked : per_token);
  }
  CaseSpec f32 = make_case("choice_f32", ForwardMode::kExtend, 16, {30, 0}, {40, 17});
  f32.q_dtype = DType::kF32;
  f32.kv_dtype = DType::kBF16;
  std::string used;
  expect_matches_reference(f32, isa, true, kTestThreads, &used);
  EXPECT_EQ(used, per_token);
  test_support::ScopedEnv off("ATTNKIT_CPU_BLOCKED_EXTEND", "0");
  expect_matches_reference(make_case("choice_off", ForwardMode::kExtend, 16, {30, 0}, {40, 17}),
                           isa, true, kTestThreads, &used);
  EXPECT_EQ(used, amx ? blocked : per_token);
}

// An extend whose bf16 output reaches 8 MiB (256 tokens x 128 q heads x d 128): the blocked
// kernels write it with streaming stores (kStreamOutputBytes), fenced before the threads join;
// a causal prefill over 2 requests (the second starting mid-block) and a windowed one, so the
// masked units also compute only the 32-key groups their rows see.
TEST_P(IntelAmxTargeted, LargeOutputByStreamingStores) {
  expect_matches_reference(
      make_case("stream_out", ForwardMode::kExtend, 16, {0, 37}, {200, 56}, 128, 8), GetParam(),
      true);
  CaseSpec windowed = make_case("stream_out_window", ForwardMode::kExtend, 16, {60}, {256}, 128, 8);
  windowed.sliding_window = 75;
  expect_matches_reference(windowed, GetParam(), true);
}

TEST_P(IntelAmxTargeted, OneThreadAndManyThreads) {
  const CaseSpec c = make_case("threads", ForwardMode::kExtend, 16, {100, 3}, {64, 120});
  expect_matches_reference(c, GetParam(), true, 1);
  expect_matches_reference(c, GetParam(), true, 7);
}

using test_support::ScopedEnv;

// The blocked extend's packing modes (the AMX kernel, and on avx512_bf16 / avx512 the same kernel
// with register-block products) on extend cases whose first visible key is not on a block boundary
// (window), whose lengths are not multiples of the key block or page (page 24), with converted KV
// (f16, fp8) and several requests: K/V packed once per forward (the default), with 512-row items,
// 256-key compute blocks, packed per item (ATTNKIT_AMX_PREPACK=0), and without the
// software-pipelined item loop (ATTNKIT_AMX_PIPELINE=0, AMX only, as ATTNKIT_AMX_SOFTMAX=0; the
// third request of pack_multi, one row pair over two blocks, takes the pipeline's same-pair path);
// on avx512_bf16 / avx512 also the per-token kernel (ATTNKIT_CPU_BLOCKED_EXTEND=0; f16 KV takes it
// anyway); the masked units' softmax rows between the tile micro-steps (ATTNKIT_AMX_MASKED_ROWS=1,
// with every packing mode; pack_softcap makes every unit a masked one); on AMX, P . V per key block
// and deferred over 2 (ATTNKIT_AMX_PV_BLOCKS=1, 2; the default defers over 4) with those modes.
// Other paths ignore the switches.
TEST_P(IntelAmxTargeted, AmxPackingModes) {
  std::vector<CaseSpec> cases;
  cases.push_back(make_case("pack_multi", ForwardMode::kExtend, 24, {300, 0, 130}, {200, 257, 1}));
  CaseSpec windowed = make_case("pack_window", ForwardMode::kExtend, 16, {300, 40}, {200, 150});
  windowed.sliding_window = 150;
  cases.push_back(windowed);
  CaseSpec f16 = make_case("pack_f16", ForwardMode::kExtend, 16, {129}, {140});
  f16.kv_dtype = DType::kF16;
  cases.push_back(f16);
  CaseSpec fp8 = make_case("pack_fp8", ForwardMode::kExtend, 16, {64}, {200});
  fp8.kv_dtype = DType::kFP8E4M3;
  cases.push_back(fp8);
  CaseSpec gqa8 = make_case("pack_gqa8", ForwardMode::kExtend, 16, {0}, {300}, 16, 2, 64);
  cases.push_back(gqa8);
  CaseSpec capped = make_case("pack_softcap", ForwardMode::kExtend, 16, {300, 0}, {200, 130});
  capped.logit_cap = 1.5f;
  cases.push_back(capped);
  for (const CaseSpec& c : cases) {
    SCOPED_TRACE(c.name);
    expect_matches_reference(c, GetParam(), true);
    {
      ScopedEnv rows("ATTNKIT_AMX_ROWS_PER_ITEM", "512");
      expect_matches_reference(c, GetParam(), true, 3);
    }
    {
      ScopedEnv keys("ATTNKIT_AMX_KEY_BLOCK", "256");
      expect_matches_reference(c, GetParam(), true);
      ScopedEnv rows("ATTNKIT_AMX_ROWS_PER_ITEM", "512");
      expect_matches_reference(c, GetParam(), true, 2);
    }
    {
      ScopedEnv per_item("ATTNKIT_AMX_PREPACK", "0");
      expect_matches_reference(c, GetParam(), true);
      ScopedEnv keys("ATTNKIT_AMX_KEY_BLOCK", "256");  // ignored without packing per forward
      expect_matches_reference(c, GetParam(), true);
    }
    {
      ScopedEnv plain("ATTNKIT_AMX_PIPELINE", "0");
      expect_matches_reference(c, GetParam(), true);
      ScopedEnv per_item("ATTNKIT_AMX_PREPACK", "0");
      expect_matches_reference(c, GetParam(), true);
    }
    {
      ScopedEnv two_pass("ATTNKIT_AMX_SOFTMAX", "0");  // the default is the one-pass row
      expect_matches_reference(c, GetParam(), true);
    }
    {
      ScopedEnv masked("ATTNKIT_AMX_MASKED_ROWS", "1");
      expect_matches_reference(c, GetParam(), true);
      {
        ScopedEnv keys("ATTNKIT_AMX_KEY_BLOCK", "256");
        expect_matches_reference(c, GetParam(), true);
      }
      ScopedEnv per_item("ATTNKIT_AMX_PREPACK", "0");
      expect_matches_reference(c, GetParam(), true);
    }
    for (const char* pv : {"1", "2"}) {       // the default is 4
      if (GetParam() != CpuIsa::kAmx) break;  // the tile kernel's switch only
      SCOPED_TRACE(std::string("ATTNKIT_AMX_PV_BLOCKS=") + pv);
      ScopedEnv blocks("ATTNKIT_AMX_PV_BLOCKS", pv);
      expect_matches_reference(c, GetParam(), true);
      {
        ScopedEnv rows("ATTNKIT_AMX_ROWS_PER_ITEM", "512");
        expect_matches_reference(c, GetParam(), true, 3);
      }
      {
        ScopedEnv masked("ATTNKIT_AMX_MASKED_ROWS", "1");
        expect_matches_reference(c, GetParam(), true);
      }
      {
        ScopedEnv keys("ATTNKIT_AMX_KEY_BLOCK", "256");  // 256-key blocks: 2 per segment at most
        expect_matches_reference(c, GetParam(), true);
      }
      ScopedEnv per_item("ATTNKIT_AMX_PREPACK", "0");  // packing per item: no deferral
      expect_matches_reference(c, GetParam(), true);
    }
    {
      ScopedEnv per_token("ATTNKIT_CPU_BLOCKED_EXTEND", "0");
      expect_matches_reference(c, GetParam(), true);
    }
  }
}

// The AMX extend's P . V deferred over 2 or 4 key blocks (ATTNKIT_AMX_PV_BLOCKS; 4 by default, 1 =
// per block) while a row's max keeps rising past the rescale threshold inside a segment: with
// scores scaled by 4 (bf16 KV read in place, the lean and the masked units, 1 and 2 threads), the
// rows' running max grows by more than 2^8 after their first block, so the P of the segment's
// earlier blocks, still waiting for P . V, must be rescaled with O (rescale_row; without it this
// test's rel_l2 is 8-16). single_pair: items of one row pair (3 tokens, one q head per kv head)
// over 903 keys, so a pair's next unit follows its ready segment at once and the segment must run
// first, alone (run_pipelined's same-pair flush), at 2 and 4 blocks per segment. The tile
// kernel's switch only.
TEST_P(IntelAmxTargeted, DeferredPvRescalesPendingProbabilities) {
  if (GetParam() != CpuIsa::kAmx) GTEST_SKIP() << "ATTNKIT_AMX_PV_BLOCKS is the AMX kernel's";
  const CaseSpec cases[] = {
      make_case("sharp_deferred", ForwardMode::kExtend, 16, {520, 0}, {90, 700}),
      make_case("single_pair", ForwardMode::kExtend, 16, {900, 5}, {3, 600}, 8, 8)};
  for (const CaseSpec& c : cases) {
    SCOPED_TRACE(c.name);
    for (const char* pv : {"1", "2", "4"}) {
      SCOPED_TRACE(std::string("ATTNKIT_AMX_PV_BLOCKS=") + pv);
      ScopedEnv blocks("ATTNKIT_AMX_PV_BLOCKS", pv);
      for (int threads : {1, 2}) {
        expect_matches_reference(c, GetParam(), true, threads, nullptr, sharpen_scores);
      }
    }
  }
}

// Sharp scores (x 4) on every path: the rows of masked units (causal diagonal blocks, a pair's last
// unit) often see a block max past their running max by more than the rescale threshold, so their
// O rows and sums are rescaled there (softmax_row_masked) on the tiles and the register blocks.
TEST_P(IntelAmxTargeted, SharpScoresOnMaskedUnits) {
  const CaseSpec c = make_case("sharp_masked", ForwardMode::kExtend, 16, {520, 0}, {90, 700});
  for (int threads : {1, 2}) {
    expect_matches_reference(c, GetParam(), true, threads, nullptr, sharpen_scores);
  }
}

// The AMX decode (default on the amx path) on what it takes in place and what it stages: page 16
// (16-key tiles straight from the pool), page 1 and 24 (tiles across pages: staged), a window
// whose first key is not on a tile boundary, soft-cap, GQA 8 at d 64 and d 256, a split long
// request (partials merged by LSE), 1 and 5 threads, the software prefetch modes
// (ATTNKIT_AMX_DECODE_PF=1, 2, 3), every sub-block size (ATTNKIT_AMX_DECODE_SUBKEYS=128, 256, 512;
// the default picks 512 only for items of >= 1024 keys read in place);
// each also with ATTNKIT_AMX_DECODE=0 (the vector decode). f16 /
// fp8 KV fall back to the vector decode. Other paths ignore the switch.
TEST_P(IntelAmxTargeted, AmxDecodeModes) {
  std::vector<CaseSpec> cases;
  cases.push_back(make_case("dec_p16", ForwardMode::kDecode, 16, {300, 77, 1, 128}, {1, 1, 1, 1}));
  cases.push_back(make_case("dec_p1", ForwardMode::kDecode, 1, {300, 33}, {1, 1}));
  cases.push_back(make_case("dec_p24", ForwardMode::kDecode, 24, {250, 130}, {1, 1}));
  CaseSpec window = make_case("dec_window", ForwardMode::kDecode, 16, {400, 40}, {1, 1});
  window.sliding_window = 137;
  cases.push_back(window);
  CaseSpec cap = make_case("dec_cap", ForwardMode::kDecode, 16, {500, 9}, {1, 1});
  cap.logit_cap = 1.5f;
  cases.push_back(cap);
  cases.push_back(make_case("dec_gqa8", ForwardMode::kDecode, 16, {300, 17}, {1, 1}, 16, 2, 64));
  cases.push_back(make_case("dec_d256", ForwardMode::kDecode, 16, {200, 64}, {1, 1}, 4, 1, 256));
  // 4200 keys: on one thread 4 items of 1056 keys, which take 512-key sub-blocks by default.
  cases.push_back(make_case("dec_long", ForwardMode::kDecode, 16, {4200}, {1}, 8, 8, 128));
  CaseSpec fp8 = make_case("dec_fp8", ForwardMode::kDecode, 16, {200, 5}, {1, 1});
  fp8.kv_dtype = DType::kFP8E4M3;
  cases.push_back(fp8);
  for (const CaseSpec& c : cases) {
    SCOPED_TRACE(c.name);
    expect_matches_reference(c, GetParam(), true);
    expect_matches_reference(c, GetParam(), true, 1);
    expect_matches_reference(c, GetParam(), true, 5);
    for (const char* mode : {"1", "2", "3"}) {
      ScopedEnv pf("ATTNKIT_AMX_DECODE_PF", mode);
      expect_matches_reference(c, GetParam(), true, 3);
    }
    for (const char* keys : {"128", "256", "512"}) {
      ScopedEnv sub("ATTNKIT_AMX_DECODE_SUBKEYS", keys);
      expect_matches_reference(c, GetParam(), true, 2);
      ScopedEnv pf("ATTNKIT_AMX_DECODE_PF", "3");
      expect_matches_reference(c, GetParam(), true);
    }
    ScopedEnv vec("ATTNKIT_AMX_DECODE", "0");
    expect_matches_reference(c, GetParam(), true);
  }
}

// The table's cases for the features intel_amx supports beyond SGLang's row (sliding window, fp8
// KV, TARGET_VERIFY chains with topk 1), run whatever the descriptor says.
TEST_P(IntelAmxTargeted, TableCasesBeyondSglangRow) {
  int ran = 0;
  for (const CaseSpec& c : harness::shared_case_table()) {
    const bool chain_verify = c.mode == ForwardMode::kTargetVerify && c.spec_topk == 1;
    const bool fp8 = c.kv_dtype == DType::kFP8E4M3 || c.kv_dtype == DType::kFP8E5M2;
    if (c.mla || c.spec_topk > 1 || !(chain_verify || fp8 || c.sliding_window >= 0)) continue;
    SCOPED_TRACE(c.name);
    expect_matches_reference(c, GetParam(), true);
    ++ran;
  }
  EXPECT_GT(ran, 0);
}

INSTANTIATE_TEST_SUITE_P(AllPaths, IntelAmxTargeted, ::testing::ValuesIn(kIsas),
                         [](const auto& info) { return std::string(cpu_isa_name(info.param)); });

// ---- rejected inputs ----

PreparedCase prepare_or_die(const CaseSpec& spec) {
  Result<PreparedCase> pc = harness::prepare_case(spec, Device::cpu());
  EXPECT_TRUE(pc.is_ok()) << pc.status().to_string();
  return std::move(pc).value();
}

// The AMX experiment knobs accept their documented values only; anything else is reported on
// stderr (core/env_knob.h) and the default kept, so an A/B with a typo does not silently measure
// the default.
TEST(IntelAmxKnobs, BadValuesAreReportedAndIgnored) {
  PreparedCase pc = prepare_or_die(make_case("knobs", ForwardMode::kExtend, 16, {40}, {30}));
  ScopedEnv keys("ATTNKIT_AMX_KEY_BLOCK", "100");
  ScopedEnv rows("ATTNKIT_AMX_ROWS_PER_ITEM", "128abc");
  ScopedEnv pipeline("ATTNKIT_AMX_PIPELINE", "l");
  ScopedEnv pf("ATTNKIT_AMX_DECODE_PF", "4");
  ScopedEnv softmax("ATTNKIT_AMX_SOFTMAX", "off");
  ScopedEnv pv_blocks("ATTNKIT_AMX_PV_BLOCKS", "3");
  ScopedEnv blocked("ATTNKIT_CPU_BLOCKED_EXTEND", "no");
  testing::internal::CaptureStderr();
  Result<std::unique_ptr<AttentionBackend>> backend = create_intel_amx_backend(pc.context());
  const std::string err = testing::internal::GetCapturedStderr();
  ASSERT_TRUE(backend.is_ok()) << backend.status().to_string();
  for (const char* line :
       {"attnkit: ignoring ATTNKIT_AMX_KEY_BLOCK=100 (accepted: 128, 256); using 128\n",
        "attnkit: ignoring ATTNKIT_AMX_ROWS_PER_ITEM=128abc (accepted: powers of two 64..512); "
        "using 256\n",
        "attnkit: ignoring ATTNKIT_AMX_PIPELINE=l (accepted: 0, 1); using 1\n",
        "attnkit: ignoring ATTNKIT_AMX_DECODE_PF=4 (accepted: integers 0..3); using 0\n",
        "attnkit: ignoring ATTNKIT_AMX_SOFTMAX=off (accepted: an integer, 0 = off); using 1\n",
        "attnkit: ignoring ATTNKIT_AMX_PV_BLOCKS=3 (accepted: 1, 2, 4); using 4\n",
        "attnkit: ignoring ATTNKIT_CPU_BLOCKED_EXTEND=no (accepted: 0, 1); using 1\n"}) {
    EXPECT_NE(err.find(line), std::string::npos) << "missing: " << line << "stderr:\n" << err;
  }
  {
    ScopedEnv good_keys("ATTNKIT_AMX_KEY_BLOCK", "256");
    ScopedEnv good_rows("ATTNKIT_AMX_ROWS_PER_ITEM", "64");
    ScopedEnv good_pipeline("ATTNKIT_AMX_PIPELINE", "0");
    ScopedEnv good_pf("ATTNKIT_AMX_DECODE_PF", "3");
    ScopedEnv good_softmax("ATTNKIT_AMX_SOFTMAX", "2");  // any integer: 0 = off, else on
    ScopedEnv good_pv_blocks("ATTNKIT_AMX_PV_BLOCKS", "1");
    ScopedEnv good_blocked("ATTNKIT_CPU_BLOCKED_EXTEND", "0");
    testing::internal::CaptureStderr();
    ASSERT_TRUE(create_intel_amx_backend(pc.context()).is_ok());
    EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  }
}

void expect_error_mentions(const Status& st, StatusCode code, const std::string& needle) {
  EXPECT_EQ(st.code(), code) << st.to_string();
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.to_string();
}

TEST(IntelAmxRejects, Fp4KvCache) {
  CaseSpec c = make_case("fp4", ForwardMode::kDecode, 16, {40}, {1});
  c.kv_dtype = DType::kFP4E2M1;
  PreparedCase pc = prepare_or_die(c);
  Result<std::unique_ptr<AttentionBackend>> backend = create_intel_amx_backend(pc.context());
  ASSERT_FALSE(backend.is_ok());
  expect_error_mentions(backend.status(), StatusCode::kUnsupported, "fp4_e2m1");
}

TEST(IntelAmxRejects, Mla) {
  const CaseSpec* spec = harness::find_case("mla_decode_page1");
  ASSERT_NE(spec, nullptr);
  PreparedCase pc = prepare_or_die(*spec);
  Result<std::unique_ptr<AttentionBackend>> backend = create_intel_amx_backend(pc.context());
  ASSERT_FALSE(backend.is_ok());
  expect_error_mentions(backend.status(), StatusCode::kUnsupported, "MLA");
}

TEST(IntelAmxRejects, HeadDimNotMultipleOf16) {
  PreparedCase pc = prepare_or_die(make_case("d72", ForwardMode::kDecode, 16, {40}, {1}, 4, 2, 72));
  Result<std::unique_ptr<AttentionBackend>> backend = create_intel_amx_backend(pc.context());
  ASSERT_FALSE(backend.is_ok());
  expect_error_mentions(backend.status(), StatusCode::kUnsupported, "qk_head_dim 72");
}

// The shared table's last MHA target-verify case with a tree (topk > 1); null if none.
const CaseSpec* verify_tree_case() {
  const CaseSpec* tree = nullptr;
  for (const CaseSpec& c : harness::shared_case_table()) {
    if (c.mode == ForwardMode::kTargetVerify && c.spec_topk > 1 && !c.mla) tree = &c;
  }
  return tree;
}

TEST(IntelAmxRejects, SpecTreeMask) {
  const CaseSpec* tree = verify_tree_case();
  ASSERT_NE(tree, nullptr) << "the shared table has no MHA verify tree (topk > 1)";
  PreparedCase pc = prepare_or_die(*tree);
  Result<std::unique_ptr<AttentionBackend>> backend = create_intel_amx_backend(pc.context());
  ASSERT_TRUE(backend.is_ok()) << backend.status().to_string();
  expect_error_mentions((*backend)->init_forward_metadata(pc.batch), StatusCode::kUnsupported,
                        "topk " + std::to_string(tree->spec_topk));
}

// topk 1 with a custom_mask: the backend verifies the chain causally, so a mask that is not the
// chain is refused (it was ignored: rel L2 ~0.1 against the reference, which applies it), the
// chain mask itself runs and matches, and a forward whose topk or mask differs from the plan's is
// refused (it ran the planned causal chain).
TEST(IntelAmxRejects, SpecMaskThatIsNotTheChain) {
  const CaseSpec* tree = verify_tree_case();
  ASSERT_NE(tree, nullptr) << "the shared table has no MHA verify tree (topk > 1)";
  PreparedCase pc = prepare_or_die(*tree);
  Result<std::unique_ptr<AttentionBackend>> backend = create_intel_amx_backend(pc.context());
  ASSERT_TRUE(backend.is_ok()) << backend.status().to_string();
  SpecInfo& spec = pc.batch.spec;
  ASSERT_TRUE(spec.custom_mask.defined());
  spec.topk = 1;  // the tree's mask kept
  expect_error_mentions((*backend)->init_forward_metadata(pc.batch), StatusCode::kUnsupported,
                        "spec.custom_mask of request");
  // Rewrite every request's block as the chain: prefix columns 1, draft i sees drafts 0..i.
  auto* mask = static_cast<uint8_t*>(spec.custom_mask.data);
  const int64_t n = spec.draft_token_num;
  for (int r = 0; r < pc.batch.batch_size; ++r) {
    const int64_t prefix = pc.batch.seq_lens_host[static_cast<size_t>(r)];
    uint8_t* block = mask + spec.mask_indptr_host[static_cast<size_t>(r)];
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t c = 0; c < prefix + n; ++c) block[i * (prefix + n) + c] = c <= prefix + i;
    }
  }
  ASSERT_TRUE(harness::run_backend(**backend, pc, /*save_kv=*/true).is_ok());
  Result<harness::Comparison> cmp = harness::compare_with_reference(pc);
  ASSERT_TRUE(cmp.is_ok()) << cmp.status().to_string();
  EXPECT_TRUE(cmp->passed()) << cmp->summary();
  // Planned as a chain, then run with topk 2 or another mask buffer: refused by name.
  ASSERT_TRUE((*backend)->init_forward_metadata(pc.batch).is_ok());
  const harness::LayerData& ld = pc.layers[0];
  spec.topk = 2;
  expect_error_mentions((*backend)->forward(ld.q, ld.k, ld.v, ld.out, ld.layer, pc.batch,
                                            /*save_kv=*/false, ld.lse),
                        StatusCode::kInvalidArgument, "init_forward_metadata");
  spec.topk = 1;
  std::vector<uint8_t> copy(mask, mask + spec.custom_mask.numel());
  spec.custom_mask.data = copy.data();
  expect_error_mentions((*backend)->forward(ld.q, ld.k, ld.v, ld.out, ld.layer, pc.batch,
                                            /*save_kv=*/false, ld.lse),
                        StatusCode::kInvalidArgument, "init_forward_metadata");
}

TEST(IntelAmxRejects, ForwardWithoutMetadata) {
  PreparedCase pc = prepare_or_die(make_case("nometa", ForwardMode::kDecode, 16, {40}, {1}));
  Result<std::unique_ptr<AttentionBackend>> backend = create_intel_amx_backend(pc.context());
  ASSERT_TRUE(backend.is_ok()) << backend.status().to_string();
  const harness::LayerData& ld = pc.layers[0];
  const Status st = (*backend)->forward(ld.q, TensorView(), TensorView(), ld.out, ld.layer,
                                        pc.batch, /*save_kv=*/false, ld.lse);
  expect_error_mentions(st, StatusCode::kInvalidArgument, "init_forward_metadata");
}

// A forward after a refused init_forward_metadata names the refusal, not a missing call; a
// later successful plan clears it.
TEST(IntelAmxRejects, ForwardAfterARefusedPlanNamesTheRefusal) {
  PreparedCase pc = prepare_or_die(make_case("refused", ForwardMode::kDecode, 16, {40}, {1}));
  Result<std::unique_ptr<AttentionBackend>> backend = create_intel_amx_backend(pc.context());
  ASSERT_TRUE(backend.is_ok()) << backend.status().to_string();
  const harness::LayerData& ld = pc.layers[0];
  const int32_t seq = pc.batch.seq_lens_host[0];
  pc.batch.seq_lens_host[0] = -5;
  const Status refused = (*backend)->init_forward_metadata(pc.batch);
  ASSERT_FALSE(refused.is_ok());
  pc.batch.seq_lens_host[0] = seq;
  const Status st = (*backend)->forward(ld.q, TensorView(), TensorView(), ld.out, ld.layer,
                                        pc.batch, /*save_kv=*/false, ld.lse);
  expect_error_mentions(st, StatusCode::kInvalidArgument, "was refused");
  EXPECT_NE(st.message().find(refused.message()), std::string::npos) << st.to_string();
  ASSERT_TRUE((*backend)->init_forward_metadata(pc.batch).is_ok());
  EXPECT_TRUE((*backend)
                  ->forward(ld.q, TensorView(), TensorView(), ld.out, ld.layer, pc.batch,
                            /*save_kv=*/false, ld.lse)
                  .is_ok());
}

TEST(IntelAmxRejects, BadShapesAreNamed) {
  PreparedCase pc = prepare_or_die(make_case("shape", ForwardMode::kDecode, 16, {40}, {1}));
  Result<std::unique_ptr<AttentionBackend>> backend = create_intel_amx_backend(pc.context());
  ASSERT_TRUE(backend.is_ok()) << backend.status().to_string();
  ASSERT_TRUE((*backend)->init_forward_metadata(pc.batch).is_ok());
  const harness::LayerData& ld = pc.layers[0];
  TensorView bad_out = ld.out;
  bad_out.shape[2] = ld.out.shape[2] / 2;
  const Status st = (*backend)->forward(ld.q, TensorView(), TensorView(), bad_out, ld.layer,
                                        pc.batch, /*save_kv=*/false, ld.lse);
  // The message must be about out's shape (a bare "out" also matched "without", "output", ...).
  expect_error_mentions(st, StatusCode::kInvalidArgument, "out: expected shape [");
}

// req_to_token entries are slots of the pool: one past the end or in the reserved page 0 is named
// (it was read out of bounds: garbage or a crash), as torch_native does.
TEST(IntelAmxRejects, PageTablePastThePoolOrInPageZero) {
  for (const bool decode : {true, false}) {
    for (const bool past_the_end : {true, false}) {
      PreparedCase pc = prepare_or_die(
          decode ? make_case("slots_decode", ForwardMode::kDecode, 16, {40, 20}, {1, 1})
                 : make_case("slots_extend", ForwardMode::kExtend, 16, {40, 20}, {9, 3}));
      const int64_t bad = past_the_end ? pc.kv_pool->rows() + 16 : 3;
      const int32_t row = pc.rows[1];
      ASSERT_TRUE(pc.req_to_token->write(row, 5, std::vector<int64_t>{bad}).is_ok());
      Result<std::unique_ptr<AttentionBackend>> backend = create_intel_amx_backend(pc.context());
      ASSERT_TRUE(backend.is_ok()) << backend.status().to_string();
      const Status st = harness::run_backend(**backend, pc, /*save_kv=*/false);
      expect_error_mentions(st, StatusCode::kInvalidArgument,
                            "req_to_token[" + std::to_string(row) + ", 5] = " +
                                std::to_string(bad) + " (request 1) is outside the KV pool slots");
    }
  }
}

// An idle batch (a rank with no work) holds no tokens: one that claims some is refused by plan and
// forward, as torch_native's plan refused it (both had returned ok; a review helper's finding).
TEST(IntelAmxRejects, IdleBatchWithTokens) {
  PreparedCase pc = prepare_or_die(make_case("idle", ForwardMode::kDecode, 16, {40, 20}, {1, 1}));
  Result<std::unique_ptr<AttentionBackend>> backend = create_intel_amx_backend(pc.context());
  ASSERT_TRUE(backend.is_ok()) << backend.status().to_string();
  ForwardBatch idle;
  idle.mode = ForwardMode::kIdle;
  idle.num_tokens = 12;
  const harness::LayerData& ld = pc.layers[0];
  expect_error_mentions((*backend)->init_forward_metadata(idle), StatusCode::kInvalidArgument,
                        "ForwardBatch.num_tokens 12 must be 0 in mode idle");
  expect_error_mentions((*backend)->forward(ld.q, TensorView(), TensorView(), ld.out, ld.layer,
                                            idle, /*save_kv=*/false, ld.lse),
                        StatusCode::kInvalidArgument, "must be 0 in mode idle");
  idle.num_tokens = 0;
  EXPECT_TRUE((*backend)->init_forward_metadata(idle).is_ok());
  EXPECT_TRUE((*backend)
                  ->forward(ld.q, TensorView(), TensorView(), ld.out, ld.layer, idle,
                            /*save_kv=*/false, ld.lse)
                  .is_ok());
}

// A plan is for one batch: a batch of the same mode and size with other rows or lengths is refused
// (it ran on the stale plan, reading the old requests' keys).
TEST(IntelAmxRejects, ForwardWithAnotherBatchsPlan) {
  PreparedCase pc = prepare_or_die(make_case("stale", ForwardMode::kDecode, 16, {40, 20}, {1, 1}));
  Result<std::unique_ptr<AttentionBackend>> backend = create_intel_amx_backend(pc.context());
  ASSERT_TRUE(backend.is_ok()) << backend.status().to_string();
  ASSERT_TRUE((*backend)->init_forward_metadata(pc.batch).is_ok());
  ForwardBatch other = pc.batch;
  other.seq_lens_host[1] -= 1;
  other.seq_lens_sum -= 1;
  // The array and its host copy agree (a contradicting copy is refused before the plan is).
  std::vector<int32_t> lens(pc.batch.seq_lens.data_as<int32_t>(),
                            pc.batch.seq_lens.data_as<int32_t>() + 2);
  lens[1] -= 1;
  other.seq_lens = TensorView(lens.data(), DType::kI32, Device::cpu(), {2});
  // Its new token's slot is the row's entry at the shorter length (ForwardBatch::validate checks
  // that out_cache_loc follows the rows before the plan is compared).
  std::vector<int64_t> loc(pc.batch.out_cache_loc.data_as<int64_t>(),
                           pc.batch.out_cache_loc.data_as<int64_t>() + 2);
  loc[1] = pc.batch.req_to_token_pool->host_row(
      other.req_pool_indices_host[1])[other.seq_lens_host[1] - 1];
  other.out_cache_loc = TensorView(loc.data(), DType::kI64, Device::cpu(), {2});
  const harness::LayerData& ld = pc.layers[0];
  const Status st = (*backend)->forward(ld.q, TensorView(), TensorView(), ld.out, ld.layer, other,
                                        /*save_kv=*/false, ld.lse);
  expect_error_mentions(st, StatusCode::kInvalidArgument, "init_forward_metadata");
}

// A verify plan of N drafts per request, then a forward of the same rows and lengths with fewer
// drafts (q / out of bs x N' rows): refused by num_tokens and draft_token_num, nothing written (the
// stale plan's query offsets wrote past the smaller out).
TEST(IntelAmxRejects, VerifyForwardWithAnotherDraftCount) {
  CaseSpec c = make_case("stale_verify", ForwardMode::kTargetVerify, 16, {40, 20}, {});
  c.spec_draft_tokens = 4;
  c.spec_topk = 1;
  PreparedCase pc = prepare_or_die(c);
  Result<std::unique_ptr<AttentionBackend>> backend = create_intel_amx_backend(pc.context());
  ASSERT_TRUE(backend.is_ok()) << backend.status().to_string();
  // Verify batches may leave the extend lengths out (the drafts follow the committed prefix): then
  // rows and seq_lens alone do not tell the two batches apart.
  ForwardBatch planned = pc.batch;
  test_support::drop_verify_lengths(&planned);
  ASSERT_TRUE((*backend)->init_forward_metadata(planned).is_ok());
  ForwardBatch fewer = planned;
  fewer.spec.draft_token_num = 2;
  // The two drafts of each request at the slots its row holds after its prefix (as
  // ForwardBatch::validate checks before the plan is compared).
  std::vector<int64_t> loc;
  for (int r = 0; r < fewer.batch_size; ++r) {
    const int32_t* row = fewer.req_to_token_pool->host_row(fewer.req_pool_indices_host[r]);
    for (int i = 0; i < 2; ++i) loc.push_back(row[fewer.seq_lens_host[r] + i]);
  }
  fewer.out_cache_loc = TensorView(loc.data(), DType::kI64, Device::cpu(), {4});
  const harness::LayerData& ld = pc.layers[0];
  const auto* bytes = static_cast<const unsigned char*>(ld.out.data);
  const std::vector<unsigned char> before(bytes, bytes + ld.out.storage_bytes());
  const Status st = test_support::forward_first_tokens(**backend, ld, fewer, 4);
  expect_error_mentions(st, StatusCode::kInvalidArgument, "num_tokens 4");
  EXPECT_TRUE(std::equal(before.begin(), before.end(), bytes)) << "out was written";
}

// The plan checked its slots against one pool and page table: a forward over another (smaller)
// pool is refused instead of reading it unchecked.
TEST(IntelAmxRejects, ForwardOverAnotherPool) {
  // The other pool is the larger one, so the batch's slots are rows of both and the refusal is
  // the plan's (a smaller pool is refused first by ForwardBatch::validate's slot check).
  PreparedCase pc = prepare_or_die(make_case("pool_a", ForwardMode::kDecode, 16, {4, 2}, {1, 1}));
  PreparedCase other =
      prepare_or_die(make_case("pool_b", ForwardMode::kDecode, 16, {40, 20}, {1, 1}));
  Result<std::unique_ptr<AttentionBackend>> backend = create_intel_amx_backend(pc.context());
  ASSERT_TRUE(backend.is_ok()) << backend.status().to_string();
  ASSERT_TRUE((*backend)->init_forward_metadata(pc.batch).is_ok());
  ForwardBatch moved = pc.batch;
  moved.kv_pool = other.kv_pool.get();
  const harness::LayerData& ld = pc.layers[0];
  const Status st = (*backend)->forward(ld.q, TensorView(), TensorView(), ld.out, ld.layer, moved,
                                        /*save_kv=*/false, ld.lse);
  expect_error_mentions(st, StatusCode::kInvalidArgument, "init_forward_metadata");
}

// The table changed between init_forward_metadata and the forward: a request freed (its row reads
// 0, the reserved page: a silent wrong answer) or a slot stored into table() past write()'s check
// (a segfault). The forward checks the slots it reads again, as torch_native does.
TEST(IntelAmxRejects, TableRowsChangedAfterPlanningAreRefused) {
  PreparedCase pc =
      prepare_or_die(make_case("stale_rows", ForwardMode::kDecode, 16, {40, 20}, {1, 1}));
  Result<std::unique_ptr<AttentionBackend>> backend = create_intel_amx_backend(pc.context());
  ASSERT_TRUE(backend.is_ok()) << backend.status().to_string();
  ASSERT_TRUE((*backend)->init_forward_metadata(pc.batch).is_ok());
  const harness::LayerData& ld = pc.layers[0];
  auto* table = const_cast<ReqToTokenPool*>(pc.batch.req_to_token_pool);
  const int row = pc.batch.req_pool_indices_host[1];
  int32_t* entries = table->table().data_as<int32_t>() + int64_t{row} * table->max_context_len();
  const int32_t kept = entries[3];
  entries[3] = 100000000;  // past the pool, stored around write()
  Status st = (*backend)->forward(ld.q, TensorView(), TensorView(), ld.out, ld.layer, pc.batch,
                                  /*save_kv=*/false, ld.lse);
  expect_error_mentions(st, StatusCode::kInvalidArgument, "= 100000000 (request 1) is outside");
  entries[3] = kept;
  ASSERT_TRUE((*backend)
                  ->forward(ld.q, TensorView(), TensorView(), ld.out, ld.layer, pc.batch,
                            /*save_kv=*/false, ld.lse)
                  .is_ok());
  // A prefix entry zeroed (the reserved page) ...
  entries[3] = 0;
  st = (*backend)->forward(ld.q, TensorView(), TensorView(), ld.out, ld.layer, pc.batch,
                           /*save_kv=*/false, ld.lse);
  expect_error_mentions(st, StatusCode::kInvalidArgument, "] = 0 (request 1) is outside");
  entries[3] = kept;
  // ... or the whole row freed: its new token's column no longer holds out_cache_loc's slot.
  ASSERT_TRUE(table->free(row).is_ok());
  st = (*backend)->forward(ld.q, TensorView(), TensorView(), ld.out, ld.layer, pc.batch,
                           /*save_kv=*/false, ld.lse);
  expect_error_mentions(st, StatusCode::kInvalidArgument,
                        "is not req_to_token[" + std::to_string(row) + ", 20] = 0");
}

TEST(IntelAmxIsa, ParsesNamesAndRejectsUnknown) {
  for (CpuIsa isa : kIsas) {
    Result<CpuIsa> parsed = parse_cpu_isa(cpu_isa_name(isa));
    ASSERT_TRUE(parsed.is_ok());
    EXPECT_EQ(*parsed, isa);
  }
  Result<CpuIsa> bad = parse_cpu_isa("sse9");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("sse9"), std::string::npos);
}

TEST(IntelAmxIsa, BestIsaFollowsFeatures) {
  DeviceInfo cpu;
  EXPECT_EQ(best_cpu_isa(cpu), CpuIsa::kScalar);
  cpu.has_avx2 = true;
  EXPECT_EQ(best_cpu_isa(cpu), CpuIsa::kAvx2);
  cpu.has_avx512 = true;
  EXPECT_EQ(best_cpu_isa(cpu), CpuIsa::kAvx512);
  cpu.has_avx512_bf16 = true;
  // AVX512-BF16 without VBMI (Cooper Lake): the vector level below.
  EXPECT_EQ(best_cpu_isa(cpu), CpuIsa::kAvx512);
  cpu.has_avx512_vbmi = true;
  EXPECT_EQ(best_cpu_isa(cpu), CpuIsa::kAvx512Bf16);
  cpu.has_amx_bf16 = true;
  EXPECT_EQ(best_cpu_isa(cpu), CpuIsa::kAmx);
}

TEST(IntelAmxIsa, ForcingAMissingIsaIsAnError) {
  const CpuIsa best = best_cpu_isa(host_cpu());
  if (best == CpuIsa::kAmx) GTEST_SKIP() << "this CPU provides every level";
  PreparedCase pc = prepare_or_die(make_case("force", ForwardMode::kDecode, 16, {40}, {1}));
  Result<std::unique_ptr<AttentionBackend>> backend = make_backend(pc, CpuIsa::kAmx);
  ASSERT_FALSE(backend.is_ok());
  expect_error_mentions(backend.status(), StatusCode::kUnsupported, "amx");
  // The message says what each level needs (VBMI for avx512_bf16 and amx).
  expect_error_mentions(backend.status(), StatusCode::kUnsupported, "AVX512-VBMI");
}

}  // namespace
}  // namespace attnkit
