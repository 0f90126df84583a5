// Inputs the CUDA kernels cannot take are refused by name before any launch (a review of the
// host-side checks found each of these reaching a kernel): the wrong entry point for the batch's
// mode (forward_extend of a decode batch had returned ok without writing out); a triton layer
// wider than its backend context (the split-KV partials are sized from the context); q / out
// views off the 16-byte grain (a misaligned-address fault); non-bf16 q / out on the MLA
// decode engine (garbage with status ok); encoder lengths on the host only over a CUDA pool (a null
// device array in the index kernel); and token totals past int32 (the CUDA index metadata wraps).
// After every refusal the context is healthy and out is untouched.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "attnkit/kv_cache.h"
#include "attnkit/registry.h"
#include "harness/case_runner.h"
#include "support/backend_case_test.h"
#include "support/gpu_test_helpers.h"
#include "support/plan_check.h"

namespace attnkit {
namespace {

using harness::CaseSpec;
using test_support::CaseOnBackend;

void expect_refused(const Status& st, StatusCode code, const std::string& needle) {
  EXPECT_EQ(st.code(), code) << st.to_string();
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.to_string();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// The backend on the case, or a skip reason (empty: made).
std::string make(const std::string& backend, const CaseSpec& spec, CaseOnBackend* out) {
  std::string skip;
  Result<CaseOnBackend> made = test_support::case_on_backend(backend, spec, Device::cuda(0), &skip);
  if (!skip.empty()) return skip;
  if (!made.is_ok()) return "";  // reported by the caller's ASSERT on backend
  *out = std::move(made).value();
  return "";
}

class EntryPoint : public ::testing::TestWithParam<std::string> {};

TEST_P(EntryPoint, WrongEntryPointIsRefused) {
  if (!test_support::has_cuda()) GTEST_SKIP() << "no CUDA device";
  const std::string& name = GetParam();
  const bool mla = name == "flashmla";
  for (const bool decode_batch : {true, false}) {
    const CaseSpec spec = test_support::plan_check_case(
        decode_batch ? "entry_decode" : "entry_extend",
        decode_batch ? ForwardMode::kDecode : ForwardMode::kExtend, {300, 41},
        decode_batch ? std::vector<int>{1, 1} : std::vector<int>{9, 3}, mla, 7);
    CaseOnBackend made;
    const std::string skip = make(name, spec, &made);
    if (!skip.empty()) GTEST_SKIP() << skip;
    ASSERT_NE(made.backend, nullptr);
    STATUS_OK(made.backend->init_forward_metadata(made.pc.batch));
    const harness::LayerData& ld = made.pc.layers[0];
    const std::vector<uint8_t> before = test_support::to_host_bytes(ld.out);
    const Status st =
        decode_batch ? made.backend->forward_extend(ld.q, TensorView(), TensorView(), ld.out,
                                                    ld.layer, made.pc.batch, false, TensorView())
                     : made.backend->forward_decode(ld.q, TensorView(), TensorView(), ld.out,
                                                    ld.layer, made.pc.batch, false, TensorView());
    expect_refused(st, StatusCode::kInvalidArgument,
                   decode_batch ? "forward_extend called with a decode batch"
                                : "forward_decode called with an extend batch");
    EXPECT_EQ(test_support::to_host_bytes(ld.out), before) << "out was written";
    // The right entry point still runs.
    STATUS_OK(made.backend->forward(ld.q, TensorView(), TensorView(), ld.out, ld.layer,
                                    made.pc.batch, false, TensorView()));
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, EntryPoint,
                         ::testing::Values("triton", "flashinfer", "fa3", "flashmla"));

CaseSpec mha_extend() {
  return test_support::plan_check_case("checks_extend", ForwardMode::kExtend, {300, 41}, {9, 3},
                                       false, 11);
}

// The context says 8 q heads, the layer (and q / out) 32: the split partials sized for 8 were
// indexed for 32.
TEST(TritonInputs, LayerWiderThanTheContextIsRefused) {
  if (!test_support::has_cuda()) GTEST_SKIP() << "no CUDA device";
  Result<harness::PreparedCase> pc = harness::prepare_case(mha_extend(), Device::cuda(0));
  ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
  BackendContext ctx = pc->context();
  ASSERT_EQ(ctx.num_q_heads, 32);
  ctx.num_q_heads = 8;
  Result<std::unique_ptr<AttentionBackend>> b = builtin_registry().find("triton")->create(ctx);
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  STATUS_OK((*b)->init_forward_metadata(pc->batch));
  const harness::LayerData& ld = pc->layers[0];
  expect_refused((*b)->forward(ld.q, TensorView(), TensorView(), ld.out, ld.layer, pc->batch, false,
                               TensorView()),
                 StatusCode::kInvalidArgument, "does not fit the backend context (heads 8/8");
}

// q / out views a bf16 element off the 16-byte grain, or with a head stride of 132 elements (264
// bytes): every backend whose kernels move rows in 16-byte vectors refuses them through the one
// byte-based check (check_vector_rows; fa3's wgmma engine declines and its flashinfer path
// refuses).
class MisalignedViews : public ::testing::TestWithParam<std::string> {};

TEST_P(MisalignedViews, AreRefusedBeforeAnyLaunch) {
  if (!test_support::has_cuda()) GTEST_SKIP() << "no CUDA device";
  const std::string& name = GetParam();
  const bool mla = name == "flashmla";
  const CaseSpec spec =
      mla ? test_support::plan_check_case("checks_mla_verify", ForwardMode::kTargetVerify,
                                          {300, 41}, {}, true, 11)
          : mha_extend();
  CaseOnBackend made;
  const std::string skip = make(name, spec, &made);
  if (!skip.empty()) GTEST_SKIP() << skip;
  ASSERT_NE(made.backend, nullptr);
  STATUS_OK(made.backend->init_forward_metadata(made.pc.batch));
  const harness::LayerData& ld = made.pc.layers[0];
  const std::vector<uint8_t> before = test_support::to_host_bytes(ld.out);
  TensorView q_off = ld.q;
  q_off.data = static_cast<char*>(q_off.data) + 2;
  expect_refused(made.backend->forward(q_off, TensorView(), TensorView(), ld.out, ld.layer,
                                       made.pc.batch, false, TensorView()),
                 StatusCode::kUnsupported, ": q ");
  TensorView out_off = ld.out;
  out_off.data = static_cast<char*>(out_off.data) + 2;
  expect_refused(made.backend->forward(ld.q, TensorView(), TensorView(), out_off, ld.layer,
                                       made.pc.batch, false, TensorView()),
                 StatusCode::kUnsupported, ": out ");
  TensorView q_strided = ld.q;
  q_strided.strides[1] = q_strided.strides[1] + 4;  // never read: refused first
  expect_refused(made.backend->forward(q_strided, TensorView(), TensorView(), ld.out, ld.layer,
                                       made.pc.batch, false, TensorView()),
                 StatusCode::kUnsupported, "16-byte aligned base and outer strides");
  EXPECT_EQ(test_support::to_host_bytes(ld.out), before) << "out was written";
  STATUS_OK(made.backend->forward(ld.q, TensorView(), TensorView(), ld.out, ld.layer, made.pc.batch,
                                  false, TensorView()));
}

INSTANTIATE_TEST_SUITE_P(Backends, MisalignedViews,
                         ::testing::Values("triton", "flashinfer", "fa3", "flashmla"));

// A head dim without kernels (72: not in ATTNKIT_HEAD_DIMS) is refused before the cache write:
// the refused forward had already stored its k / v.
TEST(TritonInputs, UnbuiltHeadDimIsRefusedBeforeTheCacheWrite) {
  if (!test_support::has_cuda()) GTEST_SKIP() << "no CUDA device";
  CaseSpec spec = mha_extend();
  spec.num_q_heads = 8;
  spec.num_kv_heads = 2;
  spec.head_dim = spec.v_head_dim = 72;
  Result<harness::PreparedCase> pc = harness::prepare_case(spec, Device::cuda(0));
  ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
  // A context of a built head dim (creation refuses 72), the layer and pool at 72.
  BackendContext ctx = pc->context();
  ctx.qk_head_dim = ctx.v_head_dim = 128;
  Result<std::unique_ptr<AttentionBackend>> b = builtin_registry().find("triton")->create(ctx);
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  STATUS_OK((*b)->init_forward_metadata(pc->batch));
  const harness::LayerData& ld = pc->layers[0];
  auto& pool = static_cast<MHAKVPool&>(*pc->kv_pool);
  const std::vector<uint8_t> k_before = test_support::to_host_bytes(pool.k_buffer(0));
  expect_refused((*b)->forward(ld.q, ld.k, ld.v, ld.out, ld.layer, pc->batch, true, TensorView()),
                 StatusCode::kUnsupported, "triton: head dims 72/72 have no kernels");
  EXPECT_EQ(test_support::to_host_bytes(pool.k_buffer(0)), k_before) << "the cache was written";
}

// A pool of another activation dtype (f16 under bf16 q) has no triton kernel (launch_simt_kv): it
// is refused before the cache write, for decode and extend. The kernels refused it after set_kv had
// stored k / v, and flashinfer sends such pools to triton on purpose (helper 49's audit).
TEST(TritonInputs, PoolOfAnotherActivationDtypeIsRefusedBeforeTheCacheWrite) {
  if (!test_support::has_cuda()) GTEST_SKIP() << "no CUDA device";
  for (ForwardMode mode : {ForwardMode::kExtend, ForwardMode::kDecode}) {
    SCOPED_TRACE(forward_mode_name(mode));
    CaseSpec spec = mode == ForwardMode::kExtend
                        ? mha_extend()
                        : test_support::plan_check_case("checks_decode", ForwardMode::kDecode,
                                                        {300, 41}, {1, 1}, false, 11);
    spec.q_dtype = DType::kBF16;
    spec.kv_dtype = DType::kF16;
    Result<harness::PreparedCase> pc = harness::prepare_case(spec, Device::cuda(0));
    ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
    Result<std::unique_ptr<AttentionBackend>> b =
        builtin_registry().find("triton")->create(pc->context());
    ASSERT_TRUE(b.is_ok()) << b.status().to_string();
    STATUS_OK((*b)->init_forward_metadata(pc->batch));
    const harness::LayerData& ld = pc->layers[0];
    auto& pool = static_cast<MHAKVPool&>(*pc->kv_pool);
    const std::vector<uint8_t> k_before = test_support::to_host_bytes(pool.k_buffer(0));
    const std::vector<uint8_t> v_before = test_support::to_host_bytes(pool.v_buffer(0));
    expect_refused((*b)->forward(ld.q, ld.k, ld.v, ld.out, ld.layer, pc->batch, true, TensorView()),
                   StatusCode::kUnsupported, "triton: kv cache dtype f16 with bf16 activations");
    EXPECT_EQ(test_support::to_host_bytes(pool.k_buffer(0)), k_before) << "the cache was written";
    EXPECT_EQ(test_support::to_host_bytes(pool.v_buffer(0)), v_before) << "the cache was written";
  }
}

// The MLA decode kernels read q and write out as bf16 whatever the views say.
TEST(MlaInputs, NonBf16QIsRefused) {
  if (!test_support::has_cuda()) GTEST_SKIP() << "no CUDA device";
  CaseOnBackend made;
  const std::string skip = make("flashmla",
                                test_support::plan_check_case("checks_mla", ForwardMode::kDecode,
                                                              {300, 41}, {1, 1}, true, 13),
                                &made);
  if (!skip.empty()) GTEST_SKIP() << skip;
  ASSERT_NE(made.backend, nullptr);
  STATUS_OK(made.backend->init_forward_metadata(made.pc.batch));
  const harness::LayerData& ld = made.pc.layers[0];
  TensorView q16 = ld.q, out16 = ld.out;
  q16.dtype = out16.dtype = DType::kF16;
  const Status st = made.backend->forward(q16, TensorView(), TensorView(), out16, ld.layer,
                                          made.pc.batch, false, TensorView());
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("f16"), std::string::npos) << st.to_string();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// The MLA decode kernels address a token's row with the page size they were built for (the
// context's, 64 here): a batch over a pool of another page size would read other requests' rows.
// It is refused by name before any launch; out is untouched; the batch on its own pool then runs.
TEST(MlaInputs, PoolOfAnotherPageSizeIsRefused) {
  if (!test_support::has_cuda()) GTEST_SKIP() << "no CUDA device";
  CaseOnBackend made;
  const std::string skip =
      make("flashmla",
           test_support::plan_check_case("checks_mla_page", ForwardMode::kDecode, {300, 41}, {1, 1},
                                         true, 17),
           &made);
  if (!skip.empty()) GTEST_SKIP() << skip;
  ASSERT_NE(made.backend, nullptr);
  const KVPool& own = *made.pc.kv_pool;
  ASSERT_EQ(own.page_size(), 64);
  // The same pool with pages of 16 and at least as many rows, so that every index of the batch is
  // inside it (the table check would refuse it first otherwise).
  KVPoolConfig config = own.config();
  config.page_size = 16;
  config.size += 64;
  Result<std::unique_ptr<MLAKVPool>> other = MLAKVPool::create(config);
  ASSERT_TRUE(other.is_ok()) << other.status().to_string();
  ForwardBatch batch = made.pc.batch;
  batch.kv_pool = other.value().get();
  const harness::LayerData& ld = made.pc.layers[0];
  const std::vector<uint8_t> out_before = test_support::to_host_bytes(ld.out);
  Status st = made.backend->init_forward_metadata(batch);
  if (st.is_ok()) {
    st = made.backend->forward(ld.q, TensorView(), TensorView(), ld.out, ld.layer, batch, false,
                               TensorView());
  }
  expect_refused(st, StatusCode::kInvalidArgument,
                 "the batch's KV pool has page_size 16; this MLA decode runs page_size 64");
  EXPECT_EQ(test_support::to_host_bytes(ld.out), out_before) << "out was written";
  // The batch on the pool it was made for runs and matches the reference.
  STATUS_OK(harness::run_backend(*made.backend, made.pc, /*save_kv=*/false));
  Result<harness::Comparison> cmp = harness::compare_with_reference(made.pc);
  ASSERT_TRUE(cmp.is_ok()) << cmp.status().to_string();
  EXPECT_TRUE(cmp.value().passed()) << cmp.value().summary();
}

// Cross-attention lengths on the host only, over a CUDA pool: the kernels read the device array.
TEST(BatchInputs, EncoderLensMustBeOnTheDevice) {
  if (!test_support::has_cuda()) GTEST_SKIP() << "no CUDA device";
  const CaseSpec* spec = harness::find_case("extend_cross_attention");
  ASSERT_NE(spec, nullptr);
  CaseOnBackend made;
  const std::string skip = make("triton", *spec, &made);
  if (!skip.empty()) GTEST_SKIP() << skip;
  ASSERT_NE(made.backend, nullptr);
  ForwardBatch batch = made.pc.batch;
  ASSERT_FALSE(batch.encoder_lens_host.empty());
  batch.encoder_lens = TensorView();
  expect_refused(made.backend->init_forward_metadata(batch), StatusCode::kInvalidArgument,
                 "ForwardBatch.encoder_lens is missing");
  STATUS_OK(made.backend->init_forward_metadata(made.pc.batch));
}

// A token total past int32 over a CUDA pool (the index metadata's prefix sums are int32).
TEST(BatchInputs, TokenTotalPastInt32IsRefused) {
  if (!test_support::has_cuda()) GTEST_SKIP() << "no CUDA device";
  CaseOnBackend made;
  const std::string skip = make("triton",
                                test_support::plan_check_case("checks_decode", ForwardMode::kDecode,
                                                              {300, 41}, {1, 1}, false, 17),
                                &made);
  if (!skip.empty()) GTEST_SKIP() << skip;
  ASSERT_NE(made.backend, nullptr);
  ForwardBatch batch = made.pc.batch;
  constexpr int32_t kMax = std::numeric_limits<int32_t>::max();
  batch.seq_lens_host[0] = kMax - 5;
  batch.seq_lens_host[1] = 100;
  batch.seq_lens_sum = int64_t{kMax} - 5 + 100;
  expect_refused(made.backend->init_forward_metadata(batch), StatusCode::kInvalidArgument,
                 "exceeds 2147483647");
}

}  // namespace
}  // namespace attnkit
