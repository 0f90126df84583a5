#include "support/gpu_test_helpers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "attnkit/device.h"
#include "attnkit/dtype.h"
#include "attnkit/tensor.h"
#include "backend/small_extend.h"
#include "core/env_knob.h"
#include "support/scoped_env.h"

#ifdef ATTNKIT_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace attnkit::test_support {

bool expects_sm90_wgmma_prefill(const harness::CaseSpec& s, int compute_capability) {
  const bool mode_ok = s.mode == ForwardMode::kExtend || s.mode == ForwardMode::kMixed ||
                       s.mode == ForwardMode::kDraftExtend;
  const bool dtype_ok =
      (s.q_dtype == DType::kBF16 || s.q_dtype == DType::kF16) && s.kv_dtype == s.q_dtype;
  const bool dim_ok =
      (s.head_dim == 64 || s.head_dim == 128 || s.head_dim == 256) && s.head_dim == s.v_head_dim;
  return compute_capability == 90 && mode_ok && dtype_ok && dim_ok && !s.mla &&
         !s.cross_attention && !expects_small_extend(s);
}

bool expects_extend_decode_tiles(const harness::CaseSpec& s) {
  if (s.mla) return false;
  const int group = s.num_q_heads / std::max(1, s.num_kv_heads);
  return detail::extend_decode_q_len(s.mode, s.new_lens, s.cross_attention, group,
                                     detail::extend_decode_rows_from_env()) > 0;
}

bool expects_small_extend(const harness::CaseSpec& s) {
  if (s.mla || s.cross_attention) return false;
  const int group = s.num_q_heads / std::max(1, s.num_kv_heads);
  return detail::few_new_tokens_per_request(s.mode, s.new_lens, s.cross_attention, group,
                                            detail::extend_decode_rows_from_env(),
                                            detail::wgmma_min_q_len_from_env());
}

std::vector<uint8_t> expected_extend_partition(const harness::CaseSpec& s, int compute_capability) {
  if (s.fp8_q || !expects_sm90_wgmma_prefill(s, compute_capability) ||
      !detail::extend_partition_from_env()) {
    return {};
  }
  const int group = s.num_q_heads / std::max(1, s.num_kv_heads);
  return detail::extend_partition(s.mode, s.new_lens, s.cross_attention, group,
                                  detail::extend_decode_rows_from_env(),
                                  detail::wgmma_min_q_len_from_env());
}

std::vector<uint8_t> expected_extend_partition(const harness::CaseSpec& s) {
  const Result<DeviceInfo> dev = detect_cuda(0);
  return dev.is_ok() ? expected_extend_partition(s, dev->compute_capability)
                     : std::vector<uint8_t>{};
}

std::string partition_test_skip(const harness::CaseSpec& base, const std::vector<uint8_t>& want) {
  if (!expects_sm90_wgmma_prefill(base)) {
    return "no SM90 wgmma kernel here: mixed forwards run whole on one kernel";
  }
  const std::vector<uint8_t> flags = expected_extend_partition(base);
  if (flags.empty()) {
    return "this environment's bounds (ATTNKIT_EXTEND_DECODE_ROWS, ATTNKIT_FA3_MIN_Q_LEN, "
           "ATTNKIT_EXTEND_PARTITION) split no forward";
  }
  if (std::getenv("ATTNKIT_EXTEND_DECODE_ROWS") == nullptr &&
      std::getenv("ATTNKIT_FA3_MIN_Q_LEN") == nullptr) {
    EXPECT_EQ(flags, want) << base.name;
  }
  return "";
}

#ifdef ATTNKIT_WITH_CUDA
void expect_partition_stream_order(const harness::CaseSpec& spec, const BackendFactory& make,
                                   const char* reserve,
                                   const std::function<void(AttentionBackend&)>& overlapped) {
  ScopedEnv forced("ATTNKIT_PARTITION_RESERVE", reserve);
  Result<harness::PreparedCase> pc = harness::prepare_case(spec, Device::cuda(0));
  ASSERT_TRUE(pc.is_ok()) << pc.status().to_string();
  Result<std::unique_ptr<AttentionBackend>> backend = make(pc->context());
  ASSERT_TRUE(backend.is_ok()) << backend.status().to_string();
  const auto stream = static_cast<cudaStream_t>(pc->batch.stream);
  // Each layer's out and LSE: NaN-poisoned before its forward, copied right after it.
  struct Copy {
    std::string what;
    const TensorView* result;
    Buffer copy;
  };
  std::vector<Copy> copies;
  ASSERT_TRUE((*backend)->init_forward_metadata(pc->batch).is_ok());
  for (size_t i = 0; i < pc->layers.size(); ++i) {
    harness::LayerData& ld = pc->layers[i];
    std::vector<std::pair<const TensorView*, const char*>> results = {{&ld.out, "out"}};
    if (ld.lse.defined()) results.emplace_back(&ld.lse, "the LSE");
    for (const auto& [t, name] : results) {
      ASSERT_EQ(cudaMemsetAsync(t->data, 0xff, static_cast<size_t>(t->storage_bytes()), stream),
                cudaSuccess);
    }
    const Status s = (*backend)->forward(ld.q, ld.save_kv_allowed ? ld.k : TensorView(),
                                         ld.save_kv_allowed ? ld.v : TensorView(), ld.out, ld.layer,
                                         pc->batch, ld.save_kv_allowed, ld.lse);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    for (const auto& [t, name] : results) {
      Result<Buffer> copy = Buffer::allocate(Device::cuda(0), t->storage_bytes());
      ASSERT_TRUE(copy.is_ok()) << copy.status().to_string();
      ASSERT_EQ(cudaMemcpyAsync(copy->data(), t->data, static_cast<size_t>(t->storage_bytes()),
                                cudaMemcpyDeviceToDevice, stream),
                cudaSuccess);
      copies.push_back({"layer " + std::to_string(i) + ": " + name, t, std::move(copy).value()});
    }
  }
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (const Copy& c : copies) {
    std::vector<uint8_t> copied(static_cast<size_t>(c.result->storage_bytes()));
    ASSERT_TRUE(copy_bytes(copied.data(), Device::cpu(), c.copy.data(), Device::cuda(0),
                           c.result->storage_bytes())
                    .is_ok());
    EXPECT_TRUE(to_host_bytes(*c.result) == copied)
        << c.what << " copied right after the forward differs from its final value";
  }
  overlapped(**backend);
}
#else
void expect_partition_stream_order(const harness::CaseSpec&, const BackendFactory&, const char*,
                                   const std::function<void(AttentionBackend&)>&) {
  GTEST_SKIP() << "built without CUDA";
}
#endif  // ATTNKIT_WITH_CUDA

std::vector<PartitionVariant> partition_variants(const harness::CaseSpec& base) {
  std::vector<PartitionVariant> out;
  harness::CaseSpec v = base;
  v.name = "part_window_sinks";
  v.sliding_window = 300;
  v.sinks = true;
  out.push_back({v, false});
  v.name = "part_softcap_page1";
  v.sliding_window = -1;
  v.sinks = false;
  v.logit_cap = 5.f;
  v.page_size = 1;
  out.push_back({v, true});
  const auto lengths = [&base](std::string name, std::vector<int> prefix, std::vector<int> fresh) {
    harness::CaseSpec c = base;
    c.name = std::move(name);
    c.prefix_lens = std::move(prefix);
    c.new_lens = std::move(fresh);
    return c;
  };
  harness::CaseSpec enc = lengths("part_encoder", {0, 0, 0}, {3, 40, 1});
  enc.mode = ForwardMode::kExtend;
  enc.type = AttentionType::kEncoderOnly;
  out.push_back({enc, true});
  for (int d : {64, 256}) {
    harness::CaseSpec c = lengths("part_d" + std::to_string(d), {1200, 0, 77}, {1, 90, 8});
    c.head_dim = c.v_head_dim = d;
    out.push_back({c, true});
  }
  return out;
}

bool has_cuda() {
#ifdef ATTNKIT_WITH_CUDA
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
#else
  return false;
#endif
}

std::vector<uint8_t> to_host_bytes(const TensorView& t) {
  std::vector<uint8_t> h(static_cast<size_t>(t.storage_bytes()));
  EXPECT_TRUE(copy_bytes(h.data(), Device::cpu(), t.data, t.device, t.storage_bytes()).is_ok());
  return h;
}

Buffer upload_bytes(const void* src, int64_t bytes) {
  Result<Buffer> b = Buffer::allocate(Device::cuda(0), std::max<int64_t>(bytes, 1));
  EXPECT_TRUE(b.is_ok());
  EXPECT_TRUE(copy_bytes(b->data(), Device::cuda(0), src, Device::cpu(), bytes).is_ok());
  return std::move(b).value();
}

bool expects_sm90_wgmma_prefill(const harness::CaseSpec& s) {
  const Result<DeviceInfo> dev = detect_cuda(0);
  return dev.is_ok() && expects_sm90_wgmma_prefill(s, dev->compute_capability);
}

bool expects_sm90_mla_prefill(const harness::CaseSpec& s) {
  const Result<DeviceInfo> dev = detect_cuda(0);
  return dev.is_ok() && dev->compute_capability == 90 && s.mla_prefill() && s.head_dim == 192 &&
         s.v_head_dim == 128 && s.mla_prefix_chunk == 0 &&
         (s.mode == ForwardMode::kExtend || s.mode == ForwardMode::kDraftExtend) &&
         (s.q_dtype == DType::kBF16 || s.q_dtype == DType::kF16) && s.sliding_window < 0 &&
         s.logit_cap == 0.f && !s.sinks && !s.cross_attention && s.type == AttentionType::kDecoder;
}

int64_t flashinfer_verify_decode_rows() {
  // The backend's reading (flashinfer_backend.cpp): 0 .. 2^20, else the default 32.
  return env_int_range("ATTNKIT_FLASHINFER_VERIFY_DECODE_ROWS", 32, 0, 1 << 20);
}

int flashinfer_verify_tile_rows() {
  return env_int("ATTNKIT_FLASHINFER_VERIFY_TILE_ROWS", 32, {16, 32});
}

int flashinfer_verify_ctas_per_sm(bool rows32, int compute_capability) {
  const int knob = env_int_range("ATTNKIT_FLASHINFER_VERIFY_CTAS_PER_SM", 0, 0, 2);
  if (knob != 0) return knob;
  return rows32 && compute_capability / 10 == 9 ? 2 : 1;
}

KVPoolConfig small_bf16_mha_pool_config(int64_t size, Device device) {
  KVPoolConfig c;
  c.num_layers = 1;
  c.size = size;
  c.page_size = 16;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.v_head_dim = 64;
  c.dtype = DType::kBF16;
  c.device = device;
  return c;
}

void expect_layer_matches_reference(const harness::PreparedCase& pc, int layer) {
  Result<harness::ReferenceResult> ref = harness::reference_for_layer(pc, layer);
  ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
  const TensorView& out = pc.layers[static_cast<size_t>(layer)].out;
  ASSERT_TRUE(out.is_contiguous());
  ASSERT_EQ(static_cast<size_t>(out.numel()), ref->out.size());
  const std::vector<uint8_t> host = to_host_bytes(out);
  int64_t non_finite = 0;
  double err2 = 0.0, ref2 = 0.0;
  for (int64_t i = 0; i < out.numel(); ++i) {
    const double y = load_as_float(host.data(), out.dtype, i);
    const double x = ref->out[static_cast<size_t>(i)];
    if (!std::isfinite(y)) {
      ++non_finite;
      continue;
    }
    err2 += (y - x) * (y - x);
    ref2 += x * x;
  }
  EXPECT_EQ(non_finite, 0) << "layer " << layer
                           << ": non-finite outputs (unwritten, or NaN keys read)";
  const double rel = ref2 > 0.0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  EXPECT_LE(rel, harness::tolerance_for(pc.spec.q_dtype))
      << "layer " << layer << ": relative L2 against the fp64 reference";
}

#ifdef ATTNKIT_WITH_CUDA
namespace {

// Host bytes of every layer's out and lse.
std::vector<std::vector<uint8_t>> copy_layer_outputs(const harness::PreparedCase& pc) {
  std::vector<std::vector<uint8_t>> h;
  for (const harness::LayerData& ld : pc.layers) {
    for (const TensorView* t : {&ld.out, &ld.lse}) {
      std::vector<uint8_t> b(static_cast<size_t>(t->storage_bytes()));
      EXPECT_TRUE(
          copy_bytes(b.data(), Device::cpu(), t->data, t->device, t->storage_bytes()).is_ok());
      h.push_back(std::move(b));
    }
  }
  return h;
}

// Captures and replays on `stream`; the caller owns the stream.
void graph_replay_on(harness::PreparedCase& pc, const BackendFactory& make, ForwardMode mode,
                     int replays, const std::function<void(AttentionBackend&)>& after_replay,
                     cudaStream_t stream, int graph_max_bs,
                     cudaStreamCaptureMode capture_mode = cudaStreamCaptureModeThreadLocal) {
  BackendContext ctx = pc.context();
  ctx.stream = stream;
  pc.batch.stream = stream;
  Result<std::unique_ptr<AttentionBackend>> made = make(ctx);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  AttentionBackend& backend = **made;

  const Status eager_run = harness::run_backend(backend, pc, /*save_kv=*/false);
  ASSERT_TRUE(eager_run.is_ok()) << eager_run.to_string();
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const std::vector<std::vector<uint8_t>> eager = copy_layer_outputs(pc);
  Result<harness::Comparison> cmp = harness::compare_with_reference(pc);
  ASSERT_TRUE(cmp.is_ok()) << cmp.status().to_string();
  EXPECT_TRUE(cmp->passed()) << cmp->summary();
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  for (harness::LayerData& ld : pc.layers) {
    ASSERT_TRUE(fill_float(ld.out, kNaN).is_ok());
    ASSERT_TRUE(fill_float(ld.lse, kNaN).is_ok());
  }

  const int bs = pc.batch.batch_size;
  const SpecInfo* spec = mode == ForwardMode::kTargetVerify ? &pc.batch.spec : nullptr;
  const int max_bs = std::max(bs, graph_max_bs);
  const int max_tokens =
      static_cast<int>(static_cast<int64_t>(pc.batch.num_tokens) * max_bs / std::max(bs, 1));
  ASSERT_TRUE(backend.init_cuda_graph_state(max_bs, max_tokens).is_ok());
  const Status cap = backend.init_forward_metadata_capture_cuda_graph(
      bs, pc.batch.num_tokens, pc.batch.req_pool_indices, pc.batch.seq_lens, TensorView(), mode,
      spec);
  ASSERT_TRUE(cap.is_ok()) << cap.to_string();
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, capture_mode), cudaSuccess);
  for (harness::LayerData& ld : pc.layers) {
    const Status s = backend.forward(ld.q, TensorView(), TensorView(), ld.out, ld.layer, pc.batch,
                                     /*save_kv=*/false, ld.lse);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
  }
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  if (inst == cudaSuccess) {
    // Several replays: the later ones prove the refreshed plan does not depend on leftover state.
    for (int rep = 0; rep < replays; ++rep) {
      const Status replay = backend.init_forward_metadata_replay_cuda_graph(
          bs, pc.batch.req_pool_indices, pc.batch.seq_lens, pc.batch.seq_lens_sum, TensorView(),
          mode, spec, pc.batch.seq_lens_host.data());
      EXPECT_TRUE(replay.is_ok()) << replay.to_string();
      EXPECT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    }
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const std::vector<std::vector<uint8_t>> replayed = copy_layer_outputs(pc);
    for (size_t i = 0; i < eager.size() && i < replayed.size(); ++i) {
      EXPECT_TRUE(eager[i] == replayed[i])
          << "layer " << i / 2 << ": " << (i % 2 == 0 ? "out" : "lse") << " differs from eager";
    }
    if (after_replay) after_replay(backend);
    cudaGraphExecDestroy(exec);
  } else {
    ADD_FAILURE() << "cudaGraphInstantiate: " << cudaGetErrorString(inst);
  }
  cudaGraphDestroy(graph);
}

}  // namespace

void expect_graph_replay_matches_eager(harness::PreparedCase& pc, const BackendFactory& make,
                                       ForwardMode mode, int replays,
                                       const std::function<void(AttentionBackend&)>& after_replay,
                                       int graph_max_bs) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  graph_replay_on(pc, make, mode, replays, after_replay, stream, graph_max_bs);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaStreamDestroy(stream);
}

void expect_graph_replay_matches_eager_on(harness::PreparedCase& pc, const BackendFactory& make,
                                          ForwardMode mode, StreamHandle stream,
                                          bool global_capture, int replays) {
  graph_replay_on(pc, make, mode, replays, {}, static_cast<cudaStream_t>(stream), 0,
                  global_capture ? cudaStreamCaptureModeGlobal : cudaStreamCaptureModeThreadLocal);
}
#else
void expect_graph_replay_matches_eager(harness::PreparedCase&, const BackendFactory&, ForwardMode,
                                       int, const std::function<void(AttentionBackend&)>&, int) {
  GTEST_SKIP() << "built without CUDA";
}
void expect_graph_replay_matches_eager_on(harness::PreparedCase&, const BackendFactory&,
                                          ForwardMode, StreamHandle, bool, int) {
  GTEST_SKIP() << "built without CUDA";
}
#endif  // ATTNKIT_WITH_CUDA

}  // namespace attnkit::test_support
