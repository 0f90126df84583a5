// Limits on the JSON text attnkit reads (model configs, bench case files, `run --case` specs),
// checked on the raw text before nlohmann parses it. nlohmann parses iteratively, but its dump,
// copy and comparison recurse once per nesting level: a 200 KB config nested 100000 levels deep
// overflowed the stack (SIGSEGV, no message) in the first error message that quoted the value.
// Real inputs nest a handful of levels.
//
//   json_nesting_past(R"({"a": [[1]]})", 2)  -> 6 (the '[' that opens level 3)
//   json_nesting_past(R"({"a": "[[[["})", 2) -> npos (brackets inside strings do not count)
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace attnkit {

// The most levels of arrays / objects the JSON readers accept.
inline constexpr int kMaxJsonNesting = 64;

// The byte offset of the first '[' or '{' (outside strings) that opens level max_depth + 1, or
// std::string_view::npos when the text stays within max_depth levels. Malformed text is the
// parser's to report: this only counts.
inline size_t json_nesting_past(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return i;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return std::string_view::npos;
}

// An nlohmann exception's what() without its "[json.exception.parse_error.101] " tag.
inline std::string without_json_exception_tag(const std::string& what) {
  const size_t tag_end = what.rfind("] ", what.find(' '));
  return what.rfind("[json.exception.", 0) == 0 && tag_end != std::string::npos
             ? what.substr(tag_end + 2)
             : what;
}

}  // namespace attnkit
