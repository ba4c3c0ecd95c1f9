// The kernel-level attention arguments as the GPU tests fill them (decode
// knobs, the wgmma prefill): one place for the operands and the geometry,
// so the cases cannot drift apart in how they describe a launch.
#pragma once

#include <cmath>

#include "ferrum/dtype.hpp"
#include "kernels/attention.hpp"

namespace ferrum::test {

struct AttentionGeometry {
  int batch = 1;
  int heads = 0;
  int kv_heads = 0;
  int q_len = 1;
  int head_dim = 0;
  long long kv_stride = 0;  // positions per kv head in k / v
  int kv_len = 0;
  long long pos_offset = 0;  // position of query 0
  bool causal = true;
};

// dtype, q / k / v / out and the geometry; the softmax scale
// 1 / sqrt(head_dim). Everything else keeps AttentionArgs' defaults: the
// caller sets what its case varies (another scale, the decode state or
// kv_lens, the error flag, the workspace, the tunings).
inline kernels::AttentionArgs attention_args(DType dtype,
                                             const void* q,    // [batch, heads, q_len, head_dim]
                                             const void* k,    // [batch, kv_heads, kv_stride, head_dim]
                                             const void* v,    // [batch, kv_heads, kv_stride, head_dim]
                                             void* out,        // [batch, heads, q_len, head_dim]
                                             const AttentionGeometry& g) {
  kernels::AttentionArgs a;
  a.dtype = dtype;
  a.q = q;
  a.k = k;
  a.v = v;
  a.out = out;
  a.batch = g.batch;
  a.num_heads = g.heads;
  a.num_kv_heads = g.kv_heads;
  a.q_len = g.q_len;
  a.head_dim = g.head_dim;
  a.kv_stride = g.kv_stride;
  a.kv_len = g.kv_len;
  a.pos_offset = g.pos_offset;
  a.causal = g.causal;
  a.scale = 1.0f / std::sqrt(static_cast<float>(g.head_dim));
  return a;
}

}  // namespace ferrum::test
