// The encoded default decode plan built on the GPU from the compact work plan, for CUDA-graph
// replay refreshes (flashinfer backend): the host uploads WorkPlan::serialize's words (header,
// bs RequestPlan, items WorkItem: 16 KB at bs 256) and this kernel writes the balanced kernel's
// plan (balanced_plan.h: header, requests, cta_begin, one segment per (item, kv head): 80 KB at
// bs 256), word for word what BalancedPlan::serialize writes for balanced_from_work_plan's plan.
// Only the one-CTA-per-slot layout (items x kv heads <= slots) of a plan without padding items
// (build_work_plan's plans have none): slot c holds CTA c = (item c / heads, kv head c % heads).
// Host-facing: no CUDA types.
#pragma once

#include <cstdint>

#include "attnkit/status.h"
#include "attnkit/tensor.h"

namespace attnkit::flashinfer {

struct PlanExpandParams {
  // [kPlanHeaderWords + bs x kRequestWords + items x kItemWords] (device): WorkPlan::serialize's
  // words.
  const int32_t* work_words = nullptr;
  int bs = 0;       // requests
  int items = 0;    // work items (none padding)
  int heads = 1;    // kv heads
  int q_tiles = 1;  // decode q tiles per request (the partial-row formula)
  int slots = 1;    // >= items x heads
  // [BalancedPlan::words_for(bs, slots, slots)] (device): the balanced kernel's plan.
  int32_t* out = nullptr;
};

// Launches the expansion on stream; kInvalidArgument names a field out of range (items x heads
// past slots, a count < 0, heads or slots < 1).
Status expand_encoded_plan(const PlanExpandParams& p, StreamHandle stream);

}  // namespace attnkit::flashinfer
