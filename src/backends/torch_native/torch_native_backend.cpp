// torch_native: the fp64 CPU reference backend. See torch_native_backend.h for the semantics.
#include "backends/torch_native/torch_native_backend.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "attnkit/registry.h"

namespace attnkit {
namespace reference {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

double load3(const TensorView& t, int64_t i, int64_t h, int64_t d) {
  return load_as_float(t.data, t.dtype, i * t.stride(0) + h * t.stride(1) + d * t.stride(2));
}

// The queries and keys of one request.
struct RequestPlan {
  int64_t q_begin = 0;  // first query token in [0, T)
  int64_t num_q = 0;
  int64_t prefix = 0;   // decoder tokens cached before the new ones (query i: position prefix + i)
  int64_t kv_len = 0;   // decoder keys in the pool (self-attention)
  int64_t encoder = 0;  // encoder tokens at the start of the row
  int32_t row = 0;      // req_to_token row
  int64_t mask_offset = -1;  // TARGET_VERIFY tree mask block, -1 = none
  int64_t mask_cols = 0;
};

std::vector<RequestPlan> plan_requests(const ForwardBatch& batch) {
  std::vector<RequestPlan> plans(static_cast<size_t>(batch.batch_size));
  const bool verify = batch.mode == ForwardMode::kTargetVerify;
  const bool has_mask = batch.has_spec && batch.spec.custom_mask.defined();
  int64_t start = 0;
  for (int r = 0; r < batch.batch_size; ++r) {
    RequestPlan& p = plans[static_cast<size_t>(r)];
    const int64_t seq_len = batch.seq_lens_host[static_cast<size_t>(r)];
    p.row = batch.req_pool_indices_host[static_cast<size_t>(r)];
    p.encoder =
        batch.encoder_lens_host.empty() ? 0 : batch.encoder_lens_host[static_cast<size_t>(r)];
    if (batch.mode == ForwardMode::kDecode) {
      p.num_q = 1;
      p.prefix = seq_len - 1;
      p.kv_len = seq_len;
    } else if (verify) {
      p.num_q = batch.spec.draft_token_num;
      p.prefix = seq_len;
      p.kv_len = seq_len + p.num_q;
      if (has_mask) {
        p.mask_offset = batch.spec.mask_indptr_host[static_cast<size_t>(r)];
        p.mask_cols = p.kv_len;
      }
    } else {
      p.num_q = batch.extend_seq_lens_host[static_cast<size_t>(r)];
      p.prefix = batch.extend_prefix_lens_host[static_cast<size_t>(r)];
      p.kv_len = seq_len;
    }
    p.q_begin = start;
    start += p.num_q;
  }
  return plans;
}

// Dequantised keys/values of a list of pool slots for one layer: k [n, Hkv, Dqk], v [n, Hkv, Dv].
struct GatheredKV {
  int64_t n = 0;
  std::vector<double> k;
  std::vector<double> v;
};

GatheredKV gather_from_pool(const KVPool& pool, const AttentionLayer& layer,
                            const std::vector<int64_t>& slots) {
  GatheredKV g;
  g.n = static_cast<int64_t>(slots.size());
  const int64_t hkv = layer.num_kv_heads;
  const int64_t dqk = layer.qk_head_dim;
  const int64_t dv = layer.v_head_dim;
  g.k.resize(static_cast<size_t>(g.n * hkv * dqk));
  g.v.resize(static_cast<size_t>(g.n * hkv * dv));
  TensorView kbuf, kscales, vbuf, vscales;
  float v_scale = layer.v_scale;
  if (pool.is_mla()) {
    const auto& mla = static_cast<const MLAKVPool&>(pool);
    kbuf = mla.kv_buffer(layer.layer_id);
    kscales = mla.scale_buffer(layer.layer_id);
    vbuf = kbuf;  // V = the first kv_lora_rank columns of the same stored row
    vscales = kscales;
    v_scale = layer.k_scale;
  } else {
    const auto& mha = static_cast<const MHAKVPool&>(pool);
    kbuf = mha.k_buffer(layer.layer_id);
    kscales = mha.k_scale_buffer(layer.layer_id);
    vbuf = mha.v_buffer(layer.layer_id);
    vscales = mha.v_scale_buffer(layer.layer_id);
  }
  for (int64_t j = 0; j < g.n; ++j) {
    const int64_t slot = slots[static_cast<size_t>(j)];
    for (int64_t h = 0; h < hkv; ++h) {
      double* kd = &g.k[static_cast<size_t>((j * hkv + h) * dqk)];
      for (int64_t d = 0; d < dqk; ++d) {
        kd[d] = load_kv_value_host(kbuf, kscales, slot, h, d, layer.k_scale);
      }
      double* vd = &g.v[static_cast<size_t>((j * hkv + h) * dv)];
      for (int64_t d = 0; d < dv; ++d) {
        vd[d] = load_kv_value_host(vbuf, vscales, slot, h, d, v_scale);
      }
    }
  }
  return g;
}

// The new tokens' k/v rows [begin, begin + n) of host tensors as fp64.
GatheredKV gather_from_tensors(const TensorView& k, const TensorView& v, int64_t begin, int64_t n) {
  GatheredKV g;
  g.n = n;
  const int64_t hkv = k.size(1), dqk = k.size(2), dv = v.size(2);
  g.k.resize(static_cast<size_t>(n * hkv * dqk));
  g.v.resize(static_cast<size_t>(n * hkv * dv));
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t h = 0; h < hkv; ++h) {
      for (int64_t d = 0; d < dqk; ++d) {
        g.k[static_cast<size_t>((j * hkv + h) * dqk + d)] = load3(k, begin + j, h, d);
      }
      for (int64_t d = 0; d < dv; ++d) {
        g.v[static_cast<size_t>((j * hkv + h) * dv + d)] = load3(v, begin + j, h, d);
      }
    }
  }
  return g;
}

struct AttendParams {
  int64_t num_q_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t dqk = 0;
  int64_t dv = 0;
  double scaling = 0.0;
  double logit_cap = 0.0;
  const float* sinks = nullptr;  // [Hq] or nullptr
};

// Attention of queries [q_begin, q_begin + num_q) of q over `kv`; visible(i, j) says whether key j
// is visible from the request's query i. Writes out rows [q_begin, ...) of out [T, Hq, Dv] and
// lse [T, Hq].
template <typename Visible>
void attend(const TensorView& q, int64_t q_begin, int64_t num_q, const GatheredKV& kv,
            const AttendParams& p, Visible visible, ReferenceOutput* result) {
  const int64_t group = p.num_q_heads / p.num_kv_heads;
  const int64_t work = num_q * p.num_q_heads;
#if defined(ATTNKIT_WITH_OPENMP)
#pragma omp parallel for schedule(dynamic, 4)
#endif
  for (int64_t w = 0; w < work; ++w) {
    const int64_t i = w / p.num_q_heads;
    const int64_t h = w % p.num_q_heads;
    const int64_t kvh = h / group;
    const int64_t token = q_begin + i;
    std::vector<double> qrow(static_cast<size_t>(p.dqk));
    for (int64_t d = 0; d < p.dqk; ++d) qrow[static_cast<size_t>(d)] = load3(q, token, h, d);
    std::vector<double> logits(static_cast<size_t>(kv.n), kNegInf);
    double max_logit = p.sinks != nullptr ? static_cast<double>(p.sinks[h]) : kNegInf;
    for (int64_t j = 0; j < kv.n; ++j) {
      if (!visible(i, j)) continue;
      const double* kd = &kv.k[static_cast<size_t>((j * p.num_kv_heads + kvh) * p.dqk)];
      double dot = 0.0;
      for (int64_t d = 0; d < p.dqk; ++d) dot += qrow[static_cast<size_t>(d)] * kd[d];
      double s = dot * p.scaling;
      if (p.logit_cap > 0.0) s = p.logit_cap * std::tanh(s / p.logit_cap);
      logits[static_cast<size_t>(j)] = s;
      max_logit = std::max(max_logit, s);
    }
    double* out = &result->out[static_cast<size_t>((token * p.num_q_heads + h) * p.dv)];
    std::fill(out, out + p.dv, 0.0);
    double& lse = result->lse[static_cast<size_t>(token * p.num_q_heads + h)];
    if (max_logit == kNegInf) {  // no visible key and no sink
      lse = kNegInf;
      continue;
    }
    double denom = p.sinks != nullptr ? std::exp(static_cast<double>(p.sinks[h]) - max_logit) : 0.0;
    for (int64_t j = 0; j < kv.n; ++j) {
      const double s = logits[static_cast<size_t>(j)];
      if (s == kNegInf) continue;
      const double e = std::exp(s - max_logit);
      denom += e;
      const double* vd = &kv.v[static_cast<size_t>((j * p.num_kv_heads + kvh) * p.dv)];
      for (int64_t d = 0; d < p.dv; ++d) out[d] += e * vd[d];
    }
    for (int64_t d = 0; d < p.dv; ++d) out[d] /= denom;
    lse = max_logit + std::log(denom);
  }
}

Status check_host(const TensorView& t, const char* name) {
  if (t.defined() && !t.device.is_cpu()) {
    return Status::invalid_argument(
        cat(name, " is on ", t.device.to_string(), ": torch_native needs host tensors"));
  }
  return Status::ok();
}

// Every req_to_token entry the plans read must be a usable slot of the pool.
Status check_rows(const ForwardBatch& batch, const std::vector<RequestPlan>& plans, bool read_self,
                  bool read_encoder) {
  const int64_t lo = batch.kv_pool->page_size();
  const int64_t hi = batch.kv_pool->rows();
  for (size_t r = 0; r < plans.size(); ++r) {
    const RequestPlan& p = plans[r];
    const int32_t* row = batch.req_to_token_pool->host_row(p.row);
    if (row == nullptr) {
      return Status::invalid_argument(
          cat("batch.req_pool_indices_host[", r, "] = ", p.row, " is not a row of req_to_token"));
    }
    const int64_t begin = read_encoder ? 0 : p.encoder;
    const int64_t end = read_self ? p.encoder + p.kv_len : p.encoder;
    for (int64_t i = begin; i < end; ++i) {
      if (row[i] < lo || row[i] >= hi) {
        return Status::invalid_argument(cat("req_to_token[", p.row, ", ", i, "] = ", row[i],
                                            " (request ", r, ") is outside the KV pool slots [", lo,
                                            ", ", hi, ")"));
      }
    }
  }
  return Status::ok();
}

}  // namespace

Result<ReferenceOutput> compute_attention_fp64(const TensorView& q, const TensorView& k,
                                               const TensorView& v, const AttentionLayer& layer,
                                               const ForwardBatch& batch) {
  // Validation inspects only the metadata of `out`, which is never written here: describe the
  // fp64 result's shape with q's pointer.
  const TensorView out_shape(q.data, q.dtype, q.device,
                             {batch.num_tokens, layer.num_q_heads, layer.v_head_dim});
  ATTNKIT_RETURN_IF_ERROR(validate_forward_inputs(q, k, v, out_shape, layer, batch,
                                                  /*save_kv=*/false, TensorView(), Device::cpu()));
  ATTNKIT_RETURN_IF_ERROR(check_host(q, "q"));
  ATTNKIT_RETURN_IF_ERROR(check_host(k, "k"));
  ATTNKIT_RETURN_IF_ERROR(check_host(v, "v"));
  ATTNKIT_RETURN_IF_ERROR(check_host(layer.sinks, "layer.sinks"));
  ReferenceOutput result;
  if (batch.mode == ForwardMode::kIdle) return result;
  if (batch.kv_pool == nullptr || batch.req_to_token_pool == nullptr) {
    return Status::invalid_argument("batch.kv_pool and batch.req_to_token_pool must be set");
  }
  if (!batch.kv_pool->device().is_cpu() || !batch.req_to_token_pool->device().is_cpu()) {
    return Status::invalid_argument("torch_native needs host pools (batch.kv_pool on " +
                                    batch.kv_pool->device().to_string() + ")");
  }
  const int64_t t = batch.num_tokens;
  AttendParams p;
  p.num_q_heads = layer.num_q_heads;
  p.num_kv_heads = layer.num_kv_heads;
  p.dqk = layer.qk_head_dim;
  p.dv = layer.v_head_dim;
  p.scaling = layer.scaling;
  p.logit_cap = layer.logit_cap;
  p.sinks = layer.sinks.defined() ? layer.sinks.data_as<const float>() : nullptr;
  result.out.assign(static_cast<size_t>(t * p.num_q_heads * p.dv), 0.0);
  result.lse.assign(static_cast<size_t>(t * p.num_q_heads), kNegInf);

  const std::vector<RequestPlan> plans = plan_requests(batch);
  const bool mla_prefill =
      layer.is_mla && layer.qk_head_dim != layer.kv_lora_rank + layer.qk_rope_head_dim;
  const int64_t window = layer.sliding_window;
  const bool encoder_only = layer.type == AttentionType::kEncoderOnly;

  if (mla_prefill) {
    // New tokens over new tokens, causal within the request; no pool read.
    for (const RequestPlan& plan : plans) {
      const GatheredKV kv = gather_from_tensors(k, v, plan.q_begin, plan.num_q);
      attend(
          q, plan.q_begin, plan.num_q, kv, p,
          [&](int64_t i, int64_t j) { return j <= i && (window < 0 || i - j <= window); }, &result);
    }
    return result;
  }

  ATTNKIT_RETURN_IF_ERROR(
      check_rows(batch, plans, !layer.is_cross_attention, layer.is_cross_attention));
  const uint8_t* mask =
      batch.has_spec && batch.spec.custom_mask.defined() && batch.mode == ForwardMode::kTargetVerify
          ? batch.spec.custom_mask.data_as<const uint8_t>()
          : nullptr;
  if (mask != nullptr) ATTNKIT_RETURN_IF_ERROR(check_host(batch.spec.custom_mask, "custom_mask"));

  for (const RequestPlan& plan : plans) {
    const int32_t* row = batch.req_to_token_pool->host_row(plan.row);
    std::vector<int64_t> slots;
    if (layer.is_cross_attention) {
      slots.assign(row, row + plan.encoder);
      const GatheredKV kv = gather_from_pool(*batch.kv_pool, layer, slots);
      attend(
          q, plan.q_begin, plan.num_q, kv, p, [](int64_t, int64_t) { return true; }, &result);
      continue;
    }
    slots.assign(row + plan.encoder, row + plan.encoder + plan.kv_len);
    const GatheredKV kv = gather_from_pool(*batch.kv_pool, layer, slots);
    const int64_t prefix = plan.prefix;
    if (plan.mask_offset >= 0) {
      const uint8_t* block = mask + plan.mask_offset;
      const int64_t cols = plan.mask_cols;
      attend(
          q, plan.q_begin, plan.num_q, kv, p,
          [&](int64_t i, int64_t j) {
            return block[i * cols + j] != 0 && (window < 0 || prefix + i - j <= window);
          },
          &result);
    } else if (encoder_only) {
      attend(
          q, plan.q_begin, plan.num_q, kv, p,
          [&](int64_t i, int64_t j) {
            const int64_t dist = prefix + i - j;
            return window < 0 || (dist <= window && -dist <= window);
          },
          &result);
    } else {
      attend(
          q, plan.q_begin, plan.num_q, kv, p,
          [&](int64_t i, int64_t j) {
            const int64_t dist = prefix + i - j;
            return dist >= 0 && (window < 0 || dist <= window);
          },
          &result);
    }
  }
  return result;
}

Status mha_varlen_fp64(const TensorView& q, const TensorView& k, const TensorView& v,
                       std::span<const int32_t> cu_seqlens_q, std::span<const int32_t> cu_seqlens_k,
                       bool causal, double scaling, double logit_cap, std::vector<double>* out,
                       std::vector<double>* lse) {
  for (const auto& [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) {
    if (!t->defined() || t->ndim != 3 || !t->device.is_cpu()) {
      return Status::invalid_argument(
          cat(name, ": expected a host tensor [tokens, heads, dim], got ", t->describe()));
    }
  }
  if (k.size(0) != v.size(0) || k.size(1) != v.size(1) || q.size(2) != k.size(2)) {
    return Status::invalid_argument(cat("k ", k.describe(), " and v ", v.describe(),
                                        " must share tokens and heads, and k's head dim must "
                                        "equal q's ",
                                        q.describe()));
  }
  if (k.size(1) <= 0 || q.size(1) % k.size(1) != 0) {
    return Status::invalid_argument(
        cat("q heads ", q.size(1), " are not divisible by k heads ", k.size(1)));
  }
  if (cu_seqlens_q.size() != cu_seqlens_k.size() || cu_seqlens_q.empty()) {
    return Status::invalid_argument(cat("cu_seqlens_q (", cu_seqlens_q.size(),
                                        " entries) and cu_seqlens_k (", cu_seqlens_k.size(),
                                        ") must both have bs + 1 >= 1 entries"));
  }
  const size_t bs = cu_seqlens_q.size() - 1;
  if (cu_seqlens_q[bs] != q.size(0) || cu_seqlens_k[bs] != k.size(0) || cu_seqlens_q[0] != 0 ||
      cu_seqlens_k[0] != 0) {
    return Status::invalid_argument(
        cat("cu_seqlens must start at 0 and end at the token counts (q ", q.size(0), ", k ",
            k.size(0), "), got q end ", cu_seqlens_q[bs], ", k end ", cu_seqlens_k[bs]));
  }
  if (!(scaling > 0.0)) {
    return Status::invalid_argument(cat("scaling ", scaling, " must be > 0"));
  }
  AttendParams p;
  p.num_q_heads = q.size(1);
  p.num_kv_heads = k.size(1);
  p.dqk = q.size(2);
  p.dv = v.size(2);
  p.scaling = scaling;
  p.logit_cap = logit_cap;
  ReferenceOutput result;
  result.out.assign(static_cast<size_t>(q.size(0) * p.num_q_heads * p.dv), 0.0);
  result.lse.assign(static_cast<size_t>(q.size(0) * p.num_q_heads), kNegInf);
  for (size_t r = 0; r < bs; ++r) {
    const int64_t q0 = cu_seqlens_q[r], lq = cu_seqlens_q[r + 1] - q0;
    const int64_t k0 = cu_seqlens_k[r], lk = cu_seqlens_k[r + 1] - k0;
    if (lq < 0 || lk < 0) {
      return Status::invalid_argument(cat("cu_seqlens decrease at sequence ", r));
    }
    const GatheredKV kv = gather_from_tensors(k, v, k0, lk);
    const int64_t shift = lk - lq;
    attend(
        q, q0, lq, kv, p, [&](int64_t i, int64_t j) { return !causal || j <= i + shift; }, &result);
  }
  *out = std::move(result.out);
  *lse = std::move(result.lse);
  return Status::ok();
}

}  // namespace reference

namespace {

// Used only when the registry has no "torch_native" entry (e.g. a partial build).
const BackendDescriptor& fallback_descriptor() {
  static const BackendDescriptor* descriptor = [] {
    auto* d = new BackendDescriptor();
    d->name = "torch_native";
    d->implementation = "fp64 CPU reference (correctness oracle)";
    d->platforms = {Platform::kCPU};
    d->built = true;
    return d;
  }();
  return *descriptor;
}

class TorchNativeBackend final : public AttentionBackend {
 public:
  explicit TorchNativeBackend(const BackendContext& ctx) : ctx_(ctx) {}

  const BackendDescriptor& descriptor() const override {
    const BackendDescriptor* found = builtin_registry().find("torch_native");
    return found != nullptr ? *found : fallback_descriptor();
  }

  Status init_forward_metadata(const ForwardBatch& batch) override { return batch.validate(); }

  Status forward_extend(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const AttentionLayer& layer,
                        const ForwardBatch& batch, bool save_kv, const TensorView& lse) override {
    if (batch.mode == ForwardMode::kDecode) {
      return Status::invalid_argument("torch_native: forward_extend called with a decode batch");
    }
    return run(q, k, v, out, layer, batch, save_kv, lse);
  }

  Status forward_decode(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const AttentionLayer& layer,
                        const ForwardBatch& batch, bool save_kv, const TensorView& lse) override {
    if (batch.mode != ForwardMode::kDecode) {
      return Status::invalid_argument(std::string("torch_native: forward_decode called with a ") +
                                      forward_mode_name(batch.mode) + " batch");
    }
    return run(q, k, v, out, layer, batch, save_kv, lse);
  }

 private:
  Status run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
             const AttentionLayer& layer, const ForwardBatch& batch, bool save_kv,
             const TensorView& lse) {
    ATTNKIT_RETURN_IF_ERROR(
        validate_forward_inputs(q, k, v, out, layer, batch, save_kv, lse, ctx_.device));
    if (batch.mode == ForwardMode::kIdle) return Status::ok();
    if (save_kv) {
      ATTNKIT_RETURN_IF_ERROR(batch.kv_pool->set_kv(layer.layer_id, batch.out_cache_loc, k, v,
                                                    layer.k_scale, layer.v_scale, ctx_.stream));
    }
    ATTNKIT_ASSIGN_OR_RETURN(reference::ReferenceOutput ref,
                             reference::compute_attention_fp64(q, k, v, layer, batch));
    const int64_t t = batch.num_tokens;
    const int64_t hq = layer.num_q_heads;
    const int64_t dv = layer.v_head_dim;
    for (int64_t i = 0; i < t; ++i) {
      for (int64_t h = 0; h < hq; ++h) {
        const double* src = &ref.out[static_cast<size_t>((i * hq + h) * dv)];
        const int64_t base = i * out.stride(0) + h * out.stride(1);
        for (int64_t d = 0; d < dv; ++d) {
          store_from_float(out.data, out.dtype, base + d * out.stride(2),
                           static_cast<float>(src[d]));
        }
        if (lse.defined()) {
          lse.data_as<float>()[i * lse.stride(0) + h * lse.stride(1)] =
              static_cast<float>(ref.lse[static_cast<size_t>(i * hq + h)]);
        }
      }
    }
    return Status::ok();
  }

  BackendContext ctx_;
};

}  // namespace

Result<std::unique_ptr<AttentionBackend>> create_torch_native_backend(const BackendContext& ctx) {
  if (!ctx.device.is_cpu()) {
    return Status::unsupported("torch_native runs on the CPU only; device " +
                               ctx.device.to_string() + " was requested");
  }
  return std::unique_ptr<AttentionBackend>(new TorchNativeBackend(ctx));
}

}  // namespace attnkit
