// Python-side owners of library objects. Each wrapper keeps alive the Python arrays whose memory
// the library object points into (zero-copy), so a view never outlives its buffer.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "attnkit/attention_layer.h"
#include "attnkit/backend.h"
#include "attnkit/forward_batch.h"
#include "attnkit/kv_cache.h"
#include "attnkit/registry.h"
#include "attnkit/selection.h"
#include "common.h"

namespace attnkit::python {

struct PyReqToTokenPool {
  std::unique_ptr<ReqToTokenPool> pool;
  // Backend calls reading the table with the GIL released (TableUse); write() and free() refuse
  // to change rows while any runs (they check it with the GIL held, after anything that could run
  // Python code, and keep the GIL until the rows are written, so a count is enough).
  std::atomic<int> readers{0};
};

// One backend call's read of a ReqToTokenPool while the GIL is released (planning reads its host
// mirror, the forward its rows): construct it with the GIL held, call done() before taking the GIL
// back. `pool` may be None (nothing to mark). Like PoolUse it guards the host side only.
class TableUse {
 public:
  explicit TableUse(nb::handle pool);
  void done();
  ~TableUse() { done(); }
  TableUse(const TableUse&) = delete;
  TableUse& operator=(const TableUse&) = delete;

 private:
  std::atomic<int>* readers_ = nullptr;
};

struct PyKVPool {
  virtual ~PyKVPool() = default;
  std::unique_ptr<KVPool> pool;
  std::vector<OutArray> keep_alive;  // caller-owned buffers of a wrapped pool (written)
  // Calls inside the pool with the GIL released (PoolUse): the low 32 bits count forwards that
  // read it, the high 32 bits set_kv calls that write it. Each kind refuses to start while the
  // other runs, so a set_kv from another thread cannot change rows under a forward.
  std::atomic<uint64_t> users{0};
};

// One call's use of a pool while the GIL is released: kForward (any number at once; every backend
// call that runs attention over the pool, save_kv's writes of the batch's new slots included) or
// kSetKv (any number at once, writing rows). A call of one kind made while the other kind is
// inside raises InvalidArgumentError naming `object`.`method` (the message is built only then);
// construct it with the GIL held, and call
// done() before the GIL is taken back (see OneCallAtATime in bind_backend.cpp: a use that outlives
// its call while waiting for the GIL starves the other thread). It guards the host side only: a
// CUDA forward returns once its kernels are queued, and a set_kv on another stream after that is
// ordered by the caller's streams, not by this.
class PoolUse {
 public:
  enum class Kind { kForward, kSetKv };
  PoolUse(PyKVPool& p, Kind kind, const char* object, const char* method);
  void done();
  ~PoolUse() { done(); }
  PoolUse(const PoolUse&) = delete;
  PoolUse& operator=(const PoolUse&) = delete;

 private:
  std::atomic<uint64_t>& users_;
  uint64_t unit_;
  bool done_ = false;
};
struct PyMHAKVPool : PyKVPool {
  MHAKVPool& mha() const { return static_cast<MHAKVPool&>(*pool); }
};
struct PyMLAKVPool : PyKVPool {
  MLAKVPool& mla() const { return static_cast<MLAKVPool&>(*pool); }
};

struct PyAttentionLayer {
  AttentionLayer layer;
  std::optional<Array> sinks;
};

struct PySpecInfo {
  SpecInfo spec;
  std::optional<Array> custom_mask;
  std::optional<Array> mask_indptr;
};

struct PyForwardBatch {
  ForwardBatch batch;
  std::vector<Array> keep_alive;  // the batch's tensors
  nb::object req_to_token_pool;   // the pools it points at
  nb::object kv_pool;
};

struct PyBackend {
  std::unique_ptr<AttentionBackend> backend;
  // A backend runs one call at a time (its plan and scratch are per instance); the calls release
  // the GIL, so a second Python thread entering is refused by this flag (OneCallAtATime).
  std::atomic<bool> busy{false};
  nb::object req_to_token_pool;
  nb::object kv_pool;
  // The static index arrays of each captured (mode, batch size): a captured graph's kernels may
  // read their addresses. A new capture of the same (mode, bs) replaces its entry;
  // init_cuda_graph_state, after which every earlier capture is refused, drops them all.
  std::map<std::pair<int, int>, std::vector<Array>> graph_buffers;
};

// The descriptor as a dict (bind_selection.cpp); shared by Backend.descriptor and matrix().
nb::dict descriptor_dict(const BackendDescriptor& d);
// "extend", "decode", ... or an attnkit.ForwardMode value.
ForwardMode parse_mode_arg(nb::handle obj);
// The Selection inside an attnkit.Selection object, or nullptr when `obj` is not one.
const Selection* selection_of(nb::handle obj);

void bind_kv(nb::module_& m);
void bind_backend(nb::module_& m);
void bind_selection(nb::module_& m);

}  // namespace attnkit::python
