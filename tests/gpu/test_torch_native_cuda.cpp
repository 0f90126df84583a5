// torch_native on the CUDA device (host staging): the shared case table against the fp64
// reference, and the same cases run on CUDA and on the CPU giving the same outputs and lse.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "backends/torch_native/torch_native_backend.h"
#include "harness/case_runner.h"
#include "support/backend_case_test.h"
#include "support/gpu_test_helpers.h"
#include "support/plan_check.h"

ATTNKIT_BACKEND_CASE_TESTS(TorchNativeCudaCases, "torch_native", attnkit::Device::cuda(0));

namespace attnkit {
namespace {

// CUDA and CPU run the same host code on the same pool bytes: only the staging differs.
constexpr double kCudaVsCpuTolerance = 1e-6;

using harness::CaseSpec;
using harness::PreparedCase;

// Values of a contiguous tensor on any device, as floats.
std::vector<float> download(const TensorView& t) {
  std::vector<float> values;
  if (!t.defined()) return values;
  std::vector<uint8_t> bytes(static_cast<size_t>(t.storage_bytes()));
  const Status s = copy_bytes(bytes.data(), Device::cpu(), t.data, t.device, t.storage_bytes());
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  values.resize(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    values[static_cast<size_t>(i)] = load_as_float(bytes.data(), t.dtype, i);
  }
  return values;
}

// Runs torch_native on the case prepared on `device`; returns the prepared case (outputs inside).
std::unique_ptr<PreparedCase> run_on(const CaseSpec& spec, Device device, bool save_kv) {
  Result<PreparedCase> pc = harness::prepare_case(spec, device);
  EXPECT_TRUE(pc.is_ok()) << device.to_string() << ": " << pc.status().to_string();
  if (!pc.is_ok()) return nullptr;
  auto prepared = std::make_unique<PreparedCase>(std::move(pc).value());
  Result<std::unique_ptr<AttentionBackend>> backend =
      create_torch_native_backend(prepared->context());
  EXPECT_TRUE(backend.is_ok()) << device.to_string() << ": " << backend.status().to_string();
  if (!backend.is_ok()) return nullptr;
  const Status run = harness::run_backend(**backend, *prepared, save_kv);
  EXPECT_TRUE(run.is_ok()) << device.to_string() << ": " << run.to_string();
  return run.is_ok() ? std::move(prepared) : nullptr;
}

// Number of elements where a and b differ by more than the tolerance (equal infinities match;
// NaN never does).
int64_t count_mismatches(const std::vector<float>& a, const std::vector<float>& b,
                         std::string* first) {
  int64_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool same =
        a[i] == b[i] || std::fabs(static_cast<double>(a[i]) - b[i]) <= kCudaVsCpuTolerance;
    if (same) continue;
    if (bad == 0) {
      *first = "element " + std::to_string(i) + ": cuda " + std::to_string(a[i]) + " cpu " +
               std::to_string(b[i]);
    }
    ++bad;
  }
  return bad;
}

class TorchNativeCudaVsCpu : public ::testing::TestWithParam<const char*> {};

TEST_P(TorchNativeCudaVsCpu, SameOutputsAndLse) {
  const CaseSpec* spec = harness::find_case(GetParam());
  ASSERT_NE(spec, nullptr) << "no case named " << GetParam();
  for (bool save_kv : {true, false}) {
    SCOPED_TRACE(spec->describe() + (save_kv ? " save_kv" : " reads pool"));
    std::unique_ptr<PreparedCase> gpu = run_on(*spec, Device::cuda(0), save_kv);
    std::unique_ptr<PreparedCase> cpu = run_on(*spec, Device::cpu(), save_kv);
    ASSERT_NE(gpu, nullptr);
    ASSERT_NE(cpu, nullptr);
    ASSERT_EQ(gpu->layers.size(), cpu->layers.size());
    for (size_t l = 0; l < gpu->layers.size(); ++l) {
      SCOPED_TRACE("layer " + std::to_string(l));
      for (const auto& [name, g, c] : {std::tuple{"out", gpu->layers[l].out, cpu->layers[l].out},
                                       std::tuple{"lse", gpu->layers[l].lse, cpu->layers[l].lse}}) {
        const std::vector<float> a = download(g);
        const std::vector<float> b = download(c);
        ASSERT_EQ(a.size(), b.size()) << name;
        ASSERT_FALSE(a.empty()) << name << " was not requested";
        for (float x : a) ASSERT_FALSE(std::isnan(x)) << name << ": NaN poison left on CUDA";
        std::string first;
        EXPECT_EQ(count_mismatches(a, b, &first), 0) << name << ": first mismatch at " << first;
      }
    }
    // The device pool after the run matches the reference's view of it as well.
    Result<harness::Comparison> cmp = harness::compare_with_reference(*gpu);
    ASSERT_TRUE(cmp.is_ok()) << cmp.status().to_string();
    EXPECT_TRUE(cmp->passed()) << cmp->summary();
  }
}

// Non-quantised KV (the CUDA and CPU pools then hold identical bytes) across the features: ragged
// pages, sinks, soft-cap, window, encoder-only, cross-attention, mixed, draft extend, decode, f32,
// the TARGET_VERIFY tree mask, MLA decode / absorbed extend / non-absorbed prefill / verify.
INSTANTIATE_TEST_SUITE_P(Cases, TorchNativeCudaVsCpu,
                         ::testing::Values("extend_page16_ragged", "extend_sinks", "extend_softcap",
                                           "extend_window8_page16", "extend_encoder_bidirectional",
                                           "extend_cross_attention", "mixed_page16",
                                           "draft_extend_page1", "decode_page24_nonpow2",
                                           "decode_f32", "verify_topk4_page16", "mla_decode_page64",
                                           "mla_extend_absorbed_page1", "mla_prefill_192_128",
                                           "mla_verify_topk4_page1"));

TEST(TorchNativeCuda, CreationNeedsTheKvPool) {
  BackendContext ctx;
  ctx.device = Device::cuda(0);
  const Result<std::unique_ptr<AttentionBackend>> created = create_torch_native_backend(ctx);
  ASSERT_FALSE(created.is_ok());
  EXPECT_EQ(created.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(created.status().message().find("ctx.kv_pool"), std::string::npos)
      << created.status().to_string();
}

// A strided out (every other head of a wider buffer) is written through the staging copy without
// touching the bytes between its elements.
TEST(TorchNativeCuda, StridedOutKeepsNeighbouringBytes) {
  const CaseSpec* spec = harness::find_case("decode_page24_nonpow2");
  ASSERT_NE(spec, nullptr);
  std::string skip;
  Result<test_support::CaseOnBackend> made =
      test_support::case_on_backend("torch_native", *spec, Device::cuda(0), &skip);
  ASSERT_TRUE(made.is_ok()) << skip << made.status().to_string();
  PreparedCase* pc = &made->pc;
  const std::unique_ptr<AttentionBackend>* backend = &made->backend;
  const harness::LayerData& ld = pc->layers[0];
  const int64_t t = ld.out.size(0), hq = ld.out.size(1), dv = ld.out.size(2);
  constexpr float kSentinel = 7.25f;
  Result<Buffer> wide =
      Buffer::allocate(Device::cuda(0), dtype_storage_bytes(ld.out.dtype, t * 2 * hq * dv));
  ASSERT_TRUE(wide.is_ok()) << wide.status().to_string();
  const TensorView wide_view = wide->view(ld.out.dtype, {t, 2 * hq, dv});
  ASSERT_TRUE(fill_float(wide_view, kSentinel).is_ok());
  TensorView strided = wide_view;
  strided.shape = {t, hq, dv};
  strided.strides = {2 * hq * dv, 2 * dv, 1};
  const Status run = (*backend)->forward(ld.q, ld.k, ld.v, strided, ld.layer, pc->batch,
                                         /*save_kv=*/ld.save_kv_allowed, ld.lse);
  ASSERT_TRUE(run.is_ok()) << run.to_string();
  const std::vector<float> all = download(wide_view);
  // The written (even) heads hold the layer's attention: against the fp64 reference (which the
  // pool as it is after the run feeds), not only "finite and not the sentinel".
  Result<harness::ReferenceResult> ref = harness::reference_for_layer(*pc, 0);
  ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
  int64_t written = 0, untouched = 0;
  double err2 = 0, ref2 = 0;
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t h = 0; h < 2 * hq; ++h) {
      for (int64_t d = 0; d < dv; ++d) {
        const float x = all[static_cast<size_t>((i * 2 * hq + h) * dv + d)];
        if (h % 2 == 1) {
          untouched += x == kSentinel ? 1 : 0;
        } else {
          written += std::isfinite(x) && x != kSentinel ? 1 : 0;
          const double r = ref->out[static_cast<size_t>((i * hq + h / 2) * dv + d)];
          err2 += (x - r) * (x - r);
          ref2 += r * r;
        }
      }
    }
  }
  EXPECT_EQ(untouched, t * hq * dv);
  EXPECT_EQ(written, t * hq * dv);
  EXPECT_GT(ref2, 0.0);
  EXPECT_LE(std::sqrt(err2 / ref2), harness::tolerance_for(spec->q_dtype));
}

// A +inf or NaN sink in device memory: the shared validation reads host sinks only, and
// torch_native had stored the layer's k / v before its host step refused the sink. Refused now
// before the cache write; the pool keeps its bytes.
TEST(TorchNativeCuda, BadDeviceSinkIsRefusedBeforeTheCacheWrite) {
  const CaseSpec* spec = harness::find_case("extend_sinks");
  ASSERT_NE(spec, nullptr);
  std::string skip;
  Result<test_support::CaseOnBackend> made =
      test_support::case_on_backend("torch_native", *spec, Device::cuda(0), &skip);
  ASSERT_TRUE(made.is_ok()) << skip << made.status().to_string();
  PreparedCase* pc = &made->pc;
  const std::unique_ptr<AttentionBackend>* backend = &made->backend;
  const harness::LayerData& ld = pc->layers[0];
  ASSERT_TRUE(ld.layer.sinks.defined() && ld.layer.sinks.device.is_cuda());
  ASSERT_TRUE((*backend)->init_forward_metadata(pc->batch).is_ok());
  const auto& pool = static_cast<const MHAKVPool&>(*pc->kv_pool);
  const std::vector<uint8_t> k_before = test_support::to_host_bytes(pool.k_buffer(0));
  std::vector<float> sinks = download(ld.layer.sinks);
  for (const float bad : {std::numeric_limits<float>::infinity(), std::nanf("")}) {
    sinks[2] = bad;
    ASSERT_TRUE(copy_bytes(ld.layer.sinks.data, ld.layer.sinks.device, sinks.data(), Device::cpu(),
                           ld.layer.sinks.storage_bytes())
                    .is_ok());
    const Status st = (*backend)->forward(ld.q, ld.k, ld.v, ld.out, ld.layer, pc->batch,
                                          /*save_kv=*/true, ld.lse);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find("layer.sinks[2] (q head 2) is "), std::string::npos)
        << st.to_string();
    EXPECT_EQ(test_support::to_host_bytes(pool.k_buffer(0)), k_before) << "the cache was written";
  }
}

}  // namespace
}  // namespace attnkit
