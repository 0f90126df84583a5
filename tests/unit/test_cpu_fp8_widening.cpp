// The intel_amx vector kernels' fp8 widening on AVX2 and AVX-512 (vec_avx2.h VecAvx2::load_as,
// vec_avx512.h VecAvx512::load_as): every fp8_e4m3 and fp8_e5m2 code, one load's width at a time
// in every lane position, against the library's scalar decode (e4m3 times the fp16 route's 2^-8,
// kFp8E4M3ViaF16Scale), exactly; the e4m3 NaN codes (0x7F, 0xFF) NaN. Each ISA's test is skipped
// where the CPU lacks its traits' features.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>

#include "attnkit/device.h"
#include "attnkit/dtype.h"
#include "backends/intel_amx/kernels/cpu_attention_params.h"
#include "backends/intel_amx/kernels/storage_types.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include "backends/intel_amx/kernels/vec_avx2.h"

namespace attnkit::cpu_attention {
namespace {

// kWidth codes widened by the AVX2 traits.
template <class S>
std::array<float, VecAvx2::kWidth> widen_avx2(const uint8_t* codes) {
  std::array<float, VecAvx2::kWidth> out{};
  VecAvx2::store(out.data(), VecAvx2::load_as<S>(codes));
  return out;
}

}  // namespace
}  // namespace attnkit::cpu_attention
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
#include "backends/intel_amx/kernels/vec_avx512.h"

namespace attnkit::cpu_attention {
namespace {

// kWidth codes widened by the AVX-512 traits.
template <class S>
std::array<float, VecAvx512::kWidth> widen_avx512(const uint8_t* codes) {
  std::array<float, VecAvx512::kWidth> out{};
  VecAvx512::store(out.data(), VecAvx512::load_as<S>(codes));
  return out;
}

}  // namespace
}  // namespace attnkit::cpu_attention
#pragma GCC pop_options

namespace attnkit::cpu_attention {
namespace {

constexpr int kCodes = 256;

// Widen(codes) -> std::array<float, kLanes>: one load of the traits under test.
template <class S, int kLanes, class Widen>
void expect_every_code(Widen widen, float (*reference)(uint8_t), float scale, const char* what) {
  // Lane l of load i holds code (i + l * 37) % 256: each code in every lane position.
  constexpr int kStride = 37;
  for (int i = 0; i < kCodes; ++i) {
    uint8_t codes[kLanes];
    for (int l = 0; l < kLanes; ++l) codes[l] = static_cast<uint8_t>((i + l * kStride) % kCodes);
    const std::array<float, kLanes> got = widen(codes);
    for (int l = 0; l < kLanes; ++l) {
      const float want = reference(codes[l]) * scale;
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got[l])) << what << " code 0x" << std::hex << int{codes[l]};
      } else {
        EXPECT_EQ(got[l], want) << what << " code 0x" << std::hex << int{codes[l]};
        EXPECT_EQ(std::signbit(got[l]), std::signbit(want))
            << what << " code 0x" << std::hex << int{codes[l]};
      }
    }
  }
}

// Every code of both formats, then the e4m3 NaN codes (exactly 0x7F and 0xFF) beside their
// neighbours.
template <int kLanes, class WidenE4m3, class WidenE5m2>
void expect_traits_match(WidenE4m3 widen_e4m3, WidenE5m2 widen_e5m2) {
  expect_every_code<StoreFp8E4M3, kLanes>(widen_e4m3, fp8_e4m3_to_float, 1.f / kFp8E4M3ViaF16Scale,
                                          "e4m3");
  expect_every_code<StoreFp8E5M2, kLanes>(widen_e5m2, fp8_e5m2_to_float, 1.f, "e5m2");
  constexpr uint8_t kPattern[8] = {0x7F, 0xFF, 0x7E, 0xFE, 0x00, 0x80, 0x01, 0x81};
  uint8_t codes[kLanes];
  for (int l = 0; l < kLanes; ++l) codes[l] = kPattern[l % 8];
  const std::array<float, kLanes> got = widen_e4m3(codes);
  for (int l = 0; l < kLanes; ++l) {
    EXPECT_EQ(std::isnan(got[l]), l % 8 < 2)
        << "lane " << l << " code 0x" << std::hex << int{codes[l]};
  }
}

TEST(CpuFp8Widening, Avx2MatchesTheScalarDecodeForEveryCode) {
  if (!detect_cpu().has_avx2) GTEST_SKIP() << "this CPU has no AVX2 / FMA / F16C";
  expect_traits_match<VecAvx2::kWidth>(widen_avx2<StoreFp8E4M3>, widen_avx2<StoreFp8E5M2>);
}

TEST(CpuFp8Widening, Avx512MatchesTheScalarDecodeForEveryCode) {
  if (!detect_cpu().has_avx512) GTEST_SKIP() << "this CPU has no AVX-512 F / BW / VL";
  expect_traits_match<VecAvx512::kWidth>(widen_avx512<StoreFp8E4M3>, widen_avx512<StoreFp8E5M2>);
}

}  // namespace
}  // namespace attnkit::cpu_attention
