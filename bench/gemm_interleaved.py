#!/usr/bin/env python3
"""GEMM: ferrum against torch.matmul, interleaved in one process.

Both sides get the same tensors and queue on the same stream (ferrum's,
wrapped as a torch ExternalStream); each repetition times one torch.matmul
and one ferrum gemm back to back, so clock drift and other processes affect
both alike. Weight sets rotate past L2 for the skinny shapes.

usage: gemm_interleaved.py --capi build/bench/libferrum_bench_capi.so [--json FILE] [--reps N]
"""
import argparse
import ctypes
import json
import statistics
import sys

SHAPES = [(8192, 8192, 8192)] + [(m, n, 8192) for n in (8192, 28672) for m in (1, 16, 64)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capi", required=True, help="path to libferrum_bench_capi.so")
    ap.add_argument("--json", help="write results here")
    ap.add_argument("--reps", type=int, default=60)
    args = ap.parse_args()

    import torch
    if not torch.cuda.is_available():
        print("no GPU: nothing to benchmark")
        return 0
    lib = ctypes.CDLL(args.capi)
    lib.ferrum_bench_stream.restype = ctypes.c_void_p
    lib.ferrum_bench_gemm.restype = ctypes.c_int
    lib.ferrum_bench_gemm.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_longlong] * 3 + [ctypes.c_int, ctypes.c_char_p,
                                                                                      ctypes.c_int]
    stream = torch.cuda.ExternalStream(lib.ferrum_bench_stream())
    err = ctypes.create_string_buffer(512)
    records = []
    print(f"{'dtype':5} {'shape':24} {'ferrum us':>10} {'torch us':>10} {'torch/ferrum':>13} {'TFLOP/s':>8}")
    with torch.cuda.stream(stream):
        for dt, td, code in (("f16", torch.float16, 0), ("bf16", torch.bfloat16, 1)):
            for m, n, k in SHAPES:
                weight_bytes = n * k * 2
                sets = max(2, -(-256 * 2**20 // weight_bytes))
                a = [torch.randn(m, k, dtype=td, device="cuda") for _ in range(sets)]
                w = [torch.randn(n, k, dtype=td, device="cuda") / k**0.5 for _ in range(sets)]
                out = [torch.empty(m, n, dtype=td, device="cuda") for _ in range(sets)]

                def ferrum(s):
                    rc = lib.ferrum_bench_gemm(a[s].data_ptr(), w[s].data_ptr(), out[s].data_ptr(), m, n, k, code,
                                               err, len(err))
                    if rc != 0:
                        raise RuntimeError(err.value.decode())

                def torch_mm(s):
                    torch.matmul(a[s], w[s].t(), out=out[s])

                for s in range(sets):  # warm-up, and a correctness check against torch
                    ferrum(s)
                    ref = torch.matmul(a[s], w[s].t())
                    torch.cuda.synchronize()
                    rel = ((out[s].float() - ref.float()).norm() / ref.float().norm()).item()
                    if rel > 1e-2:
                        raise RuntimeError(f"ferrum gemm differs from torch: relative error {rel}")
                times = {"ferrum": [], "torch": []}
                for r in range(args.reps):
                    s = r % sets
                    for name, fn in (("torch", torch_mm), ("ferrum", ferrum)) if r % 2 else (("ferrum", ferrum),
                                                                                            ("torch", torch_mm)):
                        e0 = torch.cuda.Event(enable_timing=True)
                        e1 = torch.cuda.Event(enable_timing=True)
                        e0.record(stream)
                        fn(s)
                        e1.record(stream)
                        times[name].append((e0, e1))
                torch.cuda.synchronize()
                med = {name: statistics.median(e0.elapsed_time(e1) * 1e3 for e0, e1 in ev) for name, ev in times.items()}
                tflops = 2.0 * m * n * k / med["ferrum"] / 1e6
                shape = f"m={m} n={n} k={k}"
                print(f"{dt:5} {shape:24} {med['ferrum']:10.2f} {med['torch']:10.2f} "
                      f"{med['torch'] / med['ferrum']:13.3f} {tflops:8.1f}")
                records.append({"dtype": dt, "shape": shape, "ferrum_us": med["ferrum"], "torch_us": med["torch"],
                                "torch_over_ferrum": med["torch"] / med["ferrum"], "sets": sets, "reps": args.reps})
                del a, w, out
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tool": "gemm_interleaved", "torch_version": torch.__version__,
                       "device": torch.cuda.get_device_name(), "records": records}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
