// Shared by the flashinfer decode planner tests (test_flashinfer_balanced_plan,
// test_flashinfer_split_long): the H200's SM count, a decode batch from its kv lengths and the
// query tiles of a request.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backends/flashinfer/kernels/work_plan.h"

namespace attnkit::flashinfer::test_support {

constexpr int kH200Sms = 132;

// One decode request per length: request i's query token i (q_len 1), kv_len lens[i].
inline std::vector<PlanRequest> decode_requests(const std::vector<int>& lens) {
  std::vector<PlanRequest> r;
  for (size_t i = 0; i < lens.size(); ++i) {
    r.push_back({static_cast<int32_t>(i), 1, static_cast<int32_t>(lens[i])});
  }
  return r;
}

// Query tiles (kDecodeTileRows packed rows each) of one request whose q heads per kv head are
// `group`.
inline int64_t q_tiles(const PlanRequest& r, int group) {
  return (static_cast<int64_t>(r.q_len) * group + kDecodeTileRows - 1) / kDecodeTileRows;
}

}  // namespace attnkit::flashinfer::test_support
