// A table of every public op that takes buffers, each with a small VALID
// call: its buffer arguments (name as the op's error messages spell it,
// dtype, element count), its size arguments, and how to call it. The
// bad-input suite mutates one argument at a time (null, wrong backend, too
// small, wrong dtype, zero / huge size) and expects the matching ErrorCode;
// the supports() test makes the valid call and expects success or
// Unsupported as supports() says.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "support/test_support.hpp"

namespace ferrum::test {

// What an op does with a buffer, for the overlap rule (backend.hpp, "Outputs
// and inputs"): an InOut buffer counts as an output.
enum class Role { Input, Output, InOut };

struct BufferArg {
  std::string name;
  DType dtype;
  std::size_t numel;       // what a valid call passes (exactly what the op needs)
  std::size_t too_small;   // an element count the op must refuse with ShapeMismatch
  DType wrong_dtype;       // a dtype the op must refuse with DTypeMismatch
  Role role = Role::Input;
  bool written() const { return role != Role::Input; }
};

struct SizeArg {
  std::string name;  // as the error message spells it ("tokens", "cfg.num_heads")
  std::size_t value;
};

// A QuantWeight that is not backed by anything: enough for the validating
// layer of gemm_gptq / gemm_quant (load_gptq is not implemented anywhere).
class FakeQuantWeight final : public QuantWeight {
 public:
  FakeQuantWeight(const Backend* backend, QuantKind kind, std::size_t k, std::size_t n)
      : backend_(backend), kind_(kind), k_(k), n_(n) {}
  QuantKind kind() const noexcept override { return kind_; }
  std::size_t k() const noexcept override { return k_; }
  std::size_t n() const noexcept override { return n_; }
  const Backend* backend() const noexcept override { return backend_; }

 private:
  const Backend* backend_;
  QuantKind kind_;
  std::size_t k_, n_;
};

// The arguments of one call. Buffers and sizes start valid; tests replace
// one of them. Scalars the ops take besides sizes live here too.
struct OpArgs {
  std::map<std::string, Buffer> buffers;
  std::map<std::string, std::size_t> sizes;
  float eps = 1e-5f;
  float scale = 0.0f;  // flash_attention cfg.scale
  std::size_t pos_offset = 0;
  std::size_t cache_len = 0;
  std::size_t kv_seq_stride = 0;
  std::size_t src_rank = 0;
  bool causal = true;
  RopeMode mode = RopeMode::NormAndRope;
  GeluApproximation approx = GeluApproximation::Erf;
  ReduceOp reduce = ReduceOp::Sum;
  std::unique_ptr<QuantWeight> weight;  // gemm_gptq / gemm_quant
  bool null_norm_w = false;             // qk_norm_rope: pass norm_w as a null pointer (qkv_rope_append: q_norm)
  bool null_k_norm = false;             // qkv_rope_append: pass k_norm as a null pointer
  std::vector<Buffer> keep_alive;       // parents of views placed in `buffers`

  // Replaces buffer `name` by a view of its first `count` elements.
  void shrink(const std::string& name, std::size_t count) {
    Buffer parent = std::move(buffers.at(name));  // moving keeps the memory in place
    buffers[name] = parent.view(0, count);
    keep_alive.push_back(std::move(parent));
  }

  Buffer& buf(const std::string& name) { return buffers.at(name); }
  std::size_t size(const std::string& name) const { return sizes.at(name); }
};

struct OpSpec {
  Op op;
  std::string name;  // how its error messages name it
  std::vector<BufferArg> buffers;
  std::vector<SizeArg> sizes;  // each validated as >= 1 and <= INT32_MAX
  std::function<void(Backend&, OpArgs&)> call;
  // Whether the op states an overlap rule of its own (copy_slice, the
  // collectives, advance_decode_state) instead of backend.hpp's.
  bool own_overlap_rule = false;
};

// Every buffer-taking op of the interface (all of Op except LoadGptq,
// GraphCapture and DeviceStateMode, which take no buffers).
const std::vector<OpSpec>& op_specs();
const OpSpec& op_spec(Op op);
// Valid arguments on `backend` (buffers zero-filled, ids in range).
OpArgs make_args(Backend& backend, const OpSpec& spec);
// A zero-filled buffer.
Buffer zeros(Backend& backend, DType dtype, std::size_t numel);

// ── Graph tests over the registry (test_graph_ops.cpp, test_graph_cold.cpp) ──

// Random float inputs (integer buffers keep make_args's valid ids and
// lengths; f32 ones, sums of squares among them, stay positive), outputs
// poisoned with 0xA5 bytes so that a run that skips a write shows, and for
// advance_decode_state a next token (7) whose write into token_log shows.
void fill_random(Backend& backend, const OpSpec& spec, OpArgs& a, Rng& rng);
// The spec's call as a capture may record it: the registry's
// advance_decode_state call sets the decode state first, which a capture
// refuses, so here it is advance_decode_state alone (the caller sets the
// state outside the capture).
void call_capturable(Backend& backend, const OpSpec& spec, OpArgs& a);
// Every buffer's bytes, in spec order; and written back.
std::vector<std::vector<std::uint8_t>> read_all(Backend& backend, const OpSpec& spec, OpArgs& a);
void write_all(Backend& backend, const OpSpec& spec, OpArgs& a, const std::vector<std::vector<std::uint8_t>>& bytes);

// A valid call of ANY Op (including LoadGptq, GraphCapture and
// DeviceStateMode), for the supports() consistency test; synchronizes.
void call_op_validly(Backend& backend, Op op);

}  // namespace ferrum::test
