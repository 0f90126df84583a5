// Shared pieces of the plan-check tests (plan_check.h).
#include "support/plan_check.h"

#include <utility>

#include "attnkit/registry.h"
#include "support/backend_case_test.h"

namespace attnkit::test_support {

void use_absorbed_mla(harness::CaseSpec* c) {
  c->mla = true;
  c->kv_lora_rank = 512;
  c->qk_rope_head_dim = 64;
  c->num_q_heads = 16;
  c->num_kv_heads = 1;
  c->head_dim = 512 + 64;
  c->v_head_dim = 512;
}

harness::CaseSpec plan_check_case(std::string name, ForwardMode mode, std::vector<int> prefix,
                                  std::vector<int> fresh, bool mla, uint64_t seed) {
  harness::CaseSpec c;
  c.name = std::move(name);
  c.mode = mode;
  c.page_size = mla ? 64 : 16;
  c.prefix_lens = std::move(prefix);
  c.new_lens = std::move(fresh);
  if (mode == ForwardMode::kTargetVerify) {
    c.spec_draft_tokens = 4;
    c.spec_topk = 1;
  }
  c.num_q_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = c.v_head_dim = 128;
  if (mla) use_absorbed_mla(&c);
  c.seed = seed;
  return c;
}

Result<CaseOnBackend> case_on_backend(const std::string& backend, const harness::CaseSpec& spec,
                                      Device device, std::string* skip) {
  const BackendDescriptor* descriptor = builtin_registry().find(backend);
  if (descriptor == nullptr) return Status::not_found("no backend " + backend);
  *skip = harness::skip_reason(*descriptor, spec, device_info_for(device));
  if (!skip->empty()) return Status::unsupported(*skip);
  ATTNKIT_ASSIGN_OR_RETURN(harness::PreparedCase pc, harness::prepare_case(spec, device));
  ATTNKIT_ASSIGN_OR_RETURN(std::unique_ptr<AttentionBackend> made,
                           harness::create_backend_for_case(*descriptor, pc));
  return CaseOnBackend{std::move(pc), std::move(made)};
}

void drop_verify_lengths(ForwardBatch* batch) {
  batch->extend_seq_lens_host.clear();
  batch->extend_prefix_lens_host.clear();
  batch->extend_start_loc_host.clear();
  batch->extend_seq_lens = batch->extend_prefix_lens = batch->extend_start_loc = TensorView();
  batch->spec.custom_mask = batch->spec.mask_indptr = TensorView();
  batch->spec.mask_indptr_host.clear();
}

Status forward_first_tokens(AttentionBackend& backend, const harness::LayerData& ld,
                            ForwardBatch batch, int64_t tokens) {
  batch.num_tokens = static_cast<int>(tokens);
  batch.out_cache_loc.shape[0] = batch.positions.shape[0] = tokens;
  TensorView q = ld.q, out = ld.out, lse = ld.lse;
  q.shape[0] = out.shape[0] = tokens;
  if (lse.defined()) lse.shape[0] = tokens;
  return backend.forward(q, TensorView(), TensorView(), out, ld.layer, batch, /*save_kv=*/false,
                         lse);
}

}  // namespace attnkit::test_support
