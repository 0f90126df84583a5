// Runs the `attnkit` binary of this build (ATTNKIT_CLI_PATH) for CLI tests: stdout, stderr and the
// exit status of one invocation.
#pragma once

#include <string>
#include <vector>

namespace attnkit::test_support {

struct CliRun {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// `args` are appended to the binary's path as shell words (quote them where needed).
CliRun run_cli(const std::string& cli_path, const std::string& args);

std::string read_text_file(const std::string& path);
// Writes `text` to `path`, replacing the file.
void write_text_file(const std::string& path, const std::string& text);

// One bad invocation and a piece of the error line it must print.
struct CliErrorCase {
  std::string args;
  std::string expected;
};
// For each case (gtest EXPECTs): a non-zero exit, one line on stderr that starts with "attnkit",
// contains `expected` and does not contain any of `never` (e.g. a later stage's message).
void expect_cli_errors(const std::string& cli_path, const std::vector<CliErrorCase>& cases,
                       const std::vector<std::string>& never = {});

}  // namespace attnkit::test_support
