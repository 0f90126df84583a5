// The host-side launch limits the CUDA backends check before their cache write (a refusal after
// set_kv would leave the new k / v stored for a forward that never ran): triton's tensor-core
// extend grid (triton_kernels.h) and flashinfer's prefill grid (flashinfer_kernels.h), both one
// block per tile in a one-dimensional grid of at most 2^31 - 1 blocks.
#include <gtest/gtest.h>

#include <string>

#include "backends/flashinfer/kernels/flashinfer_kernels.h"
#include "backends/triton/kernels/triton_kernels.h"

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

}  // namespace
}  // namespace attnkit
