// A NaN element in one key's K: the fp64 reference gives every query row that sees the key a NaN
// output row (the NaN score poisons the softmax denominator and P.V) and leaves every other row
// finite; in its V, the NaN column of the rows that see the key (NanKeySpot::in_v; in extend,
// tiled kernels may also put NaN in that column of rows that share a key block but not the key). A
// backend must do the same: mapping the NaN score to a probability of 0 (a dropped key) or to a
// clamped value would be a silent wrong answer. Shared by the CPU (intel_amx, every ISA path) and
// GPU (every CUDA backend) tests.
#pragma once

#include <functional>
#include <memory>

#include "attnkit/backend.h"
#include "attnkit/device.h"
#include "harness/case_runner.h"

namespace attnkit::test_support {

// Where the NaN goes: K of request `request`'s key at `position`, kv head `kv_head`, dimension
// `dim` (absorbed MLA: kv head 0, `dim` indexes the latent row, so a dim below kv_lora_rank is in
// V too). A cached key (position < the request's prefix) is written into the pool; a new token's
// into the k the layer receives, which the run writes into the pool.
struct NanKeySpot {
  int request = 0;
  int position = 0;
  int kv_head = 0;
  int dim = 0;
  bool in_v = false;  // MHA: the NaN goes into the key's V instead (its column of the seeing rows)
};

using CaseBackendMaker =
    std::function<Result<std::unique_ptr<AttentionBackend>>(const harness::PreparedCase&)>;

// Prepares `spec` (MHA or absorbed MLA) on `device`, writes the NaN (bf16 / f16 / fp8_e4m3 K), runs
// the backend `make` returns (save_kv on), and expects for every layer: the output's NaN elements
// are exactly the reference's, the finite ones match it (|out - ref| <= 0.05 + 0.02 |ref|), the lse
// (when requested) is NaN on exactly the reference's NaN rows and near it elsewhere, at least one
// row is finite, and at least one row is NaN iff `any_nan` (some query sees the key). Call from a
// TEST body (uses ASSERT).
void expect_nan_key_propagates(const harness::CaseSpec& spec, Device device, const NanKeySpot& spot,
                               bool any_nan, const CaseBackendMaker& make);

}  // namespace attnkit::test_support
