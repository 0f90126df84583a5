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

// The work plan the expansion reads: WorkPlan::serialize's words (uploaded by the host).
struct WorkWords {
  const int32_t* words;
  int bs;
  __device__ RequestPlan request(int r) const {
    return reinterpret_cast<const RequestPlan*>(words + kPlanHeaderWords)[r];
  }
  __device__ WorkItem item(int64_t i) const {
    return reinterpret_cast<const WorkItem*>(words + kPlanHeaderWords +
                                             static_cast<int64_t>(bs) * kRequestWords)[i];
  }
};

// The work plan that build_work_plan makes for a decode batch it does not split, from the lengths
// alone (plan_expand.h, PlanFromLengthsParams): request r = q_start r, q_len 1, one item per q
// tile, each over the request's keys.
struct FromLengths {
  const PlanFromLengthsParams* p;
  __device__ RequestPlan request(int r) const {
    RequestPlan q;
    q.q_start = r;
    q.q_len = 1;
    q.kv_len = p->kv_len[r];
    return q;  // num_splits 1, partial_base 0, reserved 0
  }
  __device__ WorkItem item(int64_t i) const {
    WorkItem w;
    w.request = static_cast<int32_t>(i / p->q_tiles);
    w.q_row_begin = static_cast<int32_t>(i % p->q_tiles) * kDecodeTileRows;
    w.kv_end = p->kv_len[w.request];
    return w;  // kv_begin 0, split 0
  }
};

__device__ void store_record(int32_t* at, const void* record) {  // 32 bytes, 16-byte aligned
  const int4* r = static_cast<const int4*>(record);
  reinterpret_cast<int4*>(at)[0] = r[0];
  reinterpret_cast<int4*>(at)[1] = r[1];
}

// Grid-stride over the three parts of the output (thread tid of stride): header + requests (one
// request record per thread), cta_begin, segments (one thread per segment, two 16-byte stores).
template <class Source>
__device__ void expand(const Source& src, int bs, int64_t items, int heads, int q_tiles, int slots,
                       int32_t* out, int64_t tid, int64_t stride) {
  const int64_t ctas = items * heads;
  if (tid < kPlanHeaderWords) {
    out[tid] = tid == 0   ? slots
               : tid == 1 ? static_cast<int32_t>(ctas)
               : tid == 2 ? kBalancedPlanTag
                          : 0;
  }
  for (int64_t r = tid; r < bs; r += stride) {
    const RequestPlan q = src.request(static_cast<int>(r));
    store_record(out + kPlanHeaderWords + r * kRequestWords, &q);
  }
  const int64_t req_end = kPlanHeaderWords + static_cast<int64_t>(bs) * kRequestWords;
  const int64_t cb_words = BalancedPlan::cta_begin_words_for(slots);
  int32_t* cta_begin = out + req_end;
  for (int64_t c = tid; c < cb_words; c += stride) {
    cta_begin[c] = c <= slots ? static_cast<int32_t>(c < ctas ? c : ctas) : 0;
  }
  int4* segments = reinterpret_cast<int4*>(cta_begin + cb_words);
  const int64_t n_segments = ctas > slots ? ctas : slots;  // zeros past the CTAs
  for (int64_t k = tid; k < n_segments; k += stride) {
    int4 lo = make_int4(0, 0, 0, 0), hi = make_int4(0, 0, 0, 0);
    if (k < ctas) {
      const WorkItem it = src.item(k / heads);
      const int h = static_cast<int>(k % heads);
      const RequestPlan req = src.request(it.request);
      const bool split = req.num_splits > 1;
      const int part = split ? it.split : 0;
      const int parts = split ? req.num_splits : 1;
      const int64_t base = split ? int64_t{req.partial_base} * q_tiles * heads +
                                       ((it.q_row_begin / kDecodeTileRows) * int64_t{heads} + h) *
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

// grid: ceil(slots / kThreads) block: kThreads (both kernels).
__global__ void __launch_bounds__(kThreads) expand_encoded_plan_kernel(const PlanExpandParams p) {
  expand(WorkWords{p.work_words, p.bs}, p.bs, p.items, p.heads, p.q_tiles, p.slots, p.out,
         static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x,
         static_cast<int64_t>(gridDim.x) * blockDim.x);
}

// The lengths travel in the launch's parameters (__grid_constant__: read in place, not copied).
__global__ void __launch_bounds__(kThreads)
    expand_plan_from_lengths_kernel(const __grid_constant__ PlanFromLengthsParams p) {
  expand(FromLengths{&p}, p.bs, static_cast<int64_t>(p.bs) * p.q_tiles, p.heads, p.q_tiles, p.slots,
         p.out, static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x,
         static_cast<int64_t>(gridDim.x) * blockDim.x);
}

static_assert(sizeof(RequestPlan) == 32 && sizeof(WorkItem) == 32, "records are 8 words");
static_assert(kPlanHeaderWords % 4 == 0, "requests start 16-byte aligned");
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

Status expand_plan_from_lengths(const PlanFromLengthsParams& p, StreamHandle stream) {
  const int64_t ctas = static_cast<int64_t>(p.bs) * p.q_tiles * p.heads;
  if (p.bs < 0 || p.bs > kPlanLengthsMax || p.heads < 1 || p.q_tiles < 1 || p.slots < 1 ||
      ctas > p.slots) {
    return Status::invalid_argument(
        "flashinfer plan from lengths: bs " + std::to_string(p.bs) + ", heads " +
        std::to_string(p.heads) + ", q_tiles " + std::to_string(p.q_tiles) + " and slots " +
        std::to_string(p.slots) + " must have 0 <= bs <= " + std::to_string(kPlanLengthsMax) +
        ", heads, q_tiles, slots >= 1 and bs x q_tiles x heads <= slots");
  }
  if (p.out == nullptr) {
    return Status::invalid_argument("flashinfer plan from lengths: out must be set");
  }
  for (int r = 0; r < p.bs; ++r) {
    if (p.kv_len[r] < 1) {
      return Status::invalid_argument("flashinfer plan from lengths: request " + std::to_string(r) +
                                      " has kv_len " + std::to_string(p.kv_len[r]) +
                                      " (a decode request holds its new token: >= 1)");
    }
  }
  const int blocks = static_cast<int>((int64_t{p.slots} + kThreads - 1) / kThreads);
  expand_plan_from_lengths_kernel<<<blocks, kThreads, 0, cuda::to_stream(stream)>>>(p);
  ATTNKIT_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

}  // namespace attnkit::flashinfer
