// The attention backend interface every implementation sits behind.
//
// Host protocol: check -> workspace size -> plan (init_forward_metadata, once per forward, shared
// by all layers) -> run (forward_extend / forward_decode, per layer). Run never allocates or
// synchronises, so it is CUDA-graph capturable.
#pragma once

#include <memory>
#include <optional>

#include "attnkit/attention_layer.h"
#include "attnkit/forward_batch.h"
#include "attnkit/kv_cache.h"
#include "attnkit/status.h"
#include "attnkit/tensor.h"

namespace attnkit {

struct BackendDescriptor;

// Everything a backend is built with: fixed for its lifetime.
struct BackendContext {
  // The device every call of the backend runs on: CUDA backends make it current for the call and
  // give the caller's device back (a process driving several GPUs may leave any one current).
  Device device;
  // The context's stream (nullptr: the device's default stream); ForwardBatch::stream overrides it
  // per forward. A stream of another device than `device` is refused by name.
  StreamHandle stream = nullptr;
  int num_q_heads = 0;  // per rank
  int num_kv_heads = 0;
  int qk_head_dim = 0;
  int v_head_dim = 0;
  bool is_mla = false;
  int kv_lora_rank = 0;
  int qk_rope_head_dim = 0;
  DType q_dtype = DType::kBF16;  // q / k / v / out activations
  int page_size = 1;
  int max_batch_size = 0;
  int max_context_len = 0;
  int num_layers = 0;
  ReqToTokenPool* req_to_token_pool = nullptr;
  KVPool* kv_pool = nullptr;
  int speculative_num_draft_tokens = 0;
  int speculative_topk = 0;
  int num_threads = 0;  // CPU backends: 0 = from OMP_NUM_THREADS / hardware
  // MLA chunked prefix cache (AttentionLayer::mla_prefix): the chunk_tokens of the layers'
  // MlaPrefixDecompressor (one budget for the model), so that init_forward_metadata plans the
  // prefix chunks and reserves their workspace once per forward. 0 = no layer carries mla_prefix.
  int mla_prefix_chunk_tokens = 0;
  // SM90 paged decode (flashinfer) may read a forward's plan and first page-table words before
  // the previous kernel of the stream has finished (programmatic dependent launch). Set true only
  // if the kernel launched just before a forward_* on the stream never writes req_to_token or
  // req_pool_indices (an engine that fills them by copies, or by kernels at the start of a batch
  // before its embedding, qualifies). A forward with save_kv true is always allowed the early
  // reads: attnkit's own KV store, which writes only K/V, is the kernel just before it. false:
  // other forwards wait for the previous kernel before their first page-table read.
  bool early_page_table_reads = false;
};

// One call at a time: a backend keeps the plan of its last init_forward_metadata and per-instance
// scratch, so two threads calling one backend (or planning while another forwards) race on them.
// Give each thread its own backend (and batch), or serialise the calls; the Python binding refuses
// a call made while another thread is inside one.
class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;
  virtual const BackendDescriptor& descriptor() const = 0;
  // The device the backend was made for (its BackendContext::device); nullopt for a backend that
  // does not say (the default, for backends outside attnkit). HybridAttnBackend::create refuses
  // two parts that name different devices.
  virtual std::optional<Device> device() const { return std::nullopt; }

  // Once per forward, before the layers run. The plan is made from the batch as it is now: its
  // lengths, its request rows and the contents of its host arrays (spec.custom_mask included: a
  // backend may plan a verify batch's tree from the mask bytes) stay as they are until the
  // forward's layers have run; a batch changed in between needs a new init_forward_metadata.
  virtual Status init_forward_metadata(const ForwardBatch& batch) = 0;
  // q [T, Hq, Dqk], k [T, Hkv, Dqk], v [T, Hkv, Dv], out [T, Hq, Dv] (caller-allocated).
  // save_kv: write k/v at out_cache_loc first. k/v may be empty: everything is read from the pool.
  // lse: optional f32 [T, Hq] natural-log log-sum-exp of the (scaled, capped) logits.
  virtual Status forward_extend(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& out, const AttentionLayer& layer,
                                const ForwardBatch& batch, bool save_kv,
                                const TensorView& lse = {}) = 0;
  virtual Status forward_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& out, const AttentionLayer& layer,
                                const ForwardBatch& batch, bool save_kv,
                                const TensorView& lse = {}) = 0;
  // IDLE -> nothing; DECODE -> forward_decode; every other mode -> forward_extend.
  Status forward(const TensorView& q, const TensorView& k, const TensorView& v,
                 const TensorView& out, const AttentionLayer& layer, const ForwardBatch& batch,
                 bool save_kv = true, const TensorView& lse = {});

  // CUDA graphs: static buffers once; capture writes metadata into them; replay refreshes them in
  // place (no allocation, no host sync). Backends without graph support return kUnsupported.
  virtual Status init_cuda_graph_state(int max_bs, int max_num_tokens);
  virtual Status init_forward_metadata_capture_cuda_graph(int bs, int num_tokens,
                                                          const TensorView& req_pool_indices,
                                                          const TensorView& seq_lens,
                                                          const TensorView& encoder_lens,
                                                          ForwardMode mode, const SpecInfo* spec);
  // seq_lens_host: the bs lengths of seq_lens on the host (padded rows: the fill value), or
  // nullptr. Backends that plan on the host from the real lengths (triton and flashinfer decode:
  // the split-KV plan, as in eager runs) need it and return kInvalidArgument without it.
  virtual Status init_forward_metadata_replay_cuda_graph(int bs, const TensorView& req_pool_indices,
                                                         const TensorView& seq_lens,
                                                         int64_t seq_lens_sum,
                                                         const TensorView& encoder_lens,
                                                         ForwardMode mode, const SpecInfo* spec,
                                                         const int32_t* seq_lens_host);
  virtual int cuda_graph_seq_len_fill_value() const { return 1; }
};

// Shared input validation for forward_extend / forward_decode: shapes, dtypes, devices, head
// counts vs the layer, lengths vs pool capacity, and the values of host-resident sinks (finite or
// -inf; device sinks are not read). Every backend calls it before any launch. allow_fp8_q: q may
// be fp8_e4m3 (AttentionLayer::q_scale; out, k and v then share out's dtype), for a backend
// that takes e4m3 q; false (the default) refuses it by name.
Status validate_forward_inputs(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const AttentionLayer& layer,
                               const ForwardBatch& batch, bool save_kv, const TensorView& lse,
                               Device device, bool allow_fp8_q = false);

// forward_decode takes decode batches only and forward_extend every other mode (forward() picks
// the entry point from batch.mode): the wrong one is an error naming `backend`, the entry point
// and the mode (a decode batch through forward_extend had returned ok without writing out).
Status check_entry_point(std::string_view backend, bool decode_entry, const ForwardBatch& batch);

// For kernels that load and store q / k / v / out rows in 16-byte vectors: the base address and
// every stride but the innermost (in bytes) must be whole 16-byte vectors, or the load faults on a
// misaligned address (a view with a storage offset, an odd head stride). An undefined or empty view
// passes. kUnsupported naming `backend`, the tensor and its layout otherwise.
Status check_vector_rows(std::string_view backend, const TensorView& t, const char* name);

}  // namespace attnkit
