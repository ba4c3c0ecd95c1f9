// Bad input to EVERY public op, on CpuBackend always and on CudaBackend when
// a GPU is present (skipped otherwise). Each case checks the ErrorCode AND
// that the message names the op (and the offending argument).
//
// The generic cases walk the op table of support/op_registry.hpp, replacing
// one argument of a valid call at a time:
//   null buffer -> NullBuffer, buffer of another backend instance ->
//   WrongBackend, one element too few -> ShapeMismatch, wrong dtype ->
//   DTypeMismatch, size 0 or > INT32_MAX -> InvalidArgument.
// The overlap rule walks the same table: every output against every other
// buffer of its call. The op-specific cases cover eps / scale / enum
// domains, capacities, GQA grouping, causal reach, size-product overflow,
// misalignment (Buffer::wrap), weights of a destroyed backend and the
// host-side buffer API.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "support/op_registry.hpp"
#include "support/test_support.hpp"

namespace ferrum::test {
namespace {

constexpr std::size_t kHuge = std::size_t{1} << 31;  // one past INT32_MAX
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

class BadInput : public BackendTest {
 protected:
  // Runs `mutate` on fresh valid arguments of `op`, then the call; expects
  // `code` with a message naming the op and `arg` (quoted, as messages quote it).
  void expect_call_error(Op op, ErrorCode code, const std::string& arg, const std::function<void(OpArgs&)>& mutate,
                         std::source_location where = std::source_location::current()) {
    const OpSpec& spec = op_spec(op);
    OpArgs a = make_args(backend(), spec);
    mutate(a);
    expect_error(code, spec.name, [&] { spec.call(backend(), a); }, arg, where);
  }
};

// ── The valid calls themselves are valid ─────────────────────────────────────

TEST_P(BadInput, BaselineCallsAreValid) {
  for (const OpSpec& spec : op_specs()) {
    SCOPED_TRACE(spec.name);
    OpArgs a = make_args(backend(), spec);
    if (backend().supports(spec.op)) {
      EXPECT_NO_THROW({
        spec.call(backend(), a);
        backend().synchronize();
      });
    } else {
      expect_error(ErrorCode::Unsupported, spec.name, [&] { spec.call(backend(), a); });
    }
  }
}

// ── One argument at a time, for every op ─────────────────────────────────────

TEST_P(BadInput, NullBuffer) {
  for (const OpSpec& spec : op_specs()) {
    for (const BufferArg& b : spec.buffers) {
      SCOPED_TRACE(cat(spec.name, " '", b.name, "' = null"));
      expect_call_error(spec.op, ErrorCode::NullBuffer, cat("'", b.name, "'"),
                        [&](OpArgs& a) { a.buffers[b.name] = Buffer{}; });
    }
  }
}

TEST_P(BadInput, BufferOfAnotherBackend) {
  for (const OpSpec& spec : op_specs()) {
    for (const BufferArg& b : spec.buffers) {
      SCOPED_TRACE(cat(spec.name, " '", b.name, "' from another backend"));
      expect_call_error(spec.op, ErrorCode::WrongBackend, cat("'", b.name, "'"),
                        [&](OpArgs& a) { a.buffers[b.name] = zeros(other(), b.dtype, b.numel); });
    }
  }
}

TEST_P(BadInput, BufferTooSmall) {
  for (const OpSpec& spec : op_specs()) {
    for (const BufferArg& b : spec.buffers) {
      SCOPED_TRACE(cat(spec.name, " '", b.name, "' with ", b.too_small, " elements"));
      expect_call_error(spec.op, ErrorCode::ShapeMismatch, cat("'", b.name, "'"), [&](OpArgs& a) {
        // A view: too small by the view's count, though the memory behind it is larger.
        a.shrink(b.name, b.too_small);
      });
    }
  }
}

TEST_P(BadInput, WrongDType) {
  for (const OpSpec& spec : op_specs()) {
    for (const BufferArg& b : spec.buffers) {
      SCOPED_TRACE(cat(spec.name, " '", b.name, "' as ", to_string(b.wrong_dtype)));
      expect_call_error(spec.op, ErrorCode::DTypeMismatch, cat("'", b.name, "'"),
                        [&](OpArgs& a) { a.buffers[b.name] = zeros(backend(), b.wrong_dtype, b.numel); });
    }
  }
}

TEST_P(BadInput, MixedHalfDTypes) {
  // bf16 among f16 arguments (each alone is a legal dtype; together they are not).
  for (const OpSpec& spec : op_specs()) {
    std::size_t half_buffers = 0;  // argmax: one f16 input and an i32 output, nothing to mix
    for (const BufferArg& b : spec.buffers) half_buffers += b.dtype == DType::F16;
    for (const BufferArg& b : spec.buffers) {
      if (b.dtype != DType::F16 || half_buffers < 2) continue;
      SCOPED_TRACE(cat(spec.name, " '", b.name, "' as bf16"));
      // The mismatch involves the one bf16 argument, so the message names it.
      expect_call_error(spec.op, ErrorCode::DTypeMismatch, cat("'", b.name, "'"),
                        [&](OpArgs& a) { a.buffers[b.name] = zeros(backend(), DType::BF16, b.numel); });
    }
  }
}

TEST_P(BadInput, ZeroSize) {
  for (const OpSpec& spec : op_specs()) {
    for (const SizeArg& s : spec.sizes) {
      SCOPED_TRACE(cat(spec.name, " ", s.name, " = 0"));
      expect_call_error(spec.op, ErrorCode::InvalidArgument, cat("'", s.name, "'"),
                        [&](OpArgs& a) { a.sizes[s.name] = 0; });
    }
  }
}

TEST_P(BadInput, SizePast32Bits) {
  for (const OpSpec& spec : op_specs()) {
    for (const SizeArg& s : spec.sizes) {
      SCOPED_TRACE(cat(spec.name, " ", s.name, " = 2^31"));
      expect_call_error(spec.op, ErrorCode::InvalidArgument, cat("'", s.name, "'"),
                        [&](OpArgs& a) { a.sizes[s.name] = kHuge; });
    }
  }
}

// Sizes each within 32 bits whose derived kernel dimension is not.
TEST_P(BadInput, DerivedSizePast32Bits) {
  expect_call_error(Op::GemmSiluMul, ErrorCode::InvalidArgument, "'2 * im'",
                    [](OpArgs& a) { a.sizes["im"] = kHuge / 2; });  // 2 * im = 2^31
  expect_call_error(Op::QkvRopeAppend, ErrorCode::InvalidArgument, "'cfg.heads + 2 * cfg.kv_heads'",
                    [](OpArgs& a) { a.sizes["cfg.heads"] = kHuge - 2; });  // + 2 * 1 = 2^31
}

// ── Scalars: eps, scale, enums ───────────────────────────────────────────────

TEST_P(BadInput, BadEps) {
  for (Op op : {Op::RmsNorm, Op::FusedAddRmsNorm, Op::LayerNorm, Op::QkNormRope, Op::RmsNormGemmGptq,
                Op::RmsNormGemmSiluMulGptq}) {
    for (float eps : {kNaN, -1e-6f, kInf, -kInf}) {
      SCOPED_TRACE(cat(to_string(op), " eps=", eps));
      expect_call_error(op, ErrorCode::InvalidArgument, "'eps'", [&](OpArgs& a) { a.eps = eps; });
    }
  }
}

TEST_P(BadInput, EpsZeroIsAllowed) {
  for (Op op : {Op::RmsNorm, Op::FusedAddRmsNorm, Op::LayerNorm, Op::QkNormRope, Op::RmsNormGemmGptq,
                Op::RmsNormGemmSiluMulGptq}) {
    SCOPED_TRACE(to_string(op));
    OpArgs a = make_args(backend(), op_spec(op));
    a.eps = 0.0f;
    EXPECT_NO_THROW(op_spec(op).call(backend(), a));
  }
  backend().synchronize();
}

TEST_P(BadInput, GeluBadApproximation) {
  expect_call_error(Op::Gelu, ErrorCode::InvalidArgument, "'approx'",
                    [](OpArgs& a) { a.approx = static_cast<GeluApproximation>(7); });
}

TEST_P(BadInput, AllReduceBadOp) {
  expect_call_error(Op::AllReduce, ErrorCode::InvalidArgument, "'op'",
                    [](OpArgs& a) { a.reduce = static_cast<ReduceOp>(42); });
}

TEST_P(BadInput, BroadcastFromRankPastWorld) {
  expect_call_error(Op::Broadcast, ErrorCode::InvalidArgument, "'src_rank'", [](OpArgs& a) { a.src_rank = 1; });
}

// ── qk_norm_rope ─────────────────────────────────────────────────────────────

TEST_P(BadInput, QkNormRopeDomain) {
  expect_call_error(Op::QkNormRope, ErrorCode::InvalidArgument, "'head_dim'", [](OpArgs& a) {
    a.sizes["head_dim"] = 7;  // odd: no halves to rotate
  });
  expect_call_error(Op::QkNormRope, ErrorCode::InvalidArgument, "'mode'",
                    [](OpArgs& a) { a.mode = static_cast<RopeMode>(9); });
  expect_call_error(Op::QkNormRope, ErrorCode::NullBuffer, "'norm_w'", [](OpArgs& a) { a.null_norm_w = true; });
  expect_call_error(Op::QkNormRope, ErrorCode::ShapeMismatch, "'cos'", [](OpArgs& a) {
    a.shrink("cos", 3);  // less than one row of head_dim / 2 = 4, in both tables
    a.shrink("sin", 3);
  });
  // RopeOnly reads neither norm_w nor eps.
  {
    OpArgs a = make_args(backend(), op_spec(Op::QkNormRope));
    a.mode = RopeMode::RopeOnly;
    a.null_norm_w = true;
    a.eps = kNaN;
    EXPECT_NO_THROW(op_spec(Op::QkNormRope).call(backend(), a));
    backend().synchronize();
  }
}

TEST_P(BadInput, QkNormRopePositionsPastTable) {
  // The table has 6 positions; 3 tokens fit at offsets 0..3.
  expect_call_error(Op::QkNormRope, ErrorCode::CapacityExceeded, "'pos_offset' = 4, 'tokens' = 3",
                    [](OpArgs& a) { a.pos_offset = 4; });
  expect_call_error(Op::QkNormRope, ErrorCode::CapacityExceeded,
                    cat("'pos_offset' = ", std::numeric_limits<std::size_t>::max() - 1),
                    [](OpArgs& a) { a.pos_offset = std::numeric_limits<std::size_t>::max() - 1; });
  expect_call_error(Op::QkNormRope, ErrorCode::CapacityExceeded, "'tokens' = 7", [&](OpArgs& a) {
    a.sizes["tokens"] = 7;  // more tokens than the table has positions (buffers sized to match)
    a.buffers["input"] = zeros(backend(), DType::F16, 7 * 2 * 8);
    a.buffers["output"] = zeros(backend(), DType::F16, 7 * 2 * 8);
  });
  OpArgs a = make_args(backend(), op_spec(Op::QkNormRope));
  a.pos_offset = 3;  // the last three positions: legal
  EXPECT_NO_THROW(op_spec(Op::QkNormRope).call(backend(), a));
  backend().synchronize();
}

// ── kv_cache_append_head_major ───────────────────────────────────────────────

TEST_P(BadInput, KvAppendPastCapacity) {
  // Capacity 5, 2 new tokens: cache_len 0..3 fit.
  expect_call_error(Op::KvCacheAppendHeadMajor, ErrorCode::CapacityExceeded,
                    "'cache_len' = 4 + 'new_tokens' = 2 exceeds 'capacity' = 5", [](OpArgs& a) { a.cache_len = 4; });
  expect_call_error(Op::KvCacheAppendHeadMajor, ErrorCode::CapacityExceeded,
                    cat("'cache_len' = ", std::numeric_limits<std::size_t>::max()),
                    [](OpArgs& a) { a.cache_len = std::numeric_limits<std::size_t>::max(); });
  expect_call_error(Op::KvCacheAppendHeadMajor, ErrorCode::CapacityExceeded, "'new_tokens' = 6",
                    [&](OpArgs& a) {
                      a.sizes["new_tokens"] = 6;  // more than the whole capacity
                      a.buffers["new_k"] = zeros(backend(), DType::F16, 2 * 6 * 4);
                      a.buffers["new_v"] = zeros(backend(), DType::F16, 2 * 6 * 4);
                    });
  OpArgs a = make_args(backend(), op_spec(Op::KvCacheAppendHeadMajor));
  a.cache_len = 3;  // ends exactly at capacity: legal
  EXPECT_NO_THROW(op_spec(Op::KvCacheAppendHeadMajor).call(backend(), a));
  backend().synchronize();
}

// ── qkv_rope_append ──────────────────────────────────────────────────────────

TEST_P(BadInput, QkvRopeAppendDomainAndPositions) {
  const Op op = Op::QkvRopeAppend;
  expect_call_error(op, ErrorCode::InvalidArgument, "'cfg.head_dim'", [&](OpArgs& a) {
    a.sizes["cfg.head_dim"] = 7;  // odd: no halves to rotate (buffers still large enough)
  });
  expect_call_error(op, ErrorCode::InvalidArgument, "'cfg.mode'", [](OpArgs& a) { a.mode = static_cast<RopeMode>(9); });
  expect_call_error(op, ErrorCode::NullBuffer, "'q_norm'", [](OpArgs& a) { a.null_norm_w = true; });
  expect_call_error(op, ErrorCode::NullBuffer, "'k_norm'", [](OpArgs& a) { a.null_k_norm = true; });
  expect_call_error(op, ErrorCode::InvalidArgument, "'cfg.eps'", [](OpArgs& a) { a.eps = kNaN; });
  // Each head count fits 32 bits, a qkv row's heads do not.
  expect_call_error(op, ErrorCode::InvalidArgument, "'cfg.heads + 2 * cfg.kv_heads'",
                    [](OpArgs& a) { a.sizes["cfg.kv_heads"] = std::size_t{1} << 30; });
  // Each size fits 32 bits, qkv's element count (16 x (2^30 + 2) x 2^30)
  // does not fit 64: named, not wrapped around into a small buffer size.
  expect_call_error(op, ErrorCode::InvalidArgument,
                    "argument 'qkv' [tokens, (heads + 2 kv_heads) * head_dim] = 16 x ", [](OpArgs& a) {
                      a.sizes["tokens"] = 16;
                      a.sizes["cfg.heads"] = std::size_t{1} << 30;
                      a.sizes["cfg.head_dim"] = std::size_t{1} << 30;
                    });
  // Tables of 6 positions, caches of 5, 2 tokens: offsets 0..3 fit both.
  expect_call_error(op, ErrorCode::CapacityExceeded, "cfg.capacity", [](OpArgs& a) { a.pos_offset = 4; });
  expect_call_error(op, ErrorCode::CapacityExceeded, "cos/sin tables",
                    [](OpArgs& a) { a.pos_offset = std::numeric_limits<std::size_t>::max() - 1; });
  expect_call_error(op, ErrorCode::CapacityExceeded, "cos/sin tables", [](OpArgs& a) {
    a.sizes["cfg.capacity"] = 5;
    a.sizes["cfg.max_pos"] = 4;  // the tables end before the caches do
    a.pos_offset = 3;
  });
  {
    OpArgs a = make_args(backend(), op_spec(op));
    a.pos_offset = 3;  // ends exactly at the capacity: legal
    EXPECT_NO_THROW(op_spec(op).call(backend(), a));
    backend().synchronize();
  }
  {
    // RopeOnly reads neither norm nor eps.
    OpArgs a = make_args(backend(), op_spec(op));
    a.mode = RopeMode::RopeOnly;
    a.null_norm_w = true;
    a.null_k_norm = true;
    a.eps = kNaN;
    EXPECT_NO_THROW(op_spec(op).call(backend(), a));
    backend().synchronize();
  }
}

// qkv_rope_append_ragged shares the geometry and rope checks; its positions
// are device values (out of range: thrown by CpuBackend, reported at
// synchronize by CudaBackend; tests/cpu/test_qkv_rope_append.cpp and
// tests/gpu/test_ops_cuda.cpp).
TEST_P(BadInput, QkvRopeAppendRaggedDomain) {
  const Op op = Op::QkvRopeAppendRagged;
  expect_call_error(op, ErrorCode::InvalidArgument, "'cfg.head_dim'", [](OpArgs& a) { a.sizes["cfg.head_dim"] = 7; });
  expect_call_error(op, ErrorCode::InvalidArgument, "'cfg.mode'", [](OpArgs& a) { a.mode = static_cast<RopeMode>(9); });
  expect_call_error(op, ErrorCode::NullBuffer, "'q_norm'", [](OpArgs& a) { a.null_norm_w = true; });
  expect_call_error(op, ErrorCode::NullBuffer, "'k_norm'", [](OpArgs& a) { a.null_k_norm = true; });
  expect_call_error(op, ErrorCode::InvalidArgument, "'cfg.eps'", [](OpArgs& a) { a.eps = kNaN; });
  // Caches for 2 sequences: a batch of 3 needs more of every buffer.
  expect_call_error(op, ErrorCode::ShapeMismatch, "'qkv'", [](OpArgs& a) { a.sizes["batch"] = 3; });
}

// ── flash_attention ──────────────────────────────────────────────────────────

TEST_P(BadInput, FlashAttentionDomain) {
  expect_call_error(Op::FlashAttention, ErrorCode::CapacityExceeded, "cfg.kv_seq_stride",
                    [](OpArgs& a) { a.kv_seq_stride = 2; });  // kv_len 3 > stride 2
  // A stride past 32 bits is refused as a size before any buffer is sized by it.
  expect_call_error(Op::FlashAttention, ErrorCode::InvalidArgument, "'cfg.kv_seq_stride' = 2147483648",
                    [](OpArgs& a) { a.kv_seq_stride = kHuge; });
  expect_call_error(Op::FlashAttention, ErrorCode::InvalidArgument, "cfg.num_kv_heads",
                    [](OpArgs& a) { a.sizes["cfg.num_kv_heads"] = 3; });  // 4 heads are not groups of 3
  for (float scale : {kNaN, -0.5f, kInf, 1e30f, kMaxAttentionScale * 2.0f}) {
    SCOPED_TRACE(cat("scale=", scale));
    expect_call_error(Op::FlashAttention, ErrorCode::InvalidArgument, "cfg.scale",
                      [&](OpArgs& a) { a.scale = scale; });
  }
  // Causal queries at positions [2, 4) need keys up to 3, but kv_len is 3.
  expect_call_error(Op::FlashAttention, ErrorCode::InvalidArgument, "'pos_offset' = 2, 'q_len' = 2",
                    [](OpArgs& a) { a.pos_offset = 2; });
  // Size products that overflow 64 bits, each size within 32 bits.
  expect_call_error(Op::FlashAttention, ErrorCode::InvalidArgument, "overflow", [](OpArgs& a) {
    for (const char* n : {"batch", "q_len", "kv_len", "cfg.num_heads", "cfg.head_dim"}) a.sizes[n] = kHuge - 1;
    a.sizes["cfg.num_kv_heads"] = 1;
    a.causal = false;
  });
}

// flash_decode_ragged shares flash_attention's geometry checks: each reached
// through this op too (the GQA group, the scale), and its own (the stride it
// requires, zero sequences).
TEST_P(BadInput, FlashDecodeRaggedDomain) {
  const Op op = Op::FlashDecodeRagged;
  expect_call_error(op, ErrorCode::InvalidArgument, "cfg.num_kv_heads",
                    [](OpArgs& a) { a.sizes["cfg.num_kv_heads"] = 3; });  // 4 heads are not groups of 3
  for (float scale : {kNaN, -0.5f, kInf, 1e30f, kMaxAttentionScale * 2.0f}) {
    SCOPED_TRACE(cat("scale=", scale));
    expect_call_error(op, ErrorCode::InvalidArgument, "cfg.scale", [&](OpArgs& a) { a.scale = scale; });
  }
  expect_call_error(op, ErrorCode::InvalidArgument, "cfg.kv_seq_stride",
                    [](OpArgs& a) { a.sizes["cfg.kv_seq_stride"] = 0; });
  expect_call_error(op, ErrorCode::InvalidArgument, "'batch'", [](OpArgs& a) { a.sizes["batch"] = 0; });
}

// Device-state decode reads kv_len on the device: without kv_seq_stride the
// host kv_len would be baked into a captured graph.
TEST_P(BadInput, FlashAttentionDeviceStateNeedsAStride) {
  backend().set_device_state_mode(true);
  expect_call_error(Op::FlashAttention, ErrorCode::InvalidArgument, "cfg.kv_seq_stride", [](OpArgs& a) {
    a.sizes["q_len"] = 1;
    a.pos_offset = 2;
  });
  backend().set_device_state_mode(false);
}

// mla_attention (no backend implements it yet) checks its geometry all the
// same: each head size within 32 bits, their sum too, and the scale.
TEST_P(BadInput, MlaAttentionDomain) {
  const OpSpec& spec = op_spec(Op::MlaAttention);
  OpArgs a = make_args(backend(), spec);
  auto call = [&](const MlaConfig& cfg) {
    backend().mla_attention(a.buf("q"), a.buf("kv_latent"), a.buf("out"), a.size("batch"), a.size("q_len"),
                            a.size("kv_len"), cfg);
  };
  MlaConfig valid;
  valid.num_heads = a.size("cfg.num_heads");
  valid.kv_lora_rank = a.size("cfg.kv_lora_rank");
  valid.qk_nope_head_dim = 8;
  valid.qk_rope_head_dim = 4;  // the registry's latent: kv_lora_rank + 4
  valid.v_head_dim = a.size("cfg.v_head_dim");
  for (const auto& [name, field, value] :
       {std::tuple{"cfg.qk_rope_head_dim", &MlaConfig::qk_rope_head_dim, std::size_t{0}},
        std::tuple{"cfg.qk_rope_head_dim", &MlaConfig::qk_rope_head_dim, std::numeric_limits<std::size_t>::max() - 3},
        std::tuple{"cfg.qk_nope_head_dim", &MlaConfig::qk_nope_head_dim, std::size_t{0}},
        std::tuple{"cfg.kv_lora_rank + cfg.qk_rope_head_dim", &MlaConfig::qk_rope_head_dim, kHuge - 5}}) {
    SCOPED_TRACE(cat(name, " = ", value));
    MlaConfig cfg = valid;
    cfg.*field = value;
    expect_error(ErrorCode::InvalidArgument, "mla_attention", [&] { call(cfg); }, name);
  }
  for (float scale : {kNaN, -1.0f, kInf, 1e30f, kMaxAttentionScale * 2.0f}) {
    SCOPED_TRACE(cat("scale=", scale));
    MlaConfig cfg = valid;
    cfg.scale = scale;
    expect_error(ErrorCode::InvalidArgument, "mla_attention", [&] { call(cfg); }, "cfg.scale");
  }
}

TEST_P(BadInput, FlashAttentionLegalVariantsPassValidation) {
  // Non-causal with pos_offset past kv_len, and kv_seq_stride > kv_len, are
  // legal: the call reaches the backend (which may not implement it yet).
  for (int variant = 0; variant < 2; ++variant) {
    SCOPED_TRACE(variant == 0 ? "non-causal, pos_offset 100" : "kv_seq_stride 5 > kv_len 3");
    const OpSpec& spec = op_spec(Op::FlashAttention);
    OpArgs a = make_args(backend(), spec);
    if (variant == 0) {
      a.causal = false;
      a.pos_offset = 100;
    } else {
      a.kv_seq_stride = 5;
      a.buffers["k"] = zeros(backend(), DType::F16, 1 * 2 * 5 * 64);
      a.buffers["v"] = zeros(backend(), DType::F16, 1 * 2 * 5 * 64);
    }
    if (backend().supports(Op::FlashAttention)) {
      EXPECT_NO_THROW(spec.call(backend(), a));
    } else {
      expect_error(ErrorCode::Unsupported, "flash_attention", [&] { spec.call(backend(), a); });
    }
  }
}

// ── Quantized GEMM ───────────────────────────────────────────────────────────

constexpr Op kQuantOps[] = {Op::GemmGptq,           Op::GemmSiluMulGptq, Op::GemmQuant, Op::GemmGptqAddResidual,
                             Op::RmsNormGemmGptq, Op::RmsNormGemmSiluMulGptq};

TEST_P(BadInput, QuantWeightChecks) {
  for (Op op : kQuantOps) {
    SCOPED_TRACE(to_string(op));
    expect_call_error(op, ErrorCode::WrongBackend, "'w'", [&](OpArgs& a) {
      a.weight = std::make_unique<FakeQuantWeight>(&other(), QuantKind::Gptq, a.weight->k(), a.weight->n());
    });
  }
  for (Op op : {Op::GemmGptq, Op::GemmSiluMulGptq, Op::GemmGptqAddResidual, Op::RmsNormGemmGptq,
                Op::RmsNormGemmSiluMulGptq}) {
    SCOPED_TRACE(to_string(op));
    expect_call_error(op, ErrorCode::InvalidArgument, "quant kind Awq", [&](OpArgs& a) {
      a.weight = std::make_unique<FakeQuantWeight>(&backend(), QuantKind::Awq, a.weight->k(), a.weight->n());
    });
  }
  for (QuantKind kind : {QuantKind::Awq, QuantKind::Fp8}) {
    expect_call_error(Op::GemmQuant, ErrorCode::Unsupported, "'w'", [&](OpArgs& a) {
      a.weight = std::make_unique<FakeQuantWeight>(&backend(), kind, a.weight->k(), a.weight->n());
    });
  }
  // Every backend validates the checkpoint before anything else.
  GptqHostTensors empty;
  expect_error(ErrorCode::InvalidArgument, "load_gptq", [&] { (void)backend().load_gptq(empty); }, "argument 'k' = 0");
  // A weight that claims this backend but was not made by its load_gptq,
  // refused under the name of the op called.
  for (Op op : kQuantOps) {
    if (!backend().supports(op)) continue;
    expect_call_error(op, ErrorCode::InvalidArgument, "'w'", [&](OpArgs& a) {
      a.weight = std::make_unique<FakeQuantWeight>(&backend(), QuantKind::Gptq, a.weight->k(), a.weight->n());
    });
  }
}

// A weight whose backend was destroyed reports none, and every quantized op
// refuses it (a later backend at the same address must not pass for it).
TEST_P(BadInput, WeightOfADestroyedBackendIsRefused) {
  for (Op op : kQuantOps) {
    SCOPED_TRACE(to_string(op));
    std::unique_ptr<Backend> gone = make_backend(GetParam());
    OpArgs from_gone = make_args(*gone, op_spec(op));
    std::unique_ptr<QuantWeight> w = std::move(from_gone.weight);
    const bool real = gone->supports(Op::LoadGptq);
    from_gone = OpArgs{};  // its buffers freed while their backend lives
    gone.reset();
    if (real) {
      EXPECT_EQ(w->backend(), nullptr);
    } else {
      w = std::make_unique<FakeQuantWeight>(nullptr, QuantKind::Gptq, w->k(), w->n());
    }
    expect_call_error(op, ErrorCode::WrongBackend, "since destroyed", [&](OpArgs& a) { a.weight = std::move(w); });
  }
}

// ── The overlap rule (backend.hpp, "Outputs and inputs") ────────────────────

// For every op and every written buffer O (output or in/out) against every
// other buffer B of the call: both placed at the start of one fresh
// allocation, as views of their own dtype and length; then B at the start
// and O one element further (a partial overlap). The op refuses both
// (InvalidArgument naming O and B): no op runs in place.
TEST_P(BadInput, OutputsOverlappingInputsAreRefused) {
  std::size_t pairs = 0;
  for (const OpSpec& spec : op_specs()) {
    if (spec.own_overlap_rule) continue;
    for (const BufferArg& o : spec.buffers) {
      if (!o.written()) continue;
      for (const BufferArg& b : spec.buffers) {
        if (&b == &o) continue;
        ++pairs;
        const std::size_t o_bytes = o.numel * size_of(o.dtype), b_bytes = b.numel * size_of(b.dtype);
        const std::size_t shift = size_of(o.dtype);
        Buffer base = zeros(backend(), DType::U8, std::max(o_bytes, b_bytes) + shift);
        auto* bytes = static_cast<std::uint8_t*>(base.data());
        OpArgs a = make_args(backend(), spec);
        a.buffers[b.name] = Buffer::wrap(backend(), bytes, b.dtype, b.numel);
        for (std::size_t offset : {std::size_t{0}, shift}) {
          SCOPED_TRACE(cat(spec.name, ": '", o.name, "' on '", b.name, "' at byte ", offset));
          a.buffers[o.name] = Buffer::wrap(backend(), bytes + offset, o.dtype, o.numel);
          expect_error(ErrorCode::InvalidArgument, spec.name, [&] { spec.call(backend(), a); }, cat("'", o.name, "'"));
          expect_error(ErrorCode::InvalidArgument, spec.name, [&] { spec.call(backend(), a); }, cat("'", b.name, "'"));
        }
      }
    }
  }
  EXPECT_GE(pairs, 100u) << "the op table lost its outputs";
}

// ── Misalignment: Buffer::wrap refuses pointers off the element grid ─────────

TEST_P(BadInput, MisalignedWrap) {
  Buffer base = zeros(backend(), DType::U8, 64);
  auto* bytes = static_cast<std::uint8_t*>(base.data());
  for (DType dt : {DType::F16, DType::BF16, DType::F32, DType::I32}) {
    for (std::size_t off = 1; off < size_of(dt); ++off) {
      SCOPED_TRACE(cat(to_string(dt), " at byte offset ", off));
      expect_error(ErrorCode::Misaligned, "Buffer::wrap", [&] { (void)Buffer::wrap(backend(), bytes + off, dt, 4); },
                   "'ptr'");
    }
    // On the element grid it is accepted, and an op takes it.
    EXPECT_NO_THROW((void)Buffer::wrap(backend(), bytes + size_of(dt), dt, 4));
  }
  EXPECT_NO_THROW((void)Buffer::wrap(backend(), bytes + 1, DType::U8, 4));  // u8 has no alignment
  expect_error(ErrorCode::NullBuffer, "Buffer::wrap", [&] { (void)Buffer::wrap(backend(), nullptr, DType::F16, 4); },
               "'ptr'");
  // A wrapped, element-aligned but not 16-byte-aligned buffer is a legal op argument.
  Buffer x = Buffer::wrap(backend(), bytes + 2, DType::F16, 8);
  Buffer y = Buffer::wrap(backend(), bytes + 34, DType::F16, 8);
  EXPECT_NO_THROW(backend().add_inplace(x, y, 8));
  backend().synchronize();
}

// ── Host-side buffer API ─────────────────────────────────────────────────────

TEST_P(BadInput, AllocSizes) {
  expect_error(ErrorCode::InvalidArgument, "alloc", [&] { (void)backend().alloc(DType::F16, 0); }, "'numel'");
  // A value outside the DType enum (its element size would be 0).
  const auto bad = static_cast<DType>(9);
  expect_error(ErrorCode::InvalidArgument, "alloc", [&] { (void)backend().alloc(bad, 4); }, "'dtype'");
  const std::vector<float> four(4, 1.0f);
  expect_error(ErrorCode::InvalidArgument, "upload", [&] { (void)backend().upload(four, bad); }, "'dtype'");
  Buffer base = zeros(backend(), DType::U8, 16);
  expect_error(ErrorCode::InvalidArgument, "Buffer::wrap", [&] { (void)Buffer::wrap(backend(), base.data(), bad, 4); },
               "'dtype'");
  // An element count whose byte size overflows 64 bits: the message names
  // the argument and the sizes.
  const std::string half_max = std::to_string(std::numeric_limits<std::size_t>::max() / 2);
  expect_error(ErrorCode::InvalidArgument, "alloc",
               [&] { (void)backend().alloc(DType::F32, std::numeric_limits<std::size_t>::max() / 2); },
               {"'numel'", half_max + " x 4", "overflows 64 bits"});
  // The same rules for host memory.
  expect_error(ErrorCode::InvalidArgument, "alloc_host", [&] { (void)backend().alloc_host(DType::I32, 0); }, "'numel'");
  expect_error(ErrorCode::InvalidArgument, "alloc_host", [&] { (void)backend().alloc_host(bad, 4); }, "'dtype'");
  expect_error(ErrorCode::InvalidArgument, "alloc_host",
               [&] { (void)backend().alloc_host(DType::F32, std::numeric_limits<std::size_t>::max() / 2); },
               {"'numel'", half_max + " x 4", "overflows 64 bits"});
}

TEST_P(BadInput, WriteAndReadBounds) {
  Buffer b = zeros(backend(), DType::F16, 8);
  const std::vector<float> nine(9, 1.0f), four(4, 1.0f);
  std::vector<std::uint8_t> host(32);
  expect_error(ErrorCode::ShapeMismatch, "write", [&] { backend().write(b, nine); }, "'dst'");
  expect_error(ErrorCode::ShapeMismatch, "write", [&] { backend().write(b, four, 5); }, "'dst'");
  expect_error(ErrorCode::ShapeMismatch, "write_bytes", [&] { backend().write_bytes(b, host.data(), 17); }, "'dst'");
  expect_error(ErrorCode::ShapeMismatch, "write_bytes", [&] { backend().write_bytes(b, host.data(), 2, 15); }, "'dst'");
  expect_error(ErrorCode::NullBuffer, "write_bytes", [&] { backend().write_bytes(b, nullptr, 2); }, "'host'");
  expect_error(ErrorCode::ShapeMismatch, "download", [&] { (void)backend().download(b, 9); }, "'count'");
  expect_error(ErrorCode::ShapeMismatch, "read_bytes", [&] { backend().read_bytes(b, host.data(), 17); }, "'src'");
  expect_error(ErrorCode::ShapeMismatch, "read_bytes", [&] { backend().read_bytes(b, host.data(), 4, 14); }, "'src'");
  expect_error(ErrorCode::NullBuffer, "read_bytes", [&] { backend().read_bytes(b, nullptr, 2); }, "'host'");
  // Null and foreign buffers.
  Buffer null;
  Buffer foreign = zeros(other(), DType::F16, 8);
  expect_error(ErrorCode::NullBuffer, "write", [&] { backend().write(null, four); }, "'dst'");
  expect_error(ErrorCode::WrongBackend, "write", [&] { backend().write(foreign, four); }, "'dst'");
  expect_error(ErrorCode::NullBuffer, "download", [&] { (void)backend().download(null, 0); }, "'src'");
  expect_error(ErrorCode::WrongBackend, "download", [&] { (void)backend().download(foreign, 4); }, "'src'");
  expect_error(ErrorCode::WrongBackend, "read_bytes", [&] { backend().read_bytes(foreign, host.data(), 2); }, "'src'");
  expect_error(ErrorCode::WrongBackend, "write_bytes", [&] { backend().write_bytes(foreign, host.data(), 2); }, "'dst'");
}

TEST_P(BadInput, CopySliceRanges) {
  // Offsets are not size arguments: ranges running past either buffer are ShapeMismatch.
  expect_call_error(Op::CopySlice, ErrorCode::ShapeMismatch, "'src'", [&](OpArgs& a) {
    a.buffers["dst"] = zeros(backend(), DType::F16, 20);
    a.sizes["len"] = 7;
  });
  Buffer src = zeros(backend(), DType::F16, 6), dst = zeros(backend(), DType::F16, 6);
  expect_error(ErrorCode::ShapeMismatch, "copy_slice", [&] { backend().copy_slice(src, 1, dst, 0, 6); }, "'src'");
  expect_error(ErrorCode::ShapeMismatch, "copy_slice", [&] { backend().copy_slice(src, 0, dst, 1, 6); }, "'dst'");
  expect_error(ErrorCode::ShapeMismatch, "copy_slice", [&] { backend().copy_slice(src, 7, dst, 0, 1); }, "'src'");
  expect_error(ErrorCode::ShapeMismatch, "copy_slice",
               [&] { backend().copy_slice(src, 0, dst, std::numeric_limits<std::size_t>::max(), 1); }, "'dst'");
  // A range whose end would pass 2^64 is written as offset + len, not as the wrapped sum.
  expect_error(ErrorCode::ShapeMismatch, "copy_slice",
               [&] { backend().copy_slice(src, std::numeric_limits<std::size_t>::max(), dst, 0, 2); },
               "range [18446744073709551615, 18446744073709551615 + 2) runs past 'src'");
}

// Views of one buffer: ranges that share bytes without being the same are
// refused (a device-to-device copy is undefined there), on every backend
// alike; the same range is already in place; disjoint ranges copy. The
// world-size-1 collectives, which copy, follow the same rule.
TEST_P(BadInput, CopySliceOverlap) {
  std::vector<float> values(16);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  Buffer whole = backend().upload(values, DType::F32);
  Buffer front = whole.view(0, 10), back = whole.view(4, 10);
  expect_error(ErrorCode::InvalidArgument, "copy_slice", [&] { backend().copy_slice(front, 0, back, 0, 8); },
               "overlaps");
  expect_error(ErrorCode::InvalidArgument, "copy_slice", [&] { backend().copy_slice(whole, 3, whole, 1, 4); },
               "overlaps");
  expect_error(ErrorCode::InvalidArgument, "reduce_scatter",
               [&] { backend().reduce_scatter(front, back, 8, ReduceOp::Sum); }, "overlaps");
  expect_error(ErrorCode::InvalidArgument, "all_gather", [&] { backend().all_gather(front, back, 8); }, "overlaps");
  backend().copy_slice(whole, 2, whole, 2, 5);  // the same range
  backend().copy_slice(front, 4, back, 0, 6);   // the same bytes through two views
  backend().reduce_scatter(whole, whole, 16, ReduceOp::Sum);  // in place
  backend().all_gather(whole, whole, 16);                     // in place
  EXPECT_EQ(backend().download(whole), values);
  backend().copy_slice(whole, 0, whole, 8, 8);  // disjoint halves of one buffer
  for (std::size_t i = 8; i < 16; ++i) values[i] = static_cast<float>(i - 8);
  EXPECT_EQ(backend().download(whole), values);
}

TEST_P(BadInput, DecodeStateDomain) {
  expect_error(ErrorCode::InvalidArgument, "set_decode_state", [&] { backend().set_decode_state(0x80000000u, 0); },
               "'token'");
  expect_error(ErrorCode::InvalidArgument, "set_decode_state", [&] { backend().set_decode_state(0, 0x7fffffffu); },
               "'step'");
  EXPECT_NO_THROW(backend().set_decode_state(0x7fffffffu, 0x7ffffffeu));  // the largest legal values
  backend().synchronize();
}

TEST_P(BadInput, GraphCaptureStateErrors) {
  expect_error(ErrorCode::GraphCapture, "end_graph_capture", [&] { backend().end_graph_capture(); });
  EXPECT_FALSE(backend().is_capturing());
  if (!backend().supports(Op::GraphCapture)) {
    expect_error(ErrorCode::Unsupported, "begin_graph_capture", [&] { backend().begin_graph_capture(); });
    EXPECT_FALSE(backend().is_capturing());
    EXPECT_FALSE(backend().replay_last_graph());
    EXPECT_NO_THROW(backend().reset_graph());
  }
}

FERRUM_INSTANTIATE_ON_ALL_BACKENDS(BadInput);

}  // namespace
}  // namespace ferrum::test
