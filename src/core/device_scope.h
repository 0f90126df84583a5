// The CUDA device a call runs on. A backend made for cuda:N (BackendContext::device) launches its
// kernels and allocates on N whatever device its caller left current (a serving process that
// drives several GPUs from one thread switches devices between ranks), and gives the caller its
// device back when the call returns. CPU devices: nothing to do.
#pragma once

#include <string_view>

#include "attnkit/status.h"
#include "attnkit/tensor.h"

namespace attnkit {

// Makes `device` current for the scope's lifetime (a cudaGetDevice, and a cudaSetDevice only when
// another device is current) and restores the previous device at its end. status(): the error of
// a failed switch (an ordinal past the machine's devices), naming `device`; callers return it
// before any launch.
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

// kInvalidArgument when the non-null `stream` belongs to another device than `device` (its kernels
// would run there, on pointers of `device`), naming `what` (the parameter), both devices and the
// fix. A null stream is the current device's default stream: inside a DeviceScope, `device`'s.
Status check_stream_device(StreamHandle stream, const Device& device, std::string_view what);

}  // namespace attnkit
