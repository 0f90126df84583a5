// AVX-512 + AVX512-BF16 (vdpbf16ps) instantiation of the vector attention kernels. The ISA is
// enabled for the code below the pragma only; the exported entry points sit after it and just call
// in, so the library needs no -march flag and runs on any x86-64 CPU (the backend calls these only
// when cpuid and the OS report AVX-512 F/BW/VL and AVX512-BF16).
// GCC 12's AVX-512 headers start some intrinsics from _mm512_undefined_*(), which -Wuninitialized
// reports at every inlined use; the header lines are exempted, nothing else.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#ifdef ATTNKIT_WITH_OPENMP
#include <omp.h>
#endif

#include "backends/intel_amx/kernels/cpu_attention_params.h"
#include "backends/intel_amx/kernels/storage_types.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")
#include "backends/intel_amx/kernels/vec_avx512.h"
#include "backends/intel_amx/kernels/vector_attention_impl.h"

namespace attnkit::cpu_attention {
namespace {

// AVX-512 plus the bf16 pair dot product: q.k of bf16 rows 32 elements per instruction, and
// P.V two keys per instruction (V rows interleaved in pairs, P rounded to bf16 pairs). fp8_e4m3
// K/V rows are widened to bf16 by bit moves (exact: every e4m3 value is a bf16 value), so fp8
// runs the same dot products on half the bytes.
struct VecAvx512Bf16 : VecAvx512 {
  static constexpr bool kHasBf16Dot = true;
  static constexpr int kBf16PerDot = 32;

  static __m512bh as_bh(__m512i x) { return reinterpret_cast<__m512bh>(x); }

  // fp8_e4m3 bytes (the low byte of each 16-bit word; high bytes zero) -> bf16 bits of the value
  // times 2^-8 (the kFp8E4M3ViaF16Scale convention of the f16 path, so the scales are shared).
  // Normal numbers (exponent field e > 0): bf16 exponent e + 127 - 7 - 8 = e + 112 is a constant
  // OR (no carry: the fp8 fields land on bits 4..10, 112 << 7 on bits 11..13); the 8 subnormals
  // (e = 0) come from a table.
  static __m512i fp8e4m3_words_to_bf16(__m512i w) {
    constexpr int kAandBorC = 0xEA;  // ternary-logic truth table of (a & b) | c
    constexpr int kAorBandC = 0xF8;  // a | (b & c)
    constexpr int16_t kBf16Exponent112 = 0x3800;
    constexpr int16_t kFieldsAt4 = 0x07F0;  // e4m3 exponent + mantissa after << 4
    constexpr int16_t kExponentBits = 0x78;
    constexpr int16_t kBf16Sign = static_cast<int16_t>(0x8000);
    // bf16 of m * 2^-9 * 2^-8 for the subnormal mantissas m = 0..7 (the rest unused).
    alignas(64) static constexpr uint16_t kSubnormals[32] = {0x0000, 0x3700, 0x3780, 0x37C0,
                                                             0x3800, 0x3820, 0x3840, 0x3860};
    const __m512i normal =
        _mm512_ternarylogic_epi32(_mm512_slli_epi16(w, 4), _mm512_set1_epi16(kFieldsAt4),
                                  _mm512_set1_epi16(kBf16Exponent112), kAandBorC);
    const __mmask32 subnormal = _mm512_testn_epi16_mask(w, _mm512_set1_epi16(kExponentBits));
    const __m512i magnitude =
        _mm512_mask_permutexvar_epi16(normal, subnormal, w, _mm512_load_si512(kSubnormals));
    return _mm512_ternarylogic_epi32(magnitude, _mm512_slli_epi16(w, kFp8SignToF16Shift),
                                     _mm512_set1_epi16(kBf16Sign), kAorBandC);
  }

  // 32 consecutive K elements as bf16 pairs.
  template <class S>
  static __m512bh load_k_pairs(const typename S::T* p) {
    if constexpr (std::is_same_v<S, StoreBf16>) {
      return as_bh(_mm512_loadu_si512(p));
    } else {
      static_assert(std::is_same_v<S, StoreFp8E4M3>);
      return as_bh(fp8e4m3_words_to_bf16(
          _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))));
    }
  }
  // 16 K elements (the tail of a head dim that is a multiple of 16 but not of 32), zero-extended.
  template <class S>
  static __m512bh load_k_half(const typename S::T* p) {
    if constexpr (std::is_same_v<S, StoreBf16>) {
      return as_bh(_mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
    } else {
      static_assert(std::is_same_v<S, StoreFp8E4M3>);
      return as_bh(fp8e4m3_words_to_bf16(_mm512_cvtepu8_epi16(
          _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))))));
    }
  }
  // 16 columns of two V rows as bf16 pairs (row0[i], row1[i]).
  template <class S>
  static __m512bh load_v_pairs(const typename S::T* row0, const typename S::T* row1) {
    constexpr int kHighWord = 16;
    if constexpr (std::is_same_v<S, StoreBf16>) {
      const __m512i a =
          _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row0)));
      const __m512i b =
          _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row1)));
      return as_bh(_mm512_or_si512(a, _mm512_slli_epi32(b, kHighWord)));
    } else {
      static_assert(std::is_same_v<S, StoreFp8E4M3>);
      const __m512i a =
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row0)));
      const __m512i b =
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row1)));
      return as_bh(fp8e4m3_words_to_bf16(_mm512_or_si512(a, _mm512_slli_epi32(b, kHighWord))));
    }
  }
  // 16 f32 probabilities -> 8 bf16 pairs (round to nearest even).
  static void store_bf16_pairs(float const* p, uint32_t* out) {
    const __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(p));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), reinterpret_cast<const __m256i&>(h));
  }
  static __m512 dot_bf16(__m512 acc, __m512bh a, __m512bh b) { return _mm512_dpbf16_ps(acc, a, b); }
  static __m512bh broadcast_pair(uint32_t pair) {
    return as_bh(_mm512_set1_epi32(static_cast<int>(pair)));
  }
};

void decode_entry(const CpuAttentionParams& p, const DecodeWork& w, const ThreadScratch& s) {
  dispatch_kv<VecAvx512Bf16, DecodeRunner>(p, w, s);
}

void extend_entry(const CpuAttentionParams& p, const ExtendWork& w, const ThreadScratch& s) {
  dispatch_kv<VecAvx512Bf16, ExtendRunner>(p, w, s);
}

}  // namespace
}  // namespace attnkit::cpu_attention
#pragma GCC pop_options

namespace attnkit::cpu_attention {

void decode_avx512_bf16(const CpuAttentionParams& p, const DecodeWork& w, const ThreadScratch& s) {
  decode_entry(p, w, s);
}

void extend_avx512_bf16(const CpuAttentionParams& p, const ExtendWork& w, const ThreadScratch& s) {
  extend_entry(p, w, s);
}

}  // namespace attnkit::cpu_attention
