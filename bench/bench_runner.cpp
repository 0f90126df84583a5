#include "bench/bench_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#ifdef ATTNKIT_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace attnkit::bench {
namespace {

#ifdef ATTNKIT_WITH_CUDA
Status cuda_check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::ok();
  return Status::cuda_error(std::string(what) + ": " + cudaGetErrorString(err));
}

// Owns two CUDA events.
class EventPair {
 public:
  Status create() {
    ATTNKIT_RETURN_IF_ERROR(cuda_check(cudaEventCreate(&start_), "cudaEventCreate"));
    return cuda_check(cudaEventCreate(&stop_), "cudaEventCreate");
  }
  ~EventPair() {
    if (start_) cudaEventDestroy(start_);
    if (stop_) cudaEventDestroy(stop_);
  }
  cudaEvent_t start() const { return start_; }
  cudaEvent_t stop() const { return stop_; }

 private:
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

// Owns a non-blocking stream (graph capture needs one other than the legacy default stream), a
// graph and its executable; ends a capture left open by an error.
class GraphResources {
 public:
  ~GraphResources() {
    if (capturing_) {
      cudaGraph_t dropped = nullptr;
      cudaStreamEndCapture(stream_, &dropped);
      if (dropped) cudaGraphDestroy(dropped);
    }
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  Status create_stream() {
    return cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                      "cudaStreamCreateWithFlags");
  }
  Status begin_capture() {
    ATTNKIT_RETURN_IF_ERROR(
        cuda_check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
                   "cudaStreamBeginCapture"));
    capturing_ = true;
    return Status::ok();
  }
  Status end_capture_and_instantiate() {
    capturing_ = false;
    ATTNKIT_RETURN_IF_ERROR(
        cuda_check(cudaStreamEndCapture(stream_, &graph_), "cudaStreamEndCapture"));
    return cuda_check(cudaGraphInstantiate(&exec_, graph_, 0), "cudaGraphInstantiate");
  }
  Status launch() { return cuda_check(cudaGraphLaunch(exec_, stream_), "cudaGraphLaunch"); }
  cudaStream_t stream() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  bool capturing_ = false;
};

// `iters` samples on `stream`: start event, enqueue(i), stop event, wait; each sample's time is
// divided by `per_sample` (the forwards enqueue(i) issues).
template <typename Enqueue>
Result<std::vector<double>> time_event_samples(cudaStream_t stream, int iters, int per_sample,
                                               Enqueue enqueue) {
  EventPair events;
  ATTNKIT_RETURN_IF_ERROR(events.create());
  std::vector<double> ms;
  ms.reserve(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    ATTNKIT_RETURN_IF_ERROR(cuda_check(cudaEventRecord(events.start(), stream), "cudaEventRecord"));
    ATTNKIT_RETURN_IF_ERROR(enqueue(i));
    ATTNKIT_RETURN_IF_ERROR(cuda_check(cudaEventRecord(events.stop(), stream), "cudaEventRecord"));
    ATTNKIT_RETURN_IF_ERROR(
        cuda_check(cudaEventSynchronize(events.stop()), "cudaEventSynchronize (timed sample)"));
    float elapsed = 0;
    ATTNKIT_RETURN_IF_ERROR(cuda_check(
        cudaEventElapsedTime(&elapsed, events.start(), events.stop()), "cudaEventElapsedTime"));
    ms.push_back(elapsed / per_sample);
  }
  return ms;
}
#endif

// One forward call on rotating copy `index % layers`: k/v empty, save_kv off (the pool holds
// every token), as harness::run_backend does.
Status forward_copy(AttentionBackend& backend, harness::PreparedCase& prepared, int index) {
  harness::LayerData& l = prepared.layers[static_cast<size_t>(index) % prepared.layers.size()];
  // A non-absorbed MLA layer reads its new tokens' k / v (never the pool).
  const bool mla_prefill =
      l.layer.is_mla && l.layer.qk_head_dim != l.layer.kv_lora_rank + l.layer.qk_rope_head_dim;
  return backend.forward(l.q, mla_prefill ? l.k : TensorView(), mla_prefill ? l.v : TensorView(),
                         l.out, l.layer, prepared.batch, /*save_kv=*/false, TensorView());
}

// Writes the new tokens' k/v into every copy's pool layer (what run_backend does before calling a
// backend with save_kv off), so that all keys the timed calls read are real values.
Status write_new_tokens(harness::PreparedCase& prepared) {
  for (const harness::LayerData& l : prepared.layers) {
    if (!l.save_kv_allowed || l.k.empty()) continue;
    ATTNKIT_RETURN_IF_ERROR(prepared.kv_pool->set_kv(l.layer.layer_id, prepared.batch.out_cache_loc,
                                                     l.k, l.v, l.layer.k_scale, l.layer.v_scale,
                                                     prepared.batch.stream));
  }
  return Status::ok();
}

// The p-quantile (0 <= p <= 1) of v by the nearest rank; v non-empty.
double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

// Fills the time, rates and ceiling ratio of `r` (whose bytes and flops are set) from `t`.
CaseResult finish_timing(CaseResult r, const Timing& t, const CeilingRates& ceilings) {
  r.ms_median = t.ms_median;
  r.ms_min = t.ms_min;
  r.ms_max = t.ms_max;
  if (!t.refresh_us.empty() && !t.refresh_idle_us.empty()) {
    r.refresh_samples = static_cast<int>(t.refresh_us.size());
    r.refresh_us_median = median(t.refresh_us);
    r.refresh_us_p90 = percentile(t.refresh_us, 0.9);
    r.refresh_us_max = *std::max_element(t.refresh_us.begin(), t.refresh_us.end());
    r.refresh_idle_us_median = median(t.refresh_idle_us);
  }
  r.gbs = gb_per_s(r.bytes, r.ms_median);
  r.tflops = tflop_per_s(r.flops, r.ms_median);
  r.memory_bound = is_memory_bound(r.bench_case, ceilings.copy_gbs, ceilings.compute_tflops);
  if (r.memory_bound) {
    r.ceiling = ceilings.copy_name;
    r.ceiling_ratio = ceilings.copy_gbs > 0 ? r.gbs / ceilings.copy_gbs : 0;
  } else {
    r.ceiling = ceilings.compute_name;
    r.ceiling_ratio = ceilings.compute_tflops > 0 ? r.tflops / ceilings.compute_tflops : 0;
  }
  return r;
}

Timing summarize(std::vector<double> ms) {
  Timing t;
  t.ms_median = median(ms);
  t.ms_min = *std::min_element(ms.begin(), ms.end());
  t.ms_max = *std::max_element(ms.begin(), ms.end());
  return t;
}

// Why a case's paired rounds run fewer calls than asked (calls > 0) or none (calls 0), from the
// timed median the cut was made by (paired_calls_per_round).
std::string paired_cut_note(double ms_median, const RunSettings& settings, int calls) {
  std::ostringstream why;
  why << settings.paired_rounds << " rounds at the timed median " << ms_median
      << " ms would take more than --paired-max-seconds " << settings.paired_max_seconds;
  if (calls == 0) return "skipped: one call per round over " + why.str();
  return std::to_string(calls) + " of " + std::to_string(settings.paired_calls) +
         " calls per round: " + std::to_string(settings.paired_calls) + " per round over " +
         why.str();
}

}  // namespace

const char* case_status_name(CaseStatus status) {
  switch (status) {
    case CaseStatus::kOk:
      return "ok";
    case CaseStatus::kSkipped:
      return "skipped";
    case CaseStatus::kFailed:
      return "failed";
    case CaseStatus::kMismatch:
      return "mismatch";
  }
  return "unknown";
}

Result<Timing> time_forward(AttentionBackend& backend, harness::PreparedCase& prepared, int warmup,
                            int iters, int launches) {
  if (launches < 1) {
    return Status::invalid_argument("time_forward: launches must be >= 1 (got " +
                                    std::to_string(launches) + ")");
  }
  if (prepared.layers.empty() || iters <= 0 || warmup < 0) {
    return Status::invalid_argument("time_forward: needs layers (got " +
                                    std::to_string(prepared.layers.size()) + "), iters > 0 (got " +
                                    std::to_string(iters) + ") and warmup >= 0 (got " +
                                    std::to_string(warmup) + ")");
  }
  ATTNKIT_RETURN_IF_ERROR(write_new_tokens(prepared));
  ATTNKIT_RETURN_IF_ERROR(backend.init_forward_metadata(prepared.batch));
  for (int i = 0; i < warmup; ++i) ATTNKIT_RETURN_IF_ERROR(forward_copy(backend, prepared, i));
  std::vector<double> ms;
  ms.reserve(static_cast<size_t>(iters));
#ifdef ATTNKIT_WITH_CUDA
  if (prepared.device.is_cuda()) {
    auto stream = static_cast<cudaStream_t>(prepared.batch.stream);
    ATTNKIT_RETURN_IF_ERROR(cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize"));
    Result<std::vector<double>> samples =
        time_event_samples(stream, iters, launches, [&](int i) -> Status {
          for (int j = 0; j < launches; ++j) {
            ATTNKIT_RETURN_IF_ERROR(forward_copy(backend, prepared, warmup + i * launches + j));
          }
          return Status::ok();
        });
    if (!samples) return samples.status();
    return summarize(std::move(*samples));
  }
#endif
  if (!prepared.device.is_cpu()) {
    return Status::not_built("time_forward: device " + prepared.device.to_string() +
                             " needs a CUDA build");
  }
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    ATTNKIT_RETURN_IF_ERROR(forward_copy(backend, prepared, warmup + i));
    const auto t1 = std::chrono::steady_clock::now();
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  return summarize(std::move(ms));
}

std::string graph_skip_reason(const BackendDescriptor& descriptor, const BenchCase& c,
                              Device device) {
  if (!device.is_cuda()) return "--graph times CUDA graphs: needs --device cuda";
  if (c.kind == BenchKind::kExtend) {
    return "--graph times decode and verify forwards only (serving engines capture those); this "
           "is an extend case";
  }
  if (!descriptor.cuda_graph) {
    return "--graph: backend " + descriptor.name + " has no CUDA-graph support";
  }
  return "";
}

#ifdef ATTNKIT_WITH_CUDA
namespace {

// The refresh a serving engine runs before every replay: the backend's host plan from the lengths.
Status refresh_replay(AttentionBackend& backend, const ForwardBatch& b, ForwardMode mode,
                      const SpecInfo* spec) {
  return backend.init_forward_metadata_replay_cuda_graph(b.batch_size, b.req_pool_indices,
                                                         b.seq_lens, b.seq_lens_sum, TensorView(),
                                                         mode, spec, b.seq_lens_host.data());
}

// The replay metadata refresh's host time (init_forward_metadata_replay_cuda_graph), `count`
// samples in each of two patterns, each refresh followed by one replay of g:
// - overlapped, as a serving engine that runs one step ahead of the GPU pays it (SGLang's
//   overlap scheduler): refresh i is issued while replay i - 1 runs, once replay i - 2 finished.
//   Never with the host further ahead: a backend's refresh may wait for the upload of the plan
//   before it (one staging buffer), so a host many replays ahead would time the GPU;
// - idle: the stream drained before each refresh (the host cost alone).
// Not inside event-timed replays: the plan upload would count as GPU time.
Status time_replay_refreshes(AttentionBackend& backend, const ForwardBatch& b, ForwardMode mode,
                             const SpecInfo* spec, GraphResources& g, int count, Timing* timing) {
  EventPair replay_done;  // start(): replays 0, 2, 4 ...; stop(): 1, 3, 5 ...
  ATTNKIT_RETURN_IF_ERROR(replay_done.create());
  auto done_event = [&](int i) { return i % 2 == 0 ? replay_done.start() : replay_done.stop(); };
  auto refresh_us = [&](std::vector<double>* out) -> Status {
    const auto t0 = std::chrono::steady_clock::now();
    ATTNKIT_RETURN_IF_ERROR(refresh_replay(backend, b, mode, spec));
    const auto t1 = std::chrono::steady_clock::now();
    out->push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    return Status::ok();
  };
  timing->refresh_us.reserve(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    if (i >= 2) {
      ATTNKIT_RETURN_IF_ERROR(cuda_check(cudaEventSynchronize(done_event(i - 2)),
                                         "cudaEventSynchronize (replay i - 2)"));
    }
    ATTNKIT_RETURN_IF_ERROR(refresh_us(&timing->refresh_us));
    ATTNKIT_RETURN_IF_ERROR(g.launch());
    ATTNKIT_RETURN_IF_ERROR(
        cuda_check(cudaEventRecord(done_event(i), g.stream()), "cudaEventRecord (replay done)"));
  }
  timing->refresh_idle_us.reserve(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    ATTNKIT_RETURN_IF_ERROR(
        cuda_check(cudaStreamSynchronize(g.stream()), "cudaStreamSynchronize (idle refresh)"));
    ATTNKIT_RETURN_IF_ERROR(refresh_us(&timing->refresh_idle_us));
    ATTNKIT_RETURN_IF_ERROR(g.launch());
  }
  return cuda_check(cudaStreamSynchronize(g.stream()), "cudaStreamSynchronize (graph refreshes)");
}

}  // namespace
#endif

Result<Timing> time_graph_replay(const BackendDescriptor& descriptor,
                                 harness::PreparedCase& prepared, int warmup, int iters,
                                 int forwards) {
  if (prepared.layers.empty() || iters <= 0 || warmup < 0 || forwards < 1) {
    return Status::invalid_argument(
        "time_graph_replay: needs layers (got " + std::to_string(prepared.layers.size()) +
        "), iters > 0 (got " + std::to_string(iters) + "), warmup >= 0 (got " +
        std::to_string(warmup) + ") and forwards >= 1 (got " + std::to_string(forwards) + ")");
  }
  const ForwardMode mode = prepared.batch.mode;
  if (mode != ForwardMode::kDecode && mode != ForwardMode::kTargetVerify) {
    return Status::invalid_argument(std::string("time_graph_replay: the case's forward mode is ") +
                                    forward_mode_name(mode) + "; graphs hold decode or verify");
  }
#ifdef ATTNKIT_WITH_CUDA
  if (!prepared.device.is_cuda()) {
    return Status::invalid_argument("time_graph_replay: device " + prepared.device.to_string() +
                                    " is not a CUDA device");
  }
  GraphResources g;
  ATTNKIT_RETURN_IF_ERROR(g.create_stream());
  prepared.batch.stream = g.stream();
  // The case outlives g's stream: point it back at the default stream on every way out.
  struct StreamReset {
    harness::PreparedCase& p;
    ~StreamReset() { p.batch.stream = nullptr; }
  } stream_reset{prepared};
  BackendContext ctx = prepared.context();
  ctx.stream = g.stream();
  Result<std::unique_ptr<AttentionBackend>> made = descriptor.create(ctx);
  if (!made) return made.status();
  AttentionBackend& backend = **made;
  ATTNKIT_RETURN_IF_ERROR(write_new_tokens(prepared));

  const ForwardBatch& b = prepared.batch;
  const SpecInfo* spec = mode == ForwardMode::kTargetVerify ? &b.spec : nullptr;
  ATTNKIT_RETURN_IF_ERROR(backend.init_cuda_graph_state(b.batch_size, b.num_tokens));
  ATTNKIT_RETURN_IF_ERROR(backend.init_forward_metadata_capture_cuda_graph(
      b.batch_size, b.num_tokens, b.req_pool_indices, b.seq_lens, TensorView(), mode, spec));
  ATTNKIT_RETURN_IF_ERROR(g.begin_capture());
  for (int i = 0; i < forwards; ++i) ATTNKIT_RETURN_IF_ERROR(forward_copy(backend, prepared, i));
  ATTNKIT_RETURN_IF_ERROR(g.end_capture_and_instantiate());
  ATTNKIT_RETURN_IF_ERROR(refresh_replay(backend, b, mode, spec));
  for (int i = 0; i < std::max(warmup, 1); ++i) ATTNKIT_RETURN_IF_ERROR(g.launch());
  ATTNKIT_RETURN_IF_ERROR(
      cuda_check(cudaStreamSynchronize(g.stream()), "cudaStreamSynchronize (graph warm-up)"));
  Result<std::vector<double>> samples =
      time_event_samples(g.stream(), iters, forwards, [&](int) { return g.launch(); });
  if (!samples) return samples.status();
  Timing timing = summarize(std::move(*samples));
  ATTNKIT_RETURN_IF_ERROR(
      time_replay_refreshes(backend, b, mode, spec, g, std::max(iters, 100), &timing));
  return timing;
#else
  (void)descriptor;
  return Status::not_built("time_graph_replay: --graph needs a CUDA build");
#endif
}

CaseResult run_case(const BackendDescriptor& descriptor, const BenchCase& c,
                    const RunSettings& settings, const DeviceInfo& device_info,
                    const CeilingRates& ceilings) {
  CaseResult r;
  r.backend = descriptor.name;
  r.bench_case = c;
  r.flops = attention_flops(c);
  r.bytes = attention_bytes(c);
  r.warmup = settings.warmup;
  r.iters = settings.iters;
  const harness::CaseSpec spec = to_case_spec(c);
  std::string reason = harness::skip_reason(descriptor, spec, device_info);
  if (reason.empty() && settings.graph) {
    reason = graph_skip_reason(descriptor, c, settings.device);
  }
  if (!reason.empty()) {
    r.status = CaseStatus::kSkipped;
    r.message = reason;
    return r;
  }
  auto fail = [&](const Status& s, const char* stage) {
    r.status = CaseStatus::kFailed;
    r.message = std::string(stage) + ": " + s.to_string();
    return r;
  };
  // A backend that refuses the case when it is created (a v_head_dim its kernels lack: rules the
  // descriptor does not list, which skip_reason cannot see) is skipped like one whose descriptor
  // says so, with its own message.
  auto refused_or_failed = [&](const Status& s, const char* stage) {
    if (s.code() != StatusCode::kUnsupported) return fail(s, stage);
    r.status = CaseStatus::kSkipped;
    r.message = s.message();
    return r;
  };

  if (settings.verify) {
    harness::PrepareOptions options;
    options.num_layers = 1;
    Result<harness::PreparedCase> prepared = harness::prepare_case(spec, settings.device, options);
    if (!prepared) return fail(prepared.status(), "verify prepare_case");
    auto backend = harness::create_backend_for_case(descriptor, *prepared);
    if (!backend) return refused_or_failed(backend.status(), "verify create backend");
    const Status run = harness::run_backend(**backend, *prepared, /*save_kv=*/false);
    if (!run.is_ok()) return fail(run, "verify run");
    Result<harness::Comparison> cmp = harness::compare_with_reference(*prepared);
    if (!cmp) return fail(cmp.status(), "verify compare");
    harness::apply_backend_arithmetic(**backend, &*cmp);  // fa3's FP8 kernel: fp8 bounds
    r.verified = true;
    r.rel_l2 = cmp->rel_l2;
    r.max_abs = cmp->max_abs;
    r.message = cmp->summary();
    if (!cmp->passed()) {
      r.status = CaseStatus::kMismatch;
      return r;
    }
  }

  harness::PrepareOptions options;
  options.num_layers =
      rotation_copies(c, static_cast<double>(settings.rotate_bytes), settings.max_copies);
  options.request_lse = false;
  options.poison = false;
  options.snapshot_pool = false;
  options.fast_inputs = true;
  r.copies = options.num_layers;
  Result<harness::PreparedCase> prepared = harness::prepare_case(spec, settings.device, options);
  if (!prepared) return fail(prepared.status(), "prepare_case");
  // The byte / FLOP formulas count kv_tokens_total(c) keys; the prepared case must hold exactly
  // those (a case spec that lost a case parameter, e.g. kv_lens, would time another problem).
  int64_t held = 0;
  for (const int32_t len : prepared->kv_lens) held += len;
  if (held != kv_tokens_total(c)) {
    return fail(
        Status::internal("the prepared case holds " + std::to_string(held) +
                         " KV tokens, the formulas count " + std::to_string(kv_tokens_total(c))),
        "bytes formula");
  }
  if (settings.graph) {
    // One pass over every rotating copy per replay, so that a replay never finds its inputs in L2.
    r.forwards_per_sample = std::max(settings.launches, options.num_layers);
    r.timing = "cuda graph";
    Result<Timing> timing = time_graph_replay(descriptor, *prepared, settings.warmup,
                                              settings.iters, r.forwards_per_sample);
    if (!timing) return fail(timing.status(), "graph timing");
    return finish_timing(r, *timing, ceilings);
  }
  r.forwards_per_sample = settings.launches;
  r.timing = settings.launches > 1 ? "eager back-to-back" : "eager";
  auto backend = harness::create_backend_for_case(descriptor, *prepared);
  if (!backend) return refused_or_failed(backend.status(), "create backend");
  Result<Timing> timing =
      time_forward(**backend, *prepared, settings.warmup, settings.iters, settings.launches);
  if (!timing) return fail(timing.status(), "timing");
  // Paired rounds (CPU): each round measures its ceiling, then times r.paired_calls forwards:
  // paired_calls, fewer where the rounds' calls would take more than paired_max_seconds at the
  // timed median, none (no rounds) where one call per round would (a reference backend's 2k
  // prefill takes seconds per call); r.paired_note says which.
  int index = settings.warmup + settings.iters;
  r.paired_calls = paired_calls_per_round(timing->ms_median, settings.paired_rounds,
                                          settings.paired_calls, settings.paired_max_seconds);
  auto round_ms = [&]() -> Result<double> {  // the median of one round's forwards
    std::vector<double> ms;
    for (int i = 0; i < r.paired_calls; ++i, ++index) {
      const auto t0 = std::chrono::steady_clock::now();
      ATTNKIT_RETURN_IF_ERROR(forward_copy(**backend, *prepared, index));
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    return median(ms);
  };
  // Copy rounds for the memory-bound kinds (decode: their targets are stated against the copy,
  // even where a slow vector peak makes the table judge one compute-bound), peak rounds for the
  // compute-bound one (extend, whose targets are stated against the compute peak, even where a
  // few new tokens per request make the table judge one memory-bound), never both.
  const bool memory_kind = is_memory_bound(c);
  const bool copy_rounds = settings.device.is_cpu() && memory_kind && settings.paired_rounds > 0 &&
                           settings.copy_probe != nullptr;
  const bool peak_rounds = settings.device.is_cpu() && settings.paired_rounds > 0 &&
                           !settings.paired_peak.empty() &&
                           settings.paired_peak == ceilings.compute_name && !memory_kind;
  if ((copy_rounds || peak_rounds) && r.paired_calls < settings.paired_calls) {
    r.paired_note = paired_cut_note(timing->ms_median, settings, r.paired_calls);
  }
  if (copy_rounds && r.paired_calls > 0) {
    for (int round = 0; round < settings.paired_rounds; ++round) {
      const double copy_gbs = settings.copy_probe->pass_gbs();
      const double read_gbs = settings.copy_probe->read_pass_gbs();
      Result<double> ms = round_ms();
      if (!ms) return fail(ms.status(), "paired timing");
      const double gbs = gb_per_s(r.bytes, *ms);
      r.paired_copy_gbs.push_back(copy_gbs);
      r.paired_gbs.push_back(gbs);
      r.paired_ratios.push_back(copy_gbs > 0 ? gbs / copy_gbs : 0);
      r.paired_read_gbs.push_back(read_gbs);
      r.paired_read_ratios.push_back(read_gbs > 0 ? gbs / read_gbs : 0);
    }
    r.paired_ratio_median = median(r.paired_ratios);
    r.paired_read_ratio_median = median(r.paired_read_ratios);
  }
  // Compute-bound cases against passes of the compute ceiling they are judged by (the AMX peak
  // moves 2x between seconds on a shared Xeon host: docs/perf/amx_notes.md "Session 35").
  if (peak_rounds && r.paired_calls > 0) {
    for (int round = 0; round < settings.paired_rounds; ++round) {
      Result<double> peak = cpu_peak_pass_tflops(settings.paired_peak, kPairedPeakReps);
      if (!peak) {  // the rounds end; the case's timing stands (a failed ceiling only warns)
        r.message = "paired peak rounds stopped: " + peak.status().to_string();
        break;
      }
      Result<double> ms = round_ms();
      if (!ms) return fail(ms.status(), "paired timing");
      const double tflops = tflop_per_s(r.flops, *ms);
      r.paired_peak_tflops.push_back(*peak);
      r.paired_tflops.push_back(tflops);
      r.paired_peak_ratios.push_back(*peak > 0 ? tflops / *peak : 0);
    }
    r.paired_peak_ratio_median = median(r.paired_peak_ratios);
  }
  return finish_timing(r, *timing, ceilings);
}

}  // namespace attnkit::bench
