#!/usr/bin/env python3
"""One decode SDPA shape, run a few times, for ncu to profile torch's kernels.

What structure lets cuDNN read K+V at 4.6 TB/s in decode (issue 3; ours tops
out at 4.3)? Its grid, block, shared memory, registers, occupancy and DRAM
rate answer that; ncu reports them for the kernels this script launches:

  ncu --clock-control none --profile-from-start off --launch-count 8 \
      --metrics launch__grid_size,launch__block_size,launch__registers_per_thread,\
launch__shared_mem_per_block_dynamic,launch__shared_mem_per_block_static,\
launch__occupancy_limit_shared_mem,sm__warps_active.avg.pct_of_peak_sustained_active,\
gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum \
      python3 bench/torch_decode_probe.py --backend cudnn --batch 16 --kv 8192

Shapes as bench/torch_reference.py's decode cases: 32 q heads, 8 kv heads,
hd 128, f16, q_len 1, GQA through enable_gqa. One call runs outside the
profiled range (cudaProfilerStart / Stop), so the range holds only the
decode calls' kernels. Not a benchmark (no timing).
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["cudnn", "flash"], default="cudnn")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--kv", type=int, default=8192, help="cache length L")
    ap.add_argument("--calls", type=int, default=4)
    args = ap.parse_args()

    nh, nkv, hd = 32, 8, 128
    q = torch.randn(args.batch, nh, 1, hd, device="cuda", dtype=torch.float16)
    k = torch.randn(args.batch, nkv, args.kv, hd, device="cuda", dtype=torch.float16)
    v = torch.randn(args.batch, nkv, args.kv, hd, device="cuda", dtype=torch.float16)
    backend = SDPBackend.CUDNN_ATTENTION if args.backend == "cudnn" else SDPBackend.FLASH_ATTENTION
    with sdpa_kernel(backend):
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # plans, workspaces: outside the range
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        for _ in range(args.calls):
            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    print(f"probe: {args.backend} B={args.batch} L={args.kv}: {args.calls} calls")


if __name__ == "__main__":
    main()
