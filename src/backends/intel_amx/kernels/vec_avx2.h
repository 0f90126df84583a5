// AVX2 + FMA + F16C traits for the vector attention kernels. Include only from a translation unit
// compiled with those features enabled (see kernels_avx2.cpp).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "backends/intel_amx/kernels/storage_types.h"

namespace attnkit::cpu_attention {
namespace {

struct VecAvx2 {
  using F = __m256;
  static constexpr int kWidth = 8;
  static constexpr bool kHasBf16Dot = false;

  static F zero() { return _mm256_setzero_ps(); }
  static F set1(float x) { return _mm256_set1_ps(x); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F x) { _mm256_storeu_ps(p, x); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F max(F a, F b) { return _mm256_max_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static float reduce_add(F x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // out[t] = the sum of the 8 lanes of v[t] for t < 16 (one key block's q.k partial vectors), by
  // two 8-vector hadd trees: 21 operations per 8 keys instead of 6 per key.
  static void reduce_add_16(const F* v, float* out) {
    constexpr int kLowLanes = 0x20;   // 128-bit lanes (a0, b0)
    constexpr int kHighLanes = 0x31;  // 128-bit lanes (a1, b1)
    for (int h = 0; h < 2; ++h) {
      const F* w = v + 8 * h;
      // s0123: elements 0-3 the sums of lanes 0-3 of w[0..3], elements 4-7 those of lanes 4-7.
      const F s0123 = _mm256_hadd_ps(_mm256_hadd_ps(w[0], w[1]), _mm256_hadd_ps(w[2], w[3]));
      const F s4567 = _mm256_hadd_ps(_mm256_hadd_ps(w[4], w[5]), _mm256_hadd_ps(w[6], w[7]));
      store(out + 8 * h, add(_mm256_permute2f128_ps(s0123, s4567, kLowLanes),
                             _mm256_permute2f128_ps(s0123, s4567, kHighLanes)));
    }
  }
  static float reduce_max(F x) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }

  // 2^x; x < kExp2Floor (including -inf) gives 0, NaN gives NaN (a NaN score poisons its row,
  // as in the reference): the compare is true for unordered lanes and vmaxps / vminps return their
  // second operand when either is NaN.
  static F exp2(F x) {
    constexpr float kExp2Ceil = 127.f;
    constexpr int kF32ExponentBias = 127;
    constexpr int kF32MantissaBits = 23;
    const F live = _mm256_cmp_ps(x, set1(kExp2Floor), _CMP_NLT_UQ);
    x = _mm256_min_ps(set1(kExp2Ceil), _mm256_max_ps(set1(kExp2Floor), x));
    const F n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const F f = sub(x, n);
    F p = fma(set1(kExp2C6), f, set1(kExp2C5));
    p = fma(p, f, set1(kExp2C4));
    p = fma(p, f, set1(kExp2C3));
    p = fma(p, f, set1(kExp2C2));
    p = fma(p, f, set1(kExp2C1));
    p = fma(p, f, set1(1.f));
    const __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(kF32ExponentBias)),
        kF32MantissaBits);
    return _mm256_and_ps(live, mul(p, _mm256_castsi256_ps(e)));
  }

  // As VecAvx512::tanh, the small-|y| series included (tanh(NaN) is NaN).
  static F tanh(F y) {
    constexpr float kTanhSaturation = 40.f;
    constexpr float kTanhSeriesBelow = 0.125f;
    const F sign = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u)));
    const F a = _mm256_andnot_ps(sign, y);
    const F e = exp2(_mm256_min_ps(set1(kTanhSaturation), mul(a, set1(2.f * kLog2e))));
    const F large = sub(set1(1.f), _mm256_div_ps(set1(2.f), add(e, set1(1.f))));
    const F a2 = mul(a, a);
    F p = add(set1(2.f / 15.f), mul(a2, set1(-17.f / 315.f)));
    p = add(set1(-1.f / 3.f), mul(a2, p));
    p = add(set1(1.f), mul(a2, p));
    const F t =
        _mm256_blendv_ps(large, mul(a, p), _mm256_cmp_ps(a, set1(kTanhSeriesBelow), _CMP_LT_OQ));
    return _mm256_or_ps(t, _mm256_and_ps(sign, y));
  }

  template <class S>
  static F load_as(const typename S::T* p) {
    if constexpr (std::is_same_v<S, StoreF32>) {
      return _mm256_loadu_ps(p);
    } else if constexpr (std::is_same_v<S, StoreBf16>) {
      const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      return _mm256_castsi256_ps(_mm256_slli_epi32(w, kBf16ToF32Shift));
    } else if constexpr (std::is_same_v<S, StoreF16>) {
      return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    } else {
      const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
      __m128i h;
      if constexpr (std::is_same_v<S, StoreFp8E5M2>) {
        h = _mm_slli_epi16(_mm_cvtepu8_epi16(raw), kFp8E5M2ToF16Shift);
      } else {
        // The bytes sign-extended to 16 bits and shifted by kFp8E4M3ToF16Shift: the sign lands
        // on bit 15 (and, from the byte's bit 7, on bit 14, which the mask clears), the magnitude
        // on bits 7..13: an fp16 2^8 times too small, as kFp8E4M3ViaF16Scale says. Three
        // operations where separate sign and magnitude moves take five.
        const __m128i h0 = _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(raw), kFp8E4M3ToF16Shift),
                                         _mm_set1_epi16(static_cast<int16_t>(kFp8E4M3F16Bits)));
        // The NaN codes (magnitude 0x7F, either sign) are the words that read kFp8E4M3F16Bits
        // with the sign set; the compare mask (all ones) is itself an f16 NaN: OR-ed in as it is.
        const __m128i nan =
            _mm_cmpeq_epi16(_mm_or_si128(h0, _mm_set1_epi16(static_cast<int16_t>(kF16SignBit))),
                            _mm_set1_epi16(static_cast<int16_t>(kFp8E4M3F16Bits)));
        h = _mm_or_si128(h0, nan);
      }
      return _mm256_cvtph_ps(h);
    }
  }
};

}  // namespace
}  // namespace attnkit::cpu_attention
