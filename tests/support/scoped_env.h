// Sets an environment variable for one scope, restoring the previous value (or unsetting it) when
// the scope ends. Backends and engines read their experiment knobs when they are created, so a test
// creates the backend inside the scope.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace attnkit::test_support {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name); old != nullptr) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace attnkit::test_support
