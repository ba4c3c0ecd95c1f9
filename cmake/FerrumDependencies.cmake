# Finds what ferrum_kernels needs and defines:
#   CUDA::cudart / CUDA::cublas / CUDA::cublasLt  (CUDAToolkit; no kernel is
#   compiled at run time, so NVRTC is not linked), with FERRUM_CUDA only
#   NCCL::NCCL and FERRUM_WITH_NCCL (on when NCCL is found; never without FERRUM_CUDA)
#   ferrum_fmt: fmt, header-only, linked privately (never in our public headers)
if(FERRUM_CUDA)
  find_package(CUDAToolkit REQUIRED)
  find_package(NCCL QUIET)
else()
  set(NCCL_FOUND FALSE)
endif()
option(FERRUM_WITH_NCCL "Build the NCCL communicator (tensor parallelism)" ${NCCL_FOUND})
if(FERRUM_WITH_NCCL AND NOT FERRUM_CUDA)
  message(FATAL_ERROR "FERRUM_WITH_NCCL is ON but FERRUM_CUDA is OFF (the communicator runs on CudaBackend)")
elseif(FERRUM_WITH_NCCL AND NOT NCCL_FOUND)
  message(FATAL_ERROR "FERRUM_WITH_NCCL is ON but NCCL was not found (set NCCL_ROOT)")
endif()

add_library(ferrum_fmt INTERFACE)
find_package(fmt CONFIG QUIET)
if(TARGET fmt::fmt-header-only)
  target_link_libraries(ferrum_fmt INTERFACE fmt::fmt-header-only)
else()
  # Some machines ship fmt's headers without its CMake package.
  find_path(FERRUM_FMT_INCLUDE_DIR fmt/format.h REQUIRED)
  target_include_directories(ferrum_fmt INTERFACE ${FERRUM_FMT_INCLUDE_DIR})
  target_compile_definitions(ferrum_fmt INTERFACE FMT_HEADER_ONLY=1)
endif()
