// MHAKVPool::wrap and MLAKVPool::wrap: KV pools over caller-owned memory (a serving engine's own
// allocator, PyTorch tensors through DLPack). The pool holds non-owning Buffers, so every accessor,
// set_kv and every backend work on it exactly as on a pool from create().
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "attnkit/kv_cache.h"
#include "core/device_scope.h"
#include "core/str_cat.h"
#include "kv/kv_pool_config.h"

namespace attnkit {
namespace {

constexpr uintptr_t kCudaKvAlignment = 16;

Status check_count(const char* name, size_t got, int num_layers) {
  if (static_cast<int64_t>(got) != num_layers) {
    return Status::invalid_argument(
        cat(name, ": got ", got, " per-layer views, expected num_layers ", num_layers));
  }
  return Status::ok();
}

// Checks view `name`[layer] against the pool's layout and returns a non-owning Buffer over it.
Result<Buffer> borrow_view(const TensorView& view, const char* name, int layer, DType dtype,
                           Device device, int64_t rows, int64_t heads, int64_t dim) {
  const std::string label = cat(name, "[", layer, "]");
  if (!view.defined()) {
    return Status::invalid_argument(cat(label, " is missing (null data)"));
  }
  if (view.dtype != dtype) {
    return Status::invalid_argument(cat(label, ": dtype ", dtype_name(view.dtype),
                                        " must be the pool dtype ", dtype_name(dtype), " (",
                                        view.describe(), ")"));
  }
  if (view.device != device) {
    return Status::invalid_argument(
        cat(label, ": on ", view.device.to_string(), ", the pool is on ", device.to_string()));
  }
  if (view.ndim != 3 || view.shape[0] != rows || view.shape[1] != heads || view.shape[2] != dim) {
    return Status::invalid_argument(cat(label, ": expected shape [", rows, ", ", heads, ", ", dim,
                                        "] ([size + page_size, heads, dim]), got ",
                                        view.describe()));
  }
  if (!view.is_contiguous()) {
    return Status::invalid_argument(
        cat(label, ": must be contiguous, got strides of ", view.describe()));
  }
  // The CUDA kernels read KV rows (and fp4 block scales) in 16-byte vectors (cp.async, TMA): a
  // misaligned base is a misaligned-address fault that kills the CUDA context, so it is refused
  // here (a stacked array of odd-sized layers, a storage offset).
  if (device.is_cuda() && reinterpret_cast<uintptr_t>(view.data) % kCudaKvAlignment != 0) {
    return Status::invalid_argument(cat(
        label, ": data address ", view.data, " is not ", kCudaKvAlignment,
        "-byte aligned (the CUDA kernels load KV rows in ", kCudaKvAlignment, "-byte vectors)"));
  }
  return Buffer::borrow(view.data, view.storage_bytes(), device);
}

// The views' memory must not overlap (k[0] passed again as v[0], two layers on one buffer): set_kv
// would then overwrite one with the other. Errors name both views.
struct Borrowed {
  std::string label;
  uintptr_t begin = 0;
  uintptr_t end = 0;
};
Status check_disjoint(std::vector<Borrowed> views) {  // a copy: sorted here
  std::stable_sort(views.begin(), views.end(),
                   [](const Borrowed& a, const Borrowed& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < views.size(); ++i) {
    if (views[i].begin < views[i - 1].end) {
      return Status::invalid_argument(cat(views[i - 1].label, " and ", views[i].label,
                                          " share memory (each view needs its own; set_kv would "
                                          "overwrite one with the other)"));
    }
  }
  return Status::ok();
}
// A CUDA pool's views name their device, which is the caller's word: CUDA is asked where each
// view's first and last byte really are (after the checks that need no device).
Status check_located(const std::vector<Borrowed>& views, const Device& device) {
  if (!device.is_cuda()) return Status::ok();
  for (const Borrowed& b : views) {
    for (const uintptr_t at : {b.begin, b.end - 1}) {
      ATTNKIT_RETURN_IF_ERROR(
          check_memory_on_device(reinterpret_cast<const void*>(at), device, b.label));
    }
  }
  return Status::ok();
}
Borrowed borrowed(const Buffer& buffer, const char* name, int layer) {
  const auto begin = reinterpret_cast<uintptr_t>(buffer.data());
  return {cat(name, "[", layer, "]"), begin, begin + static_cast<uintptr_t>(buffer.bytes())};
}

}  // namespace

Result<std::unique_ptr<MHAKVPool>> MHAKVPool::wrap(const KVPoolConfig& config,
                                                   std::span<const TensorView> k,
                                                   std::span<const TensorView> v,
                                                   std::span<const TensorView> k_scales,
                                                   std::span<const TensorView> v_scales) {
  ATTNKIT_RETURN_IF_ERROR(detail::validate_mha_pool_config(config));
  ATTNKIT_RETURN_IF_ERROR(check_count("k", k.size(), config.num_layers));
  ATTNKIT_RETURN_IF_ERROR(check_count("v", v.size(), config.num_layers));
  const bool fp4 = config.dtype == DType::kFP4E2M1;
  if (fp4) {
    ATTNKIT_RETURN_IF_ERROR(check_count("k_scales", k_scales.size(), config.num_layers));
    ATTNKIT_RETURN_IF_ERROR(check_count("v_scales", v_scales.size(), config.num_layers));
  } else if (!k_scales.empty() || !v_scales.empty()) {
    return Status::invalid_argument(
        cat("k_scales / v_scales are only used by fp4_e2m1 pools; "
            "the pool dtype is ",
            dtype_name(config.dtype)));
  }

  auto pool = std::unique_ptr<MHAKVPool>(new MHAKVPool(config));
  const int64_t rows = pool->rows();
  const int64_t heads = config.num_kv_heads;
  std::vector<Borrowed> views;
  for (int layer = 0; layer < config.num_layers; ++layer) {
    const auto l = static_cast<size_t>(layer);
    ATTNKIT_ASSIGN_OR_RETURN(Buffer kb, borrow_view(k[l], "k", layer, config.dtype, config.device,
                                                    rows, heads, config.head_dim));
    ATTNKIT_ASSIGN_OR_RETURN(Buffer vb, borrow_view(v[l], "v", layer, config.dtype, config.device,
                                                    rows, heads, config.v_head_dim));
    views.push_back(borrowed(kb, "k", layer));
    views.push_back(borrowed(vb, "v", layer));
    pool->k_.push_back(std::move(kb));
    pool->v_.push_back(std::move(vb));
    if (!fp4) continue;
    ATTNKIT_ASSIGN_OR_RETURN(
        Buffer ks, borrow_view(k_scales[l], "k_scales", layer, DType::kFP8E4M3, config.device, rows,
                               heads, config.head_dim / kFp4GroupSize));
    ATTNKIT_ASSIGN_OR_RETURN(
        Buffer vs, borrow_view(v_scales[l], "v_scales", layer, DType::kFP8E4M3, config.device, rows,
                               heads, config.v_head_dim / kFp4GroupSize));
    views.push_back(borrowed(ks, "k_scales", layer));
    views.push_back(borrowed(vs, "v_scales", layer));
    pool->k_scales_.push_back(std::move(ks));
    pool->v_scales_.push_back(std::move(vs));
  }
  ATTNKIT_RETURN_IF_ERROR(check_disjoint(views));
  ATTNKIT_RETURN_IF_ERROR(check_located(views, config.device));
  pool->index_buffers();
  ATTNKIT_RETURN_IF_ERROR(pool->init_device_guard());
  return pool;
}

Result<std::unique_ptr<MLAKVPool>> MLAKVPool::wrap(const KVPoolConfig& config,
                                                   std::span<const TensorView> kv,
                                                   std::span<const TensorView> scales) {
  ATTNKIT_ASSIGN_OR_RETURN(const KVPoolConfig normalized, detail::validate_mla_pool_config(config));
  const int row_dim = normalized.head_dim;
  ATTNKIT_RETURN_IF_ERROR(check_count("kv", kv.size(), config.num_layers));
  const bool fp4 = config.dtype == DType::kFP4E2M1;
  if (fp4) {
    ATTNKIT_RETURN_IF_ERROR(check_count("scales", scales.size(), config.num_layers));
  } else if (!scales.empty()) {
    return Status::invalid_argument(
        cat("scales are only used by fp4_e2m1 pools; the pool dtype "
            "is ",
            dtype_name(config.dtype)));
  }

  auto pool = std::unique_ptr<MLAKVPool>(new MLAKVPool(normalized));
  const int64_t rows = pool->rows();
  std::vector<Borrowed> views;
  for (int layer = 0; layer < config.num_layers; ++layer) {
    const auto l = static_cast<size_t>(layer);
    ATTNKIT_ASSIGN_OR_RETURN(
        Buffer b, borrow_view(kv[l], "kv", layer, config.dtype, config.device, rows, 1, row_dim));
    views.push_back(borrowed(b, "kv", layer));
    pool->kv_.push_back(std::move(b));
    if (!fp4) continue;
    ATTNKIT_ASSIGN_OR_RETURN(
        Buffer s, borrow_view(scales[l], "scales", layer, DType::kFP8E4M3, config.device, rows, 1,
                              row_dim / kFp4GroupSize));
    views.push_back(borrowed(s, "scales", layer));
    pool->scales_.push_back(std::move(s));
  }
  ATTNKIT_RETURN_IF_ERROR(check_disjoint(views));
  ATTNKIT_RETURN_IF_ERROR(check_located(views, config.device));
  pool->index_buffers();
  ATTNKIT_RETURN_IF_ERROR(pool->init_device_guard());
  return pool;
}

}  // namespace attnkit
