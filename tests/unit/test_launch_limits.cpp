// The host-side launch limits the CUDA backends check before their cache write (a refusal after
// set_kv would leave the new k / v stored for a forward that never ran): triton's tensor-core
// extend grid (triton_kernels.h) and flashinfer's prefill grid (flashinfer_kernels.h), both one
// block per tile in a one-dimensional grid of at most 2^31 - 1 blocks; and which tile of those
// kernels fits a device's opt-in shared memory per block (cuda/common/smem_fit.h).
#include <gtest/gtest.h>

#include <string>

#include "backends/flashinfer/kernels/flashinfer_kernels.h"
#include "backends/triton/kernels/triton_kernels.h"
#include "cuda/common/ring_shape.h"

namespace attnkit {
namespace {

TEST(LaunchLimits, TritonExtendTileRowsFollowTheHeadDim) {
  EXPECT_EQ(triton::mma_extend_block_m(64), 128);
  EXPECT_EQ(triton::mma_extend_block_m(128), 128);
  EXPECT_EQ(triton::mma_extend_block_m(256), 64);
}

TEST(LaunchLimits, TritonExtendGridAtTheLimit) {
  // review_s56's case: 16384 requests, the longest 131072 tokens (1024 tiles of 128 rows) and 128
  // q heads is exactly 2^31 blocks; one tile fewer fits.
  EXPECT_TRUE(triton::check_mma_extend_grid(16384, 131072 - 128, 128, 128).is_ok());
  const Status over = triton::check_mma_extend_grid(16384, 131072, 128, 128);
  ASSERT_FALSE(over.is_ok());
  EXPECT_EQ(over.code(), StatusCode::kInvalidArgument);
  const std::string msg = over.message();
  EXPECT_NE(msg.find("2147483648 blocks"), std::string::npos) << msg;
  EXPECT_NE(msg.find("16384 requests"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1024 query tiles of 128 rows"), std::string::npos) << msg;
  EXPECT_NE(msg.find("128 q heads"), std::string::npos) << msg;
  // d 256 tiles hold 64 rows: half the length reaches the same grid.
  EXPECT_FALSE(triton::check_mma_extend_grid(16384, 65536, 128, 256).is_ok());
  EXPECT_TRUE(triton::check_mma_extend_grid(16384, 65536 - 64, 128, 256).is_ok());
  // A partial tile counts as a tile.
  EXPECT_FALSE(triton::check_mma_extend_grid(16384, 131072 - 127, 128, 128).is_ok());
  // Ordinary batches and empty ones.
  EXPECT_TRUE(triton::check_mma_extend_grid(256, 32768, 64, 128).is_ok());
  EXPECT_TRUE(triton::check_mma_extend_grid(0, 0, 32, 128).is_ok());
}

TEST(LaunchLimits, FlashInferPrefillGridAtTheLimit) {
  EXPECT_TRUE(flashinfer::check_prefill_grid(0x7fffffff, 1).is_ok());
  EXPECT_TRUE(flashinfer::check_prefill_grid(268435455, 8).is_ok());  // 2^31 - 8
  const Status over = flashinfer::check_prefill_grid(268435456, 8);   // 2^31
  ASSERT_FALSE(over.is_ok());
  EXPECT_EQ(over.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(over.message().find("268435456 work items x 8 kv heads"), std::string::npos)
      << over.message();
}

// Opt-in shared memory per block (cudaDevAttrMaxSharedMemoryPerBlockOptin) of the tensor-core
// generations: H100 / H200, A100, sm_86 / sm_89.
constexpr int kSm90Optin = 227 * 1024;
constexpr int kSm80Optin = 163 * 1024;
constexpr int kSm86Optin = 99 * 1024;

// docs/review_s58.md measured the kernels' Traits on the host: the rule's bytes are theirs (the
// Traits static_assert the same), and the defaults past 99 KB are the ones it found.
TEST(SharedMemoryFit, FlashInferPrefillBytesAreTheKernels) {
  using flashinfer::prefill_smem_bytes;
  using flashinfer::prefill_tile;
  EXPECT_EQ(prefill_smem_bytes(64, false, prefill_tile(64, true)), 74496);
  EXPECT_EQ(prefill_smem_bytes(64, true, prefill_tile(64, false)), 62208);
  EXPECT_EQ(prefill_smem_bytes(80, false, prefill_tile(80, true)), 90880);
  EXPECT_EQ(prefill_smem_bytes(96, false, prefill_tile(96, true)), 66944);
  EXPECT_EQ(prefill_smem_bytes(128, false, prefill_tile(128, true)), 104960);
  EXPECT_EQ(prefill_smem_bytes(128, true, prefill_tile(128, false)), 77184);
  EXPECT_EQ(prefill_smem_bytes(256, false, prefill_tile(256, true)), 169344);
  EXPECT_EQ(prefill_smem_bytes(256, true, prefill_tile(256, false)), 150912);
}

TEST(SharedMemoryFit, FlashInferPrefillTilePerDevice) {
  using flashinfer::prefill_fit;
  using flashinfer::PrefillFit;
  for (const int d : {64, 80, 96, 128, 256}) {
    for (const bool quant : {false, true}) {
      SCOPED_TRACE("d " + std::to_string(d) + (quant ? " fp8" : " native"));
      // SM90 runs every default tile.
      EXPECT_EQ(prefill_fit(d, quant, kSm90Optin), PrefillFit::kDefault);
      // A compact tile is never larger than the default, and it is the default itself wherever
      // the default fits the smallest device.
      const flashinfer::PrefillTile def = flashinfer::prefill_tile(d, !quant);
      const flashinfer::PrefillTile small = flashinfer::prefill_tile_compact(d, !quant);
      EXPECT_LE(flashinfer::prefill_smem_bytes(d, quant, small),
                flashinfer::prefill_smem_bytes(d, quant, def));
      if (flashinfer::prefill_smem_bytes(d, quant, def) <= kSm86Optin) {
        EXPECT_EQ(small.tile_n, def.tile_n);
        EXPECT_EQ(small.sub_n, def.sub_n);
        EXPECT_EQ(small.stages, def.stages);
      }
    }
  }
  // An A100: d 256 bf16 takes two-stage 32-key tiles (135,424 bytes); the rest, fp8 d 256
  // (150,912) included, their default.
  EXPECT_EQ(prefill_fit(256, false, kSm80Optin), PrefillFit::kCompact);
  EXPECT_EQ(prefill_fit(256, true, kSm80Optin), PrefillFit::kDefault);
  EXPECT_EQ(flashinfer::prefill_smem_bytes(256, false, flashinfer::prefill_tile_compact(256, true)),
            135424);
  EXPECT_EQ(prefill_fit(128, false, kSm80Optin), PrefillFit::kDefault);
  // sm_86 / sm_89: d 128 bf16 takes three-stage 32-key tiles (87,424 bytes), d 256 has none (the
  // backend's portable path), d <= 96 and fp8 d 128 keep their default.
  EXPECT_EQ(prefill_fit(128, false, kSm86Optin), PrefillFit::kCompact);
  EXPECT_EQ(flashinfer::prefill_smem_bytes(128, false, flashinfer::prefill_tile_compact(128, true)),
            87424);
  EXPECT_EQ(prefill_fit(128, true, kSm86Optin), PrefillFit::kDefault);
  EXPECT_EQ(prefill_fit(256, false, kSm86Optin), PrefillFit::kNone);
  EXPECT_EQ(prefill_fit(256, true, kSm86Optin), PrefillFit::kNone);
  for (const int d : {64, 80, 96}) {
    EXPECT_EQ(prefill_fit(d, false, kSm86Optin), PrefillFit::kDefault) << d;
    EXPECT_EQ(prefill_fit(d, true, kSm86Optin), PrefillFit::kDefault) << d;
  }
}

// The ring decode CTA (flashinfer's decode, triton's 2 x 4-warp shape): docs/review_s58.md's
// column, and the compact CTA where the default does not fit 99 KB (ring::Traits static_asserts
// both sizes).
TEST(SharedMemoryFit, RingDecodeCtaPerDevice) {
  using cuda::ring::cta_smem_bytes;
  struct Row {
    int d;
    bool fp8;
    int bytes;          // the default CTA
    int compact_bytes;  // the compact one (the default's where that fits 99 KB)
  };
  const Row rows[] = {
      {64, false, 97024, 97024},   {64, true, 88320, 88320},   {80, false, 94976, 94976},
      {80, true, 105216, 92416},   {96, false, 111872, 84736}, {96, true, 107264, 92416},
      {128, false, 110336, 75008}, {128, true, 99072, 99072},  {256, false, 144640, 76544},
      {256, true, 79104, 79104},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE("d " + std::to_string(r.d) + (r.fp8 ? " fp8" : " bf16"));
    EXPECT_EQ(cta_smem_bytes(r.d, r.fp8), r.bytes);
    const bool fits = cuda::ring::default_cta_fits(r.d, r.fp8, kSm86Optin);
    EXPECT_EQ(fits, r.bytes <= kSm86Optin);
    const int compact = fits ? r.bytes
                             : cta_smem_bytes(r.d, r.fp8, cuda::ring::compact_warps(r.d),
                                              cuda::ring::kCompactCtaSmemBudget);
    EXPECT_EQ(compact, r.compact_bytes);
    EXPECT_LE(compact, kSm86Optin);
    EXPECT_TRUE(cuda::ring::default_cta_fits(r.d, r.fp8, kSm80Optin));
  }
  // d 128 bf16: three stages per warp by default, two in the compact CTA.
  EXPECT_EQ(cuda::ring::cta_stages(128, false), 3);
  EXPECT_EQ(cuda::ring::cta_stages(128, false, 4, cuda::ring::kCompactCtaSmemBudget), 2);
}

TEST(SharedMemoryFit, TritonExtendTilePerDevice) {
  using triton::mma_extend_fits;
  using triton::mma_extend_smem_bytes;
  using triton::mma_extend_tile;
  using triton::mma_extend_tile_compact;
  // The kernel's bytes (MmaExtendKernel::smem_bytes static_asserts the rule): docs/review_s58.md.
  EXPECT_EQ(mma_extend_smem_bytes(64, mma_extend_tile(64, true)), 80256);
  EXPECT_EQ(mma_extend_smem_bytes(80, mma_extend_tile(80, true)), 96640);
  EXPECT_EQ(mma_extend_smem_bytes(96, mma_extend_tile(96, true)), 69824);
  EXPECT_EQ(mma_extend_smem_bytes(128, mma_extend_tile(128, true)), 108800);
  EXPECT_EQ(mma_extend_smem_bytes(128, mma_extend_tile(128, false)), 90304);
  EXPECT_EQ(mma_extend_smem_bytes(256, mma_extend_tile(256, true)), 103552);
  // sm_86 / sm_89: d 128 with KV of the q dtype takes the compact tile (that of fp8 KV), d 256
  // three stages of 16-key tiles.
  EXPECT_EQ(mma_extend_smem_bytes(128, mma_extend_tile_compact(128, true)), 90304);
  EXPECT_EQ(mma_extend_smem_bytes(256, mma_extend_tile_compact(256, true)), 86112);
  EXPECT_EQ(mma_extend_tile_compact(256, false).block_n, 16);
  for (const int d : {64, 80, 96, 128, 256}) {
    for (const bool native : {true, false}) {
      SCOPED_TRACE("d " + std::to_string(d) + (native ? " native" : " quantised"));
      EXPECT_TRUE(mma_extend_fits(d, native, kSm90Optin));
      EXPECT_TRUE(mma_extend_fits(d, native, kSm80Optin));
      EXPECT_TRUE(mma_extend_fits(d, native, kSm86Optin));
      // The compact tile is the default wherever that fits 99 KB.
      const triton::MmaExtendKeyTile def = mma_extend_tile(d, native);
      if (mma_extend_smem_bytes(d, def) <= kSm86Optin) {
        EXPECT_EQ(mma_extend_tile_compact(d, native).block_n, def.block_n);
        EXPECT_EQ(mma_extend_tile_compact(d, native).stages, def.stages);
      }
    }
  }
}

}  // namespace
}  // namespace attnkit
