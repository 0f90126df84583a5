// MHAKVPool::wrap / MLAKVPool::wrap (pools over caller-owned memory) and Buffer::borrow: the pool
// reads and writes the caller's buffers, never frees them, and rejects views that do not match
// the config with messages naming the layer and the view.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attnkit/kv_cache.h"

namespace attnkit {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr int kLayers = 2;
constexpr int kPage = 4;
constexpr int kSize = 4 * kPage;
constexpr int kRows = kSize + kPage;
constexpr int kHeads = 2;
constexpr int kDim = 32;
constexpr int kVDim = 16;

KVPoolConfig config(DType dtype) {
  KVPoolConfig c;
  c.num_layers = kLayers;
  c.size = kSize;
  c.page_size = kPage;
  c.dtype = dtype;
  c.device = Device::cpu();
  c.num_kv_heads = kHeads;
  c.head_dim = kDim;
  c.v_head_dim = kVDim;
  return c;
}

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.5f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng) + 0.25f;
  return v;
}

// Caller-owned per-layer f32 storage, NaN-poisoned.
struct CallerBuffers {
  std::vector<std::vector<float>> k, v;
  std::vector<TensorView> k_views, v_views;
  CallerBuffers() {
    for (int l = 0; l < kLayers; ++l) {
      k.emplace_back(static_cast<size_t>(kRows) * kHeads * kDim, kNaN);
      v.emplace_back(static_cast<size_t>(kRows) * kHeads * kVDim, kNaN);
    }
    for (int l = 0; l < kLayers; ++l) {
      k_views.emplace_back(k[l].data(), DType::kF32, Device::cpu(),
                           std::initializer_list<int64_t>{kRows, kHeads, kDim});
      v_views.emplace_back(v[l].data(), DType::kF32, Device::cpu(),
                           std::initializer_list<int64_t>{kRows, kHeads, kVDim});
    }
  }
};

TEST(BufferBorrow, ViewsCallerMemoryAndFreesNothing) {
  std::vector<float> storage(8, 1.5f);
  Buffer moved;
  {
    Buffer b = Buffer::borrow(storage.data(), 8 * sizeof(float), Device::cpu());
    EXPECT_FALSE(b.owns_memory());
    EXPECT_EQ(b.data(), storage.data());
    EXPECT_EQ(b.view(DType::kF32, {2, 4}).data, storage.data());
    EXPECT_EQ(b.view(DType::kF32, {3, 4}).data, nullptr);  // more than the borrowed bytes
    moved = std::move(b);
  }
  EXPECT_FALSE(moved.owns_memory());
  EXPECT_EQ(moved.data(), storage.data());
  moved = Buffer();  // releasing a borrowed buffer leaves the memory alone
  EXPECT_TRUE(moved.owns_memory());
  storage[7] = 2.5f;
  EXPECT_EQ(storage[7], 2.5f);
}

TEST(MHAKVPoolWrap, SetKvWritesIntoCallerBuffers) {
  CallerBuffers caller;
  auto pool = MHAKVPool::wrap(config(DType::kF32), caller.k_views, caller.v_views);
  ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
  MHAKVPool& p = **pool;
  EXPECT_EQ(p.k_buffer(1).data, caller.k[1].data());
  EXPECT_EQ(p.v_buffer(0).data, caller.v[0].data());
  EXPECT_FALSE(p.k_scale_buffer(0).defined());

  const std::vector<int64_t> slots = {kPage + 1, 3 * kPage + 2, kRows - 1};
  const int64_t t = static_cast<int64_t>(slots.size());
  std::vector<float> k = random_values(static_cast<size_t>(t * kHeads * kDim), 1);
  std::vector<float> v = random_values(static_cast<size_t>(t * kHeads * kVDim), 2);
  const TensorView loc(const_cast<int64_t*>(slots.data()), DType::kI64, Device::cpu(), {t});
  const TensorView kt(k.data(), DType::kF32, Device::cpu(), {t, kHeads, kDim});
  const TensorView vt(v.data(), DType::kF32, Device::cpu(), {t, kHeads, kVDim});
  ASSERT_TRUE(p.set_kv(1, loc, kt, vt, 1.0f, 1.0f, nullptr).is_ok());

  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = 0; j < kHeads * kDim; ++j) {
      EXPECT_EQ(caller.k[1][slots[i] * kHeads * kDim + j], k[i * kHeads * kDim + j]);
    }
    for (int64_t j = 0; j < kHeads * kVDim; ++j) {
      EXPECT_EQ(caller.v[1][slots[i] * kHeads * kVDim + j], v[i * kHeads * kVDim + j]);
    }
  }
  // Rows that were not written stay poisoned; layer 0 is untouched.
  EXPECT_TRUE(std::isnan(caller.k[1][kPage * kHeads * kDim]));
  for (float x : caller.k[0]) ASSERT_TRUE(std::isnan(x));
  pool = Status::internal("drop the pool");  // destroying the pool must not free caller memory
  caller.k[1][0] = 3.0f;
  EXPECT_EQ(caller.k[1][0], 3.0f);
}

TEST(MHAKVPoolWrap, RejectsViewsThatDoNotMatchTheConfig) {
  CallerBuffers caller;
  const KVPoolConfig c = config(DType::kF32);

  std::vector<TensorView> one_layer = {caller.k_views[0]};
  Status s = MHAKVPool::wrap(c, one_layer, caller.v_views).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("k: got 1 per-layer views, expected num_layers 2"), std::string::npos)
      << s.message();

  std::vector<TensorView> bad_shape = caller.k_views;
  bad_shape[1].shape[2] = kDim / 2;
  s = MHAKVPool::wrap(c, bad_shape, caller.v_views).status();
  EXPECT_NE(s.message().find("k[1]: expected shape [20, 2, 32]"), std::string::npos) << s.message();

  std::vector<TensorView> bad_dtype = caller.v_views;
  bad_dtype[0].dtype = DType::kF16;
  s = MHAKVPool::wrap(c, caller.k_views, bad_dtype).status();
  EXPECT_NE(s.message().find("v[0]: dtype f16 must be the pool dtype f32"), std::string::npos)
      << s.message();

  std::vector<TensorView> strided = caller.k_views;
  strided[0].strides[0] = 2 * kHeads * kDim;
  s = MHAKVPool::wrap(c, strided, caller.v_views).status();
  EXPECT_NE(s.message().find("k[0]: must be contiguous"), std::string::npos) << s.message();

  std::vector<TensorView> on_gpu = caller.k_views;
  on_gpu[1].device = Device::cuda(0);
  s = MHAKVPool::wrap(c, on_gpu, caller.v_views).status();
  EXPECT_NE(s.message().find("k[1]: on cuda:0, the pool is on cpu"), std::string::npos)
      << s.message();

  KVPoolConfig bad_size = c;
  bad_size.size = kSize + 1;
  s = MHAKVPool::wrap(bad_size, caller.k_views, caller.v_views).status();
  EXPECT_NE(s.message().find("KVPoolConfig.size 17"), std::string::npos) << s.message();

  s = MHAKVPool::wrap(c, caller.k_views, caller.v_views, caller.k_views, caller.v_views).status();
  EXPECT_NE(s.message().find("only used by fp4_e2m1 pools"), std::string::npos) << s.message();

  KVPoolConfig fp4 = c;
  fp4.dtype = DType::kFP4E2M1;
  s = MHAKVPool::wrap(fp4, caller.k_views, caller.v_views).status();
  EXPECT_NE(s.message().find("k_scales: got 0 per-layer views"), std::string::npos) << s.message();

  // One buffer for K and V (set_kv wrote V over K), or for two layers: refused by name.
  std::vector<TensorView> v_on_k = caller.v_views;
  for (size_t l = 0; l < v_on_k.size(); ++l) v_on_k[l].data = caller.k_views[l].data;
  s = MHAKVPool::wrap(c, caller.k_views, v_on_k).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("k[0] and v[0] share memory"), std::string::npos) << s.message();
  std::vector<TensorView> same_layers = caller.v_views;
  same_layers[1] = same_layers[0];
  s = MHAKVPool::wrap(c, caller.k_views, same_layers).status();
  EXPECT_NE(s.message().find("v[0] and v[1] share memory"), std::string::npos) << s.message();
}

// A CUDA pool's buffers must start 16-byte aligned: the kernels load KV rows in 16-byte vectors,
// and a misaligned wrap (a stacked array of odd-sized layers) reached them as a misaligned-address
// fault. Checked before any device work, so no GPU is needed: the addresses are never read.
TEST(MHAKVPoolWrap, CudaBuffersMustBe16ByteAligned) {
  CallerBuffers caller;
  KVPoolConfig c = config(DType::kF32);
  c.device = Device::cuda(0);
  std::vector<TensorView> k = caller.k_views, v = caller.v_views;
  for (TensorView* t : {&k[0], &k[1], &v[0], &v[1]}) t->device = Device::cuda(0);
  ASSERT_EQ(reinterpret_cast<uintptr_t>(k[1].data) % 16, 0u);  // std::vector<float>: 16-aligned
  k[1].data = static_cast<char*>(k[1].data) + sizeof(float);
  const Status s = MHAKVPool::wrap(c, k, v).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("k[1]: data address"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("is not 16-byte aligned"), std::string::npos) << s.message();
  // A CPU pool takes any address its dtype allows (the CPU kernels load unaligned).
  std::vector<float> shifted(static_cast<size_t>(kRows) * kHeads * kDim + 1, 0.f);
  std::vector<TensorView> cpu_k = caller.k_views;
  cpu_k[1].data = shifted.data() + 1;
  EXPECT_TRUE(MHAKVPool::wrap(config(DType::kF32), cpu_k, caller.v_views).is_ok());
}

TEST(MLAKVPoolWrap, LatentRowsAndVViewAliasCallerMemory) {
  constexpr int kRank = 32;
  constexpr int kRope = 16;
  KVPoolConfig c;
  c.num_layers = 1;
  c.size = kSize;
  c.page_size = kPage;
  c.dtype = DType::kF32;
  c.kv_lora_rank = kRank;
  c.qk_rope_head_dim = kRope;
  std::vector<float> storage(static_cast<size_t>(kRows) * (kRank + kRope), kNaN);
  const std::vector<TensorView> views = {
      TensorView(storage.data(), DType::kF32, Device::cpu(), {kRows, 1, kRank + kRope})};
  auto pool = MLAKVPool::wrap(c, views);
  ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
  EXPECT_EQ((*pool)->kv_buffer(0).data, storage.data());
  EXPECT_EQ((*pool)->v_view(0).data, storage.data());
  EXPECT_EQ((*pool)->v_view(0).shape[2], kRank);

  const int64_t slot = 2 * kPage + 3;
  std::vector<float> k = random_values(kRank + kRope, 3);
  const TensorView loc(const_cast<int64_t*>(&slot), DType::kI64, Device::cpu(), {1});
  const TensorView kt(k.data(), DType::kF32, Device::cpu(), {1, 1, kRank + kRope});
  ASSERT_TRUE((*pool)->set_kv(0, loc, kt, TensorView(), 1.0f, 1.0f, nullptr).is_ok());
  for (int j = 0; j < kRank + kRope; ++j) {
    EXPECT_EQ(storage[static_cast<size_t>(slot * (kRank + kRope) + j)], k[j]);
  }

  const std::vector<TensorView> wrong = {
      TensorView(storage.data(), DType::kF32, Device::cpu(), {kRows, 1, kRank})};
  const Status s = MLAKVPool::wrap(c, wrong).status();
  EXPECT_NE(s.message().find("kv[0]: expected shape [20, 1, 48]"), std::string::npos)
      << s.message();
}

}  // namespace
}  // namespace attnkit
