// Randomly mutated calls of every buffer-taking op, on CpuBackend always and
// on CudaBackend when a GPU is present (skipped otherwise). Where the
// bad-input suite (test_bad_input.cpp) changes one argument of a valid call
// at a time and expects one ErrorCode, each call here changes one to four at
// once, drawn from: a size argument set to a boundary value (0, 1, one off,
// doubled, 2^31 - 1, 2^31, 2^32, values whose products wrap 64 bits, ...);
// a buffer replaced by a shorter, longer, null, other-dtype or
// other-backend one, or by another argument of the same call (aliasing);
// an i32 buffer's contents (ids, positions, lengths) set to out-of-range
// values; a scalar set to NaN, infinity, a negative or a huge value; an enum
// set outside its values; the quantized weight replaced by one of another
// shape, kind or backend. Whatever the combination, the call must either
// run or refuse its input with a ferrum::Error (on CUDA: from the call or
// from the synchronize() after it, DeviceCheck included); a Cuda, cuBLAS or
// Internal error (a kernel that faulted, a launcher reached with a value
// the checks should have refused) fails the test. Nor may it write
// past the end of any output: every written buffer is a view at the start
// of an allocation whose remaining 32 elements hold random bytes, checked
// after each call. Inputs are allocated at their size (CpuBackend rounds an
// allocation up to 64 bytes), so a read past that is an AddressSanitizer
// report in a sanitizer build (README, "Sanitizers"), and on CUDA a
// compute-sanitizer one (gpu_suite.sh verify).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "support/op_registry.hpp"
#include "support/test_support.hpp"

namespace ferrum::test {
namespace {

constexpr std::size_t kGuardElems = 32;
// CpuBackend's calls take microseconds; CudaBackend's synchronize each one,
// and the GPU suite runs them under compute-sanitizer.
constexpr int kCpuCalls = 20000, kCudaCalls = 1000;

// The codes of a call refused for its input (or for what the backend does
// not implement), as opposed to a failure inside the library.
bool is_refusal(ErrorCode code) {
  switch (code) {
    case ErrorCode::InvalidArgument:
    case ErrorCode::ShapeMismatch:
    case ErrorCode::DTypeMismatch:
    case ErrorCode::Misaligned:
    case ErrorCode::NullBuffer:
    case ErrorCode::CapacityExceeded:
    case ErrorCode::WrongBackend:
    case ErrorCode::Unsupported:
    case ErrorCode::DeviceCheck:
      return true;
    default:
      return false;
  }
}

// One written buffer's guard: the allocation, where the guard starts, and
// the bytes it must still hold.
struct Guard {
  std::string name;
  const Buffer* parent;
  std::size_t offset_bytes;
  std::vector<std::uint8_t> bytes;
};

class RandomCalls : public BackendTest {
 protected:
  // A zero-filled buffer of `numel` elements; if `guarded`, a view at the
  // start of an allocation with kGuardElems more, whose guard is filled
  // with random bytes and recorded.
  Buffer fresh(Rng& rng, Backend& be, const std::string& name, DType dtype, std::size_t numel, bool guarded) {
    if (!guarded) return zeros(be, dtype, numel);
    parents_.push_back(std::make_unique<Buffer>(zeros(be, dtype, numel + kGuardElems)));
    const Buffer& parent = *parents_.back();
    Guard g{name, &parent, numel * size_of(dtype), std::vector<std::uint8_t>(kGuardElems * size_of(dtype))};
    for (std::uint8_t& b : g.bytes) b = static_cast<std::uint8_t>(rng.bits32());
    be.write_bytes(*parents_.back(), g.bytes.data(), g.bytes.size(), g.offset_bytes);
    guards_.push_back(std::move(g));
    return parent.view(0, numel);
  }

  // Replaces buffer `name` of `a` by `b`, keeping the old one alive (a view
  // of it may sit in another argument).
  static void replace(OpArgs& a, const std::string& name, Buffer b) {
    a.keep_alive.push_back(std::move(a.buffers.at(name)));
    a.buffers[name] = std::move(b);
  }

  // Copies the first min(n, m) bytes of `from` into `to` (same backend).
  void copy_prefix(Backend& be, const Buffer& from, Buffer& to) {
    const std::size_t n = std::min(from.nbytes(), to.nbytes());
    if (n == 0 || from.is_null() || to.is_null() || from.backend() != &be) return;
    std::vector<std::uint8_t> host(n);
    be.read_bytes(from, host.data(), n);
    be.write_bytes(to, host.data(), n);
  }

  std::vector<std::unique_ptr<Buffer>> parents_;
  std::vector<Guard> guards_;
};

// A size argument's boundary values around `v`.
std::size_t mutated_size(Rng& rng, std::size_t v) {
  constexpr std::size_t kMax = std::numeric_limits<std::size_t>::max();
  const std::size_t menu[] = {0,
                              1,
                              2,
                              v > 0 ? v - 1 : 0,
                              v + 1,
                              2 * v,
                              3 * v + 1,
                              7,
                              64,
                              65537,
                              (std::size_t{1} << 31) - 1,
                              std::size_t{1} << 31,
                              (std::size_t{1} << 32) - 1,
                              std::size_t{1} << 32,
                              (std::size_t{1} << 32) + v,
                              std::size_t{1} << 33,
                              std::size_t{1} << 62,
                              kMax / 3,
                              kMax};
  return menu[rng.below(static_cast<std::uint32_t>(std::size(menu)))];
}

float mutated_scalar(Rng& rng) {
  const float menu[] = {0.0f,
                        -1.0f,
                        -0.0f,
                        1e-40f,
                        1e30f,
                        std::numeric_limits<float>::quiet_NaN(),
                        std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity(),
                        0.125f};
  return menu[rng.below(static_cast<std::uint32_t>(std::size(menu)))];
}

std::int32_t mutated_i32(Rng& rng) {
  const std::int32_t menu[] = {-1, 0, 1, 2, 5, 6, 1000, std::numeric_limits<std::int32_t>::max(),
                               std::numeric_limits<std::int32_t>::min()};
  return menu[rng.below(static_cast<std::uint32_t>(std::size(menu)))];
}

DType random_dtype(Rng& rng) {
  const DType menu[] = {DType::F16, DType::BF16, DType::F32, DType::I32, DType::U8};
  return menu[rng.below(static_cast<std::uint32_t>(std::size(menu)))];
}

TEST_P(RandomCalls, EveryCallRunsOrThrowsAFerrumErrorAndStaysInBounds) {
  FERRUM_SEEDED_RNG(rng);
  Backend& be = backend();
  const std::vector<OpSpec>& specs = op_specs();
  std::map<std::string, int> outcomes;  // "ran", or the ErrorCode's name
  const int calls = be.kind() == BackendKind::Cpu ? kCpuCalls : kCudaCalls;
  for (int call = 0; call < calls; ++call) {
    const OpSpec& spec = specs[rng.below(static_cast<std::uint32_t>(specs.size()))];
    parents_.clear();
    guards_.clear();
    OpArgs a = make_args(be, spec);
    // Every written buffer guarded, before any mutation (a mutated one gets
    // a guard of its own).
    for (const BufferArg& b : spec.buffers) {
      if (!b.written()) continue;
      Buffer g = fresh(rng, be, b.name, b.dtype, b.numel, true);
      copy_prefix(be, a.buf(b.name), g);
      replace(a, b.name, std::move(g));
    }
    std::string what = cat(spec.name, ":");
    const int mutations = 1 + static_cast<int>(rng.below(4));
    for (int m = 0; m < mutations; ++m) {
      const std::uint32_t kind = rng.below(8);
      if (kind <= 1 && !spec.sizes.empty()) {  // a size (twice as likely: most checks are about sizes)
        const SizeArg& s = spec.sizes[rng.below(static_cast<std::uint32_t>(spec.sizes.size()))];
        a.sizes[s.name] = mutated_size(rng, a.sizes[s.name]);
        what += cat(" ", s.name, "=", a.sizes[s.name]);
      } else if (kind <= 3 && !spec.buffers.empty()) {  // a buffer's length, dtype, backend or absence
        const BufferArg& b = spec.buffers[rng.below(static_cast<std::uint32_t>(spec.buffers.size()))];
        const std::uint32_t how = rng.below(5);
        if (how == 0) {
          replace(a, b.name, Buffer{});
          what += cat(" ", b.name, "=null");
        } else if (how == 1) {
          replace(a, b.name, zeros(other(), b.dtype, b.numel));
          what += cat(" ", b.name, "=other backend");
        } else {
          const Buffer& old = a.buf(b.name);
          const DType dtype = how == 2 ? random_dtype(rng) : (old.is_null() ? b.dtype : old.dtype());
          const std::size_t numel = how == 3 ? 1 + rng.below(static_cast<std::uint32_t>(b.numel))
                                   : how == 4 ? b.numel + 1 + rng.below(16)
                                              : b.numel;
          Buffer nb = fresh(rng, be, b.name, dtype, numel, b.written());
          if (dtype == old.dtype()) copy_prefix(be, old, nb);
          replace(a, b.name, std::move(nb));
          what += cat(" ", b.name, "=", to_string(dtype), "[", numel, "]");
        }
      } else if (kind == 4 && spec.buffers.size() >= 2) {  // one argument passed as another (aliasing)
        const BufferArg& to = spec.buffers[rng.below(static_cast<std::uint32_t>(spec.buffers.size()))];
        const BufferArg& from = spec.buffers[rng.below(static_cast<std::uint32_t>(spec.buffers.size()))];
        const Buffer& src = a.buf(from.name);
        if (&to != &from && !src.is_null()) {
          replace(a, to.name, src.view(0, src.numel()));
          what += cat(" ", to.name, "=", from.name);
        }
      } else if (kind == 5) {  // an i32 buffer's contents
        for (const BufferArg& b : spec.buffers) {
          Buffer& buf = a.buf(b.name);
          if (buf.is_null() || buf.dtype() != DType::I32 || buf.backend() != &be) continue;
          const std::size_t at = rng.below(static_cast<std::uint32_t>(buf.numel()));
          const std::int32_t v = mutated_i32(rng);
          be.write_bytes(buf, &v, sizeof v, at * sizeof v);
          what += cat(" ", b.name, "[", at, "]=", v);
          break;
        }
      } else if (kind == 6) {  // a scalar or an enum
        switch (rng.below(9)) {
          case 0: a.eps = mutated_scalar(rng); what += cat(" eps=", a.eps); break;
          case 1: a.scale = mutated_scalar(rng); what += cat(" scale=", a.scale); break;
          case 2: a.pos_offset = mutated_size(rng, a.pos_offset); what += cat(" pos_offset=", a.pos_offset); break;
          case 3: a.cache_len = mutated_size(rng, a.cache_len); what += cat(" cache_len=", a.cache_len); break;
          case 4:
            a.kv_seq_stride = mutated_size(rng, a.kv_seq_stride);
            what += cat(" kv_seq_stride=", a.kv_seq_stride);
            break;
          case 5: a.src_rank = mutated_size(rng, a.src_rank); what += cat(" src_rank=", a.src_rank); break;
          case 6:
            a.mode = static_cast<RopeMode>(rng.below(4));
            a.approx = static_cast<GeluApproximation>(rng.below(4));
            a.reduce = static_cast<ReduceOp>(rng.below(6));
            what += cat(" enums=", static_cast<int>(a.mode), "/", static_cast<int>(a.approx), "/",
                        static_cast<int>(a.reduce));
            break;
          case 7: a.causal = !a.causal; what += cat(" causal=", a.causal); break;
          default:
            a.null_norm_w = !a.null_norm_w;
            a.null_k_norm = rng.below(2) == 0;
            what += cat(" null_norm_w=", a.null_norm_w, " null_k_norm=", a.null_k_norm);
            break;
        }
      } else if (a.weight != nullptr) {  // the quantized weight
        const auto qkind = static_cast<QuantKind>(rng.below(3));
        const std::size_t k = mutated_size(rng, a.weight->k()), n = mutated_size(rng, a.weight->n());
        const Backend* owner = rng.below(2) == 0 ? &be : &other();
        a.weight = std::make_unique<FakeQuantWeight>(owner, qkind, k, n);
        what += cat(" weight=", static_cast<int>(qkind), "/", k, "x", n, owner == &be ? "" : "/other backend");
      }
    }
    SCOPED_TRACE(cat("call ", call, " ", what));
    try {
      spec.call(be, a);
      be.synchronize();
      ++outcomes["ran"];
    } catch (const Error& e) {
      ++outcomes[std::string(to_string(e.code()))];
      EXPECT_TRUE(is_refusal(e.code())) << "a failure, not a refusal: " << e.what();
      // A DeviceCheck is reported once; the next call starts clean.
      if (e.code() == ErrorCode::DeviceCheck) EXPECT_NO_THROW(be.synchronize());
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a ferrum::Error: " << e.what();
      ++outcomes["foreign"];
    }
    for (const Guard& g : guards_) {
      std::vector<std::uint8_t> now(g.bytes.size());
      be.read_bytes(*g.parent, now.data(), now.size(), g.offset_bytes);
      if (now != g.bytes) {
        ADD_FAILURE() << "'" << g.name << "' written past its end";
        break;
      }
    }
    if (::testing::Test::HasFailure()) break;  // the first failing call is the one to read
  }
  std::string summary;
  for (const auto& [outcome, count] : outcomes) summary += cat(" ", outcome, " ", count);
  RecordProperty("outcomes", summary);
  // Both sides were exercised: some mutated calls are still valid and ran,
  // most were refused.
  EXPECT_GT(outcomes["ran"], calls / 50) << summary;
  EXPECT_GT(outcomes["InvalidArgument"] + outcomes["ShapeMismatch"], calls / 4) << summary;
}

FERRUM_INSTANTIATE_ON_ALL_BACKENDS(RandomCalls);

}  // namespace
}  // namespace ferrum::test
