// Session 63 probe: does compute-sanitizer's racecheck credit a named barrier that two warpgroups
// block on from two different instructions (template instances, as mla_decode_wgmma.cuh's
// publish_row_sums<g>)? Each of 2 warpgroups writes its row sums, both sync, both read both rows,
// for several segments; variant 0: one instruction (runtime g), 1: two instructions (template g,
// barrier.sync), 2: two instructions (template g, bar.sync = barrier.sync.aligned). Variants
// 3-5 are 0-2 in a block of 384 threads whose first warpgroup (the MLA kernel's producer) is not
// in barrier 3 and returns at once; variants 6-8 add the kernel's kBarM0 hand-over per segment
// (group 0 bar.arrive 1, group 1 bar.sync 1) to 3-5. Session 64 (H200): 0-5 reported 0 hazards,
// 6-8 4 hazards each (the l_sh write / read, which barrier 3 alone orders). Variant 9: the
// seesaw's running-max hand-over as the only order (group 0 writes m0, bar.arrive 1; group 1
// bar.sync 1, reads m0, writes m1, bar.arrive 2; group 0 bar.sync 2, reads m1; race-free). Variant
// 10: its positive control, group 1 reading m0 with no barrier (a real race). Session 65 (H200):
// variant 9 8 hazards (every write / read pair of both buffers), variant 10 4: racecheck does not
// credit an arrive -> sync hand-over as an order at all.
//   nvcc -arch=sm_90a -o /tmp/rc scripts/device/probes/racecheck_two_role_barrier.cu
//   compute-sanitizer --tool racecheck /tmp/rc <variant>
#include <cstdio>
#include <cstdlib>

template <int kAligned>
__device__ __forceinline__ void sync3() {
  if constexpr (kAligned) {
    asm volatile("bar.sync 3, 256;" ::: "memory");
  } else {
    asm volatile("barrier.sync 3, 256;" ::: "memory");
  }
}

__device__ float segment_runtime(float* l_sh, int g, int r, float v) {
  sync3<0>();
  l_sh[g * 128 + r] = v;
  sync3<0>();
  return l_sh[r] + l_sh[128 + r];
}

template <int g, int kAligned>
__device__ float segment_template(float* l_sh, int r, float v) {
  sync3<kAligned>();
  l_sh[g * 128 + r] = v;
  sync3<kAligned>();
  return l_sh[r] + l_sh[128 + r];
}

__global__ void probe(float* out, int variant, int segments) {
  __shared__ float l_sh[256];
  const int first = variant >= 3 ? 128 : 0;  // threads before the two groups (a producer)
  if (static_cast<int>(threadIdx.x) < first) return;
  const int t = threadIdx.x - first;
  const int g = t / 128, r = t % 128;
  const bool hand_over = variant >= 6;
  variant %= 3;
  float acc = 0.f;
  for (int s = 0; s < segments; ++s) {
    const float v = static_cast<float>(s * 256 + t);
    if (hand_over) {
      if (g == 0) {
        asm volatile("bar.arrive 1, 256;" ::: "memory");
      } else {
        asm volatile("bar.sync 1, 256;" ::: "memory");
      }
    }
    if (variant == 0) {
      acc += segment_runtime(l_sh, g, r, v);
    } else if (variant == 1) {
      acc += g == 0 ? segment_template<0, 0>(l_sh, r, v) : segment_template<1, 0>(l_sh, r, v);
    } else {
      acc += g == 0 ? segment_template<0, 1>(l_sh, r, v) : segment_template<1, 1>(l_sh, r, v);
    }
  }
  out[blockIdx.x * 256 + t] = acc;
}

// Variants 9 / 10 (see the top): 384 threads, the first warpgroup returns at once.
__global__ void handover(float* out, int variant, int segments) {
  __shared__ float m0_sh[128];
  __shared__ float m1_sh[128];
  if (threadIdx.x < 128) return;
  const int t = threadIdx.x - 128;
  const int g = t / 128, r = t % 128;
  const bool synced = variant == 9;
  float acc = 0.f;
  for (int s = 0; s < segments; ++s) {
    const float v = static_cast<float>(s * 256 + t);
    if (g == 0) {
      m0_sh[r] = v;
      if (synced) asm volatile("bar.arrive 1, 256;" ::: "memory");
      if (synced) asm volatile("bar.sync 2, 256;" ::: "memory");
      acc += synced ? m1_sh[r] : 0.f;
    } else {
      if (synced) asm volatile("bar.sync 1, 256;" ::: "memory");
      acc += m0_sh[r];
      m1_sh[r] = v + acc;
      if (synced) asm volatile("bar.arrive 2, 256;" ::: "memory");
    }
  }
  out[blockIdx.x * 256 + t] = acc;
}

int main(int argc, char** argv) {
  const int variant = argc > 1 ? std::atoi(argv[1]) : 0;
  float* out = nullptr;
  if (cudaMalloc(&out, 4 * 256 * sizeof(float)) != cudaSuccess) return 2;
  if (variant >= 9) {
    handover<<<4, 384>>>(out, variant, 8);
  } else {
    probe<<<4, variant >= 3 ? 384 : 256>>>(out, variant, 8);
  }
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("variant %d: %s\n", variant, cudaGetErrorString(e));
  cudaFree(out);
  return e == cudaSuccess ? 0 : 1;
}
