// AVX-512 (F/BW/VL + F16C) traits for the vector attention kernels. Include only from a
// translation unit compiled with those features enabled (see kernels_avx512.cpp).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "backends/intel_amx/kernels/storage_types.h"

namespace attnkit::cpu_attention {
namespace {

struct VecAvx512 {
  using F = __m512;
  static constexpr int kWidth = 16;
  static constexpr bool kHasBf16Dot = false;

  static F zero() { return _mm512_setzero_ps(); }
  static F set1(float x) { return _mm512_set1_ps(x); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F x) { _mm512_storeu_ps(p, x); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static float reduce_add(F x) { return _mm512_reduce_add_ps(x); }
  static float reduce_max(F x) { return _mm512_reduce_max_ps(x); }

  // out[i] = sum of the lanes of v[i] for 16 vectors: a transpose-and-add tree (45 shuffles and
  // adds instead of 16 horizontal reductions of ~8 each).
  static void reduce_add_16(const F* v, float* out) { store(out, reduce_add_16v(v)); }
  static F reduce_add_16v(const F* v) {
    F quad[4];
    for (int q = 0; q < 4; ++q) quad[q] = quad_sums(v + 4 * q);
    return combine_quads(quad);
  }
  // The first two levels of reduce_add_16v: per 128-bit lane L, the partial sums of w[0..3] over
  // that lane's four elements (lane L, element e holds the sum for w[e]).
  static F quad_sums(const F* w) { return quad_fold<false>(w); }
  // quad_sums with the sum (kMax: the maximum) as the fold.
  template <bool kMax>
  static F fold(F a, F b) {
    return kMax ? max(a, b) : add(a, b);
  }
  template <bool kMax>
  static F quad_fold(const F* w) {
    const F s01 = fold<kMax>(_mm512_unpacklo_ps(w[0], w[1]), _mm512_unpackhi_ps(w[0], w[1]));
    const F s23 = fold<kMax>(_mm512_unpacklo_ps(w[2], w[3]), _mm512_unpackhi_ps(w[2], w[3]));
    return fold<kMax>(_mm512_shuffle_ps(s01, s23, 0x44), _mm512_shuffle_ps(s01, s23, 0xEE));
  }
  // The last two levels: quad[q] = quad_sums of vectors 4q..4q+3 -> lane i = the sum of vector i.
  static F combine_quads(const F* quad) {
    constexpr int kEvenLanes = 0x88;  // 128-bit lanes (a0, a2, b0, b2)
    constexpr int kOddLanes = 0xDD;   // 128-bit lanes (a1, a3, b1, b3)
    const F h01 = add(_mm512_shuffle_f32x4(quad[0], quad[1], kEvenLanes),
                      _mm512_shuffle_f32x4(quad[0], quad[1], kOddLanes));
    const F h23 = add(_mm512_shuffle_f32x4(quad[2], quad[3], kEvenLanes),
                      _mm512_shuffle_f32x4(quad[2], quad[3], kOddLanes));
    return add(_mm512_shuffle_f32x4(h01, h23, kEvenLanes),
               _mm512_shuffle_f32x4(h01, h23, kOddLanes));
  }

  // 2^x; x < kExp2Floor (including -inf) gives 0, NaN gives NaN (a NaN score poisons its row,
  // as in the reference): the compare is true for unordered lanes and vmaxps returns its second
  // operand when either is NaN.
  static F exp2(F x) {
    const __mmask16 live = _mm512_cmp_ps_mask(x, set1(kExp2Floor), _CMP_NLT_UQ);
    x = _mm512_max_ps(set1(kExp2Floor), x);
    const F n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const F f = sub(x, n);
    F p = fma(set1(kExp2C6), f, set1(kExp2C5));
    p = fma(p, f, set1(kExp2C4));
    p = fma(p, f, set1(kExp2C3));
    p = fma(p, f, set1(kExp2C2));
    p = fma(p, f, set1(kExp2C1));
    p = fma(p, f, set1(1.f));
    return _mm512_maskz_scalef_ps(live, p, n);
  }

  // tanh(y) = sign(y) * (1 - 2 / (exp(2|y|) + 1)); 2|y|log2(e) is clamped where tanh is 1 in f32
  // (vminps's second operand is the NaN one: tanh(NaN) is NaN). Below |y| = 1/8 that difference
  // cancels (absolute error ~6e-8, which a large soft-cap multiplies back up): the odd Taylor
  // polynomial to y^7 takes over there (truncation < 1e-9 relative).
  static F tanh(F y) {
    constexpr float kTanhSaturation = 40.f;
    const __m512i sign_mask = _mm512_set1_epi32(static_cast<int>(0x80000000u));
    const __m512i bits = _mm512_castps_si512(y);
    const F a = _mm512_castsi512_ps(_mm512_andnot_si512(sign_mask, bits));
    const F e = exp2(_mm512_min_ps(set1(kTanhSaturation), mul(a, set1(2.f * kLog2e))));
    const F large = sub(set1(1.f), _mm512_div_ps(set1(2.f), add(e, set1(1.f))));
    const F t = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, set1(kTanhSeriesBelow), _CMP_LT_OQ),
                                     large, tanh_series(a));
    return _mm512_castsi512_ps(
        _mm512_or_si512(_mm512_castps_si512(t), _mm512_and_si512(sign_mask, bits)));
  }

  // tanh(a) = a (1 - a^2/3 + 2a^4/15 - 17a^6/315) for small a (Horner in a^2).
  static constexpr float kTanhSeriesBelow = 0.125f;
  static F tanh_series(F a) {
    const F a2 = mul(a, a);
    F p = add(set1(2.f / 15.f), mul(a2, set1(-17.f / 315.f)));
    p = add(set1(-1.f / 3.f), mul(a2, p));
    p = add(set1(1.f), mul(a2, p));
    return mul(a, p);
  }

  // Widen kWidth consecutive elements to f32.
  template <class S>
  static F load_as(const typename S::T* p) {
    if constexpr (std::is_same_v<S, StoreF32>) {
      return _mm512_loadu_ps(p);
    } else if constexpr (std::is_same_v<S, StoreBf16>) {
      const __m512i w =
          _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
      return _mm512_castsi512_ps(_mm512_slli_epi32(w, kBf16ToF32Shift));
    } else if constexpr (std::is_same_v<S, StoreF16>) {
      return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    } else {
      return _mm512_cvtph_ps(
          fp8_to_f16_bits<S>(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
    }
  }

  // kWidth fp8 bytes -> their fp16 bits (e4m3: 2^8 times too small, kFp8E4M3ViaF16Scale).
  template <class S>
  static __m256i fp8_to_f16_bits(__m128i raw) {
    if constexpr (std::is_same_v<S, StoreFp8E5M2>) {
      return _mm256_slli_epi16(_mm256_cvtepu8_epi16(raw), kFp8E5M2ToF16Shift);
    } else {
      // As VecAvx2::load_as: the bytes sign-extended to 16 bits and shifted by
      // kFp8E4M3ToF16Shift put the sign on bit 15 (and on bit 14, which the mask clears) and the
      // magnitude on bits 7..13. Three operations where separate sign and magnitude moves take
      // five.
      const __m256i h0 =
          _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(raw), kFp8E4M3ToF16Shift),
                           _mm256_set1_epi16(static_cast<int16_t>(kFp8E4M3F16Bits)));
      // The NaN codes (magnitude 0x7F, either sign) read kFp8E4M3F16Bits with the sign set; the
      // compare mask (all ones) is itself an f16 NaN: OR-ed in as it is.
      const __m256i nan = _mm256_cmpeq_epi16(
          _mm256_or_si256(h0, _mm256_set1_epi16(static_cast<int16_t>(kF16SignBit))),
          _mm256_set1_epi16(static_cast<int16_t>(kFp8E4M3F16Bits)));
      return _mm256_or_si256(h0, nan);
    }
  }
};

}  // namespace
}  // namespace attnkit::cpu_attention
