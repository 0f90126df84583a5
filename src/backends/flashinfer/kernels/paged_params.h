// The data the flashinfer backend's paged attention kernels read: the per-forward plan (requests
// and work items, written by the host planner into a preallocated workspace) and the per-layer
// Params POD passed as `const __grid_constant__`. Plain C++ (no CUDA types), shared by host and
// device.
//
// Vocabulary:
//  * packed row: GQA heads are packed into the MMA M dimension. Row i of a request covers token
//    i / group and q head kv_head * group + i % group, so one CTA serves a whole head group.
//  * key k of a request is decoder token k of its req_to_token row; its pool slot comes from the
//    page table req_to_token[row, ::page_size] read in place:
//      slot(k) = req_to_token[row, k - k % page_size] + k % page_size
//    (every page-start entry is page-aligned, so no per-token index list is ever built).
#pragma once

#include <cstdint>

namespace attnkit::flashinfer {

// Tile shapes the planner must agree on with the kernels' Traits.
inline constexpr int kMmaRows = 16;  // rows of one warp's m16n8k16 tile
// Decode (paged_decode_sm80.cuh over cuda/common/ring_decode.cuh, which static_asserts these):
// kDecodeRingWarps warps per CTA, each streaming its own tiles of kDecodeRingKeys keys; the planner
// cuts split chunks in multiples of one tile per warp.
inline constexpr int kDecodeRingWarps = 4;
inline constexpr int kDecodeRingKeys = 16;  // one PV k-step per warp tile
inline constexpr int kDecodeTileKeys = kDecodeRingWarps * kDecodeRingKeys;  // 64
inline constexpr int kDecodeTileRows = kMmaRows;                            // 16
// Decode CTAs resident per SM at d <= 128 (110 KB of shared memory each on SM90): the kernel's
// __launch_bounds__ and the planner's grid target (kTargetCtasPerSm) both use it.
inline constexpr int kDecodeCtasPerSm = 2;
inline constexpr int kPrefillWarpsM = 4;  // prefill: warps split the rows of a tile
// Packed rows of one prefill work item (paged_prefill_sm80.cuh: 4 warps x 32 rows at d <= 128,
// 8 warps x 16 rows at d 256).
inline constexpr int kPrefillTileRows = 128;

// Which tile shape a forward uses: decode (one query token per request, few packed rows, warps
// along the keys) or prefill (many packed rows, warps along the rows).
enum class TileShape : int32_t { kDecode = 0, kPrefill = 1 };

// One request of the forward (8 int32 words).
struct RequestPlan {
  int32_t q_start = 0;       // first of its tokens in [0, T)
  int32_t q_len = 0;         // its new tokens (decode: 1; verify: N)
  int32_t kv_len = 0;        // keys in the pool: cached prefix + new tokens
  int32_t num_splits = 1;    // split-KV chunks; 1 = the attention kernel writes out/lse itself
  int32_t partial_base = 0;  // first partial row of the request when num_splits > 1
  int32_t reserved[3] = {0, 0, 0};
};

// One CTA's work (8 int32 words): packed rows [q_row_begin, q_row_begin + tile rows) of one
// request, keys [kv_begin, kv_end) (before the layer's causal / window clip).
struct WorkItem {
  int32_t request = -1;  // -1: padding of a CUDA-graph grid (the CTA exits)
  int32_t q_row_begin = 0;
  int32_t kv_begin = 0;
  int32_t kv_end = 0;
  int32_t split = 0;  // index among the request's splits
  // Copies of the request's RequestPlan fields (WorkPlan::serialize fills them), so that the
  // decode CTA's first page-table / K/V loads wait on the item load only, not on a second plan
  // record.
  int32_t req_kv_len = 0;
  int32_t req_q_start = 0;
  int32_t req_q_len = 0;
};

// Plan buffer layout (int32 words): [kPlanHeaderWords header][bs RequestPlan][items WorkItem].
// header[0] = number of valid work items (CTAs with blockIdx.x >= it exit: graph grids are padded).
inline constexpr int kPlanHeaderWords = 8;
inline constexpr int kRequestWords = static_cast<int>(sizeof(RequestPlan) / sizeof(int32_t));
inline constexpr int kItemWords = static_cast<int>(sizeof(WorkItem) / sizeof(int32_t));
static_assert(sizeof(RequestPlan) == 32 && sizeof(WorkItem) == 32, "plan records are 8 words");

// Per-layer launch parameters. Strides are in elements.
struct PagedParams {
  const void* q = nullptr;  // [T, Hq, D] bf16/f16
  int64_t q_stride_token = 0, q_stride_head = 0;
  void* out = nullptr;  // [T, Hq, D] q dtype
  int64_t o_stride_token = 0, o_stride_head = 0;
  float* lse = nullptr;  // [T, Hq] f32 natural-log LSE; nullptr = not requested
  int64_t lse_stride_token = 0, lse_stride_head = 0;

  const void* k_pool = nullptr;  // [rows, Hkv, D] pool dtype (q dtype, fp8_e4m3 or fp8_e5m2)
  const void* v_pool = nullptr;  // [rows, Hkv, D]
  int64_t k_stride_row = 0, k_stride_head = 0;
  int64_t v_stride_row = 0, v_stride_head = 0;

  const int32_t* req_to_token = nullptr;  // [max_reqs + 1, req_to_token_stride]
  int64_t req_to_token_stride = 0;
  const int32_t* req_pool_indices = nullptr;  // [bs] row of each request
  int page_size = 1;
  int page_shift = 0;  // log2(page_size) when page_size is a power of two, else -1

  const int32_t* plan = nullptr;  // header + [bs] RequestPlan + [items] WorkItem (see above)
  int bs = 0;

  const uint8_t* custom_mask = nullptr;  // verify tree mask; request r: [q_len, kv_len] bytes
  const int64_t* mask_indptr = nullptr;  // [bs + 1] offsets of each request's block
  const float* sinks = nullptr;          // [Hq] per-head sink logit; nullptr = off

  // Split-KV partials: [partials, Hq, D] / [partials, Hq] (WorkItem plans; the balanced decode
  // kernel's rows are W = min(group, 16) entries wide: balanced_plan.h balanced_partial_width).
  float* partial_out = nullptr;  // f32, normalised partial outputs
  float* partial_lse = nullptr;  // f32, log2-domain LSE of each partial
  // Decode: split CTAs finished per (request, q tile, kv head), [bs * q_tiles * Hkv] int32, zero
  // between launches (the request's last split CTA merges in place and resets it).
  int* split_counters = nullptr;

  int num_q_heads = 0;
  int num_kv_heads = 0;
  int group = 1;            // num_q_heads / num_kv_heads
  float scale_log2 = 0.f;   // scaling * k_scale * log2(e): logits straight to the exp2 domain
  float scale = 0.f;        // scaling * k_scale (soft-cap path)
  float logit_cap = 0.f;    // cap * tanh(x / cap); 0 = off
  float v_scale = 1.f;      // fp8 KV: folded into the output
  int sliding_window = -1;  // key k visible from query position p when p - k <= window
  int causal = 1;           // 1: key k visible when k <= query position
  // Decode experiment knob (ATTNKIT_FLASHINFER_DECODE_LOOP=generic, not API): 1 runs the streaming
  // loop that checks the soft-cap per logit even when it is off (paged_decode_sm80.cuh).
  int decode_generic_loop = 0;
  // Programmatic dependent launch of the decode kernel. The backend sets the most it allows
  // (every decode launch; eager split plans have it since 2026-11-23,
  // ATTNKIT_FLASHINFER_PDL_SPLIT=0 restores 0 for them), launch_paged the mode it launches (at most
  // that; ATTNKIT_FLASHINFER_PDL overrides): 0 = off, 1 = the CTA waits for the previous grid at
  // its start, 2 = after its plan item and first page-table words (allowed only where the previous
  // kernel of the stream cannot write the plan, req_pool_indices or req_to_token: after the
  // backend's own set_kv, or with BackendContext::early_page_table_reads).
  int decode_pdl = 0;
  // How a split decode CTA counts itself (experiment knob ATTNKIT_FLASHINFER_SPLIT_SYNC=fence_all,
  // not API): 0 = one acq_rel atomic by thread 0 between two CTA barriers
  // (ring::last_split_cta_acq_rel), 1 = every thread fences, then the atomic, then a fence
  // (ring::last_split_cta, the previous default).
  int split_sync_fence_all = 0;
  // 1 (default; ATTNKIT_FLASHINFER_PDL_TRIGGER=end, an A/B knob, sets 0): every CTA lets the next
  // PDL-launched kernel start as soon as its own wait for the previous grid returned
  // (griddepcontrol.launch_dependents), so the next grid's CTAs sit in the free CTA slots, past
  // their prologue, while this grid streams; 0 = after its streaming. Either way the dependents
  // wait for this whole grid before reading anything it writes. (Released before the wait, every
  // queued forward started at once: b16 kv 4k --launches 10 86.6 us instead of 70.3.)
  int decode_pdl_early = 0;
  // 1: the decode tiles of a partitioned forward launched right after the SM90 wgmma kernel that
  // released them at its start (backend/small_extend.h; Fa3Params::trigger_dependents), with
  // decode_pdl 0. The ring kernel's CTAs then start beside that kernel and read nothing it writes
  // (disjoint rows; the keys were stored before it), so they skip the wait; the grid's last CTA
  // waits for it (griddepcontrol.wait) before exiting, so this grid completes after it and the
  // stream's next work sees both. (That wait is the PTX rule for a dependent of a grid that
  // triggers early; on the H200 / driver 580 the stream already ordered the next work after both
  // grids without it: session 75's mutant run of the OverlappedKernelsKeepStreamOrder tests
  // passed 5 / 5. It costs one resident CTA until the wgmma grid ends.) Set only for
  // paged_decode_ring_kernel's launches.
  int decode_overlap = 0;
  // Balanced decode (the default, ATTNKIT_FLASHINFER_DECODE_BALANCE=auto or =1;
  // balanced_plan.h): > 0 = the plan is a balanced-kernel plan of this many slots, launched as
  // paged_decode_balanced_kernel with one CTA per slot; 0 = a WorkItem plan.
  int balance_slots = 0;
  // Target verify on decode tiles (WorkItem plans of TileShape::kDecode with q_len = N drafts;
  // paged_decode_ring_kernel's kVerify), or an extend with few new tokens per request on them
  // (each item carries its request's q_len; backend/small_extend.h): 1 launches that kernel;
  // decode_q_tiles = its split counters' q tiles per request (ceil(N x group /
  // decode_tile_rows), N the drafts of every request, or an extend's longest request).
  int decode_verify = 0;
  int decode_q_tiles = 0;
  // Rows of a decode-tile verify item (WorkItem::q_row_begin steps by it): 16, or 32 (head dims
  // <= 128: the two-M-tile CTA, RingVerify32Traits).
  int decode_tile_rows = kDecodeTileRows;
};

}  // namespace attnkit::flashinfer
