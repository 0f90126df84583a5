// The device checks of core/device_scope.h that need no GPU: pools on another device than the
// backend's are refused by name (each pool, either may be null), and the CPU device is a no-op
// for the scope and the stream check. tests/gpu/test_multi_gpu.cpp covers them on two GPUs.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "attnkit/kv_cache.h"
#include "core/device_scope.h"

namespace attnkit {
namespace {

std::unique_ptr<MHAKVPool> cpu_pool() {
  KVPoolConfig c;
  c.num_layers = 1;
  c.page_size = 16;
  c.size = 4 * c.page_size;
  c.dtype = DType::kBF16;
  c.device = Device::cpu();
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.v_head_dim = 64;
  Result<std::unique_ptr<MHAKVPool>> made = MHAKVPool::create(c);
  EXPECT_TRUE(made.is_ok()) << made.status().to_string();
  return made.is_ok() ? std::move(made).value() : nullptr;
}

TEST(DeviceChecks, PoolsOfAnotherDeviceAreNamed) {
  std::unique_ptr<MHAKVPool> pool = cpu_pool();
  ASSERT_NE(pool, nullptr);
  Result<std::unique_ptr<ReqToTokenPool>> table = ReqToTokenPool::create(4, 64, Device::cpu());
  ASSERT_TRUE(table.is_ok()) << table.status().to_string();

  EXPECT_TRUE(check_pools_on_device("x", pool.get(), table.value().get(), Device::cpu()).is_ok());
  EXPECT_TRUE(check_pools_on_device("x", nullptr, nullptr, Device::cuda(1)).is_ok());

  Status st = check_pools_on_device("ForwardBatch", pool.get(), nullptr, Device::cuda(1));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("ForwardBatch: the KV pool is on cpu, the backend on cuda:1"),
            std::string::npos)
      << st.to_string();

  st = check_pools_on_device("BackendContext", nullptr, table.value().get(), Device::cuda(0));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(
      st.message().find("BackendContext: the req_to_token pool is on cpu, the backend on cuda:0"),
      std::string::npos)
      << st.to_string();
}

TEST(DeviceChecks, CpuDeviceIsANoOp) {
  const DeviceScope scope(Device::cpu());
  EXPECT_TRUE(scope.status().is_ok());
  int not_a_stream = 0;
  EXPECT_TRUE(check_stream_device(&not_a_stream, Device::cpu(), "stream").is_ok());
  EXPECT_TRUE(check_stream_device(nullptr, Device::cuda(0), "stream").is_ok());
}

}  // namespace
}  // namespace attnkit
