#include "support/op_registry.hpp"

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "support/op_runners.hpp"

namespace ferrum::test {

namespace {

constexpr DType kH = DType::F16;
constexpr DType kBad = DType::I32;  // not an activation dtype

// A buffer argument that must hold exactly `numel` elements of f16.
BufferArg act(std::string name, std::size_t numel) { return {std::move(name), kH, numel, numel - 1, kBad}; }
// `b` as an op's output, or as a buffer it reads and writes.
BufferArg output(BufferArg b) {
  b.role = Role::Output;
  return b;
}
BufferArg inout(BufferArg b) {
  b.role = Role::InOut;
  return b;
}
BufferArg input(BufferArg b) {
  b.role = Role::Input;
  return b;
}

// Small valid sizes, distinct so a mix-up shows.
constexpr std::size_t kTokens = 3, kDim = 8, kVocab = 5;
constexpr std::size_t kQDim = 8, kKvDim = 4;
constexpr std::size_t kHeads = 2, kHeadDim = 8, kMaxPos = 6;
constexpr std::size_t kNkv = 2, kCapacity = 5, kNewTokens = 2, kHd = 4;
constexpr std::size_t kBatch = 1, kQLen = 2, kKvLen = 3, kNumHeads = 4, kNumKvHeads = 2,
                      kAttnHd = 64;  // a head_dim every backend implements
constexpr std::size_t kM = 2, kN = 8, kK = 16;
constexpr std::size_t kLoraRank = 8, kRopeDim = 4, kVHeadDim = 8;

QkvRopeAppendConfig qkv_rope_append_config(const OpArgs& a) {
  return {.heads = a.size("cfg.heads"),
          .kv_heads = a.size("cfg.kv_heads"),
          .head_dim = a.size("cfg.head_dim"),
          .capacity = a.size("cfg.capacity"),
          .max_pos = a.size("cfg.max_pos"),
          .eps = a.eps,
          .mode = a.mode};
}

// qkv_rope_append's two forms: heads 2, kv_heads 1 (q | k | v rows of 4
// heads of kHeadDim), `rows` tokens, caches for `seqs` sequences; the
// geometry with the token count named `count_name`.
constexpr std::size_t kQkvKv = 1;
std::vector<BufferArg> qkv_rope_buffers(std::size_t rows, std::size_t seqs) {
  const std::size_t table = kMaxPos * kHeadDim / 2;
  const std::size_t cache = seqs * kQkvKv * kCapacity * kHeadDim;
  return {act("qkv", rows * (kHeads + 2 * kQkvKv) * kHeadDim),
          act("q_norm", kHeadDim),
          act("k_norm", kHeadDim),
          {"cos", DType::F32, table, table - 1, kH},
          {"sin", DType::F32, table, table - 1, kH},
          output(act("q_out", kHeads * rows * kHeadDim)),
          inout(act("k_cache", cache)),
          inout(act("v_cache", cache))};
}
std::vector<SizeArg> qkv_rope_sizes(const char* count_name, std::size_t count) {
  return {{count_name, count},        {"cfg.heads", kHeads},       {"cfg.kv_heads", kQkvKv},
          {"cfg.head_dim", kHeadDim}, {"cfg.capacity", kCapacity}, {"cfg.max_pos", kMaxPos}};
}

std::vector<OpSpec> build_specs() {
  std::vector<OpSpec> s;
  s.push_back({Op::CopySlice, "copy_slice", {act("src", 6), output(act("dst", 6))}, {{"len", 6}},
               [](Backend& be, OpArgs& a) { be.copy_slice(a.buf("src"), 0, a.buf("dst"), 0, a.size("len")); },
               /*own_overlap_rule=*/true});
  s.push_back({Op::RmsNorm, "rms_norm", {act("x", kTokens * kDim), act("w", kDim), output(act("out", kTokens * kDim))},
               {{"tokens", kTokens}, {"dim", kDim}}, [](Backend& be, OpArgs& a) {
                 be.rms_norm(a.buf("x"), a.buf("w"), a.eps, a.buf("out"), a.size("tokens"), a.size("dim"));
               }});
  s.push_back({Op::FusedAddRmsNorm, "fused_add_rms_norm",
               {inout(act("residual", kTokens * kDim)), act("x", kTokens * kDim), act("w", kDim),
                output(act("out", kTokens * kDim))},
               {{"tokens", kTokens}, {"dim", kDim}}, [](Backend& be, OpArgs& a) {
                 be.fused_add_rms_norm(a.buf("residual"), a.buf("x"), a.buf("w"), a.eps, a.buf("out"),
                                       a.size("tokens"), a.size("dim"));
               }});
  s.push_back({Op::LayerNorm, "layer_norm",
               {act("x", kTokens * kDim), act("gamma", kDim), act("beta", kDim), output(act("out", kTokens * kDim))},
               {{"tokens", kTokens}, {"dim", kDim}}, [](Backend& be, OpArgs& a) {
                 be.layer_norm(a.buf("x"), a.buf("gamma"), a.buf("beta"), a.eps, a.buf("out"), a.size("tokens"),
                               a.size("dim"));
               }});
  s.push_back({Op::Gelu, "gelu", {act("x", 10), output(act("out", 10))}, {{"len", 10}},
               [](Backend& be, OpArgs& a) { be.gelu(a.buf("x"), a.buf("out"), a.size("len"), a.approx); }});
  s.push_back({Op::AddBias, "add_bias", {inout(act("data", kTokens * kDim)), act("bias", kDim)},
               {{"rows", kTokens}, {"cols", kDim}},
               [](Backend& be, OpArgs& a) { be.add_bias(a.buf("data"), a.buf("bias"), a.size("rows"), a.size("cols")); }});
  s.push_back({Op::AddInplace, "add_inplace", {inout(act("residual", 10)), act("x", 10)}, {{"len", 10}},
               [](Backend& be, OpArgs& a) { be.add_inplace(a.buf("residual"), a.buf("x"), a.size("len")); }});
  s.push_back({Op::Argmax, "argmax", {act("x", kTokens * kVocab), output({"out", DType::I32, kTokens, kTokens - 1, kH})},
               {{"rows", kTokens}, {"cols", kVocab}},
               [](Backend& be, OpArgs& a) { be.argmax(a.buf("x"), a.buf("out"), a.size("rows"), a.size("cols")); }});
  // From position 0, so that the valid call's write (token_log[1]) is in
  // range whatever an earlier test left in the decode state.
  s.push_back({Op::AdvanceDecodeState, "advance_decode_state",
               {{"next_token", DType::I32, 1, 0, DType::F32},
                inout({"token_log", DType::I32, kTokens, 1, DType::F32})},
               {},
               [](Backend& be, OpArgs& a) {
                 be.set_decode_state(0, 0);
                 be.advance_decode_state(a.buf("next_token"), a.buf("token_log"));
               },
               /*own_overlap_rule=*/true});
  s.push_back({Op::Gemm, "gemm", {act("a", kM * kK), act("b", kN * kK), output(act("out", kM * kN))},
               {{"m", kM}, {"n", kN}, {"k", kK}}, [](Backend& be, OpArgs& a) {
                 be.gemm(a.buf("a"), a.buf("b"), a.buf("out"), a.size("m"), a.size("n"), a.size("k"));
               }});
  s.push_back({Op::GemmSiluMul, "gemm_silu_mul",
               {act("a", kM * kK), act("w", 2 * kN * kK), output(act("gate_up", kM * 2 * kN)),
                output(act("act", kM * kN))},
               {{"m", kM}, {"im", kN}, {"k", kK}}, [](Backend& be, OpArgs& a) {
                 be.gemm_silu_mul(a.buf("a"), a.buf("w"), a.buf("gate_up"), a.buf("act"), a.size("m"), a.size("im"),
                                  a.size("k"));
               }});
  s.push_back({Op::EmbeddingLookup, "embedding_lookup",
               {{"table", kH, kVocab * kDim, kVocab * kDim - 1, kBad},
                {"ids", DType::I32, kTokens, kTokens - 1, DType::F32},
                output(act("out", kTokens * kDim))},
               {{"tokens", kTokens}, {"dim", kDim}, {"vocab", kVocab}}, [](Backend& be, OpArgs& a) {
                 be.embedding_lookup(a.buf("table"), a.buf("ids"), a.buf("out"), a.size("tokens"), a.size("dim"),
                                     a.size("vocab"));
               }});
  s.push_back({Op::SplitQkv, "split_qkv",
               {act("qkv", kTokens * (kQDim + 2 * kKvDim)), output(act("q", kTokens * kQDim)),
                output(act("k", kTokens * kKvDim)), output(act("v", kTokens * kKvDim))},
               {{"tokens", kTokens}, {"q_dim", kQDim}, {"kv_dim", kKvDim}}, [](Backend& be, OpArgs& a) {
                 be.split_qkv(a.buf("qkv"), a.buf("q"), a.buf("k"), a.buf("v"), a.size("tokens"), a.size("q_dim"),
                              a.size("kv_dim"));
               }});
  s.push_back({Op::FusedSiluMulSplit, "fused_silu_mul_split",
               {act("gate_up", kTokens * 2 * kDim), output(act("out", kTokens * kDim))},
               {{"tokens", kTokens}, {"im", kDim}},
               [](Backend& be, OpArgs& a) {
                 be.fused_silu_mul_split(a.buf("gate_up"), a.buf("out"), a.size("tokens"), a.size("im"));
               }});
  const std::size_t table = kMaxPos * kHeadDim / 2;
  s.push_back({Op::QkNormRope, "qk_norm_rope",
               {act("input", kTokens * kHeads * kHeadDim), act("norm_w", kHeadDim),
                {"cos", DType::F32, table, table - 1, kH}, {"sin", DType::F32, table, table - 1, kH},
                output(act("output", kTokens * kHeads * kHeadDim))},
               {{"tokens", kTokens}, {"heads", kHeads}, {"head_dim", kHeadDim}, {"max_pos", kMaxPos}},
               [](Backend& be, OpArgs& a) {
                 be.qk_norm_rope(a.buf("input"), a.null_norm_w ? nullptr : &a.buf("norm_w"), a.buf("cos"),
                                 a.buf("sin"), a.buf("output"), a.size("tokens"), a.size("heads"),
                                 a.size("head_dim"), a.pos_offset, a.size("max_pos"), a.eps, a.mode);
               }});
  s.push_back({Op::KvCacheAppendHeadMajor, "kv_cache_append_head_major",
               {inout(act("cache_k", kNkv * kCapacity * kHd)), inout(act("cache_v", kNkv * kCapacity * kHd)),
                act("new_k", kNkv * kNewTokens * kHd), act("new_v", kNkv * kNewTokens * kHd)},
               {{"capacity", kCapacity}, {"new_tokens", kNewTokens}, {"nkv", kNkv}, {"hd", kHd}},
               [](Backend& be, OpArgs& a) {
                 be.kv_cache_append_head_major(a.buf("cache_k"), a.buf("cache_v"), a.cache_len, a.size("capacity"),
                                               a.buf("new_k"), a.buf("new_v"), a.size("new_tokens"), a.size("nkv"),
                                               a.size("hd"));
               }});
  {
    constexpr std::size_t kSeqs = 2;  // ragged: positions written by make_args, 0 and the last cache row
    std::vector<BufferArg> ragged = qkv_rope_buffers(kSeqs, kSeqs);
    ragged.push_back({"positions", DType::I32, kSeqs, kSeqs - 1, DType::F32});
    s.push_back({Op::QkvRopeAppend, "qkv_rope_append", qkv_rope_buffers(kNewTokens, 1),
                 qkv_rope_sizes("tokens", kNewTokens), [](Backend& be, OpArgs& a) {
                   be.qkv_rope_append(a.buf("qkv"), a.null_norm_w ? nullptr : &a.buf("q_norm"),
                                      a.null_k_norm ? nullptr : &a.buf("k_norm"),
                                      a.buf("cos"), a.buf("sin"), a.buf("q_out"), a.buf("k_cache"),
                                      a.buf("v_cache"), a.size("tokens"), a.pos_offset, qkv_rope_append_config(a));
                 }});
    s.push_back({Op::QkvRopeAppendRagged, "qkv_rope_append_ragged", std::move(ragged), qkv_rope_sizes("batch", kSeqs),
                 [](Backend& be, OpArgs& a) {
                   be.qkv_rope_append_ragged(a.buf("qkv"), a.null_norm_w ? nullptr : &a.buf("q_norm"),
                                             a.null_k_norm ? nullptr : &a.buf("k_norm"), a.buf("cos"), a.buf("sin"),
                                             a.buf("q_out"), a.buf("k_cache"), a.buf("v_cache"), a.buf("positions"),
                                             a.size("batch"), qkv_rope_append_config(a));
                 }});
  }
  s.push_back({Op::TransposeHeadToToken, "transpose_head_to_token",
               {act("src", kTokens * kHeads * kHeadDim), output(act("dst", kTokens * kHeads * kHeadDim))},
               {{"tokens", kTokens}, {"heads", kHeads}, {"dim", kHeadDim}}, [](Backend& be, OpArgs& a) {
                 be.transpose_head_to_token(a.buf("src"), a.buf("dst"), a.size("tokens"), a.size("heads"),
                                            a.size("dim"));
               }});
  const std::size_t qn = kBatch * kNumHeads * kQLen * kAttnHd, kvn = kBatch * kNumKvHeads * kKvLen * kAttnHd;
  s.push_back({Op::FlashAttention, "flash_attention", {act("q", qn), act("k", kvn), act("v", kvn), output(act("out", qn))},
               {{"batch", kBatch},
                {"q_len", kQLen},
                {"kv_len", kKvLen},
                {"cfg.num_heads", kNumHeads},
                {"cfg.num_kv_heads", kNumKvHeads},
                {"cfg.head_dim", kAttnHd}},
               [](Backend& be, OpArgs& a) {
                 AttnConfig cfg = attn_config(a.size("cfg.num_heads"), a.size("cfg.num_kv_heads"),
                                              a.size("cfg.head_dim"), a.kv_seq_stride);
                 cfg.causal = a.causal;
                 cfg.scale = a.scale;
                 be.flash_attention(a.buf("q"), a.buf("k"), a.buf("v"), a.buf("out"), a.size("batch"),
                                    a.size("q_len"), a.size("kv_len"), a.pos_offset, cfg);
               }});
  {
    constexpr std::size_t kRaggedBatch = 2, kCap = 5;
    const std::size_t rq = kRaggedBatch * kNumHeads * kAttnHd, rkv = kRaggedBatch * kNumKvHeads * kCap * kAttnHd;
    s.push_back({Op::FlashDecodeRagged, "flash_decode_ragged",
                 {act("q", rq), act("k", rkv), act("v", rkv), output(act("out", rq)),
                  {"kv_lens", DType::I32, kRaggedBatch, kRaggedBatch - 1, DType::F32}},
                 {{"batch", kRaggedBatch},
                  {"cfg.num_heads", kNumHeads},
                  {"cfg.num_kv_heads", kNumKvHeads},
                  {"cfg.head_dim", kAttnHd},
                  {"cfg.kv_seq_stride", kCap}},
                 [](Backend& be, OpArgs& a) {
                   AttnConfig cfg = attn_config(a.size("cfg.num_heads"), a.size("cfg.num_kv_heads"),
                                                a.size("cfg.head_dim"), a.size("cfg.kv_seq_stride"));
                   cfg.scale = a.scale;
                   be.flash_decode_ragged(a.buf("q"), a.buf("k"), a.buf("v"), a.buf("out"), a.buf("kv_lens"),
                                          a.size("batch"), cfg);
                 }});
  }
  const std::size_t latent = kLoraRank + kRopeDim;
  s.push_back({Op::MlaAttention, "mla_attention",
               {act("q", kBatch * kNumHeads * kQLen * latent), act("kv_latent", kBatch * kKvLen * latent),
                output(act("out", kBatch * kNumHeads * kQLen * kVHeadDim))},
               {{"batch", kBatch},
                {"q_len", kQLen},
                {"kv_len", kKvLen},
                {"cfg.num_heads", kNumHeads},
                {"cfg.kv_lora_rank", kLoraRank},
                {"cfg.v_head_dim", kVHeadDim}},
               [](Backend& be, OpArgs& a) {
                 MlaConfig cfg;
                 cfg.num_heads = a.size("cfg.num_heads");
                 cfg.kv_lora_rank = a.size("cfg.kv_lora_rank");
                 cfg.qk_nope_head_dim = 8;
                 cfg.qk_rope_head_dim = kRopeDim;
                 cfg.v_head_dim = a.size("cfg.v_head_dim");
                 be.mla_attention(a.buf("q"), a.buf("kv_latent"), a.buf("out"), a.size("batch"), a.size("q_len"),
                                  a.size("kv_len"), cfg);
               }});
  s.push_back({Op::GemmGptq, "gemm_gptq", {act("a", kM * kK), output(act("out", kM * kN))}, {{"m", kM}},
               [](Backend& be, OpArgs& a) { be.gemm_gptq(a.buf("a"), *a.weight, a.buf("out"), a.size("m")); }});
  s.push_back({Op::GemmSiluMulGptq, "gemm_silu_mul_gptq",
               {act("a", kM * kK), output(act("gate_up", kM * kN)), output(act("act", kM * kN / 2))}, {{"m", kM}},
               [](Backend& be, OpArgs& a) {
                 be.gemm_silu_mul_gptq(a.buf("a"), *a.weight, a.buf("gate_up"), a.buf("act"), a.size("m"));
               }});
  // The row_sq ops: f32 [rows, ceil(cols / 16)] beside the activations.
  auto row_sq = [](std::size_t rows, std::size_t cols) {
    const std::size_t numel = rows * row_sq_groups(cols);
    return BufferArg{"row_sq", DType::F32, numel, numel - 1, kH, Role::Output};
  };
  s.push_back({Op::RowSumSquares, "row_sum_squares", {act("x", kTokens * kDim), row_sq(kTokens, kDim)},
               {{"rows", kTokens}, {"cols", kDim}}, [](Backend& be, OpArgs& a) {
                 be.row_sum_squares(a.buf("x"), a.buf("row_sq"), a.size("rows"), a.size("cols"));
               }});
  s.push_back({Op::GemmGptqAddResidual, "gemm_gptq_add_residual",
               {act("a", kM * kK), output(act("out", kM * kN)), inout(act("residual", kM * kN)), row_sq(kM, kN)},
               {{"m", kM}},
               [](Backend& be, OpArgs& a) {
                 be.gemm_gptq_add_residual(a.buf("a"), *a.weight, a.buf("out"), a.buf("residual"), a.buf("row_sq"),
                                           a.size("m"));
               }});
  s.push_back({Op::RmsNormGemmGptq, "rms_norm_gemm_gptq",
               {act("x", kM * kK), input(row_sq(kM, kK)), act("norm_w", kK), output(act("normed", kM * kK)),
                output(act("out", kM * kN))},
               {{"m", kM}}, [](Backend& be, OpArgs& a) {
                 be.rms_norm_gemm_gptq(a.buf("x"), a.buf("row_sq"), a.buf("norm_w"), a.eps, *a.weight,
                                       a.buf("normed"), a.buf("out"), a.size("m"));
               }});
  s.push_back({Op::RmsNormGemmSiluMulGptq, "rms_norm_gemm_silu_mul_gptq",
               {act("x", kM * kK), input(row_sq(kM, kK)), act("norm_w", kK), output(act("normed", kM * kK)),
                output(act("gate_up", kM * kN)), output(act("act", kM * kN / 2))},
               {{"m", kM}}, [](Backend& be, OpArgs& a) {
                 be.rms_norm_gemm_silu_mul_gptq(a.buf("x"), a.buf("row_sq"), a.buf("norm_w"), a.eps, *a.weight,
                                                a.buf("normed"), a.buf("gate_up"), a.buf("act"), a.size("m"));
               }});
  s.push_back({Op::GemmQuant, "gemm_quant", {act("a", kM * kK), output(act("out", kM * kN))}, {{"m", kM}},
               [](Backend& be, OpArgs& a) { be.gemm_quant(a.buf("a"), *a.weight, a.buf("out"), a.size("m")); }});
  // Collectives take f32 as well: use it, so the activation-only ops are not the only dtype path.
  s.push_back({Op::AllReduce, "all_reduce", {inout({"buf", DType::F32, 10, 9, kBad})}, {{"len", 10}},
               [](Backend& be, OpArgs& a) { be.all_reduce(a.buf("buf"), a.size("len"), a.reduce); }, /*own_overlap_rule=*/true});
  s.push_back({Op::AllGather, "all_gather", {act("local", 10), output(act("global", 10))}, {{"local_len", 10}},
               [](Backend& be, OpArgs& a) { be.all_gather(a.buf("local"), a.buf("global"), a.size("local_len")); },
               /*own_overlap_rule=*/true});
  s.push_back({Op::Broadcast, "broadcast", {inout(act("buf", 10))}, {{"len", 10}},
               [](Backend& be, OpArgs& a) { be.broadcast(a.buf("buf"), a.size("len"), a.src_rank); }, /*own_overlap_rule=*/true});
  s.push_back({Op::ReduceScatter, "reduce_scatter", {act("input", 10), output(act("output", 10))}, {{"len", 10}},
               [](Backend& be, OpArgs& a) {
                 be.reduce_scatter(a.buf("input"), a.buf("output"), a.size("len"), a.reduce);
               },
               /*own_overlap_rule=*/true});
  return s;
}

}  // namespace

const std::vector<OpSpec>& op_specs() {
  static const std::vector<OpSpec> specs = build_specs();
  return specs;
}

const OpSpec& op_spec(Op op) {
  for (const OpSpec& s : op_specs()) {
    if (s.op == op) return s;
  }
  throw std::out_of_range(cat("op_spec: no spec for ", to_string(op)));
}

Buffer zeros(Backend& backend, DType dtype, std::size_t numel) {
  Buffer b = backend.alloc(dtype, numel);
  const std::vector<std::uint8_t> zero(b.nbytes(), 0);
  backend.write_bytes(b, zero.data(), zero.size());
  return b;
}

// A well-formed 4-bit GPTQ checkpoint (one group of -1, symmetric V1 zeros).
struct ValidGptq {
  std::vector<std::int32_t> qweight, qzeros;
  std::vector<float> scales;
  GptqHostTensors tensors;

  ValidGptq(std::size_t k, std::size_t n)
      : qweight(k / 8 * n, 0x77777777), qzeros(n / 8, 0x77777777), scales(n, 0.01f) {
    tensors.qweight = qweight;
    tensors.qzeros = qzeros;
    tensors.scales = scales;
    tensors.k = k;
    tensors.n = n;
    tensors.group_size = -1;
  }
};

OpArgs make_args(Backend& backend, const OpSpec& spec) {
  OpArgs a;
  for (const BufferArg& b : spec.buffers) a.buffers.emplace(b.name, zeros(backend, b.dtype, b.numel));
  for (const SizeArg& s : spec.sizes) a.sizes.emplace(s.name, s.value);
  if (spec.op == Op::FlashAttention) a.pos_offset = kKvLen - kQLen;  // causal: the queries end at kv_len
  if (spec.op == Op::FlashDecodeRagged) {  // lengths 1 and the whole capacity
    const std::int32_t lens[] = {1, static_cast<std::int32_t>(a.size("cfg.kv_seq_stride"))};
    backend.write_bytes(a.buf("kv_lens"), lens, sizeof(lens));
  }
  if (spec.op == Op::QkvRopeAppendRagged) {  // the first and the last cache row
    const std::int32_t positions[] = {0, static_cast<std::int32_t>(a.size("cfg.capacity")) - 1};
    backend.write_bytes(a.buf("positions"), positions, sizeof(positions));
  }
  if (spec.op == Op::GemmGptq || spec.op == Op::GemmQuant || spec.op == Op::GemmSiluMulGptq ||
      spec.op == Op::GemmGptqAddResidual || spec.op == Op::RmsNormGemmGptq || spec.op == Op::RmsNormGemmSiluMulGptq) {
    // A real weight where the backend can load one, so valid calls run.
    if (backend.supports(Op::LoadGptq)) {
      a.weight = backend.load_gptq(ValidGptq(kK, kN).tensors);
    } else {
      a.weight = std::make_unique<FakeQuantWeight>(&backend, QuantKind::Gptq, kK, kN);
    }
  }
  return a;
}

void fill_random(Backend& backend, const OpSpec& spec, OpArgs& a, Rng& rng) {
  for (const BufferArg& b : spec.buffers) {
    Buffer& buf = a.buf(b.name);
    if (b.role == Role::Output) {
      const std::vector<std::uint8_t> poison(buf.nbytes(), 0xA5);
      backend.write_bytes(buf, poison.data(), poison.size());
    } else if (b.dtype == DType::F32) {
      std::vector<float> v(buf.numel());
      for (float& x : v) x = rng.uniform(0.5f, 2.0f);
      backend.write(buf, v);
    } else if (b.dtype == DType::F16 || b.dtype == DType::BF16) {
      backend.write(buf, random_normal(rng, b.dtype, buf.numel()).values);
    }
  }
  if (spec.op == Op::AdvanceDecodeState) {
    const std::int32_t seven = 7;
    backend.write_bytes(a.buf("next_token"), &seven, sizeof(seven));
  }
}

void call_capturable(Backend& backend, const OpSpec& spec, OpArgs& a) {
  if (spec.op == Op::AdvanceDecodeState) {
    backend.advance_decode_state(a.buf("next_token"), a.buf("token_log"));
  } else {
    spec.call(backend, a);
  }
}

std::vector<std::vector<std::uint8_t>> read_all(Backend& backend, const OpSpec& spec, OpArgs& a) {
  std::vector<std::vector<std::uint8_t>> bytes;
  for (const BufferArg& b : spec.buffers) {
    Buffer& buf = a.buf(b.name);
    bytes.emplace_back(buf.nbytes());
    backend.read_bytes(buf, bytes.back().data(), buf.nbytes());
  }
  return bytes;
}

void write_all(Backend& backend, const OpSpec& spec, OpArgs& a, const std::vector<std::vector<std::uint8_t>>& bytes) {
  for (std::size_t i = 0; i < spec.buffers.size(); ++i) {
    backend.write_bytes(a.buf(spec.buffers[i].name), bytes[i].data(), bytes[i].size());
  }
}

void call_op_validly(Backend& backend, Op op) {
  switch (op) {
    case Op::LoadGptq: {
      (void)backend.load_gptq(ValidGptq(128, 8).tensors);
      break;
    }
    case Op::GraphCapture: {
      Buffer x = zeros(backend, kH, 10), y = zeros(backend, kH, 10);
      backend.begin_graph_capture();
      backend.add_inplace(x, y, 10);
      backend.end_graph_capture();
      if (!backend.replay_last_graph()) throw std::runtime_error("replay_last_graph() returned false after a capture");
      backend.reset_graph();
      break;
    }
    case Op::DeviceStateMode: {
      Buffer table = zeros(backend, kH, kVocab * kDim), out = zeros(backend, kH, kDim);
      DeviceStateScope scope(backend, true);
      backend.set_decode_state(kVocab - 1, 0);
      backend.embedding_lookup(table, Buffer{}, out, 1, kDim, kVocab);
      break;
    }
    default: {
      const OpSpec& spec = op_spec(op);
      OpArgs a = make_args(backend, spec);
      spec.call(backend, a);
      break;
    }
  }
  backend.synchronize();
}

}  // namespace ferrum::test
