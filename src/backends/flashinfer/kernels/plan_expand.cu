// The encoded default decode plan expanded on the GPU (plan_expand.h).
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "backends/flashinfer/kernels/balanced_plan.h"
#include "backends/flashinfer/kernels/paged_params.h"
#include "backends/flashinfer/kernels/plan_expand.h"
#include "cuda/common/cuda_check.cuh"

namespace attnkit::flashinfer {
namespace {

constexpr int kThreads = 256;

// grid: ceil(slots / kThreads) block: kThreads. Grid-stride over the three parts of the output:
// header + requests, cta_begin, segments (one thread per segment, two 16-byte stores).
__global__ void __launch_bounds__(kThreads) expand_encoded_plan_kernel(const PlanExpandParams p) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t ctas = static_cast<int64_t>(p.items) * p.heads;
  const int64_t req_end = kPlanHeaderWords + static_cast<int64_t>(p.bs) * kRequestWords;
  for (int64_t w = tid; w < req_end; w += stride) {
    int32_t v = 0;
    if (w >= kPlanHeaderWords) {
      v = p.work_words[w];  // the work plan's requests sit at the same offset
    } else if (w == 0) {
      v = p.slots;
    } else if (w == 1) {
      v = static_cast<int32_t>(ctas);
    } else if (w == 2) {
      v = kBalancedPlanTag;
    }
    p.out[w] = v;
  }
  const int64_t cb_words = BalancedPlan::cta_begin_words_for(p.slots);
  int32_t* cta_begin = p.out + req_end;
  for (int64_t c = tid; c < cb_words; c += stride) {
    cta_begin[c] = c <= p.slots ? static_cast<int32_t>(c < ctas ? c : ctas) : 0;
  }
  const RequestPlan* requests =
      reinterpret_cast<const RequestPlan*>(p.work_words + kPlanHeaderWords);
  const WorkItem* items = reinterpret_cast<const WorkItem*>(p.work_words + req_end);
  int4* segments = reinterpret_cast<int4*>(cta_begin + cb_words);
  const int64_t n_segments = ctas > p.slots ? ctas : p.slots;  // zeros past the CTAs
  for (int64_t k = tid; k < n_segments; k += stride) {
    int4 lo = make_int4(0, 0, 0, 0), hi = make_int4(0, 0, 0, 0);
    if (k < ctas) {
      const WorkItem it = items[k / p.heads];
      const int h = static_cast<int>(k % p.heads);
      const RequestPlan& req = requests[it.request];
      const bool split = req.num_splits > 1;
      const int part = split ? it.split : 0;
      const int parts = split ? req.num_splits : 1;
      const int64_t base = split ? int64_t{req.partial_base} * p.q_tiles * p.heads +
                                       ((it.q_row_begin / kDecodeTileRows) * int64_t{p.heads} + h) *
                                           int64_t{req.num_splits}
                                 : 0;
      // Segment's words: request, kv_head | q_row_begin << 16, kv_begin, kv_end,
      // part | parts << 16, partial_base, req_kv_len, req_q_start (little endian, as on the host).
      lo = make_int4(it.request,
                     static_cast<int32_t>((static_cast<uint32_t>(h) & 0xffffu) |
                                          (static_cast<uint32_t>(it.q_row_begin) << 16)),
                     it.kv_begin, it.kv_end);
      hi = make_int4(static_cast<int32_t>((static_cast<uint32_t>(part) & 0xffffu) |
                                          (static_cast<uint32_t>(parts) << 16)),
                     static_cast<int32_t>(base), req.kv_len, req.q_start);
    }
    segments[2 * k] = lo;
    segments[2 * k + 1] = hi;
  }
}

static_assert(sizeof(Segment) == 2 * sizeof(int4), "a segment is two 16-byte words");
static_assert(offsetof(Segment, kv_head) == 4 && offsetof(Segment, q_row_begin) == 6 &&
                  offsetof(Segment, part) == 16 && offsetof(Segment, parts) == 18 &&
                  offsetof(Segment, partial_base) == 20,
              "the kernel packs Segment's 16-bit fields by these offsets");

}  // namespace

Status expand_encoded_plan(const PlanExpandParams& p, StreamHandle stream) {
  if (p.bs < 0 || p.items < 0 || p.heads < 1 || p.slots < 1 || p.q_tiles < 1 ||
      static_cast<int64_t>(p.items) * p.heads > p.slots) {
    return Status::invalid_argument(
        "flashinfer plan expansion: bs " + std::to_string(p.bs) + ", items " +
        std::to_string(p.items) + ", heads " + std::to_string(p.heads) + ", q_tiles " +
        std::to_string(p.q_tiles) + " and slots " + std::to_string(p.slots) +
        " must have bs, items >= 0, heads, q_tiles, slots >= 1 and items x heads <= slots");
  }
  if (p.work_words == nullptr || p.out == nullptr) {
    return Status::invalid_argument("flashinfer plan expansion: work_words and out must be set");
  }
  const int64_t segments = p.slots;  // items x heads <= slots
  const int blocks = static_cast<int>((segments + kThreads - 1) / kThreads);
  expand_encoded_plan_kernel<<<blocks, kThreads, 0, cuda::to_stream(stream)>>>(p);
  ATTNKIT_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

}  // namespace attnkit::flashinfer
