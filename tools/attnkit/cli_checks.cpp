#include "tools/attnkit/cli_checks.h"

#include <charconv>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>

namespace attnkit::cli {
namespace {

CLI::Validator int_at_least(int lo, const std::string& help_name) {
  return CLI::Validator(
      [lo](std::string& value) -> std::string {
        const std::string allowed =
            "must be an integer from " + std::to_string(lo) + " to " + std::to_string(INT_MAX);
        int64_t v = 0;
        const char* end = value.data() + value.size();
        const auto [ptr, ec] = std::from_chars(value.data(), end, v);
        if (value.empty() || ec == std::errc::invalid_argument || ptr != end) {
          return "\"" + value + "\" is not an integer (" + allowed + ")";
        }
        if (ec == std::errc::result_out_of_range || v < lo || v > INT_MAX) {
          return value + " is not allowed: " + allowed;
        }
        return std::string();
      },
      help_name);
}

}  // namespace

CLI::Validator integer_at_least(int lo) { return int_at_least(lo, ">=" + std::to_string(lo)); }

CLI::Validator positive_int() { return int_at_least(1, "POSITIVE"); }

CLI::Validator non_negative_int() { return int_at_least(0, "NONNEGATIVE"); }

CLI::Validator positive_number() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        // Decimal only (std::stod would also read "0x10" as 16 and "inf"); from_chars reports a
        // number past double's range (1e400) as out of range, not as "not a number".
        double v = 0.0;
        const char* end = value.data() + value.size();
        // A leading '+' as std::stod took it (from_chars alone refuses it).
        const bool plus = value.size() > 1 && value[0] == '+' && value[1] != '-' && value[1] != '+';
        const char* begin = value.data() + (plus ? 1 : 0);
        const auto [ptr, ec] = std::from_chars(begin, end, v, std::chars_format::general);
        if (value.empty() || ec == std::errc::invalid_argument || ptr != end) {
          return "\"" + value + "\" is not a number (must be a decimal number > 0)";
        }
        if (ec == std::errc::result_out_of_range) {
          return value + " is out of range (must be a number > 0 within double's range)";
        }
        if (!std::isfinite(v) || v <= 0.0) return value + " is not allowed: must be a number > 0";
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
