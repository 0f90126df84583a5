// `attnkit run --case '<json>'`: a harness::CaseSpec written as JSON. Keys are the CaseSpec field
// names; absent keys keep CaseSpec's defaults, except v_head_dim, which defaults to head_dim (MHA,
// as in the case files) or kv_lora_rank (MLA absorbed). Example:
//   {"name": "my_decode", "mode": "decode", "page_size": 16, "prefix_lens": [1023, 4000],
//    "new_lens": [1, 1], "num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128,
//    "v_head_dim": 128, "kv_dtype": "fp8_e4m3"}
#pragma once

#include <string>

#include "attnkit/status.h"
#include "harness/case_runner.h"

namespace attnkit::bench {

// Errors name the key, the value and what is accepted.
Result<harness::CaseSpec> parse_case_spec_json(const std::string& text);

}  // namespace attnkit::bench
