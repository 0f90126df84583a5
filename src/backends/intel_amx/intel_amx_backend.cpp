// intel_amx: the CPU attention backend (host protocol, planning and ISA dispatch). The kernels are
// in kernels/: one vector implementation instantiated per ISA (scalar, AVX2, AVX-512,
// AVX-512-BF16), the blocked extend kernel (AMX-BF16 tiles, or register blocks of vdpbf16ps /
// f32 FMAs on AVX-512 without AMX) and the AMX decode.
#include "backends/intel_amx/intel_amx_backend.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attnkit/registry.h"
#include "backend/kernel_params.h"
#include "backends/intel_amx/kernels/cpu_attention_params.h"
#include "core/env_knob.h"
#include "core/str_cat.h"

#ifdef ATTNKIT_WITH_OPENMP
#include <omp.h>
#endif

namespace attnkit {
namespace {

using cpu_attention::CpuAttentionParams;
using cpu_attention::CpuRequest;
using cpu_attention::DecodeItem;
using cpu_attention::DecodeMerge;
using cpu_attention::DecodeWork;
using cpu_attention::ExtendItem;
using cpu_attention::ExtendWork;
using cpu_attention::ThreadScratch;

constexpr const char* kIsaEnvVar = "ATTNKIT_CPU_ISA";
constexpr CpuIsa kAllIsas[] = {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16,
                               CpuIsa::kAmx};

// Decode split-KV heuristic: a decode item covers every kv head of a key range of one request
// (its pool rows are read whole, in order). Aim for kDecodeItemsPerThread items per thread so
// dynamic scheduling evens out ragged lengths, but never split below kMinSplitKeys keys (the
// merge and the per-item query load must stay small next to the keys read).
// Example: bs 1, 32k keys, 16 threads: 32768 keys / 64 items = 512-key chunks, 64 items.
// bs 8, 4k keys, 2 threads: chunk 32768 / 8 = 4096 keys, so no split: 8 items (one per request).
constexpr int kDecodeItemsPerThread = 4;
constexpr int kMinSplitKeys = 256;
// Extend items of the per-token vector kernels: this many query tokens (all heads of the group).
constexpr int kVectorExtendTokensPerItem = 16;
constexpr int kExtendItemsPerThread = 4;
// The blocked extend packs each forward's K/V blocks once (ExtendWork::packed) while the packed
// copy stays below this size; larger batches pack per item into the thread scratch.
constexpr int64_t kMaxPackedBytes = int64_t{512} << 20;
// Experiment switches of the blocked extend (AMX, and the register blocks on avx512_bf16 /
// avx512; read once per backend): ATTNKIT_AMX_PREPACK=0 packs per
// item (the layout before packing once per forward), ATTNKIT_AMX_ROWS_PER_ITEM (64..512, a power
// of two) sets the largest item, ATTNKIT_AMX_KEY_BLOCK=256 computes 256 keys per block (two packed
// blocks; only when packing once per forward). Other values are reported and keep the defaults
// (core/env_knob.h).
constexpr const char* kPrepackEnvVar = "ATTNKIT_AMX_PREPACK";
constexpr const char* kRowsPerItemEnvVar = "ATTNKIT_AMX_ROWS_PER_ITEM";
constexpr const char* kKeyBlockEnvVar = "ATTNKIT_AMX_KEY_BLOCK";
// ATTNKIT_AMX_PIPELINE=0: the AMX extend loop without the software pipelining of session 7.
constexpr const char* kPipelineEnvVar = "ATTNKIT_AMX_PIPELINE";
// ATTNKIT_AMX_DECODE=0: decode on the amx path runs the avx512_bf16 vector kernel (the decode
// before session 8) instead of the AMX tile decode.
constexpr const char* kAmxDecodeEnvVar = "ATTNKIT_AMX_DECODE";

// The AMX extend's lean softmax rows fold the max pass into the exp pass
// (ExtendWork::fast_softmax), the default since session 8 (Xeon host of the H200 lease, 2026-11-23
// 07:42Z, 2k causal, alternated: 2 threads 34.6 / 45.6 ms vs 44.8 / 49.1 ms, 16 threads 7.77
// vs 8.15 ms); ATTNKIT_AMX_SOFTMAX=0 keeps the two-pass row.
constexpr const char* kFastSoftmaxEnvVar = "ATTNKIT_AMX_SOFTMAX";
// ATTNKIT_AMX_MASKED_ROWS=1: the AMX extend's masked units run their softmax rows between the tile
// micro-steps (ExtendWork::masked_rows); off by default: level on an AMX Xeon (session 35).
constexpr const char* kMaskedRowsEnvVar = "ATTNKIT_AMX_MASKED_ROWS";
// ATTNKIT_AMX_PV_BLOCKS=1|2|4: compute blocks per P . V segment of the pipelined AMX extend
// (ExtendWork::pv_blocks). 4 by default since session 82 (AMX development VM, 2 threads, 2k causal,
// four alternated rounds: 23.2-24.1% of the paired AMX peak against 22.2-23.2% per block; the
// tile work alone 33.7-34.9% against 31.4-32.2%, docs/perf/amx_notes.md).
constexpr const char* kPvBlocksEnvVar = "ATTNKIT_AMX_PV_BLOCKS";
constexpr int kDefaultPvBlocks = 4;

// On avx512_bf16 and avx512 (no AMX), extend with bf16 q and bf16 / fp8 KV runs the AMX kernel's
// algorithm with register blocks of vdpbf16ps (extend_blocked_avx512_bf16; session 29, AMD Zen 5
// dev VM, 2k causal, 2 threads: 43-46 ms vs 153-168 ms for the per-token kernel, docs/PERF.md) or
// of f32 FMAs (extend_blocked_avx512); ATTNKIT_CPU_BLOCKED_EXTEND=0 keeps the per-token vector
// kernel of those ISAs for every extend. Read on every ISA (so a bad value is reported anywhere);
// amx, scalar and avx2 ignore it.
constexpr const char* kBlockedExtendEnvVar = "ATTNKIT_CPU_BLOCKED_EXTEND";

// Unset, or set to a number other than 0 (any integer; 0 = off).
bool env_on_unless_zero(const char* name) {
  return env_int_if(
             name, 1, [](int) { return true; }, "an integer, 0 = off") != 0;
}

// ATTNKIT_AMX_DECODE_PF=1|2|3: the AMX decode's software prefetch modes (DecodeWork::amx_prefetch;
// default 0, none; session 8 A/B).
int env_amx_decode_prefetch() { return env_int_range("ATTNKIT_AMX_DECODE_PF", 0, 0, 3); }

// ATTNKIT_AMX_DECODE_SUBKEYS=128|256|512: the AMX decode's keys per softmax sub-block for every
// item (DecodeWork::amx_sub_keys); unset: 512 for items of >= 1024 keys whose tiles are read in
// place, else 128 (session 25).
int env_amx_decode_sub_keys() {
  return env_int_if(
      "ATTNKIT_AMX_DECODE_SUBKEYS", 0, [](int v) { return v == 128 || v == 256 || v == 512; },
      "128, 256 or 512");
}

bool env_pipeline() { return env_flag(kPipelineEnvVar, true); }

bool env_prepack() { return env_flag(kPrepackEnvVar, true); }

int env_key_block() {
  return env_int(kKeyBlockEnvVar, cpu_attention::kAmxKeyBlock,
                 {cpu_attention::kAmxKeyBlock, cpu_attention::kAmxMaxKeyBlock});
}

int env_pv_blocks() { return env_int(kPvBlocksEnvVar, kDefaultPvBlocks, {1, 2, 4}); }

int env_rows_per_item() {
  const auto ok = [](int rows) {
    for (int r = cpu_attention::kAmxMinRowsPerItem; r <= cpu_attention::kAmxRowsPerItem; r *= 2) {
      if (r == rows) return true;
    }
    return false;
  };
  return env_int_if(kRowsPerItemEnvVar, cpu_attention::kAmxDefaultRowsPerItem, ok,
                    cat("powers of two ", cpu_attention::kAmxMinRowsPerItem, "..",
                        cpu_attention::kAmxRowsPerItem));
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Far above any CPU's hardware threads; each thread owns a scratch slice.
constexpr int kMaxThreads = 4096;

int default_num_threads(int requested) {
  if (requested > 0) return requested;
#ifdef ATTNKIT_WITH_OPENMP
  return std::max(1, omp_get_max_threads());
#else
  return 1;
#endif
}

bool kv_dtype_supported(DType d) {
  return d == DType::kBF16 || d == DType::kF16 || d == DType::kF32 || d == DType::kFP8E4M3 ||
         d == DType::kFP8E5M2;
}

Status check_head_dim(int dim, const char* name) {
  if (dim > 0 && dim % cpu_attention::kHeadDimMultiple == 0 && dim <= cpu_attention::kMaxHeadDim) {
    return Status::ok();
  }
  return Status::unsupported(
      cat(name, " ", dim, " is not supported by intel_amx (needs a multiple of ",
          cpu_attention::kHeadDimMultiple, " up to ", cpu_attention::kMaxHeadDim, ")"));
}

// The work of one forward for one key set (self-attention over decoder tokens, or
// cross-attention over encoder tokens): shared by every layer of that kind.
struct Plan {
  std::vector<CpuRequest> requests;
  std::vector<DecodeItem> decode_items;
  std::vector<DecodeMerge> decode_merges;
  std::vector<ExtendItem> extend_items;
  // The extend items were planned for the blocked kernel (IntelAmxBackend::blocked_applies);
  // otherwise for the per-token vector kernel.
  bool blocked = false;
  // Blocked extend with K/V packed once per forward: first packed block of each request, then the
  // total (ExtendWork::pack_begin); empty when the items pack for themselves.
  std::vector<int64_t> pack_begin;
  int key_block = cpu_attention::kAmxKeyBlock;  // ExtendWork::key_block
  int32_t num_partials = 0;
};

class IntelAmxBackend final : public AttentionBackend {
 public:
  IntelAmxBackend(const BackendContext& ctx, CpuIsa isa, const BackendDescriptor& descriptor)
      : ctx_(ctx),
        isa_(isa),
        descriptor_(descriptor),
        num_threads_(default_num_threads(ctx.num_threads)),
        prepack_(env_prepack()),
        amx_rows_per_item_(env_rows_per_item()),
        amx_key_block_(env_key_block()),
        amx_pipeline_(env_pipeline()),
        amx_decode_(env_on_unless_zero(kAmxDecodeEnvVar)),
        amx_fast_softmax_(env_on_unless_zero(kFastSoftmaxEnvVar)),
        amx_masked_rows_(env_flag(kMaskedRowsEnvVar, false)),
        amx_pv_blocks_(env_pv_blocks()),
        amx_decode_prefetch_(env_amx_decode_prefetch()),
        amx_decode_sub_keys_(env_amx_decode_sub_keys()),
        blocked_extend_(env_flag(kBlockedExtendEnvVar, true)) {}

  // Per-thread scratch for the context's head counts and dims: sized once here, reused by every
  // forward (the kernels never allocate).
  Status init() {
    // One scratch slice per thread: a garbage count (OMP_NUM_THREADS=100000) failed as a 59 GB
    // allocation naming nothing.
    if (num_threads_ > kMaxThreads) {
      return Status::invalid_argument(
          cat("intel_amx: ", num_threads_, " threads (BackendContext.num_threads ",
              ctx_.num_threads, ", else OMP_NUM_THREADS) is above the limit ", kMaxThreads));
    }
    // Decode keeps the state of every q head (extend only a group's).
    int64_t floats =
        cpu_attention::vector_scratch_layout(ctx_.num_q_heads, ctx_.qk_head_dim, ctx_.v_head_dim)
            .total;
    if (blocked_possible()) {
      floats = std::max(floats,
                        cpu_attention::amx_scratch_layout(ctx_.qk_head_dim, ctx_.v_head_dim).total);
    }
    if (isa_ == CpuIsa::kAmx) {
      floats = std::max(floats, cpu_attention::amx_decode_scratch_floats(
                                    ctx_.num_q_heads, ctx_.num_kv_heads, ctx_.qk_head_dim));
    }
    scratch_stride_ = floats;
    ATTNKIT_ASSIGN_OR_RETURN(
        scratch_, Buffer::allocate(Device::cpu(),
                                   floats * num_threads_ * static_cast<int64_t>(sizeof(float))));
    return Status::ok();
  }

  std::optional<Device> device() const override { return ctx_.device; }
  const BackendDescriptor& descriptor() const override { return descriptor_; }
  CpuIsa isa() const { return isa_; }
  const char* last_extend_kernel() const { return last_extend_kernel_; }

  Status init_forward_metadata(const ForwardBatch& batch) override {
    planned_ = false;
    plan_refused_.clear();
    Status s = build_plan(batch);
    // A forward after a refused plan names that refusal (its first cause), not a missing call.
    if (!s.is_ok()) plan_refused_ = s.to_string();
    return s;
  }

  // init_forward_metadata's work (planned_ is false until it succeeds).
  Status build_plan(const ForwardBatch& batch) {
    ATTNKIT_RETURN_IF_ERROR(batch.validate());  // an idle batch too: it must hold no tokens
    if (batch.mode == ForwardMode::kIdle) return Status::ok();
    ATTNKIT_RETURN_IF_ERROR(check_spec(batch));
    build_requests(batch, /*cross=*/false, &self_);
    has_cross_ = !batch.encoder_lens_host.empty();
    if (has_cross_) build_requests(batch, /*cross=*/true, &cross_);
    ATTNKIT_RETURN_IF_ERROR(check_key_slots(batch, self_));
    if (has_cross_) ATTNKIT_RETURN_IF_ERROR(check_key_slots(batch, cross_));
    const bool decode = batch.mode == ForwardMode::kDecode;
    const DType kv_dtype = batch.kv_pool->dtype();
    decode ? plan_decode(&self_) : plan_extend(kv_dtype, &self_);
    if (has_cross_) decode ? plan_decode(&cross_) : plan_extend(kv_dtype, &cross_);
    const int group = ctx_.num_q_heads / ctx_.num_kv_heads;
    const int32_t partials = std::max(self_.num_partials, has_cross_ ? cross_.num_partials : 0);
    partial_out_.resize(static_cast<size_t>(partials) * group * ctx_.v_head_dim);
    partial_lse_.resize(static_cast<size_t>(partials) * group);
    int64_t pack_blocks = 0;
    if (!self_.pack_begin.empty()) pack_blocks = self_.pack_begin.back();
    if (has_cross_ && !cross_.pack_begin.empty()) {
      pack_blocks = std::max(pack_blocks, cross_.pack_begin.back());
    }
    const int64_t pack_bytes =
        pack_blocks * cpu_attention::amx_packed_block_elems(ctx_.qk_head_dim, ctx_.v_head_dim) *
        static_cast<int64_t>(sizeof(uint16_t));
    if (pack_bytes > packed_.bytes()) {  // grows only; reused by every layer of the forward
      ATTNKIT_ASSIGN_OR_RETURN(packed_, Buffer::allocate(Device::cpu(), pack_bytes));
    }
    planned_mode_ = batch.mode;
    planned_batch_size_ = batch.batch_size;
    planned_rows_ = batch.req_pool_indices_host;
    planned_seq_lens_ = batch.seq_lens_host;
    planned_encoder_lens_ = batch.encoder_lens_host;
    planned_extend_lens_ = batch.extend_seq_lens_host;
    planned_num_tokens_ = batch.num_tokens;
    planned_kv_pool_ = batch.kv_pool;
    planned_req_to_token_ = batch.req_to_token_pool;
    planned_draft_tokens_ =
        batch.mode == ForwardMode::kTargetVerify ? batch.spec.draft_token_num : 0;
    planned_topk_ = batch.spec.topk;
    planned_custom_mask_ = batch.spec.custom_mask.data;
    planned_ = true;
    return Status::ok();
  }

  Status forward_extend(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const AttentionLayer& layer,
                        const ForwardBatch& batch, bool save_kv, const TensorView& lse) override {
    if (batch.mode == ForwardMode::kDecode) {
      return Status::invalid_argument(
          "forward_extend called with batch.mode decode (use forward_decode or forward)");
    }
    CpuAttentionParams p;
    ATTNKIT_RETURN_IF_ERROR(prepare(q, k, v, out, layer, batch, save_kv, lse, &p));
    if (batch.num_tokens == 0) return Status::ok();
    const Plan& plan = layer.is_cross_attention ? cross_ : self_;
    ExtendWork work{&plan.requests, &plan.extend_items};
    work.pipelined = amx_pipeline_;
    work.fast_softmax = amx_fast_softmax_;
    work.masked_rows = amx_masked_rows_;
    work.pv_blocks = amx_pv_blocks_;
    if (!plan.pack_begin.empty()) {
      work.packed = static_cast<uint16_t*>(packed_.data());
      work.pack_begin = &plan.pack_begin;
      work.key_block = plan.key_block;
    }
    const ThreadScratch ts = thread_scratch();
    // The blocked kernels only where planned for (their items and packed blocks) and where this
    // call's q dtype agrees with the context's; else the per-token kernel of the ISA.
    const bool blocked = plan.blocked && blocked_applies(q.dtype, p.kv_dtype);
    last_extend_kernel_ = blocked ? blocked_kernel_name()
                                  : cpu_isa_name(isa_ == CpuIsa::kAmx ? CpuIsa::kAvx512Bf16 : isa_);
    switch (isa_) {
      case CpuIsa::kAmx:
        if (blocked) {
          cpu_attention::extend_amx(p, work, ts);
        } else {
          cpu_attention::extend_avx512_bf16(p, work, ts);
        }
        break;
      case CpuIsa::kAvx512Bf16:
        if (blocked) {
          cpu_attention::extend_blocked_avx512_bf16(p, work, ts);
        } else {
          cpu_attention::extend_avx512_bf16(p, work, ts);
        }
        break;
      case CpuIsa::kAvx512:
        if (blocked) {
          cpu_attention::extend_blocked_avx512(p, work, ts);
        } else {
          cpu_attention::extend_avx512(p, work, ts);
        }
        break;
      case CpuIsa::kAvx2:
        cpu_attention::extend_avx2(p, work, ts);
        break;
      case CpuIsa::kScalar:
        cpu_attention::extend_scalar(p, work, ts);
        break;
    }
    return Status::ok();
  }

  Status forward_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const AttentionLayer& layer,
                        const ForwardBatch& batch, bool save_kv, const TensorView& lse) override {
    if (batch.mode != ForwardMode::kDecode) {
      return Status::invalid_argument(cat("forward_decode called with batch.mode ",
                                          forward_mode_name(batch.mode), " (needs decode)"));
    }
    CpuAttentionParams p;
    ATTNKIT_RETURN_IF_ERROR(prepare(q, k, v, out, layer, batch, save_kv, lse, &p));
    if (batch.num_tokens == 0) return Status::ok();
    const Plan& plan = layer.is_cross_attention ? cross_ : self_;
    const DecodeWork work{&plan.requests,      &plan.decode_items,  &plan.decode_merges,
                          partial_out_.data(), partial_lse_.data(), amx_decode_prefetch_,
                          amx_decode_sub_keys_};
    const ThreadScratch ts = thread_scratch();
    switch (isa_) {
      case CpuIsa::kAmx:
        if (amx_decode_) {
          cpu_attention::decode_amx(p, work, ts);
        } else {
          cpu_attention::decode_avx512_bf16(p, work, ts);
        }
        break;
      case CpuIsa::kAvx512Bf16:
        cpu_attention::decode_avx512_bf16(p, work, ts);
        break;
      case CpuIsa::kAvx512:
        cpu_attention::decode_avx512(p, work, ts);
        break;
      case CpuIsa::kAvx2:
        cpu_attention::decode_avx2(p, work, ts);
        break;
      case CpuIsa::kScalar:
        cpu_attention::decode_scalar(p, work, ts);
        break;
    }
    if (!plan.decode_merges.empty()) cpu_attention::merge_decode_partials(p, work, num_threads_);
    return Status::ok();
  }

 private:
  ThreadScratch thread_scratch() {
    return {static_cast<float*>(scratch_.data()), scratch_stride_, num_threads_};
  }

  // Target verify runs each request's drafts causally after its prefix: right for a chain
  // (topk 1). A custom_mask given with topk 1 must then be that chain (prefix columns 1, draft
  // row i sees drafts 0..i); any other mask was ignored, a silent wrong answer where the other
  // backends apply it. One pass over the mask per plan (host memory on this backend; ~1 ms for
  // 64 requests x 8 drafts x 32k keys).
  static Status check_spec(const ForwardBatch& batch) {
    if (batch.mode != ForwardMode::kTargetVerify) return Status::ok();
    if (batch.spec.topk > 1) {
      return Status::unsupported(cat("intel_amx does not support speculative verify trees (topk ",
                                     batch.spec.topk,
                                     "; supported: topk 1, a chain verified causally)"));
    }
    if (!batch.spec.custom_mask.defined()) return Status::ok();
    const auto* mask = static_cast<const uint8_t*>(batch.spec.custom_mask.data);
    const int64_t n = batch.spec.draft_token_num;
    for (int r = 0; r < batch.batch_size; ++r) {
      const int64_t prefix = batch.seq_lens_host[static_cast<size_t>(r)];
      const uint8_t* block = mask + batch.spec.mask_indptr_host[static_cast<size_t>(r)];
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t* row = block + i * (prefix + n);
        // The prefix columns (most of the mask) by memchr for a 0 byte, the drafts' one by one.
        const void* zero = std::memchr(row, 0, static_cast<size_t>(prefix));
        const int64_t first = zero == nullptr ? prefix : static_cast<const uint8_t*>(zero) - row;
        for (int64_t c = first; c < prefix + n; ++c) {
          const bool want = c < prefix + i + 1;
          if ((row[c] != 0) != want) {
            return Status::unsupported(
                cat("intel_amx verifies a chain causally (topk 1): spec.custom_mask of request ", r,
                    ", draft ", i, ", column ", c, " is ", int{row[c]}, " where the chain has ",
                    int{want},
                    " (prefix columns 1, draft i sees drafts 0..i); other masks "
                    "(speculative trees) are not supported"));
          }
        }
      }
    }
    return Status::ok();
  }

  // Every req_to_token entry a plan reads must be a usable slot of the pool ([page_size, rows):
  // page 0 is reserved); the kernels index the pool with them unchecked.
  // Run per layer too, so the common case is a min / max reduction per request (vectorised,
  // requests across threads): ~0.1 ns per key; only a batch that fails is walked for the message.
  static Status check_key_slots(const ForwardBatch& batch, const Plan& plan) {
    const int64_t lo = batch.kv_pool->page_size();
    const int64_t hi = batch.kv_pool->rows();
    const auto n = static_cast<int64_t>(plan.requests.size());
    int64_t keys = 0;
    for (const CpuRequest& rq : plan.requests) keys += rq.seq_len;
    int bad = 0;
#ifdef ATTNKIT_WITH_OPENMP
#pragma omp parallel for schedule(static) reduction(| : bad) if (keys > (int64_t{1} << 16))
#endif
    for (int64_t r = 0; r < n; ++r) {
      const CpuRequest& rq = plan.requests[static_cast<size_t>(r)];
      const int32_t* row = batch.req_to_token_pool->host_row(rq.req_row);
      if (row == nullptr) continue;
      const int32_t* slots = row + rq.key_offset;
      int32_t low = std::numeric_limits<int32_t>::max();
      int32_t high = std::numeric_limits<int32_t>::min();
      for (int32_t j = 0; j < rq.seq_len; ++j) {
        low = std::min(low, slots[j]);
        high = std::max(high, slots[j]);
      }
      if (rq.seq_len > 0 && (low < lo || high >= hi)) bad |= 1;
    }
    if (bad == 0) return Status::ok();
    for (size_t r = 0; r < plan.requests.size(); ++r) {
      const CpuRequest& rq = plan.requests[r];
      const int32_t* row = batch.req_to_token_pool->host_row(rq.req_row);
      for (int32_t j = 0; row != nullptr && j < rq.seq_len; ++j) {
        const int32_t slot = row[rq.key_offset + j];
        if (slot < lo || slot >= hi) {
          return Status::invalid_argument(
              cat("req_to_token[", rq.req_row, ", ", rq.key_offset + j, "] = ", slot, " (request ",
                  r, ") is outside the KV pool slots [", lo, ", ", hi, ")"));
        }
      }
    }
    return Status::ok();
  }

  // Requests of the batch. Request r's req_to_token row holds its encoder tokens first, then its
  // decoder tokens: self-attention keys start after the encoder tokens, cross-attention keys are
  // the encoder tokens (all visible: the kernels run them non-causal without a window).
  static void build_requests(const ForwardBatch& batch, bool cross, Plan* plan) {
    const int bs = batch.batch_size;
    plan->requests.resize(static_cast<size_t>(bs));
    int32_t q_start = 0;
    for (int r = 0; r < bs; ++r) {
      const size_t i = static_cast<size_t>(r);
      CpuRequest& rq = plan->requests[i];
      const int32_t encoder_len = batch.encoder_lens_host.empty() ? 0 : batch.encoder_lens_host[i];
      rq.req_row = batch.req_pool_indices_host[i];
      rq.key_offset = cross ? 0 : encoder_len;
      const int32_t seq_len = batch.seq_lens_host[i];
      switch (batch.mode) {
        case ForwardMode::kDecode:
          rq.seq_len = seq_len;
          rq.num_queries = 1;
          rq.first_q_pos = seq_len - 1;
          break;
        case ForwardMode::kTargetVerify:  // seq_len is the committed prefix; the drafts follow it
          rq.num_queries = batch.spec.draft_token_num;
          rq.seq_len = seq_len + rq.num_queries;
          rq.first_q_pos = seq_len;
          break;
        default:
          rq.seq_len = seq_len;
          rq.num_queries = batch.extend_seq_lens_host[i];
          rq.first_q_pos = batch.extend_prefix_lens_host[i];
          break;
      }
      if (cross) rq.seq_len = encoder_len;
      rq.q_start = q_start;
      q_start += rq.num_queries;
    }
  }

  void plan_decode(Plan* plan) const {
    plan->decode_items.clear();
    plan->decode_merges.clear();
    plan->pack_begin.clear();
    const int hkv = ctx_.num_kv_heads;
    int64_t keys = 0;
    for (const CpuRequest& rq : plan->requests) keys += rq.seq_len;
    const int64_t target_items = static_cast<int64_t>(num_threads_) * kDecodeItemsPerThread;
    const int64_t chunk = ceil_div(std::max<int64_t>(kMinSplitKeys, ceil_div(keys, target_items)),
                                   cpu_attention::kKeyBlock) *
                          cpu_attention::kKeyBlock;
    int32_t partials = 0;
    for (int32_t r = 0; r < static_cast<int32_t>(plan->requests.size()); ++r) {
      const int32_t len = plan->requests[static_cast<size_t>(r)].seq_len;
      const int32_t splits = static_cast<int32_t>(std::max<int64_t>(1, ceil_div(len, chunk)));
      if (splits == 1) {
        plan->decode_items.push_back({r, 0, len, -1, 0});
        continue;
      }
      // Partial slots of request r: [partials, partials + hkv * splits), head-major.
      for (int32_t h = 0; h < hkv; ++h) {
        plan->decode_merges.push_back({r, h, partials + h * splits, splits});
      }
      for (int32_t s = 0; s < splits; ++s) {
        const int32_t begin = static_cast<int32_t>(s * chunk);
        const int32_t end = static_cast<int32_t>(std::min<int64_t>(len, begin + chunk));
        plan->decode_items.push_back({r, begin, end, partials + s, splits});
      }
      partials += hkv * splits;
    }
    plan->num_partials = partials;
  }

  void plan_extend(DType kv_dtype, Plan* plan) const {
    std::vector<ExtendItem>& items = plan->extend_items;
    items.clear();
    const int group = ctx_.num_q_heads / ctx_.num_kv_heads;
    int rows_per_item = kVectorExtendTokensPerItem * group;
    plan->blocked = blocked_applies(ctx_.q_dtype, kv_dtype);
    if (plan->blocked) {
      // Largest item (best reuse of each packed K/V block) that still leaves
      // kExtendItemsPerThread items per thread. Example: one 2048-token request, group 4, 8 kv
      // heads, 16 threads: 8192 rows per head / 256 = 32 items per head, 256 >= 64 items: 256.
      int64_t total_rows = 0;
      for (const CpuRequest& rq : plan->requests) total_rows += rq.num_queries * group;
      const int64_t wanted = static_cast<int64_t>(num_threads_) * kExtendItemsPerThread;
      rows_per_item = amx_rows_per_item_;
      while (rows_per_item > cpu_attention::kAmxMinRowsPerItem &&
             ceil_div(total_rows, rows_per_item) * ctx_.num_kv_heads < wanted) {
        rows_per_item /= 2;
      }
    }
    for (int32_t r = 0; r < static_cast<int32_t>(plan->requests.size()); ++r) {
      const int32_t rows = plan->requests[static_cast<size_t>(r)].num_queries * group;
      for (int32_t h = 0; h < ctx_.num_kv_heads; ++h) {
        for (int32_t row = 0; row < rows; row += rows_per_item) {
          items.push_back({r, h, row, std::min(rows, row + rows_per_item)});
        }
      }
    }
    // Most keys first (the last query blocks of long causal requests), so dynamic scheduling
    // does not end on one long item.
    auto keys_of = [&](const ExtendItem& it) {
      const CpuRequest& rq = plan->requests[static_cast<size_t>(it.request)];
      return std::min(rq.seq_len, rq.first_q_pos + (it.row_end - 1) / group + 1);
    };
    std::stable_sort(items.begin(), items.end(), [&](const ExtendItem& a, const ExtendItem& b) {
      return keys_of(a) > keys_of(b);
    });
    plan->pack_begin.clear();
    plan->key_block = cpu_attention::kAmxKeyBlock;
    if (!plan->blocked || !prepack_ || items.empty()) return;
    const int64_t block_bytes =
        cpu_attention::amx_packed_block_elems(ctx_.qk_head_dim, ctx_.v_head_dim) *
        static_cast<int64_t>(sizeof(uint16_t));
    int64_t blocks = 0;
    plan->pack_begin.reserve(plan->requests.size() + 1);
    for (const CpuRequest& rq : plan->requests) {
      plan->pack_begin.push_back(blocks);
      blocks += cpu_attention::amx_blocks_per_head(rq.seq_len, amx_key_block_) * ctx_.num_kv_heads;
    }
    plan->pack_begin.push_back(blocks);
    if (blocks * block_bytes > kMaxPackedBytes) {
      plan->pack_begin.clear();
    } else {
      plan->key_block = amx_key_block_;
    }
  }

  // Whether this backend's ISA has a blocked extend kernel: AMX tiles, or the register blocks of
  // avx512_bf16 (vdpbf16ps) and avx512 (f32 FMA) unless ATTNKIT_CPU_BLOCKED_EXTEND=0.
  bool blocked_possible() const {
    return isa_ == CpuIsa::kAmx ||
           ((isa_ == CpuIsa::kAvx512Bf16 || isa_ == CpuIsa::kAvx512) && blocked_extend_);
  }

  // intel_amx_last_extend_kernel's name of the blocked kernel of this ISA.
  const char* blocked_kernel_name() const {
    switch (isa_) {
      case CpuIsa::kAmx:
        return "amx";
      case CpuIsa::kAvx512Bf16:
        return "blocked_avx512_bf16";
      default:
        return "blocked_avx512";
    }
  }

  // Whether the blocked extend runs q / KV of these dtypes: its operands are bf16, so q must be
  // bf16 (f16 / f32 activations would lose precision their callers expect) and the KV one that
  // bf16 holds exactly (bf16, fp8_e4m3, fp8_e5m2), on the AMX tiles as on the register blocks;
  // f16 / f32 KV runs the per-token kernel in f32 (the AMX kernel had rounded it to bf16: lse off
  // by 0.24 at a sharp softmax).
  bool blocked_applies(DType q_dtype, DType kv_dtype) const {
    if (!blocked_possible() || q_dtype != DType::kBF16) return false;
    return kv_dtype == DType::kBF16 || kv_dtype == DType::kFP8E4M3 || kv_dtype == DType::kFP8E5M2;
  }

  // Validation, the cache write and the kernel parameters shared by extend and decode.
  Status prepare(const TensorView& q, const TensorView& k, const TensorView& v,
                 const TensorView& out, const AttentionLayer& layer, const ForwardBatch& batch,
                 bool save_kv, const TensorView& lse, CpuAttentionParams* p) {
    ATTNKIT_RETURN_IF_ERROR(
        validate_forward_inputs(q, k, v, out, layer, batch, save_kv, lse, Device::cpu()));
    if (layer.is_mla) {
      return Status::unsupported("intel_amx does not support MLA layers (layer.is_mla is true)");
    }
    if (!planned_ || planned_mode_ != batch.mode || planned_batch_size_ != batch.batch_size ||
        planned_rows_ != batch.req_pool_indices_host || planned_seq_lens_ != batch.seq_lens_host ||
        planned_encoder_lens_ != batch.encoder_lens_host ||
        planned_extend_lens_ != batch.extend_seq_lens_host ||
        planned_num_tokens_ != batch.num_tokens || planned_kv_pool_ != batch.kv_pool ||
        planned_req_to_token_ != batch.req_to_token_pool ||
        (batch.mode == ForwardMode::kTargetVerify &&
         (planned_draft_tokens_ != batch.spec.draft_token_num || planned_topk_ != batch.spec.topk ||
          planned_custom_mask_ != batch.spec.custom_mask.data))) {
      if (!planned_ && !plan_refused_.empty()) {
        return Status::invalid_argument(
            cat("intel_amx: no plan for this forward: the last init_forward_metadata was refused (",
                plan_refused_, ")"));
      }
      return Status::invalid_argument(
          cat("intel_amx: init_forward_metadata was not called for this batch (mode ",
              forward_mode_name(batch.mode), ", batch_size ", batch.batch_size, ", num_tokens ",
              batch.num_tokens,
              "): the plan is for the batch it was last called with (mode, request rows, "
              "seq_lens, extend and encoder lengths, num_tokens, draft_token_num, topk and "
              "custom_mask, and the KV and "
              "req_to_token pools its slots were checked against)"));
    }
    if (layer.num_q_heads != ctx_.num_q_heads || layer.num_kv_heads != ctx_.num_kv_heads ||
        layer.qk_head_dim != ctx_.qk_head_dim || layer.v_head_dim != ctx_.v_head_dim) {
      return Status::invalid_argument(cat("layer heads/dims (", layer.num_q_heads, "/",
                                          layer.num_kv_heads, ", d ", layer.qk_head_dim, "/",
                                          layer.v_head_dim, ") differ from the backend context (",
                                          ctx_.num_q_heads, "/", ctx_.num_kv_heads, ", d ",
                                          ctx_.qk_head_dim, "/", ctx_.v_head_dim, ")"));
    }
    const auto* pool = dynamic_cast<const MHAKVPool*>(batch.kv_pool);
    if (pool == nullptr) return Status::unsupported("intel_amx needs an MHA KV pool");
    const DType kv_dtype = pool->dtype();
    if (!kv_dtype_supported(kv_dtype)) {
      return Status::unsupported(cat("KV cache dtype ", dtype_name(kv_dtype),
                                     " is not supported by intel_amx (supported: bf16, f16, f32, "
                                     "fp8_e4m3, fp8_e5m2)"));
    }
    if (batch.req_to_token_pool == nullptr) {
      return Status::invalid_argument("batch.req_to_token_pool is null");
    }
    // The slots again, per layer: the kernels index the pool with them unchecked, and the table
    // may have changed since init_forward_metadata (a request freed, whose row reads as 0, or a
    // store into table() past write()'s check: a slot past the pool segfaulted). A min / max per
    // request (check_key_slots), against the layer's O(keys x heads x dim).
    ATTNKIT_RETURN_IF_ERROR(check_key_slots(batch, self_));
    if (has_cross_) ATTNKIT_RETURN_IF_ERROR(check_key_slots(batch, cross_));
    if (save_kv && batch.num_tokens > 0) {
      ATTNKIT_RETURN_IF_ERROR(batch.kv_pool->set_kv(layer.layer_id, batch.out_cache_loc, k, v,
                                                    layer.k_scale, layer.v_scale, nullptr));
    }

    const TensorView kb = pool->k_buffer(layer.layer_id);
    const TensorView vb = pool->v_buffer(layer.layer_id);
    const TensorView table = batch.req_to_token_pool->table();
    p->q = q.data;
    p->q_token_stride = q.stride(0);
    p->q_head_stride = q.stride(1);
    p->out = out.data;
    p->out_token_stride = out.stride(0);
    p->out_head_stride = out.stride(1);
    p->lse = lse.defined() ? lse.data_as<float>() : nullptr;
    p->lse_token_stride = lse.defined() ? lse.stride(0) : 0;
    p->lse_head_stride = lse.defined() ? lse.stride(1) : 0;
    p->act_dtype = q.dtype;
    p->k_cache = kb.data;
    p->v_cache = vb.data;
    p->k_row_stride = kb.stride(0);
    p->k_head_stride = kb.stride(1);
    p->v_row_stride = vb.stride(0);
    p->v_head_stride = vb.stride(1);
    p->kv_dtype = kv_dtype;
    p->req_to_token = table.data_as<const int32_t>();
    p->req_to_token_stride = table.stride(0);
    p->num_q_heads = layer.num_q_heads;
    p->num_kv_heads = layer.num_kv_heads;
    p->head_dim = layer.qk_head_dim;
    p->v_head_dim = layer.v_head_dim;
    const bool fp8 = dtype_is_fp8(kv_dtype);
    const float widen = kv_dtype == DType::kFP8E4M3 ? cpu_attention::kFp8E4M3ViaF16Scale : 1.f;
    p->score_scale = layer.scaling * (fp8 ? layer.k_scale * widen : 1.f);
    p->value_scale = fp8 ? layer.v_scale * widen : 1.f;
    p->logit_cap = layer.logit_cap;
    p->sliding_window =
        layer.is_cross_attention ? -1 : detail::kernel_sliding_window(layer.sliding_window, batch);
    p->causal = layer.type == AttentionType::kDecoder && !layer.is_cross_attention;
    p->sinks = layer.sinks.defined() ? layer.sinks.data_as<const float>() : nullptr;
    return Status::ok();
  }

  BackendContext ctx_;
  CpuIsa isa_;
  const BackendDescriptor& descriptor_;
  int num_threads_;
  bool prepack_;             // ATTNKIT_AMX_PREPACK (default on)
  int amx_rows_per_item_;    // ATTNKIT_AMX_ROWS_PER_ITEM (default kAmxDefaultRowsPerItem)
  int amx_key_block_;        // ATTNKIT_AMX_KEY_BLOCK (default kAmxKeyBlock)
  bool amx_pipeline_;        // ATTNKIT_AMX_PIPELINE (default on)
  bool amx_decode_;          // ATTNKIT_AMX_DECODE (default on)
  bool amx_fast_softmax_;    // ATTNKIT_AMX_SOFTMAX (default on; 0 = two-pass rows)
  bool amx_masked_rows_;     // ATTNKIT_AMX_MASKED_ROWS (default off)
  int amx_pv_blocks_;        // ATTNKIT_AMX_PV_BLOCKS (default kDefaultPvBlocks)
  int amx_decode_prefetch_;  // ATTNKIT_AMX_DECODE_PF (default 0)
  int amx_decode_sub_keys_;  // ATTNKIT_AMX_DECODE_SUBKEYS (default 0: per item)
  bool blocked_extend_;      // ATTNKIT_CPU_BLOCKED_EXTEND (default on; 0: avx512(_bf16) per-token)
  // The extend kernel of the last forward_extend (intel_amx_last_extend_kernel).
  const char* last_extend_kernel_ = "none";
  Buffer packed_;  // blocked extend: the forward's packed K/V blocks
  Buffer scratch_;
  int64_t scratch_stride_ = 0;

  bool planned_ = false;
  std::string plan_refused_;  // the last init_forward_metadata's refusal ("" after a success)
  ForwardMode planned_mode_ = ForwardMode::kIdle;
  int planned_batch_size_ = 0;
  // What the plan was made from: a forward with another batch of the same mode and size is refused.
  std::vector<int32_t> planned_rows_, planned_seq_lens_, planned_encoder_lens_,
      planned_extend_lens_;
  int planned_num_tokens_ = 0;
  const KVPool* planned_kv_pool_ = nullptr;
  const ReqToTokenPool* planned_req_to_token_ = nullptr;
  int planned_draft_tokens_ = 0;  // target verify's N
  int planned_topk_ = 1;          // target verify's topk and mask, checked by check_spec
  const void* planned_custom_mask_ = nullptr;
  Plan self_;
  Plan cross_;
  bool has_cross_ = false;
  std::vector<float> partial_out_;
  std::vector<float> partial_lse_;
};

Result<CpuIsa> choose_isa(const IntelAmxOptions& options) {
  const DeviceInfo cpu = detect_cpu();
  std::optional<CpuIsa> forced = options.isa;
  const char* env = std::getenv(kIsaEnvVar);
  if (!forced && env != nullptr && env[0] != '\0') {
    Result<CpuIsa> parsed = parse_cpu_isa(env);
    if (!parsed) return Status::invalid_argument(cat(kIsaEnvVar, ": ", parsed.status().message()));
    forced = *parsed;
  }
  if (!forced) return best_cpu_isa(cpu);
  if (!cpu_isa_supported(*forced, cpu)) {
    return Status::unsupported(cat(
        "intel_amx: instruction set ", cpu_isa_name(*forced), " was requested but this CPU (",
        cpu.name, ") provides up to ", cpu_isa_name(best_cpu_isa(cpu)),
        " (avx512 needs AVX-512 F/BW/VL; avx512_bf16 also AVX512-BF16 and AVX512-VBMI; amx also "
        "AMX-BF16 with the OS's tile permission)"));
  }
  return *forced;
}

}  // namespace

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return "scalar";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
    case CpuIsa::kAvx512Bf16:
      return "avx512_bf16";
    case CpuIsa::kAmx:
      return "amx";
  }
  return "unknown";
}

Result<CpuIsa> parse_cpu_isa(std::string_view name) {
  for (CpuIsa isa : kAllIsas) {
    if (name == cpu_isa_name(isa)) return isa;
  }
  return Status::invalid_argument(cat("CPU instruction set '", name,
                                      "' is not known (expected amx, avx512_bf16, avx512, avx2 or "
                                      "scalar)"));
}

bool cpu_isa_supported(CpuIsa isa, const DeviceInfo& cpu) {
  switch (isa) {
    case CpuIsa::kScalar:
      return true;
    case CpuIsa::kAvx2:
      return cpu.has_avx2;
    case CpuIsa::kAvx512:
      return cpu.has_avx512;
    case CpuIsa::kAvx512Bf16:
      return cpu.has_avx512 && cpu.has_avx512_bf16 && cpu.has_avx512_vbmi;
    case CpuIsa::kAmx:
      return cpu.has_avx512 && cpu.has_avx512_bf16 && cpu.has_avx512_vbmi && cpu.has_amx_bf16;
  }
  return false;
}

CpuIsa best_cpu_isa(const DeviceInfo& cpu) {
  CpuIsa best = CpuIsa::kScalar;
  for (CpuIsa isa : kAllIsas) {
    if (cpu_isa_supported(isa, cpu)) best = isa;
  }
  return best;
}

Result<std::unique_ptr<AttentionBackend>> create_intel_amx_backend(const BackendContext& ctx) {
  return create_intel_amx_backend_with_options(ctx, IntelAmxOptions{});
}

Result<std::unique_ptr<AttentionBackend>> create_intel_amx_backend_with_options(
    const BackendContext& ctx, const IntelAmxOptions& options) {
  if (!ctx.device.is_cpu()) {
    return Status::invalid_argument(
        cat("intel_amx runs on the CPU; ctx.device is ", ctx.device.to_string()));
  }
  if (ctx.is_mla) return Status::unsupported("intel_amx does not support MLA (ctx.is_mla is true)");
  if (ctx.num_q_heads <= 0 || ctx.num_kv_heads <= 0 || ctx.num_q_heads % ctx.num_kv_heads != 0) {
    return Status::invalid_argument(cat("ctx heads ", ctx.num_q_heads, "/", ctx.num_kv_heads,
                                        ": need num_q_heads a positive multiple of num_kv_heads"));
  }
  ATTNKIT_RETURN_IF_ERROR(check_head_dim(ctx.qk_head_dim, "qk_head_dim"));
  ATTNKIT_RETURN_IF_ERROR(check_head_dim(ctx.v_head_dim, "v_head_dim"));
  if (ctx.num_threads < 0) {
    return Status::invalid_argument(
        cat("ctx.num_threads ", ctx.num_threads, " is negative (0 = OpenMP default)"));
  }
  if (ctx.kv_pool != nullptr && !kv_dtype_supported(ctx.kv_pool->dtype())) {
    return Status::unsupported(cat("KV cache dtype ", dtype_name(ctx.kv_pool->dtype()),
                                   " is not supported by intel_amx (supported: bf16, f16, f32, "
                                   "fp8_e4m3, fp8_e5m2)"));
  }
  ATTNKIT_ASSIGN_OR_RETURN(const CpuIsa isa, choose_isa(options));
  const BackendDescriptor* descriptor = builtin_registry().find("intel_amx");
  if (descriptor == nullptr) {
    return Status::internal("intel_amx is missing from the builtin registry");
  }
  auto backend = std::make_unique<IntelAmxBackend>(ctx, isa, *descriptor);
  ATTNKIT_RETURN_IF_ERROR(backend->init());
  return std::unique_ptr<AttentionBackend>(std::move(backend));
}

Result<CpuIsa> intel_amx_backend_isa(const AttentionBackend& backend) {
  const auto* amx = dynamic_cast<const IntelAmxBackend*>(&backend);
  if (amx == nullptr) {
    return Status::invalid_argument(
        cat("backend ", backend.descriptor().name, " is not intel_amx"));
  }
  return amx->isa();
}

Result<std::string> intel_amx_last_extend_kernel(const AttentionBackend& backend) {
  const auto* amx = dynamic_cast<const IntelAmxBackend*>(&backend);
  if (amx == nullptr) {
    return Status::invalid_argument(
        cat("backend ", backend.descriptor().name, " is not intel_amx"));
  }
  return std::string(amx->last_extend_kernel());
}

}  // namespace attnkit
