// Bindings of the per-forward objects and the backend interface: AttentionLayer, SpecInfo,
// ForwardBatch, Backend (init_forward_metadata, forward_extend / forward_decode, the CUDA-graph
// calls) and create_backend.

#include <cmath>
#include <optional>
#include <string>
#include <utility>

#include "wrappers.h"

namespace attnkit::python {
namespace {

using namespace nb::literals;

// Host copy of a length array: the explicit host argument if given, else read from the array
// (a device->host copy for CUDA arrays), else empty.
std::vector<int32_t> host_copy(nb::handle host, const TensorView& array, const char* name) {
  if (!host.is_none()) return host_ints32(host, name);
  if (!array.defined()) return {};
  return narrow_ints32(view_ints(array, name), name);
}

TensorView optional_view(const std::optional<Array>& array, const char* name,
                         std::vector<Array>* keep_alive) {
  if (!array) return TensorView();
  keep_alive->push_back(*array);
  return to_view(*array, name);
}

AttentionType parse_type(const std::string& type) {
  if (type == "decoder") return AttentionType::kDecoder;
  if (type == "encoder_only") return AttentionType::kEncoderOnly;
  raise_invalid("type \"" + type + "\" is not valid (accepted: \"decoder\", \"encoder_only\")");
}

using ForwardFn = Status (AttentionBackend::*)(const TensorView&, const TensorView&,
                                               const TensorView&, const TensorView&,
                                               const AttentionLayer&, const ForwardBatch&, bool,
                                               const TensorView&);

// Holds PyBackend::busy for one call; a call made while another thread holds it raises (the
// backend's plan and scratch would be shared: intel_amx gave wrong outputs under four threads).
// Constructed with the GIL held (a refusal raises). done() lets go before the GIL is taken back:
// a finished call that still counted while it waited for the GIL would refuse the thread holding
// the GIL, which never lets go of it while it is refused (starvation).
class OneCallAtATime {
 public:
  OneCallAtATime(PyBackend& b, const char* method) : busy_(b.busy) {
    if (busy_.exchange(true, std::memory_order_acquire)) {
      raise_invalid(std::string("Backend.") + method +
                    ": another thread is inside a call of this backend; a backend runs one call "
                    "at a time (use one backend per thread, or a lock)");
    }
  }
  void done() {
    if (!done_) busy_.store(false, std::memory_order_release);
    done_ = true;
  }
  ~OneCallAtATime() { done(); }
  OneCallAtATime(const OneCallAtATime&) = delete;
  OneCallAtATime& operator=(const OneCallAtATime&) = delete;

 private:
  std::atomic<bool>& busy_;
  bool done_ = false;
};

void run_forward(PyBackend& b, ForwardFn fn, const char* method, const Array& q,
                 const std::optional<Array>& k, const std::optional<Array>& v, nb::handle out,
                 const PyAttentionLayer& layer, const PyForwardBatch& batch, bool save_kv,
                 nb::handle lse) {
  const TensorView qv = to_view(q, "q");
  const TensorView kv = k ? to_view(*k, "k") : TensorView();
  const TensorView vv = v ? to_view(*v, "v") : TensorView();
  const TensorView ov = to_view(writable_array(out, "out", "the attention output"), "out");
  const TensorView lv =
      lse.is_none() ? TensorView() : to_view(writable_array(lse, "lse", "the log-sum-exp"), "lse");
  Status status;
  {
    OneCallAtATime one(b, method);
    PoolUse use(nb::cast<PyKVPool&>(batch.kv_pool), PoolUse::Kind::kForward, "Backend", method);
    TableUse table(batch.req_to_token_pool);
    nb::gil_scoped_release release;
    status = (b.backend.get()->*fn)(qv, kv, vv, ov, layer.layer, batch.batch, save_kv, lv);
    table.done();
    use.done();  // before the GIL is taken back (OneCallAtATime)
    one.done();
  }
  check(status);
}

// The Python method for one of the forward entry points (forward_extend, forward_decode, forward).
auto forward_method(ForwardFn fn, const char* method) {
  return [fn, method](PyBackend& b, const Array& q, std::optional<Array> k, std::optional<Array> v,
                      nb::handle out, const PyAttentionLayer& layer, const PyForwardBatch& batch,
                      bool save_kv, nb::handle lse) {
    run_forward(b, fn, method, q, k, v, out, layer, batch, save_kv, lse);
  };
}

constexpr const char* kForwardDoc =
    "q [T, Hq, Dqk], k [T, Hkv, Dqk] and v [T, Hkv, Dv] (None: read everything from the pool), "
    "out [T, Hq, Dv] (caller-allocated, q's dtype), optional lse f32 [T, Hq]. save_kv writes k/v "
    "at batch.out_cache_loc first. Runs on the stream of the batch (or the backend's).";

}  // namespace

ForwardMode parse_mode_arg(nb::handle obj) {
  if (nb::isinstance<nb::str>(obj)) {
    const std::string name = nb::cast<std::string>(obj);
    for (ForwardMode mode :
         {ForwardMode::kExtend, ForwardMode::kDecode, ForwardMode::kMixed, ForwardMode::kIdle,
          ForwardMode::kTargetVerify, ForwardMode::kDraftExtend}) {
      if (name == forward_mode_name(mode)) return mode;
    }
    raise_invalid("mode \"" + name +
                  "\" is not valid (accepted: extend, decode, mixed, idle, target_verify, "
                  "draft_extend)");
  }
  ForwardMode mode;
  // Not an int: True / 0 / 5 were taken as DECODE / EXTEND / DRAFT_EXTEND (the enum's cast
  // converts integers).
  if (!nb::isinstance<ForwardMode>(obj) || !nb::try_cast<ForwardMode>(obj, mode)) {
    raise_invalid("mode must be a string or attnkit.ForwardMode, got " +
                  nb::cast<std::string>(nb::str(obj.type())));
  }
  return mode;
}

void bind_backend(nb::module_& m) {
  nb::enum_<ForwardMode>(m, "ForwardMode")
      .value("EXTEND", ForwardMode::kExtend)
      .value("DECODE", ForwardMode::kDecode)
      .value("MIXED", ForwardMode::kMixed)
      .value("IDLE", ForwardMode::kIdle)
      .value("TARGET_VERIFY", ForwardMode::kTargetVerify)
      .value("DRAFT_EXTEND", ForwardMode::kDraftExtend);

  nb::class_<PyAttentionLayer>(m, "AttentionLayer", "Per-layer description handed to every call.")
      .def(
          "__init__",
          [](PyAttentionLayer* self, int num_q_heads, int num_kv_heads, int qk_head_dim,
             std::optional<int> v_head_dim, int layer_id, std::optional<float> scaling,
             float logit_cap, int sliding_window, bool is_cross_attention, const std::string& type,
             std::optional<Array> sinks, float k_scale, float v_scale, float q_scale, bool is_mla,
             int kv_lora_rank, int qk_rope_head_dim) {
            AttentionLayer l;
            l.layer_id = layer_id;
            l.num_q_heads = num_q_heads;
            l.num_kv_heads = num_kv_heads;
            l.qk_head_dim = qk_head_dim;
            l.v_head_dim = v_head_dim.value_or(qk_head_dim);
            l.scaling =
                scaling.value_or(qk_head_dim > 0 ? 1.0f / std::sqrt(float(qk_head_dim)) : 0.0f);
            l.logit_cap = logit_cap;
            l.sliding_window = sliding_window;
            l.is_cross_attention = is_cross_attention;
            l.type = parse_type(type);
            if (sinks) l.sinks = to_view(*sinks, "sinks");
            l.k_scale = k_scale;
            l.v_scale = v_scale;
            l.q_scale = q_scale;
            l.is_mla = is_mla;
            l.kv_lora_rank = kv_lora_rank;
            l.qk_rope_head_dim = qk_rope_head_dim;
            new (self) PyAttentionLayer{l, sinks};
          },
          "num_q_heads"_a, "num_kv_heads"_a, "qk_head_dim"_a, "v_head_dim"_a = nb::none(),
          nb::kw_only(), "layer_id"_a = 0, "scaling"_a = nb::none(), "logit_cap"_a = 0.0f,
          "sliding_window"_a = -1, "is_cross_attention"_a = false, "type"_a = "decoder",
          "sinks"_a = nb::none(), "k_scale"_a = 1.0f, "v_scale"_a = 1.0f, "q_scale"_a = 1.0f,
          "is_mla"_a = false, "kv_lora_rank"_a = 0, "qk_rope_head_dim"_a = 0,
          "scaling defaults to 1/sqrt(qk_head_dim). sliding_window: a key is visible when "
          "q_pos - k_pos <= sliding_window (-1 = off). type: \"decoder\" (causal) or "
          "\"encoder_only\" (bidirectional; refused in target_verify / draft_extend batches). "
          "sinks: optional f32 [num_q_heads] logits. q_scale: "
          "the scale of an e4m3 q (stored x / q_scale; fa3's SM90 FP8 prefill), ignored "
          "otherwise.")
      .def_prop_rw(
          "layer_id", [](const PyAttentionLayer& l) { return l.layer.layer_id; },
          [](PyAttentionLayer& l, int v) { l.layer.layer_id = v; })
      .def_prop_ro("num_q_heads", [](const PyAttentionLayer& l) { return l.layer.num_q_heads; })
      .def_prop_ro("num_kv_heads", [](const PyAttentionLayer& l) { return l.layer.num_kv_heads; })
      .def_prop_ro("qk_head_dim", [](const PyAttentionLayer& l) { return l.layer.qk_head_dim; })
      .def_prop_ro("v_head_dim", [](const PyAttentionLayer& l) { return l.layer.v_head_dim; })
      .def_prop_rw(
          "scaling", [](const PyAttentionLayer& l) { return l.layer.scaling; },
          [](PyAttentionLayer& l, float v) { l.layer.scaling = v; })
      .def_prop_rw(
          "logit_cap", [](const PyAttentionLayer& l) { return l.layer.logit_cap; },
          [](PyAttentionLayer& l, float v) { l.layer.logit_cap = v; })
      .def_prop_rw(
          "sliding_window", [](const PyAttentionLayer& l) { return l.layer.sliding_window; },
          [](PyAttentionLayer& l, int v) { l.layer.sliding_window = v; })
      .def_prop_rw(
          "k_scale", [](const PyAttentionLayer& l) { return l.layer.k_scale; },
          [](PyAttentionLayer& l, float v) { l.layer.k_scale = v; })
      .def_prop_rw(
          "v_scale", [](const PyAttentionLayer& l) { return l.layer.v_scale; },
          [](PyAttentionLayer& l, float v) { l.layer.v_scale = v; })
      .def_prop_rw(
          "q_scale", [](const PyAttentionLayer& l) { return l.layer.q_scale; },
          [](PyAttentionLayer& l, float v) { l.layer.q_scale = v; })
      .def_prop_ro("is_mla", [](const PyAttentionLayer& l) { return l.layer.is_mla; });

  nb::class_<PySpecInfo>(m, "SpecInfo",
                         "Speculative-decoding inputs (TARGET_VERIFY, DRAFT_EXTEND).")
      .def(
          "__init__",
          [](PySpecInfo* self, int draft_token_num, int topk, int num_steps,
             std::optional<Array> custom_mask, std::optional<Array> mask_indptr,
             nb::handle mask_indptr_host) {
            SpecInfo s;
            s.draft_token_num = draft_token_num;
            s.topk = topk;
            s.num_steps = num_steps;
            if (custom_mask) s.custom_mask = to_view(*custom_mask, "custom_mask");
            if (mask_indptr) s.mask_indptr = to_view(*mask_indptr, "mask_indptr");
            if (!mask_indptr_host.is_none()) {
              s.mask_indptr_host = host_ints(mask_indptr_host, "mask_indptr_host");
            } else if (mask_indptr) {
              s.mask_indptr_host = view_ints(s.mask_indptr, "mask_indptr");
            }
            new (self) PySpecInfo{s, custom_mask, mask_indptr};
          },
          "draft_token_num"_a, "topk"_a = 1, "num_steps"_a = 0, "custom_mask"_a = nb::none(),
          "mask_indptr"_a = nb::none(), "mask_indptr_host"_a = nb::none(),
          "custom_mask: uint8/bool flat tree mask; request r's row-major [N, prefix + N] block "
          "starts at mask_indptr[r] (int64 [bs + 1]).");

  nb::class_<PyForwardBatch>(m, "ForwardBatch",
                             "What one forward pass asks of the attention layer. Arrays are "
                             "borrowed zero-copy and kept alive by the batch.")
      .def(
          "__init__",
          [](PyForwardBatch* self, nb::handle mode, const Array& req_pool_indices,
             const Array& seq_lens, const Array& out_cache_loc, PyReqToTokenPool& req_to_token_pool,
             PyKVPool& kv_pool, std::optional<Array> positions,
             std::optional<Array> extend_prefix_lens, std::optional<Array> extend_seq_lens,
             std::optional<Array> extend_start_loc, std::optional<Array> encoder_lens,
             nb::handle req_pool_indices_host, nb::handle seq_lens_host,
             nb::handle extend_prefix_lens_host, nb::handle extend_seq_lens_host,
             nb::handle extend_start_loc_host, nb::handle encoder_lens_host, const PySpecInfo* spec,
             nb::handle stream) {
            PyForwardBatch w;
            ForwardBatch& b = w.batch;
            b.mode = parse_mode_arg(mode);
            b.req_pool_indices = optional_view(req_pool_indices, "req_pool_indices", &w.keep_alive);
            b.seq_lens = optional_view(seq_lens, "seq_lens", &w.keep_alive);
            b.out_cache_loc = optional_view(out_cache_loc, "out_cache_loc", &w.keep_alive);
            b.positions = optional_view(positions, "positions", &w.keep_alive);
            b.extend_prefix_lens =
                optional_view(extend_prefix_lens, "extend_prefix_lens", &w.keep_alive);
            b.extend_seq_lens = optional_view(extend_seq_lens, "extend_seq_lens", &w.keep_alive);
            b.extend_start_loc = optional_view(extend_start_loc, "extend_start_loc", &w.keep_alive);
            b.encoder_lens = optional_view(encoder_lens, "encoder_lens", &w.keep_alive);
            b.batch_size =
                b.req_pool_indices.ndim > 0 ? static_cast<int>(b.req_pool_indices.size(0)) : 0;
            b.num_tokens = b.out_cache_loc.ndim > 0 ? static_cast<int>(b.out_cache_loc.size(0)) : 0;
            b.req_pool_indices_host =
                host_copy(req_pool_indices_host, b.req_pool_indices, "req_pool_indices");
            b.seq_lens_host = host_copy(seq_lens_host, b.seq_lens, "seq_lens");
            b.extend_prefix_lens_host =
                host_copy(extend_prefix_lens_host, b.extend_prefix_lens, "extend_prefix_lens");
            b.extend_seq_lens_host =
                host_copy(extend_seq_lens_host, b.extend_seq_lens, "extend_seq_lens");
            b.extend_start_loc_host =
                host_copy(extend_start_loc_host, b.extend_start_loc, "extend_start_loc");
            b.encoder_lens_host = host_copy(encoder_lens_host, b.encoder_lens, "encoder_lens");
            b.seq_lens_sum = 0;
            for (int32_t len : b.seq_lens_host) b.seq_lens_sum += len;
            b.req_to_token_pool = req_to_token_pool.pool.get();
            b.kv_pool = kv_pool.pool.get();
            if (spec != nullptr) {
              b.has_spec = true;
              b.spec = spec->spec;
              if (spec->custom_mask) w.keep_alive.push_back(*spec->custom_mask);
              if (spec->mask_indptr) w.keep_alive.push_back(*spec->mask_indptr);
            }
            b.stream = parse_stream_arg(stream);
            w.req_to_token_pool = nb::find(&req_to_token_pool);
            w.kv_pool = nb::find(&kv_pool);
            check(b.validate());
            new (self) PyForwardBatch(std::move(w));
          },
          "mode"_a, "req_pool_indices"_a, "seq_lens"_a, "out_cache_loc"_a, "req_to_token_pool"_a,
          "kv_pool"_a, nb::kw_only(), "positions"_a = nb::none(),
          "extend_prefix_lens"_a = nb::none(), "extend_seq_lens"_a = nb::none(),
          "extend_start_loc"_a = nb::none(), "encoder_lens"_a = nb::none(),
          "req_pool_indices_host"_a = nb::none(), "seq_lens_host"_a = nb::none(),
          "extend_prefix_lens_host"_a = nb::none(), "extend_seq_lens_host"_a = nb::none(),
          "extend_start_loc_host"_a = nb::none(), "encoder_lens_host"_a = nb::none(),
          "spec"_a = nb::none(), "stream"_a = nb::none(),
          "Arrays live on the backend's device: int32 req_pool_indices / seq_lens / extend_* / "
          "encoder_lens [bs], int64 out_cache_loc / positions [T]. Host copies of the length "
          "arrays are read from the arrays (a synchronous device->host copy for CUDA arrays) "
          "unless given as *_host lists. stream: cudaStream_t as an int (e.g. "
          "torch.cuda.current_stream().cuda_stream). The batch is validated on construction.")
      .def_prop_ro("mode", [](const PyForwardBatch& b) { return b.batch.mode; })
      .def_prop_ro("batch_size", [](const PyForwardBatch& b) { return b.batch.batch_size; })
      .def_prop_ro("num_tokens", [](const PyForwardBatch& b) { return b.batch.num_tokens; })
      .def_prop_ro("seq_lens_sum", [](const PyForwardBatch& b) { return b.batch.seq_lens_sum; })
      .def_prop_ro("seq_lens_host", [](const PyForwardBatch& b) { return b.batch.seq_lens_host; })
      .def_prop_rw(
          "stream",
          [](const PyForwardBatch& b) { return reinterpret_cast<uintptr_t>(b.batch.stream); },
          [](PyForwardBatch& b, nb::handle s) { b.batch.stream = parse_stream_arg(s); },
          nb::for_setter(nb::arg("stream").none()),  // None: the backend's stream, as in __init__
          "cudaStream_t the layer calls run on (0 or None = the backend's stream).")
      .def("validate", [](const PyForwardBatch& b) { check(b.batch.validate()); });

  nb::class_<PyBackend>(m, "Backend", "An attention backend (from create_backend).")
      .def_prop_ro("name", [](const PyBackend& b) { return b.backend->descriptor().name; })
      .def_prop_ro(
          "device",
          [](const PyBackend& b) -> std::optional<std::string> {
            const std::optional<Device> d = b.backend->device();
            if (!d) return std::nullopt;
            return d->to_string();
          },
          "The device the backend was made for (\"cpu\", \"cuda:1\"), as KVPool.device says it.")
      .def_prop_ro("descriptor",
                   [](const PyBackend& b) { return descriptor_dict(b.backend->descriptor()); })
      .def(
          "init_forward_metadata",
          [](PyBackend& b, const PyForwardBatch& batch) {
            Status status;
            {
              OneCallAtATime one(b, "init_forward_metadata");
              TableUse table(batch.req_to_token_pool);
              nb::gil_scoped_release release;
              status = b.backend->init_forward_metadata(batch.batch);
              table.done();
              one.done();
            }
            check(status);
          },
          "batch"_a, "Once per forward, before the layers run.")
      .def("forward_extend", forward_method(&AttentionBackend::forward_extend, "forward_extend"),
           "q"_a, "k"_a.none(), "v"_a.none(), "out"_a, "layer"_a, "batch"_a, "save_kv"_a = true,
           "lse"_a = nb::none(), kForwardDoc)
      .def("forward_decode", forward_method(&AttentionBackend::forward_decode, "forward_decode"),
           "q"_a, "k"_a.none(), "v"_a.none(), "out"_a, "layer"_a, "batch"_a, "save_kv"_a = true,
           "lse"_a = nb::none(), kForwardDoc)
      .def("forward", forward_method(&AttentionBackend::forward, "forward"), "q"_a, "k"_a.none(),
           "v"_a.none(), "out"_a, "layer"_a, "batch"_a, "save_kv"_a = true, "lse"_a = nb::none(),
           "IDLE -> nothing, DECODE -> forward_decode, else forward_extend.")
      .def(
          "init_cuda_graph_state",
          [](PyBackend& b, int max_bs, int max_num_tokens) {
            const OneCallAtATime one(b, "init_cuda_graph_state");
            check(b.backend->init_cuda_graph_state(max_bs, max_num_tokens));
            b.graph_buffers.clear();  // the earlier captures are refused from here on
          },
          "max_bs"_a, "max_num_tokens"_a,
          "Allocate the static graph buffers once (kUnsupported -> UnsupportedError for backends "
          "without CUDA-graph support).")
      .def(
          "init_forward_metadata_capture_cuda_graph",
          [](PyBackend& b, int bs, int num_tokens, const Array& req_pool_indices,
             const Array& seq_lens, std::optional<Array> encoder_lens, nb::handle mode,
             const PySpecInfo* spec) {
            const TensorView rv = to_view(req_pool_indices, "req_pool_indices");
            const TensorView sv = to_view(seq_lens, "seq_lens");
            const TensorView ev =
                encoder_lens ? to_view(*encoder_lens, "encoder_lens") : TensorView();
            const ForwardMode fm = parse_mode_arg(mode);
            const OneCallAtATime one(b, "init_forward_metadata_capture_cuda_graph");
            check(b.backend->init_forward_metadata_capture_cuda_graph(
                bs, num_tokens, rv, sv, ev, fm, spec != nullptr ? &spec->spec : nullptr));
            std::vector<Array>& kept = b.graph_buffers[{static_cast<int>(fm), bs}];
            kept.assign({req_pool_indices, seq_lens});
            if (encoder_lens) kept.push_back(*encoder_lens);
          },
          "bs"_a, "num_tokens"_a, "req_pool_indices"_a, "seq_lens"_a, "encoder_lens"_a = nb::none(),
          "mode"_a = "decode", "spec"_a = nb::none(),
          "Before capturing a graph: writes the metadata into the static buffers. The arrays are "
          "the graph's static inputs; the backend keeps them alive.")
      .def(
          "init_forward_metadata_replay_cuda_graph",
          [](PyBackend& b, int bs, const Array& req_pool_indices, const Array& seq_lens,
             int64_t seq_lens_sum, std::optional<Array> encoder_lens, nb::handle mode,
             const PySpecInfo* spec, nb::handle seq_lens_host) {
            const TensorView rv = to_view(req_pool_indices, "req_pool_indices");
            const TensorView sv = to_view(seq_lens, "seq_lens");
            const TensorView ev =
                encoder_lens ? to_view(*encoder_lens, "encoder_lens") : TensorView();
            const std::vector<int32_t> host = host_ints32(seq_lens_host, "seq_lens_host");
            if (!host.empty() && static_cast<int64_t>(host.size()) < bs) {
              raise_invalid("seq_lens_host: " + std::to_string(host.size()) + " lengths for bs " +
                            std::to_string(bs) +
                            " (needs one per graph row, padded rows included)");
            }
            const ForwardMode fm = parse_mode_arg(mode);
            Status status;
            {
              OneCallAtATime one(b, "init_forward_metadata_replay_cuda_graph");
              TableUse table(b.req_to_token_pool);
              nb::gil_scoped_release release;
              status = b.backend->init_forward_metadata_replay_cuda_graph(
                  bs, rv, sv, seq_lens_sum, ev, fm, spec != nullptr ? &spec->spec : nullptr,
                  host.empty() ? nullptr : host.data());
              table.done();
              one.done();
            }
            check(status);
          },
          "bs"_a, "req_pool_indices"_a, "seq_lens"_a, "seq_lens_sum"_a,
          "encoder_lens"_a = nb::none(), "mode"_a = "decode", "spec"_a = nb::none(),
          "seq_lens_host"_a = nb::none(),
          "Before replaying: refresh the static metadata in place (no allocation, no sync). "
          "seq_lens_host: the bs lengths on the host (padded rows: the fill value); the triton "
          "and flashinfer decode plans need it (they plan splits from the host lengths).")
      .def_prop_ro("cuda_graph_seq_len_fill_value",
                   [](const PyBackend& b) { return b.backend->cuda_graph_seq_len_fill_value(); });

  m.def(
      "create_backend",
      [](nb::handle name, PyKVPool& kv_pool, PyReqToTokenPool& req_to_token_pool, int num_q_heads,
         nb::handle q_dtype, nb::handle device, nb::handle stream, std::optional<int> page_size,
         std::optional<int> num_kv_heads, std::optional<int> qk_head_dim,
         std::optional<int> v_head_dim, std::optional<int> max_batch_size,
         std::optional<int> max_context_len, std::optional<int> num_layers,
         int speculative_num_draft_tokens, int speculative_topk, int num_threads) {
        const KVPoolConfig& pc = kv_pool.pool->config();
        BackendContext ctx;
        ctx.device = device.is_none() ? kv_pool.pool->device() : parse_device_arg(device);
        ctx.stream = parse_stream_arg(stream);
        ctx.num_q_heads = num_q_heads;
        ctx.num_kv_heads = num_kv_heads.value_or(pc.num_kv_heads);
        ctx.qk_head_dim = qk_head_dim.value_or(pc.head_dim);
        ctx.v_head_dim = v_head_dim.value_or(pc.v_head_dim);
        ctx.is_mla = kv_pool.pool->is_mla();
        ctx.kv_lora_rank = pc.kv_lora_rank;
        ctx.qk_rope_head_dim = pc.qk_rope_head_dim;
        ctx.q_dtype = parse_dtype_arg(q_dtype, "q_dtype");
        ctx.page_size = page_size.value_or(pc.page_size);
        ctx.max_batch_size = max_batch_size.value_or(req_to_token_pool.pool->max_reqs());
        ctx.max_context_len = max_context_len.value_or(req_to_token_pool.pool->max_context_len());
        ctx.num_layers = num_layers.value_or(pc.num_layers);
        ctx.req_to_token_pool = req_to_token_pool.pool.get();
        ctx.kv_pool = kv_pool.pool.get();
        ctx.speculative_num_draft_tokens = speculative_num_draft_tokens;
        ctx.speculative_topk = speculative_topk;
        ctx.num_threads = num_threads;
        auto result = std::make_unique<PyBackend>();
        if (const Selection* selection = selection_of(name)) {
          result->backend = check(create_selected_backend(*selection, ctx));
        } else if (nb::isinstance<nb::str>(name)) {
          result->backend = check(builtin_registry().create(nb::cast<std::string>(name), ctx));
        } else {
          raise_invalid("name must be a backend name (str) or an attnkit.Selection, got " +
                        nb::cast<std::string>(nb::str(name.type())));
        }
        result->req_to_token_pool = nb::find(&req_to_token_pool);
        result->kv_pool = nb::find(&kv_pool);
        return result;
      },
      "name"_a, nb::kw_only(), "kv_pool"_a, "req_to_token_pool"_a, "num_q_heads"_a,
      "q_dtype"_a = "bf16", "device"_a = nb::none(), "stream"_a = nb::none(),
      "page_size"_a = nb::none(), "num_kv_heads"_a = nb::none(), "qk_head_dim"_a = nb::none(),
      "v_head_dim"_a = nb::none(), "max_batch_size"_a = nb::none(),
      "max_context_len"_a = nb::none(), "num_layers"_a = nb::none(),
      "speculative_num_draft_tokens"_a = 0, "speculative_topk"_a = 0, "num_threads"_a = 0,
      "Create a backend by flag name (\"torch_native\", \"intel_amx\", \"triton\", ...) or from an "
      "attnkit.Selection (a hybrid backend when prefill and decode differ). Shapes, page size, "
      "layer count and device default to the pools'. stream: the cudaStream_t (int) the "
      "backend's own work and the CUDA-graph metadata calls run on, e.g. "
      "torch.cuda.current_stream().cuda_stream.");
}

}  // namespace attnkit::python
