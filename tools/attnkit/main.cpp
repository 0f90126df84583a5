// `attnkit`: the command-line tool. Subcommands register themselves through
// tools/attnkit/commands.h. Every error ends as one line on stderr ("attnkit: ...") and a non-zero
// exit status.
#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tools/attnkit/commands.h"

namespace {

// The subcommand the user reached (the deepest parsed one), or the root.
const CLI::App* active_app(const CLI::App& root) {
  const CLI::App* app = &root;
  for (;;) {
    const std::vector<CLI::App*> subs = app->get_subcommands();
    if (subs.empty()) return app;
    app = subs.back();
  }
}

std::string valid_options(const CLI::App& app) {
  std::string out;
  for (const CLI::Option* o : app.get_options()) {
    if (!out.empty()) out += ", ";
    out += o->get_name(false, true);
  }
  return out;
}

std::string valid_subcommands(const CLI::App& app) {
  std::string out;
  for (const CLI::App* sub : app.get_subcommands({})) {
    if (!out.empty()) out += ", ";
    out += sub->get_name();
  }
  return out;
}

// "Could not convert: --verify = maybe" about a flag: the flag's name and the value given, or
// nothing when the option takes a value (its own check names what it allows).
std::optional<std::pair<std::string, std::string>> bad_flag_value(const CLI::App& app,
                                                                  const std::string& what) {
  constexpr std::string_view kPrefix = "Could not convert: ";
  const size_t eq = what.find(" = ");
  if (what.rfind(kPrefix, 0) != 0 || eq == std::string::npos) return std::nullopt;
  const std::string name = what.substr(kPrefix.size(), eq - kPrefix.size());
  const CLI::Option* o = app.get_option_no_throw(name);
  if (o == nullptr || o->get_expected_max() != 0) return std::nullopt;
  return std::make_pair(name, what.substr(eq + 3));
}

}  // namespace

namespace attnkit {

[[noreturn]] void cli_fail(const std::string& message) {
  std::cerr << "attnkit: " << message << "\n";
  throw CLI::RuntimeError(1);
}

}  // namespace attnkit

int main(int argc, char** argv) {
  CLI::App app{
      "attnkit: attention backends for LLM inference (SGLang's --attention-backend vocabulary).\n"
      "Support matrices, backend selection for a model and device, benchmarks and demos.",
      "attnkit"};
  app.require_subcommand(1, 1);
  attnkit::register_matrix_command(app);
  attnkit::register_select_command(app);
  attnkit::register_backends_command(app);
  attnkit::register_bench_commands(app);
  attnkit::register_demo_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help (of the root or of a subcommand)
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();  // the subcommand already printed its one-line error
  } catch (const CLI::ParseError& e) {
    const CLI::App* where = active_app(app);
    const std::string cmd = where == &app ? std::string("attnkit") : "attnkit " + where->get_name();
    std::string message = cmd + ": " + e.what();
    const bool no_subcommand = where == &app && app.get_subcommands().empty();
    if (no_subcommand && argc > 1) {  // CLI11 only says that a subcommand is required
      message = cmd + (argv[1][0] == '-' ? ": unknown option \"" : ": unknown subcommand \"") +
                argv[1] + "\"";
    }
    if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
      // CLI11's own text lists the extra arguments last first ("cpu --device").
      if (!no_subcommand) {
        std::string extras;
        for (const std::string& arg : where->remaining())
          extras += (extras.empty() ? "" : " ") + arg;
        if (!extras.empty()) message = cmd + ": not expected: " + extras;
      }
      message += no_subcommand ? "; valid subcommands: " + valid_subcommands(app)
                               : "; valid options: " + valid_options(*where);
    } else if (no_subcommand) {
      message += "; valid subcommands: " + valid_subcommands(app);
    } else if (dynamic_cast<const CLI::ConversionError*>(&e) != nullptr) {
      // CLI11 says "Could not convert: --verify = maybe" without what a flag takes.
      if (const auto flag = bad_flag_value(*where, e.what())) {
        message = cmd + ": " + flag->first + "=" + flag->second +
                  " is not allowed: " + flag->first + " is a flag; give it alone, or " +
                  flag->first + "=true|false (also 1/0, on/off, yes/no)";
      }
    }
    std::cerr << message << " (see " << cmd << " --help)\n";
    return e.get_exit_code() == 0 ? 1 : e.get_exit_code();
  } catch (const std::exception& e) {
    // Library code returns Status; this is the last guard against an exception from a container
    // or the standard library (std::bad_alloc for a case too large for this machine), which would
    // otherwise abort with std::terminate's two lines.
    std::cerr << "attnkit: " << e.what() << " (an exception escaped the subcommand)\n";
    return 1;
  }
  // Output lost to a full disk or a closed descriptor is a failure, not a silent success
  // (`attnkit matrix > /dev/full` exited 0).
  errno = 0;
  std::cout.flush();
  if (!std::cout || std::fflush(stdout) != 0 || std::ferror(stdout) != 0) {
    const int err = errno;
    std::cerr << "attnkit: writing to standard output failed"
              << (err != 0 ? std::string(" (") + std::strerror(err) + ")" : std::string()) << "\n";
    return 1;
  }
  return 0;
}
