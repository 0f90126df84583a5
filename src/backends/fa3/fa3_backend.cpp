// The `fa3` backend: host side. Decides per forward (plan) and per layer (hooks) whether the
// SM90 wgmma prefill kernel runs; everything it does not cover is delegated to an owned
// flashinfer backend, which plans every forward as well so that any layer can fall back.
//
// Host protocol: init_forward_metadata plans the flashinfer path and, for wgmma-eligible
// forwards, the query tiles (sorted longest-first) uploaded into a grow-only device workspace;
// forward_extend fills an Fa3Params and launches. CUDA graphs (decode) are the flashinfer
// backend's.
#include "backends/fa3/fa3_backend.h"

#ifdef ATTNKIT_WITH_CUDA

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "attnkit/registry.h"
#include "backend/device_array.h"
#include "backend/kernel_params.h"
#include "backends/fa3/kernels/fa3_kernels.h"
#include "backends/fa3/kernels/tile_plan.h"
#include "backends/flashinfer/flashinfer_backend.h"
#include "cuda/common/cuda_check.cuh"
#include "cuda/common/device_attributes.h"
#include "cuda/common/dispatch.h"

namespace attnkit {
namespace {

constexpr int kWgmmaComputeCapability = 90;
constexpr int kVecElems = 8;  // 16-byte rows of bf16/f16
constexpr float kLog2e = 1.4426950408889634f;

std::string str(int64_t v) { return std::to_string(v); }

bool vec_aligned(const TensorView& t) {
  return reinterpret_cast<uintptr_t>(t.data) % (kVecElems * 2) == 0 &&
         t.stride(0) % kVecElems == 0 && t.stride(1) % kVecElems == 0;
}

// The driver's cuTensorMapEncodeTiled through the runtime (no libcuda link); nullptr if absent.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    constexpr unsigned kVersion = 12000;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, kVersion, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// Rows per TMA box for a pool of `page_size` and key blocks of `block_n` (0: gather every block
// with cp.async). A box is one page, or the largest power of two dividing the key block when that
// is smaller (128-key blocks: one block of a larger page; 80-key blocks: 16 rows), so that a box
// never crosses a page; pages of fewer than 8 rows would break the 1024-byte alignment of the
// swizzled destination.
int tma_rows_for(int page_size, int block_n) {
  constexpr int kMinRows = 8;
  const bool pow2 = page_size > 0 && (page_size & (page_size - 1)) == 0;
  if (!pow2 || page_size < kMinRows) return 0;
  const int rows = std::min(page_size, block_n & -block_n);
  return rows >= kMinRows ? rows : 0;
}

// Encodes buf [rows, Hkv, D] (strides in elements) as a 3D map {D, Hkv, rows}, box {64, 1, rows}.
bool encode_pool_map(const TensorView& buf, DType dtype, int box_rows, fa3::TmaDesc* out) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  static_assert(sizeof(CUtensorMap) == sizeof(fa3::TmaDesc), "TMA descriptor size");
  constexpr int kBoxCols = 64;  // one 128-byte swizzle line of bf16 / f16
  constexpr int kElem = 2;
  CUtensorMap map;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(buf.size(2)),
                              static_cast<cuuint64_t>(buf.size(1)),
                              static_cast<cuuint64_t>(buf.size(0))};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(buf.stride(1) * kElem),
                                 static_cast<cuuint64_t>(buf.stride(0) * kElem)};
  const cuuint32_t box[3] = {kBoxCols, 1, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = encode(
      &map,
      dtype == DType::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3,
      buf.data, dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return false;
  std::memcpy(out->words, &map, sizeof(map));
  return true;
}

// Whether the forward mode's queries are "the last q_len keys of each request" (the wgmma
// kernel's causal convention). Target verify (tree positions) and decode go to flashinfer.
bool wgmma_mode(ForwardMode m) {
  return m == ForwardMode::kExtend || m == ForwardMode::kMixed || m == ForwardMode::kDraftExtend;
}

class Fa3Backend final : public AttentionBackend {
 public:
  Fa3Backend(const BackendContext& ctx, int sm_count, std::unique_ptr<AttentionBackend> inner,
             std::string wgmma_off_reason)
      : ctx_(ctx),
        sm_count_(sm_count),
        inner_(std::move(inner)),
        wgmma_off_reason_(std::move(wgmma_off_reason)) {}

  const BackendDescriptor& descriptor() const override { return *builtin_registry().find("fa3"); }

  Status init_forward_metadata(const ForwardBatch& batch) override;
  Status forward_extend(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const AttentionLayer& layer,
                        const ForwardBatch& batch, bool save_kv, const TensorView& lse) override;
  Status forward_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const AttentionLayer& layer,
                        const ForwardBatch& batch, bool save_kv, const TensorView& lse) override {
    ++stats_.flashinfer_calls;
    return inner_->forward_decode(q, k, v, out, layer, batch, save_kv, lse);
  }

  Status init_cuda_graph_state(int max_bs, int max_num_tokens) override {
    return inner_->init_cuda_graph_state(max_bs, max_num_tokens);
  }
  Status init_forward_metadata_capture_cuda_graph(int bs, int num_tokens,
                                                  const TensorView& req_pool_indices,
                                                  const TensorView& seq_lens,
                                                  const TensorView& encoder_lens, ForwardMode mode,
                                                  const SpecInfo* spec) override {
    wgmma_plan_ = false;  // captured graphs run the flashinfer kernels
    return inner_->init_forward_metadata_capture_cuda_graph(bs, num_tokens, req_pool_indices,
                                                            seq_lens, encoder_lens, mode, spec);
  }
  Status init_forward_metadata_replay_cuda_graph(int bs, const TensorView& req_pool_indices,
                                                 const TensorView& seq_lens, int64_t seq_lens_sum,
                                                 const TensorView& encoder_lens, ForwardMode mode,
                                                 const SpecInfo* spec,
                                                 const int32_t* seq_lens_host) override {
    return inner_->init_forward_metadata_replay_cuda_graph(
        bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, mode, spec, seq_lens_host);
  }

  const Fa3Stats& stats() const { return stats_; }

 private:
  StreamHandle stream_for(const ForwardBatch& batch) const {
    return batch.stream != nullptr ? batch.stream : ctx_.stream;
  }
  // "" when this layer can run on the wgmma kernel of the current plan.
  std::string layer_fallback_reason(const TensorView& q, const TensorView& out,
                                    const AttentionLayer& layer, const ForwardBatch& batch) const;
  Status run_wgmma(const TensorView& q, const TensorView& k, const TensorView& v,
                   const TensorView& out, const AttentionLayer& layer, const ForwardBatch& batch,
                   bool save_kv, const TensorView& lse);

  BackendContext ctx_;
  int sm_count_ = 0;
  std::unique_ptr<AttentionBackend> inner_;  // flashinfer
  std::string wgmma_off_reason_;             // non-empty: no forward of this context uses wgmma
  Fa3Stats stats_;
  // ATTNKIT_FA3_PINGPONG=0 turns the consumer warpgroups' GEMM alternation off (A/B timing).
  bool pingpong_ = [] {
    const char* e = std::getenv("ATTNKIT_FA3_PINGPONG");
    return e == nullptr || std::string(e) != "0";
  }();
  // ATTNKIT_FA3_TMA=0: cp.async gathers for every key block (no TMA page boxes).
  bool tma_ = [] {
    const char* e = std::getenv("ATTNKIT_FA3_TMA");
    return e == nullptr || std::string(e) != "0";
  }();
  // ATTNKIT_FA3_FENCE_TMA=0: no proxy fence after TMA-loaded blocks (see Fa3Params::fence_tma).
  bool fence_tma_ = [] {
    const char* e = std::getenv("ATTNKIT_FA3_FENCE_TMA");
    return e == nullptr || std::string(e) != "0";
  }();
  // ATTNKIT_FA3_DIAG=<bits> (diagnostics, wrong results; see Fa3Params::diag).
  int diag_ = [] {
    const char* e = std::getenv("ATTNKIT_FA3_DIAG");
    return e != nullptr ? std::atoi(e) : 0;
  }();
  // ATTNKIT_FA3_SCHED=0: plain-stride persistent schedule instead of the zigzag.
  bool zigzag_ = [] {
    const char* e = std::getenv("ATTNKIT_FA3_SCHED");
    return e == nullptr || std::string(e) != "0";
  }();
  // ATTNKIT_FA3_BLOCK_N=<keys> (A/B tuning): the key block of the wgmma kernel for the head dims
  // it is instantiated for (fa3::block_n_supported); the others keep fa3::default_block_n.
  int block_n_env_ = [] {
    const char* e = std::getenv("ATTNKIT_FA3_BLOCK_N");
    return e != nullptr ? std::atoi(e) : 0;
  }();
  // ATTNKIT_FA3_LAZY_RESCALE=1: lazy O rescale (see Fa3Params::lazy_rescale).
  bool lazy_rescale_ = [] {
    const char* e = std::getenv("ATTNKIT_FA3_LAZY_RESCALE");
    return e != nullptr && std::string(e) == "1";
  }();
  // ATTNKIT_FA3_OVERLAP=0: the serial per-block schedule instead of the intra-warpgroup overlap.
  bool overlap_ = [] {
    const char* e = std::getenv("ATTNKIT_FA3_OVERLAP");
    return e == nullptr || std::string(e) != "0";
  }();

  bool wgmma_plan_ = false;  // the current forward has a tile plan
  int plan_bs_ = 0;
  int num_tiles_ = 0;
  std::vector<int32_t> words_;
  DeviceArray<int32_t> plan_words_;
};

Status Fa3Backend::init_forward_metadata(const ForwardBatch& batch) {
  wgmma_plan_ = false;
  ATTNKIT_RETURN_IF_ERROR(inner_->init_forward_metadata(batch));
  if (!wgmma_off_reason_.empty() || !wgmma_mode(batch.mode) || !batch.encoder_lens_host.empty() ||
      batch.kv_pool == nullptr || batch.kv_pool->is_mla() ||
      batch.kv_pool->dtype() != ctx_.q_dtype) {
    return Status::ok();
  }
  // Requests (as the flashinfer planner reads them): q_len new tokens at q_start, kv_len keys.
  const int bs = batch.batch_size;
  std::vector<fa3::TileRequest> reqs(static_cast<size_t>(bs));
  int32_t start = 0;
  for (int r = 0; r < bs; ++r) {
    const size_t ur = static_cast<size_t>(r);
    const bool have_extend = !batch.extend_seq_lens_host.empty();
    fa3::TileRequest& q = reqs[ur];
    q.q_len = have_extend ? batch.extend_seq_lens_host[ur] : batch.spec.draft_token_num;
    q.q_start = have_extend && !batch.extend_start_loc_host.empty()
                    ? batch.extend_start_loc_host[ur]
                    : start;
    q.kv_len = batch.seq_lens_host[ur];
    start += q.q_len;
  }
  ATTNKIT_ASSIGN_OR_RETURN(fa3::TilePlan plan, fa3::build_tile_plan(reqs));
  words_ = std::move(plan.words);
  ATTNKIT_RETURN_IF_ERROR(plan_words_.reserve(ctx_.device, static_cast<int64_t>(words_.size())));
  // Pageable source: the copy is staged before cudaMemcpyAsync returns, so words_ may be reused.
  ATTNKIT_CUDA_TRY(cudaMemcpyAsync(plan_words_.data(), words_.data(),
                                   words_.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                                   cuda::to_stream(stream_for(batch))));
  plan_bs_ = bs;
  num_tiles_ = plan.num_tiles;
  wgmma_plan_ = true;
  return Status::ok();
}

std::string Fa3Backend::layer_fallback_reason(const TensorView& q, const TensorView& out,
                                              const AttentionLayer& layer,
                                              const ForwardBatch& batch) const {
  if (!wgmma_plan_) return "forward not planned for wgmma";
  if (layer.is_mla || layer.is_cross_attention) return "MLA / cross-attention layer";
  if (layer.sliding_window >= 0) return "sliding window";
  if (layer.logit_cap != 0.f) return "soft-cap";
  if (layer.sinks.defined()) return "attention sinks";
  if (layer.qk_head_dim != ctx_.qk_head_dim || layer.v_head_dim != ctx_.qk_head_dim ||
      layer.num_q_heads != ctx_.num_q_heads || layer.num_kv_heads != ctx_.num_kv_heads) {
    return "layer shape differs from the context";
  }
  if (q.dtype != ctx_.q_dtype || out.dtype != ctx_.q_dtype) return "q / out dtype";
  if (!vec_aligned(q) || !vec_aligned(out)) return "q / out rows not 16-byte aligned";
  if (batch.kv_pool == nullptr || batch.kv_pool->is_mla()) return "no MHA pool";
  return "";
}

Status Fa3Backend::forward_extend(const TensorView& q, const TensorView& k, const TensorView& v,
                                  const TensorView& out, const AttentionLayer& layer,
                                  const ForwardBatch& batch, bool save_kv, const TensorView& lse) {
  if (!layer_fallback_reason(q, out, layer, batch).empty()) {
    ++stats_.flashinfer_calls;
    return inner_->forward_extend(q, k, v, out, layer, batch, save_kv, lse);
  }
  return run_wgmma(q, k, v, out, layer, batch, save_kv, lse);
}

Status Fa3Backend::run_wgmma(const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& out, const AttentionLayer& layer,
                             const ForwardBatch& batch, bool save_kv, const TensorView& lse) {
  ATTNKIT_RETURN_IF_ERROR(
      validate_forward_inputs(q, k, v, out, layer, batch, save_kv, lse, ctx_.device));
  if (batch.batch_size != plan_bs_) {
    return Status::invalid_argument("fa3: batch size " + str(batch.batch_size) +
                                    " differs from the planned batch size " + str(plan_bs_) +
                                    " (call init_forward_metadata first)");
  }
  auto& pool = static_cast<MHAKVPool&>(*batch.kv_pool);
  const StreamHandle stream = stream_for(batch);
  if (save_kv && k.defined()) {
    ATTNKIT_RETURN_IF_ERROR(pool.set_kv(layer.layer_id, batch.out_cache_loc, k, v, layer.k_scale,
                                        layer.v_scale, stream));
  }
  const TensorView kbuf = pool.k_buffer(layer.layer_id);
  const TensorView vbuf = pool.v_buffer(layer.layer_id);
  if (!vec_aligned(kbuf) || !vec_aligned(vbuf)) {
    ++stats_.flashinfer_calls;
    return inner_->forward_extend(q, TensorView(), TensorView(), out, layer, batch, false, lse);
  }

  fa3::Fa3Params p;
  detail::set_io_params(p, q, out, lse);
  detail::set_kv_pool_params(p, kbuf, vbuf);
  detail::set_page_table_params(p, batch);
  p.page_size = pool.page_size();
  p.plan = plan_words_.data();
  p.bs = batch.batch_size;
  p.num_tiles = num_tiles_;
  p.num_q_heads = layer.num_q_heads;
  p.group = layer.num_q_heads / layer.num_kv_heads;
  p.scale_log2 = layer.scaling * kLog2e;
  p.causal = layer.type == AttentionType::kEncoderOnly ? 0 : 1;
  p.pingpong = pingpong_ ? 1 : 0;
  p.diag = diag_;
  p.fence_tma = fence_tma_ ? 1 : 0;
  p.sched = zigzag_ ? 1 : 0;
  const int block_n = fa3::block_n_supported(ctx_.qk_head_dim, block_n_env_)
                          ? block_n_env_
                          : fa3::default_block_n(ctx_.qk_head_dim);
  p.tma_rows = tma_ ? tma_rows_for(p.page_size, block_n) : 0;
  if (p.tma_rows > 0 && (kbuf.stride(2) != 1 || vbuf.stride(2) != 1 ||
                         !encode_pool_map(kbuf, q.dtype, p.tma_rows, &p.tma_k) ||
                         !encode_pool_map(vbuf, q.dtype, p.tma_rows, &p.tma_v))) {
    p.tma_rows = 0;  // the cp.async gather serves every block
  }
  p.overlap = overlap_ ? 1 : 0;
  p.lazy_rescale = lazy_rescale_ ? 1 : 0;

  ++stats_.wgmma_calls;
  stats_.last_block_n = block_n;
  return dispatch_value<fa3::WgmmaHeadDims>(
      ctx_.qk_head_dim, "fa3: wgmma head_dim", [&]<int kD>() -> Status {
        if constexpr (fa3::wgmma_head_dim_compiled(kD)) {
          return fa3::run_prefill_sm90<kD>(p, q.dtype, block_n, sm_count_, stream);
        } else {
          return Status::unsupported("fa3: wgmma head_dim " + str(kD) + " is not compiled in");
        }
      });
}

}  // namespace

const Fa3Stats* fa3_stats(const AttentionBackend& backend) {
  const auto* f = dynamic_cast<const Fa3Backend*>(&backend);
  return f != nullptr ? &f->stats() : nullptr;
}

Result<std::unique_ptr<AttentionBackend>> create_fa3_backend(const BackendContext& ctx) {
  if (!ctx.device.is_cuda()) {
    return Status::invalid_argument("fa3: BackendContext.device " + ctx.device.to_string() +
                                    " is not a CUDA device");
  }
  cuda::DeviceAttributes attrs;
  ATTNKIT_RETURN_IF_ERROR(cuda::query_device_attributes(ctx.device.ordinal, &attrs));
  const int sm_count = attrs.sm_count;
  const int cc = attrs.compute_capability;
  // The flashinfer backend serves every forward the wgmma kernel does not (and checks the
  // context: heads, dims, dtypes).
  Result<std::unique_ptr<AttentionBackend>> inner = create_flashinfer_backend(ctx);
  if (!inner.is_ok()) {
    return Status(inner.status().code(), "fa3: " + inner.status().message());
  }
  std::string off;
  if (cc != kWgmmaComputeCapability) {
    off = "compute capability " + str(cc) + " (wgmma needs 90)";
  } else if (ctx.is_mla) {
    off = "MLA";
  } else if (ctx.q_dtype != DType::kBF16 && ctx.q_dtype != DType::kF16) {
    off = std::string("q dtype ") + dtype_name(ctx.q_dtype);
  } else if (ctx.qk_head_dim != ctx.v_head_dim) {
    off = "qk_head_dim " + str(ctx.qk_head_dim) + " != v_head_dim " + str(ctx.v_head_dim);
  } else if (!fa3::wgmma_head_dim_compiled(ctx.qk_head_dim)) {
    off = "head_dim " + str(ctx.qk_head_dim) +
          " (wgmma head dims: " + fa3::WgmmaHeadDims::to_string() + " within ATTNKIT_HEAD_DIMS)";
  } else {
    bool available = false;
    (void)dispatch_value<fa3::WgmmaHeadDims>(ctx.qk_head_dim, "head_dim", [&]<int kD>() {
      if constexpr (fa3::wgmma_head_dim_compiled(kD)) available = fa3::prefill_sm90_available<kD>();
      return Status::ok();
    });
    if (!available) off = "no sm_90a code in this build (CMAKE_CUDA_ARCHITECTURES lacks 90a)";
  }
  return std::unique_ptr<AttentionBackend>(
      new Fa3Backend(ctx, sm_count, std::move(inner).value(), std::move(off)));
}

}  // namespace attnkit

#endif  // ATTNKIT_WITH_CUDA
