// Host-facing entry points of the flashinfer backend's kernels (no CUDA types). Each head dim is
// compiled in its own translation units (paged_attention_hd<d>_{decode,prefill}.cu), present only
// when <d> is in ATTNKIT_HEAD_DIMS (the instantiation budget).
#pragma once

#include <cstdint>
#include <string>

#include "attnkit/dtype.h"
#include "attnkit/status.h"
#include "attnkit/tensor.h"
#include "backends/flashinfer/kernels/paged_params.h"
#include "cuda/common/dispatch.h"
#include "cuda/common/smem_limits.h"

namespace attnkit::flashinfer {

// Head dims the tensor-core kernels are written for (any multiple of 16 up to 256 works; these
// are the translation units that exist).
using NativeHeadDims = ValueList<64, 80, 96, 128, 256>;

// Whether head dim d is compiled into this binary (in NativeHeadDims and in the CMake list).
constexpr bool head_dim_compiled(int d) {
#ifdef ATTNKIT_HEAD_DIMS_LIST
  constexpr int kBuilt[] = {ATTNKIT_HEAD_DIMS_LIST};
  bool in_cmake = false;
  for (int b : kBuilt) in_cmake = in_cmake || b == d;
  return in_cmake && NativeHeadDims::contains(d);
#else
  (void)d;
  return false;
#endif
}

// The prefill kernel's key tile (paged_prefill_sm80.cuh): keys per shared-memory tile (one barrier
// pair), keys per compute step (S registers) and the cp.async ring depth.
struct PrefillTile {
  int tile_n;
  int sub_n;
  int stages;
};

// The default tile of a head dim, KV of the q dtype (native) or fp8. Measured on H200
// (docs/perf/extend_notes.md): at d 128 with native-dtype KV, 64-key tiles and steps with 2
// stages beat 32-key tiles with 3 stages by 17% and two 32-key steps per 64-key tile by 8%,
// although ptxas spills ~180 bytes per thread for it (outside the MMA loops' critical path).
constexpr PrefillTile prefill_tile(int head_dim, bool native_kv) {
  const bool wide = head_dim == 128 && native_kv;
  const int n = wide || head_dim < 96 ? 64 : 32;
  return {n, n, wide ? 2 : 3};
}

// Dynamic shared memory of a prefill block (the Traits' kSmemBytes, which static_asserts it):
// kPrefillTileRows Q rows, the K + V ring (fp8: one 16-bit stage converted from a raw fp8 ring),
// the key slots; 16-bit rows padded by 8 elements.
constexpr int prefill_smem_bytes(int head_dim, bool quant_kv, PrefillTile t) {
  const int row_bytes = (head_dim + 8) * 2;
  const int stage_bytes = 2 * t.tile_n * row_bytes;
  const int raw_stage_bytes = quant_kv ? 2 * t.tile_n * head_dim : 0;
  return kPrefillTileRows * row_bytes + (quant_kv ? 1 : t.stages) * stage_bytes +
         t.stages * t.tile_n * 4 + t.stages * raw_stage_bytes;
}

// The tile for devices that cannot opt in to the default's shared memory (smem_fit.h): the
// default where it fits every tensor-core device (99 KB), else 32-key tiles with three stages
// at d <= 128 (d 128 bf16: 87,424 bytes instead of 104,960) and two at d 256 (an A100: 135,424
// instead of 169,344; no d 256 tile of 128 rows fits 99 KB).
constexpr PrefillTile prefill_tile_compact(int head_dim, bool native_kv) {
  const PrefillTile d = prefill_tile(head_dim, native_kv);
  if (prefill_smem_bytes(head_dim, !native_kv, d) <= cuda::kSmallestTensorCoreSmemOptin) return d;
  return {32, 32, head_dim > 128 ? 2 : 3};
}

// Which tile a device whose blocks may opt in to `optin` bytes runs: the default, the compact
// one, or none (the backend takes its portable path for prefill-shaped forwards).
enum class PrefillFit { kDefault, kCompact, kNone };
constexpr PrefillFit prefill_fit(int head_dim, bool quant_kv, int optin) {
  if (prefill_smem_bytes(head_dim, quant_kv, prefill_tile(head_dim, !quant_kv)) <= optin) {
    return PrefillFit::kDefault;
  }
  if (prefill_smem_bytes(head_dim, quant_kv, prefill_tile_compact(head_dim, !quant_kv)) <= optin) {
    return PrefillFit::kCompact;
  }
  return PrefillFit::kNone;
}

// The prefill kernels launch one block per (work item, kv head) in a one-dimensional grid: plans
// past 2^31 - 1 blocks are refused by name. The backend checks it before its cache write; the
// launch again.
inline Status check_prefill_grid(int64_t grid_items, int64_t num_kv_heads) {
  const int64_t blocks = grid_items * num_kv_heads;
  if (blocks <= 0x7fffffff) return Status::ok();
  return Status::invalid_argument("flashinfer: prefill grid of " + std::to_string(blocks) +
                                  " blocks (" + std::to_string(grid_items) + " work items x " +
                                  std::to_string(num_kv_heads) +
                                  " kv heads) exceeds 2^31 - 1; split the batch");
}

// Decode WorkItem plans launch (kv heads, items): the items ride grid y, whose limit is 65535.
// `hint`: what the caller can change (appended to the message).
inline Status check_decode_grid(int64_t grid_items, const std::string& what,
                                const std::string& hint = "") {
  constexpr int64_t kMaxGridY = 65535;
  if (grid_items <= kMaxGridY) return Status::ok();
  return Status::invalid_argument("flashinfer: the " + what + " plan has " +
                                  std::to_string(grid_items) +
                                  " work items per kv head, above the " +
                                  std::to_string(kMaxGridY) + " a launch allows" + hint);
}

// Paged attention over the work items of p.plan (grid_items CTAs per kv head; a CUDA-graph grid
// may be larger than the plan: extra CTAs exit). Decode merges split requests in the kernel (the
// last split CTA; p.split_counters).
// q: bf16 / f16; KV: the q dtype, fp8_e4m3 or fp8_e5m2.
template <int kD, TileShape kShape>
Status run_paged(const PagedParams& p, DType q_dtype, DType kv_dtype, int grid_items,
                 StreamHandle stream);

}  // namespace attnkit::flashinfer
