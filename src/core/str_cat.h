// cat(a, b, ...): the arguments streamed into one string, for error messages that name the
// parameter, its value and what is allowed; join(items, sep): a list of them.
#pragma once

#include <sstream>
#include <string>
#include <string_view>

namespace attnkit {

template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// The items of a container (anything `os << item` prints) with `sep` between them:
// join(std::vector<int>{16, 32, 64}, ",") == "16,32,64", join(names) == "fa3, triton".
template <typename Container>
std::string join(const Container& items, std::string_view sep = ", ") {
  std::ostringstream os;
  bool first = true;
  for (const auto& item : items) {
    if (!first) os << sep;
    os << item;
    first = false;
  }
  return os.str();
}

}  // namespace attnkit
