// The CUDA device a call runs on. A backend made for cuda:N (BackendContext::device) launches its
// kernels and allocates on N whatever device its caller left current (a serving process that
// drives several GPUs from one thread switches devices between ranks), and gives the caller its
// device back when the call returns. CPU devices: nothing to do.
#pragma once

#include <string_view>

#include "attnkit/forward_batch.h"
#include "attnkit/kv_cache.h"
#include "attnkit/status.h"
#include "attnkit/tensor.h"

namespace attnkit {

// Makes `device` current for the scope's lifetime (a cudaGetDevice, and a cudaSetDevice only when
// another device is current) and restores the previous device at its end, unless that device has
// no primary context (the caller never used it: it was current only by default). Restoring it
// would create one, hundreds of MB on a GPU the process does not use, so `device` stays current
// then, as PyTorch's device guard does. status(): the error of a failed switch (an ordinal past
// the machine's devices), naming `device`; callers return it before any launch.
class DeviceScope {
 public:
  explicit DeviceScope(const Device& device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  const Status& status() const { return status_; }

 private:
  int previous_ = -1;  // the device to restore, or -1: nothing switched
  Status status_;
};

// Whether CUDA device `ordinal` has an active primary context (true when the driver cannot say;
// false without CUDA).
bool cuda_has_primary_context(int ordinal);

// kInvalidArgument when the non-null `stream` belongs to another device than `device` (its kernels
// would run there, on pointers of `device`), naming `what` (the parameter), both devices and the
// fix. A null stream is the current device's default stream: inside a DeviceScope, `device`'s
// (so are the special handles cudaStreamLegacy / cudaStreamPerThread: check them inside one).
// Needs CUDA 12.8 (cudaStreamGetDevice); older toolkits skip the check, and so does a stream that
// is being captured into a CUDA graph (asking its device there would invalidate the capture).
// `where` ends the message: "the backend runs on" (the default) or "the pool is on".
Status check_stream_device(StreamHandle stream, const Device& device, std::string_view what,
                           std::string_view where = "the backend runs on");

// For the caller-owned memory of a KV pool whose device the caller states (MHAKVPool::wrap /
// MLAKVPool::wrap; a wrong claim would fault inside a kernel): kInvalidArgument naming `what` when
// `ptr` (not null) is not device memory of `device` (a CUDA device): memory CUDA neither allocated
// nor registered (pageable host memory, say), pinned host memory, or another GPU's memory.
// Managed memory passes. kCudaError when CUDA cannot answer (no device, no driver). Asks in
// `device`'s scope, so no context is made on a device the caller does not use.
Status check_memory_on_device(const void* ptr, const Device& device, std::string_view what);

// kInvalidArgument naming `owner` when the KV pool or the request table (either may be null) is
// not on `device`: the kernels would read another GPU's memory through their pointers.
Status check_pools_on_device(std::string_view owner, const KVPool* kv_pool,
                             const ReqToTokenPool* req_to_token_pool, const Device& device);

// The device checks of a CUDA backend's init_forward_metadata, inside its DeviceScope: the
// forward's stream (`stream`: ForwardBatch::stream, or the context's when that is null) and the
// batch's pools are `device`'s.
Status check_batch_devices(const ForwardBatch& batch, StreamHandle stream, const Device& device);

}  // namespace attnkit
