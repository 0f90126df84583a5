// MHAKVPool / MLAKVPool: config validation, set_kv round trips for every KV dtype (fp8 scale
// folding, fp4 block scales), MLA V aliasing, and input errors with no partial writes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "attnkit/kv_cache.h"
#include "kv/set_kv_cuda.h"

namespace attnkit {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr uint8_t kE4M3NaNCode = 0x7F;
constexpr uint8_t kFp4PoisonByte = 0xFF;  // two -6 codes; with a NaN block scale reads as NaN

KVPoolConfig mha_config(DType dtype, int page_size = 16) {
  KVPoolConfig c;
  c.num_layers = 2;
  c.page_size = page_size;
  c.size = 6 * page_size;
  c.dtype = dtype;
  c.device = Device::cpu();
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.v_head_dim = 32;
  return c;
}

KVPoolConfig mla_config(DType dtype) {
  KVPoolConfig c;
  c.num_layers = 2;
  c.page_size = 16;
  c.size = 64;
  c.dtype = dtype;
  c.device = Device::cpu();
  c.kv_lora_rank = 32;
  c.qk_rope_head_dim = 16;
  return c;
}

std::vector<float> random_values(size_t n, uint32_t seed, float stddev = 2.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) {
    x = dist(rng);
    if (x == 0.0f) x = 0.5f;  // never exact zeros
  }
  return v;
}

// Distinct usable slots (>= page_size), shuffled, spread over several pages.
std::vector<int64_t> random_slots(int64_t count, int64_t page_size, int64_t rows, uint32_t seed) {
  std::vector<int64_t> all(static_cast<size_t>(rows - page_size));
  std::iota(all.begin(), all.end(), page_size);
  std::shuffle(all.begin(), all.end(), std::mt19937(seed));
  all.resize(static_cast<size_t>(count));
  return all;
}

// Poisons a pool buffer so that every unwritten element reads as NaN.
void poison(const TensorView& buffer, const TensorView& scales) {
  const int64_t n = buffer.numel();
  if (buffer.dtype == DType::kFP4E2M1) {
    std::memset(buffer.data, kFp4PoisonByte, static_cast<size_t>(n / 2));
    std::memset(scales.data, kE4M3NaNCode, static_cast<size_t>(scales.numel()));
    return;
  }
  for (int64_t i = 0; i < n; ++i) store_from_float(buffer.data, buffer.dtype, i, kNaN);
}

std::vector<uint8_t> snapshot(const TensorView& t) {
  const auto* p = static_cast<const uint8_t*>(t.data);
  return std::vector<uint8_t>(p, p + dtype_storage_bytes(t.dtype, t.numel()));
}

// Max |dequant - x| allowed for one value x stored with layer scale `scale` (fp8 only).
double tolerance(DType dtype, double x, double scale) {
  const double ax = std::fabs(x);
  switch (dtype) {
    case DType::kF32:
      return 0.0;
    case DType::kBF16:  // 8 significant bits: half an ulp is at most 2^-8 relative
      return ax * std::ldexp(1.0, -8);
    case DType::kF16:  // 11 significant bits; subnormal spacing 2^-24
      return ax * std::ldexp(1.0, -11) + std::ldexp(1.0, -25);
    case DType::kFP8E4M3:  // 4 significant bits; subnormal spacing 2^-9 (in units of x / scale)
      return ax * std::ldexp(1.0, -4) + std::ldexp(1.0, -10) * scale;
    case DType::kFP8E5M2:  // 3 significant bits; subnormal spacing 2^-16
      return ax * std::ldexp(1.0, -3) + std::ldexp(1.0, -17) * scale;
    default:
      return std::numeric_limits<double>::infinity();
  }
}

// Independent reference for the fp4 block scale: scan every positive e4m3 code for the smallest
// value >= (amax / 6) / layer_scale.
uint8_t reference_block_code(float amax, float layer_scale) {
  if (amax == 0.0f) return 0;
  const float exact = (amax / 6.0f) / layer_scale;
  for (int code = 0; code <= 0x7E; ++code) {
    if (fp8_e4m3_to_float(static_cast<uint8_t>(code)) >= exact) return static_cast<uint8_t>(code);
  }
  return 0x7E;
}

// Distance from y to the nearest e2m1 value.
double nearest_e2m1_distance(double y) {
  double best = std::numeric_limits<double>::infinity();
  for (uint8_t code = 0; code < 16; ++code) {
    best = std::min(best, std::fabs(y - fp4_e2m1_to_float(code)));
  }
  return best;
}

// Checks buffer rows `slots` against src values [T, H, D] (row-major floats).
void expect_round_trip(const TensorView& buffer, const TensorView& scales, float layer_scale,
                       const std::vector<int64_t>& slots, const std::vector<float>& src,
                       const char* what) {
  const int64_t heads = buffer.size(1);
  const int64_t dim = buffer.size(2);
  for (size_t t = 0; t < slots.size(); ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* row = src.data() + (static_cast<int64_t>(t) * heads + h) * dim;
      if (buffer.dtype == DType::kFP4E2M1) {
        for (int64_t g = 0; g < dim / kFp4GroupSize; ++g) {
          float amax = 0.0f;
          for (int i = 0; i < kFp4GroupSize; ++i) {
            amax = std::max(amax, std::fabs(row[g * kFp4GroupSize + i]));
          }
          const int64_t scale_index =
              slots[t] * scales.stride(0) + h * scales.stride(1) + g * scales.stride(2);
          const uint8_t code = static_cast<const uint8_t*>(scales.data)[scale_index];
          ASSERT_EQ(code, reference_block_code(amax, layer_scale))
              << what << " block scale t " << t << " h " << h << " group " << g;
          const double block = fp8_e4m3_to_float(code);
          for (int i = 0; i < kFp4GroupSize; ++i) {
            const int64_t d = g * kFp4GroupSize + i;
            if (amax == 0.0f) {  // all-zero group: scale 0, values 0
              ASSERT_EQ(load_kv_value_host(buffer, scales, slots[t], h, d, layer_scale), 0.0f);
              continue;
            }
            const double y = row[d] / (block * layer_scale);
            ASSERT_LE(std::fabs(y), 6.0 * (1 + 1e-6)) << what << ": code would saturate";
            const double got = load_kv_value_host(buffer, scales, slots[t], h, d, layer_scale);
            const double got_code = got / (block * layer_scale);
            ASSERT_LE(std::fabs(got_code - y), nearest_e2m1_distance(y) + 1e-5 * (1 + std::fabs(y)))
                << what << " t " << t << " h " << h << " d " << d << ": x " << row[d]
                << " dequantised to " << got;
          }
        }
        continue;
      }
      for (int64_t d = 0; d < dim; ++d) {
        const double got = load_kv_value_host(buffer, scales, slots[t], h, d, layer_scale);
        ASSERT_LE(std::fabs(got - row[d]), tolerance(buffer.dtype, row[d], layer_scale))
            << what << " " << dtype_name(buffer.dtype) << " t " << t << " h " << h << " d " << d
            << ": x " << row[d] << " dequantised to " << got;
      }
    }
  }
}

// Every row not in `slots` still reads as NaN (nothing written outside loc).
void expect_untouched(const TensorView& buffer, const TensorView& scales,
                      const std::vector<int64_t>& slots, const char* what) {
  std::vector<bool> written(static_cast<size_t>(buffer.size(0)), false);
  for (int64_t s : slots) written[static_cast<size_t>(s)] = true;
  for (int64_t r = 0; r < buffer.size(0); ++r) {
    if (written[static_cast<size_t>(r)]) continue;
    for (int64_t h = 0; h < buffer.size(1); ++h) {
      // Every element; fp4 rows by their scale groups (a group's NaN poison is its scale byte).
      const int64_t step = buffer.dtype == DType::kFP4E2M1 ? kFp4GroupSize / 2 : 1;
      for (int64_t d = 0; d < buffer.size(2); d += step) {
        ASSERT_TRUE(std::isnan(load_kv_value_host(buffer, scales, r, h, d, 1.0f)))
            << what << " row " << r << " head " << h << " dim " << d << " was overwritten";
      }
    }
  }
}

class PoolDType : public ::testing::TestWithParam<DType> {};

INSTANTIATE_TEST_SUITE_P(KVDTypes, PoolDType,
                         ::testing::Values(DType::kBF16, DType::kF16, DType::kF32, DType::kFP8E4M3,
                                           DType::kFP8E5M2, DType::kFP4E2M1),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST_P(PoolDType, MHASetKVRoundTrip) {
  const DType dtype = GetParam();
  auto created = MHAKVPool::create(mha_config(dtype));
  ASSERT_TRUE(created.is_ok()) << created.status().to_string();
  MHAKVPool& pool = **created;
  const int layer = 1;
  for (int l = 0; l < 2; ++l) {
    poison(pool.k_buffer(l), pool.k_scale_buffer(l));
    poison(pool.v_buffer(l), pool.v_scale_buffer(l));
  }
  EXPECT_EQ(pool.k_buffer(layer).size(0), pool.rows());
  EXPECT_EQ(pool.rows(), 7 * 16);
  EXPECT_EQ(pool.k_scale_buffer(layer).defined(), dtype == DType::kFP4E2M1);

  const int64_t tokens = 37;
  const auto slots = random_slots(tokens, pool.page_size(), pool.rows(), 7);
  const auto k = random_values(static_cast<size_t>(tokens * 2 * 64), 11);
  const auto v = random_values(static_cast<size_t>(tokens * 2 * 32), 12, 0.5f);
  const TensorView loc(const_cast<int64_t*>(slots.data()), DType::kI64, Device::cpu(), {tokens});
  const TensorView kt(const_cast<float*>(k.data()), DType::kF32, Device::cpu(), {tokens, 2, 64});
  const TensorView vt(const_cast<float*>(v.data()), DType::kF32, Device::cpu(), {tokens, 2, 32});
  const bool scaled = dtype_is_fp8(dtype) || dtype == DType::kFP4E2M1;
  const float k_scale = 0.75f, v_scale = 0.125f;
  Status st = pool.set_kv(layer, loc, kt, vt, k_scale, v_scale, nullptr);
  ASSERT_TRUE(st.is_ok()) << st.to_string();

  // bf16/f16/f32 caches store x as is (the scale only applies to quantised caches).
  expect_round_trip(pool.k_buffer(layer), pool.k_scale_buffer(layer), scaled ? k_scale : 1.0f,
                    slots, k, "k");
  expect_round_trip(pool.v_buffer(layer), pool.v_scale_buffer(layer), scaled ? v_scale : 1.0f,
                    slots, v, "v");
  expect_untouched(pool.k_buffer(layer), pool.k_scale_buffer(layer), slots, "k");
  expect_untouched(pool.v_buffer(layer), pool.v_scale_buffer(layer), slots, "v");
  expect_untouched(pool.k_buffer(0), pool.k_scale_buffer(0), {}, "layer 0 k");
}

TEST_P(PoolDType, MLASetKVRoundTripAndVAliasesTheRow) {
  const DType dtype = GetParam();
  auto created = MLAKVPool::create(mla_config(dtype));
  ASSERT_TRUE(created.is_ok()) << created.status().to_string();
  MLAKVPool& pool = **created;
  EXPECT_EQ(pool.row_dim(), 48);
  EXPECT_EQ(pool.config().num_kv_heads, 1);
  const int layer = 0;
  poison(pool.kv_buffer(layer), pool.scale_buffer(layer));

  const TensorView kv = pool.kv_buffer(layer);
  const TensorView vv = pool.v_view(layer);
  EXPECT_EQ(vv.data, kv.data);
  EXPECT_EQ(vv.dtype, dtype);
  EXPECT_EQ(vv.size(0), pool.rows());
  EXPECT_EQ(vv.size(1), 1);
  EXPECT_EQ(vv.size(2), 32);
  EXPECT_EQ(vv.stride(0), 48);
  EXPECT_EQ(vv.stride(2), 1);
  EXPECT_FALSE(vv.is_contiguous());

  const int64_t tokens = 21;
  const auto slots = random_slots(tokens, pool.page_size(), pool.rows(), 5);
  const auto k = random_values(static_cast<size_t>(tokens * 48), 21);
  const TensorView loc(const_cast<int64_t*>(slots.data()), DType::kI64, Device::cpu(), {tokens});
  const TensorView kt(const_cast<float*>(k.data()), DType::kF32, Device::cpu(), {tokens, 1, 48});
  const bool scaled = dtype_is_fp8(dtype) || dtype == DType::kFP4E2M1;
  const float scale = scaled ? 0.5f : 1.0f;
  Status st = pool.set_kv(layer, loc, kt, TensorView(), scale, 1.0f, nullptr);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  expect_round_trip(kv, pool.scale_buffer(layer), scale, slots, k, "kv");
  expect_untouched(kv, pool.scale_buffer(layer), slots, "kv");
  // V through the strided view equals the first kv_lora_rank columns of the row.
  for (size_t t = 0; t < slots.size(); ++t) {
    for (int64_t d = 0; d < 32; ++d) {
      const float via_v = load_kv_value_host(vv, pool.scale_buffer(layer), slots[t], 0, d, scale);
      const float via_kv = load_kv_value_host(kv, pool.scale_buffer(layer), slots[t], 0, d, scale);
      ASSERT_EQ(via_v, via_kv) << "t " << t << " d " << d;
    }
  }
}

// storage_overlapping names the lowest-addressed pool buffer a byte range touches: a range ending
// at a buffer's first byte or starting at its end does not touch it; a range over two buffers names
// the one it starts in.
TEST(KVPool, StorageOverlappingNamesTheFirstBufferTouched) {
  auto pool = MHAKVPool::create(mha_config(DType::kF32)).value();
  const TensorView k1 = pool->k_buffer(1);
  const auto* base = static_cast<const char*>(k1.data);
  const int64_t bytes = k1.storage_bytes();
  // (Another buffer may sit just before or after k[1]; k[1] itself must not be named.)
  EXPECT_NE(pool->storage_overlapping(base - 64, 64), "k[1]");
  EXPECT_NE(pool->storage_overlapping(base + bytes, 64), "k[1]");
  EXPECT_EQ(pool->storage_overlapping(base, 1), "k[1]");
  EXPECT_EQ(pool->storage_overlapping(base + bytes - 1, 1), "k[1]");
  EXPECT_EQ(pool->storage_overlapping(base + 8, bytes), "k[1]");
  EXPECT_EQ(pool->storage_overlapping(pool->v_buffer(0).data, 4), "v[0]");
  EXPECT_EQ(pool->storage_overlapping(base, 0), "");
  EXPECT_EQ(pool->storage_overlapping(nullptr, 64), "");
  const std::vector<float> elsewhere(64);
  EXPECT_EQ(pool->storage_overlapping(elsewhere.data(), 256), "");
}

TEST(KVPool, AcceptsBF16AndStridedSources) {
  auto pool = MHAKVPool::create(mha_config(DType::kF32)).value();
  const int64_t tokens = 5;
  // k is a [T, H, 64] view into a wider [T, H, 128] buffer (e.g. a fused projection output).
  const auto wide = random_values(static_cast<size_t>(tokens * 2 * 128), 31);
  TensorView kt(const_cast<float*>(wide.data()), DType::kF32, Device::cpu(), {tokens, 2, 64});
  kt.strides = {2 * 128, 128, 1};
  // v is bf16.
  const auto vf = random_values(static_cast<size_t>(tokens * 2 * 32), 32);
  std::vector<uint16_t> vb(vf.size());
  for (size_t i = 0; i < vf.size(); ++i) vb[i] = float_to_bf16_bits(vf[i]);
  const TensorView vt(vb.data(), DType::kBF16, Device::cpu(), {tokens, 2, 32});
  const std::vector<int64_t> slots{16, 40, 17, 95, 111};
  const TensorView loc(const_cast<int64_t*>(slots.data()), DType::kI64, Device::cpu(), {tokens});
  ASSERT_TRUE(pool->set_kv(0, loc, kt, vt, 1.0f, 1.0f, nullptr).is_ok());
  const TensorView kb = pool->k_buffer(0);
  const TensorView vbuf = pool->v_buffer(0);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t d = 0; d < 64; ++d) {
        ASSERT_EQ(load_kv_value_host(kb, TensorView(), slots[t], h, d, 1.0f),
                  wide[static_cast<size_t>((t * 2 + h) * 128 + d)]);
      }
      for (int64_t d = 0; d < 32; ++d) {
        ASSERT_EQ(load_kv_value_host(vbuf, TensorView(), slots[t], h, d, 1.0f),
                  bf16_bits_to_float(vb[static_cast<size_t>((t * 2 + h) * 32 + d)]));
      }
    }
  }
}

TEST(KVPool, Fp8StoresXOverScale) {
  auto pool = MHAKVPool::create(mha_config(DType::kFP8E4M3)).value();
  const int64_t tokens = 1;
  std::vector<float> k(2 * 64), v(2 * 32);
  // Exactly representable after division: x = code value * scale.
  const float k_scale = 4.0f, v_scale = 0.25f;
  for (size_t i = 0; i < k.size(); ++i)
    k[i] = (1.0f + 0.125f * static_cast<float>(i % 8)) * k_scale;
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = -(2.0f + 0.25f * static_cast<float>(i % 8)) * v_scale;
  const std::vector<int64_t> slots{33};
  const TensorView loc(const_cast<int64_t*>(slots.data()), DType::kI64, Device::cpu(), {tokens});
  const TensorView kt(k.data(), DType::kF32, Device::cpu(), {tokens, 2, 64});
  const TensorView vt(v.data(), DType::kF32, Device::cpu(), {tokens, 2, 32});
  ASSERT_TRUE(pool->set_kv(0, loc, kt, vt, k_scale, v_scale, nullptr).is_ok());
  const TensorView kb = pool->k_buffer(0);
  const TensorView vb = pool->v_buffer(0);
  for (int64_t i = 0; i < 2 * 64; ++i) {
    EXPECT_EQ(load_as_float(kb.data, kb.dtype, 33 * 2 * 64 + i), k[i] / k_scale) << i;
  }
  for (int64_t i = 0; i < 2 * 32; ++i) {
    EXPECT_EQ(load_as_float(vb.data, vb.dtype, 33 * 2 * 32 + i), v[i] / v_scale) << i;
  }
}

TEST(KVPool, Fp4BlockScaleRoundsUpAndZeroBlocks) {
  // The block scale is never below the exact value, and is the next e4m3 value up.
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> log_amax(-12.0f, 11.0f);
  for (int i = 0; i < 2000; ++i) {
    const float amax = std::exp2(log_amax(rng));
    const float layer_scale = (i % 3 == 0) ? 1.0f : 0.37f;
    const uint8_t code = fp4_block_scale_code(amax, layer_scale);
    const float exact = (amax / 6.0f) / layer_scale;
    const float value = fp8_e4m3_to_float(code);
    if (exact <= 448.0f) {
      ASSERT_GE(value, exact) << "amax " << amax;
      if (code > 0) ASSERT_LT(fp8_e4m3_to_float(code - 1), exact) << "amax " << amax;
    } else {
      ASSERT_EQ(value, 448.0f) << "amax " << amax;
    }
  }
  EXPECT_EQ(fp4_block_scale_code(0.0f, 1.0f), 0);
  EXPECT_EQ(fp4_block_scale_code(kNaN, 1.0f), 0);
  EXPECT_EQ(fp4_block_scale_code(6.0f, 1.0f), 0x38);  // exactly 1.0

  // An all-zero group stores scale 0 and reads back zeros; its neighbour group is unaffected.
  auto pool = MHAKVPool::create(mha_config(DType::kFP4E2M1)).value();
  poison(pool->k_buffer(0), pool->k_scale_buffer(0));
  poison(pool->v_buffer(0), pool->v_scale_buffer(0));
  auto k = random_values(2 * 64, 41);
  std::fill(k.begin() + 16, k.begin() + 32, 0.0f);
  const auto v = random_values(2 * 32, 42);
  const std::vector<int64_t> slots{20};
  const TensorView loc(const_cast<int64_t*>(slots.data()), DType::kI64, Device::cpu(), {1});
  const TensorView kt(k.data(), DType::kF32, Device::cpu(), {1, 2, 64});
  const TensorView vt(const_cast<float*>(v.data()), DType::kF32, Device::cpu(), {1, 2, 32});
  ASSERT_TRUE(pool->set_kv(0, loc, kt, vt, 1.0f, 1.0f, nullptr).is_ok());
  const TensorView ks = pool->k_scale_buffer(0);
  EXPECT_EQ(static_cast<const uint8_t*>(ks.data)[20 * 2 * 4 + 1], 0);
  for (int d = 16; d < 32; ++d) {
    EXPECT_EQ(load_kv_value_host(pool->k_buffer(0), ks, 20, 0, d, 1.0f), 0.0f) << d;
  }
  expect_round_trip(pool->k_buffer(0), ks, 1.0f, slots, k, "k");
}

// ---- errors: nothing is written when any check fails ----

class KVPoolErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    pool_ = MHAKVPool::create(mha_config(DType::kBF16)).value();
    k_ = random_values(3 * 2 * 64, 51);
    v_ = random_values(3 * 2 * 32, 52);
    slots_ = {16, 17, 50};
    before_k_ = snapshot(pool_->k_buffer(0));
    before_v_ = snapshot(pool_->v_buffer(0));
  }
  TensorView loc() { return TensorView(slots_.data(), DType::kI64, Device::cpu(), {3}); }
  TensorView k() { return TensorView(k_.data(), DType::kF32, Device::cpu(), {3, 2, 64}); }
  TensorView v() { return TensorView(v_.data(), DType::kF32, Device::cpu(), {3, 2, 32}); }
  void expect_error(const Status& st, const std::string& needle) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
    EXPECT_EQ(snapshot(pool_->k_buffer(0)), before_k_) << "k written despite: " << st.message();
    EXPECT_EQ(snapshot(pool_->v_buffer(0)), before_v_) << "v written despite: " << st.message();
  }

  std::unique_ptr<MHAKVPool> pool_;
  std::vector<float> k_, v_;
  std::vector<int64_t> slots_;
  std::vector<uint8_t> before_k_, before_v_;
};

TEST_F(KVPoolErrors, SlotInReservedPageNamesTheSlot) {
  slots_[2] = 5;
  expect_error(pool_->set_kv(0, loc(), k(), v(), 1.0f, 1.0f, nullptr), "loc[2] = 5");
}

TEST_F(KVPoolErrors, SlotPastTheEnd) {
  slots_[2] = pool_->rows();
  expect_error(pool_->set_kv(0, loc(), k(), v(), 1.0f, 1.0f, nullptr),
               "loc[2] = " + std::to_string(pool_->rows()));
  slots_[2] = -1;
  expect_error(pool_->set_kv(0, loc(), k(), v(), 1.0f, 1.0f, nullptr), "loc[2] = -1");
}

// Two new tokens in one slot: one of them would be lost (the later row overwrote the earlier).
TEST_F(KVPoolErrors, SlotTwiceInOneWrite) {
  slots_[2] = slots_[0];
  expect_error(pool_->set_kv(0, loc(), k(), v(), 1.0f, 1.0f, nullptr),
               "loc[2] = 16 repeats loc[0]");
}

// k / v read from the buffers being written: the scatter would read rows it already overwrote
// (rows 4..11 moved to 8..11 came out [3, 3, 3, 3]; a swap lost a row). Another layer's buffer is
// fine to read.
TEST_F(KVPoolErrors, SourcesInsideTheWrittenBuffersAreRefused) {
  const TensorView k0 = pool_->k_buffer(0);  // bf16 [rows, 2, 64]
  TensorView inside = k0.slice0(40, 43);
  TensorView bf16_v(v_.data(), DType::kF32, Device::cpu(), {3, 2, 32});
  expect_error(pool_->set_kv(0, loc(), inside, bf16_v, 1.0f, 1.0f, nullptr),
               "set_kv k bf16[3, 2, 64]");
  expect_error(pool_->set_kv(0, loc(), inside, bf16_v, 1.0f, 1.0f, nullptr),
               "overlaps the pool's k[0] buffer it writes: copy it out of the pool first");
  TensorView v_inside = pool_->v_buffer(0).slice0(40, 43);
  expect_error(pool_->set_kv(0, loc(), k(), v_inside, 1.0f, 1.0f, nullptr),
               "set_kv v bf16[3, 2, 32]");
  // Another layer's rows into layer 0: nothing of layer 0 is read.
  EXPECT_TRUE(pool_
                  ->set_kv(0, loc(), pool_->k_buffer(1).slice0(40, 43),
                           pool_->v_buffer(1).slice0(40, 43), 1.0f, 1.0f, nullptr)
                  .is_ok());
}

// A view with a negative extent (numel and the slot check's vector size would be nonsense: a
// loc of [-1] aborted in std::vector's length check) is refused by name before anything is read.
TEST_F(KVPoolErrors, NegativeExtentsAreRefused) {
  TensorView neg_loc(slots_.data(), DType::kI64, Device::cpu(), {-1});
  TensorView neg_k(k_.data(), DType::kF32, Device::cpu(), {-1, 2, 64});
  TensorView neg_v(v_.data(), DType::kF32, Device::cpu(), {-1, 2, 32});
  expect_error(pool_->set_kv(0, neg_loc, neg_k, neg_v, 1.0f, 1.0f, nullptr),
               "loc: extent -1 of dim 0 is negative");
  TensorView neg_dim(k_.data(), DType::kF32, Device::cpu(), {3, 2, -64});
  expect_error(pool_->set_kv(0, loc(), neg_dim, v(), 1.0f, 1.0f, nullptr),
               "k: extent -64 of dim 2 is negative");
}

TEST_F(KVPoolErrors, ShapesDTypesDevicesLayersAndScales) {
  TensorView bad_heads(k_.data(), DType::kF32, Device::cpu(), {3, 1, 128});
  expect_error(pool_->set_kv(0, loc(), bad_heads, v(), 1.0f, 1.0f, nullptr), "k");
  TensorView bad_v(v_.data(), DType::kF32, Device::cpu(), {3, 2, 16});
  expect_error(pool_->set_kv(0, loc(), k(), bad_v, 1.0f, 1.0f, nullptr), "v:");
  TensorView short_loc(slots_.data(), DType::kI64, Device::cpu(), {2});
  expect_error(pool_->set_kv(0, short_loc, k(), v(), 1.0f, 1.0f, nullptr), "k");
  TensorView int_k(k_.data(), DType::kI32, Device::cpu(), {3, 2, 64});
  expect_error(pool_->set_kv(0, loc(), int_k, v(), 1.0f, 1.0f, nullptr), "k");
  TensorView int_loc(slots_.data(), DType::kI32, Device::cpu(), {3});
  expect_error(pool_->set_kv(0, int_loc, k(), v(), 1.0f, 1.0f, nullptr), "loc");
  // A loc with tokens but no data (the slot check read through the null pointer: SIGSEGV).
  TensorView null_loc(nullptr, DType::kI64, Device::cpu(), {3});
  expect_error(pool_->set_kv(0, null_loc, k(), v(), 1.0f, 1.0f, nullptr), "loc: ");
  TensorView flat_k(k_.data(), DType::kF32, Device::cpu(), {3, 128});
  expect_error(pool_->set_kv(0, loc(), flat_k, v(), 1.0f, 1.0f, nullptr), "k");
  TensorView cuda_k(k_.data(), DType::kF32, Device::cuda(0), {3, 2, 64});
  expect_error(pool_->set_kv(0, loc(), cuda_k, v(), 1.0f, 1.0f, nullptr), "k");
  std::vector<float> wide = random_values(3 * 2 * 128, 53);
  TensorView strided_inner(wide.data(), DType::kF32, Device::cpu(), {3, 2, 64});
  strided_inner.strides = {256, 128, 2};
  expect_error(pool_->set_kv(0, loc(), strided_inner, v(), 1.0f, 1.0f, nullptr), "stride");
  expect_error(pool_->set_kv(2, loc(), k(), v(), 1.0f, 1.0f, nullptr), "layer 2");
  expect_error(pool_->set_kv(-1, loc(), k(), v(), 1.0f, 1.0f, nullptr), "layer -1");
  expect_error(pool_->set_kv(0, loc(), k(), v(), 0.0f, 1.0f, nullptr), "k_scale");
  expect_error(pool_->set_kv(0, loc(), k(), v(), 1.0f, kNaN, nullptr), "v_scale");
  // The same call with valid inputs does write (so the checks above are meaningful).
  ASSERT_TRUE(pool_->set_kv(0, loc(), k(), v(), 1.0f, 1.0f, nullptr).is_ok());
  EXPECT_NE(snapshot(pool_->k_buffer(0)), before_k_);
}

// set_kv writes K, then V: every check of V (and of the slots) runs before the K write, so a bad
// V leaves K as it was (no half-written token whose V is missing).
TEST_F(KVPoolErrors, InvalidVLeavesKUntouched) {
  std::vector<float> v_wide = random_values(3 * 2 * 64, 54);
  TensorView v_strided(v_wide.data(), DType::kF32, Device::cpu(), {3, 2, 32});
  v_strided.strides = {128, 64, 2};
  const struct {
    TensorView v;
    float v_scale;
    const char* needle;
  } kRows[] = {
      {TensorView(v_.data(), DType::kF32, Device::cpu(), {3, 2, 16}), 1.0f, "v:"},  // v_head_dim
      {TensorView(v_.data(), DType::kF32, Device::cpu(), {2, 2, 32}), 1.0f, "v:"},  // tokens
      {TensorView(v_.data(), DType::kF32, Device::cpu(), {3, 1, 64}), 1.0f, "v:"},  // heads
      {TensorView(v_.data(), DType::kF32, Device::cpu(), {3, 64}), 1.0f, "v:"},     // rank
      {TensorView(v_.data(), DType::kI32, Device::cpu(), {3, 2, 32}), 1.0f, "v:"},
      {TensorView(v_.data(), DType::kF32, Device::cuda(0), {3, 2, 32}), 1.0f, "v:"},
      {TensorView(nullptr, DType::kF32, Device::cpu(), {3, 2, 32}), 1.0f, "v:"},
      {v_strided, 1.0f, "v: innermost stride 2"},
      {v(), 0.0f, "v_scale"},
      {v(), kNaN, "v_scale"},
      {TensorView(), 1.0f, "v:"},  // no V at all
  };
  for (const auto& row : kRows) {
    SCOPED_TRACE(row.needle);
    expect_error(pool_->set_kv(0, loc(), k(), row.v, 1.0f, row.v_scale, nullptr), row.needle);
  }
  // The same K with a valid V is written (so K was writable above).
  ASSERT_TRUE(pool_->set_kv(0, loc(), k(), v(), 1.0f, 1.0f, nullptr).is_ok());
  EXPECT_NE(snapshot(pool_->k_buffer(0)), before_k_);
  EXPECT_NE(snapshot(pool_->v_buffer(0)), before_v_);
}

TEST(KVPoolConfigErrors, NameTheField) {
  // One bad field per row: the pool kind, the dtype, the change, and what the message must name.
  struct BadConfig {
    bool mla;
    DType dtype;
    void (*edit)(KVPoolConfig&);
    const char* field;
  };
  const BadConfig kRows[] = {
      {false, DType::kBF16, [](KVPoolConfig& c) { c.size = 100; }, "size 100"},  // not x16
      {false, DType::kBF16, [](KVPoolConfig& c) { c.num_layers = 0; }, "num_layers"},
      // A garbage layer count: the per-layer buffer vectors threw an uncaught std::bad_alloc.
      {false, DType::kFP8E4M3, [](KVPoolConfig& c) { c.num_layers = 2147483647; },
       "num_layers 2147483647 must be in [1, 65536]"},
      // kv_lora_rank + qk_rope_head_dim overflowed int (the pool then had a negative row_dim).
      {true, DType::kBF16, [](KVPoolConfig& c) { c.kv_lora_rank = 2147483647 - 15; },
       "kv_lora_rank 2147483632 + qk_rope_head_dim 16 = 2147483648 must be <= 65536"},
      {false, DType::kBF16, [](KVPoolConfig& c) { c.page_size = 0; }, "page_size"},
      {false, DType::kI32, [](KVPoolConfig&) {}, "dtype"},
      {false, DType::kFP4E2M1, [](KVPoolConfig& c) { c.head_dim = 40; }, "head_dim 40"},
      {false, DType::kBF16, [](KVPoolConfig& c) { c.num_kv_heads = 0; }, "num_kv_heads"},
      {false, DType::kBF16, [](KVPoolConfig& c) { c.v_head_dim = 0; }, "v_head_dim"},
      {true, DType::kBF16, [](KVPoolConfig& c) { c.qk_rope_head_dim = 0; }, "qk_rope_head_dim"},
      {true, DType::kBF16, [](KVPoolConfig& c) { c.num_kv_heads = 8; }, "num_kv_heads 8"},
      {true, DType::kFP4E2M1, [](KVPoolConfig& c) { c.kv_lora_rank = 40; }, "kv_lora_rank 40"},
      // Slots are int32: 2^59 rows made a 64-byte buffer (the byte count wrapped) and set_kv then
      // wrote far past it.
      {false, DType::kF32, [](KVPoolConfig& c) { c.size = int64_t{1} << 59; },
       "(KV slots are int32)"},
      {true, DType::kBF16, [](KVPoolConfig& c) { c.size = 2147483632; }, "size 2147483632"},
      // Rows x values per row past 2^57 (a row of 2^31 heads x 2^30 dims) are named too.
      {false, DType::kBF16,
       [](KVPoolConfig& c) {
         c.num_kv_heads = 1 << 30;
         c.head_dim = c.v_head_dim = 1 << 30;
       },
       "values per row exceed 2^57"},
  };
  for (const BadConfig& row : kRows) {
    KVPoolConfig c = row.mla ? mla_config(row.dtype) : mha_config(row.dtype);
    row.edit(c);
    const Status st = row.mla ? MLAKVPool::create(c).status() : MHAKVPool::create(c).status();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << row.field;
    EXPECT_NE(st.message().find(row.field), std::string::npos) << st.message();
  }
  // A non-power-of-two page size is fine.
  EXPECT_TRUE(MHAKVPool::create(mha_config(DType::kBF16, 24)).is_ok());
}

TEST(KVPool, ZeroTokensIsANoOp) {
  auto pool = MHAKVPool::create(mha_config(DType::kF16)).value();
  const auto before = snapshot(pool->k_buffer(0));
  const TensorView loc(nullptr, DType::kI64, Device::cpu(), {0});
  const TensorView k(nullptr, DType::kF32, Device::cpu(), {0, 2, 64});
  const TensorView v(nullptr, DType::kF32, Device::cpu(), {0, 2, 32});
  ASSERT_TRUE(pool->set_kv(0, loc, k, v, 1.0f, 1.0f, nullptr).is_ok());
  EXPECT_EQ(snapshot(pool->k_buffer(0)), before);
}

// CPU pools check every slot before writing, so the device slot guard has nothing to report, also
// after a rejected write (a CPU pool has no device error word).
TEST_F(KVPoolErrors, CpuPoolHasNoDeviceErrorsToReport) {
  slots_[1] = -3;
  expect_error(pool_->set_kv(0, loc(), k(), v(), 1.0f, 1.0f, nullptr), "loc[1] = -3");
  const Status st = pool_->check_device_errors(nullptr);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  auto mla = MLAKVPool::create(mla_config(DType::kBF16)).value();
  EXPECT_TRUE(mla->check_device_errors().is_ok());
}

// The text check_device_errors returns for a write the CUDA scatter skipped: it names the layer,
// the token (as loc[t]), the slot, the pool's rows and usable slots, and that the k/v is missing.
TEST(KVGuardMessage, NamesLayerTokenSlotAndPoolSize) {
  detail::KVGuardRecord record;
  EXPECT_EQ(record.flag, 0u);  // a zeroed word means "nothing recorded"
  record.flag = 1;
  record.layer = 3;
  record.token = 17;
  record.slot = 123456789012LL;
  std::string msg = detail::kv_guard_message(record, 1040, 16);
  for (const char* needle : {"layer 3", "loc[17] = 123456789012", "rows [0, 1040)",
                             "usable slots [16, 1040)", "skipped", "missing"}) {
    EXPECT_NE(msg.find(needle), std::string::npos) << needle << " not in: " << msg;
  }
  record.token = 0;
  record.slot = -1;
  msg = detail::kv_guard_message(record, 80, 1);
  EXPECT_NE(msg.find("loc[0] = -1 is outside the pool rows [0, 80)"), std::string::npos) << msg;
}

#ifndef ATTNKIT_WITH_CUDA
TEST(KVPool, CudaPoolIsNotBuiltWithoutCuda) {
  KVPoolConfig c = mha_config(DType::kBF16);
  c.device = Device::cuda(0);
  const Status st = MHAKVPool::create(c).status();
  EXPECT_EQ(st.code(), StatusCode::kNotBuilt) << st.to_string();
}
#endif

}  // namespace
}  // namespace attnkit
