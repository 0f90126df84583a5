// Shared by the flashinfer decode planner tests (test_flashinfer_balanced_plan,
// test_flashinfer_split_long): the H200's SM count and a decode batch from its kv lengths.
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

}  // namespace attnkit::flashinfer::test_support
