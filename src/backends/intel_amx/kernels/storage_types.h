// Storage tags for the element types the CPU kernels read (KV cache and activations). Each tag
// names its raw element type; the ISA traits (vec_*.h) widen kWidth of them to f32 lanes.
#pragma once

#include <cstdint>

#include "core/math_constants.h"

namespace attnkit::cpu_attention {

struct StoreF32 {
  using T = float;
};
struct StoreF16 {
  using T = uint16_t;
};
struct StoreBf16 {
  using T = uint16_t;
};
struct StoreFp8E4M3 {
  using T = uint8_t;
};
struct StoreFp8E5M2 {
  using T = uint8_t;
};

using attnkit::kLn2;
using attnkit::kLog2e;
// exp2 of arguments below this is 0 to f32 precision (the smallest normal is 2^-126).
inline constexpr float kExp2Floor = -126.f;

// Coefficients of 2^f = sum c_i f^i on |f| <= 1/2: ln(2)^i / i! (relative error < 2e-7).
inline constexpr float kExp2C1 = 0.69314718f;
inline constexpr float kExp2C2 = 0.24022651f;
inline constexpr float kExp2C3 = 0.05550411f;
inline constexpr float kExp2C4 = 0.00961813f;
inline constexpr float kExp2C5 = 0.00133336f;
inline constexpr float kExp2C6 = 0.00015404f;

// fp8 -> fp16 bit moves: e5m2 is the top byte of an fp16; e4m3 keeps its sign in bit 15 and puts
// exponent+mantissa at bits 7..13 (an fp16 2^8 times too small, see kFp8E4M3ViaF16Scale).
inline constexpr int kFp8E5M2ToF16Shift = 8;
inline constexpr int kFp8E4M3ToF16Shift = 7;
inline constexpr int kFp8SignToF16Shift = 8;
inline constexpr uint16_t kFp8SignMask = 0x80;
inline constexpr uint16_t kFp8E4M3MagnitudeMask = 0x7F;
// e4m3 (OCP e4m3fn) has no infinities: the magnitude code 0x7F is NaN. The bit moves alone would
// widen it to 480 (times the 2^-8 of the move), so every widening maps it to an f16 / bf16 NaN.
inline constexpr uint16_t kFp8E4M3NanMagnitude = 0x7F;
inline constexpr uint16_t kF16QuietNan = 0x7E00;
// The fp16 bits an e4m3 byte moves to (sign bit 15, magnitude bits 7..13: kFp8E4M3ToF16Shift):
// all of them set is the NaN code's image with its sign.
inline constexpr uint16_t kF16SignBit = 0x8000;
inline constexpr uint16_t kFp8E4M3F16Bits =
    kF16SignBit | (kFp8E4M3MagnitudeMask << kFp8E4M3ToF16Shift);
inline constexpr uint16_t kBf16QuietNan = 0x7FC0;
inline constexpr int kBf16ToF32Shift = 16;

}  // namespace attnkit::cpu_attention
