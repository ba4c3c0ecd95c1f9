// qkv_rope_append against the op sequence it replaces, on the same backend:
// split_qkv → qk_norm_rope (q) → qk_norm_rope (k) → transpose_head_to_token
// (v) → kv_cache_append_head_major. q_out and both caches must be bitwise
// equal (the same arithmetic row for row), including the cache rows the
// append must not touch (poisoned first). Runs on CpuBackend in CI and on
// CudaBackend where a GPU is present (skipped otherwise): head_dim 64, 128,
// 256 and 512 take the CUDA vector path, head_dim 6 and misaligned views the
// general path; RopeOnly and NormAndRope; 1, 2, 3 and 17 tokens at an
// offset; and a device-state step (tokens = 1, the position from the decode
// state). On CudaBackend the fused op is also checked against CpuBackend's
// (q_out and k_cache within the tolerance table, v_cache bitwise).
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "support/test_support.hpp"

namespace ferrum::test {
namespace {

struct Case {
  std::size_t tokens, heads, kv_heads, head_dim, pos_offset;
  RopeMode mode;
  std::size_t lead;  // qkv view offset in elements (1: not 16-byte aligned)
};

constexpr std::size_t kCapacity = 40, kMaxPos = 48;

// What an append wrote: q_out and both caches.
struct AppendOutputs {
  const GuardedOutput* q_out;
  const GuardedOutput* k_cache;
  const GuardedOutput* v_cache;
};

// `got` bitwise equal to `want` (untouched cache rows included), and no
// write past any of the six buffers.
void expect_same_append(const AppendOutputs& got, const AppendOutputs& want, DType dt) {
  const std::size_t es = size_of(dt);
  EXPECT_TRUE(bitwise_equal(got.q_out->bytes(), want.q_out->bytes(), es)) << "q_out";
  EXPECT_TRUE(bitwise_equal(got.k_cache->bytes(), want.k_cache->bytes(), es)) << "k_cache";
  EXPECT_TRUE(bitwise_equal(got.v_cache->bytes(), want.v_cache->bytes(), es)) << "v_cache";
  for (const GuardedOutput* out : {got.q_out, got.k_cache, got.v_cache, want.q_out, want.k_cache, want.v_cache}) {
    EXPECT_TRUE(out->check_guard());
  }
}

// The fused op's inputs on one backend: qkv (`lead` elements into its
// allocation), the two norm weights and the rope tables.
struct FusedInputs {
  DeviceTensor qkv, q_norm, k_norm, cos, sin;
  FusedInputs(Backend& be, const HostTensor& qkv_host, std::size_t lead, const HostTensor& q_norm_host,
              const HostTensor& k_norm_host, const RopeTables& tables)
      : qkv(be, qkv_host, lead), q_norm(be, q_norm_host), k_norm(be, k_norm_host), cos(be, tables.cos),
        sin(be, tables.sin) {}
};

class QkvRopeAppend : public BackendTest {
 protected:
  void run(const Case& c, DType dt, Rng& rng, bool device_state) {
    Backend& be = backend();
    SCOPED_TRACE(cat(to_string(dt), " tokens=", c.tokens, " heads=", c.heads, "/", c.kv_heads, " hd=", c.head_dim,
                     " pos=", c.pos_offset, c.mode == RopeMode::NormAndRope ? " norm" : " rope-only",
                     " lead=", c.lead, device_state ? " device-state" : ""));
    const std::size_t hd = c.head_dim, row = (c.heads + 2 * c.kv_heads) * hd;
    const RopeTables tables = make_rope_tables(kMaxPos, hd, kRopeTheta10k);
    const HostTensor qkv_host = random_normal(rng, dt, c.tokens * row);
    const HostTensor q_norm_host = random_uniform(rng, dt, hd, 0.5f, 1.5f);
    const HostTensor k_norm_host = random_uniform(rng, dt, hd, 0.5f, 1.5f);
    const FusedInputs in(be, qkv_host, c.lead, q_norm_host, k_norm_host, tables);
    const DeviceTensor &qkv = in.qkv, &q_norm = in.q_norm, &k_norm = in.k_norm, &cos = in.cos, &sin = in.sin;
    const bool norm = c.mode == RopeMode::NormAndRope;
    const float eps = 1e-6f;
    // In device-state mode the host position is a decoy the ops must ignore.
    const std::size_t host_pos = device_state ? c.pos_offset / 2 + 1 : c.pos_offset;
    const QkvRopeAppendConfig cfg{.heads = c.heads, .kv_heads = c.kv_heads, .head_dim = hd, .capacity = kCapacity,
                                  .max_pos = kMaxPos, .eps = eps, .mode = c.mode};
    // The fused op on one backend's copy of the inputs (this backend's, and
    // on CUDA CpuBackend's as the reference).
    auto fused_append = [&](Backend& on, const FusedInputs& x, GuardedOutput& q_o, GuardedOutput& k_c,
                            GuardedOutput& v_c) {
      on.qkv_rope_append(x.qkv.view(), norm ? &x.q_norm.view() : nullptr, norm ? &x.k_norm.view() : nullptr,
                         x.cos.view(), x.sin.view(), q_o.view(), k_c.view(), v_c.view(), c.tokens, host_pos, cfg);
    };

    // The sequence the fused op replaces. Its scratch is offset like qkv, so
    // that on CUDA both take the same rope path (the vector and general
    // paths sum the norm in different orders).
    std::vector<Buffer> parents;
    auto scratch = [&](std::size_t n) {
      parents.push_back(be.alloc(dt, n + c.lead));
      return parents.back().view(c.lead, n);
    };
    Buffer q = scratch(c.tokens * c.heads * hd), k = scratch(c.tokens * c.kv_heads * hd),
           v = scratch(c.tokens * c.kv_heads * hd);
    Buffer k_heads = scratch(c.kv_heads * c.tokens * hd), v_heads = scratch(c.kv_heads * c.tokens * hd);
    // Outputs of both paths, guarded: q poisoned, the caches holding the same
    // random rows (rows the append must not touch stay as they were).
    const HostTensor cache_rows = random_normal(rng, dt, c.kv_heads * kCapacity * hd);
    GuardedOutput q_ref(be, dt, c.heads * c.tokens * hd, c.lead), q_out(be, dt, c.heads * c.tokens * hd);
    GuardedOutput k_cache_ref(be, cache_rows), v_cache_ref(be, cache_rows), k_cache(be, cache_rows),
        v_cache(be, cache_rows);

    {
      DeviceStateScope scope(be, device_state);
      if (device_state) be.set_decode_state(3, static_cast<std::uint32_t>(c.pos_offset));
      be.split_qkv(qkv.view(), q, k, v, c.tokens, c.heads * hd, c.kv_heads * hd);
      be.qk_norm_rope(q, norm ? &q_norm.view() : nullptr, cos.view(), sin.view(), q_ref.view(), c.tokens, c.heads, hd,
                      host_pos, kMaxPos, eps, c.mode);
      be.qk_norm_rope(k, norm ? &k_norm.view() : nullptr, cos.view(), sin.view(), k_heads, c.tokens, c.kv_heads, hd,
                      host_pos, kMaxPos, eps, c.mode);
      be.transpose_head_to_token(v, v_heads, /*tokens=*/c.kv_heads, /*heads=*/c.tokens, hd);
      be.kv_cache_append_head_major(k_cache_ref.view(), v_cache_ref.view(), host_pos, kCapacity, k_heads, v_heads, c.tokens,
                                    c.kv_heads, hd);
      fused_append(be, in, q_out, k_cache, v_cache);
      be.synchronize();
    }
    expect_same_append({&q_out, &k_cache, &v_cache}, {&q_ref, &k_cache_ref, &v_cache_ref}, dt);

    // On CUDA also against CpuBackend, the reference: the chain above shares
    // the rope rows' code with the fused kernel, so equality with it alone
    // would not catch a bug there. q_out and k_cache within the table's
    // tolerance (the norm's sums run in another order), v_cache bitwise (a
    // copy), untouched cache rows included.
    if (GetParam() != BackendKind::Cuda) return;
    const std::unique_ptr<Backend> cpu = make_backend(BackendKind::Cpu);
    const FusedInputs cpu_in(*cpu, qkv_host, c.lead, q_norm_host, k_norm_host, tables);
    GuardedOutput cpu_q(*cpu, dt, c.heads * c.tokens * hd), cpu_k(*cpu, cache_rows), cpu_v(*cpu, cache_rows);
    {
      DeviceStateScope scope(*cpu, device_state);
      if (device_state) cpu->set_decode_state(3, static_cast<std::uint32_t>(c.pos_offset));
      fused_append(*cpu, cpu_in, cpu_q, cpu_k, cpu_v);
      cpu->synchronize();
    }
    EXPECT_TRUE(all_close(q_out.values(), cpu_q.values(), dt)) << "q_out against CpuBackend";
    EXPECT_TRUE(all_close(k_cache.values(), cpu_k.values(), dt)) << "k_cache against CpuBackend";
    EXPECT_TRUE(bitwise_equal(v_cache.bytes(), cpu_v.bytes(), size_of(dt))) << "v_cache against CpuBackend";
  }
};

TEST_P(QkvRopeAppend, BitwiseEqualsTheOpsItReplaces) {
  FERRUM_SEEDED_RNG(rng);
  const Case cases[] = {
      {1, 32, 8, 128, 0, RopeMode::RopeOnly, 0},     // a Llama decode step
      {1, 16, 8, 128, 39, RopeMode::NormAndRope, 0}, // a Qwen3 step at the last cache row
      {3, 4, 2, 64, 5, RopeMode::NormAndRope, 0},
      {17, 4, 1, 64, 11, RopeMode::RopeOnly, 0},
      {3, 2, 1, 6, 2, RopeMode::NormAndRope, 0},     // head_dim 6: the general path
      {3, 4, 2, 128, 1, RopeMode::NormAndRope, 1},   // misaligned qkv: the general path
      // The largest head sizes: CUDA's vector path with 16 / 32 lanes per row
      // (two rows / one row per warp) and its general path with 4 / 8 pairs
      // per lane.
      {3, 8, 2, 256, 9, RopeMode::NormAndRope, 0},
      {2, 4, 4, 256, 38, RopeMode::RopeOnly, 0},
      {3, 4, 2, 256, 20, RopeMode::RopeOnly, 1},
      {2, 4, 2, 512, 3, RopeMode::RopeOnly, 0},
      {1, 8, 2, 512, 39, RopeMode::NormAndRope, 0},
      {3, 2, 1, 512, 14, RopeMode::NormAndRope, 1},
  };
  for (DType dt : kHalfDTypes) {
    for (const Case& c : cases) run(c, dt, rng, /*device_state=*/false);
  }
}

TEST_P(QkvRopeAppend, DeviceStateStepBitwiseEqualsTheOpsItReplaces) {
  FERRUM_SEEDED_RNG(rng);
  for (DType dt : kHalfDTypes) {
    run({1, 32, 8, 128, 23, RopeMode::RopeOnly, 0}, dt, rng, /*device_state=*/true);
    run({1, 16, 8, 128, 39, RopeMode::NormAndRope, 0}, dt, rng, /*device_state=*/true);
  }
}

FERRUM_INSTANTIATE_ON_ALL_BACKENDS(QkvRopeAppend);

// qkv_rope_append_ragged against one single-token qkv_rope_append per
// sequence at its own position, into that sequence's views, on the same
// backend: q_out and both caches bitwise equal, untouched cache rows kept.
class QkvRopeAppendRagged : public BackendTest {
 protected:
  void run(std::size_t heads, std::size_t kv_heads, std::size_t hd, RopeMode mode, std::size_t lead,
           const std::vector<std::int32_t>& positions, DType dt, Rng& rng) {
    Backend& be = backend();
    const std::size_t batch = positions.size(), row = (heads + 2 * kv_heads) * hd, q_row = heads * hd;
    const std::size_t seq = kv_heads * kCapacity * hd;
    SCOPED_TRACE(cat(to_string(dt), " batch=", batch, " heads=", heads, "/", kv_heads, " hd=", hd,
                     mode == RopeMode::NormAndRope ? " norm" : " rope-only", " lead=", lead));
    const RopeTables tables = make_rope_tables(kMaxPos, hd, kRopeTheta10k);
    DeviceTensor qkv(be, random_normal(rng, dt, batch * row), lead);
    DeviceTensor q_norm(be, random_uniform(rng, dt, hd, 0.5f, 1.5f));
    DeviceTensor k_norm(be, random_uniform(rng, dt, hd, 0.5f, 1.5f));
    DeviceTensor cos(be, tables.cos), sin(be, tables.sin);
    Buffer pos = be.alloc(DType::I32, batch);
    be.write_bytes(pos, positions.data(), batch * sizeof(std::int32_t));
    const bool norm = mode == RopeMode::NormAndRope;
    const HostTensor cache_rows = random_normal(rng, dt, batch * seq);
    GuardedOutput q_ref(be, dt, batch * q_row), q_out(be, dt, batch * q_row, lead);
    GuardedOutput k_ref(be, cache_rows), v_ref(be, cache_rows), k_cache(be, cache_rows), v_cache(be, cache_rows);
    const QkvRopeAppendConfig cfg{.heads = heads, .kv_heads = kv_heads, .head_dim = hd, .capacity = kCapacity,
                                  .max_pos = kMaxPos, .eps = 1e-6f, .mode = mode};
    for (std::size_t b = 0; b < batch; ++b) {
      Buffer q_b = q_ref.view().view(b * q_row, q_row), k_b = k_ref.view().view(b * seq, seq),
             v_b = v_ref.view().view(b * seq, seq);
      be.qkv_rope_append(qkv.view().view(b * row, row), norm ? &q_norm.view() : nullptr,
                         norm ? &k_norm.view() : nullptr, cos.view(), sin.view(), q_b, k_b, v_b, 1,
                         static_cast<std::size_t>(positions[b]), cfg);
    }
    be.qkv_rope_append_ragged(qkv.view(), norm ? &q_norm.view() : nullptr, norm ? &k_norm.view() : nullptr,
                              cos.view(), sin.view(), q_out.view(), k_cache.view(), v_cache.view(), pos, batch, cfg);
    be.synchronize();
    expect_same_append({&q_out, &k_cache, &v_cache}, {&q_ref, &k_ref, &v_ref}, dt);
  }
};

TEST_P(QkvRopeAppendRagged, BitwiseEqualsOneAppendPerSequence) {
  FERRUM_SEEDED_RNG(rng);
  for (DType dt : kHalfDTypes) {
    run(32, 8, 128, RopeMode::RopeOnly, 0, {7}, dt, rng);                    // batch 1: a Llama step
    run(16, 8, 128, RopeMode::NormAndRope, 0, {5, 0, 39, 17}, dt, rng);     // Qwen3, ragged, the last row
    run(4, 1, 64, RopeMode::RopeOnly, 0, {3, 3, 12}, dt, rng);              // two sequences at one position
    run(2, 1, 6, RopeMode::NormAndRope, 0, {1, 30, 2, 9, 0}, dt, rng);      // head_dim 6: the general path
    run(4, 2, 128, RopeMode::NormAndRope, 1, {20, 4, 11}, dt, rng);         // misaligned: the general path
    // The largest head sizes, as in BitwiseEqualsTheOpsItReplaces.
    run(8, 2, 256, RopeMode::NormAndRope, 0, {5, 0, 39}, dt, rng);
    run(4, 4, 256, RopeMode::RopeOnly, 0, {12, 30}, dt, rng);
    run(4, 1, 256, RopeMode::RopeOnly, 1, {3, 38, 3}, dt, rng);
    run(4, 2, 512, RopeMode::RopeOnly, 0, {39, 1, 22}, dt, rng);
    run(2, 1, 512, RopeMode::NormAndRope, 0, {7, 7}, dt, rng);
    run(2, 2, 512, RopeMode::NormAndRope, 1, {0, 33}, dt, rng);
  }
}

FERRUM_INSTANTIATE_ON_ALL_BACKENDS(QkvRopeAppendRagged);

// CpuBackend refuses a position past the caches or the tables, or negative,
// before writing anything (CudaBackend reports it as DeviceCheck:
// tests/gpu/test_ops_cuda.cpp); with the tables ending first and with the
// caches ending first. Ragged: positions[1] of three sequences; else the
// decode-state position of a one-token qkv_rope_append.
void expect_positions_refused(bool ragged, std::size_t capacity, std::size_t table_rows) {
  SCOPED_TRACE(cat(ragged ? "ragged" : "decode state", ", capacity ", capacity, ", table rows ", table_rows));
  CpuBackend cpu;
  constexpr std::size_t kHeads = 2, kKv = 1, kHd = 8;
  const std::size_t seqs = ragged ? 3 : 1;
  const std::size_t q_len = seqs * kHeads * kHd, cache_len = seqs * kKv * capacity * kHd;
  Buffer qkv = cpu.alloc(DType::F16, seqs * (kHeads + 2 * kKv) * kHd), q_out = cpu.alloc(DType::F16, q_len);
  Buffer k_cache = cpu.alloc(DType::F16, cache_len), v_cache = cpu.alloc(DType::F16, cache_len);
  Buffer cos = cpu.alloc(DType::F32, table_rows * kHd / 2), sin = cpu.alloc(DType::F32, table_rows * kHd / 2);
  Buffer pos = cpu.alloc(DType::I32, seqs);
  cpu.write(qkv, std::vector<float>(seqs * (kHeads + 2 * kKv) * kHd, 1.0f));
  cpu.write(cos, std::vector<float>(table_rows * kHd / 2, 1.0f));
  cpu.write(sin, std::vector<float>(table_rows * kHd / 2, 0.5f));
  cpu.write(k_cache, std::vector<float>(cache_len, 0.0f));
  cpu.write(v_cache, std::vector<float>(cache_len, 0.0f));
  const QkvRopeAppendConfig cfg{.heads = kHeads, .kv_heads = kKv, .head_dim = kHd, .capacity = capacity, .max_pos = table_rows};
  const auto last = static_cast<std::int32_t>(std::min(capacity, table_rows)) - 1;
  DeviceStateScope scope(cpu, !ragged);
  auto step_at = [&](std::int32_t middle) {
    if (ragged) {
      const std::int32_t p[3] = {0, middle, last};
      cpu.write_bytes(pos, p, sizeof p);
      cpu.qkv_rope_append_ragged(qkv, nullptr, nullptr, cos, sin, q_out, k_cache, v_cache, pos, seqs, cfg);
    } else {
      cpu.set_decode_state(0, static_cast<std::uint32_t>(middle));
      cpu.qkv_rope_append(qkv, nullptr, nullptr, cos, sin, q_out, k_cache, v_cache, 1, 0, cfg);
    }
  };
  EXPECT_NO_THROW(step_at(last));  // the last row both hold
  const std::vector<float> q_before = cpu.download(q_out, q_len);
  const std::vector<float> k_before = cpu.download(k_cache, cache_len);
  const std::vector<float> v_before = cpu.download(v_cache, cache_len);
  cpu.write(qkv, std::vector<float>(seqs * (kHeads + 2 * kKv) * kHd, 2.0f));  // a write would now differ
  // -1: a ragged position only (set_decode_state refuses it itself).
  for (std::int32_t bad : {static_cast<std::int32_t>(table_rows), static_cast<std::int32_t>(capacity), 1000, -1}) {
    if (bad < 0 && !ragged) continue;
    SCOPED_TRACE(cat("position ", bad));
    // The op, and the argument with the value it was given.
    expect_error(ErrorCode::CapacityExceeded, ragged ? "qkv_rope_append_ragged" : "qkv_rope_append",
                 [&] { step_at(bad); }, cat(ragged ? "positions[1]" : "decode-state position", " = ", bad));
    EXPECT_EQ(cpu.download(q_out, q_len), q_before);
    EXPECT_EQ(cpu.download(k_cache, cache_len), k_before);
    EXPECT_EQ(cpu.download(v_cache, cache_len), v_before);
  }
}

TEST(CpuQkvRopeAppendRagged, PositionOutOfRangeThrowsAndWritesNothing) {
  expect_positions_refused(/*ragged=*/true, /*capacity=*/8, /*table rows=*/6);
  expect_positions_refused(/*ragged=*/true, /*capacity=*/5, /*table rows=*/9);
}

TEST(CpuQkvRopeAppend, DecodeStatePositionOutOfRangeThrowsAndWritesNothing) {
  expect_positions_refused(/*ragged=*/false, /*capacity=*/8, /*table rows=*/6);
  expect_positions_refused(/*ragged=*/false, /*capacity=*/5, /*table rows=*/9);
}

}  // namespace
}  // namespace ferrum::test
