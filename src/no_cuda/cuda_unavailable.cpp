// A FERRUM_CUDA=OFF build: the CpuBackend-only library, compiled without the
// CUDA toolkit. The public headers are the same in both builds, so code
// written for CudaBackend compiles and links here; it finds no GPU:
// cuda_device_count() is 0, make_default_backend() gives a CpuBackend and
// CudaBackend's constructor throws Unsupported, as it does in a CUDA build on
// a GPU that cannot run the kernels. No CudaBackend can exist, so its other
// members are unreachable; they are defined because its vtable names them.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/device_memory.hpp"
#include "common/fail.hpp"
#include "ferrum/backend.hpp"
#include "ferrum/cuda_backend.hpp"

namespace ferrum {

namespace {

[[noreturn]] void unavailable(const char* op = "CudaBackend") {
  detail::fail(ErrorCode::Unsupported,
               "{}: ferrum was built without CUDA (FERRUM_CUDA is OFF): only CpuBackend exists in this build; "
               "make_default_backend() gives one, or rebuild with the CUDA toolkit for CudaBackend",
               op);
}

}  // namespace

int cuda_device_count() noexcept { return 0; }

// Every pointer is host memory in this build (CpuBackend's wrap check).
int detail::device_owning_memory(const void*) noexcept { return -1; }

CudaBackend::CudaBackend(CudaBackendConfig) { unavailable("CudaBackend::CudaBackend"); }
CudaBackend::~CudaBackend() = default;

std::string CudaBackend::name() const { unavailable(); }
bool CudaBackend::supports(Op) const noexcept { unavailable(); }
bool CudaBackend::supports_head_dim(Op, std::size_t) const noexcept { unavailable(); }
void CudaBackend::synchronize() { unavailable(); }
bool CudaBackend::is_capturing() const noexcept { unavailable(); }
std::uint64_t CudaBackend::held_graph() const noexcept { unavailable(); }
std::size_t CudaBackend::graph_retained_allocations() const noexcept { unavailable(); }
std::size_t CudaBackend::world_size() const noexcept { unavailable(); }
std::size_t CudaBackend::rank() const noexcept { unavailable(); }
cudaStream_t CudaBackend::stream() const noexcept { unavailable(); }
void CudaBackend::abandon_capture() noexcept { unavailable(); }
void* CudaBackend::allocate_bytes(std::size_t) { unavailable(); }
void* CudaBackend::allocate_host_bytes(std::size_t) { unavailable(); }
bool CudaBackend::check_wrapped(const void*, std::size_t) const { unavailable(); }
void CudaBackend::do_write_bytes(const char*, Buffer&, std::size_t, const void*, std::size_t) { unavailable(); }
void CudaBackend::do_read_bytes(const char*, const Buffer&, std::size_t, void*, std::size_t) { unavailable(); }
void CudaBackend::do_copy_slice(const char*, const Buffer&, std::size_t, Buffer&, std::size_t, std::size_t) {
  unavailable();
}
void CudaBackend::do_set_decode_state(std::int32_t, std::int32_t, std::int32_t) { unavailable(); }
void CudaBackend::do_advance_decode_state(const Buffer&, Buffer&) { unavailable(); }
void CudaBackend::do_begin_graph_capture() { unavailable(); }
void CudaBackend::do_end_graph_capture() { unavailable(); }
bool CudaBackend::do_replay_last_graph() { unavailable(); }
void CudaBackend::do_reset_graph() { unavailable(); }
void CudaBackend::do_rms_norm(const Buffer&, const Buffer&, float, Buffer&, std::size_t, std::size_t) { unavailable(); }
void CudaBackend::do_fused_add_rms_norm(Buffer&, const Buffer&, const Buffer&, float, Buffer&, std::size_t,
                                        std::size_t) {
  unavailable();
}
void CudaBackend::do_layer_norm(const Buffer&, const Buffer&, const Buffer&, float, Buffer&, std::size_t, std::size_t) {
  unavailable();
}
void CudaBackend::do_gelu(const Buffer&, Buffer&, std::size_t, GeluApproximation) { unavailable(); }
void CudaBackend::do_add_bias(Buffer&, const Buffer&, std::size_t, std::size_t) { unavailable(); }
void CudaBackend::do_add_inplace(Buffer&, const Buffer&, std::size_t) { unavailable(); }
void CudaBackend::do_argmax(const Buffer&, Buffer&, std::size_t, std::size_t) { unavailable(); }
void CudaBackend::do_qkv_rope_append(const Buffer&, const Buffer*, const Buffer*, const Buffer&, const Buffer&, Buffer&,
                                     Buffer&, Buffer&, std::size_t, std::size_t, const QkvRopeAppendConfig&, bool) {
  unavailable();
}
void CudaBackend::do_qkv_rope_append_ragged(const Buffer&, const Buffer*, const Buffer*, const Buffer&, const Buffer&,
                                            Buffer&, Buffer&, Buffer&, const Buffer&, std::size_t,
                                            const QkvRopeAppendConfig&) {
  unavailable();
}
void CudaBackend::do_gemm(const Buffer&, const Buffer&, Buffer&, std::size_t, std::size_t, std::size_t) {
  unavailable();
}
void CudaBackend::do_gemm_silu_mul(const Buffer&, const Buffer&, Buffer&, Buffer&, std::size_t, std::size_t,
                                   std::size_t) {
  unavailable();
}
void CudaBackend::do_embedding_lookup(const Buffer&, const Buffer&, Buffer&, std::size_t, std::size_t, std::size_t,
                                      bool) {
  unavailable();
}
void CudaBackend::do_split_qkv(const Buffer&, Buffer&, Buffer&, Buffer&, std::size_t, std::size_t, std::size_t) {
  unavailable();
}
void CudaBackend::do_fused_silu_mul_split(const Buffer&, Buffer&, std::size_t, std::size_t) { unavailable(); }
void CudaBackend::do_qk_norm_rope(const Buffer&, const Buffer*, const Buffer&, const Buffer&, Buffer&, std::size_t,
                                  std::size_t, std::size_t, std::size_t, std::size_t, float, RopeMode, bool) {
  unavailable();
}
void CudaBackend::do_kv_cache_append_head_major(Buffer&, Buffer&, std::size_t, std::size_t, const Buffer&,
                                                const Buffer&, std::size_t, std::size_t, std::size_t, bool) {
  unavailable();
}
void CudaBackend::do_transpose_head_to_token(const Buffer&, Buffer&, std::size_t, std::size_t, std::size_t) {
  unavailable();
}
void CudaBackend::do_flash_attention(const Buffer&, const Buffer&, const Buffer&, Buffer&, std::size_t, std::size_t,
                                     std::size_t, std::size_t, const AttnConfig&, bool) {
  unavailable();
}
void CudaBackend::do_flash_decode_ragged(const Buffer&, const Buffer&, const Buffer&, Buffer&, const Buffer&,
                                         std::size_t, const AttnConfig&) {
  unavailable();
}
std::unique_ptr<QuantWeight> CudaBackend::do_load_gptq(const GptqHostTensors&) { unavailable(); }
void CudaBackend::do_gemm_gptq(const Buffer&, const QuantWeight&, Buffer&, std::size_t, const char*) { unavailable(); }
void CudaBackend::do_gemm_silu_mul_gptq(const Buffer&, const QuantWeight&, Buffer&, Buffer&, std::size_t) {
  unavailable();
}
void CudaBackend::do_row_sum_squares(const Buffer&, Buffer&, std::size_t, std::size_t) { unavailable(); }
void CudaBackend::do_gemm_gptq_add_residual(const Buffer&, const QuantWeight&, Buffer&, Buffer&, Buffer&, std::size_t) {
  unavailable();
}
void CudaBackend::do_rms_norm_gemm_gptq(const Buffer&, const Buffer&, const Buffer&, float, const QuantWeight&, Buffer&,
                                        Buffer&, std::size_t) {
  unavailable();
}
void CudaBackend::do_rms_norm_gemm_silu_mul_gptq(const Buffer&, const Buffer&, const Buffer&, float, const QuantWeight&,
                                                 Buffer&, Buffer&, Buffer&, std::size_t) {
  unavailable();
}
void CudaBackend::do_all_reduce(Buffer&, std::size_t, ReduceOp) { unavailable(); }
void CudaBackend::do_all_gather(const Buffer&, Buffer&, std::size_t) { unavailable(); }
void CudaBackend::do_broadcast(Buffer&, std::size_t, std::size_t) { unavailable(); }
void CudaBackend::do_reduce_scatter(const Buffer&, Buffer&, std::size_t, ReduceOp) { unavailable(); }

}  // namespace ferrum
