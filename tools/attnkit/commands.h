// Subcommand registration for the `attnkit` CLI. Each function adds one or more subcommands to the
// root app; main.cpp calls them all. Errors inside a subcommand are reported as one line on
// stderr and a non-zero exit: throw CLI::RuntimeError(code) after printing, or use cli_fail().
#pragma once

#include <string>

namespace CLI {
class App;
}  // namespace CLI

namespace attnkit {

// tools/attnkit/matrix_command.cpp: `attnkit matrix [--format md|json]`.
void register_matrix_command(CLI::App& app);
// tools/attnkit/select_command.cpp: `attnkit select --model-config PATH [--device ...] [flags]`.
void register_select_command(CLI::App& app);
// tools/attnkit/backends_command.cpp: `attnkit backends` (built into this binary, or why not).
void register_backends_command(CLI::App& app);
// bench/bench_command.cpp: `attnkit bench` and `attnkit run`.
void register_bench_commands(CLI::App& app);
// tools/attnkit/demo_command.cpp: `attnkit demo`.
void register_demo_command(CLI::App& app);

// Prints "attnkit: <message>" on stderr and exits the command with status 1 (throws
// CLI::RuntimeError, which main turns into the exit code).
[[noreturn]] void cli_fail(const std::string& message);

// The support matrices as Markdown / JSON, generated from the descriptors (docs/support_matrix.md
// is `attnkit matrix --format md`).
std::string support_matrix_markdown();
std::string support_matrix_json();

}  // namespace attnkit
