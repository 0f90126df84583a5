// The encoded default decode plan expanded on the GPU (plan_expand.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
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

// A segment of zero words (the padding past a plan's segments).
__device__ Segment zero_segment() {
  Segment s;
  s.request = 0;
  s.parts = 0;
  return s;
}

__device__ void store_record(int32_t* at, const void* record) {  // 32 bytes, 16-byte aligned
  const int4* r = static_cast<const int4*>(record);
  reinterpret_cast<int4*>(at)[0] = r[0];
  reinterpret_cast<int4*>(at)[1] = r[1];
}

// The plan's header and request records (thread tid of stride; one record per thread); returns
// where cta_begin starts.
template <class Source>
__device__ int32_t* write_head(const Source& src, int bs, int slots, int32_t segments, int32_t* out,
                               int64_t tid, int64_t stride) {
  if (tid < kPlanHeaderWords) {
    out[tid] = tid == 0 ? slots : tid == 1 ? segments : tid == 2 ? kBalancedPlanTag : 0;
  }
  for (int64_t r = tid; r < bs; r += stride) {
    const RequestPlan q = src.request(static_cast<int>(r));
    store_record(out + kPlanHeaderWords + r * kRequestWords, &q);
  }
  return out + kPlanHeaderWords + static_cast<int64_t>(bs) * kRequestWords;
}

// Grid-stride over the three parts of the output (thread tid of stride): header + requests (one
// request record per thread), cta_begin, segments (one thread per segment, two 16-byte stores).
// Slot c walks CTAs c, c + slots, ... (balanced_from_work_plan): with ctas = q x slots + r (ctas >=
// slots) slot c holds q + (c < r) segments, so cta_begin[c] = c x q + min(c, r); with ctas < slots
// slot c < ctas holds CTA c and the others none (q 0, r ctas: the same formula).
template <class Source>
__device__ void expand(const Source& src, int bs, int64_t items, int heads, int q_tiles, int slots,
                       int32_t* out, int64_t tid, int64_t stride) {
  const int64_t ctas = items * heads;
  int32_t* cta_begin = write_head(src, bs, slots, static_cast<int32_t>(ctas), out, tid, stride);
  const int64_t cb_words = BalancedPlan::cta_begin_words_for(slots);
  const int64_t q = ctas / slots, r = ctas % slots;
  for (int64_t c = tid; c < cb_words; c += stride) {
    cta_begin[c] = c <= slots ? static_cast<int32_t>(c * q + (c < r ? c : r)) : 0;
  }
  int32_t* segments = cta_begin + cb_words;
  const int64_t n_segments = ctas > slots ? ctas : slots;  // zeros past the CTAs
  for (int64_t i = tid; i < n_segments; i += stride) {
    alignas(16) Segment seg;
    if (i < ctas) {
      // Segment i: slot c, its m-th CTA k = c + m x slots (the first r slots hold q + 1).
      const int64_t wide = r * (q + 1);
      const int64_t c = i < wide ? i / (q + 1) : r + (i - wide) / q;
      const int64_t m = i < wide ? i % (q + 1) : (i - wide) % q;
      const int64_t k = c + m * slots;
      const WorkItem it = src.item(k / heads);
      encoded_segment(it, src.request(it.request), k % heads, q_tiles, heads, &seg);
    } else {
      seg = zero_segment();
    }
    store_record(segments + i * kSegmentWords, &seg);
  }
}

// grid: ceil(max(slots, items x heads) / kThreads) block: kThreads (both kernels).
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

// ---- The cut plan from the lengths (one CTA; plan_expand.h cut_plan_from_lengths) ----

constexpr int kCutThreads = 1024;

// Exclusive scan of a[0, n) in place by the whole block (each thread a contiguous run); returns
// the total. Every thread calls it; a barrier before it returns.
template <class T>
__device__ T block_exclusive_scan(T* a, int64_t n) {
  __shared__ T warp_sums[kCutThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int64_t per = (n + blockDim.x - 1) / blockDim.x;
  const int64_t b = min(n, threadIdx.x * per), e = min(n, b + per);
  T sum = 0;
  for (int64_t i = b; i < e; ++i) sum += a[i];
  T x = sum;  // inclusive within the warp
  for (int o = 1; o < 32; o <<= 1) {
    const T y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  if (warp == 0) {
    T w = lane < warps ? warp_sums[lane] : T{0};
    for (int o = 1; o < 32; o <<= 1) {
      const T y = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += y;
    }
    if (lane < warps) warp_sums[lane] = w;
  }
  __syncthreads();
  T at = (warp > 0 ? warp_sums[warp - 1] : T{0}) + x - sum;
  const T total = warp_sums[warps - 1];
  for (int64_t i = b; i < e; ++i) {
    const T v = a[i];
    a[i] = at;
    at += v;
  }
  __syncthreads();
  return total;
}

// The last index j of a[0, n) (ascending) with a[j] <= x; a[0] <= x.
__device__ int last_at_most(const int64_t* a, int n, int64_t x) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (a[mid] <= x) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// grid: 1 block: kCutThreads, dynamic shared memory cut_plan_smem_bytes(p). The key line of
// balanced_plan.h: request r's items (q tile, kv head; heads fastest) hold its kv_len keys each
// and start at R[r] + (t x heads + h) x kv_len; cuts, segments per chunk, parts and partial rows
// per item, then the words, as build_balanced_plan + BalancedPlan::serialize write them.
__global__ void __launch_bounds__(kCutThreads)
    cut_plan_from_lengths_kernel(const __grid_constant__ PlanFromLengthsParams p) {
  extern __shared__ int64_t smem[];
  const int bs = p.bs, slots = p.slots;
  const int64_t per_request = int64_t{p.q_tiles} * p.heads;
  const int64_t n_items = bs * per_request;
  int64_t* R = smem;                                            // [bs + 1] request starts
  int64_t* cut = R + bs + 1;                                    // [slots + 1] chunk bounds
  int32_t* base = reinterpret_cast<int32_t*>(cut + slots + 1);  // [items] partial rows
  int32_t* begin = base + n_items;                              // [slots + 1] cta_begin
  for (int r = threadIdx.x; r <= bs; r += blockDim.x) {
    R[r] = r < bs ? p.kv_len[r] * per_request : 0;
  }
  __syncthreads();
  const int64_t total = block_exclusive_scan(R, bs + 1);
  const int64_t q = total / slots, rem = total % slots;
  // Item of a key position < total: (request, index within it), its start.
  const auto item_of = [&](int64_t pos, int* r, int64_t* j, int64_t* start) {
    *r = last_at_most(R, bs, pos);
    const int64_t len = p.kv_len[*r];
    *j = (pos - R[*r]) / len;
    *start = R[*r] + *j * len;
  };
  for (int k = threadIdx.x; k <= slots; k += blockDim.x) {
    int64_t c = k == slots ? total : k * q + k * rem / slots;  // floor(k T / S)
    if (k > 0 && k < slots) {
      int r;
      int64_t j, start;
      item_of(c, &r, &j, &start);
      if (c > start) c = start + (c - start) / p.granule * p.granule;
    }
    cut[k] = c;
  }
  __syncthreads();
  // Segments per chunk: the items from the one holding its first key to the one holding its last
  // (every chunk holds keys: floor(T / S) >= granule).
  for (int c = threadIdx.x; c <= slots; c += blockDim.x) {
    int32_t n = 0;
    if (c < slots) {
      int r0, r1;
      int64_t j0, j1, s0, s1;
      item_of(cut[c], &r0, &j0, &s0);
      item_of(cut[c + 1] - 1, &r1, &j1, &s1);
      n = static_cast<int32_t>((r1 * per_request + j1) - (r0 * per_request + j0) + 1);
    }
    begin[c] = n;
  }
  __syncthreads();
  const int32_t n_segments = block_exclusive_scan(begin, int64_t{slots} + 1);
  // Parts of item i: the chunks holding its first and last keys and those between.
  const auto chunks_of = [&](int64_t start, int64_t len, int* first) {
    *first = last_at_most(cut, slots, start);
    return last_at_most(cut, slots, start + len - 1) - *first + 1;
  };
  for (int64_t i = threadIdx.x; i < n_items; i += blockDim.x) {
    const int r = static_cast<int>(i / per_request);
    const int64_t len = p.kv_len[r];
    int first;
    const int parts = chunks_of(R[r] + (i - r * per_request) * len, len, &first);
    base[i] = parts > 1 ? parts : 0;
  }
  __syncthreads();
  block_exclusive_scan(base, n_items);

  // The words: header, requests, cta_begin, segments (zeros up to max(segments, slots)).
  int32_t* cta_begin =
      write_head(FromLengths{&p}, bs, slots, n_segments, p.out, threadIdx.x, blockDim.x);
  const int64_t cb_words = BalancedPlan::cta_begin_words_for(slots);
  for (int64_t c = threadIdx.x; c < cb_words; c += blockDim.x) {
    cta_begin[c] = c <= slots ? begin[c] : 0;
  }
  int32_t* segments = cta_begin + cb_words;
  for (int c = threadIdx.x; c < slots; c += blockDim.x) {
    const int64_t lo = cut[c], hi = cut[c + 1];
    int r;
    int64_t j, start;
    item_of(lo, &r, &j, &start);
    for (int32_t k = begin[c]; k < begin[c + 1]; ++k) {
      const int64_t len = p.kv_len[r];
      const int h = static_cast<int>(j % p.heads);
      const int q_row = static_cast<int>(j / p.heads) * kDecodeTileRows;
      int first;
      const int parts = chunks_of(start, len, &first);
      const int64_t b = lo > start ? lo : start;
      const int64_t e = hi < start + len ? hi : start + len;
      alignas(16) Segment seg;  // build_balanced_plan's fields
      seg.request = r;
      seg.kv_head = static_cast<int16_t>(h);
      seg.q_row_begin = static_cast<int16_t>(q_row);
      seg.kv_begin = static_cast<int32_t>(b - start);
      seg.kv_end = static_cast<int32_t>(e - start);
      seg.part = static_cast<int16_t>(c - first);
      seg.parts = static_cast<int16_t>(parts);
      seg.partial_base = parts > 1 ? base[r * per_request + j] : 0;
      seg.req_kv_len = static_cast<int32_t>(len);
      seg.req_q_start = r;
      store_record(segments + int64_t{k} * kSegmentWords, &seg);
      // The next item: the next index of this request, or the next request's first.
      start += len;
      if (++j == per_request) {
        j = 0;
        ++r;
      }
    }
  }
  for (int64_t k = n_segments + threadIdx.x; k < slots; k += blockDim.x) {
    alignas(16) const Segment zero = zero_segment();
    store_record(segments + k * kSegmentWords, &zero);
  }
}

static_assert(sizeof(RequestPlan) == 32 && sizeof(WorkItem) == 32, "records are 8 words");
static_assert(kPlanHeaderWords % 4 == 0, "requests start 16-byte aligned");
static_assert(sizeof(Segment) == 2 * sizeof(int4), "a segment is two 16-byte words");

// The first request of p with kv_len < 1, refused by `who`; ok (and *keys their sum) else.
Status check_lengths(const PlanFromLengthsParams& p, const char* who, int64_t* keys) {
  *keys = 0;
  for (int r = 0; r < p.bs; ++r) {
    if (p.kv_len[r] < 1) {
      return Status::invalid_argument(std::string(who) + ": request " + std::to_string(r) +
                                      " has kv_len " + std::to_string(p.kv_len[r]) +
                                      " (a decode request holds its new token: >= 1)");
    }
    *keys += p.kv_len[r];
  }
  return Status::ok();
}
}  // namespace

Status expand_encoded_plan(const PlanExpandParams& p, StreamHandle stream) {
  const int64_t ctas = static_cast<int64_t>(p.items) * p.heads;
  if (p.bs < 0 || p.items < 0 || p.heads < 1 || p.slots < 1 || p.q_tiles < 1 ||
      ctas > kMaxPlanSegments) {
    return Status::invalid_argument(
        "flashinfer plan expansion: bs " + std::to_string(p.bs) + ", items " +
        std::to_string(p.items) + ", heads " + std::to_string(p.heads) + ", q_tiles " +
        std::to_string(p.q_tiles) + " and slots " + std::to_string(p.slots) +
        " must have bs, items >= 0, heads, q_tiles, slots >= 1 and items x heads <= " +
        std::to_string(kMaxPlanSegments));
  }
  if (p.work_words == nullptr || p.out == nullptr) {
    return Status::invalid_argument("flashinfer plan expansion: work_words and out must be set");
  }
  const int64_t segments = std::max<int64_t>(ctas, p.slots);
  const int blocks = static_cast<int>((segments + kThreads - 1) / kThreads);
  expand_encoded_plan_kernel<<<blocks, kThreads, 0, cuda::to_stream(stream)>>>(p);
  ATTNKIT_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

Status expand_plan_from_lengths(const PlanFromLengthsParams& p, StreamHandle stream) {
  const int64_t ctas = static_cast<int64_t>(p.bs) * p.q_tiles * p.heads;
  if (p.bs < 0 || p.bs > kPlanLengthsMax || p.heads < 1 || p.q_tiles < 1 || p.slots < 1 ||
      ctas > kMaxPlanSegments) {
    return Status::invalid_argument(
        "flashinfer plan from lengths: bs " + std::to_string(p.bs) + ", heads " +
        std::to_string(p.heads) + ", q_tiles " + std::to_string(p.q_tiles) + " and slots " +
        std::to_string(p.slots) + " must have 0 <= bs <= " + std::to_string(kPlanLengthsMax) +
        ", heads, q_tiles, slots >= 1 and bs x q_tiles x heads <= " +
        std::to_string(kMaxPlanSegments));
  }
  if (p.out == nullptr) {
    return Status::invalid_argument("flashinfer plan from lengths: out must be set");
  }
  int64_t keys = 0;
  ATTNKIT_RETURN_IF_ERROR(check_lengths(p, "flashinfer plan from lengths", &keys));
  const int blocks = static_cast<int>((std::max(ctas, int64_t{p.slots}) + kThreads - 1) / kThreads);
  expand_plan_from_lengths_kernel<<<blocks, kThreads, 0, cuda::to_stream(stream)>>>(p);
  ATTNKIT_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

int64_t cut_plan_smem_bytes(int bs, int heads, int q_tiles, int slots) {
  const int64_t items = int64_t{bs} * heads * q_tiles;
  return (int64_t{bs} + 1) * 8 + (int64_t{slots} + 1) * 8 + items * 4 + (int64_t{slots} + 1) * 4;
}

namespace {
constexpr int64_t kNoOptInSmem = 48 * 1024;
constexpr int kCachedDevices = 64;
// Per device ordinal: the opt-in limit (0: not asked yet), and the dynamic shared memory the
// kernel was opted in to (0: not yet).
std::array<std::atomic<int64_t>, kCachedDevices> g_optin_limit{};
std::array<std::atomic<int64_t>, kCachedDevices> g_opted_in{};

// -1 without one (the failed call's error is not left for the next launch check).
int current_device() {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return device;
}
}  // namespace

int64_t cut_plan_max_smem() {
  const int device = current_device();
  const bool cached = device >= 0 && device < kCachedDevices;
  if (cached) {
    if (const int64_t known = g_optin_limit[device].load(std::memory_order_relaxed); known > 0) {
      return known - kCutPlanStaticSmem;
    }
  }
  int optin = 0;
  int64_t limit = kNoOptInSmem;
  if (device >= 0) {
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
        cudaSuccess) {
      cudaGetLastError();  // the failed query's error is not left for the next launch check
    } else if (optin > limit) {
      limit = optin;
    }
  }
  if (cached) g_optin_limit[device].store(limit, std::memory_order_relaxed);
  return limit - kCutPlanStaticSmem;
}

Status cut_plan_from_lengths(const PlanFromLengthsParams& p, StreamHandle stream) {
  constexpr int kMax16 = 32767;  // the segments' 16-bit fields
  if (p.bs < 1 || p.bs > kPlanLengthsMax || p.heads < 1 || p.heads > kMax16 || p.q_tiles < 1 ||
      int64_t{p.q_tiles} * kDecodeTileRows > kMax16 || p.slots < 1 || p.slots > kMax16 ||
      p.granule < 1) {
    return Status::invalid_argument(
        "flashinfer cut plan from lengths: bs " + std::to_string(p.bs) + ", heads " +
        std::to_string(p.heads) + ", q_tiles " + std::to_string(p.q_tiles) + ", slots " +
        std::to_string(p.slots) + " and granule " + std::to_string(p.granule) +
        " must have 1 <= bs <= " + std::to_string(kPlanLengthsMax) +
        ", heads and slots in 1..32767, q_tiles >= 1 (x 16 rows <= 32767) and granule >= 1");
  }
  if (p.out == nullptr) {
    return Status::invalid_argument("flashinfer cut plan from lengths: out must be set");
  }
  int64_t keys = 0;
  ATTNKIT_RETURN_IF_ERROR(check_lengths(p, "flashinfer cut plan from lengths", &keys));
  const int64_t total = keys * p.q_tiles * p.heads;
  if (total / p.slots < p.granule) {
    return Status::invalid_argument(
        "flashinfer cut plan from lengths: " + std::to_string(total) + " keys over " +
        std::to_string(p.slots) + " slots give chunks below the granule of " +
        std::to_string(p.granule) + " keys (the host planner cuts those)");
  }
  const int64_t smem = cut_plan_smem_bytes(p.bs, p.heads, p.q_tiles, p.slots);
  const int64_t max_smem = cut_plan_max_smem();
  if (smem > max_smem) {
    return Status::invalid_argument(
        "flashinfer cut plan from lengths: bs " + std::to_string(p.bs) + ", heads " +
        std::to_string(p.heads) + ", q_tiles " + std::to_string(p.q_tiles) + " and slots " +
        std::to_string(p.slots) + " need " + std::to_string(smem) +
        " bytes of shared memory, above this device's " + std::to_string(max_smem));
  }
  // Past 48 KB the launch needs the kernel opted in (a per-function attribute, not a stream
  // operation): once per device, to the device's whole limit.
  if (smem > kNoOptInSmem - kCutPlanStaticSmem) {
    const int device = current_device();
    const bool cached = device >= 0 && device < kCachedDevices;
    if (!cached || g_opted_in[device].load(std::memory_order_acquire) < max_smem) {
      ATTNKIT_CUDA_TRY(cudaFuncSetAttribute(cut_plan_from_lengths_kernel,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(max_smem)));
      if (cached) g_opted_in[device].store(max_smem, std::memory_order_release);
    }
  }
  cut_plan_from_lengths_kernel<<<1, kCutThreads, static_cast<size_t>(smem),
                                 cuda::to_stream(stream)>>>(p);
  ATTNKIT_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

}  // namespace attnkit::flashinfer
