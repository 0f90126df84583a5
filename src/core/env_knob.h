// Tuning knobs read from ATTNKIT_* environment variables. Unset or empty: the default. A value
// outside the knob's accepted set is reported once per variable per process on stderr,
//   attnkit: ignoring ATTNKIT_X=<value> (accepted: ...); using <default>
// and the default is used, so a typo in an A/B (ATTNKIT_FA3_FP8_PROMOTE=l) does not silently
// measure the default.
#pragma once

#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

namespace attnkit {

// All of `text` as a base-10 int: an optional '-', digits, nothing else (no spaces, no '+', no
// trailing characters); nullopt if malformed or outside int.
std::optional<int> parse_env_int(std::string_view text);

// "0": off, "1": on.
bool env_flag(const char* name, bool default_on);

// One of `allowed`.
int env_int(const char* name, int default_value, std::initializer_list<int> allowed);

// An integer in [min_value, max_value].
int env_int_range(const char* name, int default_value, int min_value, int max_value);

// An integer for which `ok` holds; `accepted` describes them for the message.
int env_int_if(const char* name, int default_value, const std::function<bool(int)>& ok,
               std::string_view accepted);

// One of `accepted`, returned as written; `default_value` when unset, empty or not accepted (it
// need not be one of `accepted`: it may describe a default that has no spelling).
std::string env_choice(const char* name, std::initializer_list<std::string_view> accepted,
                       std::string_view default_value);

// The message above, once per `name` per process (thread-safe); false if `name` was reported
// before. For knobs whose parsing does not fit the helpers.
bool warn_bad_env(const char* name, std::string_view value, std::string_view accepted,
                  std::string_view used);

}  // namespace attnkit
