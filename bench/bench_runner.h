// Runs one benchmark case on one backend: optional verification against the fp64 reference, then
// timing over rotating input copies (CUDA events on CUDA, steady_clock on the CPU).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attnkit/device.h"
#include "attnkit/registry.h"
#include "attnkit/tensor.h"
#include "bench/bench_case_spec.h"
#include "bench/bench_ceilings.h"
#include "bench/bench_formulas.h"
#include "harness/case_runner.h"

namespace attnkit::bench {

struct RunSettings {
  Device device;
  int warmup = 3;
  int iters = 10;
  int64_t rotate_bytes = 0;  // rotating copies must touch at least this many bytes
  int max_copies = 512;      // cap on rotating copies (tiny cases)
  bool verify = false;
  // CUDA: forwards enqueued back to back between the two timing events (the time is divided by
  // it). 1 = each timed forward alone, host launch latency included; > 1 hides it behind the
  // GPU work (kernel time).
  int launches = 1;
  // CUDA, decode and target-verify cases on backends with CUDA-graph support: time replays of one
  // CUDA graph captured through the backend's graph API (init_cuda_graph_state, capture, replay
  // metadata refresh: what a serving engine runs for decode) holding max(launches, rotating
  // copies) forwards, one per copy in turn; the time is divided by that count. Other cases are
  // skipped with the reason.
  bool graph = false;
  // CPU, memory-bound cases: after the timed calls, `paired_rounds` rounds of one pass of
  // `copy_probe` followed by `paired_calls` forwards, so that every ratio is taken against a copy
  // measured next to it (the machine's bandwidth moves between seconds on a shared host).
  // 0 rounds or no probe: off.
  int paired_rounds = 0;
  int paired_calls = 5;
  // The most one case's paired forwards may take, estimated from its timed median: fewer calls
  // per round past it, no rounds where one call per round would pass it (paired_calls_per_round).
  double paired_max_seconds = kPairedMaxSeconds;
  CpuCopyProbe* copy_probe = nullptr;
  // CPU, compute-bound cases: the same rounds against `paired_peak`, the name of the run's CPU
  // compute ceiling (cpu_peak_pass_tflops measures one of it per round); empty: off (e.g. a
  // --gemm-tflops ceiling, which no pass can measure).
  std::string paired_peak;
};

enum class CaseStatus { kOk, kSkipped, kFailed, kMismatch };
const char* case_status_name(CaseStatus status);

struct CaseResult {
  std::string backend;
  BenchCase bench_case;
  CaseStatus status = CaseStatus::kOk;
  std::string message;  // skip reason, error or verification summary
  int copies = 0;
  int forwards_per_sample = 1;  // forwards between one pair of timing events
  std::string timing;           // "eager", "eager back-to-back" or "cuda graph"
  int warmup = 0;
  int iters = 0;
  double ms_median = 0;
  double ms_min = 0;
  double ms_max = 0;
  double flops = 0;
  double bytes = 0;
  double gbs = 0;
  double tflops = 0;
  // Memory-bound cases: gbs / the copy ceiling; compute-bound: tflops / the compute ceiling; 0 when
  // that ceiling is unknown.
  double ceiling_ratio = 0;
  std::string ceiling;  // name of the ceiling the ratio is taken against
  // Judged by GB/s against the copy ceiling (is_memory_bound with the run's ceilings); set with
  // the timing, before it the kind's default.
  bool memory_bound = true;
  bool verified = false;
  double rel_l2 = 0;
  double max_abs = 0;
  // Forwards per paired round: RunSettings::paired_calls, fewer where the rounds would take more
  // than RunSettings::paired_max_seconds (run_case).
  int paired_calls = 0;
  // Why the case's paired rounds were cut or skipped (empty: run as asked, or none were due):
  // "1 of 5 calls per round ..." or "skipped: ...". In the table row and the JSON.
  std::string paired_note;
  // Paired copy rounds (RunSettings::paired_rounds), one entry per round: the copy pass's GB/s,
  // the case's GB/s over the median of that round's calls, and their ratio.
  std::vector<double> paired_copy_gbs;
  std::vector<double> paired_gbs;
  std::vector<double> paired_ratios;
  double paired_ratio_median = 0;  // median of paired_ratios (0: no rounds)
  // The same rounds against a read-only pass of the probe (CpuCopyProbe::read_pass_gbs), taken
  // right after the copy pass: the case's GB/s over the read ceiling of that moment.
  std::vector<double> paired_read_gbs;
  std::vector<double> paired_read_ratios;
  double paired_read_ratio_median = 0;
  // Paired peak rounds (RunSettings::paired_peak), one entry per round: the compute ceiling's
  // TFLOP/s measured right before the round's calls, the case's TFLOP/s over their median, and
  // the ratio.
  std::vector<double> paired_peak_tflops;
  std::vector<double> paired_tflops;
  std::vector<double> paired_peak_ratios;
  double paired_peak_ratio_median = 0;  // median of paired_peak_ratios (0: no rounds)
  // --graph: host wall time of init_forward_metadata_replay_cuda_graph, the refresh a serving
  // engine runs once before every replay of its captured decode step (all layers), in us (0: not
  // measured). refresh_samples samples, each followed by one replay, with the host one replay
  // ahead of the GPU (refresh i while replay i - 1 runs): median, p90, max; and as many with the
  // stream drained before each refresh (the host cost alone): median.
  int refresh_samples = 0;
  double refresh_us_median = 0;
  double refresh_us_p90 = 0;
  double refresh_us_max = 0;
  double refresh_idle_us_median = 0;
};

// The rates the ratios are taken against (0 = not measured).
struct CeilingRates {
  std::string copy_name;
  double copy_gbs = 0;
  std::string compute_name;
  double compute_tflops = 0;
};

// Verifies (when settings.verify) and times `c` on the backend `descriptor` describes.
CaseResult run_case(const BackendDescriptor& descriptor, const BenchCase& c,
                    const RunSettings& settings, const DeviceInfo& device_info,
                    const CeilingRates& ceilings);

// Median/min/max wall time in ms of `iters` forward calls after `warmup`, cycling over the layers
// of `prepared` (one rotating copy each). The backend's metadata is initialised once. CUDA: each
// timed sample is `launches` back-to-back forwards, divided by `launches`.
struct Timing {
  double ms_median = 0;
  double ms_min = 0;
  double ms_max = 0;
  // --graph only: host time of the replay metadata refresh
  // (init_forward_metadata_replay_cuda_graph, once per replay of the whole captured step), us:
  // with the host one replay ahead of the GPU, and with the stream drained (CaseResult).
  std::vector<double> refresh_us;
  std::vector<double> refresh_idle_us;
};
Result<Timing> time_forward(AttentionBackend& backend, harness::PreparedCase& prepared, int warmup,
                            int iters, int launches = 1);

// Why `c` on `descriptor` cannot be timed as CUDA-graph replays ("" = it can): only decode and
// MLA decode / verify cases, on a CUDA device, on backends whose descriptor says cuda_graph.
std::string graph_skip_reason(const BackendDescriptor& descriptor, const BenchCase& c,
                              Device device);

// RunSettings::graph: creates the backend on its own stream, captures `forwards` forwards (copy i
// % layers for forward i) into one graph after init_forward_metadata_capture_cuda_graph, refreshes
// the metadata with init_forward_metadata_replay_cuda_graph, replays `warmup` times, then times
// `iters` replays with CUDA events; each sample is divided by `forwards`.
Result<Timing> time_graph_replay(const BackendDescriptor& descriptor,
                                 harness::PreparedCase& prepared, int warmup, int iters,
                                 int forwards);

}  // namespace attnkit::bench
