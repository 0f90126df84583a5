#include "support/cli_runner.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace attnkit::test_support {

std::string read_text_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

CliRun run_cli(const std::string& cli_path, const std::string& args) {
  // ctest runs every test in its own process, several at once: the pid keeps the files apart.
  static int counter = 0;
  const std::string err_path = ::testing::TempDir() + "attnkit_cli_err_" +
                               std::to_string(getpid()) + "_" + std::to_string(counter++) + ".txt";
  const std::string cmd = "'" + cli_path + "' " + args + " 2>'" + err_path + "'";
  CliRun r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = read_text_file(err_path);
  std::remove(err_path.c_str());
  return r;
}

}  // namespace attnkit::test_support
