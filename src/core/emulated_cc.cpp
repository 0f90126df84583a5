// ATTNKIT_EMULATE_CC (see emulated_cc.h).
#include "core/emulated_cc.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <string>

namespace attnkit::detail {
namespace {

struct Generation {
  const char* name;
  int compute_capability;
  int max_smem_per_block_optin;  // bytes (CUDA programming guide, technical specifications)
};

constexpr std::array<Generation, 5> kGenerations = {{
    {"75", 75, 64 * 1024},
    {"80", 80, 163 * 1024},
    {"86", 86, 99 * 1024},
    {"89", 89, 99 * 1024},
    {"90", 90, 227 * 1024},
}};

}  // namespace

Status apply_emulated_compute_capability(int* compute_capability, int* max_smem_per_block_optin) {
  const char* env = std::getenv("ATTNKIT_EMULATE_CC");
  if (env == nullptr || *env == '\0') return Status::ok();
  const std::string value(env);
  for (const Generation& g : kGenerations) {
    if (value != g.name) continue;
    if (g.compute_capability < *compute_capability) {
      *compute_capability = g.compute_capability;
      *max_smem_per_block_optin = std::min(*max_smem_per_block_optin, g.max_smem_per_block_optin);
    }
    return Status::ok();
  }
  return Status::invalid_argument("ATTNKIT_EMULATE_CC=" + value +
                                  " is not supported (accepted: 75, 80, 86, 89, 90, or unset)");
}

}  // namespace attnkit::detail
