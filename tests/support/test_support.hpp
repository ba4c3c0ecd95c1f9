// Shared test machinery: seeded randomness, host tensors, uploads with
// unaligned starts, poisoned and guarded outputs, the comparisons (allclose
// per tolerance.hpp, bitwise), error expectations, backend fixtures and RoPE
// tables. Every test file shares code through tests/support only.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <random>
#include <source_location>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "ferrum/ferrum.hpp"
#include "support/tolerance.hpp"

namespace ferrum {
// gtest printers (found by ADL), so failure messages show "f16" / "Cuda".
inline void PrintTo(DType dtype, std::ostream* os) { *os << to_string(dtype); }
inline void PrintTo(BackendKind kind, std::ostream* os) { *os << (kind == BackendKind::Cuda ? "Cuda" : "Cpu"); }
}  // namespace ferrum

namespace ferrum::test {

// ── Strings ──────────────────────────────────────────────────────────────────

// Concatenates anything streamable: cat("tokens=", 7, " dim=", 769).
template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream s;
  (s << ... << args);
  return s.str();
}

// ── Seeded randomness ────────────────────────────────────────────────────────

// Every test draws FRESH inputs: the seed comes from std::random_device, or
// from the environment variable FERRUM_TEST_SEED to reproduce a failure
// (read once, by the test binaries' main: support/main/test_main.cpp; every
// default-constructed Rng then takes it).
// Use FERRUM_SEEDED_RNG so the seed is printed with every failure.

// FERRUM_TEST_SEED's text as strtoull reads it (decimal, 0x hex, 0-prefixed
// octal); nullopt for unset or empty. Anything else (junk, a sign, a value
// past 64 bits) throws std::invalid_argument: a typo must not quietly seed
// every test with 0.
std::optional<std::uint64_t> parse_seed_override(const char* text);
// The seed every default-constructed Rng takes (nullopt: a fresh one each).
void set_seed_override(std::optional<std::uint64_t> seed);

class Rng {
 public:
  Rng();
  explicit Rng(std::uint64_t seed);

  std::uint64_t seed() const noexcept { return seed_; }
  // "seed=N (reproduce with FERRUM_TEST_SEED=N)", for SCOPED_TRACE.
  std::string describe() const;
  std::mt19937_64& engine() noexcept { return engine_; }

  float uniform(float lo, float hi);
  float normal(float mean, float stddev);
  // Uniform in [0, n).
  std::uint32_t below(std::uint32_t n);
  std::uint32_t bits32();

 private:
  std::uint64_t seed_;
  std::mt19937_64 engine_;
};

// Declares `name` and SCOPED_TRACEs its seed for the rest of the scope: two
// declarations, for block scope only (not the body of an unbraced if / else).
#define FERRUM_SEEDED_RNG(name)       \
  ::ferrum::test::Rng name;           \
  SCOPED_TRACE(name.describe())

std::vector<float> uniform_values(Rng& rng, std::size_t n, float lo = -1.0f, float hi = 1.0f);
std::vector<float> normal_values(Rng& rng, std::size_t n, float mean = 0.0f, float stddev = 1.0f);

// ── Host tensors ─────────────────────────────────────────────────────────────

// f32 -> `dtype` -> f32 (RNE): the value a buffer of `dtype` holds after write().
float round_to(DType dtype, float value);

// Values exactly representable in `dtype` (so uploading them is lossless and
// an fp64 reference can take them as the exact inputs).
struct HostTensor {
  DType dtype = DType::F16;
  std::vector<float> values;

  std::size_t size() const noexcept { return values.size(); }
  bool empty() const noexcept { return values.empty(); }
};

// Rounds every value into `dtype`.
HostTensor make_tensor(DType dtype, std::vector<float> values);
HostTensor random_uniform(Rng& rng, DType dtype, std::size_t n, float lo = -1.0f, float hi = 1.0f);
HostTensor random_normal(Rng& rng, DType dtype, std::size_t n, float mean = 0.0f, float stddev = 1.0f);
// i32 tensor of ids in [0, vocab).
HostTensor random_ids(Rng& rng, std::size_t n, std::uint32_t vocab);

// Raw element bytes as a buffer of t.dtype stores them.
std::vector<std::uint8_t> encode_bytes(const HostTensor& t);
// Raw elements of `dtype` (a device buffer's bytes), decoded to floats.
std::vector<float> decode_bytes(DType dtype, const std::vector<std::uint8_t>& bytes);

// ── Uploads ──────────────────────────────────────────────────────────────────

// An input: `lead` + n elements on a backend, exposing the view of the n
// elements at `lead` (lead = 1 makes a 2-byte element start 2 bytes past a
// 16-byte boundary, so vectorized paths must fall back).
class DeviceTensor {
 public:
  DeviceTensor() = default;
  DeviceTensor(Backend& backend, const HostTensor& host, std::size_t lead = 0);

  Buffer& view() noexcept { return view_; }
  const Buffer& view() const noexcept { return view_; }

 private:
  Buffer storage_;
  Buffer view_;  // into storage_ (moving a Buffer keeps its memory in place)
};

// ── Poisoned, guarded outputs ────────────────────────────────────────────────

inline constexpr std::uint8_t kPoisonByte = 0xFF;    // 0xFFFF: NaN in f16 and bf16; f32 NaN
inline constexpr std::uint8_t kSentinelByte = 0xA5;  // guard fill: 0xA5A5 is a finite value
inline constexpr std::size_t kDefaultGuard = 67;     // elements after the view (> one 16-byte vector)

// An output buffer of lead + need + guard elements. The op gets view(), the
// `need` elements at `lead`. The lead and guard elements hold a sentinel;
// the view holds poison (NaN bit patterns) or, for in/out buffers, the
// initial contents given. check_guard() verifies the op wrote nothing
// outside its view.
class GuardedOutput {
 public:
  GuardedOutput(Backend& backend, DType dtype, std::size_t need, std::size_t lead = 0,
                std::size_t guard = kDefaultGuard);
  GuardedOutput(Backend& backend, const HostTensor& initial, std::size_t lead = 0,
                std::size_t guard = kDefaultGuard);

  Buffer& view() noexcept { return view_; }
  DType dtype() const noexcept { return dtype_; }
  std::size_t need() const noexcept { return need_; }

  // Refills the view with poison and the lead/guard with the sentinel.
  void poison();
  ::testing::AssertionResult check_guard() const;
  // check_guard(), its failure saying "<op> wrote past '<output>' (<where>)".
  ::testing::AssertionResult check_guard(std::string_view op, std::string_view output, std::string_view where) const;
  std::vector<float> values() const;          // the view, decoded
  std::vector<std::uint8_t> bytes() const;    // the view, raw

 private:
  void fill(const std::vector<std::uint8_t>& view_bytes);

  Backend* backend_;
  DType dtype_;
  std::size_t need_, lead_, guard_;
  Buffer storage_;
  Buffer view_;
};

// ── Comparisons ──────────────────────────────────────────────────────────────

// Every element: |got - ref| <= atol*scale + rtol*|ref| with the table's
// tolerance for `dtype`; NaN never passes. On failure reports the number of
// failing elements, the worst one (index, got, ref, error, allowed) and the
// first few failures.
::testing::AssertionResult all_close(std::span<const float> got, std::span<const double> ref, DType dtype,
                                     double scale = op_scale::kUnit);
::testing::AssertionResult all_close(std::span<const float> got, std::span<const float> ref, DType dtype,
                                     double scale = op_scale::kUnit);
// Every element equal as a value with the same sign (+-0 and +-Inf
// included), or NaN in both: for outputs where NaN may come out with any
// payload (the GPU's conversions give their own canonical NaN, the host's
// another).
::testing::AssertionResult equal_or_both_nan(std::span<const float> got, std::span<const float> want);
// Byte-for-byte equality, reported per element of `elem_bytes`.
::testing::AssertionResult bitwise_equal(std::span<const std::uint8_t> got, std::span<const std::uint8_t> want,
                                         std::size_t elem_bytes);

// ── Errors ───────────────────────────────────────────────────────────────────

// Success iff fn() throws ferrum::Error with `code` whose message contains
// "op:" (the op as the message's prefix names it) and every one of `parts`
// (an argument's name, the offending value, the rule that failed).
::testing::AssertionResult throws_error(ErrorCode code, std::string_view op, const std::function<void()>& fn,
                                        std::initializer_list<std::string_view> parts);
// With one part, `arg` (none when empty); `op` anywhere in the message.
::testing::AssertionResult throws_error(ErrorCode code, std::string_view op, const std::function<void()>& fn,
                                        std::string_view arg = {});
// Non-fatal expectations of the above, reported at the caller's line.
void expect_error(ErrorCode code, std::string_view op, const std::function<void()>& fn,
                  std::initializer_list<std::string_view> parts,
                  std::source_location where = std::source_location::current());
void expect_error(ErrorCode code, std::string_view op, const std::function<void()>& fn, std::string_view arg = {},
                  std::source_location where = std::source_location::current());

// CudaBackend's collectives read device memory: host memory (alloc_host) in
// any collective's buffer is a named InvalidArgument before anything is
// issued, at be.world_size() whatever it is, also inside a capture (which
// the refusal ends). Buffers of `len` elements per rank, f32.
void expect_collectives_refuse_host_memory(Backend& be, std::size_t len,
                                           std::source_location where = std::source_location::current());

// For a forked child (EXPECT_EXIT) that must meet host memory running out:
// caps its address space at what it maps now plus `growth` bytes
// (RLIMIT_AS), writing "setrlimit failed" to stderr where it cannot.
void bound_address_space_growth(std::size_t growth);

// ── Backends and fixtures ────────────────────────────────────────────────────

bool have_cuda();
// A CudaBackend (device 0) or CpuBackend.
std::unique_ptr<Backend> make_backend(BackendKind kind);
std::string_view kind_name(BackendKind kind);

// While alive, the backend is in device-state mode `enable`; restores the
// previous mode on destruction (also when an op throws).
class DeviceStateScope {
 public:
  DeviceStateScope(Backend& backend, bool enable);
  ~DeviceStateScope();
  DeviceStateScope(const DeviceStateScope&) = delete;
  DeviceStateScope& operator=(const DeviceStateScope&) = delete;

 private:
  Backend& backend_;
  bool previous_;
};

inline constexpr const char* kNoCudaMessage =
    "no CUDA device visible (ferrum::cuda_device_count() == 0): CUDA tests skipped";

// GPU tests: skipped with kNoCudaMessage when there is no device; otherwise
// gives a CudaBackend and a CpuBackend (the oracle).
template <class Base = ::testing::Test>
class CudaFixture : public Base {
 protected:
  void SetUp() override {
    if (!have_cuda()) GTEST_SKIP() << kNoCudaMessage;
    cuda_ = make_backend(BackendKind::Cuda);
    cpu_ = make_backend(BackendKind::Cpu);
  }
  void TearDown() override {
    if (!cuda_) return;
    cuda_->set_device_state_mode(false);
    // A graph left in the device's slot would keep the memory every later
    // test frees (CudaBackend::graph_retained_allocations).
    if (!cuda_->is_capturing() && cuda_->held_graph() != 0) cuda_->reset_graph();
  }
  Backend& cuda() { return *cuda_; }
  Backend& cpu() { return *cpu_; }

  std::unique_ptr<Backend> cuda_;
  std::unique_ptr<Backend> cpu_;
};
using CudaTest = CudaFixture<>;
template <class Param>
using CudaParamTest = CudaFixture<::testing::TestWithParam<Param>>;

// Suites that run on every backend: parameterized by BackendKind, the CUDA
// instance skipped without a device. backend() and other() are two distinct
// instances of the same kind.
class BackendTest : public ::testing::TestWithParam<BackendKind> {
 protected:
  void SetUp() override;
  Backend& backend() { return *backend_; }
  Backend& other() { return *other_; }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Backend> other_;
};
std::string backend_param_name(const ::testing::TestParamInfo<BackendKind>& info);
#define FERRUM_INSTANTIATE_ON_ALL_BACKENDS(Suite)                                                       \
  INSTANTIATE_TEST_SUITE_P(AllBackends, Suite,                                                          \
                           ::testing::Values(::ferrum::BackendKind::Cpu, ::ferrum::BackendKind::Cuda),  \
                           ::ferrum::test::backend_param_name)

// ── RoPE tables ──────────────────────────────────────────────────────────────

inline constexpr double kRopeTheta10k = 10000.0;     // Llama 2
inline constexpr double kRopeTheta1M = 1000000.0;    // Qwen 2/3, Llama 3 long

// cos/sin [max_pos, head_dim / 2] in f32: angle(p, i) = p * theta^(-2i / head_dim),
// computed in double and rounded once to f32.
struct RopeTables {
  std::size_t max_pos = 0;
  std::size_t head_dim = 0;
  double theta = 0.0;
  HostTensor cos;
  HostTensor sin;
};
RopeTables make_rope_tables(std::size_t max_pos, std::size_t head_dim, double theta);

// ── Sweep parameters ─────────────────────────────────────────────────────────

inline constexpr DType kHalfDTypes[] = {DType::F16, DType::BF16};
inline constexpr std::size_t kSweepDims[] = {8, 769, 4096, 5120};
inline constexpr std::size_t kSweepTokens[] = {1, 7, 83, 4096};

std::string dtype_param_name(const ::testing::TestParamInfo<DType>& info);

// (dtype, tokens, dim): every combination, for row ops.
using RowParam = std::tuple<DType, std::size_t, std::size_t>;
std::vector<RowParam> all_row_params();  // use with ::testing::ValuesIn
std::string row_param_name(const ::testing::TestParamInfo<RowParam>& info);

// Accessors for suites parameterized by RowParam: derive as
// `class S : public RowParamTest<::testing::TestWithParam<RowParam>>` (or
// over CudaParamTest<RowParam>).
template <class Base>
class RowParamTest : public Base {
 protected:
  DType dt() const { return std::get<0>(this->GetParam()); }
  std::size_t tokens() const { return std::get<1>(this->GetParam()); }
  std::size_t dim() const { return std::get<2>(this->GetParam()); }
  // Position of dim() in kSweepDims.
  std::size_t dim_index() const {
    std::size_t i = 0;
    while (kSweepDims[i] != dim()) ++i;
    return i;
  }
};

// (dtype, case index) for ops whose size cases are a hand-picked list; the
// test SCOPED_TRACEs the case's full description.
using DTypeCaseParam = std::tuple<DType, std::size_t>;

template <class Base>
class CaseParamTest : public Base {
 protected:
  DType dt() const { return std::get<0>(this->GetParam()); }
  std::size_t index() const { return std::get<1>(this->GetParam()); }
};
std::vector<DTypeCaseParam> dtype_case_params(std::size_t num_cases);
std::string dtype_case_param_name(const ::testing::TestParamInfo<DTypeCaseParam>& info);

}  // namespace ferrum::test
