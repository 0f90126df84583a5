// Validation of KVPoolConfig, shared by the pools that allocate (kv_pool.cpp) and the pools that
// wrap caller memory (kv_pool_external.cpp), so both accept exactly the same configurations with
// the same messages.
#pragma once

#include "attnkit/kv_cache.h"

namespace attnkit::detail {

// Fields every MHA pool needs (layers, size vs page size, dtype, heads, head dims, fp4 groups).
Status validate_mha_pool_config(const KVPoolConfig& config);
// The same for MLA; returns the config normalised to one KV head, head_dim = kv_lora_rank +
// qk_rope_head_dim and v_head_dim = kv_lora_rank.
Result<KVPoolConfig> validate_mla_pool_config(const KVPoolConfig& config);

}  // namespace attnkit::detail
