// TMA tensor maps over the attention layouts (host side): what the wgmma
// prefill hands to cp.async.bulk.tensor. The encoder,
// cuTensorMapEncodeTiled, is reached through the runtime
// (cudaGetDriverEntryPointByVersion), so the library does not link the
// driver library; it is looked up once per process.
#pragma once

#include <cuda.h>  // CUtensorMap

#include "ferrum/dtype.hpp"

namespace ferrum::kernels {

// A 3-d map over `base`: [planes][rows][head_dim] elements of 2 bytes (f16 or
// bf16), row r of plane p at (p * plane_rows + r) * head_dim (plane_rows >=
// rows), boxes of 64 rows x 64 columns with the 128-byte swizzle (a box lands
// as 64 rows of 128 bytes, 16-byte chunk c of row r at chunk c ^ (r & 7)),
// zero fill past `rows` and past `planes`. head_dim a multiple of 64. False
// (nothing written) when the encoder is missing or refuses the map.
bool encode_rows_map(CUtensorMap* map, DType dtype, const void* base, int head_dim, long long rows,
                     long long plane_rows, long long planes);

}  // namespace ferrum::kernels
