// The host side of the shared tensor-core MLA decode kernel family: the backends `flashmla`
// (page 64), `cutlass_mla` (page 128) and `flashinfer` (page 1) each own one engine for their
// page size and route absorbed decode and verify (topk 1) forwards to it.
//
// Protocol: why_not(batch) (the single answer to "does this forward run here?"; "" = yes) ->
// plan(batch) once per forward (reserves workspace, launches the schedule kernel that splits every
// request's KV evenly across SMs) -> run(...) per layer (attention + LSE combine; no allocation,
// no synchronisation). CUDA graphs: init_graph sizes a fixed workspace; plan_graph launches the
// schedule kernel from the static seq_lens on the stream (no host work beyond the launch).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attnkit/backend.h"
#include "backend/device_array.h"
#include "backend/graph_captures.h"
#include "backend/plan_stamp.h"
#include "cuda/common/tma_map.h"

namespace attnkit::mla {

// Per-layer call counters of an engine.
struct MlaDecodeStats {
  int64_t runs = 0;              // layers run (decode kernel launches)
  int64_t combine_launches = 0;  // runs that launched the LSE combine kernel (MlaDecodeParams)
  int64_t wgmma_fp8_runs = 0;    // fp8-cache runs on the wgmma kernel (64-row tiles, SM90)
  int64_t grid_rows_runs = 0;    // runs whose grid had the row tiles of a part adjacent (rows)
  int64_t k_tma_runs = 0;        // runs whose whole K tiles were loaded by TMA (kv_tma_ok)
  int64_t q_tma_runs = 0;        // runs whose Q tiles were loaded by TMA (q_tma_ok)
};

class MlaDecodeEngine {
 public:
  // owner: the backend name used in messages; page_size: the paged loader's compile-time page
  // (1, 64, 128); allow_fp8: the owner's descriptor has FP8 KV for MLA. Fails (kUnsupported) with
  // the reason when the device cannot run the kernels (compute capability < 80 or less than the
  // kernels' shared memory per block).
  static Result<std::unique_ptr<MlaDecodeEngine>> create(const BackendContext& ctx,
                                                         std::string owner, int page_size,
                                                         bool allow_fp8);

  // Why this forward does not run on the engine ("" = it does): mode (decode, or target_verify
  // with topk 1), encoder lengths, dtypes, head dims.
  std::string why_not(const ForwardBatch& batch) const;
  // The same answer for a CUDA-graph batch (pool dtype from the context).
  std::string why_not_graph(ForwardMode mode, const SpecInfo* spec) const;

  Status plan(const ForwardBatch& batch, StreamHandle stream);
  Status run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
             const AttentionLayer& layer, const ForwardBatch& batch, bool save_kv,
             const TensorView& lse, StreamHandle stream);

  Status init_graph(int max_bs, int max_num_tokens);
  // The plan of a graph capture (`capture`: recorded, with its queries per request) or replay
  // (refused unless a graph of that mode, bs and queries per request was captured since
  // init_graph: the captured kernels' q / out and grids are the capture's).
  Status plan_graph(int bs, const TensorView& seq_lens, ForwardMode mode, const SpecInfo* spec,
                    StreamHandle stream, bool capture);

  int page_size() const { return page_size_; }
  // Whether 64-row tiles (33+ query rows per request: 128 heads) run the sm_90a wgmma kernel: SM90
  // device, sm_90a code in the build, ATTNKIT_MLA_WGMMA not "0"; page sizes 1, 64 and 128 alike;
  // with an fp8 cache unless ATTNKIT_MLA_WGMMA_FP8=0.
  bool uses_wgmma() const { return use_wgmma_; }
  const MlaDecodeStats& stats() const { return stats_; }

 private:
  MlaDecodeEngine(const BackendContext& ctx, std::string owner, int page_size, bool allow_fp8,
                  int sm_count)
      : ctx_(ctx),
        owner_(std::move(owner)),
        page_size_(page_size),
        allow_fp8_(allow_fp8),
        sm_count_(sm_count) {}
  std::string why_not_common(ForwardMode mode, int topk, DType kv_dtype) const;
  Status schedule(ForwardMode mode, int bs, int s_q, const TensorView& seq_lens, int32_t* sched,
                  int32_t* split_indptr, StreamHandle stream);

  BackendContext ctx_;
  std::string owner_;
  int page_size_ = 1;
  bool allow_fp8_ = false;
  int sm_count_ = 0;
  bool use_wgmma_ = false;
  // ATTNKIT_MLA_WGMMA_BLOCKS: 0 tile, 1 block barriers, 2 + split, 3 seesaw, 6 seesaw without
  // the phantom tile, 7 6 + early S0, 8 7 + own P1 buffer; -1 (unset, auto): per launch,
  // default_wgmma_variant
  int wgmma_variant_ = -1;
  int wgmma_diag_ = 0;     // ATTNKIT_MLA_WGMMA_DIAG: 1 noload, 2 noconvert (timing diagnostics)
  bool wgmma_fp8_ = true;  // ATTNKIT_MLA_WGMMA_FP8=0: fp8 64-row tiles on mma.sync
  int mma_prefetch_ = 2;   // ATTNKIT_MLA_MMA_PREFETCH: 0 off, 1 on, 2 per tile size, 3 smem
  bool fp8_f16_ = true;    // ATTNKIT_MLA_FP8_F16=0: bf16 MMA inputs for fp8 16-row tiles
  // ATTNKIT_MLA_COMBINE_SKIP=0: launch the combine even unsplit. The skip is decided from
  // ForwardBatch::seq_lens_host, which must equal seq_lens (forward_batch.h).
  bool combine_skip_ = true;
  int grid_rows_fastest_ = 2;  // ATTNKIT_MLA_GRID_ORDER (MlaDecodeParams::grid_rows_fastest)
  int k_tma_ = 3;      // ATTNKIT_MLA_K_TMA: 0 cp.async only, 1 TMA, 2 TMA evict-first, 3 consumer
  bool q_tma_ = true;  // ATTNKIT_MLA_Q_TMA=0: Q tiles by cp.async (MlaDecodeParams::q_tma_ok)
  // TMA maps of the buffers seen (pool layers, q): buffer, rows and row stride -> its map.
  struct RowTmaMap {
    const void* data = nullptr;
    int64_t rows = 0, stride = 0;
    cuda::TmaDesc desc;
  };
  std::vector<RowTmaMap> tma_maps_;    // pool layers
  std::vector<RowTmaMap> q_tma_maps_;  // q buffers
  const cuda::TmaDesc* row_tma_map(std::vector<RowTmaMap>* cache, size_t max_maps, const void* data,
                                   int64_t rows, int64_t stride);
  MlaDecodeStats stats_;

  // The current forward's plan.
  struct Plan {
    bool valid = false;
    ForwardMode mode = ForwardMode::kIdle;
    int bs = 0;
    int s_q = 1;
    // The planned batch's num_tokens (a graph capture: bs x s_q; a forward of another count is
    // refused: the plan's query rows would index past its q / out); -1 for replay plans (no
    // forward runs on them).
    int num_tokens = -1;
    std::optional<PlanKey> lengths;  // eager plans: plan_key (plan_stamp.h)
    bool replay = false;             // a CUDA-graph replay plan (no forward runs on it)
    int num_parts = 1;
    const int32_t* sched = nullptr;
    const int32_t* split_indptr = nullptr;
    float* partial_out = nullptr;
    float* partial_lse = nullptr;
    // false when the host schedule (eager plans with seq_lens_host) splits no request: the
    // decode kernel finishes every request and the combine launch is skipped. (The device
    // schedule comes from seq_lens: stale host lengths would leave a split request uncombined.)
    bool need_combine = true;
  } plan_;

  DeviceArray<int32_t> sched_, split_indptr_;
  DeviceArray<float> partial_out_, partial_lse_;
  bool graph_ready_ = false;
  int graph_max_bs_ = 0;
  int graph_max_tokens_ = 0;
  GraphCaptures graph_captures_;
  DeviceArray<int32_t> graph_sched_, graph_split_indptr_;
  DeviceArray<float> graph_partial_out_, graph_partial_lse_;
};

}  // namespace attnkit::mla
