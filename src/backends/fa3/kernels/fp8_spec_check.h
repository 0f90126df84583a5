// The FP8 prefill's check of a speculative softmax step on the packed e4m3 P (prefill_sm90_fp8.cuh,
// the promoted three-warpgroup kernel); host and device, so that tests/unit/test_fa3_plan.cpp
// checks it on the CPU.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace attnkit::fa3 {

// Whether any of the kRows x 4 packed e4m3 words (4 values each) holds a byte >= `limit`
// (0x39..0x7f): the speculation failed. P >= 0 (or NaN, 0x7f), so its bytes lie below 0x80 and are
// ordered as unsigned integers; adding 0x80 - limit to every byte sets a byte's bit 7 exactly
// when the byte is >= limit, without a carry into the next byte (0x7f + 0x47 < 0x100). Two words
// per OR of three: 1.5 integer instructions per 4 values, instead of 4 FMNMX and the block
// maximum's shuffles.
template <int kRows>
ATTNKIT_HOST_DEVICE inline bool e4m3_words_reach(const uint32_t (&w)[kRows][4], uint32_t limit) {
  const uint32_t add = (0x80u - limit) * 0x01010101u;
  uint32_t acc = 0;
#pragma unroll
  for (int kk = 0; kk < kRows; ++kk) {
    acc |= (w[kk][0] + add) | (w[kk][1] + add);
    acc |= (w[kk][2] + add) | (w[kk][3] + add);
  }
  return (acc & 0x80808080u) != 0;
}

// The limits: e4m3 256 (0x78; P rounded from >= 248, i.e. a row maximum risen by about the
// lazy-rescale threshold of 8 in log2 units), and above 1.0 (0x38) without lazy rescale.
inline constexpr uint32_t kE4m3SpecLimitLazy = 0x78u;
inline constexpr uint32_t kE4m3SpecLimitEager = 0x39u;

}  // namespace attnkit::fa3
