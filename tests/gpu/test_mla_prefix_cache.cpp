// The MLA chunked prefix cache (AttentionLayer::mla_prefix, src/backends/mla/mla_prefix_cache.h)
// on the CUDA device against the fp64 reference: every chunk size from one token per chunk
// (hundreds of chunks, odd and even counts through the three-slot merge ring) to one chunk, each
// backend whose MLA row claims it, fp8 latent rows, f16 activations; and the clear errors of the
// backends, layers and contexts that cannot run it. The shared case table adds mla_prefill_prefix_*
// cases.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attnkit/registry.h"
#include "backends/triton/triton_backend.h"
#include "harness/case_runner.h"
#include "harness/mla_prefix_expander.h"
#include "support/backend_case_test.h"
#include "support/gpu_test_helpers.h"

namespace attnkit {
namespace {

harness::CaseSpec prefix_case(std::string name, int page, std::vector<int> prefix,
                              std::vector<int> fresh, int chunk) {
  harness::CaseSpec c;
  c.name = std::move(name);
  c.mode = ForwardMode::kExtend;
  c.page_size = page;
  c.prefix_lens = std::move(prefix);
  c.new_lens = std::move(fresh);
  c.mla = true;
  c.kv_lora_rank = 512;
  c.qk_rope_head_dim = 64;
  c.num_q_heads = 8;
  c.num_kv_heads = 8;
  c.head_dim = 192;
  c.v_head_dim = 128;
  c.mla_prefix_chunk = chunk;
  c.seed = 77;
  return c;
}

TEST(MlaPrefixCache, EveryChunkSizeMatchesTheReference) {
  // bs 3, 207 prefix tokens (plan_prefix_chunks fills every chunk but the last): chunk 1 -> 207
  // chunks of one key, 2 -> 104, 7 -> 30 (the 77-token prefix ends in chunk 25), 100 -> 3, 4096 ->
  // one chunk.
  for (int chunk : {1, 2, 7, 100, 4096}) {
    for (const char* backend : {"flashinfer", "fa3"}) {
      SCOPED_TRACE(std::string(backend) + " chunk " + std::to_string(chunk));
      test_support::run_shared_case(backend, Device::cuda(0),
                                    prefix_case("chunks", 1, {130, 0, 77}, {9, 4, 21}, chunk),
                                    false);
    }
  }
}

TEST(MlaPrefixCache, PagedBackendsAndQuantisedLatentRows) {
  harness::CaseSpec c = prefix_case("page64", 64, {640, 65, 1}, {33, 2, 64}, 128);
  test_support::run_shared_case("flashmla", Device::cuda(0), c, false);
  test_support::run_shared_case("fa3", Device::cuda(0), c, false);
  c.kv_dtype = DType::kFP8E4M3;
  test_support::run_shared_case("flashmla", Device::cuda(0), c, false);
  c.kv_dtype = DType::kFP4E2M1;  // block-scaled fp4 latent rows (flashmla's row claims fp4 KV)
  test_support::run_shared_case("flashmla", Device::cuda(0), c, false);
  c.num_q_heads = c.num_kv_heads = 128;  // DeepSeek-V3's 128 heads per rank (TP 1)
  c.kv_dtype = DType::kBF16;
  c.prefix_lens = {300, 1000};
  c.new_lens = {16, 5};
  c.mla_prefix_chunk = 512;
  test_support::run_shared_case("flashmla", Device::cuda(0), c, false);
}

TEST(MlaPrefixCache, F16Activations) {
  harness::CaseSpec c = prefix_case("f16", 1, {200, 31}, {17, 40}, 64);
  c.q_dtype = DType::kF16;
  c.kv_dtype = DType::kF16;
  test_support::run_shared_case("flashinfer", Device::cuda(0), c, false);
  c.kv_dtype = DType::kFP4E2M1;  // fp4 rows dequantised into f16
  test_support::run_shared_case("flashinfer", Device::cuda(0), c, false);
}

TEST(MlaPrefixCache, UnsupportedBackendsAndLayersSayWhy) {
  Result<harness::PreparedCase> pc =
      harness::prepare_case(prefix_case("errors", 1, {50, 3}, {4, 4}, 16), Device::cuda(0));
  ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
  harness::LayerData& ld = pc->layers[0];
  // triton's MLA row says no: an error, never a silent prefix-less result.
  Result<std::unique_ptr<AttentionBackend>> triton = create_triton_backend(pc->context());
  ASSERT_TRUE(triton.is_ok()) << triton.status().to_string();
  ASSERT_TRUE((*triton)->init_forward_metadata(pc->batch).is_ok());
  Status s = (*triton)->forward(ld.q, ld.k, ld.v, ld.out, ld.layer, pc->batch, false, ld.lse);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.to_string();
  EXPECT_NE(s.message().find("mla_prefix"), std::string::npos) << s.to_string();
  // A sliding window is not part of the chunked path.
  Result<std::unique_ptr<AttentionBackend>> fi =
      harness::create_backend_for_case(*builtin_registry().find("flashinfer"), *pc);
  ASSERT_TRUE(fi.is_ok()) << fi.status().to_string();
  ASSERT_TRUE((*fi)->init_forward_metadata(pc->batch).is_ok());
  AttentionLayer windowed = ld.layer;
  windowed.sliding_window = 8;
  s = (*fi)->forward(ld.q, ld.k, ld.v, ld.out, windowed, pc->batch, false, ld.lse);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.to_string();
  EXPECT_NE(s.message().find("sliding window"), std::string::npos) << s.to_string();
  // chunk_tokens 0 names the field.
  MlaPrefixDecompressor bad = *ld.layer.mla_prefix;
  bad.chunk_tokens = 0;
  AttentionLayer bad_layer = ld.layer;
  bad_layer.mla_prefix = &bad;
  s = (*fi)->forward(ld.q, ld.k, ld.v, ld.out, bad_layer, pc->batch, false, ld.lse);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("chunk_tokens 0"), std::string::npos) << s.to_string();
  // init_forward_metadata planned the chunks for BackendContext::mla_prefix_chunk_tokens (16): a
  // layer with another budget is refused, naming both.
  MlaPrefixDecompressor other = *ld.layer.mla_prefix;
  other.chunk_tokens = 17;
  AttentionLayer other_layer = ld.layer;
  other_layer.mla_prefix = &other;
  s = (*fi)->forward(ld.q, ld.k, ld.v, ld.out, other_layer, pc->batch, false, ld.lse);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("chunk_tokens 17 but BackendContext.mla_prefix_chunk_tokens is 16"),
            std::string::npos)
      << s.to_string();
  // A context without the budget plans no prefix chunks and says what to set.
  BackendContext no_budget = pc->context();
  no_budget.mla_prefix_chunk_tokens = 0;
  Result<std::unique_ptr<AttentionBackend>> fi0 =
      builtin_registry().find("flashinfer")->create(no_budget);
  ASSERT_TRUE(fi0.is_ok()) << fi0.status().to_string();
  ASSERT_TRUE((*fi0)->init_forward_metadata(pc->batch).is_ok());
  s = (*fi0)->forward(ld.q, ld.k, ld.v, ld.out, ld.layer, pc->batch, false, ld.lse);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("BackendContext.mla_prefix_chunk_tokens is 0"), std::string::npos)
      << s.to_string();
}

// The CUDA form of the case table's prefix expander writes the host form's bits (the reference
// replays the host form), also at shapes the MLA cases never reach: rank 1 and 3 (the division
// instead of the mask), no rope columns, k / v rows that do not divide the CTA's 256 threads, the
// widest row staged in shared memory (12288 values) and a wider one read from global memory.
// Outputs poisoned first.
TEST(MlaPrefixExpander, CudaWritesTheHostFormsBits) {
  struct Shape {
    int r, rope, dqk, dv, heads, tokens;
  };
  const Shape shapes[] = {{512, 64, 192, 128, 3, 5}, {1, 0, 3, 1, 1, 2},
                          {3, 1, 5, 7, 2, 3},        {100, 3, 257, 300, 3, 2},
                          {12288, 0, 40, 33, 1, 2},  {12300, 16, 80, 24, 2, 2}};
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> value(-2.f, 2.f);
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (const Shape& sh : shapes) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " r " + std::to_string(sh.r) + " rope " +
                   std::to_string(sh.rope) + " dqk " + std::to_string(sh.dqk) + " dv " +
                   std::to_string(sh.dv) + " heads " + std::to_string(sh.heads));
      const int64_t w = sh.r + sh.rope;
      const int64_t n_lat = sh.tokens * w;
      const int64_t n_k = int64_t{sh.tokens} * sh.heads * sh.dqk;
      const int64_t n_v = int64_t{sh.tokens} * sh.heads * sh.dv;
      std::vector<uint16_t> lat(static_cast<size_t>(n_lat));
      for (int64_t i = 0; i < n_lat; ++i) store_from_float(lat.data(), dt, i, value(rng));
      std::vector<uint16_t> want_k(static_cast<size_t>(n_k)), want_v(static_cast<size_t>(n_v));
      STATUS_OK(harness::expand_mla_prefix_for_tests(
          TensorView(lat.data(), dt, Device::cpu(), {sh.tokens, w}),
          TensorView(want_k.data(), dt, Device::cpu(), {sh.tokens, sh.heads, sh.dqk}),
          TensorView(want_v.data(), dt, Device::cpu(), {sh.tokens, sh.heads, sh.dv}), sh.r,
          nullptr));
      void* d_lat = nullptr;
      void* d_k = nullptr;
      void* d_v = nullptr;
      CUDA_OK(cudaMalloc(&d_lat, static_cast<size_t>(n_lat) * 2));
      CUDA_OK(cudaMalloc(&d_k, static_cast<size_t>(n_k) * 2));
      CUDA_OK(cudaMalloc(&d_v, static_cast<size_t>(n_v) * 2));
      CUDA_OK(
          cudaMemcpy(d_lat, lat.data(), static_cast<size_t>(n_lat) * 2, cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemset(d_k, 0xff, static_cast<size_t>(n_k) * 2));  // NaN in bf16 and f16
      CUDA_OK(cudaMemset(d_v, 0xff, static_cast<size_t>(n_v) * 2));
      const Status s = harness::expand_mla_prefix_for_tests(
          TensorView(d_lat, dt, Device::cuda(0), {sh.tokens, w}),
          TensorView(d_k, dt, Device::cuda(0), {sh.tokens, sh.heads, sh.dqk}),
          TensorView(d_v, dt, Device::cuda(0), {sh.tokens, sh.heads, sh.dv}), sh.r, nullptr);
      std::vector<uint16_t> got_k(static_cast<size_t>(n_k)), got_v(static_cast<size_t>(n_v));
      const cudaError_t sync = cudaDeviceSynchronize();
      const cudaError_t copy_k =
          cudaMemcpy(got_k.data(), d_k, static_cast<size_t>(n_k) * 2, cudaMemcpyDeviceToHost);
      const cudaError_t copy_v =
          cudaMemcpy(got_v.data(), d_v, static_cast<size_t>(n_v) * 2, cudaMemcpyDeviceToHost);
      cudaFree(d_lat);
      cudaFree(d_k);
      cudaFree(d_v);
      ASSERT_TRUE(s.is_ok()) << s.to_string();
      CUDA_OK(sync);
      CUDA_OK(copy_k);
      CUDA_OK(copy_v);
      EXPECT_EQ(std::memcmp(got_k.data(), want_k.data(), got_k.size() * 2), 0);
      EXPECT_EQ(std::memcmp(got_v.data(), want_v.data(), got_v.size() * 2), 0);
    }
  }
}

}  // namespace
}  // namespace attnkit
