// Portable scalar traits (one f32 lane) for the vector attention kernels: the reference-shaped
// fallback when the CPU has neither AVX2 nor AVX-512, and the path CI forces to test the algorithm
// without SIMD.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "attnkit/dtype.h"
#include "backends/intel_amx/kernels/storage_types.h"

namespace attnkit::cpu_attention {
namespace {

struct VecScalar {
  using F = float;
  static constexpr int kWidth = 1;
  static constexpr bool kHasBf16Dot = false;

  static F zero() { return 0.f; }
  static F set1(float x) { return x; }
  static F load(const float* p) { return *p; }
  static void store(float* p, F x) { *p = x; }
  static F add(F a, F b) { return a + b; }
  static F sub(F a, F b) { return a - b; }
  static F mul(F a, F b) { return a * b; }
  static F max(F a, F b) { return a > b ? a : b; }
  static F fma(F a, F b, F c) { return std::fma(a, b, c); }
  static float reduce_add(F x) { return x; }
  static float reduce_max(F x) { return x; }
  static F exp2(F x) { return x < kExp2Floor ? 0.f : std::exp2(x); }
  static F tanh(F y) { return std::tanh(y); }

  template <class S>
  static F load_as(const typename S::T* p) {
    if constexpr (std::is_same_v<S, StoreF32>) {
      return *p;
    } else if constexpr (std::is_same_v<S, StoreBf16>) {
      const uint32_t bits = static_cast<uint32_t>(*p) << kBf16ToF32Shift;
      float x;
      std::memcpy(&x, &bits, sizeof(x));
      return x;
    } else if constexpr (std::is_same_v<S, StoreF16>) {
      return f16_bits_to_float(*p);
    } else if constexpr (std::is_same_v<S, StoreFp8E5M2>) {
      return f16_bits_to_float(static_cast<uint16_t>(*p << kFp8E5M2ToF16Shift));
    } else {
      const uint16_t sign = static_cast<uint16_t>((*p & kFp8SignMask) << kFp8SignToF16Shift);
      const uint16_t code = *p & kFp8E4M3MagnitudeMask;
      const uint16_t mag = code == kFp8E4M3NanMagnitude
                               ? kF16QuietNan
                               : static_cast<uint16_t>(code << kFp8E4M3ToF16Shift);
      return f16_bits_to_float(static_cast<uint16_t>(sign | mag));
    }
  }
};

}  // namespace
}  // namespace attnkit::cpu_attention
