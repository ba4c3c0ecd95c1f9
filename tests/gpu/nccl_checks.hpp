// The collective checks one rank runs, shared by test_nccl.cpp (two ranks in
// one process, one thread each) and nccl_worker.cpp (one process per rank).
// Every rank of the communicator must call run_collective_checks with the
// same arguments at the same time: it issues the same collectives in the same
// order on every rank.
//
// Inputs are small integers chosen so that every expected value is exact in
// f16, bf16 and f32 (|sum| <= 20, products of {-2,-1,1,2}, averages of two
// integers = half-integers, all-gather values below 256), so results are
// compared for exact equality. The Avg expectation sum / world is exact for
// world sizes that are powers of two (NCCL pre-multiplies by 1/world).
// Outputs have guard elements after the view that must keep their value.
#pragma once

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "ferrum/ferrum.hpp"

namespace ferrum::test::nccl {

inline constexpr std::size_t kGuard = 17;

// Guard element j past a buffer on rank r: -(64 + kGuard r + j), distinct
// for every rank and position (each rank's run of kGuard values its own) and
// outside the checks' data (the 2-rank reductions and broadcasts stay within
// +-10, all_gather's values are >= 0): a copy or sum that runs past the end
// changes it, as does a max or min on every rank but the one whose guard
// wins. Exact in f16 and bf16 (integers below 256 for up to 8 ranks).
inline float guard_value(std::size_t rank, std::size_t j) {
  return -static_cast<float>(64 + kGuard * rank + j);
}

inline constexpr std::size_t kCheckLens[] = {1, 4099, 262147};
inline constexpr ReduceOp kReduceOps[] = {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod, ReduceOp::Avg};
inline constexpr DType kCollectiveDTypes[] = {DType::F16, DType::BF16, DType::F32};

// Workplace rule: NVLink multicast (NVLS) stays off on the H200 machines.
// Called before any communicator is created in the process.
inline void keep_nvls_off() {
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);  // unless already set
}

inline const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
    case ReduceOp::Prod: return "prod";
    case ReduceOp::Avg: return "avg";
  }
  return "?";
}

// The value rank r contributes at element i for a reduction `op`.
inline float reduce_input(ReduceOp op, std::size_t r, std::size_t i) {
  static constexpr float kProd[] = {-2.0f, -1.0f, 1.0f, 2.0f};
  switch (op) {
    case ReduceOp::Prod: return kProd[(i + 3 * r) % 4];
    case ReduceOp::Avg: return static_cast<float>(static_cast<int>((i + 7 * r) % 9) - 4);
    default: return static_cast<float>(static_cast<int>((i * 3 + r * 5) % 11) - 5);
  }
}

inline float reduce_expect(ReduceOp op, std::size_t world, std::size_t i) {
  double acc = reduce_input(op, 0, i);
  for (std::size_t r = 1; r < world; ++r) {
    const double v = reduce_input(op, r, i);
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: acc += v; break;
      case ReduceOp::Max: acc = v > acc ? v : acc; break;
      case ReduceOp::Min: acc = v < acc ? v : acc; break;
      case ReduceOp::Prod: acc *= v; break;
    }
  }
  if (op == ReduceOp::Avg) acc /= static_cast<double>(world);
  return static_cast<float>(acc);
}

inline std::string id_to_hex(const CommUniqueId& id) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (char c : id.bytes) {
    const auto b = static_cast<unsigned char>(c);
    s += kHex[b >> 4];
    s += kHex[b & 15];
  }
  return s;
}

inline bool id_from_hex(const std::string& s, CommUniqueId& id) {
  if (s.size() != 2 * id.bytes.size()) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (std::size_t i = 0; i < id.bytes.size(); ++i) {
    const int hi = nibble(s[2 * i]), lo = nibble(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    id.bytes[i] = static_cast<char>((hi << 4) | lo);
  }
  return true;
}

class Checker {
 public:
  explicit Checker(Backend& be) : be_(be), rank_(be.rank()), world_(be.world_size()) {}

  const std::vector<std::string>& failures() const { return failures_; }

  // [values..., guard...] uploaded as dtype.
  Buffer upload_guarded(const std::vector<float>& values, DType dt) {
    std::vector<float> host = values;
    for (std::size_t j = 0; j < kGuard; ++j) host.push_back(guard_value(rank_, j));
    return be_.upload(host, dt);
  }

  // Downloads len + kGuard elements and compares: first len to want, the rest to the guard.
  void expect(const Buffer& buf, const std::vector<float>& want, const std::string& what) {
    be_.synchronize();
    const std::vector<float> got = be_.download(buf, want.size() + kGuard);
    std::size_t bad = 0, first = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const float w = i < want.size() ? want[i] : guard_value(rank_, i - want.size());
      if (!(got[i] == w)) {
        if (bad++ == 0) first = i;
      }
    }
    if (bad != 0) {
      std::ostringstream s;
      s << "rank " << rank_ << " of " << world_ << ": " << what << ": " << bad << " wrong element(s); first at "
        << first << (first >= want.size() ? " (guard)" : "") << ": got " << got[first] << ", want "
        << (first < want.size() ? want[first] : guard_value(rank_, first - want.size()));
      failures_.push_back(s.str());
    }
  }

  void fail(const std::string& what) {
    failures_.push_back("rank " + std::to_string(rank_) + " of " + std::to_string(world_) + ": " + what);
  }

  // Expects fn to throw ferrum::Error with `code` (a local validation error: no collective is issued), its message
  // naming the op and the argument (`arg`, quoted as the messages quote it).
  template <class Fn>
  void expect_error(ErrorCode code, const std::string& op, const std::string& arg, const std::string& what, Fn&& fn) {
    try {
      fn();
      fail(what + ": did not throw");
    } catch (const Error& e) {
      const std::string message = e.what();
      if (e.code() != code) fail(what + ": threw " + std::string(to_string(e.code())) + ": " + message);
      for (const std::string& part : {op + ":", "'" + arg + "'"}) {
        if (message.find(part) == std::string::npos) fail(what + ": the message does not name " + part + ": " + message);
      }
    }
  }

  void all_reduce(DType dt, std::size_t len, ReduceOp op) {
    std::vector<float> in(len), want(len);
    for (std::size_t i = 0; i < len; ++i) {
      in[i] = reduce_input(op, rank_, i);
      want[i] = reduce_expect(op, world_, i);
    }
    Buffer buf = upload_guarded(in, dt);
    be_.all_reduce(buf, len, op);
    expect(buf, want, label("all_reduce", dt, len, op_name(op)));
  }

  void all_gather(DType dt, std::size_t len) {
    auto value = [](std::size_t r, std::size_t i) { return static_cast<float>((i % 64) + 64 * (r % 3)); };
    std::vector<float> local(len), want(world_ * len);
    for (std::size_t i = 0; i < len; ++i) local[i] = value(rank_, i);
    for (std::size_t r = 0; r < world_; ++r) {
      for (std::size_t i = 0; i < len; ++i) want[r * len + i] = value(r, i);
    }
    Buffer in = be_.upload(local, dt);
    // Poisoned: NaN equals no expected value, so an element left unwritten fails.
    Buffer out = upload_guarded(std::vector<float>(world_ * len, std::numeric_limits<float>::quiet_NaN()), dt);
    be_.all_gather(in, out, len);
    expect(out, want, label("all_gather", dt, len, ""));
  }

  void broadcast(DType dt, std::size_t len, std::size_t root) {
    auto value = [](std::size_t r, std::size_t i) { return static_cast<float>(static_cast<int>((i + 5 * r) % 19) - 9); };
    std::vector<float> mine(len), want(len);
    for (std::size_t i = 0; i < len; ++i) {
      mine[i] = value(rank_, i);
      want[i] = value(root, i);
    }
    Buffer buf = upload_guarded(mine, dt);
    be_.broadcast(buf, len, root);
    expect(buf, want, label("broadcast", dt, len, "root " + std::to_string(root)));
  }

  void reduce_scatter(DType dt, std::size_t len, ReduceOp op) {
    // Rank r's input at global index g = q * len + i is reduce_input(op, r, g);
    // this rank keeps slice q = rank.
    std::vector<float> in(world_ * len), want(len);
    for (std::size_t g = 0; g < world_ * len; ++g) in[g] = reduce_input(op, rank_, g);
    for (std::size_t i = 0; i < len; ++i) want[i] = reduce_expect(op, world_, rank_ * len + i);
    Buffer input = be_.upload(in, dt);
    // Poisoned (NaN): -1 is an expected value of some elements, which a skipped write would have passed.
    Buffer output = upload_guarded(std::vector<float>(len, std::numeric_limits<float>::quiet_NaN()), dt);
    be_.reduce_scatter(input, output, len, op);
    expect(output, want, label("reduce_scatter", dt, len, op_name(op)));
  }

  // Validation errors are local: no rank issues a collective for them.
  void validation_errors() {
    const std::size_t len = 8;
    Buffer f16 = be_.alloc(DType::F16, world_ * len), f32 = be_.alloc(DType::F32, world_ * len);
    Buffer small = be_.alloc(DType::F16, world_ * len - 1);
    expect_error(ErrorCode::ShapeMismatch, "reduce_scatter", "input", "reduce_scatter with a short input",
                 [&] { be_.reduce_scatter(small, f16, len, ReduceOp::Sum); });
    expect_error(ErrorCode::DTypeMismatch, "reduce_scatter", "output", "reduce_scatter with mixed dtypes",
                 [&] { be_.reduce_scatter(f16, f32, len, ReduceOp::Sum); });
    expect_error(ErrorCode::ShapeMismatch, "all_gather", "global", "all_gather with a short global",
                 [&] { be_.all_gather(f16, small, len); });
    expect_error(ErrorCode::InvalidArgument, "broadcast", "src_rank", "broadcast from rank world_size",
                 [&] { be_.broadcast(f16, len, world_); });
  }

 private:
  static std::string label(const char* op, DType dt, std::size_t len, const std::string& extra) {
    return std::string(op) + " " + std::string(to_string(dt)) + " len=" + std::to_string(len) +
           (extra.empty() ? "" : " " + extra);
  }

  Backend& be_;
  std::size_t rank_, world_;
  std::vector<std::string> failures_;
};

// Every collective, op and dtype. Returns the failures (empty: all passed);
// an exception (a NCCL error, a timeout) ends the run and is reported too.
inline std::vector<std::string> run_collective_checks(Backend& be) {
  Checker c(be);
  try {
    if (be.world_size() < 2) c.fail("world size " + std::to_string(be.world_size()) + ", expected at least 2");
    for (DType dt : kCollectiveDTypes) {
      for (std::size_t len : kCheckLens) {
        for (ReduceOp op : kReduceOps) c.all_reduce(dt, len, op);
        c.all_gather(dt, len);
        for (std::size_t root = 0; root < be.world_size(); ++root) c.broadcast(dt, len, root);
        for (ReduceOp op : kReduceOps) c.reduce_scatter(dt, len, op);
      }
    }
    c.validation_errors();
    be.synchronize();
  } catch (const std::exception& e) {
    c.fail(std::string("threw: ") + e.what());
  }
  return c.failures();
}

}  // namespace ferrum::test::nccl
