// AttentionBackend: mode routing, the default (unsupported) CUDA-graph methods and the shared input
// validation every backend runs before any launch.
#include "attnkit/backend.h"

#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <utility>

#include "attnkit/kv_cache.h"
#include "attnkit/registry.h"
#include "backend/validate.h"
#include "core/math_constants.h"
#include "core/str_cat.h"

namespace attnkit {

namespace {

// The room the shared checks leave above the log2-unit softmax scale and the fp8 v_scale for the
// kernels' extra 2^8 (the CPU fp8 widening, the f16 staging).
constexpr float kKernelScaleRoom = 256.f;
// The most keys a request of a windowed layer may have: 2^30 less room for a key block.
constexpr int64_t kMaxWindowedKeys = (int64_t{1} << 30) - (int64_t{1} << 16);

std::string shape_string(std::initializer_list<int64_t> dims) {
  std::ostringstream os;
  os << "[";
  bool first = true;
  for (int64_t d : dims) {
    os << (first ? "" : ", ") << d;
    first = false;
  }
  os << "]";
  return os.str();
}

// `t` must be a 3-D (or `dims.size()`-D) tensor of exactly `dims` with a unit innermost stride.
Status check_exact(const TensorView& t, const char* name, std::initializer_list<int64_t> dims,
                   const char* layout) {
  bool ok = t.ndim == static_cast<int>(dims.size());
  int i = 0;
  for (int64_t d : dims) {
    if (!ok) break;
    ok = t.shape[static_cast<size_t>(i)] == d;
    ++i;
  }
  if (!ok) {
    return Status::invalid_argument(
        cat(name, ": expected shape ", shape_string(dims), " ", layout, ", got ", t.describe()));
  }
  // (An array of no elements has no layout to check: numpy gives zero-size arrays stride 0.)
  if (t.ndim > 0 && t.numel() > 0 && t.shape[static_cast<size_t>(t.ndim - 1)] > 1 &&
      t.stride(-1) != 1) {
    return Status::invalid_argument(
        cat(name, ": the innermost stride must be 1, got ", t.stride(-1), " (", t.describe(), ")"));
  }
  return Status::ok();
}

Status check_on(const TensorView& t, const char* name, Device device) {
  if (t.device != device) {
    return Status::invalid_argument(cat(name, " is on ", t.device.to_string(),
                                        " but the backend runs on ", device.to_string()));
  }
  return Status::ok();
}

Status check_layer(const AttentionLayer& layer) {
  if (layer.num_q_heads <= 0 || layer.num_kv_heads <= 0) {
    return Status::invalid_argument(cat("layer.num_q_heads ", layer.num_q_heads,
                                        " and layer.num_kv_heads ", layer.num_kv_heads,
                                        " must be > 0"));
  }
  if (layer.num_q_heads % layer.num_kv_heads != 0) {
    return Status::invalid_argument(cat("layer.num_q_heads ", layer.num_q_heads,
                                        " is not divisible by layer.num_kv_heads ",
                                        layer.num_kv_heads, " (GQA needs whole groups)"));
  }
  if (layer.qk_head_dim <= 0 || layer.v_head_dim <= 0) {
    return Status::invalid_argument(cat("layer.qk_head_dim ", layer.qk_head_dim,
                                        " and layer.v_head_dim ", layer.v_head_dim,
                                        " must be > 0"));
  }
  if (!(layer.scaling > 0.f) || !std::isfinite(layer.scaling)) {
    return Status::invalid_argument(cat("layer.scaling ", layer.scaling,
                                        " must be finite and > 0 (usually 1/sqrt(qk_head_dim))"));
  }
  if (layer.logit_cap < 0.f || !std::isfinite(layer.logit_cap)) {
    return Status::invalid_argument(
        cat("layer.logit_cap ", layer.logit_cap, " must be finite and >= 0 (0 = off)"));
  }
  if (layer.type != AttentionType::kDecoder && layer.type != AttentionType::kEncoderOnly) {
    return Status::invalid_argument(cat("layer.type ", static_cast<int>(layer.type),
                                        " is not an AttentionType (0 decoder, 1 encoder-only)"));
  }
  if (layer.sliding_window < -1) {
    return Status::invalid_argument(
        cat("layer.sliding_window ", layer.sliding_window, " must be -1 (off) or >= 0"));
  }
  if (!(layer.k_scale > 0.f) || !(layer.v_scale > 0.f) || !std::isfinite(layer.k_scale) ||
      !std::isfinite(layer.v_scale)) {
    return Status::invalid_argument(cat("layer.k_scale ", layer.k_scale, " and layer.v_scale ",
                                        layer.v_scale, " must be finite and > 0"));
  }
  if (!(layer.q_scale > 0.f) || !std::isfinite(layer.q_scale)) {
    return Status::invalid_argument(
        cat("layer.q_scale ", layer.q_scale, " must be finite and > 0 (1 unless q is fp8_e4m3)"));
  }
  if (layer.is_mla) {
    const int row = layer.kv_lora_rank + layer.qk_rope_head_dim;
    if (layer.kv_lora_rank <= 0 || layer.qk_rope_head_dim < 0) {
      return Status::invalid_argument(cat("layer.kv_lora_rank ", layer.kv_lora_rank,
                                          " must be > 0 and layer.qk_rope_head_dim ",
                                          layer.qk_rope_head_dim, " >= 0 for MLA"));
    }
    if (layer.qk_head_dim == row) {  // absorbed
      if (layer.num_kv_heads != 1 || layer.v_head_dim != layer.kv_lora_rank) {
        return Status::invalid_argument(
            cat("MLA absorbed layer (qk_head_dim ", layer.qk_head_dim,
                " = kv_lora_rank + qk_rope_head_dim): needs num_kv_heads 1 (got ",
                layer.num_kv_heads, ") and v_head_dim = kv_lora_rank ", layer.kv_lora_rank,
                " (got ", layer.v_head_dim, ")"));
      }
    }
  }
  if (layer.mla_prefix != nullptr) {
    if (!layer.is_mla || layer.qk_head_dim == layer.kv_lora_rank + layer.qk_rope_head_dim) {
      return Status::invalid_argument(
          cat("layer.mla_prefix is set on a layer that is not an MLA non-absorbed (prefill) layer "
              "(is_mla ",
              layer.is_mla, ", qk_head_dim ", layer.qk_head_dim, ")"));
    }
    if (layer.mla_prefix->chunk_tokens < 1 || !layer.mla_prefix->expand) {
      return Status::invalid_argument(cat("layer.mla_prefix: chunk_tokens ",
                                          layer.mla_prefix->chunk_tokens,
                                          " must be >= 1 and expand must be set"));
    }
    if (layer.num_kv_heads != layer.num_q_heads || layer.qk_head_dim <= layer.qk_rope_head_dim) {
      return Status::invalid_argument(cat(
          "layer.mla_prefix: the decompressed prefix has one key head per query head "
          "(num_kv_heads ",
          layer.num_kv_heads, " must equal num_q_heads ", layer.num_q_heads, ") and qk_head_dim ",
          layer.qk_head_dim, " must exceed qk_rope_head_dim ", layer.qk_rope_head_dim));
    }
  }
  return Status::ok();
}

}  // namespace

Status AttentionBackend::forward(const TensorView& q, const TensorView& k, const TensorView& v,
                                 const TensorView& out, const AttentionLayer& layer,
                                 const ForwardBatch& batch, bool save_kv, const TensorView& lse) {
  switch (batch.mode) {
    case ForwardMode::kIdle:
      return batch.validate();  // nothing to run; an idle batch holds no tokens
    case ForwardMode::kDecode:
      return forward_decode(q, k, v, out, layer, batch, save_kv, lse);
    case ForwardMode::kExtend:
    case ForwardMode::kMixed:
    case ForwardMode::kTargetVerify:
    case ForwardMode::kDraftExtend:
      return forward_extend(q, k, v, out, layer, batch, save_kv, lse);
  }
  return Status::invalid_argument(
      cat("batch.mode ", static_cast<int>(batch.mode), " is not a ForwardMode"));
}

Status AttentionBackend::init_cuda_graph_state(int /*max_bs*/, int /*max_num_tokens*/) {
  return Status::unsupported(descriptor().name + " does not support CUDA graphs");
}

Status AttentionBackend::init_forward_metadata_capture_cuda_graph(
    int /*bs*/, int /*num_tokens*/, const TensorView& /*req_pool_indices*/,
    const TensorView& /*seq_lens*/, const TensorView& /*encoder_lens*/, ForwardMode /*mode*/,
    const SpecInfo* /*spec*/) {
  return Status::unsupported(descriptor().name + " does not support CUDA graphs");
}

Status AttentionBackend::init_forward_metadata_replay_cuda_graph(
    int /*bs*/, const TensorView& /*req_pool_indices*/, const TensorView& /*seq_lens*/,
    int64_t /*seq_lens_sum*/, const TensorView& /*encoder_lens*/, ForwardMode /*mode*/,
    const SpecInfo* /*spec*/, const int32_t* /*seq_lens_host*/) {
  return Status::unsupported(descriptor().name + " does not support CUDA graphs");
}

// The sink logits of host-resident `sinks` (f32 [q_heads], shape checked): each finite, or -inf
// for no sink. A +inf sink takes the whole softmax denominator and a NaN one poisons it: every
// row of that head comes out NaN. Device sinks are not read here (that would need a copy and a
// synchronisation inside forward).
Status check_sink_values(const TensorView& sinks) {
  if (!sinks.device.is_cpu()) return Status::ok();
  const float* values = sinks.data_as<const float>();
  for (int64_t h = 0; h < sinks.shape[0]; ++h) {
    const float sink = values[h * sinks.stride(0)];
    if (std::isnan(sink) || sink == std::numeric_limits<float>::infinity()) {
      return Status::invalid_argument(cat("layer.sinks[", h, "] (q head ", h, ") is ", sink,
                                          ": a sink must be finite, or -inf for no sink"));
    }
    // The kernels take the sink in log2 units (and the max of it and the row's logits): a finite
    // sink whose product overflowed gave inf - inf, NaN rows.
    if (!std::isfinite(2.f * kLog2e * sink) && sink > 0.f) {
      return Status::invalid_argument(cat("layer.sinks[", h, "] (q head ", h, ") is ", sink,
                                          ": sink x 2 log2(e) must be finite (at most ",
                                          std::numeric_limits<float>::max() / (2.f * kLog2e), ")"));
    }
  }
  return Status::ok();
}

Status check_windowed_lengths(const AttentionLayer& layer, const ForwardBatch& batch) {
  if (layer.sliding_window < 0) return Status::ok();
  const int64_t drafts = batch.mode == ForwardMode::kTargetVerify ? batch.spec.draft_token_num : 0;
  for (size_t r = 0; r < batch.seq_lens_host.size(); ++r) {
    const int64_t keys = int64_t{batch.seq_lens_host[r]} + drafts;
    if (keys > kMaxWindowedKeys) {
      return Status::invalid_argument(
          cat("layer.sliding_window ", layer.sliding_window, " over request ", r, " of ", keys,
              " keys: windowed layers take requests of at most ", kMaxWindowedKeys,
              " keys (int32 key positions in the kernels)"));
    }
  }
  return Status::ok();
}

Status check_entry_point(std::string_view backend, bool decode_entry, const ForwardBatch& batch) {
  const bool decode_batch = batch.mode == ForwardMode::kDecode;
  if (decode_entry == decode_batch) return Status::ok();
  const std::string mode = forward_mode_name(batch.mode);
  const char* article =
      std::string_view("aeiou").find(mode.front()) != std::string_view::npos ? "an" : "a";
  return Status::invalid_argument(
      std::string(backend) + ": " + (decode_entry ? "forward_decode" : "forward_extend") +
      " called with " + article + " " + mode + " batch (" +
      (decode_entry ? "forward_decode takes decode batches" : "use forward_decode") +
      "; forward() picks the entry point from batch.mode)");
}

Status check_vector_rows(std::string_view backend, const TensorView& t, const char* name) {
  if (!t.defined() || t.numel() == 0) return Status::ok();
  constexpr int64_t kVectorBytes = 16;
  const int64_t elem_bits = dtype_bits(t.dtype);
  bool aligned = reinterpret_cast<uintptr_t>(t.data) % kVectorBytes == 0;
  for (int d = 0; d + 1 < t.ndim; ++d) {
    if (t.shape[static_cast<size_t>(d)] > 1) {
      aligned = aligned && (t.stride(d) * elem_bits / 8) % kVectorBytes == 0;
    }
  }
  if (!aligned) {
    return Status::unsupported(cat(backend, ": ", name, " ", t.describe(),
                                   " needs a 16-byte aligned base and outer strides of whole "
                                   "16-byte vectors (its kernels move rows in 16-byte vectors)"));
  }
  return Status::ok();
}

namespace {

// validate_forward_inputs, with out's checks skipped when `out` is null
// (validate_reference_inputs).
Status validate_inputs(const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView* out, const AttentionLayer& layer,
                       const ForwardBatch& batch, bool save_kv, const TensorView& lse,
                       Device device, bool allow_fp8_q) {
  ATTNKIT_RETURN_IF_ERROR(check_layer(layer));
  if (batch.mode == ForwardMode::kIdle) return Status::ok();
  ATTNKIT_RETURN_IF_ERROR(batch.validate());

  const int64_t t = batch.num_tokens;
  const int64_t hq = layer.num_q_heads;
  const int64_t hkv = layer.num_kv_heads;
  const int64_t dqk = layer.qk_head_dim;
  const int64_t dv = layer.v_head_dim;
  const bool mla_absorbed =
      layer.is_mla && layer.qk_head_dim == layer.kv_lora_rank + layer.qk_rope_head_dim;
  const bool mla_prefill = layer.is_mla && !mla_absorbed;
  // A non-absorbed layer attends over the new tokens' k / v only (plus layer.mla_prefix's
  // decompressed chunks): a decode, mixed or verify batch's history sits in the latent pool, which
  // such a layer never reads, so its output would silently leave the history out.
  if (mla_prefill && (batch.mode == ForwardMode::kDecode || batch.mode == ForwardMode::kMixed ||
                      batch.mode == ForwardMode::kTargetVerify)) {
    return Status::invalid_argument(
        cat("MLA non-absorbed layer (qk_head_dim ", dqk, " != kv_lora_rank + qk_rope_head_dim ",
            layer.kv_lora_rank + layer.qk_rope_head_dim, ") in a ", forward_mode_name(batch.mode),
            " batch: it reads no cached history; decode, mixed and target_verify batches need the "
            "absorbed layer "
            "(qk_head_dim = kv_lora_rank + qk_rope_head_dim, v_head_dim = kv_lora_rank)"));
  }

  // Speculative batches are causal by definition (a draft sees the drafts before it, or the verify
  // tree's mask): an encoder-only layer there has no meaning, and the kernels that run them (the
  // decode tiles, the MLA decode engine) order keys causally whatever the layer's type, so it is
  // refused instead of answered by some backends causally and by others bidirectionally.
  if (layer.type == AttentionType::kEncoderOnly &&
      (batch.mode == ForwardMode::kTargetVerify || batch.mode == ForwardMode::kDraftExtend)) {
    return Status::invalid_argument(
        cat("layer.type encoder-only (bidirectional) in a ", forward_mode_name(batch.mode),
            " batch: speculative batches are causal; encoder-only layers run extend, mixed or "
            "decode batches"));
  }

  // Activations.
  if (!q.defined()) return Status::invalid_argument("q is missing (null data)");
  // The activations' dtype (out, k, v): q's, or with an e4m3 q (allow_fp8_q) out's (the
  // reference, which has no out: k's, else bf16).
  const bool fp8_q = allow_fp8_q && q.dtype == DType::kFP8E4M3;
  const DType act = !fp8_q           ? q.dtype
                    : out != nullptr ? out->dtype
                    : k.defined()    ? k.dtype
                                     : DType::kBF16;
  if (!dtype_is_activation(q.dtype) && !fp8_q) {
    return Status::invalid_argument(cat("q: dtype ", dtype_name(q.dtype),
                                        " is not supported (expected f32, f16 or bf16",
                                        allow_fp8_q ? ", or fp8_e4m3 with layer.q_scale)" : ")"));
  }
  if (fp8_q && !dtype_is_activation(act)) {
    return Status::invalid_argument(
        cat("q: dtype fp8_e4m3 needs out / k / v in f32, f16 or bf16, "
            "not ",
            dtype_name(act)));
  }
  ATTNKIT_RETURN_IF_ERROR(check_exact(q, "q", {t, hq, dqk}, "[tokens, q_heads, qk_head_dim]"));
  ATTNKIT_RETURN_IF_ERROR(check_on(q, "q", device));
  if (out != nullptr) {
    if (!out->defined()) return Status::invalid_argument("out is missing (null data)");
    if (out->dtype != act) {
      return Status::invalid_argument(cat("out: dtype ", dtype_name(out->dtype),
                                          " must equal q's dtype ", dtype_name(q.dtype)));
    }
    ATTNKIT_RETURN_IF_ERROR(check_exact(*out, "out", {t, hq, dv}, "[tokens, q_heads, v_head_dim]"));
    ATTNKIT_RETURN_IF_ERROR(check_on(*out, "out", device));
  }

  const bool k_given = k.defined();
  const bool v_given = v.defined();
  if (k_given) {
    if (k.dtype != act) {
      return Status::invalid_argument(cat("k: dtype ", dtype_name(k.dtype), " must equal ",
                                          fp8_q ? "out's dtype " : "q's dtype ", dtype_name(act)));
    }
    ATTNKIT_RETURN_IF_ERROR(check_exact(k, "k", {t, hkv, dqk}, "[tokens, kv_heads, qk_head_dim]"));
    ATTNKIT_RETURN_IF_ERROR(check_on(k, "k", device));
  }
  if (v_given) {
    if (v.dtype != act) {
      return Status::invalid_argument(cat("v: dtype ", dtype_name(v.dtype), " must equal ",
                                          fp8_q ? "out's dtype " : "q's dtype ", dtype_name(act)));
    }
    ATTNKIT_RETURN_IF_ERROR(check_exact(v, "v", {t, hkv, dv}, "[tokens, kv_heads, v_head_dim]"));
    ATTNKIT_RETURN_IF_ERROR(check_on(v, "v", device));
  }
  if (lse.defined()) {
    if (lse.dtype != DType::kF32) {
      return Status::invalid_argument(cat("lse: dtype ", dtype_name(lse.dtype), " must be f32"));
    }
    ATTNKIT_RETURN_IF_ERROR(check_exact(lse, "lse", {t, hq}, "[tokens, q_heads]"));
    ATTNKIT_RETURN_IF_ERROR(check_on(lse, "lse", device));
  }
  if (layer.sinks.defined()) {
    if (layer.sinks.dtype != DType::kF32) {
      return Status::invalid_argument(
          cat("layer.sinks: dtype ", dtype_name(layer.sinks.dtype), " must be f32"));
    }
    ATTNKIT_RETURN_IF_ERROR(check_exact(layer.sinks, "layer.sinks", {hq}, "[q_heads]"));
    ATTNKIT_RETURN_IF_ERROR(check_on(layer.sinks, "layer.sinks", device));
    ATTNKIT_RETURN_IF_ERROR(check_sink_values(layer.sinks));
  }

  ATTNKIT_RETURN_IF_ERROR(check_windowed_lengths(layer, batch));

  // What save_kv needs.
  if (save_kv) {
    if (layer.is_cross_attention) {
      return Status::invalid_argument(
          "save_kv is true for a cross-attention layer: its keys are the encoder tokens already "
          "in the pool (write them with kv_pool->set_kv during the encoder pass)");
    }
    if (mla_prefill) {
      return Status::invalid_argument(
          cat("save_kv is true for an MLA non-absorbed layer (qk_head_dim ", dqk,
              " != kv_lora_rank + qk_rope_head_dim ", layer.kv_lora_rank + layer.qk_rope_head_dim,
              "): write the latent row with kv_pool->set_kv instead"));
    }
    if (!k_given || (!v_given && !mla_absorbed)) {
      return Status::invalid_argument(cat("save_kv is true but ", !k_given ? "k" : "v",
                                          " is missing: both k and v of the new tokens are "
                                          "needed to write the cache"));
    }
  }
  if (layer.mla_prefix != nullptr &&
      ((batch.mode != ForwardMode::kExtend && batch.mode != ForwardMode::kMixed &&
        batch.mode != ForwardMode::kDraftExtend) ||
       batch.extend_prefix_lens_host.empty() || !batch.encoder_lens_host.empty())) {
    return Status::invalid_argument(
        cat("layer.mla_prefix (MLA chunked prefix cache) needs an extend, mixed or draft-extend "
            "batch with extend_prefix_lens_host and no encoder_lens (mode ",
            forward_mode_name(batch.mode), ")"));
  }
  if (mla_prefill && (!k_given || !v_given)) {
    return Status::invalid_argument(
        cat("MLA non-absorbed layer (qk_head_dim ", dqk, ", v_head_dim ", dv,
            "): k and v of the new tokens are required (the latent pool is not read)"));
  }
  if (layer.is_cross_attention && batch.encoder_lens_host.empty()) {
    return Status::invalid_argument(
        "layer.is_cross_attention is set but batch.encoder_lens_host is empty");
  }

  // The pool must match the layer.
  const KVPool* pool = batch.kv_pool;
  if (pool == nullptr) return Status::invalid_argument("batch.kv_pool is null");
  if (pool->device() != device) {
    return Status::invalid_argument(cat("batch.kv_pool is on ", pool->device().to_string(),
                                        " but the backend runs on ", device.to_string()));
  }
  const KVPoolConfig& cfg = pool->config();
  if (t > cfg.size) {
    return Status::invalid_argument(
        cat("batch.num_tokens ", t, " exceeds the KV pool's usable slots ", cfg.size));
  }
  if (layer.layer_id < 0 || layer.layer_id >= cfg.num_layers) {
    return Status::invalid_argument(cat("layer.layer_id ", layer.layer_id,
                                        " is outside the KV pool's layers [0, ", cfg.num_layers,
                                        ")"));
  }
  if (pool->is_mla() != layer.is_mla) {
    return Status::invalid_argument(cat("layer.is_mla ", layer.is_mla ? "true" : "false",
                                        " does not match the KV pool (",
                                        pool->is_mla() ? "MLA" : "MHA", ")"));
  }
  if (layer.is_mla) {
    if (cfg.kv_lora_rank != layer.kv_lora_rank || cfg.qk_rope_head_dim != layer.qk_rope_head_dim) {
      return Status::invalid_argument(cat(
          "layer kv_lora_rank ", layer.kv_lora_rank, " / qk_rope_head_dim ", layer.qk_rope_head_dim,
          " do not match the MLA pool's ", cfg.kv_lora_rank, " / ", cfg.qk_rope_head_dim));
    }
  } else {
    if (cfg.num_kv_heads != hkv || cfg.head_dim != dqk || cfg.v_head_dim != dv) {
      return Status::invalid_argument(
          cat("layer (num_kv_heads ", hkv, ", qk_head_dim ", dqk, ", v_head_dim ", dv,
              ") does not match the KV pool (num_kv_heads ", cfg.num_kv_heads, ", head_dim ",
              cfg.head_dim, ", v_head_dim ", cfg.v_head_dim, ")"));
    }
  }
  // The kernels take the softmax scale in log2 units, some with a further 2^8 (the CPU fp8
  // widening, the f16 staging of the MLA kernels): that product must be finite and the scale
  // normal, on every pool (a scale of 3e38 turned every score into inf / NaN). Quantized pools fold
  // k_scale in (each factor valid, the product had overflowed to inf or flushed to 0: NaN or
  // uniform rows); a non-absorbed MLA layer reads no pool rows, so none is folded there. An e4m3 q
  // folds q_scale in as well (the fa3 engine's order: scaling x log2(e) x k_scale x q_scale).
  const bool fold_k = dtype_is_quantized(cfg.dtype) && !mla_prefill;
  const float folded =
      layer.scaling * kLog2e * (fold_k ? layer.k_scale : 1.f) * (fp8_q ? layer.q_scale : 1.f);
  if (!std::isfinite(folded * kKernelScaleRoom) || !(folded >= std::numeric_limits<float>::min())) {
    return Status::invalid_argument(
        cat("layer.scaling ", layer.scaling,
            fold_k ? cat(" x layer.k_scale ", layer.k_scale) : std::string(),
            fp8_q ? cat(" x layer.q_scale ", layer.q_scale) : std::string(), " (the softmax scale",
            fp8_q ? " of an fp8_e4m3 q" : "",
            fold_k ? cat(" over the ", dtype_name(cfg.dtype), " pool") : std::string(),
            ", x log2(e)) must be a finite normal float, with room for the kernels' 2^8 (at most ",
            std::numeric_limits<float>::max() / kKernelScaleRoom, ")"));
  }
  if (fold_k && !std::isfinite(layer.v_scale * kKernelScaleRoom)) {
    return Status::invalid_argument(cat("layer.v_scale ", layer.v_scale, " over the ",
                                        dtype_name(cfg.dtype),
                                        " pool must leave room for the kernels' 2^8 (at most ",
                                        std::numeric_limits<float>::max() / kKernelScaleRoom, ")"));
  }
  // A soft-cap: the kernels take cap x log2(e) (x 2 in some tanh forms) and the scale / cap; a
  // cap near FLT_MAX made the first inf (every row NaN), one past ~1e37 the second subnormal (the
  // CPU kernels flush it: uniform rows). Such a cap changes no logit (0 turns the cap off). A
  // subnormal cap made scale / cap inf, and a zero logit times it NaN (the wgmma kernels' tanh
  // argument, scale x (ln 2 / cap) in the FP8 kernel, (scale x ln 2) / cap in the bf16 one) where
  // the reference's tanh(0 / cap) is 0.
  const float cap = layer.logit_cap;
  if (cap > 0.f && (!std::isfinite(2.f * kLog2e * cap) || !std::isnormal(folded / (2.f * cap)) ||
                    !std::isfinite(kLn2 / cap) || !std::isfinite(folded * kLn2 / cap))) {
    return Status::invalid_argument(
        cat("layer.logit_cap ", layer.logit_cap, " with the softmax scale ", layer.scaling,
            ": cap x 2 log2(e) must be finite and scale / cap a normal float (a cap this large "
            "changes no logit, one this small saturates every logit; 0 turns it off)"));
  }
  const std::pair<const TensorView*, const char*> batch_tensors[] = {
      {&batch.req_pool_indices, "batch.req_pool_indices"},
      {&batch.seq_lens, "batch.seq_lens"},
      {&batch.out_cache_loc, "batch.out_cache_loc"},
      {&batch.positions, "batch.positions"},
      {&batch.extend_prefix_lens, "batch.extend_prefix_lens"},
      {&batch.extend_seq_lens, "batch.extend_seq_lens"},
      {&batch.extend_start_loc, "batch.extend_start_loc"},
      {&batch.encoder_lens, "batch.encoder_lens"},
      {&batch.spec.custom_mask, "batch.spec.custom_mask"},
      {&batch.spec.mask_indptr, "batch.spec.mask_indptr"},
  };
  // out and lse must not be views of the cache (the forward would overwrite cached k / v, any
  // layer's) or of the request table (its slots; a CPU kernel then read the pool at garbage
  // rows), nor of each other, the batch's index arrays (read as indices by later layers) or the
  // forward's q / k / v and the layer's sinks (the GPU kernels read q tiles while other CTAs store
  // results, set_kv reads k / v, and a CPU kernel read sinks it had overwritten), and no two of
  // their elements may share an address (a stride-0 out kept only the last head's result). The
  // bytes are those of the view's lowest to highest element: a negative stride walks below data.
  const TensorView table =
      batch.req_to_token_pool != nullptr ? batch.req_to_token_pool->table() : TensorView();
  // The KV pool buffer under those bytes of t ("" if none); false when t's strides span more
  // bytes than an address holds.
  const auto pool_buffer_under = [pool](const TensorView& t, std::string* hit) {
    int64_t first = 0;
    int64_t end = 0;
    if (!t.byte_extent(&first, &end)) return false;
    *hit = pool->storage_overlapping(static_cast<const char*>(t.data) + first, end - first);
    return true;
  };
  for (const auto& [t, name] : {std::pair{out, "out"}, std::pair{&lse, "lse"}}) {
    if (t == nullptr || !t->defined()) continue;
    std::string hit;
    if (!pool_buffer_under(*t, &hit) && t->numel() > 0) {
      return Status::invalid_argument(
          cat(name, " ", t->describe(), ": its strides span more bytes than an address holds"));
    }
    if (!hit.empty()) {
      return Status::invalid_argument(cat(name, " ", t->describe(), " overlaps the KV pool's ", hit,
                                          " buffer: the forward would overwrite cached k / v"));
    }
    if (t->overlaps(table)) {
      return Status::invalid_argument(
          cat(name, " ", t->describe(),
              " overlaps the request table (req_to_token_pool.table()): the forward would "
              "overwrite its slots"));
    }
    if (t == &lse && out != nullptr && lse.overlaps(*out)) {
      return Status::invalid_argument(cat("lse ", lse.describe(), " overlaps out ", out->describe(),
                                          ": each would overwrite the other's results"));
    }
    for (const auto& [tensor, tensor_name] : batch_tensors) {
      if (t->overlaps(*tensor)) {
        return Status::invalid_argument(cat(name, " ", t->describe(), " overlaps ", tensor_name,
                                            ": the forward would overwrite the batch's indices"));
      }
    }
    for (const auto& [input, input_name] :
         {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}, {&layer.sinks, "layer.sinks"}}) {
      if (t->overlaps(*input)) {
        return Status::invalid_argument(cat(
            name, " ", t->describe(), " overlaps ", input_name, " ", input->describe(),
            ": the forward reads ", input_name,
            " while it writes its results (in place is not supported); pass a separate buffer"));
      }
    }
    if (t->may_self_overlap()) {
      return Status::invalid_argument(
          cat(name, " ", t->describe(),
              " has elements that share memory (a stride of 0, or strides that interleave): each "
              "result would overwrite another; pass a view whose elements are distinct"));
    }
  }
  // q read from the KV pool's storage: save_kv writes the new k / v first, so a q over those rows
  // would be replaced before the attention reads it (a silent wrong answer).
  if (std::string hit; save_kv && q.defined() && pool_buffer_under(q, &hit) && !hit.empty()) {
    return Status::invalid_argument(
        cat("q ", q.describe(), " overlaps the KV pool's ", hit,
            " buffer: save_kv writes the new k / v there before the attention reads q; pass a "
            "separate buffer"));
  }
  if (batch.req_to_token_pool != nullptr && batch.req_to_token_pool->device() != device) {
    return Status::invalid_argument(cat("batch.req_to_token_pool is on ",
                                        batch.req_to_token_pool->device().to_string(),
                                        " but the backend runs on ", device.to_string()));
  }
  for (const auto& [tensor, name] : batch_tensors) {
    if (tensor->defined()) ATTNKIT_RETURN_IF_ERROR(check_on(*tensor, name, device));
  }
  return Status::ok();
}

}  // namespace

Status validate_forward_inputs(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const AttentionLayer& layer,
                               const ForwardBatch& batch, bool save_kv, const TensorView& lse,
                               Device device, bool allow_fp8_q) {
  return validate_inputs(q, k, v, &out, layer, batch, save_kv, lse, device, allow_fp8_q);
}

Status validate_reference_inputs(const TensorView& q, const TensorView& k, const TensorView& v,
                                 const AttentionLayer& layer, const ForwardBatch& batch,
                                 Device device) {
  return validate_inputs(q, k, v, nullptr, layer, batch, /*save_kv=*/false, TensorView(), device,
                         /*allow_fp8_q=*/true);
}

}  // namespace attnkit
