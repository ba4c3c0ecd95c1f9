#include "support/op_runners.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <stdexcept>

#include "support/tolerance.hpp"

namespace ferrum::test {

// ── Results ──────────────────────────────────────────────────────────────────

const Output& OpResult::at(std::string_view name) const {
  for (const auto& [n, out] : outputs) {
    if (n == name) return out;
  }
  throw std::out_of_range(cat("OpResult: no output named '", name, "'"));
}

::testing::AssertionResult OpResult::guards_ok() const {
  if (guard_failures.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << guard_failures;
}

void expect_same_outputs(const OpResult& got, const OpResult& want, Match match, double scale,
                         std::initializer_list<std::string_view> exact_outputs) {
  EXPECT_TRUE(got.guards_ok()) << "(backend under test)";
  EXPECT_TRUE(want.guards_ok()) << "(reference backend)";
  ASSERT_EQ(got.outputs.size(), want.outputs.size());
  for (const auto& [name, ref] : want.outputs) {
    SCOPED_TRACE(cat("output '", name, "'"));
    const Output& out = got.at(name);
    const bool exact = match == Match::Exact ||
                       std::find(exact_outputs.begin(), exact_outputs.end(), name) != exact_outputs.end();
    if (exact) {
      EXPECT_TRUE(bitwise_equal(out.bytes, ref.bytes, size_of(ref.dtype)));
    } else if (match == Match::ExactOrNan) {
      EXPECT_TRUE(equal_or_both_nan(out.values, ref.values));
    } else {
      EXPECT_TRUE(all_close(out.values, ref.values, ref.dtype, scale));
    }
  }
}

namespace {

// One op execution: owns the uploaded inputs and the guarded outputs.
class OpRun {
 public:
  OpRun(Backend& be, const RunOptions& o) : be_(be), o_(o) {}

  Buffer& in(const HostTensor& t) {
    inputs_.push_back(std::make_unique<DeviceTensor>(be_, t, o_.lead));
    return inputs_.back()->view();
  }
  Buffer& out(std::string name, DType dtype, std::size_t need) {
    outputs_.emplace_back(std::move(name), std::make_unique<GuardedOutput>(be_, dtype, need, o_.lead));
    return outputs_.back().second->view();
  }
  // A workspace: poisoned and guarded like an output, its guard checked,
  // its contents not returned.
  Buffer& scratch(std::string name, DType dtype, std::size_t need) {
    scratch_.emplace_back(std::move(name), std::make_unique<GuardedOutput>(be_, dtype, need, o_.lead));
    return scratch_.back().second->view();
  }
  Buffer& inout(std::string name, const HostTensor& initial) {
    outputs_.emplace_back(std::move(name), std::make_unique<GuardedOutput>(be_, initial, o_.lead));
    return outputs_.back().second->view();
  }

  template <class F>
  OpResult go(F&& op) {
    {
      std::optional<DeviceStateScope> scope;
      if (o_.decode) {
        scope.emplace(be_, true);
        be_.set_decode_state(o_.decode->token, o_.decode->step);
      }
      if (o_.graph) {
        record_and_replay(op);
      } else {
        op();
      }
    }
    be_.synchronize();
    OpResult result;
    for (auto& [name, g] : outputs_) {
      Output out;
      out.dtype = g->dtype();
      out.bytes = g->bytes();
      out.values = decode_bytes(out.dtype, out.bytes);
      result.outputs.emplace_back(name, std::move(out));
      const ::testing::AssertionResult guard = g->check_guard();
      if (!guard) result.guard_failures += cat("output '", name, "': ", guard.message(), "\n");
    }
    for (auto& [name, g] : scratch_) {
      const ::testing::AssertionResult guard = g->check_guard();
      if (!guard) result.guard_failures += cat("workspace '", name, "': ", guard.message(), "\n");
    }
    return result;
  }

 private:
  // Records `op` in a graph, checks that recording wrote nothing, replays the
  // graph once and drops it. A failed check throws (the run has no result).
  template <class F>
  void record_and_replay(F& op) {
    std::vector<std::vector<std::uint8_t>> before;
    for (auto& [name, g] : outputs_) before.push_back(g->bytes());
    be_.begin_graph_capture();
    try {
      op();
    } catch (...) {
      // An op's own refusal has ended the capture; anything else leaves it
      // open: end it and drop whatever it recorded, keeping the first error.
      if (be_.is_capturing()) {
        try {
          be_.end_graph_capture();
          be_.reset_graph();
        } catch (...) {
        }
      }
      throw;
    }
    be_.end_graph_capture();
    for (std::size_t i = 0; i < outputs_.size(); ++i) {
      if (outputs_[i].second->bytes() != before[i]) {
        throw std::runtime_error(cat("graph run: recording the op wrote output '", outputs_[i].first, "'"));
      }
    }
    if (!be_.replay_last_graph()) throw std::runtime_error("graph run: replay_last_graph() found no graph");
    be_.reset_graph();
  }

  Backend& be_;
  RunOptions o_;
  std::vector<std::unique_ptr<DeviceTensor>> inputs_;
  std::vector<std::pair<std::string, std::unique_ptr<GuardedOutput>>> outputs_;
  std::vector<std::pair<std::string, std::unique_ptr<GuardedOutput>>> scratch_;
};

std::string dt_name(const HostTensor& t) { return std::string(to_string(t.dtype)); }

// Random table of `rows` x `cols` where positions [valid, rows) of every
// block of `rows` rows hold NaN.
HostTensor random_with_nan_tail(Rng& rng, DType dt, std::size_t blocks, std::size_t rows, std::size_t valid,
                                std::size_t cols) {
  HostTensor t = random_normal(rng, dt, blocks * rows * cols);
  for (std::size_t b = 0; b < blocks; ++b) {
    for (std::size_t r = valid; r < rows; ++r) {
      std::fill_n(t.values.begin() + static_cast<std::ptrdiff_t>((b * rows + r) * cols), cols,
                  std::numeric_limits<float>::quiet_NaN());
    }
  }
  return t;
}

}  // namespace

// ── Case generators ──────────────────────────────────────────────────────────

RmsNormCase make_rms_norm_case(Rng& rng, DType dt, std::size_t tokens, std::size_t dim, float amplitude,
                               float eps) {
  return {tokens, dim, eps, random_uniform(rng, dt, tokens * dim, -amplitude, amplitude),
          random_uniform(rng, dt, dim, -2.0f, 2.0f)};
}

FusedAddRmsNormCase make_fused_add_rms_norm_case(Rng& rng, DType dt, std::size_t tokens, std::size_t dim,
                                                 float amplitude, float eps) {
  return {tokens, dim, eps, random_uniform(rng, dt, tokens * dim, -amplitude, amplitude),
          random_uniform(rng, dt, tokens * dim, -amplitude, amplitude), random_uniform(rng, dt, dim, -2.0f, 2.0f)};
}

LayerNormCase make_layer_norm_case(Rng& rng, DType dt, std::size_t tokens, std::size_t dim, float amplitude,
                                   float eps) {
  // A non-zero mean, so that the mean subtraction matters.
  return {tokens, dim, eps, random_normal(rng, dt, tokens * dim, 0.5f * amplitude, amplitude),
          random_uniform(rng, dt, dim, -2.0f, 2.0f), random_uniform(rng, dt, dim)};
}

GeluCase make_gelu_case(Rng& rng, DType dt, std::size_t len, GeluApproximation approx) {
  return {len, approx, random_normal(rng, dt, len, 0.0f, 3.0f)};
}

AddBiasCase make_add_bias_case(Rng& rng, DType dt, std::size_t rows, std::size_t cols) {
  return {rows, cols, random_uniform(rng, dt, rows * cols), random_uniform(rng, dt, cols)};
}

AddInplaceCase make_add_inplace_case(Rng& rng, DType dt, std::size_t len) {
  return {len, random_uniform(rng, dt, len), random_uniform(rng, dt, len)};
}

namespace {

// NaN, +Inf, -Inf and +- the largest finite value of t's dtype.
constexpr std::size_t kSpecials = 5;
float special_value(DType dt, std::size_t k) {
  const float max_finite = dt == DType::BF16 ? 0x1.fep127f : 0x1.ffcp15f;
  const float specials[kSpecials] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                                     -std::numeric_limits<float>::infinity(), max_finite, -max_finite};
  return specials[k % kSpecials];
}

// Writes the specials into t every `stride` elements from `offset`, cycling
// through them (strides prime to 8 reach every lane of a 16-byte vector).
void sprinkle_non_finite(HostTensor& t, std::size_t offset, std::size_t stride) {
  std::size_t k = 0;
  for (std::size_t i = offset; i < t.size(); i += stride) t.values[i] = special_value(t.dtype, k++);
}

}  // namespace

AddBiasCase make_non_finite_add_bias_case(Rng& rng, DType dt, std::size_t rows, std::size_t cols) {
  AddBiasCase c = make_add_bias_case(rng, dt, rows, cols);
  sprinkle_non_finite(c.data, 0, 7);
  sprinkle_non_finite(c.bias, 2, 5);
  return c;
}

AddInplaceCase make_non_finite_add_inplace_case(Rng& rng, DType dt, std::size_t len) {
  AddInplaceCase c = make_add_inplace_case(rng, dt, len);
  sprinkle_non_finite(c.residual, 0, 7);
  sprinkle_non_finite(c.x, 1, 3);
  // Every pair of specials at 3 mod 11 (every lane over the run), then
  // again in the tail (the last elements).
  for (std::size_t p = 0; p < kSpecials * kSpecials; ++p) {
    for (std::size_t i : {3 + 11 * p, len - 1 - p}) {
      if (i >= len) continue;
      c.residual.values[i] = special_value(dt, p / kSpecials);
      c.x.values[i] = special_value(dt, p);
    }
  }
  return c;
}

GemmCase make_gemm_case(Rng& rng, DType dt, std::size_t m, std::size_t n, std::size_t k) {
  return {m, n, k, random_uniform(rng, dt, m * k), random_uniform(rng, dt, n * k)};
}

EmbeddingCase make_embedding_case(Rng& rng, DType dt, std::size_t tokens, std::size_t dim, std::size_t vocab) {
  return {tokens, dim, vocab, random_uniform(rng, dt, vocab * dim),
          random_ids(rng, tokens, static_cast<std::uint32_t>(vocab))};
}

SplitQkvCase make_split_qkv_case(Rng& rng, DType dt, std::size_t tokens, std::size_t q_dim, std::size_t kv_dim) {
  return {tokens, q_dim, kv_dim, random_uniform(rng, dt, tokens * (q_dim + 2 * kv_dim))};
}

SiluMulCase make_silu_mul_case(Rng& rng, DType dt, std::size_t tokens, std::size_t im) {
  return {tokens, im, random_normal(rng, dt, tokens * 2 * im, 0.0f, 2.0f)};
}

GemmSiluMulCase make_gemm_silu_mul_case(Rng& rng, DType dt, std::size_t m, std::size_t im, std::size_t k) {
  const float w_amp = 4.5f / std::sqrt(static_cast<float>(k));
  return {m, im, k, random_uniform(rng, dt, m * k), random_uniform(rng, dt, 2 * im * k, -w_amp, w_amp)};
}

QkNormRopeCase make_qk_norm_rope_case(Rng& rng, DType dt, std::size_t tokens, std::size_t heads,
                                      std::size_t head_dim, std::size_t pos_offset, RopeMode mode, double theta,
                                      std::size_t min_max_pos, float amplitude, float eps) {
  const std::size_t max_pos = std::max(pos_offset + tokens, min_max_pos) + 3;
  QkNormRopeCase c{tokens, heads, head_dim, pos_offset, eps, mode,
                   random_normal(rng, dt, tokens * heads * head_dim, 0.0f, amplitude), HostTensor{dt, {}},
                   make_rope_tables(max_pos, head_dim, theta)};
  if (mode == RopeMode::NormAndRope) c.norm_w = random_uniform(rng, dt, head_dim, -2.0f, 2.0f);
  return c;
}

KvAppendCase make_kv_append_case(Rng& rng, DType dt, std::size_t nkv, std::size_t capacity, std::size_t hd,
                                 std::size_t cache_len, std::size_t new_tokens) {
  return {nkv,
          capacity,
          hd,
          cache_len,
          new_tokens,
          random_uniform(rng, dt, nkv * capacity * hd),
          random_uniform(rng, dt, nkv * capacity * hd),
          random_uniform(rng, dt, nkv * new_tokens * hd),
          random_uniform(rng, dt, nkv * new_tokens * hd)};
}

TransposeCase make_transpose_case(Rng& rng, DType dt, std::size_t tokens, std::size_t heads, std::size_t dim) {
  return {tokens, heads, dim, random_uniform(rng, dt, heads * tokens * dim)};
}

CopySliceCase make_copy_slice_case(Rng& rng, DType dt, std::size_t src_size, std::size_t src_offset,
                                   std::size_t dst_size, std::size_t dst_offset, std::size_t len) {
  auto random_any = [&](std::size_t n) {
    switch (dt) {
      case DType::I32:
        return make_tensor(dt, uniform_values(rng, n, -1e6f, 1e6f));
      case DType::U8:
        return make_tensor(dt, uniform_values(rng, n, 0.0f, 255.0f));
      default:
        return random_uniform(rng, dt, n);
    }
  };
  return {src_offset, dst_offset, len, random_any(src_size), random_any(dst_size)};
}

FlashCase make_flash_case(Rng& rng, DType dt, std::size_t batch, std::size_t q_len, std::size_t kv_len,
                          std::size_t pos_offset, const AttnConfig& cfg, std::size_t valid_kv) {
  FlashCase c{batch, q_len, kv_len, pos_offset, cfg, valid_kv == 0 ? kv_len : valid_kv, {}, {}, {}};
  const std::size_t stride = c.stride();
  c.q = random_normal(rng, dt, batch * cfg.num_heads * q_len * cfg.head_dim);
  c.k = random_with_nan_tail(rng, dt, batch * cfg.num_kv_heads, stride, c.valid_kv, cfg.head_dim);
  c.v = random_with_nan_tail(rng, dt, batch * cfg.num_kv_heads, stride, c.valid_kv, cfg.head_dim);
  return c;
}

FlashCase with_scores_at_the_exact_edge(FlashCase c, float magnitude) {
  const float a = round_to(c.q.dtype, magnitude);
  for (HostTensor* t : {&c.q, &c.k}) {
    for (float& x : t->values) {
      if (std::isfinite(x) && x != 0.0f) x = std::copysign(a, x);
    }
  }
  const double most = static_cast<double>(a) * a * static_cast<double>(c.cfg.head_dim);  // the largest |q·k|
  c.cfg.scale = static_cast<float>(kAttentionExactLogit / most);
  return c;
}

::testing::AssertionResult convex_in_v(const FlashCase& c, const Output& out) {
  const auto rel = static_cast<float>(tolerance_for(out.dtype).rtol);
  float v_max = 0.0f;  // over the keys any query sees (rows past valid_kv hold NaN)
  for (float x : c.v.values) {
    if (std::isfinite(x)) v_max = std::max(v_max, std::fabs(x));
  }
  for (std::size_t i = 0; i < out.values.size(); ++i) {
    const float x = out.values[i];
    if (!std::isfinite(x) || std::fabs(x) > v_max * (1.0f + rel)) {
      return ::testing::AssertionFailure() << "out[" << i << "] = " << x << ", not finite or past max |v| = " << v_max
                                           << " (relative slack " << rel << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

RaggedDecodeCase make_ragged_decode_case(Rng& rng, DType dt, const AttnConfig& cfg,
                                         const std::vector<std::size_t>& kv_lens) {
  RaggedDecodeCase c{kv_lens.size(), cfg, {}, {}, {}, {}};
  c.q = random_normal(rng, dt, c.batch * cfg.num_heads * cfg.head_dim);
  c.k.dtype = c.v.dtype = dt;
  for (std::size_t len : kv_lens) {
    for (HostTensor* t : {&c.k, &c.v}) {
      const HostTensor seq = random_with_nan_tail(rng, dt, cfg.num_kv_heads, cfg.kv_seq_stride, len, cfg.head_dim);
      t->values.insert(t->values.end(), seq.values.begin(), seq.values.end());
    }
  }
  std::vector<float> lens(kv_lens.begin(), kv_lens.end());
  c.kv_lens = make_tensor(DType::I32, std::move(lens));
  return c;
}

AttnConfig attn_config(std::size_t num_heads, std::size_t num_kv_heads, std::size_t head_dim,
                       std::size_t kv_seq_stride) {
  AttnConfig cfg;
  cfg.num_heads = num_heads;
  cfg.num_kv_heads = num_kv_heads;
  cfg.head_dim = head_dim;
  cfg.kv_seq_stride = kv_seq_stride;
  return cfg;
}

// ── Descriptions ─────────────────────────────────────────────────────────────

std::string describe(const RmsNormCase& c) {
  return cat("rms_norm ", dt_name(c.x), " tokens=", c.tokens, " dim=", c.dim, " eps=", c.eps);
}
std::string describe(const FusedAddRmsNormCase& c) {
  return cat("fused_add_rms_norm ", dt_name(c.x), " tokens=", c.tokens, " dim=", c.dim, " eps=", c.eps);
}
std::string describe(const LayerNormCase& c) {
  return cat("layer_norm ", dt_name(c.x), " tokens=", c.tokens, " dim=", c.dim, " eps=", c.eps);
}
std::string describe(const GeluCase& c) {
  return cat("gelu ", dt_name(c.x), " len=", c.len, c.approx == GeluApproximation::Erf ? " erf" : " tanh");
}
std::string describe(const AddBiasCase& c) {
  return cat("add_bias ", dt_name(c.data), " rows=", c.rows, " cols=", c.cols);
}
std::string describe(const AddInplaceCase& c) { return cat("add_inplace ", dt_name(c.x), " len=", c.len); }
std::string describe(const GemmCase& c) {
  return cat("gemm ", dt_name(c.a), " m=", c.m, " n=", c.n, " k=", c.k);
}
std::string describe(const GemmSiluMulCase& c) {
  return cat("gemm_silu_mul ", dt_name(c.a), " m=", c.m, " im=", c.im, " k=", c.k);
}
std::string describe(const EmbeddingCase& c) {
  return cat("embedding_lookup ", dt_name(c.table), " tokens=", c.tokens, " dim=", c.dim, " vocab=", c.vocab,
             c.null_ids ? " (null ids)" : "");
}
std::string describe(const SplitQkvCase& c) {
  return cat("split_qkv ", dt_name(c.qkv), " tokens=", c.tokens, " q_dim=", c.q_dim, " kv_dim=", c.kv_dim);
}
std::string describe(const SiluMulCase& c) {
  return cat("fused_silu_mul_split ", dt_name(c.gate_up), " tokens=", c.tokens, " im=", c.im);
}
std::string describe(const QkNormRopeCase& c) {
  return cat("qk_norm_rope ", dt_name(c.input), " tokens=", c.tokens, " heads=", c.heads, " head_dim=", c.head_dim,
             " pos_offset=", c.pos_offset, " max_pos=", c.tables.max_pos, " theta=", c.tables.theta,
             c.mode == RopeMode::NormAndRope ? " NormAndRope" : " RopeOnly");
}
std::string describe(const KvAppendCase& c) {
  return cat("kv_cache_append_head_major ", dt_name(c.new_k), " nkv=", c.nkv, " capacity=", c.capacity, " hd=", c.hd,
             " cache_len=", c.cache_len, " new_tokens=", c.new_tokens);
}
std::string describe(const TransposeCase& c) {
  return cat("transpose_head_to_token ", dt_name(c.src), " tokens=", c.tokens, " heads=", c.heads, " dim=", c.dim);
}
std::string describe(const CopySliceCase& c) {
  return cat("copy_slice ", dt_name(c.src), " src=", c.src.size(), "@", c.src_offset, " dst=", c.dst.size(), "@",
             c.dst_offset, " len=", c.len);
}
std::string describe(const FlashCase& c) {
  return cat("flash_attention ", dt_name(c.q), " batch=", c.batch, " heads=", c.cfg.num_heads, "/",
             c.cfg.num_kv_heads, " head_dim=", c.cfg.head_dim, " q_len=", c.q_len, " kv_len=", c.kv_len,
             " pos_offset=", c.pos_offset, " stride=", c.stride(), " valid_kv=", c.valid_kv,
             c.cfg.causal ? " causal" : " non-causal", " scale=", c.cfg.scale);
}
std::string describe(const RaggedDecodeCase& c) {
  std::string lens;
  for (float l : c.kv_lens.values) lens += cat(lens.empty() ? "" : ",", static_cast<long>(l));
  return cat("flash_decode_ragged ", dt_name(c.q), " batch=", c.batch, " heads=", c.cfg.num_heads, "/",
             c.cfg.num_kv_heads, " head_dim=", c.cfg.head_dim, " capacity=", c.cfg.kv_seq_stride, " kv_lens=[", lens,
             "] scale=", c.cfg.scale);
}
std::string describe(const RunOptions& o) {
  std::string s = cat("lead=", o.lead);
  if (o.decode) s += cat(" device-state token=", o.decode->token, " step=", o.decode->step);
  if (o.graph) s += " graph";
  return s;
}

// ── Runners ──────────────────────────────────────────────────────────────────

OpResult run(Backend& be, const RmsNormCase& c, const RunOptions& o) {
  OpRun r(be, o);
  Buffer& x = r.in(c.x);
  Buffer& w = r.in(c.w);
  Buffer& out = r.out("out", c.x.dtype, c.tokens * c.dim);
  return r.go([&] { be.rms_norm(x, w, c.eps, out, c.tokens, c.dim); });
}

OpResult run(Backend& be, const FusedAddRmsNormCase& c, const RunOptions& o) {
  OpRun r(be, o);
  Buffer& residual = r.inout("residual", c.residual);
  Buffer& x = r.in(c.x);
  Buffer& w = r.in(c.w);
  Buffer& out = r.out("out", c.x.dtype, c.tokens * c.dim);
  return r.go([&] { be.fused_add_rms_norm(residual, x, w, c.eps, out, c.tokens, c.dim); });
}

OpResult run(Backend& be, const LayerNormCase& c, const RunOptions& o) {
  OpRun r(be, o);
  Buffer& x = r.in(c.x);
  Buffer& gamma = r.in(c.gamma);
  Buffer& beta = r.in(c.beta);
  Buffer& out = r.out("out", c.x.dtype, c.tokens * c.dim);
  return r.go([&] { be.layer_norm(x, gamma, beta, c.eps, out, c.tokens, c.dim); });
}

OpResult run(Backend& be, const GeluCase& c, const RunOptions& o) {
  OpRun r(be, o);
  Buffer& x = r.in(c.x);
  Buffer& out = r.out("out", c.x.dtype, c.len);
  return r.go([&] { be.gelu(x, out, c.len, c.approx); });
}

OpResult run(Backend& be, const AddBiasCase& c, const RunOptions& o) {
  OpRun r(be, o);
  Buffer& data = r.inout("data", c.data);
  Buffer& bias = r.in(c.bias);
  return r.go([&] { be.add_bias(data, bias, c.rows, c.cols); });
}

OpResult run(Backend& be, const AddInplaceCase& c, const RunOptions& o) {
  OpRun r(be, o);
  Buffer& residual = r.inout("residual", c.residual);
  Buffer& x = r.in(c.x);
  return r.go([&] { be.add_inplace(residual, x, c.len); });
}

OpResult run(Backend& be, const GemmCase& c, const RunOptions& o) {
  OpRun r(be, o);
  Buffer& a = r.in(c.a);
  Buffer& b = r.in(c.b);
  Buffer& out = r.out("out", c.a.dtype, c.m * c.n);
  return r.go([&] { be.gemm(a, b, out, c.m, c.n, c.k); });
}

OpResult run(Backend& be, const EmbeddingCase& c, const RunOptions& o) {
  OpRun r(be, o);
  Buffer& table = r.in(c.table);
  Buffer null_ids;
  Buffer& ids = c.null_ids ? null_ids : r.in(c.ids);
  Buffer& out = r.out("out", c.table.dtype, c.tokens * c.dim);
  return r.go([&] { be.embedding_lookup(table, ids, out, c.tokens, c.dim, c.vocab); });
}

OpResult run(Backend& be, const SplitQkvCase& c, const RunOptions& o) {
  OpRun r(be, o);
  Buffer& qkv = r.in(c.qkv);
  Buffer& q = r.out("q", c.qkv.dtype, c.tokens * c.q_dim);
  Buffer& k = r.out("k", c.qkv.dtype, c.tokens * c.kv_dim);
  Buffer& v = r.out("v", c.qkv.dtype, c.tokens * c.kv_dim);
  return r.go([&] { be.split_qkv(qkv, q, k, v, c.tokens, c.q_dim, c.kv_dim); });
}

OpResult run(Backend& be, const SiluMulCase& c, const RunOptions& o) {
  OpRun r(be, o);
  Buffer& gate_up = r.in(c.gate_up);
  Buffer& out = r.out("out", c.gate_up.dtype, c.tokens * c.im);
  return r.go([&] { be.fused_silu_mul_split(gate_up, out, c.tokens, c.im); });
}

OpResult run(Backend& be, const GemmSiluMulCase& c, const RunOptions& o) {
  OpRun r(be, o);
  Buffer& a = r.in(c.a);
  Buffer& w = r.in(c.w);
  Buffer& gate_up = r.scratch("gate_up", c.a.dtype, c.m * 2 * c.im);
  Buffer& act = r.out("act", c.a.dtype, c.m * c.im);
  return r.go([&] { be.gemm_silu_mul(a, w, gate_up, act, c.m, c.im, c.k); });
}

OpResult run(Backend& be, const QkNormRopeCase& c, const RunOptions& o) {
  OpRun r(be, o);
  Buffer& input = r.in(c.input);
  Buffer* norm_w = c.norm_w.empty() ? nullptr : &r.in(c.norm_w);
  Buffer& cos = r.in(c.tables.cos);
  Buffer& sin = r.in(c.tables.sin);
  Buffer& out = r.out("out", c.input.dtype, c.tokens * c.heads * c.head_dim);
  return r.go([&] {
    be.qk_norm_rope(input, norm_w, cos, sin, out, c.tokens, c.heads, c.head_dim, c.pos_offset, c.tables.max_pos,
                    c.eps, c.mode);
  });
}

OpResult run(Backend& be, const KvAppendCase& c, const RunOptions& o) {
  OpRun r(be, o);
  Buffer& cache_k = r.inout("cache_k", c.cache_k);
  Buffer& cache_v = r.inout("cache_v", c.cache_v);
  Buffer& new_k = r.in(c.new_k);
  Buffer& new_v = r.in(c.new_v);
  return r.go([&] {
    be.kv_cache_append_head_major(cache_k, cache_v, c.cache_len, c.capacity, new_k, new_v, c.new_tokens, c.nkv,
                                  c.hd);
  });
}

OpResult run(Backend& be, const TransposeCase& c, const RunOptions& o) {
  OpRun r(be, o);
  Buffer& src = r.in(c.src);
  Buffer& dst = r.out("out", c.src.dtype, c.tokens * c.heads * c.dim);
  return r.go([&] { be.transpose_head_to_token(src, dst, c.tokens, c.heads, c.dim); });
}

OpResult run(Backend& be, const CopySliceCase& c, const RunOptions& o) {
  OpRun r(be, o);
  Buffer& src = r.in(c.src);
  Buffer& dst = r.inout("dst", c.dst);
  return r.go([&] { be.copy_slice(src, c.src_offset, dst, c.dst_offset, c.len); });
}

OpResult run(Backend& be, const FlashCase& c, const RunOptions& o) {
  OpRun r(be, o);
  Buffer& q = r.in(c.q);
  Buffer& k = r.in(c.k);
  Buffer& v = r.in(c.v);
  Buffer& out = r.out("out", c.q.dtype, c.q.size());
  return r.go([&] { be.flash_attention(q, k, v, out, c.batch, c.q_len, c.kv_len, c.pos_offset, c.cfg); });
}

OpResult run(Backend& be, const RaggedDecodeCase& c, const RunOptions& o) {
  OpRun r(be, o);
  Buffer& q = r.in(c.q);
  Buffer& k = r.in(c.k);
  Buffer& v = r.in(c.v);
  Buffer& kv_lens = r.in(c.kv_lens);
  Buffer& out = r.out("out", c.q.dtype, c.q.size());
  return r.go([&] { be.flash_decode_ragged(q, k, v, out, kv_lens, c.batch, c.cfg); });
}

::testing::AssertionResult ragged_equals_single_decodes(Backend& be, const RaggedDecodeCase& c) {
  const OpResult batch = run(be, c);
  if (auto guards = batch.guards_ok(); !guards) return guards << " (ragged batch)";
  const std::size_t q_row = c.cfg.num_heads * c.cfg.head_dim;
  const std::size_t kv_seq = c.cfg.num_kv_heads * c.cfg.kv_seq_stride * c.cfg.head_dim;
  const DType dt = c.q.dtype;
  const std::size_t es = size_of(dt);
  const auto slice = [&](const HostTensor& t, std::size_t b, std::size_t n) {
    return make_tensor(dt, {t.values.begin() + static_cast<std::ptrdiff_t>(b * n),
                            t.values.begin() + static_cast<std::ptrdiff_t>((b + 1) * n)});
  };
  const auto& all = batch.at("out").bytes;
  for (std::size_t b = 0; b < c.batch; ++b) {
    const auto len = static_cast<std::size_t>(c.kv_lens.values[b]);
    const FlashCase one{1, 1, len, len - 1, c.cfg, len, slice(c.q, b, q_row), slice(c.k, b, kv_seq),
                        slice(c.v, b, kv_seq)};
    const OpResult single = run(be, one);
    if (auto guards = single.guards_ok(); !guards) return guards << " (sequence " << b << " alone)";
    const std::vector<std::uint8_t> mine(all.begin() + static_cast<std::ptrdiff_t>(b * q_row * es),
                                         all.begin() + static_cast<std::ptrdiff_t>((b + 1) * q_row * es));
    if (auto eq = bitwise_equal(mine, single.at("out").bytes, es); !eq) {
      return eq << " (sequence " << b << ", kv_len " << len << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

// ── Effective arguments ──────────────────────────────────────────────────────

std::size_t effective_token(const EmbeddingCase& c, std::size_t t, const RunOptions& o) {
  if (o.decode && c.tokens == 1) return o.decode->token;
  return static_cast<std::size_t>(c.ids.values[t]);
}
std::size_t effective_pos_offset(const QkNormRopeCase& c, const RunOptions& o) {
  return o.decode && c.tokens == 1 ? o.decode->step : c.pos_offset;
}
std::size_t effective_cache_len(const KvAppendCase& c, const RunOptions& o) {
  return o.decode && c.new_tokens == 1 ? o.decode->step : c.cache_len;
}
std::size_t effective_kv_len(const FlashCase& c, const RunOptions& o) {
  return o.decode && c.q_len == 1 ? o.decode->step + 1 : c.kv_len;
}
std::size_t effective_pos_offset(const FlashCase& c, const RunOptions& o) {
  return o.decode && c.q_len == 1 ? o.decode->step : c.pos_offset;
}

// ── Shared size lists ────────────────────────────────────────────────────────

std::pair<std::size_t, std::size_t> transpose_shape_for(std::size_t dim_index) {
  static constexpr std::pair<std::size_t, std::size_t> kShapes[] = {{2, 4}, {3, 257}, {32, 128}, {40, 128}};
  return kShapes[dim_index];
}

std::vector<GemmShape> gemm_shapes() {
  return {
      {1, 769, 769},    {1, 5120, 4096}, {1, 4096, 5120},  {7, 769, 5120},  {7, 4096, 769},
      {7, 5120, 5120},  {83, 769, 769},  {83, 4096, 5120}, {83, 5120, 769}, {4096, 8, 769},
      {4096, 769, 8},   {4096, 769, 83}, {7, 8, 8},
  };
}

std::vector<RopeSpec> rope_specs() {
  std::vector<RopeSpec> specs;
  // Every head size the CUDA kernels take a different path or instance for:
  // the 16-byte path's groups of 1 / 4 / 8 / 16 / 32 lanes per row, and (on
  // misaligned views) the one-warp path's 1 / 2 / 4 / 8 pairs per lane.
  const std::size_t head_dims[] = {16, 64, 128, 256, 512};
  const RopeMode modes[] = {RopeMode::NormAndRope, RopeMode::RopeOnly};
  for (std::size_t ti = 0; ti < std::size(kSweepTokens); ++ti) {
    const std::size_t tokens = kSweepTokens[ti];
    // Decode-like single tokens deep into the table; prefill chunks at and past 0.
    static constexpr std::size_t kPosOffsets[] = {1021, 13, 0, 5};
    for (std::size_t hi = 0; hi < std::size(head_dims); ++hi) {
      // 83 tokens already give head_dim 512 many blocks; 4096 would only add
      // seconds of fp64 reference.
      if (tokens == 4096 && head_dims[hi] == 512) continue;
      for (std::size_t mi = 0; mi < std::size(modes); ++mi) {
        const double theta = (ti + hi + mi) % 2 == 0 ? kRopeTheta10k : kRopeTheta1M;
        specs.push_back({tokens, 7, head_dims[hi], kPosOffsets[ti], modes[mi], theta});
      }
    }
  }
  return specs;
}

std::vector<KvAppendSpec> kv_append_specs() {
  return {
      {1, 16, 8, 0, 1},          // first decode step
      {3, 50, 256, 49, 1},       // last free row
      {2, 100, 64, 93, 7},       // fills the cache exactly
      {5, 300, 96, 17, 83},      // chunk in the middle
      {4, 9, 769, 2, 7},         // odd head_dim: rows not 16-byte multiples
      {8, 4200, 128, 0, 4096},   // prefill from empty
      {8, 4200, 128, 104, 4096}, // prefill at cache_len > 0, up to capacity
      {1, 1, 8, 0, 1},           // capacity 1
  };
}

std::vector<FlashSpec> flash_specs() {
  std::vector<FlashSpec> specs;
  const std::pair<std::size_t, std::size_t> heads[] = {{4, 4}, {8, 2}, {16, 2}};  // GQA ratios 1, 4, 8
  // head_dim and scale are bits 0 and 1 of the (kv, heads) counter and both
  // causal values run for each, so every (head_dim, scale, causal)
  // combination comes up at kv 7 or 129 (at kv 1 the scale cannot matter).
  std::size_t index = 0, cases = 0;
  for (std::size_t kv : {std::size_t{1}, std::size_t{7}, std::size_t{129}}) {
    for (const auto& [nh, nkv] : heads) {
      for (bool causal : {true, false}) {
        AttnConfig cfg;
        cfg.num_heads = nh;
        cfg.num_kv_heads = nkv;
        cfg.head_dim = index % 2 == 1 ? 128 : 64;
        cfg.causal = causal;
        cfg.scale = index / 2 % 2 == 1 ? 0.3f : 0.0f;  // 0: 1/sqrt(head_dim)
        const std::size_t batch = ++cases % 3 == 0 ? 2 : 1;
        // Decode: one query at the newest position, kv_seq_stride > kv_len.
        cfg.kv_seq_stride = kv + 13;
        specs.push_back({batch, 1, kv, kv - 1, cfg});
        // Prefill: every position queries, stride 0 (= kv_len).
        cfg.kv_seq_stride = 0;
        specs.push_back({batch, kv, kv, 0, cfg});
        // A chunk of queries at pos_offset > 0 that does not reach the end.
        if (kv > 1) {
          const std::size_t q_len = std::min<std::size_t>(kv - 1, 5);
          cfg.kv_seq_stride = kv + 65;
          specs.push_back({batch, q_len, kv, (kv - q_len + 1) / 2, cfg});
        }
      }
      ++index;
    }
  }
  // Decode across several slices of the CUDA kernel (128 keys at capacities
  // 1000 and 1300, 256 at 2100 and 2400), GQA 16 (more q heads per kv head
  // than one block takes), and head_dim 256.
  for (std::size_t kv : {std::size_t{1000}, std::size_t{2100}}) {
    AttnConfig cfg;
    cfg.num_heads = 32;
    cfg.num_kv_heads = 2;
    cfg.head_dim = kv == 1000 ? 128 : 256;
    cfg.causal = true;
    cfg.kv_seq_stride = kv + 300;
    specs.push_back({2, 1, kv, kv - 1, cfg});
    cfg.kv_seq_stride = 0;
    specs.push_back({1, 9, kv, kv - 9, cfg});
  }
  // One causal query before the newest key (it sees pos_offset + 1 of the
  // kv_len keys: the decode kernels' limit below kv_len), several slices in
  // from the cache's end.
  for (std::size_t hd : {64, 128}) specs.push_back({2, 1, 1000, 300, attn_config(8, 2, hd, 1300)});
  return specs;
}

std::vector<RaggedDecodeSpec> ragged_decode_specs() {
  std::vector<RaggedDecodeSpec> specs;
  const std::pair<std::size_t, std::size_t> heads[] = {{4, 4}, {8, 2}, {16, 2}};  // GQA ratios 1, 4, 8
  std::size_t index = 0;
  for (std::size_t hd : {64, 128, 256}) {
    for (const auto& [nh, nkv] : heads) {
      AttnConfig cfg;
      cfg.num_heads = nh;
      cfg.num_kv_heads = nkv;
      cfg.head_dim = hd;
      cfg.scale = ++index % 3 == 0 ? 0.3f : 0.0f;
      cfg.kv_seq_stride = 1100;
      specs.push_back({cfg, {1, 7, 129, 1000, 512, 513, 1100}});
    }
  }
  // One long sequence beside short ones, and GQA 16 (two blocks per group).
  AttnConfig cfg;
  cfg.num_heads = 32;
  cfg.num_kv_heads = 2;
  cfg.head_dim = 128;
  cfg.kv_seq_stride = 5000;
  specs.push_back({cfg, {4999, 3, 2048}});
  return specs;
}

std::vector<StateCase<EmbeddingCase>> embedding_state_cases(Rng& rng, DType dt) {
  std::vector<StateCase<EmbeddingCase>> cases;
  for (bool null_ids : {false, true}) {
    for (std::size_t dim : {8, 769, 4096}) {
      EmbeddingCase c = make_embedding_case(rng, dt, 1, dim, kEmbeddingVocab);
      c.null_ids = null_ids;
      const auto decoy = static_cast<std::uint32_t>(c.ids.values[0]);
      std::vector<DecodeStep> steps;
      for (std::uint32_t i = 0; i < 3; ++i) {
        // Any token but the decoy id, at any step.
        const auto token = static_cast<std::uint32_t>((decoy + 1 + rng.below(kEmbeddingVocab - 1)) % kEmbeddingVocab);
        steps.push_back({i == 2 ? static_cast<std::uint32_t>(kEmbeddingVocab - 1) : token, rng.below(1u << 20)});
      }
      if (steps[2].token == decoy) steps.pop_back();
      cases.push_back({std::move(c), std::move(steps)});
    }
  }
  return cases;
}

std::vector<StateCase<QkNormRopeCase>> rope_state_cases(Rng& rng, DType dt) {
  std::vector<StateCase<QkNormRopeCase>> cases;
  for (std::size_t hd : {64, 128, 256}) {
    for (RopeMode mode : {RopeMode::NormAndRope, RopeMode::RopeOnly}) {
      QkNormRopeCase c = make_qk_norm_rope_case(rng, dt, 1, 8, hd, 0, mode, kRopeTheta1M, 4096);
      const auto last = static_cast<std::uint32_t>(c.tables.max_pos - 1);
      std::vector<DecodeStep> steps = {{0, 0}, {0, 1}, {0, 2 + rng.below(last - 2)}, {0, last}};
      cases.push_back({std::move(c), std::move(steps)});
    }
  }
  return cases;
}

std::vector<StateCase<KvAppendCase>> kv_append_state_cases(Rng& rng, DType dt) {
  constexpr std::uint32_t kCap = 1024;
  std::vector<StateCase<KvAppendCase>> cases;
  for (std::size_t hd : {64, 128, 256}) {
    cases.push_back({make_kv_append_case(rng, dt, 8, kCap, hd, 0, 1),
                     {{0, 0}, {0, 5}, {0, 6 + rng.below(kCap - 7)}, {0, kCap - 1}}});
  }
  return cases;
}

std::vector<StateCase<FlashCase>> flash_state_cases(Rng& rng, DType dt) {
  constexpr std::uint32_t kStride = 300;
  std::vector<StateCase<FlashCase>> cases;
  for (const auto& [nh, nkv] : {std::pair<std::size_t, std::size_t>{8, 8}, {8, 2}, {16, 2}}) {
    for (std::uint32_t step : {0u, 6u, 7u + rng.below(kStride - 8), kStride - 1}) {
      AttnConfig cfg;
      cfg.num_heads = nh;
      cfg.num_kv_heads = nkv;
      cfg.head_dim = 128;
      cfg.kv_seq_stride = kStride;
      // Host kv_len 1 / pos_offset 0 are decoys.
      cases.push_back({make_flash_case(rng, dt, 1, 1, 1, 0, cfg, step + 1), {{0, step}}});
    }
  }
  return cases;
}

void expect_backend_works(Backend& test, Backend& ref, Rng& rng) {
  SCOPED_TRACE("the backend still works");
  const auto norm = make_rms_norm_case(rng, DType::F16, 7, 769);
  expect_same_outputs(run(test, norm), run(ref, norm), Match::Close);
  const auto emb = make_embedding_case(rng, DType::BF16, 7, 769, kEmbeddingVocab);
  expect_same_outputs(run(test, emb), run(ref, emb), Match::Exact);
}

std::vector<CopySliceSpec> copy_slice_specs() {
  std::vector<CopySliceSpec> specs;
  for (DType dt : {DType::F16, DType::BF16, DType::F32, DType::I32, DType::U8}) {
    specs.push_back({dt, 1, 0, 1, 0, 1});
    specs.push_back({dt, 1000, 3, 777, 5, 700});
    specs.push_back({dt, 100003, 12345, 100001, 1, 87654});
    specs.push_back({dt, 4096, 0, 4096, 0, 4096});
  }
  return specs;
}

}  // namespace ferrum::test
