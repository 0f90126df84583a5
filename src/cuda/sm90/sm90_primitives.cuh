// Hopper (sm_90a) building blocks written directly in inline PTX: mbarriers, cp.async into
// shared memory, proxy fences, wgmma fences / commit / wait, shared-memory matrix descriptors for
// the 128-byte swizzle, and setmaxnreg. Everything compiles to nothing outside sm_90a (the
// callers' kernels are guarded the same way), so the header can be included by any translation
// unit.
#pragma once

#include <cstdint>

namespace attnkit::sm90 {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarrier (CTA scope) ----

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the other threads (then __syncthreads()).
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// `count` arrivals at once.
__device__ __forceinline__ void mbar_arrive_cnt(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// Arrives and adds `bytes` to the barrier's expected transaction count (TMA completes them).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
// Blocks until the phase of parity `parity` has completed. A fresh barrier is in phase 0, so
// waiting with parity 1 returns at once (the producer's first pass over its empty barriers).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
}

// ---- cp.async (16 bytes, L2 only); src_bytes 0 zero-fills the destination ----

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
// Arrives on `bar` once all of this thread's earlier cp.asyncs have landed, without blocking;
// .noinc: that arrival is one of the barrier's expected arrivals (init count = copying threads).
__device__ __forceinline__ void cp_async_arrive_noinc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}
// stmatrix.x4: four 8 x 8 b16 matrices of the warp into shared memory; register i of every thread
// goes to matrix i (thread t holds row t / 4, columns 2 (t % 4), + 1), and thread t gives the
// 16-byte row address of row t % 8 of matrix t / 8.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

// Orders this thread's generic-proxy shared-memory writes (cp.async, st.shared) before later
// async-proxy reads (wgmma operands).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// One bulk copy (no tensor map) of `bytes` from global `src` into shared memory at `dst`,
// completing its transactions on `bar` (16-byte aligned, bytes a multiple of 16).
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

// TMA: one box of a 3D tensor map (its address in param / global space) into shared memory at
// `dst`, completing `bytes` of transactions on `bar`.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* tmap, int c0, int c1, int c2,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
      "%3, %4}], [%5];" ::"r"(dst),
      "l"(tmap), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

// TMA store: the box of a 3D tensor map at {c0, c1, c2} from shared memory at `src` (a bulk async
// group: commit with bulk_commit, wait with bulk_wait_read / bulk_wait). The writes to `src`
// before it must be fenced (fence_proxy_async) by every thread that made them.
__device__ __forceinline__ void tma_store_3d(const void* tmap, uint32_t src, int c0, int c1,
                                             int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(tmap),
      "r"(src), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
// This thread's bulk groups beyond the newest kPending have read their shared memory.
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}
// ... and completed (their global writes done).
template <int kPending>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(kPending) : "memory");
}

// TMA: one box of a 2D tensor map into shared memory at `dst`, completing its bytes on `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* tmap, int c0, int c1,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
      "%3}], [%4];" ::"r"(dst),
      "l"(tmap), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

// The same with an L2 cache policy (l2_evict_first_policy()).
__device__ __forceinline__ void tma_load_2d_hint(uint32_t dst, const void* tmap, int c0, int c1,
                                                 uint32_t bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
      "[%0], [%1, {%2, %3}], [%4], %5;" ::"r"(dst),
      "l"(tmap), "r"(c0), "r"(c1), "r"(bar), "l"(policy)
      : "memory");
}
// An L2 policy marking every line it covers evict-first (data read once per CTA pair).
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// ---- wgmma synchronisation ----

__device__ __forceinline__ void wgmma_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
#endif
}
// Pins accumulator registers in program order around asynchronous wgmma (the compiler sees the
// wgmma asm as defining them at issue; this keeps reads after the wait and writes before issue).
template <int kN>
__device__ __forceinline__ void fence_regs(float (&r)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// ---- shared-memory matrix descriptors, 128-byte swizzle ----
//
// Tiles live in shared memory as [cols / 64][rows][64] 16-bit elements: each row of a 64-column
// block is one 128-byte line whose 16-byte chunks are XOR-permuted by (row % 8), and every block
// starts on a 1024-byte boundary (the swizzle atom: 8 lines of 128 bytes). swizzle_offset() is the
// byte offset of (row, 16-byte chunk `chunk`) for a tile of `rows` rows.
__host__ __device__ constexpr uint32_t swizzle_offset(int rows, int row, int chunk) {
  return static_cast<uint32_t>((chunk / 8) * rows * 128 + row * 128 +
                               (((chunk % 8) ^ (row % 8)) << 4));
}

constexpr uint64_t kSwizzle128B = 1ull << 62;
__device__ __forceinline__ uint64_t make_desc(uint32_t addr, uint32_t lbo_bytes,
                                              uint32_t sbo_bytes) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((lbo_bytes & 0x3FFFF) >> 4) << 16) |
         (static_cast<uint64_t>((sbo_bytes & 0x3FFFF) >> 4) << 32) | kSwizzle128B;
}
// The descriptor of the tile `bytes` further on (same LBO / SBO / swizzle): the 14-bit address
// field of a shared-memory address (< 256 KB) cannot carry into the other fields.
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) {
  const uint32_t lo = static_cast<uint32_t>(desc) + (bytes >> 4);
  return (desc & 0xFFFFFFFF00000000ull) | lo;
}
// K-major operand (A = Q rows, B = K rows; 16 contiguous k-elements per wgmma): the k-step kk of
// a tile with `rows` rows starts in 64-column block kk / 4, 32 bytes per step within the line.
// LBO is unused for swizzled K-major layouts (encoded 1); SBO = 1024: the next 8-row group.
__device__ __forceinline__ uint64_t desc_k_major(uint32_t tile, int rows, int kk) {
  return make_desc(tile + (kk / 4) * rows * 128 + (kk % 4) * 32, 16, 1024);
}
// MN-major B operand (V rows [key][d], B = V with N = d contiguous, transposed in the wgmma):
// k-step kk covers keys 16kk .. 16kk + 15 (16 lines); LBO = the next 64-column block of N,
// SBO = 1024: the next 8 keys.
__device__ __forceinline__ uint64_t desc_mn_major(uint32_t tile, int rows, int kk) {
  return make_desc(tile + kk * 16 * 128, static_cast<uint32_t>(rows) * 128, 1024);
}

// ---- register reallocation between warpgroups ----
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
#endif
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
#endif
}

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// tanh by one MUFU op (tanh.approx.f32, sm_75+: relative error below 2^-10.9, NaN stays NaN,
// +-1 at +-inf). FlashAttention-3's soft-cap uses it too.
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace attnkit::sm90
