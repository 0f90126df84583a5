// The shared case table, case preparation, the runner and the comparison with the fp64 reference.
#include "harness/case_runner.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <new>
#include <numeric>
#include <ostream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

#include "backend/small_extend.h"
#include "backends/fa3/fa3_backend.h"
#include "backends/fa3/kernels/tile_plan.h"
#include "backends/torch_native/torch_native_backend.h"
#include "core/device_scope.h"
#include "core/env_knob.h"
#include "core/str_cat.h"
#include "harness/mla_prefix_expander.h"

namespace attnkit::harness {

int64_t host_memory_available() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  constexpr std::string_view kKey = "MemAvailable:";
  while (std::getline(meminfo, line)) {
    if (line.starts_with(kKey)) {  // "MemAvailable:   20480000 kB"
      std::istringstream fields(line.substr(kKey.size()));
      int64_t kib = -1;
      return fields >> kib && kib >= 0 ? kib * 1024 : -1;
    }
  }
  return -1;
}

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
// max-abs bound = kMaxAbsFactor * rel-L2 tolerance * max(1, max |reference|).
constexpr double kMaxAbsFactor = 4.0;
// Request rows beyond the batch size, so shuffled rows leave gaps in the request table.
constexpr int kSpareRequestRows = 2;
// Guard bytes after every output tensor.
constexpr int64_t kCanaryBytes = 64;
constexpr uint8_t kCanaryByte = 0xA5;

// A contiguous view with a runtime shape.
TensorView make_view(void* data, DType dtype, Device device, const std::vector<int64_t>& shape) {
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.ndim = static_cast<int>(shape.size());
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.shape[static_cast<size_t>(d)] = shape[static_cast<size_t>(d)];
    t.strides[static_cast<size_t>(d)] = stride;
    stride *= shape[static_cast<size_t>(d)];
  }
  return t;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

// Allocates a tensor on `device` and fills it from host bytes (nullptr = leave uninitialised).
Result<TensorView> upload_bytes(std::vector<Buffer>& storage, Device device, DType dtype,
                                const std::vector<int64_t>& shape, const void* host) {
  const int64_t bytes = std::max<int64_t>(dtype_storage_bytes(dtype, numel_of(shape)), 1);
  ATTNKIT_ASSIGN_OR_RETURN(Buffer buffer, Buffer::allocate(device, bytes));
  TensorView view = make_view(buffer.data(), dtype, device, shape);
  if (host != nullptr) {
    ATTNKIT_RETURN_IF_ERROR(copy_bytes(buffer.data(), device, host, Device::cpu(),
                                       dtype_storage_bytes(dtype, numel_of(shape))));
  }
  storage.push_back(std::move(buffer));
  return view;
}

// An uninitialised output tensor between two canaries of kCanaryByte, whose addresses are
// recorded so compare_with_reference can check that nothing wrote outside the tensor. The leading
// canary spans at least one token's row (shape[0] is the token dimension), rounded up to 256
// bytes, so that the tensor keeps the buffer's 256-byte alignment: the fa3 kernels compute rows
// before the first token (a request's first tile may start there) and must not store them. The
// trailing canary is kCanaryBytes.
Result<TensorView> output_with_canary(PreparedCase& pc, DType dtype,
                                      const std::vector<int64_t>& shape) {
  constexpr int64_t kAlign = 256;
  const int64_t bytes = dtype_storage_bytes(dtype, numel_of(shape));
  const int64_t row_bytes = !shape.empty() && shape[0] > 0 ? bytes / shape[0] : 0;
  const int64_t lead = (std::max(kCanaryBytes, row_bytes) + kAlign - 1) / kAlign * kAlign;
  ATTNKIT_ASSIGN_OR_RETURN(Buffer buffer, Buffer::allocate(pc.device, lead + bytes + kCanaryBytes));
  uint8_t* const data = static_cast<uint8_t*>(buffer.data()) + lead;
  // Host outputs are written once here so that their pages exist before any timed call: on a VM
  // the first touch of a fresh page costs a fault in the guest and often one in the host (a bench
  // call writing a never-touched 16 MiB output measured 27 ms of faults on top of a 27 ms kernel),
  // while a serving engine reuses its output buffers. Poisoned cases overwrite this with NaN.
  if (pc.device.is_cpu()) std::memset(data, 0, static_cast<size_t>(bytes));
  for (const PreparedCase::Canary& c : {PreparedCase::Canary{buffer.data(), lead},
                                        PreparedCase::Canary{data + bytes, kCanaryBytes}}) {
    const std::vector<uint8_t> canary(static_cast<size_t>(c.bytes), kCanaryByte);
    ATTNKIT_RETURN_IF_ERROR(copy_bytes(c.at, pc.device, canary.data(), Device::cpu(), c.bytes));
    pc.canaries.push_back(c);
  }
  TensorView view = make_view(data, dtype, pc.device, shape);
  pc.storage.push_back(std::move(buffer));
  return view;
}

template <typename T>
Result<TensorView> upload(std::vector<Buffer>& storage, Device device, DType dtype,
                          const std::vector<T>& host) {
  return upload_bytes(storage, device, dtype, {static_cast<int64_t>(host.size())}, host.data());
}

// Float values encoded in `dtype` (f32/f16/bf16) and uploaded.
Result<TensorView> upload_floats(std::vector<Buffer>& storage, Device device, DType dtype,
                                 const std::vector<int64_t>& shape,
                                 const std::vector<float>& values) {
  if (static_cast<int64_t>(values.size()) != numel_of(shape)) {
    return Status::internal(
        cat("upload_floats: ", values.size(), " values for ", numel_of(shape), " elements"));
  }
  if (dtype == DType::kF32) {  // the history K/V of big benchmark cases: no per-element convert
    return upload_bytes(storage, device, dtype, shape, values.data());
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(dtype_storage_bytes(dtype, numel_of(shape))));
  for (size_t i = 0; i < values.size(); ++i) {
    store_from_float(bytes.data(), dtype, static_cast<int64_t>(i), values[i]);
  }
  return upload_bytes(storage, device, dtype, shape, bytes.data());
}

std::vector<float> normal_values(std::mt19937_64& rng, int64_t n, float mean = 0.f) {
  std::normal_distribution<float> dist(mean, 1.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// splitmix64: the counter-based mixer behind fast_normal_values.
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// N(mean, 1) values from a counter-based generator (Box-Muller over splitmix64 of seed + index),
// filled by all hardware threads: the same values for a seed on every machine and thread count,
// at a small fraction of std::normal_distribution's cost. For benchmark inputs of hundreds of
// millions of values (PrepareOptions::fast_inputs); the tests keep normal_values.
std::vector<float> fast_normal_values(uint64_t seed, int64_t n, float mean = 0.f) {
  std::vector<float> v(static_cast<size_t>(n));
  constexpr double kTwoPi = 6.283185307179586;
  constexpr double kUnit = 1.0 / 9007199254740992.0;  // 2^-53
  auto fill = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin & ~int64_t{1}; i < end; i += 2) {
      const uint64_t bits = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(i)));
      const uint64_t bits2 = splitmix64(bits);
      const double u1 = (static_cast<double>(bits >> 11) + 1.0) * kUnit;  // (0, 1]
      const double u2 = static_cast<double>(bits2 >> 11) * kUnit;
      const double r = std::sqrt(-2.0 * std::log(u1));
      if (i >= begin)
        v[static_cast<size_t>(i)] = mean + static_cast<float>(r * std::cos(kTwoPi * u2));
      if (i + 1 < end) {
        v[static_cast<size_t>(i + 1)] = mean + static_cast<float>(r * std::sin(kTwoPi * u2));
      }
    }
  };
  constexpr int64_t kPerThread = int64_t{1} << 20;
  const int64_t threads =
      std::min<int64_t>(std::max(1u, std::thread::hardware_concurrency()), n / kPerThread + 1);
  if (threads <= 1) {
    fill(0, n);
    return v;
  }
  std::vector<std::thread> pool;
  const int64_t chunk = ((n + threads - 1) / threads + 1) & ~int64_t{1};  // even boundaries
  int64_t b = 0;
  try {
    for (; b < n; b += chunk) pool.emplace_back(fill, b, std::min(n, b + chunk));
  } catch (const std::system_error&) {
    fill(b, n);  // no thread could be started: this one fills the rest
  }
  for (std::thread& th : pool) th.join();
  return v;
}

// A host copy of a contiguous tensor (same shape and dtype).
Result<TensorView> to_host(std::vector<Buffer>& storage, const TensorView& t) {
  if (!t.defined()) return t;
  if (!t.is_contiguous()) {
    return Status::invalid_argument("to_host: " + t.describe() + " is not contiguous");
  }
  std::vector<int64_t> shape(t.shape.begin(), t.shape.begin() + t.ndim);
  ATTNKIT_ASSIGN_OR_RETURN(TensorView h,
                           upload_bytes(storage, Device::cpu(), t.dtype, shape, nullptr));
  ATTNKIT_RETURN_IF_ERROR(copy_bytes(h.data, Device::cpu(), t.data, t.device, t.storage_bytes()));
  return h;
}

// The per-layer buffers of a pool (k, v and fp4 scales; MLA: the row and its scales).
std::vector<TensorView> pool_buffers(const KVPool& pool, int layer) {
  std::vector<TensorView> out;
  if (pool.is_mla()) {
    const auto& mla = static_cast<const MLAKVPool&>(pool);
    out = {mla.kv_buffer(layer), mla.scale_buffer(layer)};
  } else {
    const auto& mha = static_cast<const MHAKVPool&>(pool);
    out = {mha.k_buffer(layer), mha.v_buffer(layer), mha.k_scale_buffer(layer),
           mha.v_scale_buffer(layer)};
  }
  std::erase_if(out, [](const TensorView& t) { return !t.defined(); });
  return out;
}

Result<std::unique_ptr<KVPool>> create_pool(const KVPoolConfig& cfg, bool mla) {
  if (mla) {
    ATTNKIT_ASSIGN_OR_RETURN(std::unique_ptr<MLAKVPool> p, MLAKVPool::create(cfg));
    return std::unique_ptr<KVPool>(std::move(p));
  }
  ATTNKIT_ASSIGN_OR_RETURN(std::unique_ptr<MHAKVPool> p, MHAKVPool::create(cfg));
  return std::unique_ptr<KVPool>(std::move(p));
}

Status check_spec(const CaseSpec& s, const PrepareOptions& o) {
  const auto bad = [&](const std::string& what) {
    return Status::invalid_argument("case " + s.name + ": " + what);
  };
  const int bs = s.batch_size();
  const bool verify = s.mode == ForwardMode::kTargetVerify;
  if (s.mode == ForwardMode::kIdle) return bad("mode idle has no work to prepare");
  if (bs < 1) return bad("prefix_lens is empty (batch size must be >= 1)");
  if (!verify && static_cast<int>(s.new_lens.size()) != bs) {
    return bad(cat("new_lens has ", s.new_lens.size(), " entries, prefix_lens ", bs));
  }
  for (int r = 0; r < bs; ++r) {
    if (s.prefix_lens[static_cast<size_t>(r)] < 0) {
      return bad(
          cat("prefix_lens[", r, "] = ", s.prefix_lens[static_cast<size_t>(r)], " must be >= 0"));
    }
    if (!verify && s.new_lens[static_cast<size_t>(r)] < 0) {
      return bad(cat("new_lens[", r, "] = ", s.new_lens[static_cast<size_t>(r)], " must be >= 0"));
    }
    if (s.mode == ForwardMode::kDecode && s.new_lens[static_cast<size_t>(r)] != 1) {
      return bad(cat("decode needs new_lens all 1, new_lens[", r,
                     "] = ", s.new_lens[static_cast<size_t>(r)]));
    }
  }
  if (s.type == AttentionType::kEncoderOnly && (verify || s.mode == ForwardMode::kDraftExtend)) {
    return bad(cat("type encoder_only in a ", forward_mode_name(s.mode),
                   " case: speculative batches are causal (validate_forward_inputs refuses it)"));
  }
  if (s.page_size < 1 || s.page_size > kMaxCasePageSize) {
    return bad(cat("page_size ", s.page_size, " must be in [1, ", kMaxCasePageSize,
                   "] (a larger page only pads every request's last page)"));
  }
  if (s.num_q_heads < 1 || s.num_kv_heads < 1 || s.num_q_heads % s.num_kv_heads != 0) {
    return bad(cat("heads ", s.num_q_heads, "/", s.num_kv_heads,
                   " must be positive with num_q_heads divisible by num_kv_heads"));
  }
  if (s.head_dim < 1 || s.v_head_dim < 1) {
    return bad(cat("head dims ", s.head_dim, "/", s.v_head_dim, " must be >= 1"));
  }
  if (!dtype_is_activation(s.q_dtype)) {
    return bad(cat("q_dtype ", dtype_name(s.q_dtype), " must be f32, f16 or bf16"));
  }
  if (s.cross_attention && static_cast<int>(s.encoder_lens.size()) != bs) {
    return bad(cat("cross_attention needs encoder_lens for each of the ", bs, " requests"));
  }
  if (!s.cross_attention && !s.encoder_lens.empty()) {
    return bad("encoder_lens given without cross_attention");
  }
  // One message per rule, with the values that broke it.
  if (s.shared_prefix < 0) return bad(cat("shared_prefix ", s.shared_prefix, " must be >= 0"));
  if (s.shared_prefix % s.page_size != 0) {
    return bad(cat("shared_prefix ", s.shared_prefix, " must be a multiple of page_size ",
                   s.page_size, " (shared tokens fill whole pages)"));
  }
  if (s.shared_prefix > 0 && s.cross_attention) {
    return bad(cat("shared_prefix ", s.shared_prefix, " must be 0 with cross_attention"));
  }
  if (const auto shortest = std::min_element(s.prefix_lens.begin(), s.prefix_lens.end());
      s.shared_prefix > *shortest) {
    return bad(cat("shared_prefix ", s.shared_prefix,
                   " must be at most every request's cached prefix (prefix_lens[",
                   shortest - s.prefix_lens.begin(), "] = ", *shortest,
                   s.mode == ForwardMode::kDecode
                       ? "; a decode request of kv_len n caches n - 1 tokens)"
                       : ")"));
  }
  const bool spec_mode = verify || s.mode == ForwardMode::kDraftExtend;
  if (spec_mode && (s.spec_draft_tokens < 1 || s.spec_topk < 1)) {
    return bad(cat(forward_mode_name(s.mode),
                   " needs spec_draft_tokens >= 1 and spec_topk >= 1, got ", s.spec_draft_tokens,
                   " / ", s.spec_topk));
  }
  if (!spec_mode && (s.spec_draft_tokens != 0 || s.spec_topk != 0)) {
    return bad(cat("spec_draft_tokens / spec_topk ", s.spec_draft_tokens, " / ", s.spec_topk,
                   " are for target_verify and draft_extend only (leave them 0 in mode ",
                   forward_mode_name(s.mode), ")"));
  }
  // The backends refuse a cap whose products with the layer's scale leave the float range (0 turns
  // it off); the case's bound is stricter and independent of the scale, so a case file fails
  // when it is read, not per backend after the ceilings. Real soft-caps are 5-50.
  if (s.logit_cap != 0.f && !(s.logit_cap >= kMinCaseLogitCap && s.logit_cap <= kMaxCaseLogitCap)) {
    return bad(cat("logit_cap ", s.logit_cap, " must be 0 (off) or in [", kMinCaseLogitCap, ", ",
                   kMaxCaseLogitCap,
                   "] (a larger cap changes no logit, a smaller one saturates "
                   "every logit)"));
  }
  if (s.sliding_window < -1) {
    return bad(cat("sliding_window ", s.sliding_window, " must be -1 (off) or >= 0"));
  }
  if (!s.mla && (s.kv_lora_rank != 0 || s.qk_rope_head_dim != 0)) {
    return bad(cat("kv_lora_rank / qk_rope_head_dim ", s.kv_lora_rank, " / ", s.qk_rope_head_dim,
                   " are for MLA cases only (leave them 0 without mla)"));
  }
  for (int r = 0; s.cross_attention && r < bs; ++r) {
    if (s.encoder_lens[static_cast<size_t>(r)] < 0) {
      return bad(
          cat("encoder_lens[", r, "] = ", s.encoder_lens[static_cast<size_t>(r)], " must be >= 0"));
    }
  }
  // The request table is int32 [rows, max_context_len] with max_context_len = the longest row
  // rounded up to whole pages plus one page, and the new tokens are counted in int32: lengths
  // whose sums do not fit are named here instead of wrapping around in prepare_case.
  int64_t total_new = 0;
  for (int r = 0; r < bs; ++r) {
    const auto i = static_cast<size_t>(r);
    const int64_t enc = s.cross_attention ? s.encoder_lens[i] : 0;
    const int64_t fresh = verify ? s.spec_draft_tokens : s.new_lens[i];
    const int64_t row = enc + s.prefix_lens[i] + fresh;
    const int64_t table_len = ((row + s.page_size - 1) / s.page_size + 1) * s.page_size;
    if (table_len > INT32_MAX) {
      return bad(cat("request ", r, ": encoder ", enc, " + prefix ", s.prefix_lens[i], " + new ",
                     fresh, " = ", row, " tokens need a request-table row of ", table_len,
                     " entries (whole pages of page_size ", s.page_size,
                     " plus one) but at most 2147483647 fit in int32"));
    }
    total_new += fresh;
  }
  if (total_new == 0) {
    return bad(
        "no request has new tokens (new_lens are all 0): the forward would compute nothing "
        "(and --verify would compare nothing)");
  }
  if (total_new > INT32_MAX) {
    return bad(cat(total_new,
                   " new tokens in all (the sum of new_lens, or batch size x "
                   "spec_draft_tokens) exceed 2147483647 (int32 num_tokens)"));
  }
  if (s.mla) {
    if (s.kv_lora_rank < 1 || s.qk_rope_head_dim < 1) {
      return bad(cat("mla needs kv_lora_rank and qk_rope_head_dim >= 1 (got ", s.kv_lora_rank,
                     " and ", s.qk_rope_head_dim, ")"));
    }
    if (s.mla_absorbed() && (s.num_kv_heads != 1 || s.v_head_dim != s.kv_lora_rank)) {
      return bad(cat("MLA absorbed (head_dim = kv_lora_rank + qk_rope_head_dim = ", s.head_dim,
                     ") needs num_kv_heads 1 and v_head_dim = kv_lora_rank ", s.kv_lora_rank,
                     " (got num_kv_heads ", s.num_kv_heads, ", v_head_dim ", s.v_head_dim, ")"));
    }
    if (!s.mla_absorbed() && s.mode != ForwardMode::kExtend) {
      return bad(cat("MLA head_dim ", s.head_dim, " is not kv_lora_rank + qk_rope_head_dim = ",
                     int64_t{s.kv_lora_rank} + s.qk_rope_head_dim,
                     ", which makes it a non-absorbed (prefill) case, and those must use mode "
                     "extend (got ",
                     forward_mode_name(s.mode), ")"));
    }
  }
  if (s.mla_prefix_chunk < 0 ||
      (s.mla_prefix_chunk > 0 && (!s.mla || s.mla_absorbed() || s.num_kv_heads != s.num_q_heads))) {
    return bad(cat("mla_prefix_chunk ", s.mla_prefix_chunk,
                   " must be 0, or > 0 only for MLA non-absorbed cases with num_kv_heads = "
                   "num_q_heads"));
  }
  if (!std::isfinite(s.v_mean) || (s.v_mean != 0.f && s.mla)) {
    // MLA: absorbed, V is part of the key row; not absorbed, the cached history has no V of its
    // own (prepare_case draws none), so only the new tokens' V would move.
    return bad(cat("v_mean ", s.v_mean, " must be finite, and 0 for MLA cases"));
  }
  if (s.fp8_q && s.mla) {  // (q_dtype is an activation dtype: checked above)
    return bad("fp8_q needs an MHA case (got MLA)");
  }
  if (o.num_layers < 1) return bad(cat("num_layers ", o.num_layers, " must be >= 1"));
  // Layer l is cross-attention when l is odd: one layer would run (and verify) self-attention only.
  if (s.cross_attention && o.num_layers < 2) {
    return bad(cat("num_layers ", o.num_layers,
                   " is too few for a cross-attention case: its even layers run self-attention "
                   "and its odd ones cross-attention, so it needs num_layers >= 2"));
  }
  if (o.spare_pages < 0) return bad(cat("spare_pages ", o.spare_pages, " must be >= 0"));
  return Status::ok();
}

}  // namespace

Status validate_case(const CaseSpec& spec) { return check_spec(spec, PrepareOptions{}); }

HostFootprint host_footprint(const CaseSpec& spec, Device device, const PrepareOptions& options) {
  constexpr double kI64 = sizeof(int64_t);
  constexpr double kI32 = sizeof(int32_t);
  constexpr double kF32 = sizeof(float);
  const bool verify = spec.mode == ForwardMode::kTargetVerify;
  const double ps = spec.page_size;
  // The lengths prepare_case derives, summed in double (billions of tokens are the point).
  double tokens = 0;   // every request's row: encoder + prefix + new tokens
  double history = 0;  // slots written before the forward (the shared prefix once)
  double fresh = 0;    // new tokens (num_tokens)
  double needed_pages = 0;
  double longest = 0;
  double mask = 0;  // verify: one byte per (draft, visible column)
  for (int r = 0; r < spec.batch_size(); ++r) {
    const auto i = static_cast<size_t>(r);
    const double enc = spec.cross_attention ? spec.encoder_lens[i] : 0;
    const double prefix = spec.prefix_lens[i];
    const double n = verify ? spec.spec_draft_tokens : spec.new_lens[i];
    const double row = enc + prefix + n;
    tokens += row;
    history += enc + prefix - (r > 0 ? spec.shared_prefix : 0);
    fresh += n;
    needed_pages += std::ceil(row / ps);
    longest = std::max(longest, row);
    if (verify) mask += n * (prefix + n);
  }
  const double pages = std::max(needed_pages + options.spare_pages, 1.0);
  const double table_entries =
      (spec.batch_size() + kSpareRequestRows + 1.0) * (std::ceil(longest / ps) + 1) * ps;
  // PageAllocator (a state byte and a free-list id per page), the page list, the slots, the
  // request table, then hist_slots, out_cache_loc, positions and the mask; on the CPU the last
  // four are uploaded into host buffers as well.
  const double index = (history + 2 * fresh) * kI64 + mask;
  HostFootprint f;
  f.tables = pages * (1 + 2 * kI64) + tokens * kI64 + table_entries * kI32 +
             index * (device.is_cpu() ? 2 : 1);

  // The pool: rows x values per row per layer (fp4: its fp8 block scale per 16 values too).
  const double kv_heads = spec.mla ? 1 : spec.num_kv_heads;
  // (The dims summed as doubles: two int dims near INT32_MAX would wrap negative and pass the
  // guard.)
  const double dkv = static_cast<double>(spec.head_dim) + spec.v_head_dim;
  const double row_values =
      spec.mla ? static_cast<double>(spec.kv_lora_rank) + spec.qk_rope_head_dim : kv_heads * dkv;
  const double value_bytes =
      dtype_bits(spec.kv_dtype) / 8.0 + (spec.kv_dtype == DType::kFP4E2M1 ? 1.0 / 16 : 0.0);
  const double layer_pool = (pages * ps + ps) * row_values * value_bytes;
  const double layers = options.num_layers;
  if (device.is_cpu()) f.pool = layers * layer_pool;
  if (options.snapshot_pool) f.snapshot = layers * layer_pool;

  // Inputs. Per layer: history K (and V) drawn as f32 and kept as such, q / k / v drawn as f32 and
  // stored in q's dtype, out (and lse).
  const double qb = dtype_bits(spec.q_dtype) / 8.0;
  const double dk = spec.mla ? row_values : spec.head_dim;
  const double dv = spec.mla ? 0 : spec.v_head_dim;
  const double hq = spec.num_q_heads;
  const double hkv = spec.num_kv_heads;
  const double history_values = history * kv_heads * (dk + dv);
  const double new_values = fresh * (hq * spec.head_dim + hkv * dkv);
  const double outputs = fresh * hq * (spec.v_head_dim * qb + (options.request_lse ? kF32 : 0));
  if (device.is_cpu()) f.inputs = layers * (history_values * kF32 + new_values * qb + outputs);
  // The largest transient host vector set of one layer: the random history K or V, or the new
  // q / k / v with their converted bytes; on CUDA also the staging of the NaN poison (one pool
  // buffer of a layer, or an output).
  double staging = std::max(history * kv_heads * std::max(dk, dv) * kF32,
                            fresh * std::max(hq * spec.head_dim, hkv * dkv) * (kF32 + qb));
  const double pool_buffer = (pages * ps + ps) * kv_heads * std::max(dk, dv) * value_bytes;
  if (!device.is_cpu() && options.poison) staging = std::max({staging, pool_buffer, outputs});
  f.inputs += staging;
  return f;
}

Status check_host_footprint(const CaseSpec& spec, Device device, const PrepareOptions& options,
                            int64_t available) {
  const HostFootprint f = host_footprint(spec, device, options);
  if (available <= 0 || f.total() <= static_cast<double>(available)) return Status::ok();
  constexpr double kMiB = 1024.0 * 1024.0;
  // In whole MiB; past what an int64 holds (a case of 2^31 heads of 2^31 dims) in %g form, where
  // llround would answer LLONG_MIN.
  const auto mib = [&](double bytes) -> std::string {
    const double m = bytes / kMiB;
    if (m < 1e15) return std::to_string(std::llround(m));
    std::ostringstream s;
    s.precision(3);
    s << m;
    return s.str();
  };
  std::vector<std::string> parts;
  if (f.tables > 0) parts.push_back(cat("page and request tables ", mib(f.tables), " MiB"));
  if (f.pool > 0) {
    parts.push_back(cat("KV pool ", mib(f.pool), " MiB for ", options.num_layers,
                        " layers of page_size ", spec.page_size));
  }
  if (f.snapshot > 0) parts.push_back(cat("pool snapshot ", mib(f.snapshot), " MiB"));
  if (f.inputs > 0) parts.push_back(cat("inputs ", mib(f.inputs), " MiB"));
  return Status::out_of_memory(cat("case ", spec.name, ": preparing it on ", device.to_string(),
                                   " needs ", mib(f.total()), " MiB of host memory (",
                                   join(parts, ", "), "), above the ", available >> 20,
                                   " MiB this host has available"));
}

namespace {

// Half the smallest positive value of the KV dtype (at scale 1): the most a value in its
// subnormal range moves in a round trip. 0 for fp4 (block scales: the relative tolerance holds).
double kv_subnormal_half_step(DType kv) {
  switch (kv) {
    case DType::kF32:
      return std::ldexp(1.0, -150);
    case DType::kF16:
      return std::ldexp(1.0, -25);
    case DType::kBF16:
      return std::ldexp(1.0, -134);
    case DType::kFP8E4M3:
      return std::ldexp(1.0, -10);
    case DType::kFP8E5M2:
      return std::ldexp(1.0, -17);
    default:
      return 0.0;
  }
}

// Float tolerance of a round trip through the KV dtype (rel L2 of one [token, head] row).
double kv_roundtrip_tolerance(DType kv, DType q) {
  double t = 0.0;
  switch (kv) {
    case DType::kF32:
      t = 1e-6;
      break;
    case DType::kF16:
      t = 1e-3;
      break;
    case DType::kBF16:
      t = 8e-3;
      break;
    case DType::kFP8E4M3:
      t = 0.07;
      break;
    case DType::kFP8E5M2:
      t = 0.14;
      break;
    default:
      t = 0.25;  // fp4 e2m1 with per-16 block scales
      break;
  }
  return std::max(t, kv == q ? 0.0 : 1e-6);
}

// Host mirror of a prepared case: pools, request table, batch and layer tensors on the CPU.
struct HostMirror {
  std::vector<Buffer> storage;
  std::unique_ptr<KVPool> own_pool;
  std::unique_ptr<ReqToTokenPool> own_table;
  const KVPool* pool = nullptr;
  ForwardBatch batch;
  std::vector<AttentionLayer> layers;
  std::vector<TensorView> q, k, v, out, lse;
};

Result<HostMirror> make_host_mirror(const PreparedCase& pc) {
  HostMirror m;
  if (pc.device.is_cpu()) {
    m.pool = pc.kv_pool.get();
    m.batch = pc.batch;
    for (const LayerData& ld : pc.layers) {
      m.layers.push_back(ld.layer);
      m.q.push_back(ld.q);
      m.k.push_back(ld.k);
      m.v.push_back(ld.v);
      m.out.push_back(ld.out);
      m.lse.push_back(ld.lse);
    }
    return m;
  }
  KVPoolConfig cfg = pc.kv_pool->config();
  cfg.device = Device::cpu();
  ATTNKIT_ASSIGN_OR_RETURN(m.own_pool, create_pool(cfg, pc.kv_pool->is_mla()));
  for (int l = 0; l < cfg.num_layers; ++l) {
    const std::vector<TensorView> src = pool_buffers(*pc.kv_pool, l);
    const std::vector<TensorView> dst = pool_buffers(*m.own_pool, l);
    for (size_t i = 0; i < src.size(); ++i) ATTNKIT_RETURN_IF_ERROR(copy_tensor(dst[i], src[i]));
  }
  m.pool = m.own_pool.get();
  const ReqToTokenPool& table = *pc.req_to_token;
  ATTNKIT_ASSIGN_OR_RETURN(
      m.own_table,
      ReqToTokenPool::create(table.max_reqs(), table.max_context_len(), Device::cpu()));
  ATTNKIT_RETURN_IF_ERROR(m.own_table->copy_rows_from(table, pc.rows));
  m.batch = pc.batch;
  m.batch.kv_pool = m.own_pool.get();
  m.batch.req_to_token_pool = m.own_table.get();
  m.batch.stream = nullptr;
  for (TensorView* t :
       {&m.batch.req_pool_indices, &m.batch.seq_lens, &m.batch.out_cache_loc, &m.batch.positions,
        &m.batch.extend_prefix_lens, &m.batch.extend_seq_lens, &m.batch.extend_start_loc,
        &m.batch.encoder_lens, &m.batch.spec.custom_mask, &m.batch.spec.mask_indptr}) {
    ATTNKIT_ASSIGN_OR_RETURN(*t, to_host(m.storage, *t));
  }
  for (const LayerData& ld : pc.layers) {
    AttentionLayer layer = ld.layer;
    ATTNKIT_ASSIGN_OR_RETURN(layer.sinks, to_host(m.storage, ld.layer.sinks));
    m.layers.push_back(layer);
    for (auto [dst, src] : {std::pair{&m.q, &ld.q},
                            {&m.k, &ld.k},
                            {&m.v, &ld.v},
                            {&m.out, &ld.out},
                            {&m.lse, &ld.lse}}) {
      ATTNKIT_ASSIGN_OR_RETURN(TensorView h, to_host(m.storage, *src));
      dst->push_back(h);
    }
  }
  return m;
}

Result<reference::ReferenceOutput> reference_of(const HostMirror& m, const PreparedCase& pc,
                                                int l) {
  const bool mla_prefill = pc.spec.mla_prefill();
  const TensorView k = mla_prefill ? m.k[static_cast<size_t>(l)] : TensorView();
  const TensorView v = mla_prefill ? m.v[static_cast<size_t>(l)] : TensorView();
  return reference::compute_attention_fp64(m.q[static_cast<size_t>(l)], k, v,
                                           m.layers[static_cast<size_t>(l)], m.batch);
}

double load3(const TensorView& t, int64_t i, int64_t h, int64_t d) {
  return load_as_float(t.data, t.dtype, i * t.stride(0) + h * t.stride(1) + d * t.stride(2));
}

// Pool integrity of one layer: rows outside the new slots must equal the snapshot; new rows must
// dequantise to the new k/v within the KV dtype's tolerance.
void check_pool_layer(const HostMirror& m, const PreparedCase& pc, int l, Comparison* c) {
  const LayerData& ld = pc.layers[static_cast<size_t>(l)];
  const std::vector<TensorView> bufs = pool_buffers(*m.pool, l);
  std::vector<uint8_t> is_new(static_cast<size_t>(m.pool->rows()), 0);
  if (ld.save_kv_allowed) {
    for (int64_t slot : pc.out_cache_loc) is_new[static_cast<size_t>(slot)] = 1;
  }
  if (!pc.pool_snapshot.empty()) {
    const std::vector<uint8_t>& snap = pc.pool_snapshot[static_cast<size_t>(l)];
    size_t offset = 0;
    for (const TensorView& b : bufs) {
      const int64_t bytes = b.storage_bytes();
      const int64_t row_bytes = bytes / m.pool->rows();
      const auto* cur = static_cast<const uint8_t*>(b.data);
      for (int64_t row = 0; row < m.pool->rows(); ++row) {
        if (is_new[static_cast<size_t>(row)]) continue;
        if (std::memcmp(cur + row * row_bytes, snap.data() + offset + row * row_bytes,
                        static_cast<size_t>(row_bytes)) != 0) {
          ++c->pool_stray_writes;
        }
      }
      offset += static_cast<size_t>(bytes);
    }
  }
  if (!ld.save_kv_allowed) return;
  // New rows against the k/v the layer was given.
  const TensorView& k = m.k[static_cast<size_t>(l)];
  const TensorView& v = m.v[static_cast<size_t>(l)];
  const double tol = kv_roundtrip_tolerance(pc.spec.kv_dtype, pc.spec.q_dtype);
  const AttentionLayer& layer = ld.layer;
  const auto row_ok = [&](const TensorView& buf, const TensorView& scales, const TensorView& src,
                          int64_t t, int64_t h, int64_t dim, float scale) {
    double err = 0.0, norm = 0.0;
    for (int64_t d = 0; d < dim; ++d) {
      const double x = load3(src, t, h, d);
      const double y =
          load_kv_value_host(buf, scales, pc.out_cache_loc[static_cast<size_t>(t)], h, d, scale);
      if (!std::isfinite(y)) return false;
      err += (x - y) * (x - y);
      norm += x * x;
    }
    // Plus the absolute rounding of values in the dtype's subnormal range (at head_dim 1 one
    // fp8 value below half its smallest step rounds to 0: a 100% relative error).
    const double floor = kv_subnormal_half_step(pc.spec.kv_dtype) * std::fabs(scale) *
                         std::sqrt(static_cast<double>(dim));
    return std::sqrt(err) <= tol * std::sqrt(norm) + floor + std::numeric_limits<float>::min();
  };
  for (int64_t t = 0; t < pc.num_tokens; ++t) {
    if (m.pool->is_mla()) {
      if (!row_ok(bufs[0], bufs.size() > 1 ? bufs[1] : TensorView(), k, t, 0, k.size(2),
                  layer.k_scale)) {
        ++c->pool_bad_new_values;
      }
      continue;
    }
    const auto& mha = static_cast<const MHAKVPool&>(*m.pool);
    for (int64_t h = 0; h < k.size(1); ++h) {
      if (!row_ok(mha.k_buffer(l), mha.k_scale_buffer(l), k, t, h, k.size(2), layer.k_scale) ||
          !row_ok(mha.v_buffer(l), mha.v_scale_buffer(l), v, t, h, v.size(2), layer.v_scale)) {
        ++c->pool_bad_new_values;
      }
    }
  }
}

// seed mixing for per-layer streams (splitmix64 increment).
constexpr uint64_t kSeedStride = 0x9E3779B97F4A7C15ull;

}  // namespace

// ---------------------------------------------------------------------------------------------
// CaseSpec and the table

std::string CaseSpec::describe() const {
  std::ostringstream os;
  os << name << ": " << forward_mode_name(mode) << " bs " << batch_size() << " page " << page_size
     << " heads " << num_q_heads << "/" << num_kv_heads << " d " << head_dim << "/" << v_head_dim
     << " q " << dtype_name(q_dtype) << " kv " << dtype_name(kv_dtype) << " prefix ["
     << join(prefix_lens, ",") << "]";
  if (mode != ForwardMode::kTargetVerify) os << " new [" << join(new_lens, ",") << "]";
  if (sliding_window >= 0) os << " window " << sliding_window;
  if (logit_cap > 0.f) os << " softcap " << logit_cap;
  if (sinks) os << " sinks";
  if (type == AttentionType::kEncoderOnly) os << " bidirectional";
  if (cross_attention) os << " cross (encoder [" << join(encoder_lens, ",") << "])";
  if (mode == ForwardMode::kTargetVerify || mode == ForwardMode::kDraftExtend) {
    os << " drafts " << spec_draft_tokens << " topk " << spec_topk;
  }
  if (mla) os << " mla " << kv_lora_rank << "+" << qk_rope_head_dim;
  if (!shuffle_pages) os << " contiguous";
  if (shared_prefix > 0) os << " shared " << shared_prefix;
  if (mla_prefix_chunk > 0) os << " prefix chunks of " << mla_prefix_chunk;
  if (v_mean != 0.f) os << " v_mean " << v_mean;
  if (fp8_q) os << " q in fp8_e4m3";
  return os.str();
}

void PrintTo(const CaseSpec& spec, std::ostream* os) { *os << spec.describe(); }

const std::vector<CaseSpec>& shared_case_table() {
  static const std::vector<CaseSpec> table = [] {
    std::vector<CaseSpec> t;
    const auto add = [&t](std::string name, ForwardMode mode, int page, std::vector<int> prefix,
                          std::vector<int> fresh) -> CaseSpec& {
      CaseSpec c;
      c.name = std::move(name);
      c.mode = mode;
      c.page_size = page;
      c.prefix_lens = std::move(prefix);
      c.new_lens = std::move(fresh);
      c.seed = 1000 + t.size();
      t.push_back(std::move(c));
      return t.back();
    };
    const auto heads = [](CaseSpec& c, int hq, int hkv, int d) {
      c.num_q_heads = hq;
      c.num_kv_heads = hkv;
      c.head_dim = d;
      c.v_head_dim = d;
    };
    const auto mla = [](CaseSpec& c, int hq, bool absorbed) {
      constexpr int kLora = 512, kRope = 64, kNope = 128, kV = 128;
      c.mla = true;
      c.kv_lora_rank = kLora;
      c.qk_rope_head_dim = kRope;
      c.num_q_heads = hq;
      c.num_kv_heads = absorbed ? 1 : hq;
      c.head_dim = absorbed ? kLora + kRope : kNope + kRope;
      c.v_head_dim = absorbed ? kLora : kV;
    };
    using M = ForwardMode;
    const std::vector<int> decode_prefix = {16, 0, 96, 1012};  // kv_len 17, 1, 97, 1013
    const std::vector<int> ones4 = {1, 1, 1, 1};

    // ---- extend: page sizes, ragged and odd lengths (kv_len % page != 0) ----
    add("extend_page1_gqa4", M::kExtend, 1, {0, 5, 17}, {7, 1, 33});
    add("extend_page16_ragged", M::kExtend, 16, {17, 0, 33}, {97, 5, 1});
    add("extend_page64_ragged", M::kExtend, 64, {64, 1, 0}, {17, 63, 40});
    add("extend_page128", M::kExtend, 128, {130, 0}, {5, 97});
    add("extend_page24_nonpow2", M::kExtend, 24, {25, 48, 0}, {23, 1, 50});
    add("extend_page16_contiguous", M::kExtend, 16, {20, 3}, {12, 30}).shuffle_pages = false;
    heads(add("extend_long_1013", M::kExtend, 16, {0}, {1013}), 4, 2, 64);
    // ---- head counts and dims ----
    heads(add("extend_group1_d64", M::kExtend, 16, {10, 3}, {20, 9}), 8, 8, 64);
    heads(add("extend_group8_d256", M::kExtend, 16, {9, 0}, {12, 17}), 16, 2, 256);
    heads(add("extend_mqa_d128", M::kExtend, 1, {21, 2}, {8, 13}), 8, 1, 128);
    // ---- features ----
    add("extend_window8_page16", M::kExtend, 16, {40, 3, 0}, {25, 10, 17}).sliding_window = 8;
    add("extend_softcap", M::kExtend, 16, {19, 0}, {14, 23}).logit_cap = 2.f;
    add("extend_sinks", M::kExtend, 16, {12, 0}, {9, 30}).sinks = true;
    add("extend_fp8_e4m3_kv", M::kExtend, 16, {33, 7}, {20, 9}).kv_dtype = DType::kFP8E4M3;
    add("extend_fp8_e5m2_kv", M::kExtend, 1, {33, 7}, {20, 9}).kv_dtype = DType::kFP8E5M2;
    add("extend_fp4_kv", M::kExtend, 16, {40, 0}, {17, 12}).kv_dtype = DType::kFP4E2M1;
    {
      CaseSpec& c = add("extend_f16", M::kExtend, 16, {13, 2}, {19, 6});
      c.q_dtype = c.kv_dtype = DType::kF16;
    }
    {
      CaseSpec& c = add("extend_f32", M::kExtend, 1, {13, 2}, {19, 6});
      c.q_dtype = c.kv_dtype = DType::kF32;
    }
    add("extend_encoder_bidirectional", M::kExtend, 1, {0, 0}, {19, 7}).type =
        AttentionType::kEncoderOnly;
    {
      CaseSpec& c = add("extend_cross_attention", M::kExtend, 16, {0, 5}, {7, 3});
      c.cross_attention = true;
      c.encoder_lens = {13, 30};
    }
    // ---- mixed (chunked prefill + decode rows; kv_len 0 and 1 inside the batch) ----
    add("mixed_page16", M::kMixed, 16, {0, 1, 0, 30, 45}, {20, 1, 1, 1, 7});
    add("mixed_page1_window", M::kMixed, 1, {0, 1, 37, 12}, {9, 1, 1, 5}).sliding_window = 16;
    {
      CaseSpec& c = add("draft_extend_page1", M::kDraftExtend, 1, {10, 20}, {4, 4});
      c.spec_draft_tokens = 4;
      c.spec_topk = 1;
    }
    // ---- decode ----
    add("decode_page1", M::kDecode, 1, decode_prefix, ones4);
    add("decode_page16", M::kDecode, 16, decode_prefix, ones4);
    add("decode_page64", M::kDecode, 64, decode_prefix, ones4);
    add("decode_page128", M::kDecode, 128, decode_prefix, ones4);
    add("decode_page24_nonpow2", M::kDecode, 24, decode_prefix, ones4);
    heads(add("decode_group1_d64", M::kDecode, 16, decode_prefix, ones4), 8, 8, 64);
    heads(add("decode_group8_d256", M::kDecode, 16, decode_prefix, ones4), 16, 2, 256);
    heads(add("decode_mqa_d128", M::kDecode, 64, decode_prefix, ones4), 8, 1, 128);
    add("decode_window32", M::kDecode, 16, decode_prefix, ones4).sliding_window = 32;
    add("decode_softcap", M::kDecode, 16, decode_prefix, ones4).logit_cap = 2.f;
    add("decode_sinks", M::kDecode, 16, decode_prefix, ones4).sinks = true;
    add("decode_fp8_e4m3_kv", M::kDecode, 16, decode_prefix, ones4).kv_dtype = DType::kFP8E4M3;
    add("decode_fp8_e5m2_kv", M::kDecode, 16, decode_prefix, ones4).kv_dtype = DType::kFP8E5M2;
    add("decode_fp8_e4m3_page64", M::kDecode, 64, decode_prefix, ones4).kv_dtype = DType::kFP8E4M3;
    add("decode_fp4_kv", M::kDecode, 16, decode_prefix, ones4).kv_dtype = DType::kFP4E2M1;
    {
      CaseSpec& c = add("decode_f16", M::kDecode, 16, decode_prefix, ones4);
      c.q_dtype = c.kv_dtype = DType::kF16;
    }
    {
      CaseSpec& c = add("decode_f32", M::kDecode, 1, decode_prefix, ones4);
      c.q_dtype = c.kv_dtype = DType::kF32;
    }
    {
      CaseSpec& c = add("decode_cross_attention", M::kDecode, 16, {4, 0, 20}, {1, 1, 1});
      c.cross_attention = true;
      c.encoder_lens = {30, 17, 1};
    }
    {
      std::vector<int> prefix(16);
      for (size_t i = 0; i < prefix.size(); ++i) prefix[i] = static_cast<int>(37 * i % 211);
      add("decode_batch16_page16", M::kDecode, 16, prefix, std::vector<int>(16, 1));
    }
    // ---- speculative verify (tree masks) ----
    const auto verify = [&](std::string name, int page, std::vector<int> prefix, int n,
                            int topk) -> CaseSpec& {
      CaseSpec& c = add(std::move(name), M::kTargetVerify, page, std::move(prefix), {});
      c.spec_draft_tokens = n;
      c.spec_topk = topk;
      return c;
    };
    verify("verify_topk1_page1", 1, {10, 33}, 4, 1);
    verify("verify_topk1_page16", 16, {10, 33, 1}, 5, 1);
    verify("verify_topk4_page1", 1, {15, 40, 1}, 8, 4);
    verify("verify_topk4_page16", 16, {15, 40}, 6, 4);
    // ---- MLA ----
    mla(add("mla_decode_page1", M::kDecode, 1, {0, 40, 200}, {1, 1, 1}), 16, true);
    mla(add("mla_decode_page64", M::kDecode, 64, {63, 130, 1012}, {1, 1, 1}), 16, true);
    mla(add("mla_decode_page128", M::kDecode, 128, {127, 300}, {1, 1}), 16, true);
    {
      CaseSpec& c = add("mla_decode_fp8_e4m3_page64", M::kDecode, 64, {63, 130}, {1, 1});
      mla(c, 16, true);
      c.kv_dtype = DType::kFP8E4M3;
    }
    {
      CaseSpec& c = add("mla_decode_fp4_page64", M::kDecode, 64, {63, 130}, {1, 1});
      mla(c, 16, true);
      c.kv_dtype = DType::kFP4E2M1;
    }
    mla(add("mla_extend_absorbed_page1", M::kExtend, 1, {20, 0}, {5, 9}), 16, true);
    mla(add("mla_prefill_192_128", M::kExtend, 64, {0, 0}, {37, 64}), 16, false);
    mla(verify("mla_verify_topk1_page1", 1, {12, 30}, 3, 1), 16, true);
    mla(verify("mla_verify_topk4_page1", 1, {12, 30}, 6, 4), 16, true);
    // ---- long extends: several query and key tiles per request (appended: earlier seeds keep) --
    heads(add("extend_long_prefix_d128", M::kExtend, 16, {150, 0}, {300, 160}), 8, 2, 128);
    heads(add("extend_long_d256", M::kExtend, 16, {70}, {300}), 8, 2, 256);
    heads(add("extend_d80", M::kExtend, 16, {21, 0}, {40, 9}), 4, 2, 80);
    heads(add("extend_d96", M::kExtend, 1, {5, 30}, {33, 17}), 4, 2, 96);
    {
      CaseSpec& c = add("extend_long_window_softcap", M::kExtend, 16, {200, 0}, {333, 150});
      c.sliding_window = 100;
      c.logit_cap = 5.f;
    }
    // 128 heads (two 64-row tiles per request), long uneven lengths (split-KV + combine), the
    // multi-token verify chain on a page-64 pool and an fp8 page-128 cache.
    mla(add("mla_decode_h128_page64", M::kDecode, 64, {1500, 63, 700}, {1, 1, 1}), 128, true);
    mla(verify("mla_verify_topk1_page64", 64, {70, 200, 1}, 2, 1), 16, true);
    {
      CaseSpec& c = add("mla_decode_fp8_e4m3_h128_page128", M::kDecode, 128, {900, 5}, {1, 1});
      mla(c, 128, true);
      c.kv_dtype = DType::kFP8E4M3;
    }
    // Absorbed MLA extend over quantised latent caches (`flashmla` / `cutlass_mla` decode fp8 on
    // their engines and send extend to the portable kernels; fp4 is portable throughout).
    {
      CaseSpec& c = add("mla_extend_fp8_e4m3_page64", M::kExtend, 64, {70, 0, 130}, {9, 33, 1});
      mla(c, 16, true);
      c.kv_dtype = DType::kFP8E4M3;
    }
    {
      CaseSpec& c = add("mla_extend_fp4_page64", M::kExtend, 64, {70, 0}, {9, 33});
      mla(c, 16, true);
      c.kv_dtype = DType::kFP4E2M1;
    }
    {
      CaseSpec& c = add("mla_extend_fp8_e4m3_page128", M::kExtend, 128, {200, 5}, {17, 4});
      mla(c, 16, true);
      c.kv_dtype = DType::kFP8E4M3;
    }
    // MLA chunked prefix cache (192/128 prefill over a cached prefix): long prefixes over many
    // chunks (9 at page 1), fp8 latent rows (4), one chunk (page 128); fp4 latent rows below.
    {
      CaseSpec& c = add("mla_prefill_prefix_chunks_page1", M::kExtend, 1, {700, 0, 1500, 63},
                        {40, 17, 64, 5});
      mla(c, 16, false);
      c.mla_prefix_chunk = 256;
    }
    {
      CaseSpec& c =
          add("mla_prefill_prefix_chunks_page64_fp8", M::kExtend, 64, {1000, 130}, {24, 50});
      mla(c, 16, false);
      c.kv_dtype = DType::kFP8E4M3;
      c.mla_prefix_chunk = 300;
    }
    {
      CaseSpec& c =
          add("mla_prefill_prefix_one_chunk_page128", M::kExtend, 128, {900, 257, 0}, {16, 31, 9});
      mla(c, 16, false);
      c.mla_prefix_chunk = 4096;
    }
    {  // 192/128 prefill of a model whose latent cache is fp8 (the layer reads no pool rows)
      CaseSpec& c = add("mla_prefill_192_128_fp8_pool", M::kExtend, 64, {0, 0}, {37, 64});
      mla(c, 16, false);
      c.kv_dtype = DType::kFP8E4M3;
    }
    // (appended: earlier seeds keep) MLA chunked prefix cache over fp4 latent rows (3 chunks).
    {
      CaseSpec& c =
          add("mla_prefill_prefix_chunks_page64_fp4", M::kExtend, 64, {700, 129}, {24, 50});
      mla(c, 16, false);
      c.kv_dtype = DType::kFP4E2M1;
      c.mla_prefix_chunk = 400;
    }
    // (appended: earlier seeds keep) Cells of the matrix no case reached: decode and verify at
    // head dims 80 / 96 (compiled decode kernels that only the extend cases had run), draft
    // extend over pages and over an MLA latent cache, and an fp4 latent cache at page 128 (the
    // only page cutlass_mla takes; the fp4 MLA cases above are page 64).
    heads(add("decode_d80", M::kDecode, 16, decode_prefix, ones4), 4, 2, 80);
    heads(add("decode_d96", M::kDecode, 1, decode_prefix, ones4), 4, 2, 96);
    heads(verify("verify_topk1_page16_d80", 16, {10, 33}, 3, 1), 4, 2, 80);
    {
      CaseSpec& c = add("draft_extend_page16", M::kDraftExtend, 16, {10, 37, 1}, {4, 4, 4});
      c.spec_draft_tokens = 4;
      c.spec_topk = 1;
    }
    {
      CaseSpec& c = add("mla_draft_extend_page64", M::kDraftExtend, 64, {70, 12}, {3, 3});
      mla(c, 16, true);
      c.spec_draft_tokens = 3;
      c.spec_topk = 1;
    }
    {
      CaseSpec& c = add("mla_decode_fp4_page128", M::kDecode, 128, {127, 300}, {1, 1});
      mla(c, 16, true);
      c.kv_dtype = DType::kFP4E2M1;
    }
    // (appended: earlier seeds keep) gpt-oss's layers: a sliding window and attention sinks
    // together, d 64 with GQA 8, in a prefill over a cached prefix (keys before the window, rows
    // whose window starts inside the prefix, a fresh request) and in decode.
    {
      CaseSpec& c = add("extend_window_sinks_d64", M::kExtend, 16, {70, 0, 5}, {40, 33, 1});
      heads(c, 16, 2, 64);
      c.sliding_window = 24;
      c.sinks = true;
    }
    {
      CaseSpec& c = add("decode_window_sinks_d64", M::kDecode, 16, decode_prefix, ones4);
      heads(c, 16, 2, 64);
      c.sliding_window = 24;
      c.sinks = true;
    }
    // (appended: earlier seeds keep) A window past every length, INT32_MAX (the API accepts it):
    // it bounds nothing. The kernels' int32 position arithmetic (q + window + 1) overflowed on it
    // (bidirectional rows saw no key; fa3's wgmma kernel waited for blocks it never loaded) until
    // detail::kernel_sliding_window clipped it. Causal and bidirectional extend, decode.
    add("extend_window_int32_max", M::kExtend, 16, {40, 3, 0}, {25, 10, 200}).sliding_window =
        std::numeric_limits<int>::max();
    {
      CaseSpec& c = add("encoder_window_int32_max", M::kExtend, 16, {0, 0}, {150, 7});
      c.type = AttentionType::kEncoderOnly;
      c.sliding_window = std::numeric_limits<int>::max();
    }
    add("decode_window_int32_max", M::kDecode, 16, decode_prefix, ones4).sliding_window =
        std::numeric_limits<int>::max();
    return t;
  }();
  return table;
}

const CaseSpec* find_case(std::string_view name) {
  for (const CaseSpec& c : shared_case_table()) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

CaseSpec make_uniform_case(std::string name, ForwardMode mode, int batch_size, int prefix_len,
                           int new_len, int num_q_heads, int num_kv_heads, int head_dim,
                           int page_size, DType q_dtype, DType kv_dtype) {
  CaseSpec c;
  c.name = std::move(name);
  c.mode = mode;
  c.page_size = page_size;
  c.prefix_lens.assign(static_cast<size_t>(batch_size), prefix_len);
  c.new_lens.assign(static_cast<size_t>(batch_size), mode == ForwardMode::kDecode ? 1 : new_len);
  c.num_q_heads = num_q_heads;
  c.num_kv_heads = num_kv_heads;
  c.head_dim = head_dim;
  c.v_head_dim = head_dim;
  c.q_dtype = q_dtype;
  c.kv_dtype = kv_dtype;
  c.seed = 1;
  return c;
}

// ---------------------------------------------------------------------------------------------
// prepare_case

BackendContext PreparedCase::context() const {
  BackendContext ctx;
  ctx.device = device;
  ctx.num_q_heads = spec.num_q_heads;
  ctx.num_kv_heads = spec.num_kv_heads;
  ctx.qk_head_dim = spec.head_dim;
  ctx.v_head_dim = spec.v_head_dim;
  ctx.is_mla = spec.mla;
  ctx.kv_lora_rank = spec.kv_lora_rank;
  ctx.qk_rope_head_dim = spec.qk_rope_head_dim;
  ctx.q_dtype = spec.q_dtype;
  ctx.page_size = spec.page_size;
  ctx.max_batch_size = spec.batch_size();
  ctx.max_context_len = req_to_token ? req_to_token->max_context_len() : 0;
  ctx.num_layers = options.num_layers;
  ctx.req_to_token_pool = req_to_token.get();
  ctx.kv_pool = kv_pool.get();
  ctx.speculative_num_draft_tokens = spec.spec_draft_tokens;
  ctx.speculative_topk = spec.spec_topk;
  ctx.mla_prefix_chunk_tokens = spec.mla_prefix_chunk;
  // The harness writes page tables and plans by host copies, never by a kernel right before a
  // forward, so the SM90 decode may read them before its wait on the previous kernel (unless the
  // options ask for the library default).
  ctx.early_page_table_reads = options.early_page_table_reads;
  return ctx;
}

namespace {

// prepare_case without its guard: host containers may throw std::bad_alloc for a case too large
// for this machine.
Result<PreparedCase> prepare_case_unguarded(const CaseSpec& spec, Device device,
                                            const PrepareOptions& options) {
  PreparedCase pc;
  pc.spec = spec;
  pc.options = options;
  pc.device = device;
  std::mt19937_64 rng(spec.seed);
  const int bs = spec.batch_size();
  const int ps = spec.page_size;
  const bool verify = spec.mode == ForwardMode::kTargetVerify;
  const bool mla_prefill = spec.mla_prefill();

  // Per-request lengths.
  std::vector<int32_t> enc(bs), prefix(bs), fresh(bs), seq(bs);
  std::vector<int64_t> row_len(bs);
  for (int r = 0; r < bs; ++r) {
    const auto i = static_cast<size_t>(r);
    enc[i] = spec.cross_attention ? spec.encoder_lens[i] : 0;
    prefix[i] = spec.prefix_lens[i];
    fresh[i] = verify ? spec.spec_draft_tokens : spec.new_lens[i];
    seq[i] = verify ? prefix[i] : prefix[i] + fresh[i];
    row_len[i] = enc[i] + prefix[i] + fresh[i];
    pc.kv_lens.push_back(prefix[i] + fresh[i]);
  }
  pc.num_tokens = std::accumulate(fresh.begin(), fresh.end(), 0);

  // Pages: every request owns whole pages; spare pages stay allocated but unused.
  int64_t needed = 0;
  for (int64_t len : row_len) needed += (len + ps - 1) / ps;
  const int64_t num_pages = std::max<int64_t>(needed + options.spare_pages, 1);
  // The KV pool's shape follows from the lengths alone (prepare_case checked that the case fits
  // the host before calling this).
  KVPoolConfig cfg;
  cfg.num_layers = options.num_layers;
  cfg.size = num_pages * ps;
  cfg.page_size = ps;
  cfg.dtype = spec.kv_dtype;
  cfg.device = device;
  if (spec.mla) {
    cfg.num_kv_heads = 1;
    cfg.kv_lora_rank = spec.kv_lora_rank;
    cfg.qk_rope_head_dim = spec.qk_rope_head_dim;
  } else {
    cfg.num_kv_heads = spec.num_kv_heads;
    cfg.head_dim = spec.head_dim;
    cfg.v_head_dim = spec.v_head_dim;
  }
  pc.allocator = std::make_unique<PageAllocator>(num_pages, ps);
  ATTNKIT_ASSIGN_OR_RETURN(std::vector<int64_t> pages, pc.allocator->alloc_pages(num_pages));
  if (spec.shuffle_pages) {
    std::shuffle(pages.begin(), pages.end(), rng);
  } else {
    std::sort(pages.begin(), pages.end());
  }
  std::vector<std::vector<int64_t>> slots(bs);
  size_t next_page = 0;
  for (int r = 0; r < bs; ++r) {
    auto& s = slots[static_cast<size_t>(r)];
    s.reserve(static_cast<size_t>(row_len[static_cast<size_t>(r)]));  // as host_footprint counts
    for (int64_t j = 0; j < row_len[static_cast<size_t>(r)]; ++j) {
      if (j % ps == 0) ++next_page;
      s.push_back(pages[next_page - 1] * ps + j % ps);
    }
  }
  // Shared prefix: the other requests point at request 0's pages (their own stay unused).
  for (int r = 1; r < bs; ++r) {
    std::copy_n(slots[0].begin(), spec.shared_prefix, slots[static_cast<size_t>(r)].begin());
  }

  // Request table.
  const int64_t max_row = *std::max_element(row_len.begin(), row_len.end());
  const int max_context = static_cast<int>(((max_row + ps - 1) / ps + 1) * ps);
  const int max_reqs = bs + kSpareRequestRows;
  ATTNKIT_ASSIGN_OR_RETURN(pc.req_to_token, ReqToTokenPool::create(max_reqs, max_context, device));
  std::vector<int32_t> rows;
  for (int i = 0; i < max_reqs; ++i) {
    ATTNKIT_ASSIGN_OR_RETURN(int row, pc.req_to_token->alloc());
    rows.push_back(row);
  }
  if (spec.shuffle_pages) {
    std::shuffle(rows.begin(), rows.end(), rng);
  } else {
    std::sort(rows.begin(), rows.end());
  }
  rows.resize(static_cast<size_t>(bs));
  pc.rows = rows;
  for (int r = 0; r < bs; ++r) {
    ATTNKIT_RETURN_IF_ERROR(
        pc.req_to_token->write(rows[static_cast<size_t>(r)], 0, slots[static_cast<size_t>(r)]));
  }

  // KV pool (its size was checked above), poisoned with NaN.
  ATTNKIT_ASSIGN_OR_RETURN(pc.kv_pool, create_pool(cfg, spec.mla));
  if (options.poison) {
    for (int l = 0; l < options.num_layers; ++l) {
      for (const TensorView& b : pool_buffers(*pc.kv_pool, l)) {
        ATTNKIT_RETURN_IF_ERROR(fill_float(b, kNaN));
      }
    }
  }
  const int64_t row_dim = spec.mla ? spec.kv_lora_rank + spec.qk_rope_head_dim : 0;
  const int64_t hist_heads = spec.mla ? 1 : spec.num_kv_heads;
  const int64_t hist_k_dim = spec.mla ? row_dim : spec.head_dim;

  // History slots: encoder tokens and the cached decoder prefix of every request.
  // Each history slot is written once: the shared prefix by request 0 only.
  std::vector<int64_t> hist_slots;
  for (int r = 0; r < bs; ++r) {
    const auto& s = slots[static_cast<size_t>(r)];
    const int skip = r > 0 ? spec.shared_prefix : 0;
    hist_slots.insert(hist_slots.end(), s.begin() + skip,
                      s.begin() + enc[static_cast<size_t>(r)] + prefix[static_cast<size_t>(r)]);
  }
  for (int r = 0; r < bs; ++r) {
    const auto i = static_cast<size_t>(r);
    for (int j = 0; j < fresh[i]; ++j) {
      pc.out_cache_loc.push_back(slots[i][static_cast<size_t>(enc[i] + prefix[i] + j)]);
    }
  }
  const int64_t n_hist = static_cast<int64_t>(hist_slots.size());
  const int64_t t = pc.num_tokens;
  ATTNKIT_ASSIGN_OR_RETURN(TensorView hist_loc,
                           upload(pc.storage, device, DType::kI64, hist_slots));

  // Layers.
  const bool quantised = dtype_is_quantized(spec.kv_dtype);
  for (int l = 0; l < options.num_layers; ++l) {
    std::mt19937_64 lrng(spec.seed + kSeedStride * static_cast<uint64_t>(l + 1));
    // Benchmarks draw their (large) inputs from the counter-based generator, seeded from lrng.
    auto normals = [&](int64_t n, float mean = 0.f) {
      return options.fast_inputs ? fast_normal_values(lrng(), n, mean)
                                 : normal_values(lrng, n, mean);
    };
    LayerData ld;
    AttentionLayer& layer = ld.layer;
    layer.layer_id = l;
    layer.num_q_heads = spec.num_q_heads;
    layer.num_kv_heads = spec.num_kv_heads;
    layer.qk_head_dim = spec.head_dim;
    layer.v_head_dim = spec.v_head_dim;
    layer.scaling = 1.f / std::sqrt(static_cast<float>(spec.head_dim));
    layer.logit_cap = spec.logit_cap;
    layer.sliding_window = spec.sliding_window;
    layer.type = spec.type;
    layer.is_cross_attention = spec.cross_attention && l % 2 == 1;
    layer.is_mla = spec.mla;
    layer.kv_lora_rank = spec.kv_lora_rank;
    layer.qk_rope_head_dim = spec.qk_rope_head_dim;
    if (quantised) {
      // Distinct non-unit scales per layer exercise the scale folding.
      layer.k_scale = 0.5f + 0.25f * static_cast<float>(l);
      layer.v_scale = spec.mla ? layer.k_scale : 0.75f + 0.5f * static_cast<float>(l);
    }
    if (spec.sinks) {
      ATTNKIT_ASSIGN_OR_RETURN(layer.sinks,
                               upload_floats(pc.storage, device, DType::kF32, {spec.num_q_heads},
                                             normals(spec.num_q_heads, 1.f)));
    }
    ld.save_kv_allowed = !layer.is_cross_attention && !mla_prefill;
    if (spec.mla_prefix_chunk > 0) {
      if (pc.mla_prefix == nullptr) {
        pc.mla_prefix = std::make_unique<MlaPrefixDecompressor>(
            make_test_mla_prefix_decompressor(spec.mla_prefix_chunk, spec.kv_lora_rank));
      }
      layer.mla_prefix = pc.mla_prefix.get();
    }

    // History K/V (f32 source; the pool quantises).
    if (n_hist > 0) {
      ATTNKIT_ASSIGN_OR_RETURN(
          TensorView hk,
          upload_floats(pc.storage, device, DType::kF32, {n_hist, hist_heads, hist_k_dim},
                        normals(n_hist * hist_heads * hist_k_dim)));
      TensorView hv;
      if (!spec.mla) {
        ATTNKIT_ASSIGN_OR_RETURN(
            hv,
            upload_floats(pc.storage, device, DType::kF32, {n_hist, hist_heads, spec.v_head_dim},
                          normals(n_hist * hist_heads * spec.v_head_dim, spec.v_mean)));
      }
      ATTNKIT_RETURN_IF_ERROR(
          pc.kv_pool->set_kv(l, hist_loc, hk, hv, layer.k_scale, layer.v_scale, nullptr));
    }

    // New tokens (fp8_q: q stored as e4m3 with the layer's scale, amax / 448).
    std::vector<float> qvals = normals(t * spec.num_q_heads * spec.head_dim);
    if (spec.fp8_q) {
      float amax = 0.f;
      for (float x : qvals) amax = std::max(amax, std::fabs(x));
      layer.q_scale = amax > 0.f ? amax / 448.f : 1.f;
      for (float& x : qvals) x /= layer.q_scale;
    }
    ATTNKIT_ASSIGN_OR_RETURN(
        ld.q, upload_floats(pc.storage, device, spec.fp8_q ? DType::kFP8E4M3 : spec.q_dtype,
                            {t, spec.num_q_heads, spec.head_dim}, qvals));
    const std::vector<float> kvals = normals(t * spec.num_kv_heads * spec.head_dim);
    ATTNKIT_ASSIGN_OR_RETURN(ld.k, upload_floats(pc.storage, device, spec.q_dtype,
                                                 {t, spec.num_kv_heads, spec.head_dim}, kvals));
    std::vector<float> vvals;
    if (spec.mla_absorbed()) {  // V = the first kv_lora_rank columns of the row
      for (int64_t i = 0; i < t; ++i) {
        vvals.insert(vvals.end(), kvals.begin() + i * spec.head_dim,
                     kvals.begin() + i * spec.head_dim + spec.v_head_dim);
      }
    } else {
      vvals = normals(t * spec.num_kv_heads * spec.v_head_dim, spec.v_mean);
    }
    ATTNKIT_ASSIGN_OR_RETURN(ld.v, upload_floats(pc.storage, device, spec.q_dtype,
                                                 {t, spec.num_kv_heads, spec.v_head_dim}, vvals));
    ATTNKIT_ASSIGN_OR_RETURN(
        ld.out, output_with_canary(pc, spec.q_dtype, {t, spec.num_q_heads, spec.v_head_dim}));
    if (options.poison) ATTNKIT_RETURN_IF_ERROR(fill_float(ld.out, kNaN));
    if (options.request_lse) {
      ATTNKIT_ASSIGN_OR_RETURN(ld.lse, output_with_canary(pc, DType::kF32, {t, spec.num_q_heads}));
      if (options.poison) ATTNKIT_RETURN_IF_ERROR(fill_float(ld.lse, kNaN));
    }
    pc.layers.push_back(std::move(ld));
  }

  // Verify trees: random parents (topk 1: a chain), depth and the ancestry mask. The tree has its
  // own random stream so the data does not depend on shuffle_pages.
  std::mt19937_64 tree_rng(spec.seed ^ kSeedStride);
  std::vector<int64_t> positions;
  std::vector<uint8_t> mask;
  std::vector<int64_t> mask_indptr = {0};
  for (int r = 0; r < bs; ++r) {
    const auto i = static_cast<size_t>(r);
    if (!verify) {
      for (int j = 0; j < fresh[i]; ++j) positions.push_back(prefix[i] + j);
      continue;
    }
    const int n = spec.spec_draft_tokens;
    std::vector<int> parent(static_cast<size_t>(n), -1), depth(static_cast<size_t>(n), 0);
    for (int j = 1; j < n; ++j) {
      std::uniform_int_distribution<int> pick(0, j - 1);
      parent[static_cast<size_t>(j)] = spec.spec_topk == 1 ? j - 1 : pick(tree_rng);
      depth[static_cast<size_t>(j)] =
          depth[static_cast<size_t>(parent[static_cast<size_t>(j)])] + 1;
    }
    const int cols = prefix[i] + n;
    for (int j = 0; j < n; ++j) {
      std::vector<uint8_t> mrow(static_cast<size_t>(cols), 0);
      std::fill(mrow.begin(), mrow.begin() + prefix[i], 1);
      for (int a = j; a >= 0; a = parent[static_cast<size_t>(a)]) {
        mrow[static_cast<size_t>(prefix[i] + a)] = 1;
      }
      mask.insert(mask.end(), mrow.begin(), mrow.end());
      positions.push_back(prefix[i] + depth[static_cast<size_t>(j)]);
      pc.verify_depth.push_back(depth[static_cast<size_t>(j)]);
    }
    mask_indptr.push_back(static_cast<int64_t>(mask.size()));
  }

  // ForwardBatch.
  ForwardBatch& b = pc.batch;
  b.mode = spec.mode;
  b.batch_size = bs;
  b.num_tokens = static_cast<int>(t);
  b.req_pool_indices_host = rows;
  b.seq_lens_host = seq;
  b.seq_lens_sum = std::accumulate(seq.begin(), seq.end(), int64_t{0});
  ATTNKIT_ASSIGN_OR_RETURN(b.req_pool_indices, upload(pc.storage, device, DType::kI32, rows));
  ATTNKIT_ASSIGN_OR_RETURN(b.seq_lens, upload(pc.storage, device, DType::kI32, seq));
  ATTNKIT_ASSIGN_OR_RETURN(b.out_cache_loc,
                           upload(pc.storage, device, DType::kI64, pc.out_cache_loc));
  ATTNKIT_ASSIGN_OR_RETURN(b.positions, upload(pc.storage, device, DType::kI64, positions));
  if (spec.mode != ForwardMode::kDecode) {
    std::vector<int32_t> start(bs);
    std::exclusive_scan(fresh.begin(), fresh.end(), start.begin(), 0);
    b.extend_prefix_lens_host = prefix;
    b.extend_seq_lens_host = fresh;
    b.extend_start_loc_host = start;
    ATTNKIT_ASSIGN_OR_RETURN(b.extend_prefix_lens, upload(pc.storage, device, DType::kI32, prefix));
    ATTNKIT_ASSIGN_OR_RETURN(b.extend_seq_lens, upload(pc.storage, device, DType::kI32, fresh));
    ATTNKIT_ASSIGN_OR_RETURN(b.extend_start_loc, upload(pc.storage, device, DType::kI32, start));
  }
  if (spec.cross_attention) {
    b.encoder_lens_host = enc;
    ATTNKIT_ASSIGN_OR_RETURN(b.encoder_lens, upload(pc.storage, device, DType::kI32, enc));
  }
  if (verify || spec.mode == ForwardMode::kDraftExtend) {
    b.has_spec = true;
    b.spec.draft_token_num = spec.spec_draft_tokens;
    b.spec.topk = spec.spec_topk;
    b.spec.num_steps = std::max(spec.spec_draft_tokens - 1, 1);
  }
  if (verify) {
    ATTNKIT_ASSIGN_OR_RETURN(b.spec.custom_mask, upload(pc.storage, device, DType::kU8, mask));
    ATTNKIT_ASSIGN_OR_RETURN(b.spec.mask_indptr,
                             upload(pc.storage, device, DType::kI64, mask_indptr));
    b.spec.mask_indptr_host = mask_indptr;
  }
  b.req_to_token_pool = pc.req_to_token.get();
  b.kv_pool = pc.kv_pool.get();
  ATTNKIT_RETURN_IF_ERROR(b.validate());

  if (options.snapshot_pool) {
    for (int l = 0; l < options.num_layers; ++l) {
      std::vector<uint8_t> bytes;
      for (const TensorView& buf : pool_buffers(*pc.kv_pool, l)) {
        const size_t at = bytes.size();
        bytes.resize(at + static_cast<size_t>(buf.storage_bytes()));
        ATTNKIT_RETURN_IF_ERROR(
            copy_bytes(bytes.data() + at, Device::cpu(), buf.data, device, buf.storage_bytes()));
      }
      pc.pool_snapshot.push_back(std::move(bytes));
    }
  }
  return pc;
}

}  // namespace

Result<PreparedCase> prepare_case(const CaseSpec& spec, Device device,
                                  const PrepareOptions& options) {
  ATTNKIT_RETURN_IF_ERROR(check_spec(spec, options));
  // Before anything is allocated, on every device: the page list, slots and request table alone
  // are host vectors of one entry per token each.
  ATTNKIT_RETURN_IF_ERROR(check_host_footprint(spec, device, options, host_memory_available()));
  try {
    return prepare_case_unguarded(spec, device, options);
  } catch (const std::bad_alloc&) {
    return Status::out_of_memory(
        cat("case ", spec.name, ": host memory ran out while preparing it (", spec.batch_size(),
            " requests, ", options.num_layers, " layers)"));
  } catch (const std::length_error&) {
    return Status::out_of_memory(cat("case ", spec.name, ": a host array is longer than ",
                                     "std::vector allows (", spec.batch_size(), " requests, ",
                                     options.num_layers, " layers)"));
  }
}

// ---------------------------------------------------------------------------------------------
// run_backend

Status run_backend(AttentionBackend& backend, PreparedCase& pc, bool save_kv) {
  ATTNKIT_RETURN_IF_ERROR(backend.init_forward_metadata(pc.batch));
  const bool mla_prefill = pc.spec.mla_prefill();
  for (LayerData& ld : pc.layers) {
    const bool save = save_kv && ld.save_kv_allowed;
    if (!save && ld.save_kv_allowed) {
      ATTNKIT_RETURN_IF_ERROR(pc.kv_pool->set_kv(ld.layer.layer_id, pc.batch.out_cache_loc, ld.k,
                                                 ld.v, ld.layer.k_scale, ld.layer.v_scale,
                                                 nullptr));
    }
    const bool pass_kv = save || mla_prefill;
    ATTNKIT_RETURN_IF_ERROR(backend.forward(ld.q, pass_kv ? ld.k : TensorView(),
                                            pass_kv ? ld.v : TensorView(), ld.out, ld.layer,
                                            pc.batch, save, ld.lse));
  }
  // CUDA pools: report a set_kv write that the device slot guard skipped (one small copy + sync).
  // The backend writes on batch.stream, the runner's own set_kv above on the default stream:
  // check on both so that neither write can still be pending when the word is read.
  if (!pc.kv_pool) return Status::ok();
  ATTNKIT_RETURN_IF_ERROR(pc.kv_pool->check_device_errors(pc.batch.stream));
  return pc.batch.stream != nullptr ? pc.kv_pool->check_device_errors(nullptr) : Status::ok();
}

// ---------------------------------------------------------------------------------------------
// Comparison

double tolerance_for(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return 1e-2;
    case DType::kF16:
      return 3e-3;
    default:
      return 1e-4;
  }
}

bool Comparison::passed() const {
  return nan_inf_count == 0 && rel_l2 <= tolerance &&
         request_rel_l2 <= kRequestFactor * tolerance && max_abs <= max_abs_tolerance &&
         lse_max_abs <= lse_tolerance && pool_stray_writes == 0 && pool_bad_new_values == 0 &&
         canaries_damaged == 0;
}

void widen_tolerance(Comparison* c, double rel, double lse) {
  if (rel > c->tolerance && c->tolerance > 0.0) {
    c->max_abs_tolerance *= rel / c->tolerance;  // kMaxAbsFactor x max(1, max |ref|) x rel
    c->tolerance = rel;
  }
  if (std::isfinite(c->lse_tolerance)) c->lse_tolerance = std::max(c->lse_tolerance, lse);
}

void apply_backend_arithmetic(const AttentionBackend& backend, Comparison* c) {
#ifdef ATTNKIT_WITH_CUDA
  const Fa3Stats* fa3 = fa3_stats(backend);
  if (fa3 != nullptr && fa3->wgmma_fp8_calls > 0) {
    widen_tolerance(c, kFp8ArithmeticRelTolerance, kFp8ArithmeticLseTolerance);
  }
#else
  (void)backend, (void)c;  // fa3 exists in CUDA builds only
#endif
}

std::string Comparison::summary() const {
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "rel_l2 %.3e (tol %.1e) worst request %d %.3e (tol %.1e) max_abs %.3e (tol %.2e) "
                "lse %.3e (tol %.1e) nan/inf %lld "
                "pool stray rows %lld bad new rows %lld canaries damaged %lld worst layer %d",
                rel_l2, tolerance, worst_request, request_rel_l2, kRequestFactor * tolerance,
                max_abs, max_abs_tolerance, lse_max_abs, lse_tolerance,
                static_cast<long long>(nan_inf_count), static_cast<long long>(pool_stray_writes),
                static_cast<long long>(pool_bad_new_values),
                static_cast<long long>(canaries_damaged), worst_layer);
  return buf;
}

Result<ReferenceResult> reference_for_layer(const PreparedCase& prepared, int layer) {
  if (layer < 0 || layer >= static_cast<int>(prepared.layers.size())) {
    return Status::invalid_argument(
        cat("layer ", layer, " is outside [0, ", prepared.layers.size(), ")"));
  }
  ATTNKIT_ASSIGN_OR_RETURN(HostMirror m, make_host_mirror(prepared));
  ATTNKIT_ASSIGN_OR_RETURN(reference::ReferenceOutput ref, reference_of(m, prepared, layer));
  return ReferenceResult{std::move(ref.out), std::move(ref.lse)};
}

Result<Comparison> compare_with_reference(const PreparedCase& pc) {
  ATTNKIT_ASSIGN_OR_RETURN(HostMirror m, make_host_mirror(pc));
  Comparison c;
  c.tolerance = tolerance_for(pc.spec.q_dtype);
  c.lse_tolerance = pc.options.request_lse ? c.tolerance : kInf;
  double max_ref = 0.0;
  double worst_ratio = -1.0;
  // Rows of out per request, in batch order (decode 1, verify N drafts, extend its new tokens);
  // none known (the whole layer as one request) when an extend batch lacks its host lengths.
  const ForwardBatch& b = pc.batch;
  std::vector<int64_t> rows_per_request;
  const bool per_row_counts = b.mode == ForwardMode::kDecode ||
                              b.mode == ForwardMode::kTargetVerify ||
                              static_cast<int>(b.extend_seq_lens_host.size()) == b.batch_size;
  for (int r = 0; per_row_counts && r < b.batch_size; ++r) {
    rows_per_request.push_back(b.mode == ForwardMode::kDecode ? 1
                               : b.mode == ForwardMode::kTargetVerify
                                   ? b.spec.draft_token_num
                                   : b.extend_seq_lens_host[static_cast<size_t>(r)]);
  }
  for (int l = 0; l < static_cast<int>(pc.layers.size()); ++l) {
    ATTNKIT_ASSIGN_OR_RETURN(reference::ReferenceOutput ref, reference_of(m, pc, l));
    const TensorView& out = m.out[static_cast<size_t>(l)];
    const int64_t t = out.size(0), hq = out.size(1), dv = out.size(2);
    double err2 = 0.0, ref2 = 0.0, max_abs = 0.0;
    // Request by request (the last one takes any rows past the counts; none known: one request);
    // the layer's sums are the requests' sums.
    const int requests = std::max<int>(1, static_cast<int>(rows_per_request.size()));
    int64_t begin = 0;
    for (int r = 0; r < requests; ++r) {
      const int64_t end =
          r + 1 < requests ? std::min(t, begin + rows_per_request[static_cast<size_t>(r)]) : t;
      double request_err2 = 0.0, request_ref2 = 0.0;
      for (int64_t i = begin; i < end; ++i) {
        for (int64_t h = 0; h < hq; ++h) {
          for (int64_t d = 0; d < dv; ++d) {
            const double y = load3(out, i, h, d);
            const double x = ref.out[static_cast<size_t>((i * hq + h) * dv + d)];
            if (!std::isfinite(y)) {
              ++c.nan_inf_count;
              continue;
            }
            request_err2 += (y - x) * (y - x);
            request_ref2 += x * x;
            max_abs = std::max(max_abs, std::fabs(y - x));
            max_ref = std::max(max_ref, std::fabs(x));
          }
        }
      }
      const double request_rel =
          request_ref2 > 0.0 ? std::sqrt(request_err2 / request_ref2) : std::sqrt(request_err2);
      if (request_rel > c.request_rel_l2) {
        c.request_rel_l2 = request_rel;
        c.worst_request = r;
      }
      err2 += request_err2;
      ref2 += request_ref2;
      begin = end;
    }
    const double rel = ref2 > 0.0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
    c.max_abs = std::max(c.max_abs, max_abs);
    c.elements = t * hq * dv;
    if (rel / c.tolerance > worst_ratio) {
      worst_ratio = rel / c.tolerance;
      c.rel_l2 = rel;
      c.worst_layer = l;
    }
    const TensorView& lse = m.lse[static_cast<size_t>(l)];
    if (lse.defined()) {
      for (int64_t i = 0; i < t; ++i) {
        for (int64_t h = 0; h < hq; ++h) {
          const double y = lse.data_as<const float>()[i * lse.stride(0) + h * lse.stride(1)];
          const double x = ref.lse[static_cast<size_t>(i * hq + h)];
          if (std::isinf(x) && y == x) continue;  // no visible key on both sides
          if (!std::isfinite(y)) {
            ++c.nan_inf_count;
            continue;
          }
          c.lse_max_abs = std::max(c.lse_max_abs, std::fabs(y - x));
        }
      }
    }
    check_pool_layer(m, pc, l, &c);
  }
  c.max_abs_tolerance = kMaxAbsFactor * c.tolerance * std::max(1.0, max_ref);
  for (const PreparedCase::Canary& canary : pc.canaries) {
    std::vector<uint8_t> guard(static_cast<size_t>(canary.bytes));
    ATTNKIT_RETURN_IF_ERROR(
        copy_bytes(guard.data(), Device::cpu(), canary.at, pc.device, canary.bytes));
    if (std::any_of(guard.begin(), guard.end(), [](uint8_t x) { return x != kCanaryByte; })) {
      ++c.canaries_damaged;
    }
  }
  return c;
}

// ---------------------------------------------------------------------------------------------
// skip_reason / create

std::string skip_reason(const BackendDescriptor& d, const CaseSpec& spec,
                        const DeviceInfo& device) {
  if (!d.built) return d.name + " is not built: " + d.not_built_reason;
  if (!d.runs_on(device.platform)) {
    return d.name + " does not run on " + platform_name(device.platform) + " (" + device.name + ")";
  }
  if (device.platform == Platform::kCUDA) {
    if (device.compute_capability < d.min_compute_capability) {
      return cat(d.name, " needs compute capability >= ", d.min_compute_capability, ", device has ",
                 device.compute_capability);
    }
    if (d.max_compute_capability > 0 && device.compute_capability > d.max_compute_capability) {
      return cat(d.name, " supports compute capability <= ", d.max_compute_capability,
                 ", device has ", device.compute_capability);
    }
  }
  // An e4m3 q (fp8_q): only fa3's SM90 FP8 prefill takes one (the other backends and paths refuse
  // it by name), so the bench and the tests skip such cases elsewhere instead of failing them.
  if (spec.fp8_q &&
      (d.name != "fa3" || device.platform != Platform::kCUDA ||
       device.compute_capability / 10 != 9 || spec.kv_dtype != DType::kFP8E4M3 ||
       spec.q_dtype != DType::kBF16 || spec.head_dim != 128 || spec.v_head_dim != 128 || spec.mla ||
       spec.mode == ForwardMode::kDecode || spec.mode == ForwardMode::kTargetVerify ||
       spec.cross_attention || !env_flag("ATTNKIT_FA3_FP8", true))) {
    return "fp8_q (q in fp8_e4m3) runs only on fa3's SM90 FP8 prefill (an extend with an fp8_e4m3 "
           "pool, bf16 activations, head dim 128, no cross-attention; not with ATTNKIT_FA3_FP8=0)";
  }
  // A window / sinks / soft-cap with an e4m3 q: only on the FP8 plans with those instantiations
  // (fa3::fp8_plan_takes_variants; no other kernel takes an e4m3 q, so another plan refuses the
  // layer). The plan is the engine's: choose_fp8_variant_partitioned over the case's requests and
  // their partition (backend/small_extend.h) with the process's knobs.
  // (A forward with few new tokens per request runs on flashinfer's tiles, an e4m3 q widened to
  // bf16: those take every variant.)
  const int group = spec.num_q_heads / std::max(1, spec.num_kv_heads);
  const bool small_extend = detail::few_new_tokens_per_request(
      spec.mode, spec.new_lens, spec.cross_attention, group, detail::extend_decode_rows_from_env(),
      detail::wgmma_min_q_len_from_env());
  if (spec.fp8_q && !small_extend &&
      (spec.sliding_window >= 0 || spec.logit_cap != 0.f || spec.sinks)) {
    std::vector<fa3::TileRequest> reqs;
    int32_t start = 0;
    for (int r = 0; r < spec.batch_size(); ++r) {
      const auto i = static_cast<size_t>(r);
      const int32_t fresh = i < spec.new_lens.size() ? spec.new_lens[i] : 0;
      reqs.push_back({start, fresh, spec.prefix_lens[i] + fresh});
      start += fresh;
    }
    std::vector<uint8_t> partition;
    if (detail::extend_partition_from_env()) {
      partition = detail::extend_partition(spec.mode, spec.new_lens, spec.cross_attention, group,
                                           detail::extend_decode_rows_from_env(),
                                           detail::wgmma_min_q_len_from_env());
    }
    const fa3::Fp8Variant plan = fa3::choose_fp8_variant_partitioned(
        reqs, &partition, spec.num_kv_heads, fa3::fp8_knobs_from_env());
    if (!fa3::fp8_plan_takes_variants(plan)) {
      return cat(
          "fp8_q with a sliding window / sinks / soft-cap runs only on fa3's FP8 plans with "
          "those variants (fp8_plan_takes_variants); this forward's plan (block_m ",
          plan.block_m, ", block_n ", plan.block_n, ", vt_pre ", plan.vt_pre, ", spec ", plan.spec,
          ", promote ", plan.promote, ") has none (ATTNKIT_FA3_FP8_* knobs?)");
    }
  }
  if (spec.mode == ForwardMode::kDecode && !d.decode_role) {
    return d.name + " cannot serve decode";
  }
  if (spec.mode != ForwardMode::kDecode && !d.prefill_role) {
    return d.name + " cannot serve extend/prefill";
  }
  const FeatureRow* row = d.row(spec.kind());
  if (row == nullptr) {
    return d.name + " has no " + attention_kind_name(spec.kind()) + " support";
  }
  if (!row->pages.allows(spec.page_size)) {
    return cat(d.name, " does not support page_size ", spec.page_size, " (", row->pages.to_string(),
               ")");
  }
  if (dtype_is_fp8(spec.kv_dtype) && !row->fp8_kv) {
    return cat(d.name, " does not support ", dtype_name(spec.kv_dtype), " KV");
  }
  if (spec.kv_dtype == DType::kFP8E5M2 && row->fp8_e4m3_only) {
    return d.name + " serves fp8 KV only as fp8_e4m3 (selection sends fp8_e5m2 elsewhere)";
  }
  if (spec.kv_dtype == DType::kFP4E2M1 && !row->fp4_kv) {
    return d.name + " does not support fp4_e2m1 KV";
  }
  const bool spec_mode =
      spec.mode == ForwardMode::kTargetVerify || spec.mode == ForwardMode::kDraftExtend;
  if (spec_mode && spec.spec_topk <= 1 && !row->spec_topk1) {
    return d.name + " does not support speculative decoding (topk 1)";
  }
  if (spec_mode && spec.spec_topk > 1) {
    if (!row->spec_topk_gt1) return cat(d.name, " does not support spec topk ", spec.spec_topk);
    if (row->topk_gt1_needs_page1 && spec.page_size != 1) {
      return cat(d.name, " supports spec topk > 1 only with page_size 1, not ", spec.page_size);
    }
  }
  if (spec.sliding_window >= 0 && !row->sliding_window) {
    return d.name + " does not support sliding window attention";
  }
  if (spec.mla_prefix_chunk > 0 && !row->chunked_prefix_cache) {
    return d.name + " does not support the MLA chunked prefix cache";
  }
  if (spec.type == AttentionType::kEncoderOnly && !row->multimodal) {
    return d.name + " does not support bidirectional (encoder / multimodal) attention";
  }
  if (!row->head_dims.empty() && std::find(row->head_dims.begin(), row->head_dims.end(),
                                           spec.head_dim) == row->head_dims.end()) {
    return cat(d.name, " is not built for head_dim ", spec.head_dim, " (has ",
               join(row->head_dims, ","), ")");
  }
  return "";
}

Result<std::unique_ptr<AttentionBackend>> create_backend_for_case(
    const BackendDescriptor& descriptor, const PreparedCase& prepared) {
  if (!descriptor.create) {
    return Status::not_built(
        descriptor.name + " has no factory in this build" +
        (descriptor.not_built_reason.empty() ? std::string() : ": " + descriptor.not_built_reason));
  }
  // As BackendRegistry::create does: the factory probes and allocates on the current device.
  const DeviceScope scope(prepared.device);
  ATTNKIT_RETURN_IF_ERROR(scope.status());
  return descriptor.create(prepared.context());
}

// ---------------------------------------------------------------------------------------------
// Peers and merging

Result<ContiguousKV> make_contiguous_kv(const PreparedCase& pc, int layer, DType dtype,
                                        Device device) {
  if (layer < 0 || layer >= static_cast<int>(pc.layers.size())) {
    return Status::invalid_argument(
        cat("layer ", layer, " is outside [0, ", pc.layers.size(), ")"));
  }
  if (!dtype_is_activation(dtype)) {
    return Status::invalid_argument(cat("dtype ", dtype_name(dtype), " must be f32, f16 or bf16"));
  }
  ATTNKIT_ASSIGN_OR_RETURN(HostMirror m, make_host_mirror(pc));
  const AttentionLayer& al = pc.layers[static_cast<size_t>(layer)].layer;
  const int64_t hkv = pc.spec.mla ? 1 : pc.spec.num_kv_heads;
  const int64_t dk =
      pc.spec.mla ? pc.spec.kv_lora_rank + pc.spec.qk_rope_head_dim : pc.spec.head_dim;
  const int64_t dv = pc.spec.mla ? pc.spec.kv_lora_rank : pc.spec.v_head_dim;
  TensorView kbuf, kscale, vbuf, vscale;
  float v_scale = al.v_scale;
  if (m.pool->is_mla()) {
    const auto& mla = static_cast<const MLAKVPool&>(*m.pool);
    kbuf = vbuf = mla.kv_buffer(layer);
    kscale = vscale = mla.scale_buffer(layer);
    v_scale = al.k_scale;
  } else {
    const auto& mha = static_cast<const MHAKVPool&>(*m.pool);
    kbuf = mha.k_buffer(layer);
    kscale = mha.k_scale_buffer(layer);
    vbuf = mha.v_buffer(layer);
    vscale = mha.v_scale_buffer(layer);
  }
  ContiguousKV out;
  out.cu_seqlens_host = {0};
  std::vector<float> kv_k, kv_v;
  for (int r = 0; r < pc.spec.batch_size(); ++r) {
    const int32_t* row = m.batch.req_to_token_pool->host_row(pc.rows[static_cast<size_t>(r)]);
    const int64_t enc = pc.spec.cross_attention ? pc.spec.encoder_lens[static_cast<size_t>(r)] : 0;
    const int32_t len = pc.kv_lens[static_cast<size_t>(r)];
    for (int32_t j = 0; j < len; ++j) {
      const int64_t slot = row[enc + j];
      for (int64_t h = 0; h < hkv; ++h) {
        for (int64_t d = 0; d < dk; ++d) {
          kv_k.push_back(load_kv_value_host(kbuf, kscale, slot, h, d, al.k_scale));
        }
        for (int64_t d = 0; d < dv; ++d) {
          kv_v.push_back(load_kv_value_host(vbuf, vscale, slot, h, d, v_scale));
        }
      }
    }
    out.cu_seqlens_host.push_back(out.cu_seqlens_host.back() + len);
    out.max_seqlen = std::max(out.max_seqlen, len);
  }
  const int64_t total = out.cu_seqlens_host.back();
  std::vector<Buffer> storage;
  ATTNKIT_ASSIGN_OR_RETURN(out.k, upload_floats(storage, device, dtype, {total, hkv, dk}, kv_k));
  ATTNKIT_ASSIGN_OR_RETURN(out.v, upload_floats(storage, device, dtype, {total, hkv, dv}, kv_v));
  ATTNKIT_ASSIGN_OR_RETURN(out.cu_seqlens,
                           upload(storage, device, DType::kI32, out.cu_seqlens_host));
  out.k_storage = std::move(storage[0]);
  out.v_storage = std::move(storage[1]);
  out.cu_seqlens_storage = std::move(storage[2]);
  return out;
}

Status merge_attention_states(const TensorView& out_a, const TensorView& lse_a,
                              const TensorView& out_b, const TensorView& lse_b,
                              const TensorView& out, const TensorView& lse) {
  for (const auto& [tensor, name] :
       {std::pair{&out_a, "out_a"}, {&out_b, "out_b"}, {&out, "out"}}) {
    if (!tensor->defined() || tensor->ndim != 3 || !tensor->device.is_cpu() ||
        !dtype_is_float(tensor->dtype) || tensor->shape != out_a.shape) {
      return Status::invalid_argument(cat(name,
                                          ": expected a host float tensor [T, H, D] shaped "
                                          "like out_a ",
                                          out_a.describe(), ", got ", tensor->describe()));
    }
  }
  const int64_t t = out_a.size(0), h = out_a.size(1), d = out_a.size(2);
  for (const auto& [tensor, name] :
       {std::pair{&lse_a, "lse_a"}, {&lse_b, "lse_b"}, {&lse, "lse"}}) {
    if (!tensor->defined() || tensor->ndim != 2 || !tensor->device.is_cpu() ||
        tensor->dtype != DType::kF32 || tensor->size(0) != t || tensor->size(1) != h) {
      return Status::invalid_argument(
          cat(name, ": expected a host f32 tensor [", t, ", ", h, "], got ", tensor->describe()));
    }
  }
  const auto lse_at = [](const TensorView& x, int64_t i, int64_t j) -> float& {
    return x.data_as<float>()[i * x.stride(0) + j * x.stride(1)];
  };
  std::vector<double> a(static_cast<size_t>(d)), b(static_cast<size_t>(d));
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = 0; j < h; ++j) {
      const double la = lse_at(lse_a, i, j), lb = lse_at(lse_b, i, j);
      for (int64_t k = 0; k < d; ++k) {
        a[static_cast<size_t>(k)] = load3(out_a, i, j, k);
        b[static_cast<size_t>(k)] = load3(out_b, i, j, k);
      }
      const double mx = std::max(la, lb);
      double wa = 0.0, wb = 0.0, merged = -kInf;
      if (mx != -kInf) {
        const double sum = std::exp(la - mx) + std::exp(lb - mx);
        merged = mx + std::log(sum);
        wa = std::exp(la - merged);
        wb = std::exp(lb - merged);
      }
      for (int64_t k = 0; k < d; ++k) {
        const double v = wa * a[static_cast<size_t>(k)] + wb * b[static_cast<size_t>(k)];
        store_from_float(out.data, out.dtype,
                         i * out.stride(0) + j * out.stride(1) + k * out.stride(2),
                         static_cast<float>(v));
      }
      lse_at(lse, i, j) = static_cast<float>(merged);
    }
  }
  return Status::ok();
}

}  // namespace attnkit::harness
