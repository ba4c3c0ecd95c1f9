// CpuBackend: plain host implementations of every op: elementwise math in
// fp32, reductions and dot products accumulated in fp64, one rounding at the
// output. It is the oracle every GPU result is checked against,
// and the fallback on machines without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ferrum/backend.hpp"

namespace ferrum {

struct CpuBackendConfig {
  // Worker threads for row-parallel ops and for load_gptq's unpacking;
  // 0 means std::thread::hardware_concurrency().
  unsigned num_threads = 0;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(CpuBackendConfig config = {});
  ~CpuBackend() override;

  BackendKind kind() const noexcept override { return BackendKind::Cpu; }
  std::string name() const override;
  bool supports(Op op) const noexcept override;
  void synchronize() override {}

 protected:
  void* allocate_bytes(std::size_t bytes) override;
  void* allocate_host_bytes(std::size_t bytes) override;  // the same memory as allocate_bytes
  // Refuses CUDA device memory (asking CUDA where a GPU is present).
  bool check_wrapped(const void* ptr, std::size_t bytes) const override;
  void do_write_bytes(const char* op, Buffer& dst, std::size_t dst_byte_offset, const void* host,
                      std::size_t bytes) override;
  void do_read_bytes(const char* op, const Buffer& src, std::size_t src_byte_offset, void* host,
                     std::size_t bytes) override;
  void do_copy_slice(const char* op, const Buffer& src, std::size_t src_offset, Buffer& dst,
                     std::size_t dst_offset, std::size_t len) override;
  void do_set_decode_state(std::int32_t token, std::int32_t pos, std::int32_t kv_len) override;
  void do_advance_decode_state(const Buffer& next_token, Buffer& token_log) override;

  void do_rms_norm(const Buffer& x, const Buffer& w, float eps, Buffer& out, std::size_t tokens,
                   std::size_t dim) override;
  void do_fused_add_rms_norm(Buffer& residual, const Buffer& x, const Buffer& w, float eps,
                             Buffer& out, std::size_t tokens, std::size_t dim) override;
  void do_layer_norm(const Buffer& x, const Buffer& gamma, const Buffer& beta, float eps,
                     Buffer& out, std::size_t tokens, std::size_t dim) override;
  void do_gelu(const Buffer& x, Buffer& out, std::size_t len, GeluApproximation approx) override;
  void do_add_bias(Buffer& data, const Buffer& bias, std::size_t rows, std::size_t cols) override;
  void do_add_inplace(Buffer& residual, const Buffer& x, std::size_t len) override;
  void do_argmax(const Buffer& x, Buffer& out, std::size_t rows, std::size_t cols) override;
  void do_qkv_rope_append(const Buffer& qkv, const Buffer* q_norm, const Buffer* k_norm, const Buffer& cos,
                          const Buffer& sin, Buffer& q_out, Buffer& k_cache, Buffer& v_cache, std::size_t tokens,
                          std::size_t pos_offset, const QkvRopeAppendConfig& cfg, bool use_decode_state) override;
  void do_qkv_rope_append_ragged(const Buffer& qkv, const Buffer* q_norm, const Buffer* k_norm, const Buffer& cos,
                                 const Buffer& sin, Buffer& q_out, Buffer& k_cache, Buffer& v_cache,
                                 const Buffer& positions, std::size_t batch, const QkvRopeAppendConfig& cfg) override;
  void do_gemm_silu_mul(const Buffer& a, const Buffer& w, Buffer& gate_up, Buffer& act, std::size_t m, std::size_t im,
                        std::size_t k) override;
  void do_gemm(const Buffer& a, const Buffer& b, Buffer& out, std::size_t m, std::size_t n,
               std::size_t k) override;
  void do_embedding_lookup(const Buffer& table, const Buffer& ids, Buffer& out, std::size_t tokens,
                           std::size_t dim, std::size_t vocab, bool use_decode_state) override;
  void do_split_qkv(const Buffer& qkv, Buffer& q, Buffer& k, Buffer& v, std::size_t tokens,
                    std::size_t q_dim, std::size_t kv_dim) override;
  void do_fused_silu_mul_split(const Buffer& gate_up, Buffer& out, std::size_t tokens,
                               std::size_t im) override;
  void do_qk_norm_rope(const Buffer& input, const Buffer* norm_w, const Buffer& cos,
                       const Buffer& sin, Buffer& output, std::size_t tokens, std::size_t heads,
                       std::size_t head_dim, std::size_t pos_offset, std::size_t max_pos, float eps,
                       RopeMode mode, bool use_decode_state) override;
  void do_kv_cache_append_head_major(Buffer& cache_k, Buffer& cache_v, std::size_t cache_len,
                                     std::size_t capacity, const Buffer& new_k, const Buffer& new_v,
                                     std::size_t new_tokens, std::size_t nkv, std::size_t hd,
                                     bool use_decode_state) override;
  void do_transpose_head_to_token(const Buffer& src, Buffer& dst, std::size_t tokens,
                                  std::size_t heads, std::size_t dim) override;
  void do_flash_attention(const Buffer& q, const Buffer& k, const Buffer& v, Buffer& out,
                          std::size_t batch, std::size_t q_len, std::size_t kv_len,
                          std::size_t pos_offset, const AttnConfig& cfg,
                          bool use_decode_state) override;
  void do_flash_decode_ragged(const Buffer& q, const Buffer& k, const Buffer& v, Buffer& out,
                              const Buffer& kv_lens, std::size_t batch, const AttnConfig& cfg) override;
  std::unique_ptr<QuantWeight> do_load_gptq(const GptqHostTensors& tensors) override;
  void do_gemm_gptq(const Buffer& a, const QuantWeight& w, Buffer& out, std::size_t m, const char* op) override;
  void do_gemm_silu_mul_gptq(const Buffer& a, const QuantWeight& w, Buffer& gate_up, Buffer& act,
                             std::size_t m) override;
  void do_row_sum_squares(const Buffer& x, Buffer& row_sq, std::size_t rows, std::size_t cols) override;
  void do_gemm_gptq_add_residual(const Buffer& a, const QuantWeight& w, Buffer& out, Buffer& residual,
                                 Buffer& row_sq, std::size_t m) override;
  void do_rms_norm_gemm_gptq(const Buffer& x, const Buffer& row_sq, const Buffer& norm_w, float eps,
                             const QuantWeight& w, Buffer& normed, Buffer& out, std::size_t m) override;
  void do_rms_norm_gemm_silu_mul_gptq(const Buffer& x, const Buffer& row_sq, const Buffer& norm_w, float eps,
                                      const QuantWeight& w, Buffer& normed, Buffer& gate_up, Buffer& act,
                                      std::size_t m) override;

 private:
  template <class F>
  void parallel_for(std::size_t n, F&& body);
  std::vector<float> decode_rows(const Buffer& a, std::size_t m, std::size_t k);
  // out[t, j] = silu(gate) * up of row t of gate_up [tokens, 2*im]: gate_j,
  // up_j at 2j, 2j + 1 (interleaved) or at j, im + j ([gate | up]).
  void silu_mul_rows(const Buffer& gate_up, Buffer& out, std::size_t tokens, std::size_t im, bool interleaved);
  // normed = rms_norm(x) * norm_w with mean(x²) from x's row_sq (the rms_norm forms' first half).
  void rms_norm_from_row_sq(const Buffer& x, const Buffer& row_sq, const Buffer& norm_w, float eps, Buffer& normed,
                            std::size_t rows, std::size_t cols);
  template <class DecodeB>
  void gemm_f32(const std::vector<float>& a_values, std::size_t m, std::size_t n, std::size_t k, DecodeB&& decode_b,
                Buffer& out);

  unsigned num_threads_;
  // Decode state, as CudaBackend keeps it on the device.
  std::int32_t state_token_ = 0;
  std::int32_t state_pos_ = 0;
  std::int32_t state_kv_len_ = 1;
};

}  // namespace ferrum
