#include "support/cli_runner.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
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

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::trunc);
  f << text;
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

void expect_cli_errors(const std::string& cli_path, const std::vector<CliErrorCase>& cases,
                       const std::vector<std::string>& never) {
  for (const CliErrorCase& c : cases) {
    const CliRun r = run_cli(cli_path, c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << c.args << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("attnkit", 0), 0u) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.expected), std::string::npos) << c.args << "\n" << r.err;
    for (const std::string& n : never) {
      EXPECT_EQ(r.err.find(n), std::string::npos) << c.args << "\n" << r.err;
    }
  }
}

}  // namespace attnkit::test_support
