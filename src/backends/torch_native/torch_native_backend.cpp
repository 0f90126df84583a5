// torch_native: the fp64 CPU reference backend. See torch_native_backend.h for the semantics.
#include "backends/torch_native/torch_native_backend.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "attnkit/registry.h"
#include "backend/validate.h"
#include "core/device_scope.h"
#include "core/str_cat.h"
#ifdef ATTNKIT_WITH_CUDA
#include "cuda/common/cuda_check.cuh"
#endif

namespace attnkit {
namespace reference {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

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

// Whether a query sees a key dist = q_pos - k_pos positions before it: causal (dist >= 0) unless
// bidirectional; a sliding window bounds dist on the sides the mask leaves open (|dist| <= window
// when bidirectional).
bool visible(int64_t dist, bool bidirectional, int64_t window) {
  if (!bidirectional && dist < 0) return false;
  return window < 0 || (dist <= window && -dist <= window);
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

// MLA chunked prefix cache: request `plan`'s cached prefix latent rows (dequantised, rounded to
// the activation dtype as the GPU gather does), decompressed by layer.mla_prefix->expand on the
// host: k [prefix, Hq, Dqk], v [prefix, Hq, Dv] as fp64.
Result<GatheredKV> expand_prefix_host(DType act, const AttentionLayer& layer,
                                      const ForwardBatch& batch, const RequestPlan& plan) {
  const int64_t n = plan.prefix;
  const int64_t width = layer.kv_lora_rank + layer.qk_rope_head_dim;
  const int64_t h = layer.num_q_heads;
  GatheredKV g;
  g.n = n;
  if (n == 0) return g;
  AttentionLayer absorbed = layer;
  absorbed.num_q_heads = 1;
  absorbed.num_kv_heads = 1;
  absorbed.qk_head_dim = static_cast<int>(width);
  absorbed.v_head_dim = layer.kv_lora_rank;
  const int32_t* row = batch.req_to_token_pool->host_row(plan.row);
  const std::vector<int64_t> slots(row + plan.encoder, row + plan.encoder + n);
  const GatheredKV lat = gather_from_pool(*batch.kv_pool, absorbed, slots);
  const int64_t es = dtype_storage_bytes(act, 1);
  std::vector<unsigned char> latent(static_cast<size_t>(n * width * es));
  std::vector<unsigned char> kb(static_cast<size_t>(n * h * layer.qk_head_dim * es));
  std::vector<unsigned char> vb(static_cast<size_t>(n * h * layer.v_head_dim * es));
  for (int64_t i = 0; i < n * width; ++i) {
    store_from_float(latent.data(), act, i, static_cast<float>(lat.k[static_cast<size_t>(i)]));
  }
  const Device cpu = Device::cpu();
  const TensorView lt(latent.data(), act, cpu, {n, width});
  const TensorView kt(kb.data(), act, cpu, {n, h, layer.qk_head_dim});
  const TensorView vt(vb.data(), act, cpu, {n, h, layer.v_head_dim});
  ATTNKIT_RETURN_IF_ERROR(layer.mla_prefix->expand(lt, kt, vt, nullptr));
  return gather_from_tensors(kt, vt, 0, n);
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
      // NaN-propagating max: a NaN logit (a NaN in q or k) makes the row NaN, as softmax does
      // (std::max kept -inf when every logit was NaN: the row read as "no visible key", out 0).
      if (std::isnan(s) || s > max_logit) max_logit = s;  // once NaN, it stays NaN
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

// The (read_self, read_encoder) row ranges compute_attention_fp64 reads for this layer; none for
// an MLA prefill without a prefix cache (it reads no pool row).
std::optional<std::pair<bool, bool>> rows_read(const AttentionLayer& layer) {
  const bool mla_prefill =
      layer.is_mla && layer.qk_head_dim != layer.kv_lora_rank + layer.qk_rope_head_dim;
  if (mla_prefill) {
    if (layer.mla_prefix == nullptr) return std::nullopt;
    return std::pair{true, false};
  }
  return std::pair{!layer.is_cross_attention, layer.is_cross_attention};
}

}  // namespace

Status check_pool_rows(const AttentionLayer& layer, const ForwardBatch& batch) {
  if (batch.mode == ForwardMode::kIdle) return Status::ok();
  if (batch.kv_pool == nullptr || batch.req_to_token_pool == nullptr) {
    return Status::invalid_argument("batch.kv_pool and batch.req_to_token_pool must be set");
  }
  const auto read = rows_read(layer);
  if (!read) return Status::ok();
  return check_rows(batch, plan_requests(batch), read->first, read->second);
}

Result<ReferenceOutput> compute_attention_fp64(const TensorView& q, const TensorView& k,
                                               const TensorView& v, const AttentionLayer& layer,
                                               const ForwardBatch& batch) {
  // No out view: the fp64 result goes to host vectors. (A stand-in view over q's memory had been
  // validated in its place, which the pool-aliasing check saw reach into the pool when v_head_dim
  // > qk_head_dim.)
  ATTNKIT_RETURN_IF_ERROR(validate_reference_inputs(q, k, v, layer, batch, Device::cpu()));
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
  // An e4m3 q (the fa3 FP8 prefill's input) is stored as x / q_scale.
  p.scaling = static_cast<double>(layer.scaling) *
              (q.dtype == DType::kFP8E4M3 ? static_cast<double>(layer.q_scale) : 1.0);
  p.logit_cap = layer.logit_cap;
  p.sinks = layer.sinks.defined() ? layer.sinks.data_as<const float>() : nullptr;
  result.out.assign(static_cast<size_t>(t * p.num_q_heads * p.dv), 0.0);
  result.lse.assign(static_cast<size_t>(t * p.num_q_heads), kNegInf);

  ATTNKIT_RETURN_IF_ERROR(check_pool_rows(layer, batch));
  const std::vector<RequestPlan> plans = plan_requests(batch);
  const bool mla_prefill =
      layer.is_mla && layer.qk_head_dim != layer.kv_lora_rank + layer.qk_rope_head_dim;
  const int64_t window = layer.sliding_window;
  const bool encoder_only = layer.type == AttentionType::kEncoderOnly;

  if (mla_prefill && layer.mla_prefix != nullptr) {
    // Chunked prefix cache: the whole prefix decompressed at once (the reference may), then the
    // new tokens: prefix keys all visible, new keys causal (encoder-only: all visible).
    for (const RequestPlan& plan : plans) {
      ATTNKIT_ASSIGN_OR_RETURN(GatheredKV pre, expand_prefix_host(q.dtype, layer, batch, plan));
      const GatheredKV fresh = gather_from_tensors(k, v, plan.q_begin, plan.num_q);
      pre.k.insert(pre.k.end(), fresh.k.begin(), fresh.k.end());
      pre.v.insert(pre.v.end(), fresh.v.begin(), fresh.v.end());
      pre.n += fresh.n;
      const int64_t prefix = plan.prefix;
      attend(
          q, plan.q_begin, plan.num_q, pre, p,
          [&](int64_t i, int64_t j) { return visible(prefix + i - j, encoder_only, window); },
          &result);
    }
    return result;
  }
  if (mla_prefill) {
    // New tokens over new tokens, causal within the request (encoder-only: bidirectional); no
    // pool read.
    for (const RequestPlan& plan : plans) {
      const GatheredKV kv = gather_from_tensors(k, v, plan.q_begin, plan.num_q);
      attend(
          q, plan.q_begin, plan.num_q, kv, p,
          [&](int64_t i, int64_t j) { return visible(i - j, encoder_only, window); }, &result);
    }
    return result;
  }

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
    } else {
      attend(
          q, plan.q_begin, plan.num_q, kv, p,
          [&](int64_t i, int64_t j) { return visible(prefix + i - j, encoder_only, window); },
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

constexpr int64_t kMinStagingBytes = 1;

// Used only when the registry has no "torch_native" entry (e.g. a partial build).
const BackendDescriptor& fallback_descriptor() {
  static const BackendDescriptor* descriptor = [] {
    auto* d = new BackendDescriptor();
    d->name = "torch_native";
    d->implementation = "fp64 CPU reference (correctness oracle)";
#ifdef ATTNKIT_WITH_CUDA
    d->platforms = {Platform::kCPU, Platform::kCUDA};
#else
    d->platforms = {Platform::kCPU};
#endif
    d->built = true;
    return d;
  }();
  return *descriptor;
}

// Waits for all work on the context's CUDA device (every stream: the caller's q/k/v producers,
// the cache write, and the pageable host->device copies of the results).
Status synchronize_device(Device device) {
#ifdef ATTNKIT_WITH_CUDA
  const DeviceScope scope(device);
  ATTNKIT_RETURN_IF_ERROR(scope.status());
  ATTNKIT_CUDA_TRY(cudaDeviceSynchronize());
  return Status::ok();
#else
  return Status::not_built("torch_native: synchronising " + device.to_string() +
                           " needs CUDA, but attnkit was built without CUDA");
#endif
}

// Pools with the same layout (the device may differ).
bool same_pool_layout(const KVPool& a, const KVPool& b) {
  const KVPoolConfig& x = a.config();
  const KVPoolConfig& y = b.config();
  return a.is_mla() == b.is_mla() && x.num_layers == y.num_layers && x.size == y.size &&
         x.page_size == y.page_size && x.dtype == y.dtype && x.num_kv_heads == y.num_kv_heads &&
         x.head_dim == y.head_dim && x.v_head_dim == y.v_head_dim &&
         x.kv_lora_rank == y.kv_lora_rank && x.qk_rope_head_dim == y.qk_rope_head_dim;
}

// The per-layer buffers of a pool: k, v and their fp4 block scales (MHA), or the [latent | rope]
// row and its fp4 block scales (MLA). Scale views are empty for non-fp4 pools.
std::vector<TensorView> layer_buffers(const KVPool& pool, int layer) {
  if (pool.is_mla()) {
    const auto& mla = static_cast<const MLAKVPool&>(pool);
    return {mla.kv_buffer(layer), mla.scale_buffer(layer)};
  }
  const auto& mha = static_cast<const MHAKVPool&>(pool);
  return {mha.k_buffer(layer), mha.v_buffer(layer), mha.k_scale_buffer(layer),
          mha.v_scale_buffer(layer)};
}

Result<std::unique_ptr<KVPool>> create_host_pool_like(const KVPool& pool) {
  KVPoolConfig config = pool.config();
  config.device = Device::cpu();
  if (pool.is_mla()) {
    ATTNKIT_ASSIGN_OR_RETURN(std::unique_ptr<MLAKVPool> mla, MLAKVPool::create(config));
    return std::unique_ptr<KVPool>(std::move(mla));
  }
  ATTNKIT_ASSIGN_OR_RETURN(std::unique_ptr<MHAKVPool> mha, MHAKVPool::create(config));
  return std::unique_ptr<KVPool>(std::move(mha));
}

// What the fp64 host path reads and writes for one layer call: the caller's own tensors on a CPU
// context, host copies of them on a CUDA context.
struct HostCall {
  TensorView q, k, v, out, lse;
  const AttentionLayer* layer = nullptr;
  const ForwardBatch* batch = nullptr;
};

class TorchNativeBackend final : public AttentionBackend {
 public:
  explicit TorchNativeBackend(const BackendContext& ctx) : ctx_(ctx) {}

  // CUDA contexts: the host mirror of ctx.kv_pool (and of the request table when given).
  Status init_host_mirrors() {
    if (ctx_.device.is_cpu()) return Status::ok();
    ATTNKIT_RETURN_IF_ERROR(ensure_pool_mirror(*ctx_.kv_pool));
    if (ctx_.req_to_token_pool != nullptr) {
      ATTNKIT_RETURN_IF_ERROR(ensure_table_mirror(*ctx_.req_to_token_pool));
    }
    return Status::ok();
  }

  std::optional<Device> device() const override { return ctx_.device; }
  const BackendDescriptor& descriptor() const override {
    const BackendDescriptor* found = builtin_registry().find("torch_native");
    return found != nullptr ? *found : fallback_descriptor();
  }

  Status init_forward_metadata(const ForwardBatch& batch) override {
    // In the device's scope: cudaStreamLegacy / cudaStreamPerThread resolve to the current device.
    const DeviceScope scope(ctx_.device);
    ATTNKIT_RETURN_IF_ERROR(scope.status());
    ATTNKIT_RETURN_IF_ERROR(check_batch_devices(
        batch, batch.stream != nullptr ? batch.stream : ctx_.stream, ctx_.device));
    return batch.validate();
  }

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
  // One code path for both devices: validate, (CUDA: stage the inputs through the host and
  // validate the staged batch), write the cache, (CUDA: stage the layer's pool), compute in fp64 on
  // the host, store in q's dtype, (CUDA: copy out and lse back).
  Status run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
             const AttentionLayer& layer, const ForwardBatch& batch, bool save_kv,
             const TensorView& lse) {
    const DeviceScope scope(ctx_.device);
    ATTNKIT_RETURN_IF_ERROR(scope.status());
    ATTNKIT_RETURN_IF_ERROR(
        validate_forward_inputs(q, k, v, out, layer, batch, save_kv, lse, ctx_.device));
    if (batch.mode == ForwardMode::kIdle) return Status::ok();
    if (ctx_.device.is_cuda() && layer.sinks.defined()) {
      // Device sinks are read here, before the cache write (the shared validation reads host sinks
      // only): a +inf / NaN sink had been refused by the host step after k / v were stored.
      ATTNKIT_RETURN_IF_ERROR(synchronize_device(ctx_.device));
      std::vector<float> sinks(static_cast<size_t>(layer.sinks.numel()));
      TensorView host(sinks.data(), DType::kF32, Device::cpu(), {layer.sinks.numel()});
      ATTNKIT_RETURN_IF_ERROR(copy_bytes(host.data, host.device, layer.sinks.data,
                                         layer.sinks.device, layer.sinks.storage_bytes()));
      ATTNKIT_RETURN_IF_ERROR(check_sink_values(host));
    }
    const bool staged = ctx_.device.is_cuda();
    HostCall call{q, k, v, out, lse, &layer, &batch};
    if (staged) ATTNKIT_RETURN_IF_ERROR(stage_inputs(q, k, v, out, layer, batch, lse, &call));
    if (save_kv && batch.num_tokens > 0) {  // no new token: nothing to write (no out_cache_loc)
      // A refused call must leave the pool as it was, so what compute_attention_fp64 checks is
      // checked before the write: the rows the reference will read and, on CUDA, the staged batch
      // as the host sees it (out_cache_loc has a host copy there, so each new token's slot is
      // compared with its row, which a CUDA pool's validate() cannot do). Then every slot written
      // is a pool row: the device's slot guard has nothing to skip.
      if (staged) ATTNKIT_RETURN_IF_ERROR(call.batch->validate());
      ATTNKIT_RETURN_IF_ERROR(reference::check_pool_rows(*call.layer, *call.batch));
      const StreamHandle stream = batch.stream != nullptr ? batch.stream : ctx_.stream;
      ATTNKIT_RETURN_IF_ERROR(batch.kv_pool->set_kv(layer.layer_id, batch.out_cache_loc, k, v,
                                                    layer.k_scale, layer.v_scale, stream));
    }
    // After the write: the reference computes from the rows as the CUDA scatter stored them.
    if (staged) ATTNKIT_RETURN_IF_ERROR(stage_pool_layer(*batch.kv_pool, layer.layer_id));
    ATTNKIT_ASSIGN_OR_RETURN(
        reference::ReferenceOutput ref,
        reference::compute_attention_fp64(call.q, call.k, call.v, *call.layer, *call.batch));
    store_results(ref, *call.layer, call.batch->num_tokens, call.out, call.lse);
    if (staged) ATTNKIT_RETURN_IF_ERROR(unstage_outputs(out, lse, call));
    return Status::ok();
  }

  // Writes the fp64 result into host out [T, Hq, Dv] (q's dtype) and lse [T, Hq] (f32, optional).
  static void store_results(const reference::ReferenceOutput& ref, const AttentionLayer& layer,
                            int64_t t, const TensorView& out, const TensorView& lse) {
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
  }

  // ---- CUDA staging (host copies; synchronous) ----
  //
  // torch_native is the eager correctness reference, not a serving path: unlike every other
  // backend it synchronises and allocates (staging buffers grow on demand, the pool mirror is
  // rebuilt when the batch brings a pool of another layout) inside forward. It never supports
  // CUDA graphs (its descriptor says so).

  Status ensure_pool_mirror(const KVPool& pool) {
    if (host_pool_ != nullptr && same_pool_layout(*host_pool_, pool)) return Status::ok();
    ATTNKIT_ASSIGN_OR_RETURN(host_pool_, create_host_pool_like(pool));
    return Status::ok();
  }

  Status ensure_table_mirror(const ReqToTokenPool& table) {
    if (host_table_ != nullptr && host_table_->max_reqs() == table.max_reqs() &&
        host_table_->max_context_len() == table.max_context_len()) {
      return Status::ok();
    }
    ATTNKIT_ASSIGN_OR_RETURN(
        host_table_,
        ReqToTokenPool::create(table.max_reqs(), table.max_context_len(), Device::cpu()));
    return Status::ok();
  }

  // A host copy of every byte `t` spans (same shape and strides, so strided views keep the bytes
  // between their elements) in the next staging buffer, grown on demand; undefined stays
  // undefined.
  Result<TensorView> stage_view(const TensorView& t, const char* name) {
    if (!t.defined()) return TensorView();
    for (int d = 0; d < t.ndim; ++d) {
      if (t.stride(d) < 0) {
        return Status::invalid_argument(cat(name, ": ", t.describe(), " has stride ", t.stride(d),
                                            " in dim ", d,
                                            "; torch_native stages only views with "
                                            "non-negative strides"));
      }
    }
    const int64_t bytes = t.storage_bytes();
    if (staging_used_ == staging_.size()) staging_.emplace_back();
    Buffer& buffer = staging_[staging_used_++];
    // A defined view of zero elements still needs a non-null pointer.
    const int64_t capacity = std::max<int64_t>(bytes, kMinStagingBytes);
    if (buffer.bytes() < capacity) {
      ATTNKIT_ASSIGN_OR_RETURN(buffer, Buffer::allocate(Device::cpu(), capacity));
    }
    TensorView host = t;
    host.data = buffer.data();
    host.device = Device::cpu();
    if (bytes > 0) {
      ATTNKIT_RETURN_IF_ERROR(copy_bytes(host.data, host.device, t.data, t.device, bytes));
    }
    return host;
  }

  // The requests' req_to_token rows from the device table's host mirror. Rows outside
  // [1, max_reqs] are left alone: row 0 is all zeros in both tables, and an invalid row reads
  // as missing in the mirror too, so the host path reports it.
  // copy_rows_from carries whether each row is allocated, as write() asks.
  Status mirror_table_rows(const ForwardBatch& batch) {
    if (batch.req_to_token_pool == nullptr) {
      return Status::invalid_argument("batch.req_to_token_pool is null");
    }
    ATTNKIT_RETURN_IF_ERROR(ensure_table_mirror(*batch.req_to_token_pool));
    const ReqToTokenPool& table = *batch.req_to_token_pool;
    for (const int32_t row : batch.req_pool_indices_host) {
      if (row < 1 || row > table.max_reqs()) continue;
      ATTNKIT_RETURN_IF_ERROR(host_table_->copy_rows_from(table, std::span(&row, 1)));
    }
    return Status::ok();
  }

  // After stage_inputs (which made the host mirror) and the cache write: synchronises the device
  // (the write, or the caller's producers of the pool's rows, may still be running), then copies
  // layer `layer_id`'s pool buffers, byte for byte, into the host mirror (MLA prefill never reads
  // the pool).
  Status stage_pool_layer(const KVPool& pool, int layer_id) {
    ATTNKIT_RETURN_IF_ERROR(synchronize_device(ctx_.device));
    const std::vector<TensorView> src = layer_buffers(pool, layer_id);
    const std::vector<TensorView> dst = layer_buffers(*host_pool_, layer_id);
    for (size_t i = 0; i < src.size(); ++i) {
      if (!src[i].defined()) continue;
      ATTNKIT_RETURN_IF_ERROR(copy_bytes(dst[i].data, Device::cpu(), src[i].data, src[i].device,
                                         src[i].storage_bytes()));
    }
    return Status::ok();
  }

  Status stage_inputs(const TensorView& q, const TensorView& k, const TensorView& v,
                      const TensorView& out, const AttentionLayer& layer, const ForwardBatch& batch,
                      const TensorView& lse, HostCall* call) {
    // The caller's producers of q / k / v and of the table may still be running. The layer's pool
    // buffers are copied later, after the cache write (stage_pool_layer).
    ATTNKIT_RETURN_IF_ERROR(synchronize_device(ctx_.device));
    ATTNKIT_RETURN_IF_ERROR(ensure_pool_mirror(*batch.kv_pool));
    ATTNKIT_RETURN_IF_ERROR(mirror_table_rows(batch));

    staging_used_ = 0;
    ATTNKIT_ASSIGN_OR_RETURN(call->q, stage_view(q, "q"));
    ATTNKIT_ASSIGN_OR_RETURN(call->k, stage_view(k, "k"));
    ATTNKIT_ASSIGN_OR_RETURN(call->v, stage_view(v, "v"));
    // out and lse are downloaded too so that the bytes between a strided view's elements survive
    // the copy back.
    ATTNKIT_ASSIGN_OR_RETURN(call->out, stage_view(out, "out"));
    ATTNKIT_ASSIGN_OR_RETURN(call->lse, stage_view(lse, "lse"));

    host_layer_ = layer;
    ATTNKIT_ASSIGN_OR_RETURN(host_layer_.sinks, stage_view(layer.sinks, "layer.sinks"));

    host_batch_ = batch;  // the host length arrays come along
    host_batch_.kv_pool = host_pool_.get();
    host_batch_.req_to_token_pool = host_table_.get();
    host_batch_.stream = nullptr;
    const std::pair<TensorView ForwardBatch::*, const char*> batch_tensors[] = {
        {&ForwardBatch::req_pool_indices, "batch.req_pool_indices"},
        {&ForwardBatch::seq_lens, "batch.seq_lens"},
        {&ForwardBatch::out_cache_loc, "batch.out_cache_loc"},
        {&ForwardBatch::positions, "batch.positions"},
        {&ForwardBatch::extend_prefix_lens, "batch.extend_prefix_lens"},
        {&ForwardBatch::extend_seq_lens, "batch.extend_seq_lens"},
        {&ForwardBatch::extend_start_loc, "batch.extend_start_loc"},
        {&ForwardBatch::encoder_lens, "batch.encoder_lens"},
    };
    for (const auto& [member, name] : batch_tensors) {
      ATTNKIT_ASSIGN_OR_RETURN(host_batch_.*member, stage_view(batch.*member, name));
    }
    ATTNKIT_ASSIGN_OR_RETURN(host_batch_.spec.custom_mask,
                             stage_view(batch.spec.custom_mask, "batch.spec.custom_mask"));
    ATTNKIT_ASSIGN_OR_RETURN(host_batch_.spec.mask_indptr,
                             stage_view(batch.spec.mask_indptr, "batch.spec.mask_indptr"));
    call->layer = &host_layer_;
    call->batch = &host_batch_;
    return Status::ok();
  }

  Status unstage_outputs(const TensorView& out, const TensorView& lse, const HostCall& call) {
    ATTNKIT_RETURN_IF_ERROR(
        copy_bytes(out.data, out.device, call.out.data, Device::cpu(), out.storage_bytes()));
    if (lse.defined()) {
      ATTNKIT_RETURN_IF_ERROR(
          copy_bytes(lse.data, lse.device, call.lse.data, Device::cpu(), lse.storage_bytes()));
    }
    // cudaMemcpy from pageable host memory may return before the device holds the data; later
    // work on the caller's (possibly non-blocking) stream must see it.
    return synchronize_device(ctx_.device);
  }

  BackendContext ctx_;
  // CUDA contexts only.
  std::unique_ptr<KVPool> host_pool_;           // host mirror of the device pool (same config)
  std::unique_ptr<ReqToTokenPool> host_table_;  // host copy of the batch's req_to_token rows
  std::vector<Buffer> staging_;                 // host staging buffers, grown on demand
  size_t staging_used_ = 0;
  AttentionLayer host_layer_;  // the layer with host sinks
  ForwardBatch host_batch_;    // the batch on the host mirrors
};

}  // namespace

Result<std::unique_ptr<AttentionBackend>> create_torch_native_backend(const BackendContext& ctx) {
  // The forwards take their head counts from each layer; the context's, where given (0: not
  // given), must still be ones a layer could have (-4 and 3 over 2 were accepted).
  if (ctx.num_q_heads < 0 || ctx.num_kv_heads < 0 ||
      (ctx.num_q_heads > 0 && ctx.num_kv_heads > 0 && ctx.num_q_heads % ctx.num_kv_heads != 0)) {
    return Status::invalid_argument(cat("ctx heads ", ctx.num_q_heads, "/", ctx.num_kv_heads,
                                        ": need num_q_heads a multiple of num_kv_heads, both > 0 "
                                        "(or 0: not given)"));
  }
  if (ctx.speculative_topk < 0) {
    return Status::invalid_argument(
        cat("ctx.speculative_topk ", ctx.speculative_topk, " must be >= 0 (0: no speculation)"));
  }
  if (ctx.device.is_cuda()) {
#ifdef ATTNKIT_WITH_CUDA
    if (ctx.kv_pool == nullptr) {
      return Status::invalid_argument(
          "ctx.kv_pool is null: torch_native on " + ctx.device.to_string() +
          " builds a host mirror of the pool at creation, so the context needs the KV pool");
    }
    if (ctx.kv_pool->device() != ctx.device) {
      return Status::invalid_argument("ctx.kv_pool is on " + ctx.kv_pool->device().to_string() +
                                      " but the context's device is " + ctx.device.to_string());
    }
#else
    return Status::unsupported(
        "torch_native runs on the CPU only in this build (attnkit was "
        "built without CUDA); device " +
        ctx.device.to_string() + " was requested");
#endif
  }
  auto backend = std::make_unique<TorchNativeBackend>(ctx);
  ATTNKIT_RETURN_IF_ERROR(backend->init_host_mirrors());
  return std::unique_ptr<AttentionBackend>(std::move(backend));
}

}  // namespace attnkit
