// `attnkit backends`: which backends this binary has, and why the others are missing.
#include <CLI/CLI.hpp>
#include <iostream>
#include <string>

#include "attnkit/registry.h"
#include "tools/attnkit/commands.h"

namespace attnkit {
namespace {

constexpr int kNameWidth = 24;

std::string padded(const std::string& s) {
  std::string out = s;
  if (out.size() < kNameWidth) out.resize(kNameWidth, ' ');
  return out + " ";
}

std::string kinds(const BackendDescriptor& d) {
  std::string k = d.mha ? "MHA" : "";
  if (d.mla) k += k.empty() ? "MLA" : "+MLA";
  return k;
}

void print_backends() {
  const BackendRegistry& reg = builtin_registry();
  std::cout << "attention backends (" << reg.all().size() << "):\n";
  for (const BackendDescriptor& d : reg.all()) {
    std::cout << "  " << padded(d.name) << (d.built ? "built      " : "not built  ")
              << padded(kinds(d)) << (d.built ? d.implementation : d.not_built_reason) << "\n";
  }
  std::cout << "linear-attention (GDN) backends (" << reg.linear_all().size() << "):\n";
  for (const LinearAttnDescriptor& d : reg.linear_all()) {
    std::cout << "  " << padded(d.name) << (d.built ? "built      " : "not built  ")
              << padded("GDN") << (d.built ? d.implementation : d.not_built_reason) << "\n";
  }
}

}  // namespace

void register_backends_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "backends", "List every backend: built into this binary, or why it is not");
  cmd->callback(print_backends);
}

}  // namespace attnkit
