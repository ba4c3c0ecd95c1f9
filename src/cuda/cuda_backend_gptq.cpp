// CudaBackend: GPTQ INT4 weights (load_gptq, gemm_gptq).
#include "ferrum/cuda_backend.hpp"

#include "common/fail.hpp"

namespace ferrum {

std::unique_ptr<QuantWeight> CudaBackend::do_load_gptq(const GptqHostTensors& tensors) {
  return Backend::do_load_gptq(tensors);  // Unsupported until the INT4 kernel lands
}

void CudaBackend::do_gemm_gptq(const Buffer& a, const QuantWeight& w, Buffer& out, std::size_t m) {
  Backend::do_gemm_gptq(a, w, out, m);
}

}  // namespace ferrum
