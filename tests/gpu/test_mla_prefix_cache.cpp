// The MLA chunked prefix cache (AttentionLayer::mla_prefix, src/backends/mla/mla_prefix_cache.h)
// on the CUDA device against the fp64 reference: every chunk size from one token per chunk
// (hundreds of chunks, odd and even counts through the three-slot merge ring) to one chunk, each
// backend whose MLA row claims it, fp8 latent rows, f16 activations; and the clear errors of the
// backends, layers and contexts that cannot run it. The shared case table adds mla_prefill_prefix_*
// cases.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "attnkit/registry.h"
#include "backends/triton/triton_backend.h"
#include "harness/case_runner.h"
#include "support/backend_case_test.h"

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

}  // namespace
}  // namespace attnkit
