// Device-side KV scatter used by CUDA pools (MHAKVPool / MLAKVPool::set_kv on a CUDA device).
// Declared here, implemented in src/kv/set_kv_cuda.cu (CUDA builds only). The host side
// (src/kv/kv_pool.cpp) validates layer, shapes, dtypes, devices and scale before calling, so the
// kernel may assume:
//   - dst is contiguous [rows, H, D] in the pool dtype (bf16, f16, f32, fp8_e4m3, fp8_e5m2,
//     fp4_e2m1; for fp4 D counts logical values, two per byte, low nibble = even index);
//   - dst_scales is contiguous fp8_e4m3 [rows, H, D / kFp4GroupSize] when dst is fp4, and empty
//     (data == nullptr) otherwise;
//   - loc is contiguous int64 [T] on the same device;
//   - src is [T, H, D] in f32, f16 or bf16 with src.stride(2) == 1 (dims 0 and 1 may be strided);
//   - scale is finite and > 0. T may be 0 (then nothing is launched).
// Slot values are NOT validated on the host (they live on the device). Slots in page 0 are legal
// here: padded CUDA-graph rows write their dummy tokens there. Device guard (always on): a token
// whose slot is outside [0, rows) writes nothing (no element, no fp4 block scale) and the first
// such token is recorded in `guard` (a KVGuardRecord on the device; nullptr = skip without
// recording): one atomicCAS on `flag` per bad token, then the winner stores layer/token/slot. The
// check is one compare per (token, head) block, and the kernel argument is a fixed pointer, so
// the launch stays graph-capturable. With ATTNKIT_CHECK_INDICES=1 in the environment the pool
// also checks 0 <= loc[t] < rows synchronously (check_slots_cuda) once, before it writes K or V,
// and returns kInvalidArgument naming the first bad t and slot with nothing written.
//
// Quantisation (must match the CPU path in kv_pool.cpp bit for bit):
//   bf16 / f16 / f32: dst = RNE(x); scale is not applied (it only applies to quantised caches).
//   fp8: dst = saturating RNE(x / scale) (float division, IEEE-rounded, no fast-math).
//   fp4: for each group of 16 consecutive values of one [t, h] row:
//        amax  = max |x| over the group (float; NaN ignored);
//        exact = (amax / 6.0f) / scale (two float divisions);
//        block = the smallest fp8_e4m3 value >= exact (round up, so no code saturates), clamped
//                to the e4m3 maximum 448; 0 when amax == 0;
//        code  = RNE-to-e2m1(x / (block * scale)) with (block * scale) computed in float; 0 when
//                block == 0.
//        Dequantised value = e2m1(code) * block * scale.
#pragma once

#include <cstdint>
#include <string>

#include "attnkit/status.h"
#include "attnkit/tensor.h"
#include "kv/kv_guard_record.h"

namespace attnkit::detail {

// KVGuardRecord: kv/kv_guard_record.h.

// The error text of a recorded bad write (host logic, in kv_pool.cpp; CPU-testable).
std::string kv_guard_message(const KVGuardRecord& record, int64_t rows, int page_size);

// CUDA builds only (set_kv_cuda.cu): copies the record at `guard` to *out on `stream`, synchronises
// the stream, and clears the record on the device when it was set (same stream).
Status kv_guard_read_and_clear(void* guard, KVGuardRecord* out, StreamHandle stream);

// CUDA builds only: with ATTNKIT_CHECK_INDICES=1, checks 0 <= loc[t] < rows for every t of loc
// (int64 [T] on the device) on `stream`, synchronously, and returns kInvalidArgument naming the
// first bad t and slot; ok at once when the knob is off or T == 0. set_kv runs it once for K and V
// before writing either, so a refused call leaves the whole cache as it was.
Status check_slots_cuda(const TensorView& loc, int64_t rows, StreamHandle stream);

// Scatters src[t] into dst[loc[t]] for t in [0, T), quantising as described above. Asynchronous
// on `stream` (a cudaStream_t, nullptr = default stream); returns a launch error as kCudaError.
// Inputs are not checked here: set_kv ran every check (the pool's and check_slots_cuda) before
// its first scatter, so only a launch error can fail the V scatter after the K scatter.
Status set_kv_cuda(const TensorView& dst,         // [rows, H, D] pool dtype, contiguous
                   const TensorView& dst_scales,  // fp4: fp8_e4m3 [rows, H, D / 16]; else empty
                   const TensorView& loc,         // int64 [T], contiguous
                   const TensorView& src,         // [T, H, D] f32/f16/bf16, stride(2) == 1
                   float scale, int layer, void* guard, StreamHandle stream);

}  // namespace attnkit::detail
