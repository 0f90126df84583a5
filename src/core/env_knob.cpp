#include "core/env_knob.h"

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>
#include <system_error>

#include "core/str_cat.h"

namespace attnkit {
namespace {

// The variable's value; nullopt when unset or empty.
std::optional<std::string> env_value(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

}  // namespace

std::optional<int> parse_env_int(std::string_view text) {
  if (text.empty() || text.front() == '+') return std::nullopt;
  int value = 0;
  const char* first = text.data();
  const char* last = first + text.size();
  const std::from_chars_result r = std::from_chars(first, last, value, 10);
  if (r.ec != std::errc() || r.ptr != last) return std::nullopt;
  return value;
}

bool warn_bad_env(const char* name, std::string_view value, std::string_view accepted,
                  std::string_view used) {
  static std::mutex mu;
  static std::set<std::string> warned;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!warned.insert(name).second) return false;
  }
  const std::string msg = cat("attnkit: ignoring ", name, "=", value, " (accepted: ", accepted,
                              "); using ", used, "\n");
  std::fputs(msg.c_str(), stderr);
  std::fflush(stderr);
  return true;
}

bool env_flag(const char* name, bool default_on) {
  const std::optional<std::string> v = env_value(name);
  if (!v) return default_on;
  if (*v == "0") return false;
  if (*v == "1") return true;
  warn_bad_env(name, *v, "0, 1", default_on ? "1" : "0");
  return default_on;
}

int env_int_if(const char* name, int default_value, const std::function<bool(int)>& ok,
               std::string_view accepted) {
  const std::optional<std::string> v = env_value(name);
  if (!v) return default_value;
  const std::optional<int> parsed = parse_env_int(*v);
  if (parsed && ok(*parsed)) return *parsed;
  warn_bad_env(name, *v, accepted, std::to_string(default_value));
  return default_value;
}

// env_int and env_int_range read the variable before they build the description of what is
// accepted (only a bad value needs it): some knobs are read on hot host paths (the flashinfer
// decode planner reads ATTNKIT_DECODE_BLOCKS_PER_SM at every CUDA-graph replay refresh).
int env_int(const char* name, int default_value, std::initializer_list<int> allowed) {
  if (std::getenv(name) == nullptr) return default_value;
  return env_int_if(
      name, default_value,
      [&](int x) {
        for (int a : allowed) {
          if (a == x) return true;
        }
        return false;
      },
      join(allowed));
}

int env_int_range(const char* name, int default_value, int min_value, int max_value) {
  if (std::getenv(name) == nullptr) return default_value;
  return env_int_if(
      name, default_value, [&](int x) { return x >= min_value && x <= max_value; },
      cat("integers ", min_value, "..", max_value));
}

std::string env_choice(const char* name, std::initializer_list<std::string_view> accepted,
                       std::string_view default_value) {
  const std::optional<std::string> v = env_value(name);
  if (!v) return std::string(default_value);
  for (std::string_view a : accepted) {
    if (*v == a) return *v;
  }
  warn_bad_env(name, *v, join(accepted), default_value);
  return std::string(default_value);
}

}  // namespace attnkit
