// DType names and the exact host conversions, checked against hand-worked bit patterns, the
// compiler's _Float16 conversion, and a brute-force nearest-value reference over every code.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attnkit/dtype.h"

namespace attnkit {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr uint32_t kRandomSeed = 20240611;

float from_bits(uint32_t b) { return std::bit_cast<float>(b); }
uint32_t to_bits(float x) { return std::bit_cast<uint32_t>(x); }

// ---- names ----

TEST(DTypeNames, CanonicalNamesRoundTrip) {
  const DType all[] = {DType::kF32,     DType::kF16, DType::kBF16, DType::kFP8E4M3, DType::kFP8E5M2,
                       DType::kFP4E2M1, DType::kI32, DType::kI64,  DType::kU8};
  const char* names[] = {"f32",      "f16",   "bf16",  "fp8_e4m3", "fp8_e5m2",
                         "fp4_e2m1", "int32", "int64", "uint8"};
  for (size_t i = 0; i < std::size(all); ++i) {
    EXPECT_STREQ(dtype_name(all[i]), names[i]);
    Result<DType> parsed = parse_dtype(names[i]);
    ASSERT_TRUE(parsed.is_ok()) << names[i];
    EXPECT_EQ(*parsed, all[i]);
  }
}

TEST(DTypeNames, Aliases) {
  EXPECT_EQ(*parse_dtype("float32"), DType::kF32);
  EXPECT_EQ(*parse_dtype("float16"), DType::kF16);
  EXPECT_EQ(*parse_dtype("fp16"), DType::kF16);
  EXPECT_EQ(*parse_dtype("bfloat16"), DType::kBF16);
  EXPECT_EQ(*parse_dtype("fp8_e4m3fn"), DType::kFP8E4M3);
  EXPECT_EQ(*parse_dtype("float8_e5m2"), DType::kFP8E5M2);
}

TEST(DTypeNames, UnknownNameErrorNamesValueAndAccepted) {
  Result<DType> r = parse_dtype("fp7");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("'fp7'"), std::string::npos) << m;
  for (const char* accepted : {"f32", "bf16", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1", "bfloat16"}) {
    EXPECT_NE(m.find(accepted), std::string::npos) << accepted << " missing from: " << m;
  }
  EXPECT_FALSE(parse_dtype("").is_ok());
  EXPECT_FALSE(parse_dtype("BF16").is_ok());  // names are case-sensitive
}

TEST(DTypeProperties, BitsAndStorage) {
  EXPECT_EQ(dtype_bits(DType::kF32), 32);
  EXPECT_EQ(dtype_bits(DType::kBF16), 16);
  EXPECT_EQ(dtype_bits(DType::kFP8E4M3), 8);
  EXPECT_EQ(dtype_bits(DType::kFP4E2M1), 4);
  EXPECT_EQ(dtype_bits(DType::kI64), 64);
  EXPECT_EQ(dtype_storage_bytes(DType::kF16, 7), 14);
  EXPECT_EQ(dtype_storage_bytes(DType::kFP4E2M1, 7), 4);
  EXPECT_EQ(dtype_storage_bytes(DType::kFP4E2M1, 8), 4);
  EXPECT_EQ(dtype_storage_bytes(DType::kFP4E2M1, 0), 0);
  EXPECT_EQ(dtype_storage_bytes(DType::kI64, 3), 24);
  EXPECT_TRUE(dtype_is_float(DType::kFP4E2M1));
  EXPECT_TRUE(dtype_is_float(DType::kBF16));
  EXPECT_FALSE(dtype_is_float(DType::kI32));
  EXPECT_FALSE(dtype_is_float(DType::kU8));
  EXPECT_TRUE(dtype_is_fp8(DType::kFP8E4M3));
  EXPECT_TRUE(dtype_is_fp8(DType::kFP8E5M2));
  EXPECT_FALSE(dtype_is_fp8(DType::kFP4E2M1));
  EXPECT_FALSE(dtype_is_fp8(DType::kU8));
}

// ---- independent reference: nearest representable value, ties to the even code ----

// Nearest code among the finite codes [0, max_code] (magnitudes) for |x|, ties to the even code.
// `decode` maps a magnitude code to its value. O(codes) per call: fine for 8-bit formats.
template <typename Decode>
uint32_t brute_force_nearest(double magnitude, uint32_t max_code, Decode decode) {
  uint32_t best = 0;
  double best_err = std::fabs(magnitude - decode(0));
  for (uint32_t c = 1; c <= max_code; ++c) {
    const double err = std::fabs(magnitude - decode(c));
    if (err < best_err || (err == best_err && (c % 2 == 0) && (best % 2 != 0))) {
      best = c;
      best_err = err;
    }
  }
  return best;
}

// Random floats spread over the format's range (and a little beyond), both signs.
std::vector<float> random_values(double max_magnitude, int count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> log_mag(std::log2(max_magnitude) - 24.0,
                                                 std::log2(max_magnitude) + 1.0);
  std::vector<float> out;
  out.reserve(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    const float v = static_cast<float>(std::exp2(log_mag(rng)));
    out.push_back((rng() & 1u) ? -v : v);
  }
  return out;
}

// ---- bf16 ----

TEST(Bf16, KnownPatterns) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16_bits(-2.0f), 0xc000);
  EXPECT_EQ(float_to_bf16_bits(0.0f), 0x0000);
  EXPECT_EQ(float_to_bf16_bits(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16_bits(kInf), 0x7f80);
  EXPECT_EQ(float_to_bf16_bits(-kInf), 0xff80);
  EXPECT_EQ(float_to_bf16_bits(3.140625f), 0x4049);
  EXPECT_FLOAT_EQ(bf16_bits_to_float(0x4049), 3.140625f);
  EXPECT_FLOAT_EQ(bf16_bits_to_float(0xc000), -2.0f);
}

TEST(Bf16, RoundToNearestEven) {
  EXPECT_EQ(float_to_bf16_bits(from_bits(0x3f808000u)), 0x3f80);             // tie, even below
  EXPECT_EQ(float_to_bf16_bits(from_bits(0x3f818000u)), 0x3f82);             // tie, odd below -> up
  EXPECT_EQ(float_to_bf16_bits(from_bits(0x3f808001u)), 0x3f81);             // above tie
  EXPECT_EQ(float_to_bf16_bits(from_bits(0x3f807fffu)), 0x3f80);             // below tie
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::max()), 0x7f80);  // rounds to inf
  EXPECT_EQ(float_to_bf16_bits(from_bits(0x00008000u)), 0x0000);             // subnormal tie, even
  EXPECT_EQ(float_to_bf16_bits(from_bits(0x00018000u)), 0x0002);  // subnormal tie, odd -> up
}

TEST(Bf16, NaNPreservedAndQuiet) {
  for (uint32_t bits : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fbfffffu, 0xff812345u}) {
    const uint16_t h = float_to_bf16_bits(from_bits(bits));
    EXPECT_TRUE(std::isnan(bf16_bits_to_float(h))) << std::hex << bits;
    EXPECT_EQ(h & 0x8000u, (bits >> 16) & 0x8000u);
  }
}

TEST(Bf16, RandomAgainstNearestNeighbour) {
  std::mt19937 rng(kRandomSeed);
  std::vector<uint32_t> probes = {0x7f7f8000u, 0x7f7f7fffu, 0xff7fc000u, 0x00ff8000u};
  for (int i = 0; i < 200000; ++i) probes.push_back(rng());
  for (uint32_t bits : probes) {
    const float x = from_bits(bits);
    if (std::isnan(x)) continue;
    const uint16_t got = float_to_bf16_bits(x);
    // Neighbours: truncation and the next code away from zero.
    const auto lo = static_cast<uint16_t>(bits >> 16);
    const auto hi = static_cast<uint16_t>(lo + 1);
    // Rounding treats infinity as the next binade, 2^128, so that overflow follows RNE.
    auto value = [](uint16_t code) {
      const float v = bf16_bits_to_float(code);
      return std::isinf(v) ? std::copysign(std::ldexp(1.0, 128), static_cast<double>(v))
                           : static_cast<double>(v);
    };
    const double xv = static_cast<double>(x);
    const double dlo = std::fabs(xv - value(lo));
    const double dhi = std::isnan(bf16_bits_to_float(hi)) ? kInf : std::fabs(xv - value(hi));
    uint16_t want = dlo < dhi ? lo : (dhi < dlo ? hi : ((lo & 1) ? hi : lo));
    if (std::isinf(x)) want = lo;
    ASSERT_EQ(got, want) << std::hex << bits;
  }
}

TEST(Bf16, ExhaustiveDecodeEncode) {
  for (uint32_t c = 0; c <= 0xffffu; ++c) {
    const float v = bf16_bits_to_float(static_cast<uint16_t>(c));
    EXPECT_EQ(to_bits(v), c << 16);
    if (!std::isnan(v)) {
      ASSERT_EQ(float_to_bf16_bits(v), c);
    }
  }
}

// ---- f16 ----

TEST(F16, KnownPatterns) {
  EXPECT_EQ(float_to_f16_bits(1.0f), 0x3c00);
  EXPECT_EQ(float_to_f16_bits(-2.0f), 0xc000);
  EXPECT_EQ(float_to_f16_bits(0.5f), 0x3800);
  EXPECT_EQ(float_to_f16_bits(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_f16_bits(65519.99f), 0x7bff);
  EXPECT_EQ(float_to_f16_bits(65520.0f), 0x7c00);  // tie above max rounds to even = inf
  EXPECT_EQ(float_to_f16_bits(1e6f), 0x7c00);
  EXPECT_EQ(float_to_f16_bits(-1e6f), 0xfc00);
  EXPECT_EQ(float_to_f16_bits(kInf), 0x7c00);
  EXPECT_EQ(float_to_f16_bits(-0.0f), 0x8000);
  EXPECT_EQ(float_to_f16_bits(std::ldexp(1.0f, -24)), 0x0001);     // min subnormal
  EXPECT_EQ(float_to_f16_bits(std::ldexp(1.0f, -25)), 0x0000);     // tie -> even 0
  EXPECT_EQ(float_to_f16_bits(std::ldexp(3.0f, -25)), 0x0002);     // tie 1|2 -> 2
  EXPECT_EQ(float_to_f16_bits(std::ldexp(1.0f, -14)), 0x0400);     // min normal
  EXPECT_EQ(float_to_f16_bits(std::ldexp(1023.5f, -24)), 0x0400);  // subnormal carries to normal
  EXPECT_EQ(float_to_f16_bits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie -> even
  EXPECT_EQ(float_to_f16_bits(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // tie -> even (up)
  EXPECT_FLOAT_EQ(f16_bits_to_float(0x7bff), 65504.0f);
  EXPECT_FLOAT_EQ(f16_bits_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_FLOAT_EQ(f16_bits_to_float(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(f16_bits_to_float(0xfc00), -kInf);
  EXPECT_TRUE(std::isnan(f16_bits_to_float(0x7e00)));
  EXPECT_TRUE(std::isnan(f16_bits_to_float(0xfc01)));
}

TEST(F16, NaNPreserved) {
  for (uint32_t bits : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fa00000u}) {
    const uint16_t h = float_to_f16_bits(from_bits(bits));
    EXPECT_EQ(h & 0x7c00u, 0x7c00u);
    EXPECT_NE(h & 0x03ffu, 0u) << std::hex << bits;
    EXPECT_EQ(h & 0x8000u, (bits >> 16) & 0x8000u);
    EXPECT_TRUE(std::isnan(f16_bits_to_float(h)));
  }
}

TEST(F16, ExhaustiveDecodeEncode) {
  for (uint32_t c = 0; c <= 0xffffu; ++c) {
    const float v = f16_bits_to_float(static_cast<uint16_t>(c));
    if (std::isnan(v)) {
      EXPECT_EQ(c & 0x7c00u, 0x7c00u);
      continue;
    }
    ASSERT_EQ(float_to_f16_bits(v), c) << std::hex << c;
  }
}

#if defined(__FLT16_MAX__)
// The compiler's own _Float16 conversion is an independent IEEE reference.
TEST(F16, MatchesCompilerFloat16) {
  for (uint32_t c = 0; c <= 0xffffu; ++c) {
    const auto h = std::bit_cast<_Float16>(static_cast<uint16_t>(c));
    const float ref = static_cast<float>(h);
    const float got = f16_bits_to_float(static_cast<uint16_t>(c));
    if (std::isnan(ref)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << c;
    } else {
      ASSERT_EQ(to_bits(got), to_bits(ref)) << std::hex << c;
    }
  }
  // Every f16 midpoint and its float neighbours, plus random floats over the whole range.
  std::vector<float> probes;
  for (uint32_t c = 0; c < 0x7c00u; ++c) {
    const float a = f16_bits_to_float(static_cast<uint16_t>(c));
    const float b = c + 1 < 0x7c00u ? f16_bits_to_float(static_cast<uint16_t>(c + 1)) : 65536.0f;
    const float mid = static_cast<float>((static_cast<double>(a) + b) / 2.0);
    probes.insert(probes.end(), {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, kInf), -mid});
  }
  std::mt19937 rng(kRandomSeed);
  for (int i = 0; i < 300000; ++i) probes.push_back(from_bits(rng()));
  for (float x : probes) {
    if (std::isnan(x)) continue;
    const auto ref = std::bit_cast<uint16_t>(static_cast<_Float16>(x));
    ASSERT_EQ(float_to_f16_bits(x), ref) << "x=" << x << " bits=" << std::hex << to_bits(x);
  }
}
#endif

// ---- fp8 e4m3fn ----

double e4m3_value(uint32_t magnitude_code) {
  // Independent closed form: S.EEEE.MMM, bias 7, subnormal quantum 2^-9.
  const uint32_t e = magnitude_code >> 3;
  const uint32_t m = magnitude_code & 7u;
  return e == 0 ? std::ldexp(static_cast<double>(m), -9)
                : std::ldexp(1.0 + m / 8.0, static_cast<int>(e) - 7);
}

TEST(Fp8E4M3, KnownConstants) {
  EXPECT_EQ(float_to_fp8_e4m3(448.0f), 0x7e);
  EXPECT_EQ(float_to_fp8_e4m3(-448.0f), 0xfe);
  EXPECT_EQ(float_to_fp8_e4m3(1.0f), 0x38);
  EXPECT_EQ(float_to_fp8_e4m3(240.0f), 0x77);
  EXPECT_EQ(float_to_fp8_e4m3(std::ldexp(1.0f, -9)), 0x01);
  EXPECT_EQ(float_to_fp8_e4m3(std::ldexp(1.0f, -6)), 0x08);
  EXPECT_EQ(float_to_fp8_e4m3(-0.0f), 0x80);
  EXPECT_FLOAT_EQ(fp8_e4m3_to_float(0x7e), 448.0f);
  EXPECT_FLOAT_EQ(fp8_e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_FLOAT_EQ(fp8_e4m3_to_float(0xb8), -1.0f);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0xff)));
}

TEST(Fp8E4M3, AllCodesRoundTrip) {
  int nan_count = 0;
  for (uint32_t c = 0; c < 256; ++c) {
    const float v = fp8_e4m3_to_float(static_cast<uint8_t>(c));
    if ((c & 0x7fu) == 0x7fu) {
      EXPECT_TRUE(std::isnan(v));
      ++nan_count;
      continue;
    }
    ASSERT_FALSE(std::isnan(v)) << c;
    ASSERT_FALSE(std::isinf(v)) << c;
    EXPECT_EQ(static_cast<double>(std::fabs(v)), e4m3_value(c & 0x7fu)) << c;
    EXPECT_EQ(std::signbit(v), (c & 0x80u) != 0) << c;
    EXPECT_EQ(float_to_fp8_e4m3(v), c) << c;
  }
  EXPECT_EQ(nan_count, 2);
}

TEST(Fp8E4M3, TiesRoundToEven) {
  EXPECT_EQ(float_to_fp8_e4m3(1.0625f), 0x38);                 // 1 | 1.125 -> even 0x38
  EXPECT_EQ(float_to_fp8_e4m3(1.1875f), 0x3a);                 // 1.125 | 1.25 -> even 0x3a
  EXPECT_EQ(float_to_fp8_e4m3(std::ldexp(1.0f, -10)), 0x00);   // 0 | min subnormal -> 0
  EXPECT_EQ(float_to_fp8_e4m3(std::ldexp(3.0f, -10)), 0x02);   // subnormal 1 | 2 -> 2
  EXPECT_EQ(float_to_fp8_e4m3(std::ldexp(15.0f, -10)), 0x08);  // 7 | min normal -> 8
  EXPECT_EQ(float_to_fp8_e4m3(432.0f), 0x7e);                  // 416 | 448 -> even 0x7e
  EXPECT_EQ(float_to_fp8_e4m3(-1.0625f), 0xb8);
}

TEST(Fp8E4M3, SaturatesAndNaN) {
  for (float x : {449.0f, 464.0f, 480.0f, 1e4f, 3e38f, kInf}) {
    EXPECT_EQ(float_to_fp8_e4m3(x), 0x7e) << x;
    EXPECT_EQ(float_to_fp8_e4m3(-x), 0xfe) << x;
  }
  EXPECT_EQ(float_to_fp8_e4m3(kNaN), 0x7f);
  EXPECT_EQ(float_to_fp8_e4m3(-kNaN), 0xff);
}

TEST(Fp8E4M3, RandomAgainstBruteForce) {
  for (float x : random_values(448.0, 50000, kRandomSeed)) {
    const uint32_t mag = brute_force_nearest(std::fabs(static_cast<double>(x)), 0x7eu, e4m3_value);
    const uint32_t want = mag | (std::signbit(x) ? 0x80u : 0u);
    ASSERT_EQ(float_to_fp8_e4m3(x), want) << "x=" << x;
  }
}

// ---- fp8 e5m2 ----

double e5m2_value(uint32_t magnitude_code) {
  const uint32_t e = magnitude_code >> 2;
  const uint32_t m = magnitude_code & 3u;
  return e == 0 ? std::ldexp(static_cast<double>(m), -16)
                : std::ldexp(1.0 + m / 4.0, static_cast<int>(e) - 15);
}

TEST(Fp8E5M2, KnownConstants) {
  EXPECT_EQ(float_to_fp8_e5m2(57344.0f), 0x7b);
  EXPECT_EQ(float_to_fp8_e5m2(1.0f), 0x3c);
  EXPECT_EQ(float_to_fp8_e5m2(-2.0f), 0xc0);
  EXPECT_EQ(float_to_fp8_e5m2(std::ldexp(1.0f, -16)), 0x01);
  EXPECT_EQ(fp8_e5m2_to_float(0x7c), kInf);
  EXPECT_EQ(fp8_e5m2_to_float(0xfc), -kInf);
  EXPECT_TRUE(std::isnan(fp8_e5m2_to_float(0x7d)));
  EXPECT_TRUE(std::isnan(fp8_e5m2_to_float(0xfe)));
  EXPECT_FLOAT_EQ(fp8_e5m2_to_float(0x7b), 57344.0f);
}

TEST(Fp8E5M2, AllCodesRoundTrip) {
  for (uint32_t c = 0; c < 256; ++c) {
    const float v = fp8_e5m2_to_float(static_cast<uint8_t>(c));
    const uint32_t mag = c & 0x7fu;
    // e5m2 is the top byte of an f16: an independent decode.
    const float via_f16 = f16_bits_to_float(static_cast<uint16_t>(c << 8));
    if (mag > 0x7cu) {
      EXPECT_TRUE(std::isnan(v)) << c;
      EXPECT_TRUE(std::isnan(via_f16)) << c;
      EXPECT_EQ(float_to_fp8_e5m2(v) & 0x7fu, 0x7fu) << c;  // NaN -> NaN
      continue;
    }
    EXPECT_EQ(to_bits(v), to_bits(via_f16)) << c;
    if (mag == 0x7cu) {
      EXPECT_TRUE(std::isinf(v));
      EXPECT_EQ(float_to_fp8_e5m2(v), (c & 0x80u) | 0x7bu);  // inf saturates
      continue;
    }
    EXPECT_EQ(static_cast<double>(std::fabs(v)), e5m2_value(mag)) << c;
    EXPECT_EQ(float_to_fp8_e5m2(v), c) << c;
  }
}

TEST(Fp8E5M2, TiesSaturationNaN) {
  EXPECT_EQ(float_to_fp8_e5m2(1.125f), 0x3c);  // 1 | 1.25 -> even
  EXPECT_EQ(float_to_fp8_e5m2(1.375f), 0x3e);  // 1.25 | 1.5 -> even
  EXPECT_EQ(float_to_fp8_e5m2(std::ldexp(1.0f, -17)), 0x00);
  EXPECT_EQ(float_to_fp8_e5m2(std::ldexp(3.0f, -17)), 0x02);
  for (float x : {57345.0f, 61440.0f, 65536.0f, 1e9f, kInf}) {
    EXPECT_EQ(float_to_fp8_e5m2(x), 0x7b) << x;
    EXPECT_EQ(float_to_fp8_e5m2(-x), 0xfb) << x;
  }
  EXPECT_TRUE(std::isnan(fp8_e5m2_to_float(float_to_fp8_e5m2(kNaN))));
  EXPECT_TRUE(std::isnan(fp8_e5m2_to_float(float_to_fp8_e5m2(-kNaN))));
}

TEST(Fp8E5M2, RandomAgainstBruteForce) {
  for (float x : random_values(57344.0, 50000, kRandomSeed + 1)) {
    const uint32_t mag = brute_force_nearest(std::fabs(static_cast<double>(x)), 0x7bu, e5m2_value);
    const uint32_t want = mag | (std::signbit(x) ? 0x80u : 0u);
    ASSERT_EQ(float_to_fp8_e5m2(x), want) << "x=" << x;
  }
}

// ---- fp4 e2m1 ----

constexpr double kFp4Values[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

double fp4_value(uint32_t magnitude_code) { return kFp4Values[magnitude_code]; }

TEST(Fp4E2M1, AllCodes) {
  for (uint32_t c = 0; c < 16; ++c) {
    const float v = fp4_e2m1_to_float(static_cast<uint8_t>(c));
    EXPECT_EQ(static_cast<double>(std::fabs(v)), kFp4Values[c & 7u]) << c;
    EXPECT_EQ(std::signbit(v), (c & 8u) != 0) << c;
    EXPECT_EQ(float_to_fp4_e2m1(v), c) << c;
  }
  EXPECT_EQ(float_to_fp4_e2m1(0.5f), 1);
  EXPECT_EQ(float_to_fp4_e2m1(-6.0f), 0xf);
}

TEST(Fp4E2M1, TiesSaturationNaN) {
  EXPECT_EQ(float_to_fp4_e2m1(0.25f), 0);  // 0 | 0.5 -> code 0
  EXPECT_EQ(float_to_fp4_e2m1(0.75f), 2);  // 0.5 | 1 -> code 2
  EXPECT_EQ(float_to_fp4_e2m1(1.25f), 2);  // 1 | 1.5 -> code 2
  EXPECT_EQ(float_to_fp4_e2m1(1.75f), 4);  // 1.5 | 2 -> code 4
  EXPECT_EQ(float_to_fp4_e2m1(2.5f), 4);   // 2 | 3 -> code 4
  EXPECT_EQ(float_to_fp4_e2m1(3.5f), 6);   // 3 | 4 -> code 6
  EXPECT_EQ(float_to_fp4_e2m1(5.0f), 6);   // 4 | 6 -> code 6
  EXPECT_EQ(float_to_fp4_e2m1(5.01f), 7);
  EXPECT_EQ(float_to_fp4_e2m1(-2.5f), 0xc);
  for (float x : {6.5f, 7.0f, 100.0f, kInf}) {
    EXPECT_EQ(float_to_fp4_e2m1(x), 7) << x;
    EXPECT_EQ(float_to_fp4_e2m1(-x), 0xf) << x;
  }
  EXPECT_EQ(float_to_fp4_e2m1(kNaN), 7);
  EXPECT_EQ(float_to_fp4_e2m1(-kNaN), 7);
}

TEST(Fp4E2M1, RandomAgainstBruteForce) {
  for (float x : random_values(6.0, 20000, kRandomSeed + 2)) {
    const uint32_t mag = brute_force_nearest(std::fabs(static_cast<double>(x)), 7u, fp4_value);
    const uint32_t want = mag | (std::signbit(x) ? 8u : 0u);
    ASSERT_EQ(float_to_fp4_e2m1(x), want) << "x=" << x;
  }
}

// ---- load / store ----

float quantize(DType dtype, float x) {
  switch (dtype) {
    case DType::kF32:
      return x;
    case DType::kF16:
      return f16_bits_to_float(float_to_f16_bits(x));
    case DType::kBF16:
      return bf16_bits_to_float(float_to_bf16_bits(x));
    case DType::kFP8E4M3:
      return fp8_e4m3_to_float(float_to_fp8_e4m3(x));
    case DType::kFP8E5M2:
      return fp8_e5m2_to_float(float_to_fp8_e5m2(x));
    case DType::kFP4E2M1:
      return fp4_e2m1_to_float(float_to_fp4_e2m1(x));
    default:
      return kNaN;
  }
}

TEST(LoadStore, FloatDTypesMatchScalarConversions) {
  constexpr int kCount = 37;  // odd, so fp4 ends mid-byte
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kFP8E4M3, DType::kFP8E5M2,
                      DType::kFP4E2M1}) {
    std::vector<float> values = random_values(4.0, kCount, kRandomSeed + 3);
    const auto bytes = static_cast<size_t>(dtype_storage_bytes(dtype, kCount));
    std::vector<unsigned char> buffer(bytes + 1, 0xa5);  // poison + canary byte
    for (int i = 0; i < kCount; ++i) store_from_float(buffer.data(), dtype, i, values[i]);
    for (int i = 0; i < kCount; ++i) {
      const float got = load_as_float(buffer.data(), dtype, i);
      EXPECT_EQ(to_bits(got), to_bits(quantize(dtype, values[i])))
          << dtype_name(dtype) << " i=" << i << " x=" << values[i];
    }
    EXPECT_EQ(buffer[bytes], 0xa5) << dtype_name(dtype) << " wrote past the end";
  }
}

TEST(LoadStore, Fp4NibbleLayout) {
  unsigned char bytes[2] = {0x00, 0xff};
  store_from_float(bytes, DType::kFP4E2M1, 0, 1.0f);   // code 2 in low nibble of byte 0
  store_from_float(bytes, DType::kFP4E2M1, 1, -6.0f);  // code 0xf in high nibble of byte 0
  store_from_float(bytes, DType::kFP4E2M1, 2, 0.5f);   // code 1 in low nibble of byte 1
  EXPECT_EQ(bytes[0], 0xf2);
  EXPECT_EQ(bytes[1], 0xf1);  // high nibble of byte 1 untouched
  EXPECT_EQ(load_as_float(bytes, DType::kFP4E2M1, 1), -6.0f);
  EXPECT_EQ(load_as_float(bytes, DType::kFP4E2M1, 3), -6.0f);
  store_from_float(bytes, DType::kFP4E2M1, 1, 3.0f);  // overwrite high nibble only
  EXPECT_EQ(bytes[0], 0x52);
}

TEST(LoadStore, IntegerDTypes) {
  int32_t i32[2] = {0, 0};
  store_from_float(i32, DType::kI32, 1, -7.0f);
  EXPECT_EQ(i32[1], -7);
  EXPECT_EQ(load_as_float(i32, DType::kI32, 1), -7.0f);
  int64_t i64[1] = {0};
  store_from_float(i64, DType::kI64, 0, 1e6f);
  EXPECT_EQ(i64[0], 1000000);
  uint8_t u8[2] = {0, 0};
  store_from_float(u8, DType::kU8, 0, 300.0f);  // saturates
  store_from_float(u8, DType::kU8, 1, 12.0f);
  EXPECT_EQ(u8[0], 255);
  EXPECT_EQ(load_as_float(u8, DType::kU8, 1), 12.0f);
}

}  // namespace
}  // namespace attnkit
