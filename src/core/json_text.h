// Limits on the JSON text attnkit reads (model configs, bench case files, `run --case` specs),
// checked on the raw text before nlohmann parses it. nlohmann parses iteratively, but its dump,
// copy and comparison recurse once per nesting level: a 200 KB config nested 100000 levels deep
// overflowed the stack (SIGSEGV, no message) in the first error message that quoted the value.
// Real inputs nest a handful of levels.
//
//   json_nesting_past(R"({"a": [[1]]})", 2)  -> 6 (the '[' that opens level 3)
//   json_nesting_past(R"({"a": "[[[["})", 2) -> npos (brackets inside strings do not count)
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>

#include "attnkit/status.h"

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

// "line 3, column 7 (byte 42)" for a 1-based byte offset (as nlohmann reports parse errors).
inline std::string describe_position(std::string_view text, size_t byte) {
  const size_t end = std::min(byte == 0 ? size_t{0} : byte - 1, text.size());
  size_t line = 1;
  size_t column = 1;
  for (size_t i = 0; i < end; ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(column) + " (byte " +
         std::to_string(byte) + ")";
}

// kInvalidArgument naming `source` and where the text first nests past kMaxJsonNesting levels;
// ok otherwise. `what` says what such a file usually nests ("a config.json nests a few levels").
inline Status check_json_nesting(std::string_view text, const std::string& source,
                                 std::string_view what) {
  const size_t too_deep = json_nesting_past(text, kMaxJsonNesting);
  if (too_deep == std::string_view::npos) return Status::ok();
  return Status::invalid_argument(
      source + ": arrays / objects nested more than " + std::to_string(kMaxJsonNesting) +
      " levels deep at " + describe_position(text, too_deep + 1) + " (" + std::string(what) + ")");
}

// `text` cut to at most max_bytes bytes and then "..." when it is longer, the cut moved back to
// the start of a UTF-8 sequence (continuation bytes are 10xxxxxx), so a message never ends in
// half a character.
inline std::string utf8_prefix(const std::string& text, size_t max_bytes) {
  if (text.size() <= max_bytes) return text;
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return text.substr(0, cut) + "...";
}

// A JSON value as an error message quotes it: its text, cut after 80 bytes (a message is one
// line; a 16 MiB file's array is not). Json: nlohmann::json (not included here).
template <typename Json>
std::string json_excerpt(const Json& value) {
  constexpr size_t kMaxBytes = 80;
  return utf8_prefix(value.dump(), kMaxBytes);
}

// An nlohmann exception's what() without its "[json.exception.parse_error.101] " tag.
inline std::string without_json_exception_tag(const std::string& what) {
  const size_t tag_end = what.rfind("] ", what.find(' '));
  return what.rfind("[json.exception.", 0) == 0 && tag_end != std::string::npos
             ? what.substr(tag_end + 2)
             : what;
}

}  // namespace attnkit
