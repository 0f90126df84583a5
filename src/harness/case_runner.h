// The shared attention case table and its runner: used by the tests of every backend, by
// `attnkit bench --verify` and by the README demo.
//
// Flow:  prepare_case(spec, device)  -> PreparedCase (pools, page tables, random K/V history,
//                                        random q/k/v, ForwardBatch, NaN-poisoned outputs)
//        run_backend(backend, prepared, save_kv)   -> init_forward_metadata + forward per layer
//        compare_with_reference(prepared)          -> fp64 torch_native reference on the host
//        skip_reason(descriptor, spec, device)     -> "" when the descriptor says it can run
//
// Conventions the table relies on (every backend must follow them):
//  * Row layout: request r's req_to_token row holds encoder_lens[r] encoder tokens first (0 when
//    the case has no encoder), then its decoder tokens. seq_lens counts decoder tokens only
//    (TARGET_VERIFY: the committed prefix only, the N drafts follow it in the row).
//  * Positions: new token i of request r has position prefix_r + i (TARGET_VERIFY: prefix_r +
//    tree depth in `positions`; masking uses the tree mask); a key's position is its decoder index.
//  * Self-attention keys are decoder tokens [0, prefix_r + new_r); cross-attention keys are the
//    encoder tokens [0, encoder_lens[r]) with no causal mask and no window.
//  * Window: key j visible from a query at position p when p - j <= sliding_window (encoder-only:
//    |p - j| <= sliding_window). Sinks join the softmax denominator only, and the returned lse is
//    the natural log of that full denominator: lse = log(sum_j exp(logit_j) + exp(sink_h)).
//  * fp8 KV: logits use the dequantised keys (stored * k_scale), outputs the dequantised values
//    (stored * v_scale); fp4: code * block scale * layer scale. Non-quantised pools ignore scales.
//    An fp8_q case's logits use the dequantised q (stored * q_scale).
//  * Layers: every case runs `num_layers` layers with independent data. With cross_attention the
//    odd layers are cross-attention layers (they read encoder K/V from the pool; save_kv is off
//    for them), the even layers self-attention over the decoder tokens.
//  * MLA absorbed (head_dim = kv_lora_rank + qk_rope_head_dim, v_head_dim = kv_lora_rank): one KV
//    head, pool row [latent | rope], V = the first kv_lora_rank columns of the row.
//  * MLA non-absorbed prefill (mla with head_dim != kv_lora_rank + qk_rope_head_dim, e.g. 192/128):
//    plain MHA over the new tokens' k/v (causal within the request); save_kv is off. With
//    mla_prefix_chunk > 0 the layers carry an MlaPrefixDecompressor (chunked prefix cache): the
//    new tokens also see their cached prefix, read from the pool as latent rows and decompressed
//    by the test expander (mla_prefix_expander.h); otherwise the MLA pool is not read.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/attention_layer.h"
#include "attnkit/backend.h"
#include "attnkit/device.h"
#include "attnkit/dtype.h"
#include "attnkit/forward_batch.h"
#include "attnkit/kv_cache.h"
#include "attnkit/registry.h"
#include "attnkit/status.h"
#include "attnkit/tensor.h"

namespace attnkit::harness {

// The largest page_size a case may ask for (the demo's --page-size bound as well): a page larger
// than every request only pads its last page, and a page of a million rows had the harness
// allocate ~20 GB for a 6-token decode.
inline constexpr int kMaxCasePageSize = 4096;

// The soft-cap range a case takes (CaseSpec::logit_cap; 0 = off).
inline constexpr float kMinCaseLogitCap = 1e-20f;
inline constexpr float kMaxCaseLogitCap = 1e20f;

// One declarative attention case. Lengths are per request.
struct CaseSpec {
  std::string name;  // [A-Za-z0-9_]: doubles as the gtest parameter name
  ForwardMode mode = ForwardMode::kExtend;
  int page_size = 1;
  std::vector<int> prefix_lens;  // cached decoder tokens before this forward (decode: kv_len - 1)
  std::vector<int> new_lens;     // new tokens (decode: all 1; TARGET_VERIFY: ignored, uses N)
  int num_q_heads = 8;
  int num_kv_heads = 2;
  int head_dim = 128;             // qk head dim (MLA absorbed: 576; MLA prefill: 192)
  int v_head_dim = 128;           // (MLA absorbed: 512; MLA prefill: 128)
  DType q_dtype = DType::kBF16;   // q / k / v / out
  DType kv_dtype = DType::kBF16;  // pool storage dtype
  int sliding_window = -1;
  float logit_cap = 0.f;
  bool sinks = false;
  AttentionType type = AttentionType::kDecoder;
  bool cross_attention = false;
  std::vector<int> encoder_lens;  // per request; non-empty only with cross_attention
  int spec_draft_tokens = 0;      // TARGET_VERIFY: N drafts per request
  int spec_topk = 0;              // 1 = chain, > 1 = tree (needs the custom mask)
  bool mla = false;
  int kv_lora_rank = 0;       // MLA: 512
  int qk_rope_head_dim = 0;   // MLA: 64
  bool shuffle_pages = true;  // random non-contiguous page tables and request rows
  // Requests 1.. reuse request 0's first shared_prefix decoder tokens (its pages, as a radix
  // cache shares a common prompt); a multiple of page_size, <= every prefix_lens[r].
  int shared_prefix = 0;
  // MLA non-absorbed prefill: > 0 = the new tokens also attend their cached prefix through the
  // chunked prefix cache (AttentionLayer::mla_prefix with the test expander of
  // mla_prefix_expander.h), at most this many prefix tokens per chunk; 0 = new tokens only.
  int mla_prefix_chunk = 0;
  // Mean of every V value (history and new tokens; N(v_mean, 1) instead of N(0, 1)); not MLA
  // (absorbed: V is part of the key row; not absorbed: the history has no V of its own). With a
  // nonzero mean O grows with the row like the softmax row sum does (the fa3 FP8 kernel's long-row
  // accumulation tests).
  float v_mean = 0.f;
  // q handed to the backend in fp8_e4m3 (the fa3 FP8 prefill's e4m3 input): each layer's q is
  // drawn as usual, then stored as RNE(x / q_scale) with one AttentionLayer::q_scale per layer
  // (amax / 448); the reference reads the e4m3 values times q_scale. out, k and v stay q_dtype.
  bool fp8_q = false;
  uint64_t seed = 0;

  int batch_size() const { return static_cast<int>(prefix_lens.size()); }
  // MLA with the [latent | rope] row as the key (decode / absorbed extend).
  bool mla_absorbed() const {
    return mla && int64_t{head_dim} == int64_t{kv_lora_rank} + qk_rope_head_dim;
  }
  // MLA with separate k / v rows (the non-absorbed 192 / 128 prefill): its forward reads the new
  // tokens' k / v from its arguments, not from the pool.
  bool mla_prefill() const { return mla && !mla_absorbed(); }
  AttentionKind kind() const { return mla ? AttentionKind::kMLA : AttentionKind::kMHA; }
  // One line: "extend_p16_gqa4: extend bs 3 page 16 heads 8/2 d 128/128 q bf16 kv bf16 ...".
  std::string describe() const;
};

// How GoogleTest prints a case parameter: its one-line description.
void PrintTo(const CaseSpec& spec, std::ostream* os);

// The table of DESIGN.md section 8 (page sizes 1/16/64/128/24, ragged and odd lengths, kv_len 0
// and 1 in a mixed batch, GQA 1/4/8 and MQA, head dims 64/128/256, MLA 576/512 and 192/128,
// window, soft-cap, sinks, fp8 e4m3/e5m2 and fp4 KV, verify trees topk 1 and > 1, encoder and
// cross attention; decode, extend, mixed, draft extend). Names are unique.
const std::vector<CaseSpec>& shared_case_table();
// nullptr when absent.
const CaseSpec* find_case(std::string_view name);

struct PrepareOptions {
  int num_layers = 2;         // independent K/V, q/k/v and outputs per layer (bench: rotation)
  bool request_lse = true;    // run_backend passes an lse tensor and compare checks it
  bool poison = true;         // NaN-fill outputs, lse and the whole pool before writing history
  bool snapshot_pool = true;  // keep a host copy of the pool to detect stray writes
  int spare_pages = 3;        // allocated-but-unused pages mixed into the page tables' range
  bool fast_inputs = false;   // counter-based, multi-threaded random inputs (bench: big cases)
  // PreparedCase::context()'s BackendContext::early_page_table_reads. true: the harness writes page
  // tables and plans by host copies, so the SM90 flashinfer decode may read them before its PDL
  // wait (mode 2). false: the library default (mode 1, wait first, unless the backend's own set_kv
  // ran), for tests of that path.
  bool early_page_table_reads = true;
};

// Everything one layer call needs; tensors live on PreparedCase::device.
struct LayerData {
  AttentionLayer layer;
  TensorView q;    // [T, Hq, Dqk]   q_dtype
  TensorView k;    // [T, Hkv, Dqk]  q_dtype (new tokens; MLA absorbed: [T, 1, row])
  TensorView v;    // [T, Hkv, Dv]   q_dtype (MLA absorbed: [T, 1, kv_lora_rank], V part of k)
  TensorView out;  // [T, Hq, Dv]    q_dtype, NaN-poisoned
  TensorView lse;  // [T, Hq]        f32, NaN-poisoned; empty unless request_lse
  bool save_kv_allowed = true;  // false for cross-attention and MLA non-absorbed layers
};

struct PreparedCase {
  CaseSpec spec;
  PrepareOptions options;
  Device device;
  int num_tokens = 0;  // T
  std::unique_ptr<ReqToTokenPool> req_to_token;
  std::unique_ptr<KVPool> kv_pool;  // MHAKVPool or MLAKVPool on `device`
  std::unique_ptr<PageAllocator> allocator;
  ForwardBatch batch;  // device tensors + host copies; points at the pools above
  std::vector<LayerData> layers;
  // Host-side facts about the case.
  std::vector<int32_t> rows;           // req_to_token row of each request
  std::vector<int32_t> kv_lens;        // decoder keys each request's queries see in the pool
  std::vector<int64_t> out_cache_loc;  // host copy of batch.out_cache_loc
  std::vector<int32_t> verify_depth;   // TARGET_VERIFY: tree depth of each draft (per token)
  std::vector<std::vector<uint8_t>> pool_snapshot;  // per layer: all pool bytes after history
  std::vector<Buffer> storage;                      // owns the memory behind batch and layers
  // Guard bytes before and after each out / lse (on `device`): where, and how many.
  struct Canary {
    void* at = nullptr;
    int64_t bytes = 0;
  };
  std::vector<Canary> canaries;
  // spec.mla_prefix_chunk > 0: the decompressor every layer's AttentionLayer::mla_prefix points to.
  std::unique_ptr<MlaPrefixDecompressor> mla_prefix;

  // The context a backend for this case is created with.
  BackendContext context() const;
};

// The checks prepare_case makes on `spec` alone (default PrepareOptions), for callers that want
// an invalid spec reported before anything else (e.g. `attnkit run --case`): the error names the
// field, its value and what is allowed.
Status validate_case(const CaseSpec& spec);

// The host's available memory (/proc/meminfo MemAvailable) in bytes; -1 where it cannot be read.
int64_t host_memory_available();

// The host memory prepare_case(spec, device, options) takes at its peak, in bytes, worked out from
// the spec's lengths alone (nothing is allocated). `spec` must pass validate_case. Example:
// decode, one request of kv_len 2e9, 2 kv heads of d 64, page 16, on cuda:0 with the bench's
// options (one layer, no snapshot): 125M pages x 17 B (allocator and page list) + 2e9 slots x 8 B
// + a request table of 4 rows x 2e9 entries x 4 B + 2e9 history slots x 8 B = 66 GB of `tables`,
// and the history K drawn on the host before its upload, 2e9 x 2 x 64 x 4 B = 1 TB of `inputs`,
// though the pool itself is on the device.
struct HostFootprint {
  // Page allocator and page list, per-token slots, the request table (CUDA: its host mirror), the
  // history / new-token slots, positions and verify mask (CPU: with their uploaded copies).
  double tables = 0;
  double pool = 0;      // CPU only: the KV pool of every layer
  double snapshot = 0;  // PrepareOptions::snapshot_pool: a host copy of the pool, on every device
  // CPU: every layer's history K/V (f32), q / k / v / out / lse; every device: the largest
  // per-layer staging of random values (and on CUDA of the NaN poison).
  double inputs = 0;
  double total() const { return tables + pool + snapshot + inputs; }
};
HostFootprint host_footprint(const CaseSpec& spec, Device device, const PrepareOptions& options);

// kOutOfMemory naming the case, its footprint's parts and `available` when host_footprint is above
// `available` bytes (<= 0: unknown, nothing is refused). prepare_case calls it with
// host_memory_available() before anything else on every device, so a case too large for the host
// is refused at once instead of after its page list, slots and request table were built (or the
// kernel's out-of-memory handler killed the process while they were filled).
Status check_host_footprint(const CaseSpec& spec, Device device, const PrepareOptions& options,
                            int64_t available);

// Builds the case on `device` (CPU or CUDA). Errors name the spec field that is inconsistent.
Result<PreparedCase> prepare_case(const CaseSpec& spec, Device device,
                                  const PrepareOptions& options = {});

// init_forward_metadata once, then forward() for every layer. save_kv = false: the runner writes
// the new k/v into the pool itself (kv_pool->set_kv) so the backend reads everything from the
// pool and receives empty k/v. Layers with save_kv_allowed = false always run with save_kv off.
// Ends with kv_pool->check_device_errors (CUDA pools: a synchronisation; a set_kv write that the
// device slot guard skipped becomes this call's error).
Status run_backend(AttentionBackend& backend, PreparedCase& prepared, bool save_kv);

// Worst layer's numbers.
struct Comparison {
  double rel_l2 = 0.0;  // ||out - ref||_2 / ||ref||_2
  // The same per request (its rows of out), worst over requests and layers: a layer's rel L2 is
  // dominated by its many short requests and cannot see one long request gone wrong.
  double request_rel_l2 = 0.0;
  int worst_request = 0;
  double max_abs = 0.0;             // max |out - ref|
  int64_t nan_inf_count = 0;        // non-finite values in out (and lse)
  double lse_max_abs = 0.0;         // max |lse - ref_lse| (0 when lse not requested)
  int64_t pool_stray_writes = 0;    // pool bytes changed outside the new tokens' slots
  int64_t pool_bad_new_values = 0;  // new-token rows not matching k/v within kv-dtype tolerance
  int64_t canaries_damaged = 0;     // canaries of output / lse tensors overwritten
  double tolerance = 0.0;           // rel L2 bound (from q dtype); per request: kRequestFactor x
  double max_abs_tolerance = 0.0;   // max-abs bound (tolerance scaled by the reference's magnitude)
  double lse_tolerance = 0.0;
  int worst_layer = 0;
  int64_t elements = 0;  // out elements compared per layer

  // A request's rows are fewer than the layer's, so its ratio is noisier: twice the bound.
  static constexpr double kRequestFactor = 2.0;
  bool passed() const;
  // "rel_l2 1.2e-03 (tol 1.0e-02) max_abs 4.1e-03 (tol 1.2e-01) lse 2.0e-05 nan 0 stray 0 ..."
  std::string summary() const;
};

// rel L2 tolerance for outputs in `dtype`: bf16 1e-2, f16 3e-3, f32 1e-4.
double tolerance_for(DType dtype);

// Copies outputs, q, k/v and the pool to the host and compares against the fp64 torch_native
// reference evaluated on the pool as it is after the run (fp8/fp4 KV: the same dequantised cache).
Result<Comparison> compare_with_reference(const PreparedCase& prepared);

// fa3's FP8 kernel computes with e4m3 Q (one scale per row, or the layer's) and e4m3 P, so its
// error against the fp64 reference over the same quantised pool is that of fp8 arithmetic, not of
// the bf16 output: rel L2 2.9-3.8% and LSE errors up to ~0.13 in a numpy model of exactly this
// arithmetic (N(0, 1) inputs, d 128, 1..1000 keys). Its outputs are held to these bounds.
inline constexpr double kFp8ArithmeticRelTolerance = 0.07;
inline constexpr double kFp8ArithmeticLseTolerance = 0.15;
// Raises c's bounds to rel (rel L2; the per-request and max-abs bounds scale with it) and lse
// (when the LSE is compared); bounds already looser stay.
void widen_tolerance(Comparison* c, double rel, double lse);
// The bounds of the arithmetic `backend` ran the case with: widen_tolerance to the FP8 ones when
// an fa3 backend ran any layer on its FP8 kernel (fa3_stats); otherwise c is left as it is.
void apply_backend_arithmetic(const AttentionBackend& backend, Comparison* c);

// The fp64 reference outputs of one layer ([T, Hq, Dv] and [T, Hq]), from the current pool.
struct ReferenceResult {
  std::vector<double> out;
  std::vector<double> lse;
};
Result<ReferenceResult> reference_for_layer(const PreparedCase& prepared, int layer);

// Why `descriptor` cannot run `spec` on `device`, derived only from the descriptor (built flag,
// platforms, compute capability, roles and the MHA/MLA FeatureRow); empty = runnable.
std::string skip_reason(const BackendDescriptor& descriptor, const CaseSpec& spec,
                        const DeviceInfo& device);

// Creates the backend through descriptor.create with prepared.context().
Result<std::unique_ptr<AttentionBackend>> create_backend_for_case(
    const BackendDescriptor& descriptor, const PreparedCase& prepared);

// ---- helpers for the bench and peers ----

// A uniform case: bs requests, each with `prefix_len` cached and `new_len` new tokens.
CaseSpec make_uniform_case(std::string name, ForwardMode mode, int batch_size, int prefix_len,
                           int new_len, int num_q_heads, int num_kv_heads, int head_dim,
                           int page_size, DType q_dtype, DType kv_dtype);

// Dense copy of one layer's self-attention keys/values for contiguous-KV peers (cuDNN, FA2):
// request r's keys [0, kv_lens[r]) concatenated, dequantised, in `dtype`, on `device`.
struct ContiguousKV {
  Buffer k_storage, v_storage, cu_seqlens_storage;
  TensorView k;           // [total_kv, Hkv, Dqk]
  TensorView v;           // [total_kv, Hkv, Dv]
  TensorView cu_seqlens;  // int32 [bs + 1]
  std::vector<int32_t> cu_seqlens_host;
  int max_seqlen = 0;
};
Result<ContiguousKV> make_contiguous_kv(const PreparedCase& prepared, int layer, DType dtype,
                                        Device device);

// Merges two partial attention results over disjoint key sets (natural-log lse):
//   lse = log(exp(lse_a) + exp(lse_b)),  out = out_a * exp(lse_a - lse) + out_b * exp(lse_b - lse)
// Host f32/f16/bf16 tensors: out_* [T, H, D], lse_* f32 [T, H]; results may alias a. An lse of
// -inf (no keys) contributes nothing.
Status merge_attention_states(const TensorView& out_a, const TensorView& lse_a,
                              const TensorView& out_b, const TensorView& lse_b,
                              const TensorView& out, const TensorView& lse);

}  // namespace attnkit::harness
