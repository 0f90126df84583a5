// Value checks for numeric CLI options, shared by every subcommand. CLI11's PositiveNumber /
// NonNegativeNumber answer a bad value with "Value 0 not in range 0.000000 to 1797...", which
// names neither the rule nor the type; these say what is allowed:
//   attnkit select: --page-size: 0 is not allowed: must be an integer >= 1
// The help text keeps CLI11's names (INT:POSITIVE, INT:NONNEGATIVE, FLOAT:POSITIVE).
// The integer validators hand CLI11 the decimal number they checked ("010" -> "10"; CLI11's own
// conversion would read it as octal 8): attach them with ->transform(), as ->check() discards a
// validator's change to the value.
#pragma once

#include <CLI/CLI.hpp>

namespace attnkit::cli {

// A whole number in [lo, INT_MAX] (help: INT>=lo); the option's own rules (e.g. -1 = off) are
// checked where it is used.
CLI::Validator integer_at_least(int lo);
// A whole number in [lo, hi] (help: INT in [lo, hi]), for options whose larger values overflow
// the arithmetic built on them or could never finish (e.g. --speculative-num-steps, --iters).
CLI::Validator integer_in_range(int lo, int hi);
// A whole number in [1, INT_MAX] (help: POSITIVE).
CLI::Validator positive_int();
// A whole number in [0, INT_MAX] (help: NONNEGATIVE).
CLI::Validator non_negative_int();
// A finite decimal number > 0 (help: POSITIVE).
CLI::Validator positive_number();
// A decimal number in [lo, hi] (help: FLOAT in [lo, hi]), lo > 0: a rate or a ceiling that must be
// plausible (a subnormal one prints as 0 and divides to inf).
CLI::Validator number_in_range(double lo, double hi);
// Any string but the empty one (`--device ""` is not "no --device"); `accepted` lists the values.
CLI::Validator non_empty(const std::string& accepted);

}  // namespace attnkit::cli
