// Element types and exact host conversions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "attnkit/status.h"

namespace attnkit {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kFP8E4M3,  // OCP e4m3fn: no inf, max 448, NaN = S.1111.111
  kFP8E5M2,  // OCP e5m2: IEEE-like, inf and NaN, max finite 57344
  kFP4E2M1,  // OCP e2m1, two values per byte (low nibble = even index), one scale per 16 values
  kI32,
  kI64,
  kU8,
};

// Values packed in one group sharing one fp4 scale.
inline constexpr int kFp4GroupSize = 16;

// "f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1", "int32", "int64", "uint8".
const char* dtype_name(DType dtype);
// Accepts the names above plus common aliases ("float32", "float16", "bfloat16", "fp16").
Result<DType> parse_dtype(std::string_view name);
// Storage bits of one element (4 for fp4).
int dtype_bits(DType dtype);
// Bytes needed for n elements (fp4: ceil(n / 2)).
int64_t dtype_storage_bytes(DType dtype, int64_t n);
bool dtype_is_float(DType dtype);
// The dtypes of activations (q / k / v / out): f32, f16, bf16.
bool dtype_is_activation(DType dtype);
bool dtype_is_fp8(DType dtype);
// A KV storage dtype stored as x / scale (fp8, fp4): k_scale folds into the softmax scale.
bool dtype_is_quantized(DType dtype);

// ---- exact host conversions (round-to-nearest-even; NaN preserved) ----
uint16_t float_to_bf16_bits(float x);
float bf16_bits_to_float(uint16_t bits);
uint16_t float_to_f16_bits(float x);
float f16_bits_to_float(uint16_t bits);
// fp8: values beyond the largest finite value saturate to +-max (the convention inference stacks
// use when quantising activations and KV); NaN maps to NaN. e5m2 infinities also saturate.
uint8_t float_to_fp8_e4m3(float x);
float fp8_e4m3_to_float(uint8_t bits);
uint8_t float_to_fp8_e5m2(float x);
float fp8_e5m2_to_float(uint8_t bits);
// fp4 e2m1 code (4 bits): values {0, 0.5, 1, 1.5, 2, 3, 4, 6} with sign; saturates to +-6, NaN ->
// +6.
uint8_t float_to_fp4_e2m1(float x);
float fp4_e2m1_to_float(uint8_t code);

// Read element i of a buffer of the given float dtype as float (fp4: unscaled code value).
float load_as_float(const void* data, DType dtype, int64_t i);
// Write x to element i (fp4: read-modify-write of the nibble).
void store_from_float(void* data, DType dtype, int64_t i, float x);

}  // namespace attnkit
