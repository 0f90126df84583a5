// Malformed batches through every CPU backend, by random mutation of valid ones.
//
// Each trial takes a prepared case of the shared table, changes one thing in its ForwardBatch the
// way a buggy engine could (a length, a count, a request row, a new token's slot, a req_to_token
// entry written through the table's API, the verify mask's offsets, the mode), and runs the
// backend on it (init_forward_metadata, then every layer). The contract checked:
//   - a batch ForwardBatch::validate() refuses is refused by the run too, with a message, and the
//     refused call leaves every byte of the KV pool as it was;
//   - a batch validate() accepts either runs and then matches the fp64 reference over the same
//     (mutated) batch, with no stray pool write, damaged canary or non-finite output, or is
//     refused with a message and the pool untouched;
//   - after any refusal the same backend object still runs the unmutated batch correctly (a refused
//     call leaves no half-made plan behind).
// The seed is fixed; a failure names the case, the trial and the mutation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attnkit/backend.h"
#include "attnkit/kv_cache.h"
#include "attnkit/registry.h"
#include "harness/case_runner.h"

namespace attnkit {
namespace {

using harness::PreparedCase;

constexpr int kTrialsPerCase = 48;

// Every byte of the pool's k / v buffers, all layers.
std::vector<uint8_t> pool_bytes(const PreparedCase& pc) {
  std::vector<uint8_t> bytes;
  const auto* pool = dynamic_cast<const MHAKVPool*>(pc.kv_pool.get());
  if (pool == nullptr) return bytes;
  for (int l = 0; l < static_cast<int>(pc.layers.size()); ++l) {
    for (const TensorView& b : {pool->k_buffer(l), pool->v_buffer(l)}) {
      const auto* p = static_cast<const uint8_t*>(b.data);
      bytes.insert(bytes.end(), p, p + b.storage_bytes());
    }
  }
  return bytes;
}

// Copies the batch's host arrays into their (host-resident) tensors, so that a mutation reaches
// both, as an engine that builds both from one list would pass them.
void mirror_host_arrays(ForwardBatch& b) {
  const struct {
    TensorView* t;
    const std::vector<int32_t>* host;
  } arrays[] = {{&b.req_pool_indices, &b.req_pool_indices_host},
                {&b.seq_lens, &b.seq_lens_host},
                {&b.extend_prefix_lens, &b.extend_prefix_lens_host},
                {&b.extend_seq_lens, &b.extend_seq_lens_host},
                {&b.extend_start_loc, &b.extend_start_loc_host},
                {&b.encoder_lens, &b.encoder_lens_host}};
  for (const auto& a : arrays) {
    if (!a.t->defined() || !a.t->device.is_cpu() || a.t->dtype != DType::kI32) continue;
    if (a.t->numel() != static_cast<int64_t>(a.host->size())) continue;
    std::memcpy(a.t->data, a.host->data(), a.host->size() * sizeof(int32_t));
  }
}

// One mutation of a prepared batch and how to take it back.
class Mutator {
 public:
  Mutator(PreparedCase& pc, uint32_t seed) : pc_(pc), rng_(seed), original_(pc.batch) {}

  // Applies a random mutation; returns what it did (for the failure message).
  std::string mutate() {
    ForwardBatch& b = pc_.batch;
    const int bs = b.batch_size;
    const int r = pick(0, std::max(bs - 1, 0));
    const int32_t delta = pick_delta();
    switch (pick(0, 11)) {
      case 0:
        return bump(b.seq_lens_host, r, delta, "seq_lens_host", /*fix_sum=*/coin());
      case 1:
        return bump(b.extend_prefix_lens_host, r, delta, "extend_prefix_lens_host", false);
      case 2:
        return bump(b.extend_seq_lens_host, r, delta, "extend_seq_lens_host", false);
      case 3:
        return bump(b.extend_start_loc_host, r, delta, "extend_start_loc_host", false);
      case 4: {
        if (b.req_pool_indices_host.empty()) break;
        const int max_reqs = pc_.req_to_token->max_reqs();
        const int32_t other = b.req_pool_indices_host[static_cast<size_t>(pick(0, bs - 1))];
        const int32_t choices[] = {
            0, -1, max_reqs + 1, other, pick(1, max_reqs), std::numeric_limits<int32_t>::max()};
        const int32_t v = choices[pick(0, 5)];
        b.req_pool_indices_host[static_cast<size_t>(r)] = v;
        mirror_host_arrays(b);
        return "req_pool_indices_host[" + std::to_string(r) + "] = " + std::to_string(v);
      }
      case 5:
        b.num_tokens += pick(0, 1) != 0 ? 1 : -1;
        return "num_tokens = " + std::to_string(b.num_tokens);
      case 6:
        b.batch_size += pick(0, 1) != 0 ? 1 : -1;
        return "batch_size = " + std::to_string(b.batch_size);
      case 7:
        b.seq_lens_sum += delta;
        return "seq_lens_sum += " + std::to_string(delta);
      case 8: {
        if (b.num_tokens <= 0 || !b.out_cache_loc.defined()) break;
        const int t = pick(0, b.num_tokens - 1);
        const int64_t rows = pc_.kv_pool->rows();
        const int64_t other = pc_.out_cache_loc[static_cast<size_t>(pick(0, b.num_tokens - 1))];
        const int64_t choices[] = {-1,
                                   rows,
                                   rows + 4096,
                                   other,
                                   pick(0, static_cast<int>(rows) - 1),
                                   std::numeric_limits<int64_t>::max()};
        const int64_t v = choices[pick(0, 5)];
        b.out_cache_loc.data_as<int64_t>()[t * b.out_cache_loc.strides[0]] = v;
        loc_touched_ = true;
        return "out_cache_loc[" + std::to_string(t) + "] = " + std::to_string(v);
      }
      case 9: {
        // A req_to_token entry the request reads, rewritten through the table's API (which keeps
        // max_slot() current): out of the pool, the reserved page 0, or a slot another token holds.
        if (bs <= 0 || pc_.kv_lens.empty()) break;
        const int row = pc_.rows[static_cast<size_t>(r)];
        const int len = std::max(1, pc_.kv_lens[static_cast<size_t>(r)]);
        const int col = pick(0, len - 1);
        const int64_t rows = pc_.kv_pool->rows();
        // Another slot that holds a token (the pool's unused slots are NaN-poisoned).
        const int r2 = pick(0, bs - 1);
        const int32_t* row2 = pc_.req_to_token->host_row(pc_.rows[static_cast<size_t>(r2)]);
        const int64_t held = row2[pick(0, std::max(1, pc_.kv_lens[static_cast<size_t>(r2)]) - 1)];
        const int64_t choices[] = {rows, rows + 100000, 0, held,
                                   std::numeric_limits<int32_t>::max()};
        const int64_t v = choices[pick(0, 4)];
        const int32_t old = pc_.req_to_token->host_row(row)[col];
        if (!pc_.req_to_token->write(row, col, std::span<const int64_t>(&v, 1)).is_ok()) break;
        table_edits_.push_back({row, col, old});
        return "req_to_token[" + std::to_string(row) + ", " + std::to_string(col) +
               "] = " + std::to_string(v) + " (was " + std::to_string(old) + ")";
      }
      case 10: {
        if (b.spec.mask_indptr_host.empty()) break;
        const size_t i =
            static_cast<size_t>(pick(0, static_cast<int>(b.spec.mask_indptr_host.size()) - 1));
        b.spec.mask_indptr_host[i] += delta;
        return "spec.mask_indptr_host[" + std::to_string(i) + "] += " + std::to_string(delta);
      }
      case 11: {
        const ForwardMode modes[] = {ForwardMode::kExtend, ForwardMode::kDecode,
                                     ForwardMode::kMixed, ForwardMode::kTargetVerify,
                                     ForwardMode::kDraftExtend};
        const ForwardMode m = modes[pick(0, 4)];
        if (m == b.mode) break;
        b.mode = m;
        return std::string("mode = ") + forward_mode_name(m);
      }
      default:
        break;
    }
    // The chosen field is absent in this batch: grow a length instead (always refused or
    // caught).
    return bump(b.seq_lens_host, r, 1, "seq_lens_host", false);
  }

  // Undoes every mutation made since the last restore.
  void restore() {
    pc_.batch = original_;
    mirror_host_arrays(pc_.batch);
    if (loc_touched_) {
      int64_t* loc = pc_.batch.out_cache_loc.data_as<int64_t>();
      for (size_t t = 0; t < pc_.out_cache_loc.size(); ++t)
        loc[static_cast<int64_t>(t) * pc_.batch.out_cache_loc.strides[0]] = pc_.out_cache_loc[t];
      loc_touched_ = false;
    }
    for (auto it = table_edits_.rbegin(); it != table_edits_.rend(); ++it) {
      const int64_t v = it->old;
      ASSERT_TRUE(
          pc_.req_to_token->write(it->row, it->col, std::span<const int64_t>(&v, 1)).is_ok());
    }
    table_edits_.clear();
  }

 private:
  struct TableEdit {
    int row, col;
    int32_t old;
  };

  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool coin() { return pick(0, 1) != 0; }
  int32_t pick_delta() {
    const int32_t choices[] = {-1,
                               1,
                               -2,
                               7,
                               -100000,
                               100000,
                               std::numeric_limits<int32_t>::min(),
                               std::numeric_limits<int32_t>::max()};
    return choices[pick(0, 7)];
  }
  std::string bump(std::vector<int32_t>& host, int r, int32_t delta, const char* name,
                   bool fix_sum) {
    if (host.empty() || r >= static_cast<int>(host.size())) return std::string(name) + " (absent)";
    // Wrap like the engine's int32 arithmetic would, without signed overflow here.
    const int64_t v = static_cast<int64_t>(host[static_cast<size_t>(r)]) + delta;
    host[static_cast<size_t>(r)] = static_cast<int32_t>(static_cast<uint32_t>(v));
    if (fix_sum && &host == &pc_.batch.seq_lens_host) pc_.batch.seq_lens_sum += delta;
    mirror_host_arrays(pc_.batch);
    return std::string(name) + "[" + std::to_string(r) + "] += " + std::to_string(delta) +
           (fix_sum ? " (seq_lens_sum kept consistent)" : "");
  }

  PreparedCase& pc_;
  std::mt19937 rng_;
  const ForwardBatch original_;
  bool loc_touched_ = false;
  std::vector<TableEdit> table_edits_;
};

struct Outcome {
  int refused_by_validate = 0;
  int accepted_and_ran = 0;
  int accepted_but_refused = 0;
};

// init_forward_metadata, then every layer. save_kv false: the backend gets no k / v and reads the
// new tokens' rows from the pool, which the first (unmutated) run of fuzz_case filled. (The
// harness's run_backend would write them itself first, through the mutated out_cache_loc.)
Status run(AttentionBackend& backend, PreparedCase& pc, bool save_kv) {
  ATTNKIT_RETURN_IF_ERROR(backend.init_forward_metadata(pc.batch));
  for (harness::LayerData& ld : pc.layers) {
    const bool save = save_kv && ld.save_kv_allowed;
    ATTNKIT_RETURN_IF_ERROR(backend.forward(ld.q, save ? ld.k : TensorView(),
                                            save ? ld.v : TensorView(), ld.out, ld.layer, pc.batch,
                                            save, ld.lse));
  }
  return Status::ok();
}

void expect_matches_reference(const PreparedCase& pc, const std::string& what) {
  Result<harness::Comparison> c = harness::compare_with_reference(pc);
  ASSERT_TRUE(c.is_ok()) << what << ": " << c.status().to_string();
  EXPECT_TRUE(c->passed()) << what << ": " << c->summary();
}

// Runs one backend over kTrialsPerCase mutations of one case.
void fuzz_case(const BackendDescriptor& desc, const harness::CaseSpec& spec, uint32_t seed,
               Outcome* outcome) {
  Result<PreparedCase> prepared = harness::prepare_case(spec, Device::cpu());
  ASSERT_TRUE(prepared.is_ok()) << prepared.status().to_string();
  PreparedCase& pc = *prepared;
  Result<std::unique_ptr<AttentionBackend>> made = harness::create_backend_for_case(desc, pc);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  AttentionBackend& backend = **made;
  {
    // The new tokens' k / v into the pool, and the case as it is passes.
    SCOPED_TRACE("the unmutated batch");
    const Status first = harness::run_backend(backend, pc, /*save_kv=*/true);
    ASSERT_TRUE(first.is_ok()) << first.to_string();
    expect_matches_reference(pc, "unmutated");
  }
  Mutator mutator(pc, seed);
  for (int trial = 0; trial < kTrialsPerCase; ++trial) {
    const bool save_kv = trial % 2 == 0;
    const std::string what = mutator.mutate();
    SCOPED_TRACE("trial " + std::to_string(trial) + " (seed " + std::to_string(seed) +
                 "): " + what + (save_kv ? ", save_kv" : ", reads the pool"));
    const Status valid = pc.batch.validate();
    const std::vector<uint8_t> before = pool_bytes(pc);
    const Status st = run(backend, pc, save_kv);
    if (!valid.is_ok()) {
      ++outcome->refused_by_validate;
      EXPECT_FALSE(st.is_ok()) << desc.name
                               << " ran a batch validate() refuses: " << valid.to_string();
    } else if (st.is_ok()) {
      ++outcome->accepted_and_ran;
      expect_matches_reference(pc, what);
    } else {
      ++outcome->accepted_but_refused;
    }
    if (!st.is_ok()) {
      EXPECT_FALSE(st.message().empty()) << st.to_string();
      EXPECT_TRUE(pool_bytes(pc) == before)
          << "the refused run wrote the KV pool: " << st.to_string();
    }
    mutator.restore();
    if (::testing::Test::HasFatalFailure()) return;
    if (!st.is_ok() && trial % 4 == 1) {
      // The backend that refused still serves the valid batch.
      SCOPED_TRACE("the unmutated batch after the refusal");
      ASSERT_TRUE(pc.batch.validate().is_ok());
      const Status again = run(backend, pc, /*save_kv=*/false);
      ASSERT_TRUE(again.is_ok()) << again.to_string();
      expect_matches_reference(pc, "unmutated");
    }
  }
}

const char* const kCases[] = {
    "extend_page16_ragged",   "extend_page1_gqa4",      "mixed_page16",
    "draft_extend_page16",    "decode_page16",          "decode_page1",
    "decode_cross_attention", "extend_cross_attention", "extend_window8_page16",
    "decode_fp8_e4m3_kv",     "verify_topk4_page16"};

TEST(BatchMutations, EveryCpuBackendRefusesWhatValidateRefusesAndKeepsThePool) {
  const DeviceInfo cpu = detect_cpu();
  int backends = 0;
  for (const BackendDescriptor& desc : builtin_registry().all()) {
    if (!desc.built || !desc.runs_on(Platform::kCPU)) continue;
    ++backends;
    Outcome outcome;
    uint32_t seed = 20261202;
    for (const char* name : kCases) {
      const harness::CaseSpec* spec = harness::find_case(name);
      ASSERT_NE(spec, nullptr) << name;
      ++seed;
      if (!harness::skip_reason(desc, *spec, cpu).empty()) continue;
      SCOPED_TRACE(desc.name + " on " + name);
      fuzz_case(desc, *spec, seed, &outcome);
      if (HasFatalFailure()) return;
    }
    // The mutations reach both sides of validate(): a run that only ever saw refusals would not
    // test the backend's own checks.
    EXPECT_GT(outcome.refused_by_validate, 50) << desc.name;
    EXPECT_GT(outcome.accepted_and_ran, 5) << desc.name;
    std::printf(
        "%s: %d refused by validate, %d accepted and matched the reference, %d accepted "
        "but refused by the backend\n",
        desc.name.c_str(), outcome.refused_by_validate, outcome.accepted_and_ran,
        outcome.accepted_but_refused);
  }
  EXPECT_GE(backends, 2) << "torch_native and intel_amx run on the CPU";
}

}  // namespace
}  // namespace attnkit
