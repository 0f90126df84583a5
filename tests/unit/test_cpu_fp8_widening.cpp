// The intel_amx vector kernels' fp8 widening on AVX2 (vec_avx2.h VecAvx2::load_as): every
// fp8_e4m3 and fp8_e5m2 code, eight per load in every lane position, against the library's scalar
// decode (e4m3 times the fp16 route's 2^-8, kFp8E4M3ViaF16Scale), exactly; the e4m3 NaN codes
// (0x7F, 0xFF) NaN. Skipped where the CPU lacks AVX2 / FMA / F16C (the traits' requirement).
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

// Eight codes widened by the AVX2 traits.
template <class S>
std::array<float, 8> widen8(const uint8_t* codes) {
  std::array<float, 8> out{};
  VecAvx2::store(out.data(), VecAvx2::load_as<S>(codes));
  return out;
}

}  // namespace
}  // namespace attnkit::cpu_attention
#pragma GCC pop_options

namespace attnkit::cpu_attention {
namespace {

constexpr int kCodes = 256;
constexpr int kLanes = 8;

template <class S>
void expect_every_code(float (*reference)(uint8_t), float scale, const char* what) {
  // Lane l of load i holds code (i + l * 37) % 256: each code in every lane position.
  constexpr int kStride = 37;
  for (int i = 0; i < kCodes; ++i) {
    uint8_t codes[kLanes];
    for (int l = 0; l < kLanes; ++l) codes[l] = static_cast<uint8_t>((i + l * kStride) % kCodes);
    const std::array<float, 8> got = widen8<S>(codes);
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

TEST(CpuFp8Widening, Avx2MatchesTheScalarDecodeForEveryCode) {
  if (!detect_cpu().has_avx2) GTEST_SKIP() << "this CPU has no AVX2 / FMA / F16C";
  expect_every_code<StoreFp8E4M3>(fp8_e4m3_to_float, 1.f / kFp8E4M3ViaF16Scale, "e4m3");
  expect_every_code<StoreFp8E5M2>(fp8_e5m2_to_float, 1.f, "e5m2");
  // The NaN codes of e4m3 are exactly 0x7F and 0xFF.
  const uint8_t nans[kLanes] = {0x7F, 0xFF, 0x7E, 0xFE, 0x00, 0x80, 0x01, 0x81};
  const std::array<float, 8> got = widen8<StoreFp8E4M3>(nans);
  EXPECT_TRUE(std::isnan(got[0]) && std::isnan(got[1]));
  for (int l = 2; l < kLanes; ++l) EXPECT_FALSE(std::isnan(got[l])) << "lane " << l;
}

}  // namespace
}  // namespace attnkit::cpu_attention
