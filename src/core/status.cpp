// Status code names and the one-line rendering of a Status.
#include "attnkit/status.h"

namespace attnkit {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid_argument";
    case StatusCode::kUnsupported:
      return "unsupported";
    case StatusCode::kNotBuilt:
      return "not_built";
    case StatusCode::kOutOfMemory:
      return "out_of_memory";
    case StatusCode::kNotFound:
      return "not_found";
    case StatusCode::kCudaError:
      return "cuda_error";
    case StatusCode::kInternal:
      return "internal";
  }
  return "unknown_status_code";
}

std::string Status::to_string() const {
  std::string out = status_code_name(code_);
  if (!message_.empty()) {
    out += ": ";
    out += message_;
  }
  return out;
}

}  // namespace attnkit
