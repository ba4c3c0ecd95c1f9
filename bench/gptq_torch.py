#!/usr/bin/env python3
"""torch's INT4 weight-only GEMM (tinygemm) on the shapes of bench_gptq.cpp.

    python3 bench/gptq_torch.py [--json PATH] [--iters N] [--warmup N] [--quick]

torch._weight_int4pack_mm(a bf16 [m, k], packed, group_size, scale_and_zeros
bf16 [k / g, n, 2]) after torch._convert_weight_to_int4pack(w, inner_k_tiles).
The packing input changed across torch 2.x: 2.5+ takes uint8 [n, k / 2] (two
4-bit values per byte, the even k index in the high nibble); earlier versions
take int32 [n, k] (one value per element). Both are tried. bf16, group 128
(tinygemm's layout; the values do not matter for timing). Also times cuBLAS
bf16 (torch.mm against a [k, n] view of an [n, k] weight, as a linear layer).

Method as bench_gptq.cpp: CUDA events around each call, warmup, median,
several weight copies rotated so that no call finds its weights in L2.
"""
import argparse
import json
import statistics

import torch

SHAPES = [(4096, 4096), (4096, 14336), (14336, 4096), (8192, 8192), (8192, 28672), (4096, 6144), (4096, 28672)]
MS = [1, 2, 4, 8, 16, 32, 64, 128]
ROTATE_BYTES = 256 << 20
GROUP = 128
INNER_K_TILES = 8


def pack_int4(w_int: torch.Tensor) -> torch.Tensor:
    """w_int: int32 [n, k] values 0..15 on the GPU -> torch's packed layout."""
    packed_u8 = ((w_int[:, ::2] << 4) | w_int[:, 1::2]).to(torch.uint8)
    try:
        return torch._convert_weight_to_int4pack(packed_u8, INNER_K_TILES)
    except (RuntimeError, TypeError):
        return torch._convert_weight_to_int4pack(w_int.contiguous(), INNER_K_TILES)


def time_median(fn, copies, warmup, iters):
    for i in range(warmup):
        fn(i % copies)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for i, (start, stop) in enumerate(events):
        start.record()
        fn((warmup + i) % copies)
        stop.record()
    torch.cuda.synchronize()
    return statistics.median(1000.0 * s.elapsed_time(e) for s, e in events)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default="")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()

    shapes = [(8192, 8192)] if args.quick else SHAPES
    ms = [1, 16, 64] if args.quick else MS
    dev = torch.device("cuda")
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, bf16, group {GROUP}")
    print(f"{'k':>6} {'n':>6} {'m':>5} | {'int4pack_us':>11} {'int4_GB/s':>9} | {'cublas_us':>9} {'speedup':>8}")
    rows = []
    for k, n in shapes:
        q_bytes = k * n // 2
        copies = max(3, -(-ROTATE_BYTES // q_bytes))
        packed, sz = [], []
        for _ in range(copies):
            w_int = torch.randint(0, 16, (n, k), dtype=torch.int32, device=dev)
            packed.append(pack_int4(w_int))
            del w_int
            scales = torch.rand(k // GROUP, n, 1, device=dev, dtype=torch.bfloat16) * 0.01 + 0.001
            zeros = torch.full((k // GROUP, n, 1), 0.0, device=dev, dtype=torch.bfloat16)
            sz.append(torch.cat([scales, zeros], dim=2).contiguous())
        dense_bytes = k * n * 2
        dense_copies = max(2, -(-ROTATE_BYTES // dense_bytes))
        dense = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.01 for _ in range(dense_copies)]
        a_all = torch.randn(max(ms), k, device=dev, dtype=torch.bfloat16)
        for m in ms:
            a = a_all[:m].contiguous()
            ours = time_median(lambda c: torch._weight_int4pack_mm(a, packed[c], GROUP, sz[c]), copies,
                               args.warmup, args.iters)
            cub = time_median(lambda c: torch.mm(a, dense[c].t()), dense_copies, args.warmup, args.iters)
            row = {"k": k, "n": n, "m": m, "int4pack_us": ours, "int4_gbps": q_bytes / (ours * 1e3),
                   "cublas_bf16_us": cub, "speedup_vs_cublas": cub / ours}
            rows.append(row)
            print(f"{k:>6} {n:>6} {m:>5} | {ours:>11.1f} {row['int4_gbps']:>9.0f} | {cub:>9.1f} {cub / ours:>7.2f}x",
                  flush=True)
        del packed, sz, dense, a_all
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "dtype": "bf16",
                       "group_size": GROUP, "iters": args.iters, "results": rows}, f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
