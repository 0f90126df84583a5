// Shared pieces of the plan-check tests (test_intel_amx's rejects, tests/gpu/test_stale_plan.cpp,
// tests/gpu/test_graph_replay_guards.cpp): a forward whose batch is not the planned / captured one
// must be refused and write nothing. use_absorbed_mla also serves test_nan_key_cases.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attnkit/backend.h"
#include "harness/case_runner.h"

namespace attnkit::test_support {

// The case's attention made absorbed MLA: 16 q heads over one latent head (kv_lora_rank 512 +
// qk_rope_head_dim 64 as the key, the 512 latent dims as the value).
void use_absorbed_mla(harness::CaseSpec* c);

// The small case of the GPU plan checks: GQA 32 / 8 heads at d 128 over pages of 16, or absorbed
// MLA (16 heads, latent 512 + rope 64) over pages of 64; target verify is a chain of 4 drafts
// (new_lens unused).
harness::CaseSpec plan_check_case(std::string name, ForwardMode mode, std::vector<int> prefix,
                                  std::vector<int> fresh, bool mla, uint64_t seed);

// `spec` prepared on `device` and a `backend` made for it. When the backend's descriptor rules the
// case out, *skip says why and the result is an error (the caller skips the test).
struct CaseOnBackend {
  harness::PreparedCase pc;
  std::unique_ptr<AttentionBackend> backend;
};
Result<CaseOnBackend> case_on_backend(const std::string& backend, const harness::CaseSpec& spec,
                                      Device device, std::string* skip);

// A target-verify batch as an engine may pass it: without the optional extend lengths, and (a
// chain) without the tree mask. Then rows and seq_lens alone do not tell one draft count from
// another.
void drop_verify_lengths(ForwardBatch* batch);

// backend.forward of layer `ld` on `batch` cut to its first `tokens` new tokens: the token count,
// the per-token tensors (out_cache_loc, positions) and q / out / lse; no k / v, save_kv off.
Status forward_first_tokens(AttentionBackend& backend, const harness::LayerData& ld,
                            ForwardBatch batch, int64_t tokens);

}  // namespace attnkit::test_support
