// Activation formulas shared by every kernel that applies them, so a fused
// path and the op it fuses give the same bits.
#pragma once

namespace ferrum::kernels {

// SwiGLU's silu(gate) * up in fp32 (__expf: the fast exponential, as every
// silu of the library).
__device__ __forceinline__ float silu_mul(float gate, float up) { return (gate / (1.0f + __expf(-gate))) * up; }

}  // namespace ferrum::kernels
