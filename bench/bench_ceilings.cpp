#include "bench/bench_ceilings.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "bench/bench_formulas.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#include <immintrin.h>
#ifdef ATTNKIT_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace attnkit::bench {
namespace {

// "32768K" / "1M" / "512" -> bytes; 0 when unparsable.
int64_t parse_cache_size(const std::string& text) {
  size_t pos = 0;
  int64_t value = 0;
  while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
    value = value * 10 + (text[pos] - '0');
    ++pos;
  }
  if (pos == 0) return 0;
  if (pos < text.size() && (text[pos] == 'K' || text[pos] == 'k')) return value << 10;
  if (pos < text.size() && (text[pos] == 'M' || text[pos] == 'm')) return value << 20;
  return value;
}

std::string read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return line;
}

// Independent accumulator chains: enough to cover the multiply-add latency (4-6 cycles) times the
// issue width (2 per cycle) of current x86 cores; 16 zmm accumulators + 2 inputs fit the 32 zmm
// registers.
constexpr int kPeakChains = 16;
// Inner iterations per timed repetition per thread: 2^24 x 16 chains x 64 FLOPs = 17 GFLOP, about
// 0.1 s per core at 150 GFLOP/s.
constexpr int64_t kPeakIters = int64_t{1} << 24;

// The peak loops' results land here so that the compiler keeps them.
volatile float g_peak_sink = 0;

// Runs `iters` rounds of kPeakChains vdpbf16ps; returns a lane sum so nothing is optimised away.
__attribute__((target("avx512f,avx512bf16"))) float bf16_dot_chains(int64_t iters) {
  __m512 acc[kPeakChains];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  // bf16 1.0 and 2^-10: the accumulators grow by 2 x 2^-10 per lane and round, never overflow.
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80);
  const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3a80);
  for (int64_t i = 0; i < iters; ++i) {
    for (__m512& x : acc) x = _mm512_dpbf16_ps(x, a, b);
  }
  __m512 sum = acc[0];
  for (int j = 1; j < kPeakChains; ++j) sum = _mm512_add_ps(sum, acc[j]);
  return _mm512_reduce_add_ps(sum);
}

__attribute__((target("avx2,fma"))) float fp32_fma_chains(int64_t iters) {
  __m256 acc[kPeakChains];
  for (__m256& a : acc) a = _mm256_setzero_ps();
  const __m256 a = _mm256_set1_ps(1.0f);
  const __m256 b = _mm256_set1_ps(1.0f / 1024);
  for (int64_t i = 0; i < iters; ++i) {
    for (__m256& x : acc) x = _mm256_fmadd_ps(a, b, x);
  }
  __m256 sum = acc[0];
  for (int j = 1; j < kPeakChains; ++j) sum = _mm256_add_ps(sum, acc[j]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  float total = 0;
  for (float x : lanes) total += x;
  return total;
}

constexpr int kAmxTileRows = 16;
constexpr int kAmxTileRowBytes = 64;
// Short passes (2^16 x 4 dots: ~2-3 ms per core), many of them: on hosts whose 2-thread tile rate
// is bimodal (the device Xeon: ~1.9 or ~4.6 TFLOP/s, vCPUs that share a physical core's tile unit
// or not) the best, median and worst pass show whether the mode changed within the process.
constexpr int64_t kAmxPeakIters = int64_t{1} << 16;  // x 4 tdpbf16ps

struct alignas(64) AmxPeakConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

#ifndef ATTNKIT_AMX_EMULATE
// `iters` rounds of 4 independent tdpbf16ps (2 x 2 blocking: C tiles 0-3, A tiles 4-5, B tiles
// 6-7), operands loaded once: the tile unit's peak with no memory traffic. Returns one C value so
// that nothing is optimised away. The caller holds the tile permission (detect_cpu()).
__attribute__((target("amx-tile,amx-bf16"))) float amx_dot_chains(int64_t iters) {
  AmxPeakConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = kAmxTileRowBytes;
    cfg.rows[t] = kAmxTileRows;
  }
  _tile_loadconfig(&cfg);
  // bf16 2^-10 everywhere: each dot adds 32 x 2^-20 per element, far from overflow.
  alignas(64) uint16_t operand[kAmxTileRows * kAmxTileRowBytes / 2];
  for (uint16_t& x : operand) x = 0x3a80;
  alignas(64) float c[kAmxTileRows * kAmxTileRowBytes / 4];
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, operand, kAmxTileRowBytes);
  _tile_loadd(5, operand, kAmxTileRowBytes);
  _tile_loadd(6, operand, kAmxTileRowBytes);
  _tile_loadd(7, operand, kAmxTileRowBytes);
  for (int64_t i = 0; i < iters; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, kAmxTileRowBytes);
  _tile_release();
  return c[0];
}
#endif

// The OpenMP threads the CPU ceilings run on (1 without OpenMP).
int ceiling_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// A compute peak: work(iters) on each of `threads` threads per pass, one warm-up pass of iters / 16
// (wakes the cores, the thread pool and the tile units), then `reps` timed passes of `flops` each.
// Fills flops, tflops (best pass) and median_tflops; the caller names the ceiling.
template <class Work>
Ceiling time_compute_peak(Work work, int threads, int64_t iters, double flops, int reps) {
  auto pass = [&](int64_t n) {
#ifdef _OPENMP
#pragma omp parallel for schedule(static, 1) num_threads(threads)
#endif
    for (int t = 0; t < threads; ++t) g_peak_sink = work(n);
  };
  pass(iters / 16);
  std::vector<double> tflops;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    pass(iters);
    const auto t1 = std::chrono::steady_clock::now();
    tflops.push_back(
        tflop_per_s(flops, std::chrono::duration<double, std::milli>(t1 - t0).count()));
  }
  Ceiling c;
  c.flops = flops;
  c.tflops = *std::max_element(tflops.begin(), tflops.end());
  c.median_tflops = median(tflops);
  c.min_tflops = *std::min_element(tflops.begin(), tflops.end());
  return c;
}

}  // namespace

int64_t host_llc_bytes(std::string* source) {
  const std::string base = "/sys/devices/system/cpu/cpu0/cache/index";
  int best_level = 0;
  int64_t best_bytes = 0;
  for (int i = 0;; ++i) {
    const std::string dir = base + std::to_string(i);
    const std::string level_text = read_first_line(dir + "/level");
    if (level_text.empty()) break;
    const std::string type = read_first_line(dir + "/type");
    const int level = std::atoi(level_text.c_str());
    if (type == "Unified" && level > best_level) {
      best_level = level;
      best_bytes = parse_cache_size(read_first_line(dir + "/size"));
    }
  }
  if (best_bytes > 0) {
    if (source) *source = "sysfs L" + std::to_string(best_level);
    return best_bytes;
  }
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (l3 > 0) {
    if (source) *source = "sysconf L3";
    return l3;
  }
  if (source) *source = "unknown";
  return 0;
}

Result<int64_t> cuda_l2_bytes(int ordinal) {
#ifdef ATTNKIT_WITH_CUDA
  int bytes = 0;
  const cudaError_t err = cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, ordinal);
  if (err != cudaSuccess) {
    return Status::cuda_error(std::string("cudaDeviceGetAttribute(L2CacheSize, device ") +
                              std::to_string(ordinal) + "): " + cudaGetErrorString(err));
  }
  return static_cast<int64_t>(bytes);
#else
  return Status::not_built("cuda_l2_bytes(" + std::to_string(ordinal) +
                           "): this build has no CUDA");
#endif
}

Result<int64_t> default_rotate_bytes(Device device, std::string* why) {
  if (device.is_cuda()) {
    ATTNKIT_ASSIGN_OR_RETURN(const int64_t l2, cuda_l2_bytes(device.ordinal));
    if (why) *why = "2 x L2 (" + std::to_string(l2 >> 20) + " MiB)";
    return 2 * l2;
  }
  std::string source;
  const int64_t llc = host_llc_bytes(&source);
  const int64_t bytes = std::max(2 * llc, kMinCpuRotateBytes);
  if (why) {
    *why = "max(2 x LLC (" + std::to_string(llc >> 20) + " MiB, " + source + "), " +
           std::to_string(kMinCpuRotateBytes >> 20) + " MiB)";
  }
  return bytes;
}

Result<CpuCopyProbe> CpuCopyProbe::create(int64_t buffer_bytes) {
  if (buffer_bytes <= 0) {
    return Status::invalid_argument("CpuCopyProbe: buffer_bytes " + std::to_string(buffer_bytes) +
                                    " must be positive");
  }
  CpuCopyProbe probe;
  ATTNKIT_ASSIGN_OR_RETURN(probe.src_, Buffer::allocate(Device::cpu(), buffer_bytes));
  ATTNKIT_ASSIGN_OR_RETURN(probe.dst_, Buffer::allocate(Device::cpu(), buffer_bytes));
  probe.bytes_ = buffer_bytes;
  probe.threads_ = ceiling_threads();
  probe.pass(/*fill=*/true);  // first touch of both buffers, by the threads that copy them
  return probe;
}

// Runs fn(t, begin, end) on `threads` threads, thread t on its contiguous, 64-byte aligned chunk
// [begin, end) of [0, bytes) (threads whose chunk is empty skip fn).
template <class Fn>
static void for_each_thread_chunk(int64_t bytes, int threads, Fn&& fn) {
  constexpr int64_t kAlign = 64;
  const int64_t chunk = ((bytes / threads + kAlign - 1) / kAlign) * kAlign;
#ifdef _OPENMP
#pragma omp parallel for schedule(static, 1) num_threads(threads)
#endif
  for (int t = 0; t < threads; ++t) {
    const int64_t begin = std::min(bytes, t * chunk);
    const int64_t end = std::min(bytes, begin + chunk);
    if (end > begin) fn(t, begin, end);
  }
}

void CpuCopyProbe::pass(bool fill) {
  char* s = static_cast<char*>(src_.data());
  char* d = static_cast<char*>(dst_.data());
  for_each_thread_chunk(bytes_, threads_, [&](int t, int64_t begin, int64_t end) {
    if (fill) std::memset(s + begin, t + 1, static_cast<size_t>(end - begin));
    std::memcpy(d + begin, s + begin, static_cast<size_t>(end - begin));
  });
}

// Sum of the 8-byte words of [p, p + bytes) in 8 independent chains (the compiler vectorises it):
// a read-only stream with no stores, far below any core's load rate per byte.
static uint64_t read_sum(const char* p, int64_t bytes) {
  constexpr int kChains = 8;
  uint64_t acc[kChains] = {};
  const int64_t words = bytes / 8;
  int64_t i = 0;
  for (; i + kChains <= words; i += kChains) {
    for (int j = 0; j < kChains; ++j) {
      uint64_t w;
      std::memcpy(&w, p + 8 * (i + j), sizeof(w));
      acc[j] += w;
    }
  }
  uint64_t total = 0;
  for (uint64_t a : acc) total += a;
  return total;
}

// Keeps the read passes' sums alive (every thread adds its chunk's).
static std::atomic<uint64_t> g_read_sink{0};

double CpuCopyProbe::read_pass_gbs() {
  const char* s = static_cast<const char*>(src_.data());
  const int64_t bytes = bytes_;
  const auto t0 = std::chrono::steady_clock::now();
  for_each_thread_chunk(bytes, threads_, [&](int, int64_t begin, int64_t end) {
    g_read_sink.fetch_add(read_sum(s + begin, end - begin), std::memory_order_relaxed);
  });
  const auto t1 = std::chrono::steady_clock::now();
  return gb_per_s(static_cast<double>(bytes),
                  std::chrono::duration<double, std::milli>(t1 - t0).count());
}

double CpuCopyProbe::pass_gbs() {
  const auto t0 = std::chrono::steady_clock::now();
  pass(/*fill=*/false);
  const auto t1 = std::chrono::steady_clock::now();
  const double ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  return gb_per_s(2.0 * static_cast<double>(bytes_), ms);
}

// One kind of CpuCopyProbe pass measured as a bandwidth ceiling.
struct CpuBandwidthPass {
  const char* name;                    // the ceiling's name; "measure_" + name in errors
  const char* action;                  // method text: "<action> of N MiB by T threads"
  const char* counted;                 // which bytes count, e.g. "bytes read + written"
  double bytes_per_buffer_byte;        // bytes one pass moves per buffer byte
  double (CpuCopyProbe::*pass_gbs)();  // one timed pass, GB/s
};

// The best (and median) of `reps` passes over a fresh probe of buffer_bytes.
static Result<Ceiling> measure_cpu_bandwidth(const CpuBandwidthPass& pass, int64_t buffer_bytes,
                                             int reps) {
  if (buffer_bytes <= 0 || reps <= 0) {
    return Status::invalid_argument(std::string("measure_") + pass.name + ": buffer_bytes " +
                                    std::to_string(buffer_bytes) + " and reps " +
                                    std::to_string(reps) + " must be positive");
  }
  ATTNKIT_ASSIGN_OR_RETURN(CpuCopyProbe probe, CpuCopyProbe::create(buffer_bytes));
  std::vector<double> gbs;
  for (int r = 0; r < reps; ++r) gbs.push_back((probe.*pass.pass_gbs)());
  Ceiling c;
  c.name = pass.name;
  c.method = std::string(pass.action) + " of " + std::to_string(buffer_bytes >> 20) + " MiB by " +
             std::to_string(probe.threads()) + " threads, " + pass.counted + ", best of " +
             std::to_string(reps);
  c.bytes = pass.bytes_per_buffer_byte * static_cast<double>(buffer_bytes);
  c.gbs = *std::max_element(gbs.begin(), gbs.end());
  c.median_gbs = median(gbs);
  return c;
}

Result<Ceiling> measure_cpu_copy(int64_t buffer_bytes, int reps) {
  return measure_cpu_bandwidth(
      {"cpu_copy", "memcpy", "bytes read + written", 2.0, &CpuCopyProbe::pass_gbs}, buffer_bytes,
      reps);
}

Result<Ceiling> measure_cpu_read(int64_t buffer_bytes, int reps) {
  return measure_cpu_bandwidth(
      {"cpu_read", "read-only sum", "bytes read", 1.0, &CpuCopyProbe::read_pass_gbs}, buffer_bytes,
      reps);
}

Result<Ceiling> measure_cpu_compute_peak(bool has_avx512_bf16, bool has_avx2, int reps) {
  if (reps <= 0) {
    return Status::invalid_argument("measure_cpu_compute_peak: reps " + std::to_string(reps) +
                                    " must be positive");
  }
  if (!has_avx512_bf16 && !has_avx2) {
    return Status::unsupported(
        "measure_cpu_compute_peak: the CPU has neither AVX512-BF16 nor AVX2");
  }
  // FLOPs of one instruction: vdpbf16ps = 16 lanes x 2 products x 2 (multiply + add);
  // vfmadd231ps ymm = 8 lanes x 2.
  constexpr double kBf16DotFlops = 64;
  constexpr double kFp32FmaFlops = 16;
  const double per_instruction = has_avx512_bf16 ? kBf16DotFlops : kFp32FmaFlops;
  const int threads = ceiling_threads();
  const double flops = static_cast<double>(threads) * static_cast<double>(kPeakIters) *
                       kPeakChains * per_instruction;
  Ceiling c = time_compute_peak(
      [has_avx512_bf16](int64_t iters) {
        return has_avx512_bf16 ? bf16_dot_chains(iters) : fp32_fma_chains(iters);
      },
      threads, kPeakIters, flops, reps);
  c.name = has_avx512_bf16 ? "cpu_bf16_dot_peak" : "cpu_fp32_fma_peak";
  c.method = std::string(has_avx512_bf16 ? "AVX512-BF16 vdpbf16ps" : "AVX2 fp32 FMA") + ", " +
             std::to_string(kPeakChains) + " register chains x " + std::to_string(threads) +
             " threads, best of " + std::to_string(reps);
  return c;
}

Result<Ceiling> measure_cpu_amx_peak(bool has_amx_bf16, int reps) {
  if (reps <= 0) {
    return Status::invalid_argument("measure_cpu_amx_peak: reps " + std::to_string(reps) +
                                    " must be positive");
  }
#ifdef ATTNKIT_AMX_EMULATE
  (void)has_amx_bf16;
  return Status::unsupported(
      "measure_cpu_amx_peak: built with ATTNKIT_AMX_EMULATE (no real tiles)");
#else
  if (!has_amx_bf16) {
    return Status::unsupported(
        "measure_cpu_amx_peak: the CPU (or the OS tile permission) provides no AMX-BF16");
  }
  // FLOPs of one tdpbf16ps: 16 x 16 results x 32 products x 2 (multiply + add).
  constexpr double kTileDotFlops = 16.0 * 16.0 * 32.0 * 2.0;
  constexpr int kDotsPerIter = 4;
  const int threads = ceiling_threads();
  const double flops = static_cast<double>(threads) * static_cast<double>(kAmxPeakIters) *
                       kDotsPerIter * kTileDotFlops;
  Ceiling c = time_compute_peak(amx_dot_chains, threads, kAmxPeakIters, flops, reps);
  c.name = "cpu_amx_bf16_peak";
  c.method = "AMX tdpbf16ps, 4 independent 16x16 tiles (2x2 blocking) from registers x " +
             std::to_string(threads) + " threads, best of " + std::to_string(reps) +
             " short passes (median " + std::to_string(c.median_tflops) + ", worst " +
             std::to_string(c.min_tflops) + "; extend ratios use the median)";
  return c;
#endif
}

Result<double> cpu_peak_pass_tflops(const std::string& name, int reps) {
  if (name == "cpu_amx_bf16_peak") {
    ATTNKIT_ASSIGN_OR_RETURN(Ceiling c, measure_cpu_amx_peak(/*has_amx_bf16=*/true, reps));
    return compute_ceiling_tflops(c);
  }
  if (name == "cpu_bf16_dot_peak" || name == "cpu_fp32_fma_peak") {
    ATTNKIT_ASSIGN_OR_RETURN(
        Ceiling c, measure_cpu_compute_peak(name == "cpu_bf16_dot_peak", /*has_avx2=*/true, reps));
    return compute_ceiling_tflops(c);
  }
  return Status::invalid_argument("cpu_peak_pass_tflops: '" + name +
                                  "' is not a CPU compute ceiling (cpu_amx_bf16_peak, "
                                  "cpu_bf16_dot_peak or cpu_fp32_fma_peak)");
}

Result<Ceiling> measure_cuda_copy(int ordinal, int64_t buffer_bytes, int reps) {
#ifdef ATTNKIT_WITH_CUDA
  if (buffer_bytes <= 0 || reps <= 0) {
    return Status::invalid_argument("measure_cuda_copy: buffer_bytes " +
                                    std::to_string(buffer_bytes) + " and reps " +
                                    std::to_string(reps) + " must be positive");
  }
  const Device device = Device::cuda(ordinal);
  ATTNKIT_ASSIGN_OR_RETURN(Buffer src, Buffer::allocate(device, buffer_bytes));
  ATTNKIT_ASSIGN_OR_RETURN(Buffer dst, Buffer::allocate(device, buffer_bytes));
  auto check = [](cudaError_t err, const char* what) -> Status {
    if (err == cudaSuccess) return Status::ok();
    return Status::cuda_error(std::string(what) + ": " + cudaGetErrorString(err));
  };
  ATTNKIT_RETURN_IF_ERROR(check(cudaSetDevice(ordinal), "cudaSetDevice"));
  ATTNKIT_RETURN_IF_ERROR(
      check(cudaMemset(src.data(), 1, static_cast<size_t>(buffer_bytes)), "cudaMemset"));
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  ATTNKIT_RETURN_IF_ERROR(check(cudaEventCreate(&start), "cudaEventCreate"));
  ATTNKIT_RETURN_IF_ERROR(check(cudaEventCreate(&stop), "cudaEventCreate"));
  std::vector<double> gbs;
  Status status;
  for (int r = -1; r < reps && status.is_ok(); ++r) {  // r = -1: untimed warm-up
    status = check(cudaEventRecord(start), "cudaEventRecord");
    if (status.is_ok()) {
      status = check(cudaMemcpy(dst.data(), src.data(), static_cast<size_t>(buffer_bytes),
                                cudaMemcpyDeviceToDevice),
                     "cudaMemcpy(DeviceToDevice)");
    }
    if (status.is_ok()) status = check(cudaEventRecord(stop), "cudaEventRecord");
    if (status.is_ok()) status = check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    if (status.is_ok())
      status = check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    if (status.is_ok() && r >= 0)
      gbs.push_back(gb_per_s(2.0 * static_cast<double>(buffer_bytes), ms));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  ATTNKIT_RETURN_IF_ERROR(status);
  Ceiling c;
  c.name = "cuda_d2d_copy";
  c.method = "cudaMemcpy device-to-device of " + std::to_string(buffer_bytes >> 20) +
             " MiB, CUDA events, bytes read + written, best of " + std::to_string(reps);
  c.bytes = 2.0 * static_cast<double>(buffer_bytes);
  c.gbs = *std::max_element(gbs.begin(), gbs.end());
  c.median_gbs = median(gbs);
  return c;
#else
  (void)buffer_bytes;
  (void)reps;
  return Status::not_built("measure_cuda_copy(device " + std::to_string(ordinal) +
                           "): this build has no CUDA");
#endif
}

}  // namespace attnkit::bench
