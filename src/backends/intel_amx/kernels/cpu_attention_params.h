// Parameters and work lists shared by every ISA variant of the intel_amx CPU kernels.
//
// The backend builds one CpuAttentionParams per layer call (plain pointers and strides, no
// allocation) and one work list per forward (in init_forward_metadata). Each ISA translation unit
// (scalar, AVX2, AVX-512, AVX-512-BF16, AMX) exports the same entry points declared at the bottom.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "attnkit/dtype.h"

namespace attnkit::cpu_attention {

// Scores are processed in blocks of this many keys by the vector kernels.
inline constexpr int kKeyBlock = 16;
// The kernels need head dims that are multiples of this (one AVX-512 vector of f32) and at most
// kMaxHeadDim; the backend rejects other dims.
inline constexpr int kHeadDimMultiple = 16;
inline constexpr int kMaxHeadDim = 256;
// fp8_e4m3 is widened by moving its bits into an fp16 (exponent bias 15 instead of 7), or into a
// bf16 with the same 2^-8 (the avx512_bf16 paths: bit moves, or the decode's byte tables): the
// widened value is the fp8 value times 2^(7 - 15), so the kernels multiply the scale by 2^(15 - 7).
inline constexpr float kFp8E4M3ViaF16Scale = 256.f;

struct CpuAttentionParams {
  const void* q = nullptr;  // [T, Hq, D] act_dtype, innermost stride 1
  int64_t q_token_stride = 0;
  int64_t q_head_stride = 0;
  void* out = nullptr;  // [T, Hq, Dv] act_dtype, innermost stride 1
  int64_t out_token_stride = 0;
  int64_t out_head_stride = 0;
  float* lse = nullptr;  // [T, Hq] f32 natural-log LSE, or nullptr
  int64_t lse_token_stride = 0;
  int64_t lse_head_stride = 0;
  DType act_dtype = DType::kBF16;  // q and out: f32, f16 or bf16

  const void* k_cache = nullptr;  // [rows, Hkv, D] kv_dtype, innermost stride 1
  const void* v_cache = nullptr;  // [rows, Hkv, Dv] kv_dtype, innermost stride 1
  int64_t k_row_stride = 0;
  int64_t k_head_stride = 0;
  int64_t v_row_stride = 0;
  int64_t v_head_stride = 0;
  DType kv_dtype = DType::kBF16;  // f32, f16, bf16, fp8_e4m3, fp8_e5m2

  const int32_t* req_to_token = nullptr;  // [max_reqs + 1, max_context_len]: pool slot per token
  int64_t req_to_token_stride = 0;

  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int v_head_dim = 0;
  // Multiplies q.k before the soft-cap: layer scaling * k_scale (* kFp8E4M3ViaF16Scale).
  float score_scale = 1.f;
  // Multiplies the output: v_scale (* kFp8E4M3ViaF16Scale).
  float value_scale = 1.f;
  float logit_cap = 0.f;         // cap * tanh(x / cap) on the scaled logit; 0 = off
  int sliding_window = -1;       // key visible when q_pos - k_pos <= window; -1 = off
  bool causal = true;            // false: every query sees all keys of its request
  const float* sinks = nullptr;  // [Hq] f32 natural-log sink logits, or nullptr

  int group() const { return num_q_heads / num_kv_heads; }
};

// One request as the kernels see it.
struct CpuRequest {
  int32_t req_row = 0;      // row of req_to_token
  int32_t key_offset = 0;   // column of key 0 in that row (encoder tokens come first)
  int32_t seq_len = 0;      // keys 0 .. seq_len - 1
  int32_t q_start = 0;      // first row of q/out belonging to this request
  int32_t num_queries = 0;  // decode: 1; extend: extend_seq_len
  int32_t first_q_pos = 0;  // position of the first query: decode seq_len - 1; extend prefix_len

  // This request's slots: key j lives in pool row slots()[j].
  const int32_t* slots(const CpuAttentionParams& p) const {
    return p.req_to_token + req_row * p.req_to_token_stride + key_offset;
  }
};

// Keys [*lo, *hi) visible from the query at q_pos of a request with seq_len keys: decoder
// attention is causal with an optional window (q_pos - k <= window); encoder-only attention is
// bidirectional with an optional symmetric window (|q_pos - k| <= window).
inline void visible_keys(const CpuAttentionParams& p, int q_pos, int seq_len, int* lo, int* hi) {
  const bool windowed = p.sliding_window >= 0;
  *lo = windowed ? std::max(0, q_pos - p.sliding_window) : 0;
  if (p.causal) {
    *hi = std::min(q_pos + 1, seq_len);
  } else {
    // int64: q_pos + window + 1 overflows int past INT32_MAX (the backend clips the window to
    // the page table's width, which may itself approach INT32_MAX).
    *hi = windowed
              ? static_cast<int>(std::min<int64_t>(seq_len, int64_t{q_pos} + p.sliding_window + 1))
              : seq_len;
  }
}

// Decode: keys [k_begin, k_end) of one request, every kv head (the pool rows of those keys are
// read once, whole). When a request is split into several chunks, each writes f32 partial output
// + log2-sum-exp of kv head h to scratch slot partial + h * partial_head_stride and a merge pass
// combines them; partial == -1 writes the final output directly.
struct DecodeItem {
  int32_t request = 0;
  int32_t k_begin = 0;
  int32_t k_end = 0;
  int32_t partial = -1;
  int32_t partial_head_stride = 0;
};

// Merge of the chunks partial_begin .. partial_begin + num_partials - 1 of (request, kv head).
struct DecodeMerge {
  int32_t request = 0;
  int32_t kv_head = 0;
  int32_t partial_begin = 0;
  int32_t num_partials = 0;
};

// Extend: query rows [row_begin, row_end) of (request, kv head), where the rows of a kv head are
// its (query token, head of the GQA group) pairs flattened token-major: row = token * group + g.
struct ExtendItem {
  int32_t request = 0;
  int32_t kv_head = 0;
  int32_t row_begin = 0;
  int32_t row_end = 0;
};

// Per-thread scratch of the vector kernels, in floats from the thread's base (each piece starts on
// a 64-byte line).
struct VectorScratchLayout {
  int64_t q = 0;       // [group, D] f32 query rows
  int64_t q_bf16 = 0;  // [group, D] bf16 query rows (vdpbf16ps path)
  int64_t acc = 0;     // [group, Dv] f32 unnormalised output
  int64_t scores = 0;  // [group, kKeyBlock] f32 scores, then probabilities
  int64_t m = 0;       // [group] running max (log2 domain)
  int64_t l = 0;       // [group] running sum
  int64_t alpha = 0;   // [group] rescale of the current block
  int64_t dots = 0;    // [group, kKeyBlock, 16] f32 q.k partial vectors (decode fast path)
  int64_t total = 0;
};
VectorScratchLayout vector_scratch_layout(int group, int head_dim, int v_head_dim);

// Per-thread scratch of the blocked extend kernels, AMX and register blocks (extend_amx.cpp: the
// tile layouts).
struct AmxScratchLayout {
  int64_t q = 0;         // [kAmxRowsPerItem, Dp] bf16 query rows, Dp = D rounded up to 32
  int64_t k_stage = 0;   // [kAmxKeyBlock, Dp] bf16 key rows of the block
  int64_t k_packed = 0;  // [Dp / 32, kAmxKeyBlock / 16, 16, 32] bf16 VNNI tiles of K^T
  int64_t v_stage = 0;   // [kAmxKeyBlock, Dvp] bf16 value rows, Dvp = Dv rounded up to 32
  int64_t v_packed = 0;  // [kAmxKeyBlock / 32, Dvp / 16, 16, 32] bf16 VNNI tiles of V
  int64_t s = 0;         // [2, 32, kAmxKeyBlock] f32 scores of a row-tile pair (double buffer)
  int64_t p = 0;         // [kAmxRowsPerItem, kAmxPvKeys] bf16 probabilities
  int64_t o = 0;         // [kAmxRowsPerItem, Dvp] f32 unnormalised output
  int64_t m = 0;         // [kAmxRowsPerItem] running max (log2 domain)
  int64_t l = 0;         // [kAmxRowsPerItem] running sum
  int64_t total = 0;
};
// Most rows of one blocked extend item (flattened (token, head) rows; a multiple of the 16-row
// tile: every packed K/V block is reused by all of them) and keys per block (a multiple of the
// 32-key tile depth). The planner may use fewer rows per item (down to kAmxMinRowsPerItem) so that
// small batches still give every thread work.
// kAmxRowsPerItem is the capacity (scratch, per-item arrays); the planner starts from
// kAmxDefaultRowsPerItem (ATTNKIT_AMX_ROWS_PER_ITEM overrides it for experiments).
inline constexpr int kAmxRowsPerItem = 512;
inline constexpr int kAmxDefaultRowsPerItem = 256;
inline constexpr int kAmxMinRowsPerItem = 64;
inline constexpr int kAmxKeyBlock = 128;
inline constexpr int kAmxMaxKeyBlock = 2 * kAmxKeyBlock;
// Most keys of one deferred P . V segment of the AMX extend (ExtendWork::pv_blocks compute blocks):
// the width of the P scratch rows.
inline constexpr int kAmxPvKeys = 4 * kAmxKeyBlock;
// Packed blocks of one (request, kv head) when the kernel computes key_block keys at a time: the
// request's keys rounded up to whole compute blocks (the padding blocks are zeros).
inline int64_t amx_blocks_per_head(int seq_len, int key_block) {
  return (seq_len + key_block - 1) / key_block * (key_block / kAmxKeyBlock);
}
AmxScratchLayout amx_scratch_layout(int head_dim, int v_head_dim);
// bf16 elements of one packed key block: K^T tiles [Dp / 32][kAmxKeyBlock / 16] then V tiles
// [kAmxKeyBlock / 32][Dvp / 16], each tile 16 x 32 bf16 (the k_packed / v_packed layouts).
int64_t amx_packed_block_elems(int head_dim, int v_head_dim);

struct DecodeWork {
  const std::vector<CpuRequest>* requests;
  const std::vector<DecodeItem>* items;
  const std::vector<DecodeMerge>* merges;
  float* partial_out;  // [num_partials, group, Dv] f32
  float* partial_lse;  // [num_partials, group] f32, log2 domain
  // AMX decode software prefetch into L2 (ATTNKIT_AMX_DECODE_PF): 0 none (default), 1 per (tile,
  // kv head) slice, 2 whole rows in address order, 3 whole rows one sub-block further ahead.
  int amx_prefetch = 0;
  // AMX decode keys per softmax sub-block (ATTNKIT_AMX_DECODE_SUBKEYS=128 / 256 / 512): 0 (default)
  // 512 for items of >= 1024 keys whose tiles are read in place, else 128.
  int amx_sub_keys = 0;
};

// Blocked extend with K/V packed once per forward: every (request, kv head, key block) of the
// requests' keys [0, seq_len) is packed into the VNNI tile layouts by a first parallel pass, and
// the items read the packed blocks (instead of each item packing every block it visits; at a 2k
// causal prefill each block was packed about 16 times). Block b of kv head h of request r starts
// at packed + (pack_begin[r] + h * ceil(seq_len / kAmxKeyBlock) + b) * amx_packed_block_elems;
// pack_begin has one more entry than there are requests (the total). packed == nullptr: each
// item packs into its thread's scratch.
struct ExtendWork {
  const std::vector<CpuRequest>* requests;
  const std::vector<ExtendItem>* items;
  uint16_t* packed = nullptr;
  const std::vector<int64_t>* pack_begin = nullptr;
  // Keys per compute block of the blocked kernels: kAmxKeyBlock, or kAmxMaxKeyBlock (two
  // consecutive packed blocks; only with packed set).
  int key_block = kAmxKeyBlock;
  // Software-pipelined AMX item loop (S of the next row-tile pair and P . V of the previous one
  // interleaved with the softmax rows of the current one); false: the loop before session 7
  // (ATTNKIT_AMX_PIPELINE=0).
  bool pipelined = true;
  // Lean softmax rows of the pipelined loop with the max pass folded into the exp pass and a
  // degree-3 exp2 (default since session 8; ATTNKIT_AMX_SOFTMAX=0 keeps the two-pass rows). The
  // register-block kernels run the plain loop, so neither switch applies to them.
  bool fast_softmax = true;
  // The pipelined loop's masked units (diagonal or partial key blocks, or soft-capped rows) run
  // their softmax rows between the tile micro-steps as the lean units do (softmax_row_masked);
  // false: after the step's tile work (ATTNKIT_AMX_MASKED_ROWS=1 turns it on; off: level with it
  // on the Xeon host in session 35's five alternated rounds, docs/perf/amx_notes.md).
  bool masked_rows = false;
  // Compute blocks per P . V of the pipelined AMX loop (1, 2 or 4; at most kAmxPvKeys keys): a row
  // pair's probabilities of that many consecutive blocks are kept and multiplied by V at once, so
  // its O tiles are loaded and stored once per segment instead of once per block
  // (ATTNKIT_AMX_PV_BLOCKS; the plain loop and the register-block kernels use 1).
  int pv_blocks = 1;
};

// Thread scratch: thread t uses scratch + t * scratch_stride floats.
struct ThreadScratch {
  float* base = nullptr;
  int64_t stride = 0;
  int num_threads = 1;
};

// ---- ISA-independent pieces (cpu_attention_common.cpp) ----
// Converts q rows [token, hq0 .. hq0 + n) to f32 [n, D] and, when q_bf16 is not null, copies them
// as bf16 [n, D] (act_dtype must be bf16 then).
void load_query_rows(const CpuAttentionParams& p, int token, int hq0, int n, float* q,
                     uint16_t* q_bf16);
// Writes out (and lse) rows [token, hq0 .. hq0 + n) from the online-softmax state: m/l [n] (m in
// log2 units), acc [n, acc_stride] unnormalised; applies sinks and value_scale.
void finalize_rows(const CpuAttentionParams& p, int token, int hq0, int n, const float* m,
                   const float* l, const float* acc, int64_t acc_stride);
// The epilogue factors of one row from its online-softmax state (m in log2 units, l): out =
// acc * *factor (sinks and value_scale folded in; 0 when l is 0) and the natural-log LSE.
void row_epilogue(const CpuAttentionParams& p, int hq, float m, float l, float* factor, float* lse);
// Combines the split-KV partials of every DecodeMerge of w (threads over merges).
void merge_decode_partials(const CpuAttentionParams& p, const DecodeWork& w, int num_threads);

// ---- entry points, one set per ISA translation unit ----
void decode_scalar(const CpuAttentionParams& p, const DecodeWork& w, const ThreadScratch& s);
void extend_scalar(const CpuAttentionParams& p, const ExtendWork& w, const ThreadScratch& s);
void decode_avx2(const CpuAttentionParams& p, const DecodeWork& w, const ThreadScratch& s);
void extend_avx2(const CpuAttentionParams& p, const ExtendWork& w, const ThreadScratch& s);
void decode_avx512(const CpuAttentionParams& p, const DecodeWork& w, const ThreadScratch& s);
void extend_avx512(const CpuAttentionParams& p, const ExtendWork& w, const ThreadScratch& s);
void decode_avx512_bf16(const CpuAttentionParams& p, const DecodeWork& w, const ThreadScratch& s);
void extend_avx512_bf16(const CpuAttentionParams& p, const ExtendWork& w, const ThreadScratch& s);
void extend_amx(const CpuAttentionParams& p, const ExtendWork& w, const ThreadScratch& s);
// The AMX extend's algorithm with its two products by vdpbf16ps register blocks instead of tiles
// (extend_amx.cpp), for AVX512-BF16 CPUs without AMX: same plan, packed blocks and scratch
// (amx_scratch_layout). The backend runs it for bf16 q with bf16 / fp8_e4m3 / fp8_e5m2 KV (exact
// in bf16); other dtypes run extend_avx512_bf16.
void extend_blocked_avx512_bf16(const CpuAttentionParams& p, const ExtendWork& w,
                                const ThreadScratch& s);
// The same with f32 FMA register blocks for AVX-512F CPUs without AVX512-BF16 (the bf16 roundings
// in integer arithmetic); the same dtypes, else extend_avx512.
void extend_blocked_avx512(const CpuAttentionParams& p, const ExtendWork& w,
                           const ThreadScratch& s);
// AMX decode (decode_amx.cpp): S^T = K . Q^T and P . V on tiles, K/V rows read in place. Shapes
// it does not take (amx_decode_supported false) run decode_avx512_bf16.
void decode_amx(const CpuAttentionParams& p, const DecodeWork& w, const ThreadScratch& s);
bool amx_decode_supported(const CpuAttentionParams& p);
// Thread scratch (floats) of decode_amx.
int64_t amx_decode_scratch_floats(int num_q_heads, int num_kv_heads, int head_dim);

}  // namespace attnkit::cpu_attention
