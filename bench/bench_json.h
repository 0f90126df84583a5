// JSON text parsing shared by the case files (bench_case_file.h) and `run --case` specs
// (bench_spec_json.cpp): every nlohmann error comes back as a Status that names `source`, and a
// key given twice in one object is refused (nlohmann keeps the last silently).
//
//   parse_json_text<nlohmann::json>(R"({"kv_len": 1e999})", "cases.json", &root)
//     -> invalid_argument "cases.json: not valid JSON: number overflow parsing '1e999'"
//   parse_json_text<nlohmann::json>(R"({"a": 1, "a": 2})", "case spec", &root)
//     -> invalid_argument "case spec: key \"a\" is given twice in one object"
#pragma once

#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "attnkit/status.h"
#include "core/json_text.h"

namespace attnkit::bench {

// nlohmann's what() without its "[json.exception.parse_error.101] " tag.
inline std::string json_error_text(const nlohmann::json::exception& e) {
  return without_json_exception_tag(e.what());
}

// A soft-cap value (logit_cap) of the case files and of `run --case` specs as f32, into *cap: a
// finite number >= 0 (0 = off) that f32 holds. kNotACap: not such a number (a double past FLT_MAX
// would become an infinite cap, no soft-cap at all, silently); kRoundsToZero: a positive value
// below the smallest f32 (1e-50), which would turn into "off".
enum class LogitCapJson { kOk, kNotACap, kRoundsToZero };
template <typename Json>
LogitCapJson logit_cap_from_json(const Json& v, float* cap) {
  if (!v.is_number() || !(v.template get<double>() >= 0.0) ||
      v.template get<double>() > static_cast<double>(std::numeric_limits<float>::max())) {
    return LogitCapJson::kNotACap;
  }
  *cap = v.template get<float>();
  return *cap == 0.f && v.template get<double>() != 0.0 ? LogitCapJson::kRoundsToZero
                                                        : LogitCapJson::kOk;
}

template <typename Json>
Status parse_json_text(const std::string& text, const std::string& source, Json* out) {
  ATTNKIT_RETURN_IF_ERROR(check_json_nesting(text, source, "case files nest a few levels"));
  std::vector<std::set<std::string>> keys;  // one set per object being parsed
  std::string duplicate;
  const auto on_event = [&](int /*depth*/, nlohmann::json::parse_event_t event, Json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start) {
      keys.emplace_back();
    } else if (event == Event::object_end && !keys.empty()) {
      keys.pop_back();
    } else if (event == Event::key && !keys.empty() && duplicate.empty() &&
               !keys.back().insert(parsed.template get<std::string>()).second) {
      duplicate = parsed.template get<std::string>();
    }
    return true;
  };
  try {
    *out = Json::parse(text, on_event);
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for 1e999
    return Status::invalid_argument(source + ": not valid JSON: " + json_error_text(e));
  }
  if (!duplicate.empty()) {
    return Status::invalid_argument(source + ": key \"" + duplicate +
                                    "\" is given twice in one object (each key once)");
  }
  return Status::ok();
}

}  // namespace attnkit::bench
