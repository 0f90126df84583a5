// The ring decode's CTA shape (ring_decode.cuh) in plain C++, for the host planners and the unit
// tests: warps, keys, rows, the shared-memory budget and what a CTA of a head dim and KV width
// takes (ring::Traits computes the same and static_asserts it).
#pragma once

namespace attnkit::cuda::ring {

inline constexpr int kWarps = 4;
inline constexpr int kKeys = 16;                  // keys of one warp tile (one PV k-step)
inline constexpr int kTileKeys = kWarps * kKeys;  // keys of one round of the CTA's warps
inline constexpr int kRows = 16;                  // packed q rows of a CTA (of one M tile)
// A CTA may pack m_tiles x kRows rows (each warp runs every M tile over its keys: the K / V
// fragments of a tile feed m_tiles MMAs); Q then stays in shared memory.
inline constexpr int kMaxMTiles = 2;
// Shared memory of one CTA: 2 fit in the 228 KB of an SM90 multiprocessor (an SM80 one, 164 KB,
// holds one).
inline constexpr int kCtaSmemBudget = 110 * 1024;
inline constexpr int kCtasPerSm = 2;
inline constexpr int kMaxStages = 8;
// The compact CTA, for devices whose blocks may not opt in to the default's shared memory
// (smem_fit.h; sm_86 / sm_89: 99 KB, where the default d 128 bf16 CTA takes 110 KB): a 96 KB
// budget, one CTA per SM, 2 warps at head dims > 128 (four warps' two-stage d 256 rings need
// 145 KB). The same kernel with fewer stages or warps in flight per SM.
inline constexpr int kCompactCtaSmemBudget = 96 * 1024;
inline constexpr int kCompactCtasPerSm = 1;
constexpr int compact_warps(int head_dim) { return head_dim > 128 ? 2 : kWarps; }

// Q of a CTA: m_tiles x kRows rows of 16-bit values padded by 8 elements.
constexpr int cta_q_bytes(int head_dim, int m_tiles = 1) {
  return m_tiles * kRows * (head_dim + 8) * 2;
}

// One ring stage of a warp: a 16-key K + V tile (16-bit rows padded by 16 bytes, raw fp8 rows
// too) and its two slot words per key.
constexpr int cta_stage_bytes(int head_dim, bool quant_kv) {
  return 2 * kKeys * (quant_kv ? head_dim + 16 : (head_dim + 8) * 2) + 2 * kKeys * 4;
}

// Ring stages per warp of a CTA: the budget left after Q, split over the warps; at least 2, at
// most kMaxStages.
constexpr int cta_stages(int head_dim, bool quant_kv, int warps = kWarps,
                         int budget = kCtaSmemBudget, int m_tiles = 1) {
  const int fit =
      (budget - cta_q_bytes(head_dim, m_tiles)) / warps / cta_stage_bytes(head_dim, quant_kv);
  return fit < 2 ? 2 : (fit > kMaxStages ? kMaxStages : fit);
}

// Dynamic shared memory of a CTA: Q, then the warps' rings, or the epilogue's f32 rows of every
// warp (their (m, d) too) where that is larger.
constexpr int cta_smem_bytes(int head_dim, bool quant_kv, int warps = kWarps,
                             int budget = kCtaSmemBudget, int m_tiles = 1) {
  const int main = warps * cta_stages(head_dim, quant_kv, warps, budget, m_tiles) *
                   cta_stage_bytes(head_dim, quant_kv);
  const int rows = m_tiles * kRows;
  const int epi = warps * rows * head_dim * 4 + 2 * warps * rows * 4;
  return cta_q_bytes(head_dim, m_tiles) + (main > epi ? main : epi);
}

// Whether the default CTA fits a device whose blocks may opt in to `optin` bytes (else the
// launchers run the compact CTA, which fits every tensor-core device: one CTA per SM).
constexpr bool default_cta_fits(int head_dim, bool quant_kv, int optin) {
  return cta_smem_bytes(head_dim, quant_kv) <= optin;
}

}  // namespace attnkit::cuda::ring
