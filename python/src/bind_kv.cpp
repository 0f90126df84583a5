// Bindings of the paged KV cache: ReqToTokenPool, PageAllocator, MHAKVPool and MLAKVPool (library
// owned, or wrapped around caller buffers).
#include <functional>
#include <string>
#include <utility>

#include "wrappers.h"

namespace attnkit::python {

PoolUse::PoolUse(PyKVPool& p, Kind kind, const char* object, const char* method)
    : users_(p.users), unit_(kind == Kind::kForward ? uint64_t{1} : uint64_t{1} << 32) {
  const uint64_t other_mask = kind == Kind::kForward ? ~uint64_t{0} << 32 : (uint64_t{1} << 32) - 1;
  uint64_t seen = users_.load(std::memory_order_relaxed);
  do {
    if ((seen & other_mask) != 0) {
      raise_invalid(std::string(object) + "." + method +
                    (kind == Kind::kForward
                         ? ": another thread is inside KVPool.set_kv of this forward's pool; a "
                           "forward and a set_kv of one pool do not overlap (order them, e.g. with "
                           "a lock)"
                         : ": another thread is inside a forward over this pool; a set_kv and a "
                           "forward of one pool do not overlap (order them, e.g. with a lock)"));
    }
  } while (!users_.compare_exchange_weak(seen, seen + unit_, std::memory_order_acquire,
                                         std::memory_order_relaxed));
}

void PoolUse::done() {
  if (!done_) users_.fetch_sub(unit_, std::memory_order_release);
  done_ = true;
}

TableUse::TableUse(nb::handle pool) {
  PyReqToTokenPool* p = nullptr;
  if (!pool.is_valid() || pool.is_none() || !nb::try_cast<PyReqToTokenPool*>(pool, p) ||
      p == nullptr) {
    return;
  }
  readers_ = &p->readers;
  readers_->fetch_add(1, std::memory_order_acquire);
}

void TableUse::done() {
  if (readers_ != nullptr) readers_->fetch_sub(1, std::memory_order_release);
  readers_ = nullptr;
}

namespace {

using namespace nb::literals;

// A row changed under a forward on another thread was read half old, half new (or past the pool).
void refuse_while_read(const PyReqToTokenPool& p, const char* method) {
  if (p.readers.load(std::memory_order_acquire) != 0) {
    raise_invalid(std::string("ReqToTokenPool.") + method +
                  ": another thread is inside a backend call that reads this table "
                  "(init_forward_metadata or a forward); rows do not change under it (order them, "
                  "e.g. with a lock)");
  }
}

// Per-layer views from a list/tuple of arrays, or one array with a leading layer dimension.
std::vector<TensorView> layer_views(nb::handle obj, const char* name, std::optional<DType> as,
                                    std::vector<OutArray>* keep_alive) {
  std::vector<TensorView> views;
  Array probe;
  if (nb::try_cast<Array>(obj, probe)) {
    const OutArray stacked = writable_array(obj, name, "the KV cache");
    const TensorView all = to_view(stacked, name, as);
    if (all.ndim != 4) {
      raise_invalid(std::string(name) + ": one array must be [num_layers, rows, heads, dim], got " +
                    all.describe() +
                    " (or pass a list with one [rows, heads, dim] array per layer)");
    }
    keep_alive->push_back(stacked);
    for (int64_t l = 0; l < all.size(0); ++l) {
      TensorView v;
      v.dtype = all.dtype;
      v.device = all.device;
      v.ndim = 3;
      for (int d = 0; d < 3; ++d) {
        v.shape[static_cast<size_t>(d)] = all.shape[static_cast<size_t>(d + 1)];
        v.strides[static_cast<size_t>(d)] = all.strides[static_cast<size_t>(d + 1)];
      }
      // Layer l starts l * stride(0) elements from layer 0 (a negative stride too: layers in
      // reverse order); the byte offset is exact (fp4 layers hold whole bytes), not rounded up.
      v.data = static_cast<char*>(all.data) + l * all.stride(0) * dtype_bits(all.dtype) / 8;
      views.push_back(v);
    }
    return views;
  }
  if (!nb::isinstance<nb::sequence>(obj)) {
    raise_invalid(std::string(name) +
                  ": expected a list of per-layer arrays or one "
                  "[num_layers, rows, heads, dim] array, got " +
                  nb::cast<std::string>(nb::str(obj.type())));
  }
  size_t index = 0;
  for (nb::handle item : obj) {
    const std::string label = std::string(name) + "[" + std::to_string(index++) + "]";
    Array readable;
    if (!nb::try_cast<Array>(item, readable)) {
      raise_invalid(label + ": not a DLPack array (" + nb::cast<std::string>(nb::str(item.type())) +
                    ")");
    }
    const OutArray array = writable_array(item, label.c_str(), "the KV cache");
    views.push_back(to_view(array, label.c_str(), as));
    keep_alive->push_back(array);
  }
  return views;
}

// A view of one layer's buffer (`what` names the method): a layer outside the pool or a buffer
// the pool's dtype does not have (block scales of a pool that is not fp4) is an error naming it
// (was "to_array: the view is undefined").
ExportArray layer_array(PyKVPool& p, const char* what, int layer,
                        const std::function<TensorView(int)>& get) {
  const int layers = p.pool->config().num_layers;
  if (layer < 0 || layer >= layers) {
    raise_invalid(std::string(what) + ": layer " + std::to_string(layer) +
                  " is outside the pool's layers [0, " + std::to_string(layers) + ")");
  }
  const TensorView view = get(layer);
  if (!view.defined()) {
    raise_invalid(std::string(what) + ": a " + dtype_name(p.pool->dtype()) +
                  " pool has no such buffer (block scales: fp4_e2m1 pools only)");
  }
  return to_array(view, nb::find(&p));
}

std::optional<DType> optional_dtype(nb::handle obj, const char* name) {
  if (obj.is_none()) return std::nullopt;
  return parse_dtype_arg(obj, name);
}

void bind_pool_common(nb::class_<PyKVPool>& cls) {
  cls.def_prop_ro("num_layers", [](const PyKVPool& p) { return p.pool->config().num_layers; })
      .def_prop_ro(
          "size", [](const PyKVPool& p) { return p.pool->config().size; },
          "Usable token slots (buffers hold size + page_size rows).")
      .def_prop_ro("rows", [](const PyKVPool& p) { return p.pool->rows(); })
      .def_prop_ro("page_size", [](const PyKVPool& p) { return p.pool->page_size(); })
      .def_prop_ro("dtype",
                   [](const PyKVPool& p) { return std::string(dtype_name(p.pool->dtype())); })
      .def_prop_ro("device", [](const PyKVPool& p) { return p.pool->device().to_string(); })
      .def_prop_ro("is_mla", [](const PyKVPool& p) { return p.pool->is_mla(); })
      .def_prop_ro("num_kv_heads", [](const PyKVPool& p) { return p.pool->config().num_kv_heads; })
      .def_prop_ro("head_dim", [](const PyKVPool& p) { return p.pool->config().head_dim; })
      .def_prop_ro("v_head_dim", [](const PyKVPool& p) { return p.pool->config().v_head_dim; })
      .def_prop_ro(
          "owns_memory", [](const PyKVPool& p) { return p.keep_alive.empty(); },
          "False for a pool made by wrap() over caller buffers.")
      .def(
          "set_kv",
          [](PyKVPool& p, int layer, const Array& loc, const Array& k, std::optional<Array> v,
             float k_scale, float v_scale, nb::handle stream) {
            const TensorView loc_v = to_view(loc, "loc");
            const TensorView k_v = to_view(k, "k");
            const TensorView v_v = v ? to_view(*v, "v") : TensorView();
            const StreamHandle s = parse_stream_arg(stream);
            Status status;
            {
              PoolUse use(p, PoolUse::Kind::kSetKv, "KVPool", "set_kv");
              nb::gil_scoped_release release;
              status = p.pool->set_kv(layer, loc_v, k_v, v_v, k_scale, v_scale, s);
              use.done();  // before the GIL is taken back
            }
            check(status);
          },
          "layer"_a, "loc"_a, "k"_a, "v"_a = nb::none(), "k_scale"_a = 1.0f, "v_scale"_a = 1.0f,
          "stream"_a = nb::none(),
          "Scatter k/v rows ([T, heads, dim], f32/f16/bf16) into slots loc (int64 [T]) of `layer`, "
          "quantising to the pool dtype (fp8: x / scale). MLA pools ignore v. CUDA pools skip a "
          "slot outside the pool and report it at the next check_device_errors().")
      .def(
          "check_device_errors",
          [](PyKVPool& p, nb::handle stream) {
            const StreamHandle s = parse_stream_arg(stream);
            Status status;
            {
              nb::gil_scoped_release release;
              status = p.pool->check_device_errors(s);
            }
            check(status);
          },
          "stream"_a = nb::none(),
          "CUDA pools: raise naming the layer, token and slot of the first set_kv write that was "
          "skipped as outside the pool since the last call (then clear it). Synchronises the "
          "stream; call it every N steps. CPU pools check slots in set_kv and never raise here.");
}

}  // namespace

void bind_kv(nb::module_& m) {
  nb::class_<PyReqToTokenPool>(m, "ReqToTokenPool",
                               "int32 [max_reqs + 1, max_context_len] table: entry [r, i] is the "
                               "pool slot of token i of request r. Row 0 is reserved.")
      .def(
          "__init__",
          [](PyReqToTokenPool* self, int max_reqs, int max_context_len, nb::handle device) {
            auto pool =
                check(ReqToTokenPool::create(max_reqs, max_context_len, parse_device_arg(device)));
            new (self) PyReqToTokenPool{std::move(pool)};
          },
          "max_reqs"_a, "max_context_len"_a, "device"_a = "cpu")
      .def(
          "alloc", [](PyReqToTokenPool& p) { return check(p.pool->alloc()); },
          "A free request row in [1, max_reqs].")
      .def(
          "free",
          [](PyReqToTokenPool& p, int row) {
            refuse_while_read(p, "free");
            check(p.pool->free(row));
          },
          "row"_a,
          "Return row `row` to the pool; its entries are reset to 0 (the reserved page 0).")
      .def_prop_ro("available", [](const PyReqToTokenPool& p) { return p.pool->available(); })
      .def_prop_ro("max_reqs", [](const PyReqToTokenPool& p) { return p.pool->max_reqs(); })
      .def_prop_ro("max_context_len",
                   [](const PyReqToTokenPool& p) { return p.pool->max_context_len(); })
      .def_prop_ro("device", [](const PyReqToTokenPool& p) { return p.pool->device().to_string(); })
      .def_prop_ro(
          "max_slot", [](const PyReqToTokenPool& p) { return p.pool->max_slot(); },
          "A bound on every entry written through write(): the largest slot stored in a row since "
          "the row was last zeroed. A forward whose rows hold a slot outside the KV pool is "
          "refused "
          "(one compare against this while the table holds only pool rows).")
      .def(
          "write",
          [](PyReqToTokenPool& p, int row, int start, nb::handle slots) {
            // After the conversion, which may run Python code (a generator, __index__,
            // __dlpack__) and so let a forward on another thread start.
            const std::vector<int64_t> values = host_ints(slots, "slots");
            refuse_while_read(p, "write");
            check(p.pool->write(row, start, values));
          },
          "row"_a, "start"_a, "slots"_a,
          "Write slots into row `row` (one alloc() handed out and not yet freed) at columns "
          "[start, start + len(slots)) (table and host mirror).")
      .def(
          "table", [](PyReqToTokenPool& p) { return to_array(p.pool->table(), nb::find(&p)); },
          "The table as a zero-copy DLPack array on the pool's device (write through write(), "
          "which also updates the host mirror that planning reads and max_slot, which forwards "
          "check against the KV pool: entries stored into this array directly bypass both).")
      .def(
          "host_row",
          [](PyReqToTokenPool& p, int row) {
            const int32_t* data = p.pool->host_row(row);
            if (data == nullptr) {
              raise_invalid("row " + std::to_string(row) + " is outside [0, " +
                            std::to_string(p.pool->max_reqs()) + "]");
            }
            return numpy_array(std::vector<int32_t>(data, data + p.pool->max_context_len()));
          },
          "row"_a, "A NumPy copy of the host mirror of row `row`.");

  nb::class_<PageAllocator>(m, "PageAllocator",
                            "Free list of page ids 1..num_pages (page 0 is reserved).")
      .def(
          "__init__",
          [](PageAllocator* self, int64_t num_pages, int page_size) {
            new (self) PageAllocator(check(PageAllocator::create(num_pages, page_size)));
          },
          "num_pages"_a, "page_size"_a)
      .def_prop_ro("page_size", &PageAllocator::page_size)
      .def_prop_ro("num_pages", &PageAllocator::num_pages)
      .def_prop_ro("available_pages", &PageAllocator::available_pages)
      .def_prop_ro("available_slots", &PageAllocator::available_slots)
      .def(
          "alloc_extend",
          [](PageAllocator& a, nb::handle prefix_lens, nb::handle seq_lens, nb::handle last_loc) {
            const auto prefix = host_ints32(prefix_lens, "prefix_lens");
            const auto seq = host_ints32(seq_lens, "seq_lens");
            const auto last = host_ints(last_loc, "last_loc");
            return numpy_array(check(a.alloc_extend(prefix, seq, last)));
          },
          "prefix_lens"_a, "seq_lens"_a, "last_loc"_a,
          "Slots (int64) of the new tokens of every request, concatenated in request order.")
      .def(
          "alloc_decode",
          [](PageAllocator& a, nb::handle seq_lens, nb::handle last_loc) {
            const auto seq = host_ints32(seq_lens, "seq_lens");
            const auto last = host_ints(last_loc, "last_loc");
            return numpy_array(check(a.alloc_decode(seq, last)));
          },
          "seq_lens"_a, "last_loc"_a)
      .def(
          "alloc_pages",
          [](PageAllocator& a, int64_t n) { return numpy_array(check(a.alloc_pages(n))); }, "n"_a)
      .def(
          "free_slots",
          [](PageAllocator& a, nb::handle slots) {
            check(a.free_slots(host_ints(slots, "slots")));
          },
          "slots"_a)
      .def(
          "free_pages",
          [](PageAllocator& a, nb::handle pages) {
            check(a.free_pages(host_ints(pages, "pages")));
          },
          "pages"_a)
      .def("is_allocated", &PageAllocator::is_allocated, "page"_a);

  m.def(
      "last_locs",
      [](PyReqToTokenPool& pool, nb::handle req_pool_indices, nb::handle prefix_lens) {
        const auto rows = host_ints32(req_pool_indices, "req_pool_indices");
        const auto prefix = host_ints32(prefix_lens, "prefix_lens");
        return numpy_array(check(last_locs_host(*pool.pool, rows, prefix)));
      },
      "req_to_token_pool"_a, "req_pool_indices"_a, "prefix_lens"_a,
      "last_loc for PageAllocator.alloc_extend: req_to_token[r, prefix_len - 1], or -1.");

  nb::class_<PyKVPool> kv_pool(m, "KVPool", "Base class of MHAKVPool and MLAKVPool.");
  bind_pool_common(kv_pool);

  nb::class_<PyMHAKVPool, PyKVPool>(
      m, "MHAKVPool",
      "Per-layer K [rows, num_kv_heads, head_dim] and V [rows, num_kv_heads, v_head_dim] buffers, "
      "rows = size + page_size (page 0 is reserved).")
      .def(
          "__init__",
          [](PyMHAKVPool* self, int num_layers, int64_t size, int page_size, int num_kv_heads,
             int head_dim, std::optional<int> v_head_dim, nb::handle dtype, nb::handle device) {
            KVPoolConfig c;
            c.num_layers = num_layers;
            c.size = size;
            c.page_size = page_size;
            c.num_kv_heads = num_kv_heads;
            c.head_dim = head_dim;
            c.v_head_dim = v_head_dim.value_or(head_dim);
            c.dtype = parse_dtype_arg(dtype, "dtype");
            c.device = parse_device_arg(device);
            auto pool = check(MHAKVPool::create(c));
            new (self) PyMHAKVPool();
            self->pool = std::move(pool);
          },
          "num_layers"_a, "size"_a, "page_size"_a, "num_kv_heads"_a, "head_dim"_a,
          "v_head_dim"_a = nb::none(), "dtype"_a = "bf16", "device"_a = "cpu",
          "A pool owned by attnkit (host memory zeroed; CUDA memory uninitialised).")
      .def_static(
          "wrap",
          [](nb::handle k, nb::handle v, int page_size, nb::handle dtype, nb::handle k_scales,
             nb::handle v_scales) {
            auto result = std::make_unique<PyMHAKVPool>();
            const std::optional<DType> as = optional_dtype(dtype, "dtype");
            const std::vector<TensorView> kv = layer_views(k, "k", as, &result->keep_alive);
            const std::vector<TensorView> vv = layer_views(v, "v", as, &result->keep_alive);
            if (kv.empty()) raise_invalid("k: no layers given");
            std::vector<TensorView> ks, vs;
            if (!k_scales.is_none()) {
              ks = layer_views(k_scales, "k_scales", DType::kFP8E4M3, &result->keep_alive);
            }
            if (!v_scales.is_none()) {
              vs = layer_views(v_scales, "v_scales", DType::kFP8E4M3, &result->keep_alive);
            }
            const TensorView& first = kv.front();
            if (first.ndim != 3 || vv.empty() || vv.front().ndim != 3) {
              raise_invalid(
                  "k / v: expected per-layer [rows, num_kv_heads, dim] arrays, got k[0] " +
                  first.describe());
            }
            KVPoolConfig c;
            c.num_layers = static_cast<int>(kv.size());
            c.page_size = page_size;
            c.size = first.size(0) - page_size;
            c.num_kv_heads = static_cast<int>(first.size(1));
            c.head_dim = static_cast<int>(first.size(2));
            c.v_head_dim = static_cast<int>(vv.front().size(2));
            c.dtype = first.dtype;
            c.device = first.device;
            result->pool = check(MHAKVPool::wrap(c, kv, vv, ks, vs));
            return result;
          },
          "k"_a, "v"_a, "page_size"_a, "dtype"_a = nb::none(), "k_scales"_a = nb::none(),
          "v_scales"_a = nb::none(),
          "A pool over caller-owned buffers (zero-copy): k / v are lists with one contiguous "
          "[size + page_size, num_kv_heads, dim] array per layer (or one [num_layers, ...] array). "
          "dtype reinterprets raw storage (uint8 as fp8_e4m3 / fp8_e5m2 / packed fp4_e2m1, a "
          "16-bit integer array as bf16 / f16). fp4 needs k_scales / v_scales (uint8 e4m3 codes, "
          "[rows, heads, dim / 16]). The arrays stay referenced by the pool.")
      .def(
          "k_buffer",
          [](PyMHAKVPool& p, int layer) {
            return layer_array(p, "k_buffer", layer, [&](int l) { return p.mha().k_buffer(l); });
          },
          "layer"_a, "Zero-copy DLPack view (fp8/fp4 as uint8 storage).")
      .def(
          "v_buffer",
          [](PyMHAKVPool& p, int layer) {
            return layer_array(p, "v_buffer", layer, [&](int l) { return p.mha().v_buffer(l); });
          },
          "layer"_a)
      .def(
          "k_scale_buffer",
          [](PyMHAKVPool& p, int layer) {
            return layer_array(p, "k_scale_buffer", layer,
                               [&](int l) { return p.mha().k_scale_buffer(l); });
          },
          "layer"_a, "fp4 pools only: e4m3 block scales (uint8) [rows, heads, head_dim / 16].")
      .def(
          "v_scale_buffer",
          [](PyMHAKVPool& p, int layer) {
            return layer_array(p, "v_scale_buffer", layer,
                               [&](int l) { return p.mha().v_scale_buffer(l); });
          },
          "layer"_a);

  nb::class_<PyMLAKVPool, PyKVPool>(
      m, "MLAKVPool",
      "Per-layer [rows, 1, kv_lora_rank + qk_rope_head_dim] latent buffer; V is a view of its "
      "first kv_lora_rank columns.")
      .def(
          "__init__",
          [](PyMLAKVPool* self, int num_layers, int64_t size, int page_size, int kv_lora_rank,
             int qk_rope_head_dim, nb::handle dtype, nb::handle device) {
            KVPoolConfig c;
            c.num_layers = num_layers;
            c.size = size;
            c.page_size = page_size;
            c.kv_lora_rank = kv_lora_rank;
            c.qk_rope_head_dim = qk_rope_head_dim;
            c.dtype = parse_dtype_arg(dtype, "dtype");
            c.device = parse_device_arg(device);
            auto pool = check(MLAKVPool::create(c));
            new (self) PyMLAKVPool();
            self->pool = std::move(pool);
          },
          "num_layers"_a, "size"_a, "page_size"_a, "kv_lora_rank"_a, "qk_rope_head_dim"_a,
          "dtype"_a = "bf16", "device"_a = "cpu")
      .def_static(
          "wrap",
          [](nb::handle kv, int page_size, int kv_lora_rank, nb::handle dtype, nb::handle scales) {
            auto result = std::make_unique<PyMLAKVPool>();
            const std::optional<DType> as = optional_dtype(dtype, "dtype");
            const std::vector<TensorView> views = layer_views(kv, "kv", as, &result->keep_alive);
            if (views.empty()) raise_invalid("kv: no layers given");
            std::vector<TensorView> sv;
            if (!scales.is_none()) {
              sv = layer_views(scales, "scales", DType::kFP8E4M3, &result->keep_alive);
            }
            const TensorView& first = views.front();
            if (first.ndim != 3) {
              raise_invalid("kv: expected per-layer [rows, 1, row_dim] arrays, got kv[0] " +
                            first.describe());
            }
            KVPoolConfig c;
            c.num_layers = static_cast<int>(views.size());
            c.page_size = page_size;
            c.size = first.size(0) - page_size;
            c.kv_lora_rank = kv_lora_rank;
            c.qk_rope_head_dim = static_cast<int>(first.size(2)) - kv_lora_rank;
            c.dtype = first.dtype;
            c.device = first.device;
            result->pool = check(MLAKVPool::wrap(c, views, sv));
            return result;
          },
          "kv"_a, "page_size"_a, "kv_lora_rank"_a, "dtype"_a = nb::none(), "scales"_a = nb::none(),
          "A pool over caller-owned latent buffers (zero-copy).")
      .def_prop_ro("kv_lora_rank",
                   [](const PyMLAKVPool& p) { return p.pool->config().kv_lora_rank; })
      .def_prop_ro("qk_rope_head_dim",
                   [](const PyMLAKVPool& p) { return p.pool->config().qk_rope_head_dim; })
      .def(
          "kv_buffer",
          [](PyMLAKVPool& p, int layer) {
            return layer_array(p, "kv_buffer", layer, [&](int l) { return p.mla().kv_buffer(l); });
          },
          "layer"_a)
      .def(
          "v_view",
          [](PyMLAKVPool& p, int layer) {
            return layer_array(p, "v_view", layer, [&](int l) { return p.mla().v_view(l); });
          },
          "layer"_a)
      .def(
          "scale_buffer",
          [](PyMLAKVPool& p, int layer) {
            return layer_array(p, "scale_buffer", layer,
                               [&](int l) { return p.mla().scale_buffer(l); });
          },
          "layer"_a);
}

}  // namespace attnkit::python
