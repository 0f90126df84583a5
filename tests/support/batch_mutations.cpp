// See batch_mutations.h.
#include "support/batch_mutations.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "attnkit/backend.h"
#include "attnkit/kv_cache.h"
#include "attnkit/tensor.h"
#include "core/env_knob.h"
#include "support/backend_case_test.h"

namespace attnkit::test_support {
namespace {

using harness::PreparedCase;

// The pool's buffers, all layers: k / v of an MHA pool, the latent rows of an MLA pool (and their
// fp4 block scales).
std::vector<TensorView> pool_buffers(const PreparedCase& pc) {
  std::vector<TensorView> buffers;
  for (int l = 0; l < static_cast<int>(pc.layers.size()); ++l) {
    if (const auto* mha = dynamic_cast<const MHAKVPool*>(pc.kv_pool.get())) {
      for (const TensorView& b :
           {mha->k_buffer(l), mha->v_buffer(l), mha->k_scale_buffer(l), mha->v_scale_buffer(l)})
        if (b.defined()) buffers.push_back(b);
    } else if (const auto* mla = dynamic_cast<const MLAKVPool*>(pc.kv_pool.get())) {
      buffers.push_back(mla->kv_buffer(l));
      if (const TensorView scales = mla->scale_buffer(l); scales.defined())
        buffers.push_back(scales);
    }
  }
  EXPECT_FALSE(buffers.empty()) << "a pool the mutation test cannot snapshot";
  return buffers;
}

// Every byte of the pool's buffers.
std::vector<uint8_t> pool_bytes(const PreparedCase& pc) {
  std::vector<uint8_t> bytes;
  for (const TensorView& b : pool_buffers(pc)) {
    const size_t at = bytes.size();
    bytes.resize(at + static_cast<size_t>(b.storage_bytes()));
    EXPECT_TRUE(
        copy_bytes(bytes.data() + at, Device::cpu(), b.data, b.device, b.storage_bytes()).is_ok());
  }
  return bytes;
}

// Writes pool_bytes' output back into the pool.
void set_pool_bytes(PreparedCase& pc, const std::vector<uint8_t>& bytes) {
  size_t at = 0;
  for (const TensorView& b : pool_buffers(pc)) {
    EXPECT_TRUE(
        copy_bytes(b.data, b.device, bytes.data() + at, Device::cpu(), b.storage_bytes()).is_ok());
    at += static_cast<size_t>(b.storage_bytes());
  }
}

// Copies the batch's host arrays into their tensors (on the pool's device), so that a mutation
// reaches both, as an engine that builds both from one list would pass them.
void mirror_host_arrays(ForwardBatch& b) {
  const struct {
    TensorView* t;
    const std::vector<int32_t>* host;
  } arrays[] = {{&b.req_pool_indices, &b.req_pool_indices_host},
                {&b.seq_lens, &b.seq_lens_host},
                {&b.extend_prefix_lens, &b.extend_prefix_lens_host},
                {&b.extend_seq_lens, &b.extend_seq_lens_host},
                {&b.extend_start_loc, &b.extend_start_loc_host},
                {&b.encoder_lens, &b.encoder_lens_host}};
  if (b.spec.mask_indptr.defined() && b.spec.mask_indptr.dtype == DType::kI64 &&
      b.spec.mask_indptr.numel() == static_cast<int64_t>(b.spec.mask_indptr_host.size())) {
    EXPECT_TRUE(copy_bytes(b.spec.mask_indptr.data, b.spec.mask_indptr.device,
                           b.spec.mask_indptr_host.data(), Device::cpu(),
                           static_cast<int64_t>(b.spec.mask_indptr_host.size() * sizeof(int64_t)))
                    .is_ok());
  }
  for (const auto& a : arrays) {
    if (!a.t->defined() || a.t->dtype != DType::kI32) continue;
    if (a.t->numel() != static_cast<int64_t>(a.host->size())) continue;
    EXPECT_TRUE(copy_bytes(a.t->data, a.t->device, a.host->data(), Device::cpu(),
                           static_cast<int64_t>(a.host->size() * sizeof(int32_t)))
                    .is_ok());
  }
}

// One mutation of a prepared batch and how to take it back.
class Mutator {
 public:
  Mutator(PreparedCase& pc, uint32_t seed)
      : pc_(pc), rng_(seed), original_(pc.batch), original_layers_(pc.layers) {}

  // Applies a random mutation; returns what it did (for the failure message).
  std::string mutate(bool save_kv) {
    save_kv_ = save_kv;
    ForwardBatch& b = pc_.batch;
    const int bs = b.batch_size;
    const int r = pick(0, std::max(bs - 1, 0));
    const int32_t delta = pick_delta();
    switch (pick(0, 13)) {
      case 0:
        // With seq_lens_sum kept consistent a decode length +-1 passes validate() and moves the
        // new token's column off its out_cache_loc slot: only the CPU's validate() sees that.
        return bump(b.seq_lens_host, r, delta, "seq_lens_host",
                    /*fix_sum=*/pc_.device.is_cpu() && coin());
      case 1:
        return bump(b.extend_prefix_lens_host, r, delta, "extend_prefix_lens_host", false);
      case 2:
        return bump(b.extend_seq_lens_host, r, delta, "extend_seq_lens_host", false);
      case 3:
        return bump(b.extend_start_loc_host, r, delta, "extend_start_loc_host", false);
      case 4: {
        if (b.req_pool_indices_host.empty()) break;
        const int max_reqs = pc_.req_to_token->max_reqs();
        const int32_t other = b.req_pool_indices_host[static_cast<size_t>(pick(0, bs - 1))];
        const int32_t choices[] = {
            0, -1, max_reqs + 1, other, std::numeric_limits<int32_t>::max(), pick(1, max_reqs)};
        // A spare row (the last: all zeros, so slot 0 of the reserved page for every key) only
        // on the CPU, where validate() finds the new tokens' slots missing from it.
        const int32_t v = choices[pick(0, pc_.device.is_cpu() ? 5 : 4)];
        b.req_pool_indices_host[static_cast<size_t>(r)] = v;
        mirror_host_arrays(b);
        return "req_pool_indices_host[" + std::to_string(r) + "] = " + std::to_string(v);
      }
      case 5:
        b.num_tokens += pick(0, 1) != 0 ? 1 : -1;
        return "num_tokens = " + std::to_string(b.num_tokens);
      case 6:
        b.batch_size += pick(0, 1) != 0 ? 1 : -1;
        return "batch_size = " + std::to_string(b.batch_size);
      case 7:
        b.seq_lens_sum += delta;
        return "seq_lens_sum += " + std::to_string(delta);
      case 8: {
        // On CUDA only where the forward saves k / v (some layer may: not the MLA 192 / 128
        // prefill, nor cross-attention layers): otherwise the backends never read out_cache_loc
        // and only the reference (which validates its host copy) would refuse it.
        if (b.num_tokens <= 0 || !b.out_cache_loc.defined()) break;
        if (!pc_.device.is_cpu() && !(save_kv_ && some_layer_saves())) break;
        const int t = pick(0, b.num_tokens - 1);
        const int64_t rows = pc_.kv_pool->rows();
        const int64_t other = pc_.out_cache_loc[static_cast<size_t>(pick(0, b.num_tokens - 1))];
        const int64_t choices[] = {-1,          rows,
                                   rows + 4096, std::numeric_limits<int64_t>::max(),
                                   other,       pick(0, static_cast<int>(rows) - 1)};
        // Slots inside the pool but not the row's (the last two) only where validate() can see
        // them: on a CUDA pool out_cache_loc has no host copy, and the engine's contract (the
        // row holds the new tokens' slots) is not checked (ForwardBatch::out_cache_loc).
        const int64_t v = choices[pick(0, pc_.device.is_cpu() ? 5 : 3)];
        EXPECT_TRUE(copy_bytes(b.out_cache_loc.data_as<int64_t>() + t, b.out_cache_loc.device, &v,
                               Device::cpu(), sizeof(v))
                        .is_ok());
        loc_touched_ = true;
        return "out_cache_loc[" + std::to_string(t) + "] = " + std::to_string(v);
      }
      case 9: {
        // A req_to_token entry the request reads, rewritten through the table's API (which keeps
        // max_slot() current): out of the pool, the reserved page 0, or a slot another token holds.
        if (bs <= 0 || pc_.kv_lens.empty()) break;
        const int row = pc_.rows[static_cast<size_t>(r)];
        const int len = row_len(r);
        // On CUDA only the committed columns (encoder tokens and the cached prefix): a new
        // token's column that no longer holds its out_cache_loc slot is seen by the CPU's
        // validate() alone.
        const int committed = test_support::committed_columns(original_, r);
        if (!pc_.device.is_cpu() && committed <= 0) break;
        const int col = pick(0, pc_.device.is_cpu() ? len - 1 : committed - 1);
        const int64_t rows = pc_.kv_pool->rows();
        const int64_t choices[] = {rows, rows + 100000, std::numeric_limits<int32_t>::max(), -1, 0};
        // Slot 0 (the reserved page) only on the CPU, whose backends refuse or read it like the
        // reference. -1: a slot another token holds (below).
        const int64_t v = choices[pick(0, pc_.device.is_cpu() ? 4 : 3)];
        if (v == -1) return move_to_held_slots(r, len, committed, col);
        return write_table(row, col, std::vector<int64_t>{v});
      }
      case 10: {
        if (b.spec.mask_indptr_host.empty()) break;
        const size_t i =
            static_cast<size_t>(pick(0, static_cast<int>(b.spec.mask_indptr_host.size()) - 1));
        b.spec.mask_indptr_host[i] += delta;
        mirror_host_arrays(b);
        return "spec.mask_indptr_host[" + std::to_string(i) + "] += " + std::to_string(delta);
      }
      case 11: {
        const ForwardMode modes[] = {ForwardMode::kExtend, ForwardMode::kDecode,
                                     ForwardMode::kMixed, ForwardMode::kTargetVerify,
                                     ForwardMode::kDraftExtend};
        const ForwardMode m = modes[pick(0, 4)];
        if (m == b.mode) break;
        b.mode = m;
        return std::string("mode = ") + forward_mode_name(m);
      }
      case 12:
        return mutate_layer();
      case 13:
        return mutate_views();
      default:
        break;
    }
    // The chosen field is absent in this batch: grow a length instead (always refused or
    // caught).
    return bump(b.seq_lens_host, r, 1, "seq_lens_host", false);
  }

  // The last mutation made a view the backend must refuse whatever the batch.
  bool must_refuse() const { return must_refuse_; }
  // The last mutation changed the layers' k_scale or v_scale.
  bool scales_changed() const { return scales_changed_; }

  // Undoes every mutation made since the last restore.
  void restore() {
    must_refuse_ = false;
    scales_changed_ = false;
    pc_.batch = original_;
    pc_.layers = original_layers_;
    mirror_host_arrays(pc_.batch);
    if (loc_touched_) {
      EXPECT_TRUE(copy_bytes(pc_.batch.out_cache_loc.data, pc_.batch.out_cache_loc.device,
                             pc_.out_cache_loc.data(), Device::cpu(),
                             static_cast<int64_t>(pc_.out_cache_loc.size() * sizeof(int64_t)))
                      .is_ok());
      loc_touched_ = false;
    }
    for (auto it = table_edits_.rbegin(); it != table_edits_.rend(); ++it) {
      const int64_t v = it->old;
      ASSERT_TRUE(
          pc_.req_to_token->write(it->row, it->col, std::span<const int64_t>(&v, 1)).is_ok());
    }
    table_edits_.clear();
  }

 private:
  struct TableEdit {
    int row, col;
    int32_t old;
  };

  // One AttentionLayer field, the same on every layer (the reference reads the layers too):
  // invalid values, and valid edge values (a window of 0 or 1, a huge scale, a tiny cap, the
  // encoder-only mask) that must then match the reference.
  std::string mutate_layer() {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    const float floats[] = {0.f, -1.f, nan, inf, -inf, 1e-30f, 50.f, 3.f};
    const int ints[] = {
        -2, -1, 0, 1, 3, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()};
    const float f = floats[pick(0, 7)];
    const int i = ints[pick(0, 6)];
    const int d = i == 0 ? 1 : i;  // the deltas of the counts and the layer id
    // The fields in the order the draw numbers them: set to the drawn float, set to the drawn int,
    // moved by the drawn delta, or (none of them) the mask type flipped.
    struct Field {
      const char* name;
      float AttentionLayer::*set_float;
      int AttentionLayer::*set_int;
      int AttentionLayer::*add_int;
    };
    using L = AttentionLayer;
    static constexpr Field kFields[] = {{"scaling", &L::scaling, nullptr, nullptr},
                                        {"logit_cap", &L::logit_cap, nullptr, nullptr},
                                        {"sliding_window", nullptr, &L::sliding_window, nullptr},
                                        {"num_q_heads", nullptr, nullptr, &L::num_q_heads},
                                        {"num_kv_heads", nullptr, nullptr, &L::num_kv_heads},
                                        {"qk_head_dim", nullptr, nullptr, &L::qk_head_dim},
                                        {"v_head_dim", nullptr, nullptr, &L::v_head_dim},
                                        {"layer_id", nullptr, nullptr, &L::layer_id},
                                        {"k_scale", &L::k_scale, nullptr, nullptr},
                                        {"v_scale", &L::v_scale, nullptr, nullptr},
                                        {"q_scale", &L::q_scale, nullptr, nullptr},
                                        {"type", nullptr, nullptr, nullptr}};
    const Field& fd = kFields[pick(0, 11)];
    scales_changed_ = fd.set_float == &L::k_scale || fd.set_float == &L::v_scale;
    for (harness::LayerData& ld : pc_.layers) {
      AttentionLayer& l = ld.layer;
      if (fd.set_float != nullptr) {
        l.*fd.set_float = f;
      } else if (fd.set_int != nullptr) {
        l.*fd.set_int = i;
      } else if (fd.add_int != nullptr) {
        l.*fd.add_int = wrap_add(l.*fd.add_int, d);
      } else {
        l.type = l.type == AttentionType::kDecoder ? AttentionType::kEncoderOnly
                                                   : AttentionType::kDecoder;
      }
    }
    const std::string what =
        fd.set_float != nullptr ? std::string(fd.name) + " = " + std::to_string(f)
        : fd.set_int != nullptr ? std::string(fd.name) + " = " + std::to_string(i)
        : fd.add_int != nullptr ? std::string(fd.name) + " += " + std::to_string(d)
                                : std::string("type flipped");
    return "every layer's " + what;
  }

  // One tensor view of layer 0 made inconsistent with the batch or the context: a row more or
  // less, another dtype (wider or narrower elements), one head more. Always refused: a backend
  // that ran it would read or write past the tensor's memory.
  std::string mutate_views() {
    harness::LayerData& ld = pc_.layers[0];
    TensorView* views[] = {&ld.q, &ld.k, &ld.v, &ld.out, &ld.lse};
    const char* names[] = {"q", "k", "v", "out", "lse"};
    const int which = pick(0, 4);
    // k / v reach the backend only where it saves them (or reads them unsaved).
    if ((which == 1 || which == 2) && !(save_kv_ && ld.save_kv_allowed) && !pc_.spec.mla_prefill())
      return std::string(names[which]) + " (not passed)";
    TensorView& t = *views[which];
    if (!t.defined()) return std::string(names[which]) + " (absent)";
    if (t.ndim < 2) return std::string(names[which]) + " (1-D)";
    must_refuse_ = true;
    switch (pick(0, 2)) {
      case 0:
        t.shape[0] += pick(0, 1) != 0 ? 1 : -1;
        return std::string(names[which]) + " rows " + std::to_string(t.shape[0]);
      case 1:
        t.dtype = t.dtype == DType::kF32 ? DType::kF16 : DType::kF32;
        return std::string(names[which]) + " dtype " + dtype_name(t.dtype);
      default:
        t.shape[1] += 1;
        return std::string(names[which]) + " heads " + std::to_string(t.shape[1]);
    }
  }

  // Rewrites req_to_token[row, col..] with `slots` through the table's API, remembering the old
  // entries for restore(); returns the mutation's description (no change: says why).
  std::string write_table(int row, int col, const std::vector<int64_t>& slots) {
    const int n = static_cast<int>(slots.size());
    if (n == 0 || col < 0 || col + n > pc_.req_to_token->max_context_len())
      return "req_to_token columns [" + std::to_string(col) + ", +" + std::to_string(n) +
             ") (none to write)";
    const int32_t* host = pc_.req_to_token->host_row(row);
    std::vector<int32_t> old(host + col, host + col + n);
    if (!pc_.req_to_token->write(row, col, slots).is_ok()) return "req_to_token write refused";
    for (int i = 0; i < n; ++i) table_edits_.push_back({row, col + i, old[static_cast<size_t>(i)]});
    std::string what = "req_to_token[" + std::to_string(row) + ", " + std::to_string(col) + "]";
    if (n > 1) what += " .. [" + std::to_string(col + n - 1) + "]";
    what += " = " + std::to_string(slots[0]) + (n > 1 ? ".." : "") + " (was " +
            std::to_string(old[0]) + (n > 1 ? ".." : "") + ")";
    return what;
  }

  // Request r reads slots that other tokens hold. Page 1: column col of its row takes another
  // token's slot. Larger pages: the page holding col takes another page that is full of tokens
  // (all page_size columns, in order), since the engine's table keeps every page whole (slot t
  // at offset t % page_size, DESIGN.md) and natively paged backends read only the page's first
  // entry (req_to_token[r, ::page_size] / page_size); a page with a stray entry in it is a table
  // no engine writes, seen only with ATTNKIT_CHECK_INDICES=1. On CUDA only pages wholly before
  // the new tokens (committed columns), as for single entries. Encoder columns take encoder
  // tokens' slots and decoder columns decoder tokens' (a cross-attention layer's buffer holds
  // only the encoder tokens, a self-attention layer's only the decoder tokens: the others are
  // NaN-poisoned); a page holding both is left alone.
  std::string move_to_held_slots(int r, int len, int committed, int col) {
    const int bs = pc_.batch.batch_size;
    const int row = pc_.rows[static_cast<size_t>(r)];
    const int ps = pc_.kv_pool->page_size();
    const int r2 = pick(0, bs - 1);
    const int32_t* row2 = pc_.req_to_token->host_row(pc_.rows[static_cast<size_t>(r2)]);
    const int enc = encoder_len(r);
    const int enc2 = encoder_len(r2);
    // On CUDA the donor holds only r2's cached keys: a slot of r2's new tokens read as r's key is
    // refused by the CPU's validate() alone (CUDA pools check it with ATTNKIT_CHECK_INDICES=1), so
    // only the reference, validating its host copy, would see it.
    const int len2 =
        pc_.device.is_cpu() ? row_len(r2) : test_support::committed_columns(original_, r2);
    if (ps == 1) {
      // The donor column in the same part of r2's row (none: the mutation falls through).
      const int lo = col < enc ? 0 : enc2;
      const int hi = col < enc ? enc2 : len2;
      if (hi <= lo) return "a held slot (none here)";
      return write_table(row, col, std::vector<int64_t>{row2[pick(lo, hi - 1)]});
    }
    const int last = pc_.device.is_cpu() ? (len - 1) / ps : committed / ps - 1;
    if (last < 0) return "a held page (none here)";
    const int first_col = pick(0, last) * ps;
    const int n = std::min(ps, len - first_col);  // >= 1 (first_col < len); on CUDA ps
    EXPECT_GE(n, 1);
    const bool encoder_page = first_col + n <= enc;
    if (!encoder_page && first_col < enc) return "a page of encoder and decoder tokens (left)";
    // The donor: a full page of r2 in the same part of its row, pages [lo, hi).
    const int lo = encoder_page ? 0 : (enc2 + ps - 1) / ps;
    const int hi = encoder_page ? enc2 / ps : len2 / ps;
    if (hi <= lo) return "a held page (none here)";
    const int64_t donor = row2[pick(lo, hi - 1) * ps];
    std::vector<int64_t> slots(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) slots[static_cast<size_t>(i)] = donor + i;
    return write_table(row, first_col, slots);
  }

  // The columns of request r's row that hold keys: its encoder tokens, then kv_lens[r] (its
  // sequence; verify: with the drafts); at least 1.
  int row_len(int r) const {
    return std::max(1, encoder_len(r) + pc_.kv_lens[static_cast<size_t>(r)]);
  }
  int encoder_len(int r) const {
    const std::vector<int32_t>& e = original_.encoder_lens_host;
    return static_cast<size_t>(r) < e.size() ? e[static_cast<size_t>(r)] : 0;
  }

  // Whether some layer of the case saves k / v when the forward does (save_kv_allowed).
  bool some_layer_saves() const {
    return std::any_of(pc_.layers.begin(), pc_.layers.end(),
                       [](const harness::LayerData& ld) { return ld.save_kv_allowed; });
  }

  // a + b in two's complement, as an engine's int32 arithmetic would wrap (no UB here).
  static int wrap_add(int a, int b) {
    return static_cast<int>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
  }

  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool coin() { return pick(0, 1) != 0; }
  int32_t pick_delta() {
    const int32_t choices[] = {-1,
                               1,
                               -2,
                               7,
                               -100000,
                               100000,
                               std::numeric_limits<int32_t>::min(),
                               std::numeric_limits<int32_t>::max()};
    return choices[pick(0, 7)];
  }
  std::string bump(std::vector<int32_t>& host, int r, int32_t delta, const char* name,
                   bool fix_sum) {
    if (host.empty() || r >= static_cast<int>(host.size())) return std::string(name) + " (absent)";
    // Wrap like the engine's int32 arithmetic would, without signed overflow here.
    const int64_t v = static_cast<int64_t>(host[static_cast<size_t>(r)]) + delta;
    host[static_cast<size_t>(r)] = static_cast<int32_t>(static_cast<uint32_t>(v));
    if (fix_sum && &host == &pc_.batch.seq_lens_host) pc_.batch.seq_lens_sum += delta;
    mirror_host_arrays(pc_.batch);
    return std::string(name) + "[" + std::to_string(r) + "] += " + std::to_string(delta) +
           (fix_sum ? " (seq_lens_sum kept consistent)" : "");
  }

  PreparedCase& pc_;
  std::mt19937 rng_;
  const ForwardBatch original_;
  const std::vector<harness::LayerData> original_layers_;
  bool loc_touched_ = false;
  bool must_refuse_ = false;
  bool scales_changed_ = false;
  bool save_kv_ = false;
  std::vector<TableEdit> table_edits_;
};

// init_forward_metadata, then every layer. save_kv false: the backend gets no k / v and reads the
// new tokens' rows from the pool, which the first (unmutated) run of fuzz_case filled. (The
// harness's run_backend would write them itself first, through the mutated out_cache_loc.)
//
// A call that fails must leave every byte of the pool as it was before that call (the calls before
// it, for the layers that passed, may have written their new tokens: a layer_id shifted by one is
// a valid layer for all but the last); *pool_kept says whether it did.
Status run(AttentionBackend& backend, PreparedCase& pc, bool save_kv, bool* pool_kept) {
  *pool_kept = true;
  std::vector<uint8_t> before = pool_bytes(pc);
  const auto refused = [&](const Status& st) {
    // A refused call has not written the cache: no write is left in the device's slot guard
    // record either (else the next, valid, forward's check would report it). The refusal by the
    // guard itself (below) has already read and cleared the record.
    const Status pending = pc.kv_pool->check_device_errors(pc.batch.stream);
    EXPECT_TRUE(pending.is_ok()) << "the call was refused (" << st.to_string()
                                 << ") after a cache write the slot guard skipped: "
                                 << pending.to_string();
    *pool_kept = pool_bytes(pc) == before;
    return st;
  };
  if (Status st = backend.init_forward_metadata(pc.batch); !st.is_ok()) return refused(st);
  for (size_t l = 0; l < pc.layers.size(); ++l) {
    harness::LayerData& ld = pc.layers[l];
    const bool save = save_kv && ld.save_kv_allowed;
    const bool pass_kv = save || pc.spec.mla_prefill();
    const Status st =
        backend.forward(ld.q, pass_kv ? ld.k : TensorView(), pass_kv ? ld.v : TensorView(), ld.out,
                        ld.layer, pc.batch, save, ld.lse);
    if (!st.is_ok()) return refused(st);
    if (save && l + 1 < pc.layers.size())
      before = pool_bytes(pc);  // what the next call starts from
  }
  // CUDA pools: a save_kv write the device's slot guard skipped (an out_cache_loc entry outside
  // the pool) is reported here, as harness::run_backend does.
  if (Status st = pc.kv_pool->check_device_errors(pc.batch.stream); !st.is_ok()) return refused(st);
  return Status::ok();
}

// stale_new_rows: the layer's k / v scales were mutated, so the pool's new-token rows were stored
// under other scales (a forward that does not save them) or saturated the fp8 range (k_scale
// 1e-30 with save_kv): the comparison's check that they hold k / v at the layer's scales does not
// apply; the outputs are still compared with the reference over the pool as it is.
void expect_matches_reference(const AttentionBackend& backend, const PreparedCase& pc,
                              const std::string& what, bool stale_new_rows = false) {
  Result<harness::Comparison> c = harness::compare_with_reference(pc);
  ASSERT_TRUE(c.is_ok()) << what << ": " << c.status().to_string();
  harness::apply_backend_arithmetic(backend, &*c);  // fa3's FP8 kernel: the fp8 bounds
  if (stale_new_rows) c->pool_bad_new_values = 0;
  EXPECT_TRUE(c->passed()) << what << ": " << c->summary();
}

}  // namespace

void fuzz_batch_mutations(const BackendDescriptor& desc, const harness::CaseSpec& spec,
                          Device device, uint32_t seed, int trials, MutationOutcome* outcome) {
  Result<PreparedCase> prepared = harness::prepare_case(spec, device);
  ASSERT_TRUE(prepared.is_ok()) << prepared.status().to_string();
  PreparedCase& pc = *prepared;
  Result<std::unique_ptr<AttentionBackend>> made = harness::create_backend_for_case(desc, pc);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  AttentionBackend& backend = **made;
  {
    // The new tokens' k / v into the pool, and the case as it is passes.
    SCOPED_TRACE("the unmutated batch");
    const Status first = harness::run_backend(backend, pc, /*save_kv=*/true);
    ASSERT_TRUE(first.is_ok()) << first.to_string();
    expect_matches_reference(backend, pc, "unmutated");
  }
  // The pool with every new token written: put back after a mutated forward that wrote before a
  // later layer refused (valid calls, e.g. layer_id + 1, may write another layer's rows).
  const std::vector<uint8_t> good_pool = pool_bytes(pc);
  Mutator mutator(pc, seed);
  int refusals = 0;
  for (int trial = 0; trial < trials; ++trial) {
    const bool save_kv = trial % 2 == 0;
    const std::string what = mutator.mutate(save_kv);
    SCOPED_TRACE("trial " + std::to_string(trial) + " (seed " + std::to_string(seed) +
                 "): " + what + (save_kv ? ", save_kv" : ", reads the pool"));
    const Status valid = pc.batch.validate();
    bool pool_kept = true;
    const Status st = run(backend, pc, save_kv, &pool_kept);
    if (mutator.must_refuse()) {
      EXPECT_FALSE(st.is_ok()) << desc.name << " ran with a view that does not fit its memory";
    } else if (!valid.is_ok()) {
      ++outcome->refused_by_validate;
      EXPECT_FALSE(st.is_ok()) << desc.name
                               << " ran a batch validate() refuses: " << valid.to_string();
    } else if (st.is_ok()) {
      ++outcome->accepted_and_ran;
      expect_matches_reference(backend, pc, what, mutator.scales_changed());
    } else {
      ++outcome->accepted_but_refused;
    }
    if (!st.is_ok()) {
      EXPECT_FALSE(st.message().empty()) << st.to_string();
      EXPECT_TRUE(pool_kept) << "the refused call wrote the KV pool: " << st.to_string();
    }
    mutator.restore();
    if (::testing::Test::HasFatalFailure()) return;
    if (pool_bytes(pc) != good_pool) set_pool_bytes(pc, good_pool);
    if (!st.is_ok()) {
      // The backend that refused still serves the valid batch (compared with the reference after
      // every fourth refusal: the fp64 reference is most of the test's time).
      SCOPED_TRACE("the unmutated batch after the refusal");
      ASSERT_TRUE(pc.batch.validate().is_ok());
      bool kept = true;
      const Status again = run(backend, pc, /*save_kv=*/true, &kept);
      ASSERT_TRUE(again.is_ok()) << again.to_string();
      if (++refusals % 4 == 0) expect_matches_reference(backend, pc, "unmutated");
    }
  }
}

namespace {

constexpr const char* kCases[] = {
    "extend_page16_ragged", "extend_page1_gqa4", "mixed_page16", "draft_extend_page16",
    "decode_page16", "decode_page1", "decode_cross_attention", "extend_cross_attention",
    "extend_window8_page16", "decode_fp8_e4m3_kv", "verify_topk4_page16",
    // MLA (latent pools; appended, so the MHA cases keep their seeds).
    "mla_decode_page1", "mla_decode_page64", "mla_decode_page128", "mla_extend_fp8_e4m3_page64",
    "mla_verify_topk1_page64", "mla_draft_extend_page64", "mla_prefill_192_128",
    "mla_decode_fp8_e4m3_h128_page128"};

}  // namespace

int fuzz_batch_mutation_cases(const BackendDescriptor& desc, Device device, uint32_t first_seed,
                              int trials, const std::string& trace, MutationOutcome* outcome) {
  const DeviceInfo info = device_info_for(device);
  uint32_t seed = first_seed;
  int cases = 0;
  for (const char* name : kCases) {
    const harness::CaseSpec* spec = harness::find_case(name);
    EXPECT_NE(spec, nullptr) << name;
    if (spec == nullptr) return -1;
    ++seed;
    if (!harness::skip_reason(desc, *spec, info).empty()) continue;
    ++cases;
    SCOPED_TRACE(trace + " on " + name);
    fuzz_batch_mutations(desc, *spec, device, seed, trials, outcome);
    if (::testing::Test::HasFatalFailure()) return -1;
  }
  return cases;
}

int committed_columns(const ForwardBatch& b, int r) {
  const auto at = [r](const std::vector<int32_t>& v) {
    return static_cast<size_t>(r) < v.size() ? v[static_cast<size_t>(r)] : 0;
  };
  const int encoder = at(b.encoder_lens_host);
  switch (b.mode) {
    case ForwardMode::kDecode:
      return encoder + at(b.seq_lens_host) - 1;
    case ForwardMode::kTargetVerify:
      return encoder + at(b.seq_lens_host);
    default:
      return encoder + at(b.extend_prefix_lens_host);
  }
}

int mutation_trials(int trials) {
  return env_int_range("ATTNKIT_TEST_MUTATION_TRIALS", trials, 1, 100000);
}

uint32_t mutation_seed(uint32_t first_seed) {
  return static_cast<uint32_t>(env_int_range("ATTNKIT_TEST_MUTATION_SEED",
                                             static_cast<int>(first_seed), 0,
                                             std::numeric_limits<int>::max()));
}

}  // namespace attnkit::test_support
