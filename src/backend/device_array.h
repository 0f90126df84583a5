// A grow-only device buffer of one element type: the metadata arrays a backend plans into (token
// indices, page tables, split plans). reserve() allocates only when the request outgrows the
// capacity, so planning reuses memory and CUDA-graph replay (which never grows) allocates nothing.
#pragma once

#include <algorithm>
#include <cstdint>

#include "attnkit/status.h"
#include "attnkit/tensor.h"

namespace attnkit {

template <typename T>
struct DeviceArray {
  Buffer buffer;
  int64_t capacity = 0;  // elements
  T* data() const { return static_cast<T*>(buffer.data()); }
  Status reserve(Device device, int64_t n) {
    if (n <= capacity) return Status::ok();
    ATTNKIT_ASSIGN_OR_RETURN(buffer, Buffer::allocate(device, std::max<int64_t>(n, 1) *
                                                                  static_cast<int64_t>(sizeof(T))));
    capacity = n;
    return Status::ok();
  }
};

}  // namespace attnkit
