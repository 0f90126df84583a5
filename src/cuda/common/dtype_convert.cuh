// Device-side element conversions for bf16 / f16 / f32 / fp8 (e4m3, e5m2) / fp4 (e2m1).
//
// Every loader reads 8 consecutive elements (one 16-byte vector of bf16/f16, 8 bytes of fp8,
// 4 bytes of fp4) and produces floats, so a kernel's thread mapping does not depend on the storage
// dtype. Quantisation helpers match the host conversions in src/core/dtype.cpp bit for bit
// (round-to-nearest-even, saturating fp8/fp4, NaN preserved for fp8).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attnkit/dtype.h"

namespace attnkit::cuda {

inline constexpr int kVecElems = 8;  // elements per vector access, for every dtype

// ---- scalar conversions ----
template <typename T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ float to_float<__half>(__half x) {
  return __half2float(x);
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

__device__ __forceinline__ float fp8_e4m3_to_float(uint8_t bits) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(bits, __NV_E4M3);
  return __half2float(__half(h));
}
__device__ __forceinline__ float fp8_e5m2_to_float(uint8_t bits) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(bits, __NV_E5M2);
  return __half2float(__half(h));
}
// Saturating round-to-nearest-even; NaN -> NaN (0x7f with the input's sign bit cleared).
__device__ __forceinline__ uint8_t float_to_fp8_e4m3(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}
__device__ __forceinline__ uint8_t float_to_fp8_e5m2(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2));
}

// e2m1 magnitudes by 3-bit code.
__device__ __forceinline__ float fp4_e2m1_to_float(uint32_t code) {
  constexpr float kMagnitudes[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  constexpr uint32_t kSignBit = 0x8u;
  constexpr uint32_t kMagnitudeMask = 0x7u;
  const float m = kMagnitudes[code & kMagnitudeMask];
  return (code & kSignBit) ? -m : m;
}
// Round-to-nearest-even onto {0, 0.5, 1, 1.5, 2, 3, 4, 6}, saturating at 6; NaN -> +6.
// The thresholds are the midpoints between neighbouring values; a tie goes to the even code.
__device__ __forceinline__ uint8_t float_to_fp4_e2m1(float x) {
  constexpr uint8_t kSignBit = 0x8u;
  constexpr uint8_t kMaxCode = 0x7u;
  if (isnan(x)) return kMaxCode;
  const float a = fabsf(x);
  uint8_t code;
  if (a <= 0.25f) {
    code = 0;
  } else if (a < 0.75f) {
    code = 1;
  } else if (a <= 1.25f) {
    code = 2;
  } else if (a < 1.75f) {
    code = 3;
  } else if (a <= 2.5f) {
    code = 4;
  } else if (a < 3.5f) {
    code = 5;
  } else if (a <= 5.f) {
    code = 6;
  } else {
    code = kMaxCode;
  }
  return static_cast<uint8_t>(code | (signbit(x) ? kSignBit : 0));
}

// ---- fp8 -> f16x2 words (MMA operands; exact) ----
// Two fp8 values (the low 16 bits of x) -> one f16x2 word.
template <DType kFp8>
__device__ __forceinline__ uint32_t fp8x2_to_f16x2(uint32_t x) {
  constexpr __nv_fp8_interpretation_t kInterp = kFp8 == DType::kFP8E4M3 ? __NV_E4M3 : __NV_E5M2;
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(x), kInterp);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

// Four fp8 values (x, lowest byte first) -> f16x2 of bytes 0-1 (lo) and of bytes 2-3 (hi).
// kPaired (SM89+): two cvt.rn.f16x2.{e4m3,e5m2}x2 of the word's halves, the high half read in
// place (ptxas makes it an operand selector, no shift); elsewhere, and with kPaired false, one
// conversion of the low 16 bits and one of x >> 16. The same bits either way.
template <DType kFp8, bool kPaired = true>
__device__ __forceinline__ void fp8x4_to_f16x2x2(uint32_t x, uint32_t& lo, uint32_t& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if constexpr (kPaired) {
    if constexpr (kFp8 == DType::kFP8E4M3) {
      asm("{.reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n"
          " cvt.rn.f16x2.e4m3x2 %1, h;}\n"
          : "=r"(lo), "=r"(hi)
          : "r"(x));
    } else {
      asm("{.reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e5m2x2 %0, l;\n"
          " cvt.rn.f16x2.e5m2x2 %1, h;}\n"
          : "=r"(lo), "=r"(hi)
          : "r"(x));
    }
    return;
  }
#endif
  lo = fp8x2_to_f16x2<kFp8>(x);
  hi = fp8x2_to_f16x2<kFp8>(x >> 16);
}

// ---- 8-element vector loads ----
__device__ __forceinline__ void unpack_bf16x8(uint4 raw, float (&out)[kVecElems]) {
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < kVecElems / 2; ++i) {
    const float2 f = __bfloat1622float2(p[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}
__device__ __forceinline__ void unpack_f16x8(uint4 raw, float (&out)[kVecElems]) {
  const __half2* p = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
  for (int i = 0; i < kVecElems / 2; ++i) {
    const float2 f = __half22float2(p[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

// Storage traits of one dtype: how 8 elements starting at element `e` of a row are fetched.
// `Raw` is the register image of those 8 elements, so loads can be issued ahead of their use.
template <DType kDType>
struct ElemTraits;

template <>
struct ElemTraits<DType::kBF16> {
  using Storage = __nv_bfloat16;
  using Raw = uint4;
  static constexpr bool kQuantized = false;
  __device__ __forceinline__ static Raw load(const void* row, int e) {
    return __ldg(reinterpret_cast<const uint4*>(static_cast<const Storage*>(row) + e));
  }
  __device__ __forceinline__ static void convert(const Raw& raw, const uint8_t*, int,
                                                 float (&out)[kVecElems]) {
    unpack_bf16x8(raw, out);
  }
};

template <>
struct ElemTraits<DType::kF16> {
  using Storage = __half;
  using Raw = uint4;
  static constexpr bool kQuantized = false;
  __device__ __forceinline__ static Raw load(const void* row, int e) {
    return __ldg(reinterpret_cast<const uint4*>(static_cast<const Storage*>(row) + e));
  }
  __device__ __forceinline__ static void convert(const Raw& raw, const uint8_t*, int,
                                                 float (&out)[kVecElems]) {
    unpack_f16x8(raw, out);
  }
};

template <>
struct ElemTraits<DType::kF32> {
  using Storage = float;
  struct Raw {
    float4 lo, hi;
  };
  static constexpr bool kQuantized = false;
  __device__ __forceinline__ static Raw load(const void* row, int e) {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(row) + e);
    return {__ldg(p), __ldg(p + 1)};
  }
  __device__ __forceinline__ static void convert(const Raw& raw, const uint8_t*, int,
                                                 float (&out)[kVecElems]) {
    out[0] = raw.lo.x, out[1] = raw.lo.y, out[2] = raw.lo.z, out[3] = raw.lo.w;
    out[4] = raw.hi.x, out[5] = raw.hi.y, out[6] = raw.hi.z, out[7] = raw.hi.w;
  }
};

template <DType kFp8>
struct Fp8ElemTraits {
  using Storage = uint8_t;
  using Raw = uint2;
  static constexpr bool kQuantized = true;
  __device__ __forceinline__ static Raw load(const void* row, int e) {
    return __ldg(reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(row) + e));
  }
  __device__ __forceinline__ static void convert(const Raw& raw, const uint8_t*, int,
                                                 float (&out)[kVecElems]) {
    const uint8_t* b = reinterpret_cast<const uint8_t*>(&raw);
#pragma unroll
    for (int i = 0; i < kVecElems; ++i) {
      out[i] = kFp8 == DType::kFP8E4M3 ? fp8_e4m3_to_float(b[i]) : fp8_e5m2_to_float(b[i]);
    }
  }
};
template <>
struct ElemTraits<DType::kFP8E4M3> : Fp8ElemTraits<DType::kFP8E4M3> {};
template <>
struct ElemTraits<DType::kFP8E5M2> : Fp8ElemTraits<DType::kFP8E5M2> {};

// fp4: two codes per byte (low nibble = even element), one fp8_e4m3 block scale per 16 elements.
// `scales` is the row's scale array ([D / 16] bytes); 8 elements share one block scale.
template <>
struct ElemTraits<DType::kFP4E2M1> {
  using Storage = uint8_t;
  using Raw = uint32_t;
  static constexpr bool kQuantized = true;
  __device__ __forceinline__ static Raw load(const void* row, int e) {
    return __ldg(reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(row) + e / 2));
  }
  __device__ __forceinline__ static void convert(const Raw& raw, const uint8_t* scales, int e,
                                                 float (&out)[kVecElems]) {
    constexpr int kNibbleBits = 4;
    const float block = fp8_e4m3_to_float(scales[e / kFp4GroupSize]);
#pragma unroll
    for (int i = 0; i < kVecElems; ++i)
      out[i] = fp4_e2m1_to_float(raw >> (kNibbleBits * i)) * block;
  }
};

// ---- 8-element vector stores of activations ----
template <typename T>
__device__ __forceinline__ void store8(T* dst, const float (&v)[kVecElems]);
template <>
__device__ __forceinline__ void store8<__nv_bfloat16>(__nv_bfloat16* dst,
                                                      const float (&v)[kVecElems]) {
  uint4 raw;
  __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < kVecElems / 2; ++i) p[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
  *reinterpret_cast<uint4*>(dst) = raw;
}
template <>
__device__ __forceinline__ void store8<__half>(__half* dst, const float (&v)[kVecElems]) {
  uint4 raw;
  __half2* p = reinterpret_cast<__half2*>(&raw);
#pragma unroll
  for (int i = 0; i < kVecElems / 2; ++i) p[i] = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
  *reinterpret_cast<uint4*>(dst) = raw;
}
template <>
__device__ __forceinline__ void store8<float>(float* dst, const float (&v)[kVecElems]) {
  float4* p = reinterpret_cast<float4*>(dst);
  p[0] = make_float4(v[0], v[1], v[2], v[3]);
  p[1] = make_float4(v[4], v[5], v[6], v[7]);
}

// Activation dtype -> CUDA type.
template <DType kDType>
struct ActivationType;
template <>
struct ActivationType<DType::kBF16> {
  using type = __nv_bfloat16;
};
template <>
struct ActivationType<DType::kF16> {
  using type = __half;
};
template <>
struct ActivationType<DType::kF32> {
  using type = float;
};

}  // namespace attnkit::cuda
