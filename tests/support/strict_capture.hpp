// StrictCapture: while alive, the calling thread holds a capture of its own
// in cudaStreamCaptureModeThreadLocal on a private stream, so CUDA refuses,
// on this thread, every call that could allocate or synchronize behind a
// stream's back (cudaMalloc, cudaMemcpy, cudaStreamSynchronize, ...) with
// cudaErrorStreamCaptureUnsupported, even inside the backend's own capture,
// which is relaxed (CUDA's rule: a thread with an ongoing capture that was
// not begun relaxed may make no potentially unsafe call). Thread-local, not
// Global: other threads of the process are left alone. Wrapped around an
// op's capture, it turns "ops never allocate or synchronize in the hot path"
// from a review claim into a driver check. Ends its capture on finish() or
// destruction; finish() says whether it ended cleanly.
#pragma once

#include <cuda_runtime_api.h>

namespace ferrum::test {

class StrictCapture {
 public:
  StrictCapture() {
    // One memset node, so that the capture is never empty (its end then
    // fails only if something invalidated it).
    ok_ = cudaMalloc(&word_, sizeof(int)) == cudaSuccess &&
          cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) == cudaSuccess &&
          cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
    capturing_ = ok_;
    if (ok_) ok_ = cudaMemsetAsync(word_, 0, sizeof(int), stream_) == cudaSuccess;
  }
  ~StrictCapture() {
    (void)finish();
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    if (word_ != nullptr) (void)cudaFree(word_);
  }
  StrictCapture(const StrictCapture&) = delete;
  StrictCapture& operator=(const StrictCapture&) = delete;

  // Whether the strict capture began (false: nothing was enforced).
  bool began() const noexcept { return ok_; }

  // Ends the strict capture: true when it began and was not invalidated
  // (an unsafe call made while it was open invalidates it).
  bool finish() noexcept {
    if (!capturing_) return false;
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    const cudaError_t err = cudaStreamEndCapture(stream_, &graph);
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    return err == cudaSuccess;
  }

 private:
  void* word_ = nullptr;  // the memset node's target
  cudaStream_t stream_ = nullptr;
  bool ok_ = false;
  bool capturing_ = false;
};

}  // namespace ferrum::test
