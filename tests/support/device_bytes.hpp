// Raw device memory for the tests that call a kernel launcher directly (no
// Backend, no Buffer): allocated on construction, optionally filled from
// host bytes, freed on scope exit. A failed CUDA call is a test failure.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

namespace ferrum::test {

class DeviceBytes {
 public:
  explicit DeviceBytes(std::size_t bytes) : bytes_(bytes) {
    EXPECT_EQ(cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes), cudaSuccess) << "cudaMalloc of " << bytes << " bytes";
  }
  explicit DeviceBytes(const std::vector<std::uint8_t>& host) : DeviceBytes(host.size()) {
    if (ptr_ != nullptr) {
      EXPECT_EQ(cudaMemcpy(ptr_, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ~DeviceBytes() {
    if (ptr_ != nullptr) {
      EXPECT_EQ(cudaFree(ptr_), cudaSuccess);
    }
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;

  void* get() const { return ptr_; }
  std::size_t size() const { return bytes_; }
  void fill(int byte) { EXPECT_EQ(cudaMemset(ptr_, byte, bytes_), cudaSuccess); }
  std::vector<std::uint8_t> read() const {
    std::vector<std::uint8_t> host(bytes_);
    EXPECT_EQ(cudaMemcpy(host.data(), ptr_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_;
};

}  // namespace ferrum::test
