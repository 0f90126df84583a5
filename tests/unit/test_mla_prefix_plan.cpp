// Host logic of the MLA chunked prefix cache runner (src/backends/mla/mla_prefix_cache.h): the
// chunk layout covers every prefix position exactly once, filling every chunk but the last to the
// budget, and the three-slot merge ring always merges the running partial with the newest chunk,
// never writes a slot it reads, and ends with every part merged into the output. CUDA builds: the
// runner accepts every latent KV dtype that a descriptor claiming the chunked prefix cache claims,
// and plans only the forwards that can carry it.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "attnkit/kv_cache.h"
#include "attnkit/registry.h"
#include "backends/mla/mla_prefix_cache.h"

namespace attnkit::mla {
namespace {

void expect_covers(const std::vector<int32_t>& prefix, int chunk_tokens, int want_chunks) {
  SCOPED_TRACE(chunk_tokens);
  const PrefixChunkLayout l = plan_prefix_chunks(prefix, chunk_tokens);
  const int bs = static_cast<int>(prefix.size());
  EXPECT_EQ(l.chunks, want_chunks);
  EXPECT_EQ(l.capacity, std::max(1, chunk_tokens));
  ASSERT_EQ(l.indptr.size(), static_cast<size_t>(l.chunks) * (bs + 1));
  ASSERT_EQ(l.starts.size(), static_cast<size_t>(l.chunks) * bs);
  ASSERT_EQ(l.tokens.size(), static_cast<size_t>(l.chunks));
  std::vector<std::vector<int>> seen(static_cast<size_t>(bs));
  for (int c = 0; c < l.chunks; ++c) {
    const int32_t* ip = &l.indptr[static_cast<size_t>(c) * (bs + 1)];
    const int32_t* start = &l.starts[static_cast<size_t>(c) * bs];
    EXPECT_EQ(ip[0], 0);
    EXPECT_EQ(ip[bs], l.tokens[static_cast<size_t>(c)]);
    EXPECT_GT(l.tokens[static_cast<size_t>(c)], 0) << "empty chunk " << c;
    // Every chunk but the last is full.
    if (c + 1 < l.chunks) {
      EXPECT_EQ(l.tokens[static_cast<size_t>(c)], l.capacity) << "chunk " << c;
    } else {
      EXPECT_LE(l.tokens[static_cast<size_t>(c)], l.capacity);
    }
    for (int r = 0; r < bs; ++r) {
      ASSERT_LE(ip[r], ip[r + 1]);
      for (int j = 0; j < ip[r + 1] - ip[r]; ++j) {
        seen[static_cast<size_t>(r)].push_back(start[r] + j);  // the gather's position
      }
    }
  }
  for (int r = 0; r < bs; ++r) {
    std::vector<int> want(static_cast<size_t>(prefix[static_cast<size_t>(r)]));
    for (size_t i = 0; i < want.size(); ++i) want[i] = static_cast<int>(i);
    EXPECT_EQ(seen[static_cast<size_t>(r)], want) << "request " << r;
  }
}

// Chunks = ceil(total prefix / budget): a request whose prefix has ended leaves its share to the
// others.
TEST(MlaPrefixPlan, ChunksCoverEveryPrefixPositionOnce) {
  expect_covers({700, 0, 1500, 63}, 256, 9);  // the case table's page-1 case: 2263 tokens
  expect_covers({1000, 130}, 300, 4);
  expect_covers({900, 257, 0}, 4096, 1);
  expect_covers({130, 0, 77}, 1, 207);  // one token per chunk
  expect_covers({130, 0, 77}, 7, 30);
  expect_covers({0, 0}, 64, 0);  // no prefix: the new-token pass only
  // The bench's uneven case: 16k + 7 x 1k in chunks of 8k (SGLang's equal shares: 16 chunks).
  expect_covers({16384, 1024, 1024, 1024, 1024, 1024, 1024, 1024}, 8192, 3);
}

// The shares: the requests with less left take all of it, the rest split what is left equally
// (the remainder of the division to the requests with most left).
TEST(MlaPrefixPlan, SharesFillTheChunkFromTheShortestRemainder) {
  const PrefixChunkLayout l = plan_prefix_chunks({100, 10, 0, 40}, 64);
  ASSERT_EQ(l.chunks, 3);
  // Chunk 0: shares of 64 / 3 = 21: request 1 takes its 10, then 54 / 2 = 27 each.
  EXPECT_EQ(l.indptr[0 * 5 + 1] - l.indptr[0 * 5 + 0], 27);
  EXPECT_EQ(l.indptr[0 * 5 + 2] - l.indptr[0 * 5 + 1], 10);
  EXPECT_EQ(l.indptr[0 * 5 + 3] - l.indptr[0 * 5 + 2], 0);
  EXPECT_EQ(l.indptr[0 * 5 + 4] - l.indptr[0 * 5 + 3], 27);
  // Chunk 1: request 3 takes its 13 (under 64 / 2), request 0 the other 51 from position 27.
  EXPECT_EQ(l.indptr[1 * 5 + 1] - l.indptr[1 * 5 + 0], 51);
  EXPECT_EQ(l.starts[1 * 4 + 0], 27);
  EXPECT_EQ(l.indptr[1 * 5 + 4] - l.indptr[1 * 5 + 3], 13);
  EXPECT_EQ(l.starts[1 * 4 + 3], 27);
  // Chunk 2: request 0's last 22 tokens, from position 78.
  EXPECT_EQ(l.tokens[2], 22);
  EXPECT_EQ(l.starts[2 * 4 + 0], 78);
}

TEST(MlaPrefixPlan, MergeRingMergesEveryPartOnce) {
  for (int chunks = 1; chunks <= 7; ++chunks) {
    SCOPED_TRACE(chunks);
    std::vector<std::set<int>> slot(3);
    slot[0] = {-1};  // the new tokens' partial
    int acc = 0;
    std::set<int> final_parts;
    for (int c = 0; c < chunks; ++c) {
      ASSERT_NE(acc, 1) << "the running partial must never sit in the chunk slot";
      slot[1] = {c};
      const MergeStep m = merge_step(acc, c + 1 == chunks);
      const std::set<int> read = {m.first, m.first + 1};
      ASSERT_EQ(read, (std::set<int>{acc, 1}));
      std::set<int> merged = slot[static_cast<size_t>(m.first)];
      merged.insert(slot[static_cast<size_t>(m.first + 1)].begin(),
                    slot[static_cast<size_t>(m.first + 1)].end());
      if (c + 1 == chunks) {
        ASSERT_EQ(m.dst, -1);
        final_parts = merged;
      } else {
        ASSERT_GE(m.dst, 0);
        ASSERT_EQ(read.count(m.dst), 0u) << "a merge never writes a slot it reads";
        slot[static_cast<size_t>(m.dst)] = merged;
        acc = m.dst;
      }
    }
    std::set<int> want = {-1};
    for (int c = 0; c < chunks; ++c) want.insert(c);
    EXPECT_EQ(final_parts, want);
  }
}

#ifdef ATTNKIT_WITH_CUDA
// The dtypes a descriptor's MLA row claims for the latent cache (bf16 always).
bool row_claims(const FeatureRow& row, DType kv) {
  switch (kv) {
    case DType::kBF16:
      return true;
    case DType::kFP8E4M3:
      return row.fp8_kv;
    case DType::kFP8E5M2:
      return row.fp8_kv && !row.fp8_e4m3_only;
    case DType::kFP4E2M1:
      return row.fp4_kv;
    default:
      return false;
  }
}

// Descriptor honesty: every built backend whose MLA row claims the chunked prefix cache runs it on
// MlaPrefixCacheRunner, so the runner must take every latent dtype such a row claims (fp4 with
// flashinfer / flashmla / cutlass_mla, fp8_e4m3 with flashmla / cutlass_mla); the case table's
// mla_prefill_prefix_chunks_page64_{fp8,fp4} run them on the GPU. A dtype no row can claim (f32)
// is refused, naming it.
TEST(MlaPrefixPlan, RunnerTakesEveryLatentDtypeTheDescriptorsClaim) {
  AttentionLayer layer;
  layer.is_mla = true;
  layer.num_q_heads = layer.num_kv_heads = 8;
  layer.qk_head_dim = 192;
  layer.v_head_dim = 128;
  layer.kv_lora_rank = 512;
  layer.qk_rope_head_dim = 64;
  layer.scaling = 0.1f;
  const TensorView q(nullptr, DType::kBF16, Device::cpu(), {1, 8, 192});  // only its dtype is read
  int rows_checked = 0;
  for (DType kv : {DType::kBF16, DType::kFP8E4M3, DType::kFP8E5M2, DType::kFP4E2M1, DType::kF32}) {
    SCOPED_TRACE(dtype_name(kv));
    KVPoolConfig cfg;
    cfg.num_layers = 1;
    cfg.size = 16;
    cfg.dtype = kv;
    cfg.device = Device::cpu();
    cfg.kv_lora_rank = layer.kv_lora_rank;
    cfg.qk_rope_head_dim = layer.qk_rope_head_dim;
    Result<std::unique_ptr<MLAKVPool>> pool = MLAKVPool::create(cfg);
    ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
    ForwardBatch batch;
    batch.kv_pool = pool->get();
    const std::string why = MlaPrefixCacheRunner::why_not(q, layer, batch);
    bool claimed = false;
    for (const BackendDescriptor& d : builtin_registry().all()) {
      if (!d.built || !d.mla || !d.mla->chunked_prefix_cache) continue;
      ++rows_checked;
      if (row_claims(*d.mla, kv)) {
        claimed = true;
        EXPECT_EQ(why, "") << d.name << " claims the chunked prefix cache and " << dtype_name(kv)
                           << " KV";
      }
    }
    if (kv == DType::kF32) {
      EXPECT_FALSE(claimed);
      EXPECT_NE(why.find("latent pool dtype f32"), std::string::npos) << why;
    }
  }
  EXPECT_GE(rows_checked, 5 * 4) << "flashinfer, fa3, flashmla, cutlass_mla";
}

TEST(MlaPrefixPlan, PlansOnlyForwardsThatCanCarryThePrefix) {
  BackendContext ctx;
  ctx.is_mla = true;
  ctx.mla_prefix_chunk_tokens = 256;
  ForwardBatch b;
  b.mode = ForwardMode::kExtend;
  b.batch_size = 2;
  b.extend_prefix_lens_host = {10, 0};
  b.extend_seq_lens_host = {3, 4};
  EXPECT_TRUE(MlaPrefixCacheRunner::takes(ctx, b));
  b.mode = ForwardMode::kMixed;
  EXPECT_TRUE(MlaPrefixCacheRunner::takes(ctx, b));
  b.mode = ForwardMode::kDraftExtend;
  EXPECT_TRUE(MlaPrefixCacheRunner::takes(ctx, b));
  for (ForwardMode m : {ForwardMode::kDecode, ForwardMode::kTargetVerify, ForwardMode::kIdle}) {
    b.mode = m;
    EXPECT_FALSE(MlaPrefixCacheRunner::takes(ctx, b)) << forward_mode_name(m);
  }
  b.mode = ForwardMode::kExtend;
  b.encoder_lens_host = {3, 3};
  EXPECT_FALSE(MlaPrefixCacheRunner::takes(ctx, b));
  b.encoder_lens_host.clear();
  ctx.mla_prefix_chunk_tokens = 0;  // no layer carries mla_prefix
  EXPECT_FALSE(MlaPrefixCacheRunner::takes(ctx, b));
  ctx.mla_prefix_chunk_tokens = 256;
  ctx.is_mla = false;
  EXPECT_FALSE(MlaPrefixCacheRunner::takes(ctx, b));
}
#endif  // ATTNKIT_WITH_CUDA

}  // namespace
}  // namespace attnkit::mla
