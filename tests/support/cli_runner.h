// Runs the `attnkit` binary of this build (ATTNKIT_CLI_PATH) for CLI tests: stdout, stderr and the
// exit status of one invocation.
#pragma once

#include <string>

namespace attnkit::test_support {

struct CliRun {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// `args` are appended to the binary's path as shell words (quote them where needed).
CliRun run_cli(const std::string& cli_path, const std::string& args);

std::string read_text_file(const std::string& path);

}  // namespace attnkit::test_support
