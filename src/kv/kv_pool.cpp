// MHAKVPool and MLAKVPool: per-layer token-major buffers, config validation and set_kv (host
// scatter with quantisation; CUDA pools hand the scatter to detail::set_kv_cuda).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "attnkit/kv_cache.h"
#include "core/device_scope.h"
#include "core/str_cat.h"
#include "kv/kv_pool_config.h"
#include "kv/set_kv_cuda.h"

namespace attnkit {

namespace {

// Largest finite fp8_e4m3 value (S.1111.110) and its code.
constexpr uint8_t kE4M3MaxCode = 0x7E;
// Largest fp4_e2m1 magnitude; block scales map a group's amax onto it.
constexpr float kFp4Max = 6.0f;

std::string cfg_error(const char* field, int64_t value, const std::string& accepted) {
  return std::string("KVPoolConfig.") + field + " " + std::to_string(value) + " " + accepted;
}

bool is_kv_dtype(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
    case DType::kF16:
    case DType::kF32:
    case DType::kFP8E4M3:
    case DType::kFP8E5M2:
    case DType::kFP4E2M1:
      return true;
    default:
      return false;
  }
}

Status validate_common(const KVPoolConfig& c) {
  // kMaxPoolLayers: a garbage value fails here, not in the per-layer buffer vectors (an uncaught
  // std::bad_alloc) or by exhausting host memory.
  if (c.num_layers < 1 || c.num_layers > kMaxPoolLayers) {
    return Status::invalid_argument(cfg_error(
        "num_layers", c.num_layers, "must be in [1, " + std::to_string(kMaxPoolLayers) + "]"));
  }
  if (c.page_size < 1) {
    return Status::invalid_argument(cfg_error("page_size", c.page_size, "must be >= 1"));
  }
  if (c.size < 1 || c.size % c.page_size != 0) {
    return Status::invalid_argument(cfg_error(
        "size", c.size, "must be a positive multiple of page_size " + std::to_string(c.page_size)));
  }
  // The pool's rows (size + page_size: page 0 is the reserved dummy page) are int32 slots in
  // req_to_token and the kernels' index math.
  constexpr int64_t kMaxRows = std::numeric_limits<int32_t>::max();
  if (c.size > kMaxRows - c.page_size) {
    return Status::invalid_argument(cfg_error("size", c.size,
                                              "plus page_size " + std::to_string(c.page_size) +
                                                  " must be <= " + std::to_string(kMaxRows) +
                                                  " (KV slots are int32)"));
  }
  if (!is_kv_dtype(c.dtype)) {
    return Status::invalid_argument(std::string("KVPoolConfig.dtype ") + dtype_name(c.dtype) +
                                    " is not a KV cache dtype (bf16, f16, f32, fp8_e4m3, "
                                    "fp8_e5m2, fp4_e2m1)");
  }
  return Status::ok();
}

Status check_fp4_dim(const KVPoolConfig& c, const char* field, int64_t value) {
  if (c.dtype == DType::kFP4E2M1 && value % kFp4GroupSize != 0) {
    return Status::invalid_argument(cfg_error(
        field, value, "must be a multiple of " + std::to_string(kFp4GroupSize) + " for fp4_e2m1"));
  }
  return Status::ok();
}

// A buffer of rows x per_row values of `dtype` (`what` names the buffer in the error when that
// count would overflow); host memory is zeroed (device memory starts undefined).
Result<Buffer> allocate_kv(Device device, DType dtype, int64_t rows, int64_t per_row,
                           const char* what) {
  // At most 2^57 values: their bits (<= 64 each) and bytes stay within int64.
  constexpr int64_t kMaxValues = int64_t{1} << 57;
  if (per_row > 0 && rows > kMaxValues / per_row) {
    return Status::invalid_argument(std::string("KV pool ") + what + ": " + std::to_string(rows) +
                                    " rows x " + std::to_string(per_row) +
                                    " values per row exceed 2^57 values (num_kv_heads x head_dim "
                                    "and size are too large together)");
  }
  const int64_t numel = rows * per_row;
  const int64_t bytes = dtype_storage_bytes(dtype, numel);
  ATTNKIT_ASSIGN_OR_RETURN(Buffer buffer, Buffer::allocate(device, bytes));
  if (device.is_cpu()) std::memset(buffer.data(), 0, static_cast<size_t>(bytes));
  return buffer;
}

TensorView view_of(const Buffer& buffer, DType dtype, int64_t rows, int64_t heads, int64_t dim) {
  if (buffer.data() == nullptr) return TensorView();
  return TensorView(buffer.data(), dtype, buffer.device(), {rows, heads, dim});
}

// Checks loc (contiguous int64 [T] on `device`); returns T.
Result<int64_t> check_loc(const TensorView& loc, Device device) {
  ATTNKIT_RETURN_IF_ERROR(check_ndim(loc, "loc", 1, "[tokens]"));
  ATTNKIT_RETURN_IF_ERROR(check_dtype(loc, "loc", {DType::kI64}));
  ATTNKIT_RETURN_IF_ERROR(check_device(loc, "loc", device));
  ATTNKIT_RETURN_IF_ERROR(check_contiguous(loc, "loc"));
  if (loc.numel() > 0 && loc.data == nullptr) {
    return Status::invalid_argument("loc: " + loc.describe() + " has no data");
  }
  return loc.size(0);
}

Status check_src(const TensorView& t, const char* name, int64_t tokens, int64_t heads, int64_t dim,
                 Device device) {
  ATTNKIT_RETURN_IF_ERROR(check_ndim(t, name, 3, "[tokens, heads, dim]"));
  ATTNKIT_RETURN_IF_ERROR(check_dtype(t, name, {DType::kF32, DType::kF16, DType::kBF16}));
  ATTNKIT_RETURN_IF_ERROR(check_shape(t, name, {tokens, heads, dim}, "[tokens, heads, dim]"));
  ATTNKIT_RETURN_IF_ERROR(check_device(t, name, device));
  if (t.numel() > 0 && t.data == nullptr) {
    return Status::invalid_argument(std::string(name) + ": " + t.describe() + " has no data");
  }
  if (dim > 1 && t.numel() > 0 && t.stride(2) != 1) {  // (numpy: zero-size arrays have stride 0)
    return Status::invalid_argument(std::string(name) + ": innermost stride " +
                                    std::to_string(t.stride(2)) + " must be 1 (" + t.describe() +
                                    ")");
  }
  return Status::ok();
}

Status check_scale(float scale, const char* name) {
  if (!std::isfinite(scale) || scale <= 0.0f) {
    return Status::invalid_argument(std::string(name) + " " + std::to_string(scale) +
                                    " must be finite and > 0");
  }
  return Status::ok();
}

// Every slot must be a usable row: [page_size, rows). Page 0 is reserved for device dummy writes.
Status check_slots_host(const TensorView& loc, int64_t page_size, int64_t rows) {
  const int64_t* slots = loc.data_as<const int64_t>();
  for (int64_t t = 0; t < loc.size(0); ++t) {
    if (slots[t] < page_size || slots[t] >= rows) {
      return Status::invalid_argument("loc[" + std::to_string(t) +
                                      "] = " + std::to_string(slots[t]) +
                                      " is outside the usable slots [" + std::to_string(page_size) +
                                      ", " + std::to_string(rows) + ") (page 0 is reserved)");
    }
  }
  // Each new token needs its own slot: a repeated one would keep only the later token's row.
  std::vector<std::pair<int64_t, int64_t>> by_slot(static_cast<size_t>(loc.size(0)));
  for (int64_t t = 0; t < loc.size(0); ++t) by_slot[static_cast<size_t>(t)] = {slots[t], t};
  std::sort(by_slot.begin(), by_slot.end());
  for (size_t i = 1; i < by_slot.size(); ++i) {
    if (by_slot[i].first == by_slot[i - 1].first) {
      return Status::invalid_argument(
          "loc[" + std::to_string(by_slot[i].second) + "] = " + std::to_string(by_slot[i].first) +
          " repeats loc[" + std::to_string(by_slot[i - 1].second) +
          "] (each new token needs its own slot; the earlier token's k/v would be lost)");
    }
  }
  return Status::ok();
}

// set_kv's sources (k, v, loc) must not share bytes with the buffers it writes: the scatter would
// read rows it had already overwritten (k[7:11] written to slots 8..11 came out [3, 3, 3, 3], and a
// swap lost a row). Other buffers of the pool (another layer's) are fine to read.
Status check_sources_apart(std::initializer_list<std::pair<const TensorView*, const char*>> sources,
                           std::initializer_list<std::pair<TensorView, const char*>> written,
                           int layer) {
  for (const auto& [src, name] : sources) {
    for (const auto& [dst, dst_name] : written) {
      if (src->overlaps(dst)) {
        return Status::invalid_argument(cat("set_kv ", name, " ", src->describe(),
                                            " overlaps the pool's ", dst_name, "[", layer,
                                            "] buffer it writes: copy it out of the pool first"));
      }
    }
  }
  return Status::ok();
}

// The slot checks, once per set_kv and before anything is written (a check between the K and the
// V scatter could refuse the call with K already written): every slot on CPU pools; on CUDA pools
// only with ATTNKIT_CHECK_INDICES=1 (otherwise the device guard skips and records bad slots).
Status check_slots(const TensorView& loc, int64_t page_size, int64_t rows, StreamHandle stream) {
  if (loc.device.is_cpu()) return check_slots_host(loc, page_size, rows);
#ifdef ATTNKIT_WITH_CUDA
  return detail::check_slots_cuda(loc, rows, stream);
#else
  (void)stream;
  return Status::ok();  // the scatter reports kNotBuilt
#endif
}

// Host scatter of src [T, H, D] into dst [rows, H, D] at loc, quantising to dst.dtype.
void scatter_host(const TensorView& dst, const TensorView& dst_scales, const TensorView& loc,
                  const TensorView& src, float scale) {
  const int64_t tokens = src.size(0);
  const int64_t heads = src.size(1);
  const int64_t dim = src.size(2);
  const int64_t* slots = loc.data_as<const int64_t>();
  const DType dtype = dst.dtype;
  const bool fp8 = dtype_is_fp8(dtype);
  const int64_t rows = dst.size(0);
  for (int64_t t = 0; t < tokens; ++t) {
    // Each slot is read once and bounded where it is used: check_slots read the caller's array
    // before, and a caller thread that changed it since (a zero-copy Python array) must not make
    // this write outside the pool. Such a token is skipped, as the CUDA scatter skips it.
    const int64_t slot = *static_cast<const volatile int64_t*>(&slots[t]);
    if (slot < 0 || slot >= rows) continue;
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t src_row = t * src.stride(0) + h * src.stride(1);
      const int64_t dst_row = slot * dst.stride(0) + h * dst.stride(1);
      if (dtype != DType::kFP4E2M1) {
        for (int64_t d = 0; d < dim; ++d) {
          const float x = load_as_float(src.data, src.dtype, src_row + d);
          store_from_float(dst.data, dtype, dst_row + d, fp8 ? x / scale : x);
        }
        continue;
      }
      // fp4: one e4m3 block scale per group of kFp4GroupSize values of this [t, h] row.
      auto* packed = static_cast<uint8_t*>(dst.data) + dst_row / 2;
      auto* block_scales = static_cast<uint8_t*>(dst_scales.data) + slot * dst_scales.stride(0) +
                           h * dst_scales.stride(1);
      for (int64_t g = 0; g < dim / kFp4GroupSize; ++g) {
        float values[kFp4GroupSize];
        float amax = 0.0f;
        for (int i = 0; i < kFp4GroupSize; ++i) {
          values[i] = load_as_float(src.data, src.dtype, src_row + g * kFp4GroupSize + i);
          const float a = std::fabs(values[i]);
          if (a > amax) amax = a;  // NaN compares false and is ignored
        }
        const uint8_t block_code = fp4_block_scale_code(amax, scale);
        block_scales[g * dst_scales.stride(2)] = block_code;
        const float block = fp8_e4m3_to_float(block_code);
        const float denom = block * scale;
        for (int i = 0; i < kFp4GroupSize; i += 2) {
          const uint8_t lo = block == 0.0f ? 0 : float_to_fp4_e2m1(values[i] / denom);
          const uint8_t hi = block == 0.0f ? 0 : float_to_fp4_e2m1(values[i + 1] / denom);
          packed[(g * kFp4GroupSize + i) / 2] = static_cast<uint8_t>(lo | (hi << 4));
        }
      }
    }
  }
}

// Writes src into dst at loc on the pool's device. Inputs are already validated (slots too for
// CPU pools); CUDA pools skip and record out-of-range slots in `guard` (see set_kv_cuda.h).
Status scatter(const TensorView& dst, const TensorView& dst_scales, const TensorView& loc,
               const TensorView& src, float scale, int layer, void* guard, StreamHandle stream) {
  if (dst.device.is_cpu()) {
    scatter_host(dst, dst_scales, loc, src, scale);
    return Status::ok();
  }
#ifdef ATTNKIT_WITH_CUDA
  return detail::set_kv_cuda(dst, dst_scales, loc, src, scale, layer, guard, stream);
#else
  (void)layer;
  (void)guard;
  (void)stream;
  return Status::not_built("set_kv: the pool is on " + dst.device.to_string() +
                           " but attnkit was built without CUDA (ATTNKIT_CUDA=OFF)");
#endif
}

Status check_layer(int layer, int num_layers) {
  if (layer < 0 || layer >= num_layers) {
    return Status::invalid_argument("layer " + std::to_string(layer) + " is outside [0, " +
                                    std::to_string(num_layers) + ")");
  }
  return Status::ok();
}

}  // namespace

uint8_t fp4_block_scale_code(float amax, float layer_scale) {
  if (!(amax > 0.0f) || !(layer_scale > 0.0f)) return 0;
  const float exact = (amax / kFp4Max) / layer_scale;
  if (!(exact < fp8_e4m3_to_float(kE4M3MaxCode))) return kE4M3MaxCode;
  uint8_t code = float_to_fp8_e4m3(exact);
  // Positive e4m3 codes are ordered like their values: step up once if RNE rounded down.
  if (fp8_e4m3_to_float(code) < exact) ++code;
  return code;
}

float load_kv_value_host(const TensorView& buffer, const TensorView& scales, int64_t slot,
                         int64_t head, int64_t d, float layer_scale) {
  const int64_t index = slot * buffer.stride(0) + head * buffer.stride(1) + d * buffer.stride(2);
  const float value = load_as_float(buffer.data, buffer.dtype, index);
  if (dtype_is_fp8(buffer.dtype)) return value * layer_scale;
  if (buffer.dtype != DType::kFP4E2M1) return value;
  const int64_t scale_index =
      slot * scales.stride(0) + head * scales.stride(1) + (d / kFp4GroupSize) * scales.stride(2);
  const float block = fp8_e4m3_to_float(static_cast<const uint8_t*>(scales.data)[scale_index]);
  return value * block * layer_scale;
}

namespace detail {

std::string kv_guard_message(const KVGuardRecord& record, int64_t rows, int page_size) {
  const std::string pool = "the pool rows [0, " + std::to_string(rows) + ") (usable slots [" +
                           std::to_string(page_size) + ", " + std::to_string(rows) +
                           "), page 0 holds dummy writes)";
  const std::string first =
      "(the first bad write since the last check; later ones are not recorded)";
  return "set_kv (device slot guard): layer " + std::to_string(record.layer) + " loc[" +
         std::to_string(record.token) + "] = " + std::to_string(record.slot) + " is outside " +
         pool + "; the write was skipped, so this token's k/v is missing from the cache " + first;
}

Status validate_mha_pool_config(const KVPoolConfig& config) {
  ATTNKIT_RETURN_IF_ERROR(validate_common(config));
  if (config.num_kv_heads < 1) {
    return Status::invalid_argument(cfg_error("num_kv_heads", config.num_kv_heads, "must be >= 1"));
  }
  if (config.head_dim < 1) {
    return Status::invalid_argument(cfg_error("head_dim", config.head_dim, "must be >= 1"));
  }
  if (config.v_head_dim < 1) {
    return Status::invalid_argument(cfg_error("v_head_dim", config.v_head_dim, "must be >= 1"));
  }
  ATTNKIT_RETURN_IF_ERROR(check_fp4_dim(config, "head_dim", config.head_dim));
  ATTNKIT_RETURN_IF_ERROR(check_fp4_dim(config, "v_head_dim", config.v_head_dim));
  return Status::ok();
}

Result<KVPoolConfig> validate_mla_pool_config(const KVPoolConfig& config) {
  ATTNKIT_RETURN_IF_ERROR(validate_common(config));
  if (config.kv_lora_rank < 1) {
    return Status::invalid_argument(cfg_error("kv_lora_rank", config.kv_lora_rank, "must be >= 1"));
  }
  if (config.qk_rope_head_dim < 1) {
    return Status::invalid_argument(
        cfg_error("qk_rope_head_dim", config.qk_rope_head_dim, "must be >= 1"));
  }
  if (config.num_kv_heads != 0 && config.num_kv_heads != 1) {
    return Status::invalid_argument(
        cfg_error("num_kv_heads", config.num_kv_heads, "must be 1 (or 0 = 1) for MLA"));
  }
  // The latent row's width, summed in int64 (the int sum overflowed for a huge kv_lora_rank).
  constexpr int64_t kMaxRowDim = 65536;
  const int64_t row_dim_wide =
      static_cast<int64_t>(config.kv_lora_rank) + static_cast<int64_t>(config.qk_rope_head_dim);
  if (row_dim_wide > kMaxRowDim) {
    return Status::invalid_argument(
        "KVPoolConfig.kv_lora_rank " + std::to_string(config.kv_lora_rank) +
        " + qk_rope_head_dim " + std::to_string(config.qk_rope_head_dim) + " = " +
        std::to_string(row_dim_wide) + " must be <= " + std::to_string(kMaxRowDim));
  }
  const int row_dim = static_cast<int>(row_dim_wide);
  if (config.head_dim != 0 && config.head_dim != row_dim) {
    return Status::invalid_argument(cfg_error(
        "head_dim", config.head_dim,
        "must be 0 or kv_lora_rank + qk_rope_head_dim = " + std::to_string(row_dim) + " for MLA"));
  }
  if (config.v_head_dim != 0 && config.v_head_dim != config.kv_lora_rank) {
    return Status::invalid_argument(
        cfg_error("v_head_dim", config.v_head_dim,
                  "must be 0 or kv_lora_rank " + std::to_string(config.kv_lora_rank) + " for MLA"));
  }
  ATTNKIT_RETURN_IF_ERROR(check_fp4_dim(config, "kv_lora_rank", config.kv_lora_rank));
  ATTNKIT_RETURN_IF_ERROR(check_fp4_dim(config, "qk_rope_head_dim", config.qk_rope_head_dim));
  KVPoolConfig normalized = config;
  normalized.num_kv_heads = 1;
  normalized.head_dim = row_dim;
  normalized.v_head_dim = config.kv_lora_rank;
  return normalized;
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// KVPool: device slot guard

Status KVPool::init_device_guard() {
#ifdef ATTNKIT_WITH_CUDA
  if (device().is_cpu()) return Status::ok();
  ATTNKIT_ASSIGN_OR_RETURN(
      guard_, Buffer::allocate(device(), static_cast<int64_t>(sizeof(detail::KVGuardRecord))));
  const detail::KVGuardRecord cleared{};
  return copy_bytes(guard_.data(), device(), &cleared, Device::cpu(),
                    static_cast<int64_t>(sizeof(cleared)));
#else
  // Without CUDA a wrapped CUDA pool exists only to report kNotBuilt from set_kv.
  return Status::ok();
#endif
}

Status KVPool::check_device_errors(StreamHandle stream) {
  if (guard_.data() == nullptr) return Status::ok();
#ifdef ATTNKIT_WITH_CUDA
  detail::KVGuardRecord record;
  const DeviceScope scope(device());
  ATTNKIT_RETURN_IF_ERROR(scope.status());
  ATTNKIT_RETURN_IF_ERROR(
      check_stream_device(stream, device(), "check_device_errors stream", "the pool is on"));
  ATTNKIT_RETURN_IF_ERROR(detail::kv_guard_read_and_clear(guard_.data(), &record, stream));
  if (record.flag == 0) return Status::ok();
  return Status::invalid_argument(detail::kv_guard_message(record, rows(), page_size()));
#else
  (void)stream;
  return Status::ok();
#endif
}

void KVPool::index_storage(
    std::initializer_list<std::pair<const char*, const std::vector<Buffer>*>> groups) {
  storage_.clear();
  for (const auto& [name, buffers] : groups) {
    for (size_t layer = 0; layer < buffers->size(); ++layer) {
      const Buffer& b = (*buffers)[layer];
      if (b.data() == nullptr || b.bytes() == 0) continue;
      const auto begin = reinterpret_cast<uintptr_t>(b.data());
      storage_.push_back(
          {begin, begin + static_cast<uintptr_t>(b.bytes()), name, static_cast<int>(layer)});
    }
  }
  std::sort(storage_.begin(), storage_.end(),
            [](const StorageSpan& a, const StorageSpan& b) { return a.begin < b.begin; });
}

std::string KVPool::storage_overlapping(const void* begin, int64_t bytes) const {
  if (begin == nullptr || bytes <= 0) return "";
  const auto lo = reinterpret_cast<uintptr_t>(begin);
  const uintptr_t hi = lo + static_cast<uintptr_t>(bytes);
  // The spans are disjoint (wrap checks it; create allocates each), so sorted by begin they are
  // sorted by end too: the first one ending past lo is the lowest-addressed candidate.
  const auto it = std::upper_bound(storage_.begin(), storage_.end(), lo,
                                   [](uintptr_t v, const StorageSpan& s) { return v < s.end; });
  if (it == storage_.end() || it->begin >= hi) return "";
  return std::string(it->name) + "[" + std::to_string(it->layer) + "]";
}

// ---------------------------------------------------------------------------------------------
// MHAKVPool

Result<std::unique_ptr<MHAKVPool>> MHAKVPool::create(const KVPoolConfig& config) {
  ATTNKIT_RETURN_IF_ERROR(detail::validate_mha_pool_config(config));
  auto pool = std::unique_ptr<MHAKVPool>(new MHAKVPool(config));
  const int64_t rows = pool->rows();
  const int64_t heads = config.num_kv_heads;
  const bool fp4 = config.dtype == DType::kFP4E2M1;
  for (int layer = 0; layer < config.num_layers; ++layer) {
    ATTNKIT_ASSIGN_OR_RETURN(
        Buffer k, allocate_kv(config.device, config.dtype, rows, heads * config.head_dim, "k"));
    ATTNKIT_ASSIGN_OR_RETURN(
        Buffer v, allocate_kv(config.device, config.dtype, rows, heads * config.v_head_dim, "v"));
    pool->k_.push_back(std::move(k));
    pool->v_.push_back(std::move(v));
    if (fp4) {
      ATTNKIT_ASSIGN_OR_RETURN(Buffer ks,
                               allocate_kv(config.device, DType::kFP8E4M3, rows,
                                           heads * (config.head_dim / kFp4GroupSize), "k scales"));
      ATTNKIT_ASSIGN_OR_RETURN(
          Buffer vs, allocate_kv(config.device, DType::kFP8E4M3, rows,
                                 heads * (config.v_head_dim / kFp4GroupSize), "v scales"));
      pool->k_scales_.push_back(std::move(ks));
      pool->v_scales_.push_back(std::move(vs));
    }
  }
  pool->index_buffers();
  ATTNKIT_RETURN_IF_ERROR(pool->init_device_guard());
  return pool;
}

void MHAKVPool::index_buffers() {
  index_storage({{"k", &k_}, {"v", &v_}, {"k_scales", &k_scales_}, {"v_scales", &v_scales_}});
}

TensorView MHAKVPool::k_buffer(int layer) const {
  if (layer < 0 || layer >= config_.num_layers) return TensorView();
  return view_of(k_[static_cast<size_t>(layer)], config_.dtype, rows(), config_.num_kv_heads,
                 config_.head_dim);
}

TensorView MHAKVPool::v_buffer(int layer) const {
  if (layer < 0 || layer >= config_.num_layers) return TensorView();
  return view_of(v_[static_cast<size_t>(layer)], config_.dtype, rows(), config_.num_kv_heads,
                 config_.v_head_dim);
}

TensorView MHAKVPool::k_scale_buffer(int layer) const {
  if (layer < 0 || layer >= config_.num_layers || k_scales_.empty()) return TensorView();
  return view_of(k_scales_[static_cast<size_t>(layer)], DType::kFP8E4M3, rows(),
                 config_.num_kv_heads, config_.head_dim / kFp4GroupSize);
}

TensorView MHAKVPool::v_scale_buffer(int layer) const {
  if (layer < 0 || layer >= config_.num_layers || v_scales_.empty()) return TensorView();
  return view_of(v_scales_[static_cast<size_t>(layer)], DType::kFP8E4M3, rows(),
                 config_.num_kv_heads, config_.v_head_dim / kFp4GroupSize);
}

Status MHAKVPool::set_kv(int layer, const TensorView& loc, const TensorView& k, const TensorView& v,
                         float k_scale, float v_scale, StreamHandle stream) {
  const DeviceScope scope(device());
  ATTNKIT_RETURN_IF_ERROR(scope.status());
  ATTNKIT_RETURN_IF_ERROR(check_stream_device(stream, device(), "set_kv stream", "the pool is on"));
  ATTNKIT_RETURN_IF_ERROR(check_layer(layer, config_.num_layers));
  ATTNKIT_ASSIGN_OR_RETURN(const int64_t tokens, check_loc(loc, device()));
  ATTNKIT_RETURN_IF_ERROR(
      check_src(k, "k", tokens, config_.num_kv_heads, config_.head_dim, device()));
  ATTNKIT_RETURN_IF_ERROR(
      check_src(v, "v", tokens, config_.num_kv_heads, config_.v_head_dim, device()));
  ATTNKIT_RETURN_IF_ERROR(check_scale(k_scale, "k_scale"));
  ATTNKIT_RETURN_IF_ERROR(check_scale(v_scale, "v_scale"));
  if (tokens == 0) return Status::ok();
  ATTNKIT_RETURN_IF_ERROR(check_sources_apart({{&k, "k"}, {&v, "v"}, {&loc, "loc"}},
                                              {{k_buffer(layer), "k"},
                                               {v_buffer(layer), "v"},
                                               {k_scale_buffer(layer), "k scales"},
                                               {v_scale_buffer(layer), "v scales"}},
                                              layer));
  ATTNKIT_RETURN_IF_ERROR(check_slots(loc, page_size(), rows(), stream));
  // Every check of K, V, the slots and the scales has passed: only a device launch error can stop
  // the V scatter after the K scatter.
  ATTNKIT_RETURN_IF_ERROR(scatter(k_buffer(layer), k_scale_buffer(layer), loc, k, k_scale, layer,
                                  device_guard(), stream));
  return scatter(v_buffer(layer), v_scale_buffer(layer), loc, v, v_scale, layer, device_guard(),
                 stream);
}

// ---------------------------------------------------------------------------------------------
// MLAKVPool

Result<std::unique_ptr<MLAKVPool>> MLAKVPool::create(const KVPoolConfig& config) {
  ATTNKIT_ASSIGN_OR_RETURN(const KVPoolConfig normalized, detail::validate_mla_pool_config(config));
  const int row_dim = normalized.head_dim;
  auto pool = std::unique_ptr<MLAKVPool>(new MLAKVPool(normalized));
  const int64_t rows = pool->rows();
  for (int layer = 0; layer < config.num_layers; ++layer) {
    ATTNKIT_ASSIGN_OR_RETURN(Buffer kv,
                             allocate_kv(config.device, config.dtype, rows, row_dim, "kv"));
    pool->kv_.push_back(std::move(kv));
    if (config.dtype == DType::kFP4E2M1) {
      ATTNKIT_ASSIGN_OR_RETURN(Buffer s, allocate_kv(config.device, DType::kFP8E4M3, rows,
                                                     row_dim / kFp4GroupSize, "kv scales"));
      pool->scales_.push_back(std::move(s));
    }
  }
  pool->index_buffers();
  ATTNKIT_RETURN_IF_ERROR(pool->init_device_guard());
  return pool;
}

void MLAKVPool::index_buffers() { index_storage({{"kv", &kv_}, {"scales", &scales_}}); }

TensorView MLAKVPool::kv_buffer(int layer) const {
  if (layer < 0 || layer >= config_.num_layers) return TensorView();
  return view_of(kv_[static_cast<size_t>(layer)], config_.dtype, rows(), 1, row_dim());
}

TensorView MLAKVPool::v_view(int layer) const {
  TensorView view = kv_buffer(layer);
  if (!view.defined()) return view;
  view.shape[2] = config_.kv_lora_rank;  // strides stay those of the full row
  return view;
}

TensorView MLAKVPool::scale_buffer(int layer) const {
  if (layer < 0 || layer >= config_.num_layers || scales_.empty()) return TensorView();
  return view_of(scales_[static_cast<size_t>(layer)], DType::kFP8E4M3, rows(), 1,
                 row_dim() / kFp4GroupSize);
}

Status MLAKVPool::set_kv(int layer, const TensorView& loc, const TensorView& k,
                         const TensorView& /*v*/, float k_scale, float /*v_scale*/,
                         StreamHandle stream) {
  const DeviceScope scope(device());
  ATTNKIT_RETURN_IF_ERROR(scope.status());
  ATTNKIT_RETURN_IF_ERROR(check_stream_device(stream, device(), "set_kv stream", "the pool is on"));
  ATTNKIT_RETURN_IF_ERROR(check_layer(layer, config_.num_layers));
  ATTNKIT_ASSIGN_OR_RETURN(const int64_t tokens, check_loc(loc, device()));
  ATTNKIT_RETURN_IF_ERROR(check_src(k, "k", tokens, 1, row_dim(), device()));
  ATTNKIT_RETURN_IF_ERROR(check_scale(k_scale, "k_scale"));
  if (tokens == 0) return Status::ok();
  ATTNKIT_RETURN_IF_ERROR(
      check_sources_apart({{&k, "k"}, {&loc, "loc"}},
                          {{kv_buffer(layer), "kv"}, {scale_buffer(layer), "scales"}}, layer));
  ATTNKIT_RETURN_IF_ERROR(check_slots(loc, page_size(), rows(), stream));
  return scatter(kv_buffer(layer), scale_buffer(layer), loc, k, k_scale, layer, device_guard(),
                 stream);
}

}  // namespace attnkit
