// DType names and exact host conversions between float and the narrow float formats.
//
// All narrow formats are encoded by one routine, `encode_minifloat`, parameterised by exponent and
// mantissa widths: the magnitude is scaled so that one unit equals one quantum of the target
// binade, rounded to nearest even in double (exact: a float has 24 significant bits), and the
// resulting integer is the magnitude code. A carry out of the mantissa moves naturally into the
// exponent field, and the smallest normal follows the largest subnormal the same way. Each format
// then applies its own overflow rule (inf for f16, saturation for fp8/fp4).
#include "attnkit/dtype.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

namespace attnkit {
namespace {

struct MiniFloatFormat {
  int exponent_bits;
  int mantissa_bits;
  int bias;
};

// IEEE binary16.
constexpr MiniFloatFormat kF16Format{5, 10, 15};
// OCP fp8 e4m3fn: no infinities, magnitude code 0x7f is NaN, max finite 0x7e = 448.
constexpr MiniFloatFormat kE4M3Format{4, 3, 7};
// OCP fp8 e5m2: IEEE-like, exponent field 31 is inf/NaN, max finite 0x7b = 57344.
constexpr MiniFloatFormat kE5M2Format{5, 2, 15};
// OCP fp4 e2m1: no inf/NaN, max 0x7 = 6.
constexpr MiniFloatFormat kE2M1Format{2, 1, 1};

constexpr uint32_t kF32SignMask = 0x80000000u;
constexpr uint32_t kF32AbsMask = 0x7fffffffu;
constexpr uint32_t kF32ExponentMask = 0x7f800000u;
constexpr uint32_t kF32QuietBit = 0x00400000u;

constexpr uint16_t kF16SignMask = 0x8000u;
constexpr uint16_t kF16InfBits = 0x7c00u;
constexpr uint16_t kF16MaxFiniteBits = 0x7bffu;
constexpr uint16_t kF16QuietBit = 0x0200u;
constexpr uint16_t kF16MantissaMask = 0x03ffu;
// Mantissa bits dropped going from f32 (23) to f16 (10).
constexpr int kF32ToF16MantissaShift = 13;

constexpr uint16_t kBf16QuietBit = 0x0040u;
constexpr int kBf16Shift = 16;
constexpr uint32_t kBf16RoundingBias = 0x7fffu;

constexpr uint8_t kFp8SignMask = 0x80u;
constexpr uint8_t kFp8AbsMask = 0x7fu;
constexpr uint8_t kE4M3NaNBits = 0x7fu;
constexpr uint8_t kE4M3MaxFiniteBits = 0x7eu;
constexpr uint8_t kE5M2NaNBits = 0x7fu;
constexpr uint8_t kE5M2MaxFiniteBits = 0x7bu;
constexpr uint8_t kE5M2ExponentMask = 0x7cu;

constexpr uint8_t kFp4SignMask = 0x8u;
constexpr uint8_t kFp4AbsMask = 0x7u;
constexpr uint8_t kFp4MaxFiniteCode = 0x7u;
constexpr uint8_t kNibbleMask = 0xfu;
constexpr int kBitsPerByte = 8;
constexpr int kNibbleBits = 4;

uint32_t float_bits(float x) { return std::bit_cast<uint32_t>(x); }
float bits_float(uint32_t b) { return std::bit_cast<float>(b); }

// Round a non-negative double with at most ~60 significant bits to the nearest integer, ties to
// even. Independent of the floating-point environment's rounding mode.
int64_t round_half_even(double v) {
  const double floor_v = std::floor(v);
  const double frac = v - floor_v;
  auto r = static_cast<int64_t>(floor_v);
  if (frac > 0.5 || (frac == 0.5 && (r & 1) != 0)) ++r;
  return r;
}

// Magnitude code (sign excluded) of finite |x| rounded to nearest even in `fmt`, without any
// overflow handling: the result may exceed the format's largest finite code.
int64_t encode_minifloat(float magnitude, MiniFloatFormat fmt) {
  if (magnitude == 0.0f) return 0;
  const int min_normal_exponent = 1 - fmt.bias;
  int exponent = min_normal_exponent;  // subnormals share the smallest normal binade's quantum
  int frexp_exponent = 0;
  std::frexp(static_cast<double>(magnitude), &frexp_exponent);  // magnitude = m * 2^e, m in [.5, 1)
  const int unbiased = frexp_exponent - 1;
  if (unbiased > exponent) exponent = unbiased;
  // One unit of `scaled` is one mantissa ulp of the binade `exponent`.
  const double scaled = std::ldexp(static_cast<double>(magnitude), fmt.mantissa_bits - exponent);
  const int64_t rounded = round_half_even(scaled);
  if (exponent == min_normal_exponent) return rounded;  // subnormal, or carries into code 1.0
  // Normal: significand in [2^m, 2^(m+1)]; the implicit one moves into the exponent field.
  const int64_t implicit_one = int64_t{1} << fmt.mantissa_bits;
  return ((static_cast<int64_t>(exponent + fmt.bias)) << fmt.mantissa_bits) + rounded -
         implicit_one;
}

// Value of a magnitude code in `fmt` (caller handles inf/NaN codes).
float decode_minifloat(uint32_t code, MiniFloatFormat fmt) {
  const uint32_t mantissa_mask = (1u << fmt.mantissa_bits) - 1u;
  const uint32_t exponent_field = code >> fmt.mantissa_bits;
  const uint32_t mantissa = code & mantissa_mask;
  const int min_normal_exponent = 1 - fmt.bias;
  if (exponent_field == 0) {
    return static_cast<float>(
        std::ldexp(static_cast<double>(mantissa), min_normal_exponent - fmt.mantissa_bits));
  }
  const double significand = static_cast<double>(mantissa | (1u << fmt.mantissa_bits));
  return static_cast<float>(
      std::ldexp(significand, static_cast<int>(exponent_field) - fmt.bias - fmt.mantissa_bits));
}

// Shared fp8 encoder: saturating to `max_finite_bits`, NaN -> `nan_bits` with the input's sign.
uint8_t float_to_fp8(float x, MiniFloatFormat fmt, uint8_t max_finite_bits, uint8_t nan_bits) {
  const uint32_t bits = float_bits(x);
  const auto sign = static_cast<uint8_t>((bits & kF32SignMask) != 0 ? kFp8SignMask : 0);
  if (std::isnan(x)) return static_cast<uint8_t>(sign | nan_bits);
  if (std::isinf(x)) return static_cast<uint8_t>(sign | max_finite_bits);
  const int64_t code = encode_minifloat(std::fabs(x), fmt);
  if (code > max_finite_bits) return static_cast<uint8_t>(sign | max_finite_bits);
  return static_cast<uint8_t>(sign | static_cast<uint8_t>(code));
}

}  // namespace

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kFP8E4M3:
      return "fp8_e4m3";
    case DType::kFP8E5M2:
      return "fp8_e5m2";
    case DType::kFP4E2M1:
      return "fp4_e2m1";
    case DType::kI32:
      return "int32";
    case DType::kI64:
      return "int64";
    case DType::kU8:
      return "uint8";
  }
  return "unknown_dtype";
}

Result<DType> parse_dtype(std::string_view name) {
  struct Alias {
    std::string_view name;
    DType dtype;
  };
  static constexpr Alias kAliases[] = {
      {"f32", DType::kF32},
      {"float32", DType::kF32},
      {"float", DType::kF32},
      {"fp32", DType::kF32},
      {"f16", DType::kF16},
      {"float16", DType::kF16},
      {"fp16", DType::kF16},
      {"half", DType::kF16},
      {"bf16", DType::kBF16},
      {"bfloat16", DType::kBF16},
      {"fp8_e4m3", DType::kFP8E4M3},
      {"fp8_e4m3fn", DType::kFP8E4M3},
      {"float8_e4m3fn", DType::kFP8E4M3},
      {"e4m3", DType::kFP8E4M3},
      {"fp8_e5m2", DType::kFP8E5M2},
      {"float8_e5m2", DType::kFP8E5M2},
      {"e5m2", DType::kFP8E5M2},
      {"fp4_e2m1", DType::kFP4E2M1},
      {"float4_e2m1fn", DType::kFP4E2M1},
      {"e2m1", DType::kFP4E2M1},
      {"int32", DType::kI32},
      {"i32", DType::kI32},
      {"int64", DType::kI64},
      {"i64", DType::kI64},
      {"uint8", DType::kU8},
      {"u8", DType::kU8},
  };
  for (const Alias& alias : kAliases) {
    if (alias.name == name) return alias.dtype;
  }
  return Status::invalid_argument(
      "dtype '" + std::string(name) +
      "' is not recognised (accepted: f32, f16, bf16, fp8_e4m3, fp8_e5m2, fp4_e2m1, int32, int64, "
      "uint8; aliases: float32, float, fp32, float16, fp16, half, bfloat16, fp8_e4m3fn, "
      "float8_e4m3fn, e4m3, float8_e5m2, e5m2, float4_e2m1fn, e2m1, i32, i64, u8)");
}

int dtype_bits(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kI32:
      return 32;
    case DType::kF16:
    case DType::kBF16:
      return 16;
    case DType::kFP8E4M3:
    case DType::kFP8E5M2:
    case DType::kU8:
      return 8;
    case DType::kFP4E2M1:
      return 4;
    case DType::kI64:
      return 64;
  }
  return 0;
}

int64_t dtype_storage_bytes(DType dtype, int64_t n) {
  const int64_t bits = static_cast<int64_t>(dtype_bits(dtype)) * n;
  return (bits + kBitsPerByte - 1) / kBitsPerByte;
}

bool dtype_is_float(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kFP8E4M3:
    case DType::kFP8E5M2:
    case DType::kFP4E2M1:
      return true;
    case DType::kI32:
    case DType::kI64:
    case DType::kU8:
      return false;
  }
  return false;
}

bool dtype_is_activation(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
}

bool dtype_is_fp8(DType dtype) { return dtype == DType::kFP8E4M3 || dtype == DType::kFP8E5M2; }

bool dtype_is_quantized(DType dtype) { return dtype_is_fp8(dtype) || dtype == DType::kFP4E2M1; }

// ---- bf16 ----

uint16_t float_to_bf16_bits(float x) {
  const uint32_t bits = float_bits(x);
  if (std::isnan(x)) {
    return static_cast<uint16_t>((bits >> kBf16Shift) | kBf16QuietBit);
  }
  const uint32_t lsb = (bits >> kBf16Shift) & 1u;
  return static_cast<uint16_t>((bits + kBf16RoundingBias + lsb) >> kBf16Shift);
}

float bf16_bits_to_float(uint16_t bits) {
  return bits_float(static_cast<uint32_t>(bits) << kBf16Shift);
}

// ---- f16 ----

uint16_t float_to_f16_bits(float x) {
  const uint32_t bits = float_bits(x);
  const auto sign = static_cast<uint16_t>((bits & kF32SignMask) != 0 ? kF16SignMask : 0);
  if (std::isnan(x)) {
    const auto payload =
        static_cast<uint16_t>(((bits & kF32AbsMask) >> kF32ToF16MantissaShift) & kF16MantissaMask);
    return static_cast<uint16_t>(sign | kF16InfBits | kF16QuietBit | payload);
  }
  if (std::isinf(x)) return static_cast<uint16_t>(sign | kF16InfBits);
  const int64_t code = encode_minifloat(std::fabs(x), kF16Format);
  if (code > kF16MaxFiniteBits) return static_cast<uint16_t>(sign | kF16InfBits);
  return static_cast<uint16_t>(sign | static_cast<uint16_t>(code));
}

float f16_bits_to_float(uint16_t bits) {
  const bool negative = (bits & kF16SignMask) != 0;
  const uint16_t magnitude = bits & static_cast<uint16_t>(~kF16SignMask);
  float value;
  if ((magnitude & kF16InfBits) == kF16InfBits) {
    const uint16_t mantissa = magnitude & kF16MantissaMask;
    if (mantissa == 0) {
      value = std::numeric_limits<float>::infinity();
    } else {
      // Quiet NaN carrying the f16 payload in the top mantissa bits.
      value = bits_float(kF32ExponentMask | kF32QuietBit |
                         (static_cast<uint32_t>(mantissa) << kF32ToF16MantissaShift));
    }
  } else {
    value = decode_minifloat(magnitude, kF16Format);
  }
  return negative ? -value : value;
}

// ---- fp8 ----

uint8_t float_to_fp8_e4m3(float x) {
  return float_to_fp8(x, kE4M3Format, kE4M3MaxFiniteBits, kE4M3NaNBits);
}

float fp8_e4m3_to_float(uint8_t bits) {
  const uint8_t magnitude = bits & kFp8AbsMask;
  const bool negative = (bits & kFp8SignMask) != 0;
  if (magnitude == kE4M3NaNBits) {
    return negative ? -std::numeric_limits<float>::quiet_NaN()
                    : std::numeric_limits<float>::quiet_NaN();
  }
  const float value = decode_minifloat(magnitude, kE4M3Format);
  return negative ? -value : value;
}

uint8_t float_to_fp8_e5m2(float x) {
  return float_to_fp8(x, kE5M2Format, kE5M2MaxFiniteBits, kE5M2NaNBits);
}

float fp8_e5m2_to_float(uint8_t bits) {
  const uint8_t magnitude = bits & kFp8AbsMask;
  const bool negative = (bits & kFp8SignMask) != 0;
  float value;
  if ((magnitude & kE5M2ExponentMask) == kE5M2ExponentMask) {
    value = magnitude == kE5M2ExponentMask ? std::numeric_limits<float>::infinity()
                                           : std::numeric_limits<float>::quiet_NaN();
  } else {
    value = decode_minifloat(magnitude, kE5M2Format);
  }
  return negative ? -value : value;
}

// ---- fp4 ----

uint8_t float_to_fp4_e2m1(float x) {
  if (std::isnan(x)) return kFp4MaxFiniteCode;
  const auto sign = static_cast<uint8_t>(std::signbit(x) ? kFp4SignMask : 0);
  if (std::isinf(x)) return static_cast<uint8_t>(sign | kFp4MaxFiniteCode);
  const int64_t code = encode_minifloat(std::fabs(x), kE2M1Format);
  if (code > kFp4MaxFiniteCode) return static_cast<uint8_t>(sign | kFp4MaxFiniteCode);
  return static_cast<uint8_t>(sign | static_cast<uint8_t>(code));
}

float fp4_e2m1_to_float(uint8_t code) {
  const float value = decode_minifloat(code & kFp4AbsMask, kE2M1Format);
  return (code & kFp4SignMask) != 0 ? -value : value;
}

// ---- element access ----

float load_as_float(const void* data, DType dtype, int64_t i) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  switch (dtype) {
    case DType::kF32: {
      float v;
      std::memcpy(&v, bytes + i * static_cast<int64_t>(sizeof(float)), sizeof(float));
      return v;
    }
    case DType::kF16:
    case DType::kBF16: {
      uint16_t b;
      std::memcpy(&b, bytes + i * static_cast<int64_t>(sizeof(uint16_t)), sizeof(uint16_t));
      return dtype == DType::kF16 ? f16_bits_to_float(b) : bf16_bits_to_float(b);
    }
    case DType::kFP8E4M3:
      return fp8_e4m3_to_float(bytes[i]);
    case DType::kFP8E5M2:
      return fp8_e5m2_to_float(bytes[i]);
    case DType::kFP4E2M1: {
      const unsigned char byte = bytes[i / 2];
      const auto code =
          static_cast<uint8_t>((i % 2 == 0 ? byte : byte >> kNibbleBits) & kNibbleMask);
      return fp4_e2m1_to_float(code);
    }
    case DType::kI32: {
      int32_t v;
      std::memcpy(&v, bytes + i * static_cast<int64_t>(sizeof(int32_t)), sizeof(int32_t));
      return static_cast<float>(v);
    }
    case DType::kI64: {
      int64_t v;
      std::memcpy(&v, bytes + i * static_cast<int64_t>(sizeof(int64_t)), sizeof(int64_t));
      return static_cast<float>(v);
    }
    case DType::kU8:
      return static_cast<float>(bytes[i]);
  }
  return std::numeric_limits<float>::quiet_NaN();
}

namespace {

// Integer stores round to nearest even and saturate to the type's range; NaN stores 0.
template <typename Int>
Int saturating_round(float x) {
  if (std::isnan(x)) return 0;
  const double r = std::nearbyint(static_cast<double>(x));
  const auto lo = static_cast<double>(std::numeric_limits<Int>::min());
  const auto hi = static_cast<double>(std::numeric_limits<Int>::max());
  if (r <= lo) return std::numeric_limits<Int>::min();
  if (r >= hi) return std::numeric_limits<Int>::max();
  return static_cast<Int>(r);
}

}  // namespace

void store_from_float(void* data, DType dtype, int64_t i, float x) {
  auto* bytes = static_cast<unsigned char*>(data);
  switch (dtype) {
    case DType::kF32:
      std::memcpy(bytes + i * static_cast<int64_t>(sizeof(float)), &x, sizeof(float));
      return;
    case DType::kF16:
    case DType::kBF16: {
      const uint16_t b = dtype == DType::kF16 ? float_to_f16_bits(x) : float_to_bf16_bits(x);
      std::memcpy(bytes + i * static_cast<int64_t>(sizeof(uint16_t)), &b, sizeof(uint16_t));
      return;
    }
    case DType::kFP8E4M3:
      bytes[i] = float_to_fp8_e4m3(x);
      return;
    case DType::kFP8E5M2:
      bytes[i] = float_to_fp8_e5m2(x);
      return;
    case DType::kFP4E2M1: {
      const uint8_t code = float_to_fp4_e2m1(x);
      unsigned char& byte = bytes[i / 2];
      if (i % 2 == 0) {
        byte = static_cast<unsigned char>((byte & (kNibbleMask << kNibbleBits)) | code);
      } else {
        byte = static_cast<unsigned char>((byte & kNibbleMask) | (code << kNibbleBits));
      }
      return;
    }
    case DType::kI32: {
      const auto v = saturating_round<int32_t>(x);
      std::memcpy(bytes + i * static_cast<int64_t>(sizeof(int32_t)), &v, sizeof(int32_t));
      return;
    }
    case DType::kI64: {
      const auto v = saturating_round<int64_t>(x);
      std::memcpy(bytes + i * static_cast<int64_t>(sizeof(int64_t)), &v, sizeof(int64_t));
      return;
    }
    case DType::kU8:
      bytes[i] = saturating_round<uint8_t>(x);
      return;
  }
}

}  // namespace attnkit
