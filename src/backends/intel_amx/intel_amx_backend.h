// Factory for the `intel_amx` backend; its descriptor lives in src/registry/builtin.cpp.
//
// intel_amx is the CPU backend: extend/prefill computes Q.K^T and P.V on AMX-BF16 tiles (K/V rows
// gathered through req_to_token and packed into the VNNI tile layout per key block; without AMX,
// the same blocks by vdpbf16ps or f32 FMA register blocks on AVX-512), decode runs
// AVX-512 (vdpbf16ps where AVX512-BF16 exists) split over (request, kv chunk), each item covering
// every kv head so the pool rows stream whole, merged by log-sum-exp; the heads of a GQA group
// share every K/V load, and softmax is online in f32.
// It reads the pool through token indices, so any page size works. Supported: MHA, decode /
// extend / mixed / draft extend / TARGET_VERIFY with topk 1 (chain), causal decoder and
// bidirectional encoder-only attention, cross-attention (encoder tokens at the start of each
// req_to_token row), sliding window, soft-cap, sinks, q in f32/f16/bf16, KV in
// bf16/f16/f32/fp8_e4m3/fp8_e5m2, head dims that are multiples of 16 up to 256. Rejected with
// kUnsupported: MLA, fp4 KV, verify trees (topk > 1).
//
// The instruction set is chosen at run time, best first: amx -> avx512_bf16 -> avx512 -> avx2 ->
// scalar. ATTNKIT_CPU_ISA=<name> (or IntelAmxOptions::isa) forces one; forcing a level the CPU
// or the OS does not provide is an error. Threads: BackendContext::num_threads, else OpenMP's
// default (OMP_NUM_THREADS).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "attnkit/backend.h"
#include "attnkit/device.h"

namespace attnkit {

// Instruction-set levels of the intel_amx kernels, lowest first.
enum class CpuIsa {
  kScalar,      // portable C++
  kAvx2,        // AVX2 + FMA + F16C
  kAvx512,      // AVX-512 F/BW/VL
  kAvx512Bf16,  // + AVX512-BF16 dot products (decode and the blocked extend without tiles) and
                //   AVX512-VBMI byte permutes (fp8 KV widened by table lookups); a CPU with
                //   AVX512-BF16 but no VBMI (Cooper Lake) runs the avx512 level
  kAmx,         // + AMX-BF16 tiles for extend; decode runs the avx512_bf16 kernel
};

// "scalar", "avx2", "avx512", "avx512_bf16", "amx".
const char* cpu_isa_name(CpuIsa isa);
Result<CpuIsa> parse_cpu_isa(std::string_view name);
// Whether the CPU (and, for AMX, the OS tile permission) described by `cpu` provides `isa`.
bool cpu_isa_supported(CpuIsa isa, const DeviceInfo& cpu);
// The best level `cpu` provides.
CpuIsa best_cpu_isa(const DeviceInfo& cpu);

struct IntelAmxOptions {
  // Forced level; nullopt = ATTNKIT_CPU_ISA if set, else best_cpu_isa(detect_cpu()).
  std::optional<CpuIsa> isa;
};

Result<std::unique_ptr<AttentionBackend>> create_intel_amx_backend(const BackendContext& ctx);
// Same, with options (the registry's factory above uses the defaults).
Result<std::unique_ptr<AttentionBackend>> create_intel_amx_backend_with_options(
    const BackendContext& ctx, const IntelAmxOptions& options);

// The level an intel_amx backend runs; kInvalidArgument when `backend` is not intel_amx.
Result<CpuIsa> intel_amx_backend_isa(const AttentionBackend& backend);
// The extend kernel its last forward_extend ran: "amx" (tiles), "blocked_avx512_bf16" /
// "blocked_avx512" (the same blocks by vdpbf16ps / f32 FMA), or the per-token vector kernel's ISA
// name ("avx512_bf16", "avx512", "avx2", "scalar"); "none" before the first. For tests and
// benchmarks.
Result<std::string> intel_amx_last_extend_kernel(const AttentionBackend& backend);

}  // namespace attnkit
