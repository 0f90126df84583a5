// Malformed batches through a backend, by random mutation of valid ones (tests/unit and tests/gpu
// test_batch_mutations*).
//
// Each trial takes a prepared case of the shared table, changes one thing the way a buggy engine
// could (in the ForwardBatch: a length, a count, a request row, a new token's slot, a
// req_to_token entry written through the table's API, the verify mask's offsets, the mode; in
// the layers: a scale, the cap, the window, a head count or dim, the layer id, the mask type; or
// one of layer 0's q / k / v / out / lse views: a row or head more or less, another dtype), and
// runs the backend on it (init_forward_metadata, then every layer). The contract checked:
//   - a batch ForwardBatch::validate() refuses, or a view that does not fit its memory, is
//     refused by the run, with a message;
//   - a refused call leaves every byte of the KV pool as it was before that call;
//   - a mutation the backend accepts runs and matches the fp64 reference over the same (mutated)
//     batch and layers, with no stray pool write, damaged canary or non-finite output;
//   - after any refusal the same backend object still runs the unmutated batch (and, every fourth
//     time, matches the reference): a refused call leaves no half-made plan behind.
// On a CUDA pool, what only the CPU's validate() can see is not tried (out_cache_loc has no host
// copy there; ForwardBatch::out_cache_loc): out_cache_loc entries inside the pool, or any in a
// forward that does not save k / v; a decode length moved with seq_lens_sum kept consistent; a
// spare request row; a new token's req_to_token column rewritten; slot 0. A refused call must also
// leave no skipped write in the pool's device slot guard record. On pages larger than 1 a table
// mutation to slots other tokens hold moves a whole page (ForwardBatch::validate's page check
// under ATTNKIT_CHECK_INDICES=1 says why).
// A failure names the trial, its seed and the mutation (the caller adds the backend and case).
#pragma once

#include <cstdint>
#include <string>

#include "attnkit/device.h"
#include "attnkit/forward_batch.h"
#include "attnkit/registry.h"
#include "harness/case_runner.h"

namespace attnkit::test_support {

struct MutationOutcome {
  int refused_by_validate = 0;   // validate() refused the batch (and so did the backend)
  int accepted_and_ran = 0;      // ran and matched the reference
  int accepted_but_refused = 0;  // the backend refused what validate() accepted (a layer, a view)
};

// Prepares `spec` on `device`, makes the backend `desc` for it, runs the unmutated case (must
// match the reference), then `trials` mutations (seeded by `seed`), counting into *outcome.
// GoogleTest EXPECT / ASSERT inside: call from a TEST body.
void fuzz_batch_mutations(const BackendDescriptor& desc, const harness::CaseSpec& spec,
                          Device device, uint32_t seed, int trials, MutationOutcome* outcome);

// fuzz_batch_mutations over each case of the shared table the mutation tests take (MHA over bf16
// and fp8_e4m3 pools: extend, mixed, draft extend, decode, verify with a tree, cross-attention, a
// window, pages 1 and 16; MLA over bf16 and fp8_e4m3 latent pools: decode at pages 1 / 64 / 128,
// extend, verify, draft extend, the non-absorbed 192 / 128 prefill) that skip_reason lets `desc`
// run on `device`; case i is seeded first_seed + 1 + i, and its failures are traced "<trace> on
// <case>". Returns how many cases ran, or -1 after a fatal failure (the caller returns).
int fuzz_batch_mutation_cases(const BackendDescriptor& desc, Device device, uint32_t first_seed,
                              int trials, const std::string& trace, MutationOutcome* outcome);

// The columns of request r's req_to_token row before its new tokens (encoder tokens + cached
// prefix; decode: all but the last; verify: the committed sequence before the drafts).
int committed_columns(const ForwardBatch& b, int r);

// For a longer, differently seeded run than the tests' fixed one (a device session with time to
// spare): ATTNKIT_TEST_MUTATION_TRIALS (1..100000) replaces `trials`, ATTNKIT_TEST_MUTATION_SEED
// (0..2^31-1) replaces `first_seed`; unset, the test's own values.
int mutation_trials(int trials);
uint32_t mutation_seed(uint32_t first_seed);

}  // namespace attnkit::test_support
