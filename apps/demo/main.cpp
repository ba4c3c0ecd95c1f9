// ferrum_demo: runs one transformer layer's op sequence the way an engine
// calls it (embedding, then per layer fused add + rms_norm -> qkv gemm ->
// split -> q/k norm + RoPE -> v transpose -> KV append -> rms_norm -> gate/up
// gemm -> SiLU·mul -> down gemm, then one residual add; no attention) on
// random weights, on the CUDA backend when a GPU is present and on the CPU
// backend otherwise, and reports what it did. With a GPU it also runs the
// CPU backend on the same inputs and reports the largest difference.
//
// Usage: ferrum_demo [--cpu] [--tokens N] [--layers N]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <ferrum/ferrum.hpp>

namespace {

struct Shape {
  std::size_t vocab = 4096;
  std::size_t dim = 512;
  std::size_t heads = 8;
  std::size_t kv_heads = 2;
  std::size_t head_dim = 64;
  std::size_t intermediate = 1408;
  std::size_t capacity = 256;
  float eps = 1e-6f;
};

std::vector<float> random_vector(std::size_t n, float scale, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Host copies of the random weights, so two backends get identical inputs.
struct HostWeights {
  std::vector<float> embedding, attn_norm, qkv, q_norm, k_norm, mlp_norm, gate_up, down, cos, sin;
};

HostWeights make_weights(const Shape& s, std::uint32_t seed) {
  std::mt19937 rng(seed);
  HostWeights w;
  const std::size_t qkv_rows = (s.heads + 2 * s.kv_heads) * s.head_dim;
  w.embedding = random_vector(s.vocab * s.dim, 1.0f, rng);
  w.attn_norm = random_vector(s.dim, 1.0f, rng);
  w.qkv = random_vector(qkv_rows * s.dim, 1.0f / std::sqrt(static_cast<float>(s.dim)), rng);
  w.q_norm = random_vector(s.head_dim, 1.0f, rng);
  w.k_norm = random_vector(s.head_dim, 1.0f, rng);
  w.mlp_norm = random_vector(s.dim, 1.0f, rng);
  w.gate_up = random_vector(2 * s.intermediate * s.dim, 1.0f / std::sqrt(static_cast<float>(s.dim)), rng);
  w.down = random_vector(s.dim * s.intermediate, 1.0f / std::sqrt(static_cast<float>(s.intermediate)), rng);
  const std::size_t half = s.head_dim / 2;
  w.cos.resize(s.capacity * half);
  w.sin.resize(s.capacity * half);
  for (std::size_t p = 0; p < s.capacity; ++p) {
    for (std::size_t i = 0; i < half; ++i) {
      const double freq = std::pow(1000000.0, -2.0 * static_cast<double>(i) / static_cast<double>(s.head_dim));
      w.cos[p * half + i] = static_cast<float>(std::cos(static_cast<double>(p) * freq));
      w.sin[p * half + i] = static_cast<float>(std::sin(static_cast<double>(p) * freq));
    }
  }
  return w;
}

struct LayerRun {
  std::vector<float> hidden;  // final residual stream
  double seconds = 0.0;
  std::size_t ops = 0;
};

LayerRun run_layers(ferrum::Backend& be, const Shape& s, const HostWeights& hw, std::size_t tokens,
                    std::size_t layers, std::uint32_t seed) {
  using ferrum::DType;
  const DType dt = DType::F16;
  const std::size_t q_dim = s.heads * s.head_dim;
  const std::size_t kv_dim = s.kv_heads * s.head_dim;
  const std::size_t qkv_dim = q_dim + 2 * kv_dim;

  ferrum::Buffer embedding = be.upload(hw.embedding, dt);
  ferrum::Buffer attn_norm = be.upload(hw.attn_norm, dt);
  ferrum::Buffer qkv_w = be.upload(hw.qkv, dt);
  ferrum::Buffer q_norm = be.upload(hw.q_norm, dt);
  ferrum::Buffer k_norm = be.upload(hw.k_norm, dt);
  ferrum::Buffer mlp_norm = be.upload(hw.mlp_norm, dt);
  ferrum::Buffer gate_up_w = be.upload(hw.gate_up, dt);
  ferrum::Buffer down_w = be.upload(hw.down, dt);
  ferrum::Buffer cos = be.upload(hw.cos, DType::F32);
  ferrum::Buffer sin = be.upload(hw.sin, DType::F32);

  std::mt19937 rng(seed);
  std::vector<float> ids(tokens);
  for (float& id : ids) id = static_cast<float>(rng() % s.vocab);
  ferrum::Buffer ids_b = be.upload(ids, DType::I32);

  ferrum::Buffer residual = be.alloc(dt, tokens * s.dim);
  ferrum::Buffer normed = be.alloc(dt, tokens * s.dim);
  ferrum::Buffer qkv = be.alloc(dt, tokens * qkv_dim);
  ferrum::Buffer q = be.alloc(dt, tokens * q_dim);
  ferrum::Buffer k = be.alloc(dt, tokens * kv_dim);
  ferrum::Buffer v = be.alloc(dt, tokens * kv_dim);
  ferrum::Buffer q_hm = be.alloc(dt, tokens * q_dim);
  ferrum::Buffer k_hm = be.alloc(dt, tokens * kv_dim);
  ferrum::Buffer v_hm = be.alloc(dt, tokens * kv_dim);
  ferrum::Buffer cache_k = be.alloc(dt, s.kv_heads * s.capacity * s.head_dim);
  ferrum::Buffer cache_v = be.alloc(dt, s.kv_heads * s.capacity * s.head_dim);
  ferrum::Buffer gate_up = be.alloc(dt, tokens * 2 * s.intermediate);
  ferrum::Buffer act = be.alloc(dt, tokens * s.intermediate);
  ferrum::Buffer mlp_out = be.alloc(dt, tokens * s.dim);

  LayerRun run;
  be.write(mlp_out, std::vector<float>(tokens * s.dim, 0.0f));  // no MLP output before layer 0
  const auto t0 = std::chrono::steady_clock::now();
  be.embedding_lookup(embedding, ids_b, residual, tokens, s.dim, s.vocab);
  ++run.ops;
  for (std::size_t layer = 0; layer < layers; ++layer) {
    // residual += previous layer's MLP output; normed = rms_norm(residual)
    be.fused_add_rms_norm(residual, mlp_out, attn_norm, s.eps, normed, tokens, s.dim);
    be.gemm(normed, qkv_w, qkv, tokens, qkv_dim, s.dim);
    be.split_qkv(qkv, q, k, v, tokens, q_dim, kv_dim);
    be.qk_norm_rope(q, &q_norm, cos, sin, q_hm, tokens, s.heads, s.head_dim, 0, s.capacity, s.eps,
                    ferrum::RopeMode::NormAndRope);
    be.qk_norm_rope(k, &k_norm, cos, sin, k_hm, tokens, s.kv_heads, s.head_dim, 0, s.capacity, s.eps,
                    ferrum::RopeMode::NormAndRope);
    // v is token-major [tokens, kv_heads, hd]; the cache wants head-major:
    // read it as [heads=tokens, tokens=kv_heads, hd] and swap the two.
    be.transpose_head_to_token(v, v_hm, s.kv_heads, tokens, s.head_dim);
    be.kv_cache_append_head_major(cache_k, cache_v, 0, s.capacity, k_hm, v_hm, tokens, s.kv_heads, s.head_dim);
    be.rms_norm(residual, mlp_norm, s.eps, normed, tokens, s.dim);
    be.gemm(normed, gate_up_w, gate_up, tokens, 2 * s.intermediate, s.dim);
    be.fused_silu_mul_split(gate_up, act, tokens, s.intermediate);
    be.gemm(act, down_w, mlp_out, tokens, s.dim, s.intermediate);
    run.ops += 11;
  }
  be.add_inplace(residual, mlp_out, tokens * s.dim);
  ++run.ops;
  be.synchronize();
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  run.hidden = be.download(residual, tokens * s.dim);
  return run;
}

void usage() {
  std::printf("usage: ferrum_demo [--cpu] [--tokens N] [--layers N]\n");
}

}  // namespace

int main(int argc, char** argv) {
  bool force_cpu = false;
  std::size_t tokens = 16;
  std::size_t layers = 4;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--cpu") {
      force_cpu = true;
    } else if (arg == "--tokens" && i + 1 < argc) {
      tokens = std::strtoul(argv[++i], nullptr, 10);
    } else if (arg == "--layers" && i + 1 < argc) {
      layers = std::strtoul(argv[++i], nullptr, 10);
    } else {
      usage();
      return arg == "--help" ? 0 : 2;
    }
  }
  const Shape shape;
  if (tokens == 0 || tokens > shape.capacity || layers == 0) {
    std::printf("ferrum_demo: --tokens must be 1..%zu and --layers at least 1\n", shape.capacity);
    return 2;
  }
  try {
    const HostWeights weights = make_weights(shape, 1234);
    std::unique_ptr<ferrum::Backend> backend;
    if (force_cpu) {
      backend = std::make_unique<ferrum::CpuBackend>();
    } else {
      backend = ferrum::make_default_backend();
    }
    std::printf("ferrum_demo: backend %s\n", backend->name().c_str());
    std::printf("  model: dim %zu, heads %zu/%zu (q/kv), head_dim %zu, intermediate %zu, vocab %zu, f16\n",
                shape.dim, shape.heads, shape.kv_heads, shape.head_dim, shape.intermediate, shape.vocab);
    std::printf("  running %zu layer(s) over %zu token(s): embedding; per layer fused add + rms_norm, qkv gemm,\n"
                "  split_qkv, q/k norm + RoPE, v transpose, KV append, rms_norm, gate/up gemm, SiLU*mul, down gemm;\n"
                "  then residual add\n",
                layers, tokens);
    const LayerRun run = run_layers(*backend, shape, weights, tokens, layers, 99);
    double sum = 0.0, sum_sq = 0.0;
    for (float x : run.hidden) {
      sum += x;
      sum_sq += static_cast<double>(x) * x;
    }
    std::printf("  %zu ops in %.3f ms; hidden state: mean %.6f, rms %.6f\n", run.ops, run.seconds * 1e3,
                sum / static_cast<double>(run.hidden.size()), std::sqrt(sum_sq / static_cast<double>(run.hidden.size())));
    if (backend->kind() == ferrum::BackendKind::Cuda) {
      ferrum::CpuBackend cpu;
      const LayerRun ref = run_layers(cpu, shape, weights, tokens, layers, 99);
      double max_diff = 0.0, max_ref = 0.0;
      for (std::size_t i = 0; i < ref.hidden.size(); ++i) {
        max_diff = std::max(max_diff, static_cast<double>(std::fabs(run.hidden[i] - ref.hidden[i])));
        max_ref = std::max(max_ref, static_cast<double>(std::fabs(ref.hidden[i])));
      }
      std::printf("  CPU reference on the same inputs: max |cuda - cpu| = %.4g (max |cpu| = %.4g)\n", max_diff,
                  max_ref);
    }
    std::printf("ferrum_demo: ok\n");
    return 0;
  } catch (const ferrum::Error& e) {
    std::printf("ferrum_demo: error: %s\n", e.what());
    return 1;
  }
}
