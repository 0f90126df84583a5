// Host-facing entry points of the triton backend's kernels (no CUDA types). Each head-dim pair is
// compiled in its own translation unit (simt_attention_hd*.cu, mma_extend_hd*.cu,
// mma_decode_hd*.cu); which pairs
// exist is decided by the ATTNKIT_HEAD_DIMS_LIST compile definition (the instantiation budget).
#pragma once

#include <string>

#include "attnkit/dtype.h"
#include "attnkit/status.h"
#include "attnkit/tensor.h"
#include "backends/triton/kernels/attention_params.h"
#include "cuda/common/dispatch.h"
#include "cuda/common/smem_limits.h"

namespace attnkit::triton {

// MHA head dims compiled in. Host (C++) sources see the CMake list; CUDA sources get one
// ATTNKIT_HEAD_DIM_<d> define per dim instead, and each simt_attention_hd<d>.cu is empty unless
// its define is set, so only the host dispatcher uses this list.
#ifdef ATTNKIT_HEAD_DIMS_LIST
using HeadDimList = ValueList<ATTNKIT_HEAD_DIMS_LIST>;
#else
using HeadDimList = ValueList<>;
#endif
// MLA absorbed (kv_lora_rank + qk_rope_head_dim / kv_lora_rank) and MLA non-absorbed prefill.
inline constexpr int kMlaHeadDimQK = 576;
inline constexpr int kMlaHeadDimV = 512;
inline constexpr int kMlaPrefillHeadDimQK = 192;
inline constexpr int kMlaPrefillHeadDimV = 128;

// The pool dtypes the kernels read with q_dtype activations: q's own, or for MHA fp8_e4m3,
// fp8_e5m2 or fp4_e2m1 (MLA: q's own only); kUnsupported naming both otherwise. The backend checks
// it before its cache write (flashinfer routes pools of another dtype to triton on purpose),
// run_simt at its dispatch.
inline Status check_kv_dtype(DType q_dtype, DType kv_dtype, bool mla) {
  const bool quantized = !mla && (kv_dtype == DType::kFP8E4M3 || kv_dtype == DType::kFP8E5M2 ||
                                  kv_dtype == DType::kFP4E2M1);
  if (kv_dtype == q_dtype || quantized) return Status::ok();
  return Status::unsupported(std::string("triton: kv cache dtype ") + dtype_name(kv_dtype) +
                             " with " + dtype_name(q_dtype) +
                             " activations is not supported (accepted: " + dtype_name(q_dtype) +
                             (mla ? "" : ", fp8_e4m3, fp8_e5m2, fp4_e2m1") + ")");
}

// SIMT attention: decode (extend = false; with p.max_splits > 1 followed by the merge kernel) or
// extend. grid_splits is the launched split extent (<= p.max_splits; 1 for extend).
// Fills p.group_tiles. Activations: bf16, f16, f32; pool: the activation dtype, fp8_e4m3,
// fp8_e5m2 or fp4_e2m1 (MLA: the activation dtype only).
template <int kDqk, int kDv>
Status run_simt(AttentionParams p, DType q_dtype, DType kv_dtype, bool extend, int grid_splits,
                StreamHandle stream);

// q heads of one kv head per block of the tensor-core decode (the M dimension of its MMAs).
inline constexpr int kMmaDecodeGroupTile = 16;

// CTA shape of the tensor-core decode (the ring core's per-warp cp.async rings either way):
//  * k2x4: 2 CTAs of 4 warps per SM (110 KB of shared memory each); fp8 pools, head dim 256, GPUs
//    with less than kMmaDecodeOneCtaSmem of opt-in shared memory per block.
//  * k1x8: 1 CTA of 8 warps per SM (same rings, ~211 KB): pools of the activation dtype at head
//    dims <= 128 on SM90-class GPUs. Half the CTAs of k2x4 for the same bytes in flight, so the
//    split planner cuts half as many splits (b16 kv4k: none) and each merge reads half as many
//    partials.
// (A third shape, 1 CTA of 4 warps with 6-stage rings, measured no better than k2x4 at b16 and
// below k1x8: docs/perf/decode_notes.md, session 4.)
enum class MmaDecodeRing { k2x4, k1x8 };
inline constexpr int kMmaDecodeOneCtaSmem = 220 * 1024;  // budget of the one-CTA shapes
inline constexpr int kMmaDecodeOneCtaMaxDim = 128;       // head dims the one-CTA shapes cover

// Tensor-core split-KV decode (SM80+, bf16/f16 activations, pool of the activation dtype or fp8,
// MHA head dims <= 256); with p.max_splits > 1 the last split CTA of each head block merges.
// Fills p.group_tiles (16 q heads per tile). `ring` is a request: shapes that do not apply to
// this head dim / pool dtype (see MmaDecodeRing) run k2x4.
template <int kD>
Status run_mma_decode(AttentionParams p, DType q_dtype, DType kv_dtype, int grid_splits,
                      MmaDecodeRing ring, StreamHandle stream);

// Query rows per block of the tensor-core extend: 4 warps of 2 (d <= 128) or 1 (d 256) 16-row
// MMA tiles. MmaExtendTraits::kBlockM is this value.
inline constexpr int mma_extend_block_m(int head_dim) { return head_dim <= 128 ? 128 : 64; }

// The tensor-core extend's key tile (mma_extend.cuh MmaExtendTile): keys per shared-memory tile,
// keys per compute step, cp.async ring depth. Measured on H200 (docs/perf/extend_notes.md): at
// d 128 with native-dtype KV, 64-key tiles computed in two 32-key steps with 2 stages beat 32-key
// tiles with 3 stages by 8% and 64-key steps (which spill) by 3%.
struct MmaExtendKeyTile {
  int block_n;
  int sub_n;
  int stages;
};
constexpr MmaExtendKeyTile mma_extend_tile(int head_dim, bool native_kv) {
  const bool wide = head_dim == 128 && native_kv;
  const int n = wide || head_dim < 96 ? 64 : 32;
  return {n, wide ? 32 : n, wide || head_dim > 128 ? 2 : 3};
}

// Dynamic shared memory of an extend block (MmaExtendKernel::smem_bytes, which static_asserts
// it): Q rows and the K + V ring of padded 16-bit rows, and per stage the rows' addresses (K and
// V: a row pointer, an fp4 scale pointer and a flag per key).
constexpr int mma_extend_smem_bytes(int head_dim, MmaExtendKeyTile t) {
  return (mma_extend_block_m(head_dim) + 2 * t.stages * t.block_n) * (head_dim + 8) * 2 +
         t.stages * 2 * t.block_n * (8 + 8 + 1);
}

// The tile for devices that cannot opt in to the default's shared memory (cuda/common/smem_fit.h):
// the default where it fits every tensor-core device (99 KB), else three stages of 32-key tiles
// at d <= 128 (d 128 with KV of the q dtype: 90,304 bytes instead of 108,800) and of 16-key
// tiles at d 256 (86,112 instead of 103,552).
constexpr MmaExtendKeyTile mma_extend_tile_compact(int head_dim, bool native_kv) {
  const MmaExtendKeyTile d = mma_extend_tile(head_dim, native_kv);
  if (mma_extend_smem_bytes(head_dim, d) <= cuda::kSmallestTensorCoreSmemOptin) return d;
  return head_dim > 128 ? MmaExtendKeyTile{16, 16, 3} : MmaExtendKeyTile{32, 32, 3};
}

// Whether the tensor-core extend has a tile for a device whose blocks may opt in to `optin` bytes
// (else the backend runs the SIMT extend kernel; every tensor-core device has one today).
constexpr bool mma_extend_fits(int head_dim, bool native_kv, int optin) {
  return mma_extend_smem_bytes(head_dim, mma_extend_tile_compact(head_dim, native_kv)) <= optin;
}

// The tensor-core extend launches one block per (query tile, request, q head) in a
// one-dimensional grid (numbered heaviest tile first, mma_extend.cuh): batches past 2^31 - 1
// blocks are refused by name. The backend checks it before its cache write; the launch again.
inline Status check_mma_extend_grid(int64_t bs, int64_t max_q_len, int64_t num_q_heads,
                                    int head_dim) {
  const int64_t block_m = mma_extend_block_m(head_dim);
  const int64_t m_tiles = (max_q_len + block_m - 1) / block_m;
  const int64_t blocks = bs * m_tiles * num_q_heads;
  if (blocks <= 0x7fffffff) return Status::ok();
  return Status::invalid_argument(
      "triton: extend grid of " + std::to_string(blocks) + " blocks (" + std::to_string(bs) +
      " requests x " + std::to_string(m_tiles) + " query tiles of " + std::to_string(block_m) +
      " rows for the longest extend of " + std::to_string(max_q_len) + " tokens x " +
      std::to_string(num_q_heads) +
      " q heads) exceeds 2^31 - 1; split the batch or chunk its longest prefill");
}

// Tensor-core extend (SM80+, bf16/f16 activations, MHA head dims <= 256).
template <int kD>
Status run_mma_extend(AttentionParams p, DType q_dtype, DType kv_dtype, int max_q_len,
                      StreamHandle stream);

}  // namespace attnkit::triton
