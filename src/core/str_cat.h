// cat(a, b, ...): the arguments streamed into one string, for error messages that name the
// parameter, its value and what is allowed.
#pragma once

#include <sstream>
#include <string>

namespace attnkit {

template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

}  // namespace attnkit
