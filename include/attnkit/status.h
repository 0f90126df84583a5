// Status and Result<T>: how every library function reports failure.
// Library code never throws, exits or aborts on bad input; it returns a Status whose message names
// the parameter, the value and what is accepted.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>

namespace attnkit {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // a parameter is malformed or out of range
  kUnsupported,      // valid input, but this backend/kernel/build does not implement it
  kNotBuilt,         // the backend exists but was not compiled into this binary / platform
  kOutOfMemory,      // pool, page or device memory exhausted
  kNotFound,         // a named thing (backend, file, key) does not exist
  kCudaError,        // a CUDA runtime call or kernel launch failed
  kInternal,         // an internal invariant failed (a bug in attnkit)
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }
  static Status invalid_argument(std::string m) {
    return {StatusCode::kInvalidArgument, std::move(m)};
  }
  static Status unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }
  static Status not_built(std::string m) { return {StatusCode::kNotBuilt, std::move(m)}; }
  static Status out_of_memory(std::string m) { return {StatusCode::kOutOfMemory, std::move(m)}; }
  static Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status cuda_error(std::string m) { return {StatusCode::kCudaError, std::move(m)}; }
  static Status internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid_argument: page_size 16 is not supported by flashmla (needs 64)"
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// A value or an error Status. Access to value() on an error is an internal invariant violation.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  Result(Status status) : status_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    assert(!status_.is_ok() && "Result constructed from an ok Status without a value");
  }

  bool is_ok() const { return value_.has_value(); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const { return status_; }
  T& value() & {
    assert(value_.has_value());
    return *value_;
  }
  const T& value() const& {
    assert(value_.has_value());
    return *value_;
  }
  T&& value() && {
    assert(value_.has_value());
    return std::move(*value_);
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace attnkit

#define ATTNKIT_CONCAT_INNER_(a, b) a##b
#define ATTNKIT_CONCAT_(a, b) ATTNKIT_CONCAT_INNER_(a, b)

// Propagate a non-ok Status.
#define ATTNKIT_RETURN_IF_ERROR(expr)                     \
  do {                                                    \
    ::attnkit::Status attnkit_status_ = (expr);           \
    if (!attnkit_status_.is_ok()) return attnkit_status_; \
  } while (0)

// auto x = ...; from a Result<T>, propagating its error.
#define ATTNKIT_ASSIGN_OR_RETURN(lhs, expr)                     \
  auto ATTNKIT_CONCAT_(attnkit_result_, __LINE__) = (expr);     \
  if (!ATTNKIT_CONCAT_(attnkit_result_, __LINE__).is_ok())      \
    return ATTNKIT_CONCAT_(attnkit_result_, __LINE__).status(); \
  lhs = std::move(ATTNKIT_CONCAT_(attnkit_result_, __LINE__)).value()
