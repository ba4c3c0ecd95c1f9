#include "kernels/common/tensor_map.hpp"

#include <cuda_runtime_api.h>

#include "kernels/common/check.hpp"

namespace ferrum::kernels {
namespace {

using EncodeTiledFn = decltype(&cuTensorMapEncodeTiled);

// Null when the driver lacks it; then the callers fall back to kernels
// without TMA.
EncodeTiledFn encode_tiled_fn() {
  static const auto fn = reinterpret_cast<EncodeTiledFn>(driver_entry_point("cuTensorMapEncodeTiled"));
  return fn;
}

}  // namespace

bool encode_rows_map(CUtensorMap* map, DType dtype, const void* base, int head_dim, long long rows,
                     long long plane_rows, long long planes) {
  const EncodeTiledFn encode = encode_tiled_fn();
  if (encode == nullptr || head_dim <= 0 || head_dim % 64 != 0) return false;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(rows > 0 ? rows : 1),
                              static_cast<cuuint64_t>(planes)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(head_dim) * 2,
                                 static_cast<cuuint64_t>(plane_rows) * static_cast<cuuint64_t>(head_dim) * 2};
  const cuuint32_t box[3] = {64, 64, 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  return encode(map, dtype == DType::BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3,
                const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace ferrum::kernels
