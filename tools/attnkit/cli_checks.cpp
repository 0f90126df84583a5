#include "tools/attnkit/cli_checks.h"

#include <charconv>
#include <climits>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>

namespace attnkit::cli {
namespace {

CLI::Validator int_in_range(int lo, int hi, const std::string& help_name) {
  return CLI::Validator(
      [lo, hi](std::string& value) -> std::string {
        const std::string allowed =
            "must be an integer from " + std::to_string(lo) + " to " + std::to_string(hi);
        int64_t v = 0;
        const char* end = value.data() + value.size();
        const auto [ptr, ec] = std::from_chars(value.data(), end, v);
        if (value.empty() || ec == std::errc::invalid_argument || ptr != end) {
          return "\"" + value + "\" is not an integer (" + allowed + ")";
        }
        if (ec == std::errc::result_out_of_range || v < lo || v > hi) {
          return value + " is not allowed: " + allowed;
        }
        // CLI11 converts the value again with strtoll(base 0), which reads "010" as octal 8: hand
        // it the decimal number that was checked.
        value = std::to_string(v);
        return std::string();
      },
      help_name);
}

// The decimal number in value (a leading '+' as std::stod took it), or the message for a value
// that is not one; "allowed" says what the option takes.
std::string parse_decimal(const std::string& value, const std::string& allowed, double* v) {
  // Decimal only (std::stod would also read "0x10" as 16 and "inf"); from_chars reports a number
  // past double's range (1e400) as out of range, not as "not a number".
  const char* end = value.data() + value.size();
  const bool plus = value.size() > 1 && value[0] == '+' && value[1] != '-' && value[1] != '+';
  const char* begin = value.data() + (plus ? 1 : 0);
  const auto [ptr, ec] = std::from_chars(begin, end, *v, std::chars_format::general);
  if (value.empty() || ec == std::errc::invalid_argument || ptr != end) {
    return "\"" + value + "\" is not a number (must be " + allowed + ")";
  }
  if (ec == std::errc::result_out_of_range) {
    return value + " is out of range (must be " + allowed + ")";
  }
  return std::string();
}

std::string shortest(double x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

}  // namespace

CLI::Validator integer_at_least(int lo) {
  return int_in_range(lo, INT_MAX, ">=" + std::to_string(lo));
}

CLI::Validator integer_in_range(int lo, int hi) {
  return int_in_range(lo, hi, "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

CLI::Validator positive_int() { return int_in_range(1, INT_MAX, "POSITIVE"); }

CLI::Validator non_negative_int() { return int_in_range(0, INT_MAX, "NONNEGATIVE"); }

CLI::Validator number_in_range(double lo, double hi) {
  const std::string range = "[" + shortest(lo) + ", " + shortest(hi) + "]";
  return CLI::Validator(
      [lo, hi, range](std::string& value) -> std::string {
        const std::string allowed = "a decimal number in " + range;
        double v = 0.0;
        if (std::string why = parse_decimal(value, allowed, &v); !why.empty()) return why;
        if (!(v >= lo && v <= hi)) return value + " is not allowed: must be " + allowed;
        return std::string();
      },
      "in " + range);
}

CLI::Validator positive_number() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        const std::string allowed = "a decimal number > 0";
        double v = 0.0;
        if (std::string why = parse_decimal(value, allowed, &v); !why.empty()) return why;
        if (!std::isfinite(v) || v <= 0.0) return value + " is not allowed: must be " + allowed;
        return std::string();
      },
      "POSITIVE");
}

CLI::Validator non_empty(const std::string& accepted) {
  return CLI::Validator(
      [accepted](std::string& value) -> std::string {
        if (!value.empty()) return std::string();
        return "the value is empty (accepted: " + accepted + ")";
      },
      "NONEMPTY");
}

}  // namespace attnkit::cli
