// Host-facing entry points of the fa3 backend's SM90 kernels (no CUDA types). Each head dim is
// its own translation unit (prefill_sm90_hd<d>.cu), compiled for sm_90a only.
#pragma once

#include "attnkit/dtype.h"
#include "attnkit/status.h"
#include "attnkit/tensor.h"
#include "backends/fa3/kernels/fa3_params.h"
#include "cuda/common/dispatch.h"

namespace attnkit::fa3 {

// Head dims of the wgmma prefill kernel.
using WgmmaHeadDims = ValueList<64, 128, 256>;

// Whether head dim d has a wgmma translation unit in this binary (in WgmmaHeadDims and in the
// CMake ATTNKIT_HEAD_DIMS list; host code only).
constexpr bool wgmma_head_dim_compiled(int d) {
#ifdef ATTNKIT_HEAD_DIMS_LIST
  constexpr int kBuilt[] = {ATTNKIT_HEAD_DIMS_LIST};
  bool in_cmake = false;
  for (int b : kBuilt) in_cmake = in_cmake || b == d;
  return in_cmake && WgmmaHeadDims::contains(d);
#else
  (void)d;
  return false;
#endif
}

// Whether the wgmma kernel for head dim kD is in this binary as sm_90 machine code (false when
// the library was built without 90a among its CUDA architectures).
template <int kD>
bool prefill_sm90_available();

// Prefill/extend over the tiles of p.plan, persistent grid of min(units, sm_count) CTAs, with key
// blocks of block_n keys (block_n_supported(kD, block_n); p.tma_rows must divide it).
// q dtype bf16 / f16; the pool holds the q dtype.
template <int kD>
Status run_prefill_sm90(const Fa3Params& p, DType q_dtype, int block_n, int sm_count,
                        StreamHandle stream);

// The MLA prefill kernel (prefill_sm90_mla.cu): non-absorbed MLA layers, q / k head dim
// kMlaPrefillDimQK, v / out kMlaPrefillDimV, bf16 / f16, kv heads = q heads (p.group 1), causal
// over the new tokens only: key k of a request is row q_start + k of p.k_pool / p.v_pool (the
// layer's k / v inputs [T, H, d]; the plan's kv_len = q_len), 128-row tiles, 128-key blocks
// (p.tma_rows 128 or 0), no window / soft-cap / sinks (kInternal). Always compiled (sm_90a).
inline constexpr int kMlaPrefillDimQK = 192;
inline constexpr int kMlaPrefillDimV = 128;
inline constexpr int kMlaPrefillBlockN = 128;
bool prefill_sm90_mla_available();
Status run_prefill_sm90_mla(const Fa3Params& p, DType q_dtype, int sm_count, StreamHandle stream);

// The FP8 kernel (prefill_sm90_fp8.cuh): e4m3 pool (k_scale folded into p.scale_log2, p.v_scale),
// bf16 q / out, head dim 128, key blocks of 128, or 192 with p.vt_pre and p.fp8_spec
// (p.fp8_block_n). Instantiated in the head-dim-128 unit.
// p.vt_pre: first the V^T pre-transpose (fp8_vt_pre_kernel over the key blocks of the longest
// request with new tokens, max_kv_len keys (> 0, else kInternal), x p.bs x kv heads) into
// p.vt_ws, then the attention kernel. Without p.vt_pre max_kv_len is unused.
bool prefill_sm90_fp8_available();
Status run_prefill_sm90_fp8(const Fa3Params& p, int sm_count, StreamHandle stream, int max_kv_len);

}  // namespace attnkit::fa3
