// Factory for the `triton` backend (CUDA builds only); its descriptor lives in
// src/registry/builtin.cpp.
#pragma once

#include <memory>

#include "attnkit/backend.h"

namespace attnkit {

Result<std::unique_ptr<AttentionBackend>> create_triton_backend(const BackendContext& ctx);

}  // namespace attnkit
