#include "support/test_support.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <limits>
#include <optional>
#include <stdexcept>

namespace ferrum::test {

// ── Seeded randomness ────────────────────────────────────────────────────────

namespace {

// Set once by the test binaries' main, before any test runs.
std::optional<std::uint64_t> g_seed_override;

std::uint64_t fresh_seed() {
  if (g_seed_override) return *g_seed_override;
  std::random_device device;
  return (static_cast<std::uint64_t>(device()) << 32) ^ device();
}

}  // namespace

std::optional<std::uint64_t> parse_seed_override(const char* text) {
  if (text == nullptr || *text == '\0') return std::nullopt;
  // strtoull itself would accept leading blanks and a sign.
  const bool starts_with_digit = std::isdigit(static_cast<unsigned char>(text[0])) != 0;
  errno = 0;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 0);
  if (!starts_with_digit || *end != '\0' || errno == ERANGE) {
    throw std::invalid_argument(cat("FERRUM_TEST_SEED='", text,
                                    "' is not an unsigned 64-bit integer (decimal, 0x hex or 0-prefixed octal)"));
  }
  return static_cast<std::uint64_t>(value);
}

void set_seed_override(std::optional<std::uint64_t> seed) { g_seed_override = seed; }

Rng::Rng() : Rng(fresh_seed()) {}
Rng::Rng(std::uint64_t seed) : seed_(seed), engine_(seed) {}

std::string Rng::describe() const {
  return cat("random seed=", seed_, " (reproduce with FERRUM_TEST_SEED=", seed_, ")");
}

float Rng::uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(engine_); }
float Rng::normal(float mean, float stddev) { return std::normal_distribution<float>(mean, stddev)(engine_); }
std::uint32_t Rng::below(std::uint32_t n) { return std::uniform_int_distribution<std::uint32_t>(0, n - 1)(engine_); }
std::uint32_t Rng::bits32() { return static_cast<std::uint32_t>(engine_() >> 32); }

std::vector<float> uniform_values(Rng& rng, std::size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng.engine());
  return v;
}

std::vector<float> normal_values(Rng& rng, std::size_t n, float mean, float stddev) {
  std::normal_distribution<float> dist(mean, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng.engine());
  return v;
}

// ── Host tensors ─────────────────────────────────────────────────────────────

float round_to(DType dtype, float value) {
  switch (dtype) {
    case DType::F16:
      return f16_to_f32(f32_to_f16(value));
    case DType::BF16:
      return bf16_to_f32(f32_to_bf16(value));
    case DType::F32:
      return value;
    case DType::I32:
      return static_cast<float>(static_cast<std::int32_t>(value));
    case DType::U8:
      return static_cast<float>(static_cast<std::uint8_t>(value));
  }
  return value;
}

HostTensor make_tensor(DType dtype, std::vector<float> values) {
  for (float& v : values) v = round_to(dtype, v);
  return HostTensor{dtype, std::move(values)};
}

HostTensor random_uniform(Rng& rng, DType dtype, std::size_t n, float lo, float hi) {
  return make_tensor(dtype, uniform_values(rng, n, lo, hi));
}

HostTensor random_normal(Rng& rng, DType dtype, std::size_t n, float mean, float stddev) {
  return make_tensor(dtype, normal_values(rng, n, mean, stddev));
}

HostTensor random_ids(Rng& rng, std::size_t n, std::uint32_t vocab) {
  std::vector<float> ids(n);
  for (float& id : ids) id = static_cast<float>(rng.below(vocab));
  return HostTensor{DType::I32, std::move(ids)};
}

std::vector<std::uint8_t> encode_bytes(const HostTensor& t) {
  const std::size_t es = size_of(t.dtype);
  std::vector<std::uint8_t> out(t.size() * es);
  for (std::size_t i = 0; i < t.size(); ++i) {
    const float v = t.values[i];
    std::uint8_t* d = out.data() + i * es;
    switch (t.dtype) {
      case DType::F16: {
        const std::uint16_t h = f32_to_f16(v);
        std::memcpy(d, &h, 2);
        break;
      }
      case DType::BF16: {
        const std::uint16_t h = f32_to_bf16(v);
        std::memcpy(d, &h, 2);
        break;
      }
      case DType::F32:
        std::memcpy(d, &v, 4);
        break;
      case DType::I32: {
        const auto x = static_cast<std::int32_t>(v);
        std::memcpy(d, &x, 4);
        break;
      }
      case DType::U8:
        *d = static_cast<std::uint8_t>(v);
        break;
    }
  }
  return out;
}

std::vector<float> decode_bytes(DType dtype, const std::vector<std::uint8_t>& bytes) {
  const std::size_t es = size_of(dtype);
  std::vector<float> out(bytes.size() / es);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::uint8_t* p = bytes.data() + i * es;
    switch (dtype) {
      case DType::F16:
      case DType::BF16: {
        std::uint16_t h;
        std::memcpy(&h, p, 2);
        out[i] = dtype == DType::F16 ? f16_to_f32(h) : bf16_to_f32(h);
        break;
      }
      case DType::F32:
        std::memcpy(&out[i], p, 4);
        break;
      case DType::I32: {
        std::int32_t x;
        std::memcpy(&x, p, 4);
        out[i] = static_cast<float>(x);
        break;
      }
      case DType::U8:
        out[i] = static_cast<float>(*p);
        break;
    }
  }
  return out;
}

// ── Uploads ──────────────────────────────────────────────────────────────────

DeviceTensor::DeviceTensor(Backend& backend, const HostTensor& host, std::size_t lead) {
  if (host.empty()) throw std::invalid_argument("DeviceTensor: empty host tensor");
  const std::size_t es = size_of(host.dtype);
  // Poison before and after the view: a kernel reading outside its input
  // picks up NaNs (or id -1) and fails the comparison.
  std::vector<std::uint8_t> all((lead + host.size() + kDefaultGuard) * es, kPoisonByte);
  const std::vector<std::uint8_t> body = encode_bytes(host);
  std::copy(body.begin(), body.end(), all.begin() + static_cast<std::ptrdiff_t>(lead * es));
  storage_ = backend.alloc(host.dtype, lead + host.size() + kDefaultGuard);
  backend.write_bytes(storage_, all.data(), all.size());
  view_ = storage_.view(lead, host.size());
}

// ── Poisoned, guarded outputs ────────────────────────────────────────────────

GuardedOutput::GuardedOutput(Backend& backend, DType dtype, std::size_t need, std::size_t lead, std::size_t guard)
    : backend_(&backend), dtype_(dtype), need_(need), lead_(lead), guard_(guard) {
  storage_ = backend.alloc(dtype, lead + need + guard);
  view_ = storage_.view(lead, need);
  poison();
}

GuardedOutput::GuardedOutput(Backend& backend, const HostTensor& initial, std::size_t lead, std::size_t guard)
    : backend_(&backend), dtype_(initial.dtype), need_(initial.size()), lead_(lead), guard_(guard) {
  storage_ = backend.alloc(dtype_, lead + need_ + guard);
  view_ = storage_.view(lead, need_);
  fill(encode_bytes(initial));
}

void GuardedOutput::poison() { fill(std::vector<std::uint8_t>(need_ * size_of(dtype_), kPoisonByte)); }

void GuardedOutput::fill(const std::vector<std::uint8_t>& view_bytes) {
  const std::size_t es = size_of(dtype_);
  std::vector<std::uint8_t> all((lead_ + need_ + guard_) * es, kSentinelByte);
  std::copy(view_bytes.begin(), view_bytes.end(), all.begin() + static_cast<std::ptrdiff_t>(lead_ * es));
  backend_->write_bytes(storage_, all.data(), all.size());
}

::testing::AssertionResult GuardedOutput::check_guard(std::string_view op, std::string_view output,
                                                      std::string_view where) const {
  ::testing::AssertionResult intact = check_guard();
  if (intact) return intact;
  return ::testing::AssertionFailure() << op << " wrote past '" << output << "' (" << where << "): " << intact.message();
}

::testing::AssertionResult GuardedOutput::check_guard() const {
  const std::size_t es = size_of(dtype_);
  auto check_region = [&](std::size_t first, std::size_t count, const char* where) -> std::string {
    if (count == 0) return {};
    std::vector<std::uint8_t> got(count * es);
    backend_->read_bytes(storage_, got.data(), got.size(), first * es);
    std::size_t bad = 0;
    std::size_t first_bad = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      if (got[i] != kSentinelByte) {
        if (bad == 0) first_bad = i / es;
        ++bad;
      }
    }
    if (bad == 0) return {};
    return cat(where, " guard overwritten: ", bad, " byte(s) changed, first at guard element ", first_bad, "; ");
  };
  const std::string report =
      check_region(0, lead_, "leading") + check_region(lead_ + need_, guard_, "trailing");
  if (report.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "output of " << need_ << " " << to_string(dtype_)
                                       << " elements: " << report;
}

std::vector<float> GuardedOutput::values() const { return backend_->download(view_, need_); }

std::vector<std::uint8_t> GuardedOutput::bytes() const {
  std::vector<std::uint8_t> out(view_.nbytes());
  backend_->read_bytes(view_, out.data(), out.size());
  return out;
}

// ── Comparisons ──────────────────────────────────────────────────────────────

namespace {

::testing::AssertionResult compare_close(std::span<const float> got, std::size_t ref_size,
                                         const std::function<double(std::size_t)>& ref_at, DType dtype,
                                         double scale) {
  if (got.size() != ref_size) {
    return ::testing::AssertionFailure() << "size mismatch: got " << got.size() << " elements, reference has "
                                         << ref_size;
  }
  const Tolerance tol = tolerance_for(dtype);
  std::size_t failures = 0;
  std::size_t nan_failures = 0;
  std::size_t worst = 0;
  double worst_ratio = -1.0;
  std::ostringstream first;
  first << std::setprecision(9);
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got[i];
    const double r = ref_at(i);
    const double allowed = tol.atol * scale + tol.rtol * std::fabs(r);
    const double err = std::fabs(g - r);
    const bool nan = std::isnan(g) || std::isnan(r);
    if (nan || !(err <= allowed)) {
      ++failures;
      if (nan) ++nan_failures;
      const double ratio = nan ? std::numeric_limits<double>::infinity() : err / allowed;
      if (ratio > worst_ratio) {
        worst_ratio = ratio;
        worst = i;
      }
      if (failures <= 5) first << "\n    [" << i << "] got " << g << " ref " << r << " |err| " << err;
    }
  }
  if (failures == 0) return ::testing::AssertionSuccess();
  const double g = got[worst];
  const double r = ref_at(worst);
  return ::testing::AssertionFailure()
         << std::setprecision(9) << failures << " of " << got.size() << " " << to_string(dtype)
         << " elements fail |got - ref| <= atol*scale + rtol*|ref| (atol=" << tol.atol << " rtol=" << tol.rtol
         << " scale=" << scale << "); " << nan_failures << " of them NaN. Worst at index " << worst << ": got "
         << g << " ref " << r << " |err| " << std::fabs(g - r) << " allowed "
         << tol.atol * scale + tol.rtol * std::fabs(r) << ". First failures:" << first.str();
}

}  // namespace

::testing::AssertionResult all_close(std::span<const float> got, std::span<const double> ref, DType dtype,
                                     double scale) {
  return compare_close(got, ref.size(), [&](std::size_t i) { return ref[i]; }, dtype, scale);
}

::testing::AssertionResult all_close(std::span<const float> got, std::span<const float> ref, DType dtype,
                                     double scale) {
  return compare_close(got, ref.size(), [&](std::size_t i) { return static_cast<double>(ref[i]); }, dtype, scale);
}

::testing::AssertionResult equal_or_both_nan(std::span<const float> got, std::span<const float> want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "size mismatch: got " << got.size() << " elements, expected "
                                         << want.size();
  }
  std::size_t mismatches = 0;
  std::ostringstream first;
  first << std::setprecision(9);
  for (std::size_t i = 0; i < got.size(); ++i) {
    const bool same = std::isnan(want[i]) ? std::isnan(got[i])
                                          : got[i] == want[i] && std::signbit(got[i]) == std::signbit(want[i]);
    if (!same) {
      ++mismatches;
      if (mismatches <= 5) first << "\n    [" << i << "] got " << got[i] << " expected " << want[i];
    }
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << mismatches << " of " << got.size()
                                       << " elements differ (equal values with equal signs, or both NaN, required). First:"
                                       << first.str();
}

::testing::AssertionResult bitwise_equal(std::span<const std::uint8_t> got, std::span<const std::uint8_t> want,
                                         std::size_t elem_bytes) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "size mismatch: got " << got.size() << " bytes, expected " << want.size();
  }
  const std::size_t n = got.size() / elem_bytes;
  std::size_t mismatches = 0;
  std::ostringstream first;
  auto hex = [&](std::span<const std::uint8_t> bytes, std::size_t e) {
    std::ostringstream s;
    s << "0x" << std::hex << std::setfill('0');
    for (std::size_t b = elem_bytes; b-- > 0;) s << std::setw(2) << static_cast<unsigned>(bytes[e * elem_bytes + b]);
    return s.str();
  };
  for (std::size_t e = 0; e < n; ++e) {
    if (std::memcmp(got.data() + e * elem_bytes, want.data() + e * elem_bytes, elem_bytes) != 0) {
      ++mismatches;
      if (mismatches <= 5) first << "\n    [" << e << "] got " << hex(got, e) << " expected " << hex(want, e);
    }
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << mismatches << " of " << n << " elements differ bitwise. First:"
                                       << first.str();
}

// ── Errors ───────────────────────────────────────────────────────────────────

namespace {

// throws_error's work: `op_text` is what the message must contain to name
// the op (the op itself, or "op:" where the caller asks for the prefix).
::testing::AssertionResult throws_error_naming(ErrorCode code, std::string_view op, std::string_view op_text,
                                               const std::function<void()>& fn,
                                               std::initializer_list<std::string_view> parts) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string_view msg = e.what();
    if (e.code() != code) {
      return ::testing::AssertionFailure() << "expected ferrum::Error " << to_string(code) << " but got "
                                           << to_string(e.code()) << ": " << msg;
    }
    if (msg.find(op_text) == std::string_view::npos) {
      return ::testing::AssertionFailure() << "error " << to_string(code) << " does not name the op as '" << op_text
                                           << "': " << msg;
    }
    std::string missing;
    for (std::string_view part : parts) {
      if (!part.empty() && msg.find(part) == std::string_view::npos) missing += cat(" \"", part, "\"");
    }
    if (!missing.empty()) {
      return ::testing::AssertionFailure() << "error " << to_string(code) << " lacks" << missing << ": " << msg;
    }
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "expected ferrum::Error " << to_string(code)
                                         << " but a different exception was thrown: " << e.what();
  }
  return ::testing::AssertionFailure() << "expected ferrum::Error " << to_string(code) << " from " << op
                                       << " but nothing was thrown";
}

}  // namespace

::testing::AssertionResult throws_error(ErrorCode code, std::string_view op, const std::function<void()>& fn,
                                        std::initializer_list<std::string_view> parts) {
  const std::string prefix = cat(op, ":");
  return throws_error_naming(code, op, prefix, fn, parts);
}

::testing::AssertionResult throws_error(ErrorCode code, std::string_view op, const std::function<void()>& fn,
                                        std::string_view arg) {
  return throws_error_naming(code, op, op, fn, {arg});
}

void expect_error(ErrorCode code, std::string_view op, const std::function<void()>& fn,
                  std::initializer_list<std::string_view> parts, std::source_location where) {
  const ::testing::AssertionResult result = throws_error(code, op, fn, parts);
  if (!result) ADD_FAILURE_AT(where.file_name(), static_cast<int>(where.line())) << result.message();
}

void expect_error(ErrorCode code, std::string_view op, const std::function<void()>& fn, std::string_view arg,
                  std::source_location where) {
  const ::testing::AssertionResult result = throws_error(code, op, fn, arg);
  if (!result) ADD_FAILURE_AT(where.file_name(), static_cast<int>(where.line())) << result.message();
}

void expect_collectives_refuse_host_memory(Backend& be, std::size_t len, std::source_location where) {
  const std::size_t world = be.world_size();
  Buffer dev = be.upload(std::vector<float>(world * len, 1.0f), DType::F32);
  Buffer dev_part = be.upload(std::vector<float>(len, 1.0f), DType::F32);
  Buffer host = be.alloc_host(DType::F32, world * len), host_part = be.alloc_host(DType::F32, len);
  auto refused = [&](const char* op, const char* arg, const std::function<void()>& call) {
    expect_error(ErrorCode::InvalidArgument, op, call, cat("argument '", arg, "'"), where);
  };
  refused("all_reduce", "buf", [&] { be.all_reduce(host, len, ReduceOp::Sum); });
  refused("all_gather", "local", [&] { be.all_gather(host_part, dev, len); });
  refused("all_gather", "global", [&] { be.all_gather(dev_part, host, len); });
  refused("broadcast", "buf", [&] { be.broadcast(host, len, 0); });
  refused("reduce_scatter", "input", [&] { be.reduce_scatter(host, dev_part, len, ReduceOp::Sum); });
  refused("reduce_scatter", "output", [&] { be.reduce_scatter(dev, host_part, len, ReduceOp::Sum); });
  be.begin_graph_capture();
  refused("all_reduce", "buf", [&] { be.all_reduce(host, len, ReduceOp::Sum); });
  if (be.is_capturing()) {
    ADD_FAILURE_AT(where.file_name(), static_cast<int>(where.line())) << "the refusal must end the capture";
    be.end_graph_capture();
    be.reset_graph();
  }
}

void bound_address_space_growth(std::size_t growth) {
  std::size_t pages = 0;
  std::ifstream("/proc/self/statm") >> pages;  // the address space now, in pages
  const rlim_t limit =
      static_cast<rlim_t>(pages) * static_cast<rlim_t>(sysconf(_SC_PAGESIZE)) + static_cast<rlim_t>(growth);
  const rlimit bound{limit, limit};
  if (setrlimit(RLIMIT_AS, &bound) != 0) std::fprintf(stderr, "setrlimit failed\n");
}

// ── Backends and fixtures ────────────────────────────────────────────────────

bool have_cuda() { return cuda_device_count() > 0; }

std::unique_ptr<Backend> make_backend(BackendKind kind) {
  if (kind == BackendKind::Cuda) return std::make_unique<CudaBackend>();
  return std::make_unique<CpuBackend>();
}

std::string_view kind_name(BackendKind kind) { return kind == BackendKind::Cuda ? "Cuda" : "Cpu"; }

DeviceStateScope::DeviceStateScope(Backend& backend, bool enable)
    : backend_(backend), previous_(backend.device_state_mode()) {
  backend_.set_device_state_mode(enable);
}

DeviceStateScope::~DeviceStateScope() { backend_.set_device_state_mode(previous_); }

void BackendTest::SetUp() {
  if (GetParam() == BackendKind::Cuda && !have_cuda()) GTEST_SKIP() << kNoCudaMessage;
  backend_ = make_backend(GetParam());
  other_ = make_backend(GetParam());
}

std::string backend_param_name(const ::testing::TestParamInfo<BackendKind>& info) {
  return std::string(kind_name(info.param));
}

// ── RoPE tables ──────────────────────────────────────────────────────────────

RopeTables make_rope_tables(std::size_t max_pos, std::size_t head_dim, double theta) {
  const std::size_t half = head_dim / 2;
  RopeTables t{max_pos, head_dim, theta, {DType::F32, std::vector<float>(max_pos * half)},
               {DType::F32, std::vector<float>(max_pos * half)}};
  for (std::size_t i = 0; i < half; ++i) {
    const double inv_freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
    for (std::size_t p = 0; p < max_pos; ++p) {
      const double angle = static_cast<double>(p) * inv_freq;
      t.cos.values[p * half + i] = static_cast<float>(std::cos(angle));
      t.sin.values[p * half + i] = static_cast<float>(std::sin(angle));
    }
  }
  return t;
}

// ── Sweep parameters ─────────────────────────────────────────────────────────

std::string dtype_param_name(const ::testing::TestParamInfo<DType>& info) {
  return std::string(to_string(info.param));
}

std::vector<RowParam> all_row_params() {
  std::vector<RowParam> params;
  for (DType dt : kHalfDTypes) {
    for (std::size_t tokens : kSweepTokens) {
      for (std::size_t dim : kSweepDims) params.emplace_back(dt, tokens, dim);
    }
  }
  return params;
}

std::string row_param_name(const ::testing::TestParamInfo<RowParam>& info) {
  const auto& [dt, tokens, dim] = info.param;
  return cat(to_string(dt), "_t", tokens, "_d", dim);
}

std::vector<DTypeCaseParam> dtype_case_params(std::size_t num_cases) {
  std::vector<DTypeCaseParam> params;
  for (DType dt : kHalfDTypes) {
    for (std::size_t i = 0; i < num_cases; ++i) params.emplace_back(dt, i);
  }
  return params;
}

std::string dtype_case_param_name(const ::testing::TestParamInfo<DTypeCaseParam>& info) {
  return cat(to_string(std::get<0>(info.param)), "_case", std::get<1>(info.param));
}

}  // namespace ferrum::test
