#include "decoder.hpp"

#include <algorithm>

#include "engine_error.hpp"

namespace ferrum::engine {

std::string to_string(DecodeMode mode) {
  switch (mode) {
    case DecodeMode::Eager:
      return "eager";
    case DecodeMode::DeviceState:
      return "device-state";
    case DecodeMode::Graph:
      return "graph";
  }
  return "?";
}

std::vector<Op> required_ops(DecodeMode mode, bool gptq, bool batch) {
  std::vector<Op> ops = {Op::EmbeddingLookup,      Op::RmsNorm,
                         Op::FusedAddRmsNorm,      Op::Gemm,
                         Op::QkvRopeAppend,        Op::QkNormRope,
                         Op::TransposeHeadToToken, Op::KvCacheAppendHeadMajor,
                         Op::FlashAttention,       Op::FusedSiluMulSplit,
                         Op::GemmSiluMul,          Op::Argmax};
  if (gptq) {
    ops.push_back(Op::LoadGptq);
    ops.push_back(Op::GemmGptq);
    ops.push_back(Op::GemmSiluMulGptq);  // gate | up with identical g_idx
    ops.push_back(Op::CopySlice);  // prefill through an unfused gate | up
  }
  if (batch) {
    ops.push_back(Op::QkvRopeAppendRagged);
    ops.push_back(Op::FlashDecodeRagged);
  }
  if (mode != DecodeMode::Eager) {
    ops.push_back(Op::DeviceStateMode);
    ops.push_back(Op::AdvanceDecodeState);  // decode_pipelined
  }
  if (mode == DecodeMode::Graph) ops.push_back(Op::GraphCapture);
  return ops;
}

std::vector<Op> missing_ops(const Backend& backend, DecodeMode mode, bool gptq, bool batch) {
  std::vector<Op> missing;
  for (Op op : required_ops(mode, gptq, batch)) {
    if (!backend.supports(op)) missing.push_back(op);
  }
  return missing;
}

std::string op_names(const std::vector<Op>& ops) {
  std::string names;
  for (Op op : ops) names += concat(names.empty() ? "" : ", ", ferrum::to_string(op));
  return names;
}

std::vector<Op> ops_refusing_head_dim(const Backend& backend, std::size_t head_dim, DecodeMode mode, bool gptq,
                                      bool batch) {
  std::vector<Op> refusing;
  for (Op op : required_ops(mode, gptq, batch)) {
    if (backend.supports(op) && !backend.supports_head_dim(op, head_dim)) refusing.push_back(op);
  }
  return refusing;
}

bool Decoder::fits_row_sq_norms(const ModelWeights& weights) {
  return std::all_of(weights.layers.begin(), weights.layers.end(), [](const LayerWeights& l) {
    return l.qkv_proj.fused() && l.qkv_proj.parts[0].quantized() && l.o_proj.quantized() &&
           l.gate_up_proj.interleaved_pairs && l.gate_up_proj.parts[0].quantized() && l.down_proj.quantized();
  });
}

Decoder::Decoder(Backend& backend, const ModelWeights& weights, std::size_t kv_capacity,
                 std::size_t max_prefill_tokens, DecodeMode mode, std::size_t sequences, DecoderOptions options)
    : be_(backend), w_(weights), cfg_(weights.config), capacity_(kv_capacity), max_tokens_(max_prefill_tokens),
      mode_(mode), row_sq_norms_(options.gptq_row_sq_norms) {
  if (row_sq_norms_ && !fits_row_sq_norms(weights)) {
    fail(ErrorCode::InvalidArgument,
         "Decoder: gptq_row_sq_norms needs every projection GPTQ, q|k|v fused and gate|up interleaved (this model "
         "has another layout)");
  }
  if (row_sq_norms_) {
    std::vector<Op> lacking;
    for (Op op : {Op::RowSumSquares, Op::GemmGptqAddResidual, Op::RmsNormGemmGptq, Op::RmsNormGemmSiluMulGptq}) {
      if (!backend.supports(op)) lacking.push_back(op);
    }
    if (!lacking.empty()) {
      fail(ErrorCode::Unsupported, "Decoder: the ", backend.name(), " backend lacks ", op_names(lacking),
           " (needed by gptq_row_sq_norms)");
    }
  }
  const std::vector<Op> missing = missing_ops(backend, mode, weights.has_gptq(), sequences > 1);
  if (!missing.empty()) {
    fail(ErrorCode::Unsupported, "Decoder: the ", backend.name(), " backend lacks ", op_names(missing), " (needed by ",
         to_string(mode), " decoding", sequences > 1 ? " of a batch" : "", ")");
  }
  const std::vector<Op> refusing = ops_refusing_head_dim(backend, cfg_.head_dim, mode, weights.has_gptq(), sequences > 1);
  if (!refusing.empty()) {
    fail(ErrorCode::Unsupported, "Decoder: the ", backend.name(), " backend does not run ", op_names(refusing),
         " on heads of head_dim = ", cfg_.head_dim);
  }
  if (kv_capacity == 0 || kv_capacity > w_.rope_positions()) {
    fail(ErrorCode::InvalidArgument, "Decoder: kv_capacity = ", kv_capacity, " must be in [1, ", w_.rope_positions(),
         "] (the RoPE tables' positions, LoadOptions::rope_positions or max_position_embeddings)");
  }
  if (max_prefill_tokens == 0 || max_prefill_tokens > kv_capacity) {
    fail(ErrorCode::InvalidArgument, "Decoder: max_prefill_tokens = ", max_prefill_tokens, " must be in [1, ",
         kv_capacity, "] (kv_capacity)");
  }
  if (sequences == 0 || sequences > 0x7fffffff) {
    fail(ErrorCode::InvalidArgument, "Decoder: sequences = ", sequences, " must be in [1, 2^31)");
  }
  positions_.assign(sequences, 0);
  unfused_qkv_ = std::any_of(w_.layers.begin(), w_.layers.end(),
                             [](const LayerWeights& l) { return !l.qkv_proj.fused(); });
  if (sequences > 1) require_fused_qkv();
  const DType dt = cfg_.dtype;
  const std::size_t t = max_tokens_;
  const std::size_t rows = std::max(max_tokens_, sequences);
  const std::size_t hidden = cfg_.hidden_size;
  const std::size_t im = cfg_.intermediate_size;
  for (std::size_t l = 0; l < cfg_.num_hidden_layers; ++l) {
    k_cache_.push_back(be_.alloc(dt, sequences * cfg_.num_key_value_heads * capacity_ * cfg_.head_dim));
    v_cache_.push_back(be_.alloc(dt, sequences * cfg_.num_key_value_heads * capacity_ * cfg_.head_dim));
  }
  ids_ = be_.alloc(DType::I32, t);  // a batch step reads batch_ids_
  ids_host_ = be_.alloc_host(DType::I32, t);
  batch_host_ = be_.alloc_host(DType::I32, 3 * sequences);
  batch_state_ = be_.alloc(DType::I32, 3 * sequences);
  batch_ids_ = batch_state_.view(0, sequences);
  seq_positions_ = batch_state_.view(sequences, sequences);
  kv_lens_ = batch_state_.view(2 * sequences, sequences);
  residual_ = be_.alloc(dt, rows * hidden);
  normed_ = be_.alloc(dt, rows * hidden);
  qkv_ = be_.alloc(dt, rows * cfg_.qkv_dim());
  if (unfused_qkv_) {  // q, k, v projected apart: the op-by-op rope / transpose / append path
    q_ = be_.alloc(dt, t * cfg_.q_dim());
    k_ = be_.alloc(dt, t * cfg_.kv_dim());
    v_ = be_.alloc(dt, t * cfg_.kv_dim());
    k_heads_ = be_.alloc(dt, t * cfg_.kv_dim());
    v_heads_ = be_.alloc(dt, t * cfg_.kv_dim());
  }
  q_heads_ = be_.alloc(dt, rows * cfg_.q_dim());
  attn_heads_ = be_.alloc(dt, rows * cfg_.q_dim());
  attn_tokens_ = be_.alloc(dt, t * cfg_.q_dim());
  attn_out_ = be_.alloc(dt, rows * hidden);
  gate_up_ = be_.alloc(dt, rows * 2 * im);
  act_ = be_.alloc(dt, rows * im);
  mlp_out_ = be_.alloc(dt, rows * hidden);
  if (row_sq_norms_) row_sq_ = be_.alloc(DType::F32, rows * row_sq_groups(hidden));
  logits_ = be_.alloc(dt, sequences * cfg_.vocab_size);
  next_token_ = be_.alloc(DType::I32, sequences);
  if (mode != DecodeMode::Eager) token_log_ = be_.alloc(DType::I32, capacity_ + 1);
  if (sequences > 1) {
    // The batch step's attention call once, on the real caches with every
    // kv length 1: a backend that cannot serve this batch (e.g. its decode
    // workspace is too small) says so now, before any prefill.
    const std::vector<std::int32_t> ones(sequences, 1);
    be_.write_bytes(kv_lens_, ones.data(), sequences * sizeof(std::int32_t));
    Buffer out = attn_heads_.view(0, sequences * cfg_.q_dim());
    be_.flash_decode_ragged(q_heads_.view(0, sequences * cfg_.q_dim()), k_cache_[0], v_cache_[0], out, kv_lens_,
                            sequences, attn_config());
  }
}

AttnConfig Decoder::attn_config() const {
  return {.num_heads = cfg_.num_attention_heads,
          .num_kv_heads = cfg_.num_key_value_heads,
          .head_dim = cfg_.head_dim,
          .causal = true,
          .kv_seq_stride = capacity_};
}

void Decoder::check_sequence(std::size_t seq) const {
  if (seq >= positions_.size()) {
    fail(ErrorCode::InvalidArgument, "Decoder: sequence ", seq, " is outside [0, ", positions_.size(),
         ") (sequences)");
  }
}

void Decoder::require_fused_qkv() const {
  if (unfused_qkv_) {
    // qkv_rope_append_ragged reads one [q | k | v] row per sequence.
    fail(ErrorCode::Unsupported, "Decoder: a batch of ", positions_.size(),
         " sequences needs a fused QKV projection; this model's q / k / v projections are separate (GPTQ parts "
         "whose g_idx differ)");
  }
}

void Decoder::check_tokens(std::size_t seq, std::span<const std::int32_t> tokens) const {
  check_sequence(seq);
  if (tokens.empty()) fail(ErrorCode::InvalidArgument, "Decoder: no tokens given");
  if (tokens.size() > max_tokens_) {
    fail(ErrorCode::InvalidArgument, "Decoder: ", tokens.size(), " tokens exceed max_prefill_tokens = ", max_tokens_);
  }
  const std::size_t pos = positions_[seq];
  if (pos + tokens.size() > capacity_) {
    fail(ErrorCode::CapacityExceeded, "Decoder: positions [", pos, ", ", pos + tokens.size(), ") of sequence ", seq,
         " run past kv_capacity = ", capacity_);
  }
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || static_cast<std::size_t>(tokens[i]) >= cfg_.vocab_size) {
      fail(ErrorCode::InvalidArgument, "Decoder: token id ", tokens[i], " at index ", i,
           positions_.size() > 1 ? concat(" of sequence ", seq) : std::string(), " is outside [0, ", cfg_.vocab_size,
           ") (vocab_size)");
    }
  }
}

std::vector<float> Decoder::prefill(std::size_t seq, std::span<const std::int32_t> tokens) {
  run_prefill(seq, tokens);
  return logits();
}

std::int32_t Decoder::prefill_next(std::size_t seq, std::span<const std::int32_t> tokens) {
  run_prefill(seq, tokens);
  return read_next_tokens(1)[0];
}

std::vector<float> Decoder::decode(std::int32_t token) {
  run_decode(token);
  return logits();
}

std::int32_t Decoder::decode_next(std::int32_t token) {
  run_decode(token);
  return read_next_tokens(1)[0];
}

std::vector<float> Decoder::decode_batch(std::span<const std::int32_t> tokens) {
  run_decode_batch(tokens);
  return logits();
}

std::vector<std::int32_t> Decoder::decode_batch_next(std::span<const std::int32_t> tokens) {
  run_decode_batch(tokens);
  return read_next_tokens(tokens.size());
}

void Decoder::wait_for_host_inputs() {
  if (!host_inputs_queued_) return;
  be_.synchronize();
  host_inputs_queued_ = false;
}

void Decoder::run_prefill(std::size_t seq, std::span<const std::int32_t> tokens) {
  check_tokens(seq, tokens);
  be_.set_device_state_mode(false);
  wait_for_host_inputs();
  std::copy(tokens.begin(), tokens.end(), static_cast<std::int32_t*>(ids_host_.data()));
  be_.copy_slice(ids_host_, 0, ids_, 0, tokens.size());
  host_inputs_queued_ = true;
  enqueue_forward({.rows = tokens.size(), .pos_offset = positions_[seq], .seq = seq});
  positions_[seq] += tokens.size();
  last_rows_ = 1;
}

Decoder::~Decoder() {
  // While a capture of someone else's is open, reset_graph would refuse and
  // in refusing abandon that capture (OpCheck::fail): leave the slot alone;
  // the graph stays held, with the buffers it points at, until the slot is
  // reset or recaptured.
  if (!graph_captured() || be_.is_capturing()) return;
  try {
    be_.reset_graph();
  } catch (const std::exception&) {
    // A device error: the graph stays held as above.
  }
}

void Decoder::run_step(Captured kind, const Pass& pass) {
  auto enqueue_step = [&] {
    enqueue_forward(pass);
    if (kind == Captured::Pipelined) be_.advance_decode_state(next_token_.view(0, 1), token_log_);
  };
  if (mode_ != DecodeMode::Graph) {
    enqueue_step();
    return;
  }
  // Captured again when the slot holds another step of this decoder or
  // anyone else's graph (the slot is the device's: see Backend::held_graph).
  if (captured_ != kind || be_.held_graph() != captured_graph_) {
    if (be_.held_graph() != 0) be_.reset_graph();  // freed before the new one is built
    captured_ = Captured::None;
    be_.begin_graph_capture();
    enqueue_step();
    be_.end_graph_capture();
    captured_ = kind;
    captured_graph_ = be_.held_graph();
  }
  if (!be_.replay_last_graph()) {
    fail(ErrorCode::GraphCapture, "Decoder: the captured decode step is gone (another user reset the graph slot)");
  }
}

namespace {

// Device-state mode on for a scope, off again however the scope ends.
class DeviceStateModeOn {
 public:
  explicit DeviceStateModeOn(Backend& be) : be_(be) { be_.set_device_state_mode(true); }
  ~DeviceStateModeOn() { be_.set_device_state_mode(false); }
  DeviceStateModeOn(const DeviceStateModeOn&) = delete;
  DeviceStateModeOn& operator=(const DeviceStateModeOn&) = delete;

 private:
  Backend& be_;
};

}  // namespace

void Decoder::run_decode(std::int32_t token) {
  const std::int32_t one[1] = {token};
  check_tokens(0, one);
  if (mode_ == DecodeMode::Eager) {
    run_prefill(0, one);
    return;
  }

  // The step reads token / pos / kv_len from the decode state, so one
  // captured graph serves every later step. The state is set first: a
  // capture records the ops, not their inputs.
  {
    const DeviceStateModeOn state_mode(be_);
    be_.set_decode_state(static_cast<std::uint32_t>(token), static_cast<std::uint32_t>(positions_[0]));
    run_step(Captured::Single, {.rows = 1, .pos_offset = positions_[0], .seq = 0});
  }
  positions_[0] += 1;
  last_rows_ = 1;
}

std::vector<std::int32_t> Decoder::decode_pipelined(std::int32_t token, std::size_t steps) {
  if (mode_ == DecodeMode::Eager) {
    fail(ErrorCode::Unsupported,
         "Decoder: decode_pipelined passes tokens through the decode state: DeviceState or Graph mode, not Eager");
  }
  if (steps == 0) return {};
  const std::int32_t one[1] = {token};
  check_tokens(0, one);  // position() < capacity_ from here on
  const std::size_t first = positions_[0];
  if (steps > capacity_ - first) {
    fail(ErrorCode::CapacityExceeded, "Decoder: ", steps, " pipelined steps from position ", first,
         " run past kv_capacity = ", capacity_);
  }
  {
    const DeviceStateModeOn state_mode(be_);
    be_.set_decode_state(static_cast<std::uint32_t>(token), static_cast<std::uint32_t>(first));
    // pos_offset is the host's copy of the position (eager planning only):
    // the steps read token, pos and kv_len from the decode state.
    for (std::size_t i = 0; i < steps; ++i) run_step(Captured::Pipelined, {.rows = 1, .pos_offset = first + i, .seq = 0});
  }
  positions_[0] = first + steps;
  last_rows_ = 1;
  // Step i (at position first + i) logged its token at first + i + 1.
  std::vector<std::int32_t> tokens(steps);
  be_.read_bytes(token_log_, tokens.data(), steps * sizeof(std::int32_t), (first + 1) * sizeof(std::int32_t));
  return tokens;
}

void Decoder::run_decode_batch(std::span<const std::int32_t> tokens) {
  const std::size_t n = positions_.size();
  if (tokens.size() != n) {
    fail(ErrorCode::InvalidArgument, "Decoder: a batch step takes one token per sequence (", n, "), got ",
         tokens.size());
  }
  require_fused_qkv();
  for (std::size_t s = 0; s < n; ++s) check_tokens(s, tokens.subspan(s, 1));
  // [ids | positions | kv lengths] in host memory the step copies from
  // (enqueue_forward): the step reads them from batch_state_ (the decode
  // state holds one sequence's), so one captured graph serves every step.
  wait_for_host_inputs();
  auto* state = static_cast<std::int32_t*>(batch_host_.data());
  for (std::size_t s = 0; s < n; ++s) {
    state[s] = tokens[s];
    state[n + s] = static_cast<std::int32_t>(positions_[s]);
    state[2 * n + s] = state[n + s] + 1;
  }
  be_.set_device_state_mode(false);
  host_inputs_queued_ = true;
  run_step(Captured::Batch, {.rows = n, .ragged = true});
  for (std::size_t& p : positions_) p += 1;
  last_rows_ = n;
}

void Decoder::enqueue_forward(const Pass& pass) {
  const std::size_t rows = pass.rows;
  const std::size_t hidden = cfg_.hidden_size;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  if (pass.ragged) be_.copy_slice(batch_host_, 0, batch_state_, 0, batch_state_.numel());  // run_decode_batch's inputs
  be_.embedding_lookup(w_.embed_tokens, pass.ragged ? batch_ids_ : ids_, residual_, rows, hidden, cfg_.vocab_size);
  if (row_sq_norms_) {
    // The norms ride on the projections (DecoderOptions::gptq_row_sq_norms):
    // residual_ and its row_sq_ carry each layer's input.
    be_.row_sum_squares(residual_, row_sq_, rows, hidden);
    for (std::size_t l = 0; l < cfg_.num_hidden_layers; ++l) {
      enqueue_attention(l, pass);  // rms_norm(residual_) -> ... -> residual_ += o
      enqueue_mlp(l, rows);        // rms_norm(residual_) -> ... -> residual_ += down
    }
    be_.rms_norm(residual_, w_.final_norm, eps, normed_, rows, hidden);
  } else {
    be_.rms_norm(residual_, w_.layers[0].input_norm, eps, normed_, rows, hidden);
    for (std::size_t l = 0; l < cfg_.num_hidden_layers; ++l) {
      enqueue_attention(l, pass);  // normed_ -> attn_out_
      be_.fused_add_rms_norm(residual_, attn_out_, w_.layers[l].post_attention_norm, eps, normed_, rows, hidden);
      enqueue_mlp(l, rows);  // normed_ -> mlp_out_
      const bool last = l + 1 == cfg_.num_hidden_layers;
      const Buffer& next_norm = last ? w_.final_norm : w_.layers[l + 1].input_norm;
      be_.fused_add_rms_norm(residual_, mlp_out_, next_norm, eps, normed_, rows, hidden);
    }
  }
  // A prefill needs only its last row's logits; a batch step every row's.
  const std::size_t out_rows = pass.ragged ? rows : 1;
  const Buffer last_rows = normed_.view((rows - out_rows) * hidden, out_rows * hidden);  // [out_rows, hidden]
  be_.gemm(last_rows, w_.output_projection(), logits_, out_rows, cfg_.vocab_size, hidden);
  be_.argmax(logits_, next_token_, out_rows, cfg_.vocab_size);  // greedy, on the device
}

void Decoder::enqueue_attention(std::size_t l, const Pass& pass) {
  const LayerWeights& lw = w_.layers[l];
  const std::size_t tokens = pass.rows;
  const std::size_t heads = cfg_.num_attention_heads;
  const std::size_t kv = cfg_.num_key_value_heads;
  const std::size_t hd = cfg_.head_dim;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const std::size_t max_pos = w_.rope_positions();

  const RopeMode mode = cfg_.has_qk_norm() ? RopeMode::NormAndRope : RopeMode::RopeOnly;
  const Buffer* q_norm = cfg_.has_qk_norm() ? &lw.q_norm : nullptr;
  const Buffer* k_norm = cfg_.has_qk_norm() ? &lw.k_norm : nullptr;
  Buffer q_heads = q_heads_.view(0, tokens * cfg_.q_dim());
  const QkvRopeAppendConfig rope{.heads = heads, .kv_heads = kv, .head_dim = hd, .capacity = capacity_,
                                 .max_pos = max_pos, .eps = eps, .mode = mode};
  const AttnConfig attn = attn_config();

  if (pass.ragged) {  // one token of each sequence: row s at its own position, in its own caches
    project_qkv(l, qkv_, tokens);
    be_.qkv_rope_append_ragged(qkv_, q_norm, k_norm, w_.rope_cos, w_.rope_sin, q_heads, k_cache_[l], v_cache_[l],
                               seq_positions_, tokens, rope);
    Buffer out = attn_heads_.view(0, tokens * cfg_.q_dim());  // [sequences, heads, hd] = [sequences, heads * hd]
    be_.flash_decode_ragged(q_heads, k_cache_[l], v_cache_[l], out, kv_lens_, tokens, attn);
    project_residual(lw.o_proj, attn_heads_, attn_out_, tokens);
    return;
  }

  // Sequence pass.seq's caches [kv, capacity, hd].
  const std::size_t seq_elems = kv * capacity_ * hd;
  Buffer k_cache = k_cache_[l].view(pass.seq * seq_elems, seq_elems);
  Buffer v_cache = v_cache_[l].view(pass.seq * seq_elems, seq_elems);
  const std::size_t pos_offset = pass.pos_offset;
  if (lw.qkv_proj.fused()) {
    // [T, q | k | v] straight into q_heads and the caches: one launch for
    // the split, both ropes, the v transpose and the append.
    project_qkv(l, qkv_, tokens);
    be_.qkv_rope_append(qkv_, q_norm, k_norm, w_.rope_cos, w_.rope_sin, q_heads, k_cache, v_cache, tokens, pos_offset,
                        rope);
  } else {  // separate projections (GPTQ parts whose g_idx differ): the same steps op by op
    project(lw.qkv_proj.parts[0], normed_, q_, tokens);
    project(lw.qkv_proj.parts[1], normed_, k_, tokens);
    project(lw.qkv_proj.parts[2], normed_, v_, tokens);
    be_.qk_norm_rope(q_, q_norm, w_.rope_cos, w_.rope_sin, q_heads, tokens, heads, hd, pos_offset, max_pos, eps, mode);
    be_.qk_norm_rope(k_, k_norm, w_.rope_cos, w_.rope_sin, k_heads_, tokens, kv, hd, pos_offset, max_pos, eps, mode);
    // v is token-major [T, kv, hd]; read it as [heads = T, tokens = kv, hd] to get [kv, T, hd].
    be_.transpose_head_to_token(v_, v_heads_, /*tokens=*/kv, /*heads=*/tokens, hd);
    be_.kv_cache_append_head_major(k_cache, v_cache, pos_offset, capacity_, k_heads_, v_heads_, tokens, kv, hd);
  }

  // q [1, heads, T, hd] against cache positions [0, pos_offset + T).
  be_.flash_attention(q_heads, k_cache, v_cache, attn_heads_, 1, tokens, pos_offset + tokens, pos_offset, attn);
  // The attention output [heads, T, hd] is already token-major [1, heads * hd] at T = 1.
  const bool one_token = tokens == 1;
  if (!one_token) be_.transpose_head_to_token(attn_heads_, attn_tokens_, tokens, heads, hd);  // [T, heads * hd]
  project_residual(lw.o_proj, one_token ? attn_heads_ : attn_tokens_, attn_out_, tokens);
}

void Decoder::enqueue_mlp(std::size_t l, std::size_t tokens) {
  const LayerWeights& lw = w_.layers[l];
  const std::size_t im = cfg_.intermediate_size;
  if (lw.gate_up_proj.interleaved_pairs) {  // SwiGLU in the GEMM (gate_up_ is its workspace)
    const Projection& gate_up = lw.gate_up_proj.parts[0];
    if (row_sq_norms_) {
      be_.rms_norm_gemm_silu_mul_gptq(residual_, row_sq_, lw.post_attention_norm, static_cast<float>(cfg_.rms_norm_eps),
                                      *gate_up.gptq, normed_, gate_up_, act_, tokens);
    } else if (gate_up.quantized()) {
      be_.gemm_silu_mul_gptq(normed_, *gate_up.gptq, gate_up_, act_, tokens);
    } else {
      be_.gemm_silu_mul(normed_, gate_up.dense, gate_up_, act_, tokens, im, cfg_.hidden_size);
    }
    project_residual(lw.down_proj, act_, mlp_out_, tokens);
    return;
  }
  if (lw.gate_up_proj.fused()) {
    project(lw.gate_up_proj.parts[0], normed_, gate_up_, tokens);  // [T, gate | up]
  } else if (tokens == 1) {
    // One row: gate and up are two contiguous halves of it.
    Buffer gate = gate_up_.view(0, im), up = gate_up_.view(im, im);
    project(lw.gate_up_proj.parts[0], normed_, gate, 1);
    project(lw.gate_up_proj.parts[1], normed_, up, 1);
  } else {
    // Several rows (prefill): each part into act_ [T, im], then its rows into
    // their half of gate_up_ (act_ is overwritten below anyway).
    for (std::size_t part = 0; part < 2; ++part) {
      project(lw.gate_up_proj.parts[part], normed_, act_, tokens);
      for (std::size_t t = 0; t < tokens; ++t) be_.copy_slice(act_, t * im, gate_up_, t * 2 * im + part * im, im);
    }
  }
  be_.fused_silu_mul_split(gate_up_, act_, tokens, im);
  project(lw.down_proj, act_, mlp_out_, tokens);
}

void Decoder::project_qkv(std::size_t layer, Buffer& qkv, std::size_t m) {
  const LayerWeights& lw = w_.layers[layer];
  if (row_sq_norms_) {
    be_.rms_norm_gemm_gptq(residual_, row_sq_, lw.input_norm, static_cast<float>(cfg_.rms_norm_eps),
                           *lw.qkv_proj.parts[0].gptq, normed_, qkv, m);
  } else {
    project(lw.qkv_proj.parts[0], normed_, qkv, m);
  }
}

void Decoder::project_residual(const Projection& p, const Buffer& x, Buffer& out, std::size_t m) {
  if (row_sq_norms_) {
    be_.gemm_gptq_add_residual(x, *p.gptq, out, residual_, row_sq_, m);
  } else {
    project(p, x, out, m);
  }
}

void Decoder::project(const Projection& p, const Buffer& x, Buffer& out, std::size_t m) {
  if (p.quantized()) {
    be_.gemm_gptq(x, *p.gptq, out, m);
  } else {
    be_.gemm(x, p.dense, out, m, p.n, p.k);
  }
}

std::vector<float> Decoder::logits() {
  std::vector<float> values = be_.download(logits_, last_rows_ * cfg_.vocab_size);
  host_inputs_queued_ = false;  // the read waited for the stream
  return values;
}

std::vector<std::int32_t> Decoder::read_next_tokens(std::size_t count) {
  std::vector<std::int32_t> tokens(count);
  be_.read_bytes(next_token_, tokens.data(), count * sizeof(std::int32_t));
  host_inputs_queued_ = false;  // the read waited for the stream
  return tokens;
}

std::int32_t argmax(std::span<const float> logits) {
  if (logits.empty()) fail(ErrorCode::InvalidArgument, "argmax: no logits");
  return static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace ferrum::engine
