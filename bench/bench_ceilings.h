// Machine ceilings measured in the same run as the cases, and the cache sizes that decide how many
// rotating input copies a case needs.
#pragma once

#include <cstdint>
#include <string>

#include "attnkit/status.h"
#include "attnkit/tensor.h"

namespace attnkit::bench {

struct Ceiling {
  std::string name;    // "cpu_copy", "cuda_d2d_copy", "cpu_bf16_dot_peak", "cpu_fp32_fma_peak",
                       // "cpu_amx_bf16_peak"
  std::string method;  // one line: how it was measured
  double bytes = 0;    // copy ceilings: bytes counted per repetition (read + written)
  double gbs = 0;      // copy ceilings: best repetition
  double median_gbs = 0;
  double flops = 0;   // compute ceilings: FLOPs per repetition
  double tflops = 0;  // compute ceilings: best repetition
  double median_tflops = 0;
  double min_tflops = 0;  // compute ceilings: worst repetition
};

// Last-level cache of the host in bytes: the highest-level unified cache of cpu0 from
// /sys/devices/system/cpu/cpu0/cache (what lscpu reports), else sysconf(_SC_LEVEL3_CACHE_SIZE),
// else 0. `source` says which.
int64_t host_llc_bytes(std::string* source);
// Device L2 in bytes (cudaDevAttrL2CacheSize); 0 without CUDA.
Result<int64_t> cuda_l2_bytes(int ordinal);

// Bytes the rotating inputs of one case must exceed: CPU 2 x LLC and at least kMinCpuRotateBytes;
// CUDA 2 x L2.
inline constexpr int64_t kMinCpuRotateBytes = int64_t{256} << 20;
Result<int64_t> default_rotate_bytes(Device device, std::string* why);

// STREAM-like copy: every OpenMP thread memcpy's its share of a buffer of `buffer_bytes` (2 x LLC
// or more) into a second one; bytes counted = 2 x buffer_bytes (read + write). Best and median of
// `reps` repetitions after one untimed pass (first touch).
Result<Ceiling> measure_cpu_copy(int64_t buffer_bytes, int reps);
// The same copy as measure_cpu_copy, kept allocated so that single passes can be interleaved with
// a case's timed calls (RunSettings::paired_rounds): create() allocates and first-touches both
// buffers, pass_gbs() times one pass (bytes read + written).
class CpuCopyProbe {
 public:
  static Result<CpuCopyProbe> create(int64_t buffer_bytes);
  double pass_gbs();
  // One read-only pass over the source buffer (every thread sums its share; no stores): the
  // per-core read ceiling that a decode, which only reads, is bound by. GB/s of bytes read.
  double read_pass_gbs();
  int64_t buffer_bytes() const { return bytes_; }
  int threads() const { return threads_; }

 private:
  void pass(bool fill);
  Buffer src_;
  Buffer dst_;
  int64_t bytes_ = 0;
  int threads_ = 1;
};
// Read-only ceiling: every OpenMP thread sums its share of a buffer of `buffer_bytes` (no stores);
// bytes counted = buffer_bytes. Best and median of `reps` passes after the first touch. Reported
// beside cpu_copy (which counts reads + writes): a decode only reads, so on hosts whose cores draw
// a limited read rate each (few threads), this is the ceiling a decode can reach.
Result<Ceiling> measure_cpu_read(int64_t buffer_bytes, int reps);
// Peak arithmetic of the host's vector units, every OpenMP thread running independent chains of
// dependent-free multiply-adds from registers (no memory traffic): AVX512-BF16 vdpbf16ps (64 FLOPs
// per instruction: 32 bf16 products + 32 adds into 16 fp32 lanes) when the CPU has it, else AVX2
// FMA on fp32 (16 FLOPs per instruction); kUnsupported without AVX2. The compute ceiling for CPU
// prefill on a CPU without AMX (measure_cpu_amx_peak is the ceiling where AMX exists).
Result<Ceiling> measure_cpu_compute_peak(bool has_avx512_bf16, bool has_avx2, int reps);
// Peak of the AMX tile unit: every OpenMP thread runs tdpbf16ps on 4 independent 16x16 f32 tiles
// from tile registers (16384 FLOPs per instruction), no memory traffic. The compute ceiling for
// CPU prefill on a machine with AMX-BF16; kUnsupported without it (or in an ATTNKIT_AMX_EMULATE
// build).
Result<Ceiling> measure_cpu_amx_peak(bool has_amx_bf16, int reps);
// The rate a compute ceiling's ratios are taken against: the AMX peak's median pass (its best can
// catch a moment when the vCPUs' tile units are not shared), every other ceiling's best.
inline double compute_ceiling_tflops(const Ceiling& c) {
  return c.name == "cpu_amx_bf16_peak" ? c.median_tflops : c.tflops;
}
// One reading of the CPU compute ceiling `name` (cpu_amx_bf16_peak, cpu_bf16_dot_peak or
// cpu_fp32_fma_peak), for the paired rounds of compute-bound cases: `reps` passes of the same
// kernel as the ceiling, reduced by compute_ceiling_tflops as the table's ratios are.
// kInvalidArgument for another name; the ceiling's own errors otherwise.
Result<double> cpu_peak_pass_tflops(const std::string& name, int reps);
// Passes per paired-round reading of the compute ceiling.
inline constexpr int kPairedPeakReps = 3;
// cudaMemcpy device-to-device of `buffer_bytes` (>= 1 GiB) timed with CUDA events; bytes counted
// = 2 x buffer_bytes.
Result<Ceiling> measure_cuda_copy(int ordinal, int64_t buffer_bytes, int reps);

}  // namespace attnkit::bench
