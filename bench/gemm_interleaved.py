#!/usr/bin/env python3
"""GEMM: ferrum against torch.matmul (cuBLAS), interleaved in one process.

Both sides get the same kind of tensors and queue on the same stream
(ferrum's, wrapped as a torch ExternalStream). Each repetition times one
torch.matmul and one ferrum gemm back to back (the order alternates), with
CUDA events around each call, so clock drift and other processes affect both
alike. Medians over --reps repetitions after a warm-up.

Cold weights: every call (either side) takes the next of >= 3 weight sets,
rotated through >= 256 MiB (past the 50 MB L2), so no call finds its weight
in L2 from the call before it.

Host overhead: each batch of timed calls is queued behind a GPU sleep long
enough for Python to enqueue the whole batch, so the events time the GPU
work only, not ctypes / torch dispatch. A batch whose last event had
already completed when the host finished queueing it is counted as
"starved" (its times may include host gaps); a non-zero count is printed
and stored.

Suites:
  decode  f16, m in {1, 2, 4, 8, 16, 64} (bf16: m in {1, 2}) x [k, n] in
          [4096, 4096], [4096, 6144], [4096, 14336], [4096, 28672],
          [14336, 4096], [8192, 8192], [4096, 128256] (lm_head): us, weight GB/s and % of a 1 GiB device copy (torch
          copy_, bytes read + written, measured in this process). m <= 16
          may take ferrum's skinny kernel when aligned (column "path");
          --ms 8,16 keeps only those m (both dtypes).
  legacy  8192^3 and m in {1, 16, 64} x [8192 x {8192, 28672}], f16 and
          bf16: the 3 % question against torch.matmul.

usage: gemm_interleaved.py --capi build/bench/libferrum_bench_capi.so [--json FILE] [--reps N]
                           [--suite decode|legacy|all] [--ms M,M,...] [--skinny-max-m N]
"""
import argparse
import ctypes
import json
import statistics
import sys
import time

DECODE_MS = (1, 2, 4, 8, 16, 64)
# (k, n); 4096 x 6144 and 4096 x 28672 are the llama3-8b step's fused q|k|v and gate|up.
DECODE_KN = ((4096, 4096), (4096, 6144), (4096, 14336), (4096, 28672), (14336, 4096), (8192, 8192), (4096, 128256))
DECODE_BF16_MS = (1, 2)
LEGACY_SHAPES = [(8192, 8192, 8192)] + [(m, n, 8192) for n in (8192, 28672) for m in (1, 16, 64)]

ROTATE_BYTES = 256 * 2**20  # weight bytes each rotation walks through (> 5x L2)
MIN_SETS = 3
BATCH = 16                   # timed pairs queued behind one GPU sleep
SLEEP_CYCLES = 20_000_000    # ~10 ms at 1.98 GHz: covers the host queueing a batch
COPY_BYTES = 2**30


def median_us(pairs):
    return statistics.median(e0.elapsed_time(e1) * 1e3 for e0, e1 in pairs)


def copy_bandwidth(torch, stream, reps=20):
    """GB/s (bytes read + written) of a 1 GiB device-to-device torch copy_."""
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    events = []
    for _ in range(reps):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record(stream)
        dst.copy_(src)
        e1.record(stream)
        events.append((e0, e1))
    torch.cuda.synchronize()
    us = median_us(events)
    del src, dst
    torch.cuda.empty_cache()
    return 2.0 * COPY_BYTES / (us * 1e-6) / 1e9, us


def bench_one(torch, lib, stream, err, dtype_name, td, code, m, n, k, reps, copy_gbps):
    weight_bytes = n * k * 2
    sets = max(MIN_SETS, -(-ROTATE_BYTES // weight_bytes))
    a = [torch.randn(m, k, dtype=td, device="cuda") for _ in range(sets)]
    w = [torch.randn(n, k, dtype=td, device="cuda") / k**0.5 for _ in range(sets)]
    out = [torch.empty(m, n, dtype=td, device="cuda") for _ in range(sets)]
    paths = {lib.ferrum_bench_gemm_is_skinny(a[s].data_ptr(), w[s].data_ptr(), m, n, k, code) for s in range(sets)}
    path = "skinny" if paths == {1} else "cublas" if paths == {0} else "mixed"

    def ferrum(s):
        rc = lib.ferrum_bench_gemm(a[s].data_ptr(), w[s].data_ptr(), out[s].data_ptr(), m, n, k, code, err, len(err))
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
            raise RuntimeError(f"ferrum gemm differs from torch: relative error {rel} (m={m} n={n} k={k})")
        torch_mm(s)
    torch.cuda.synchronize()

    times = {"ferrum": [], "torch": []}
    call = 0  # every call takes the next weight set
    starved = 0
    for b0 in range(0, reps, BATCH):
        torch.cuda._sleep(SLEEP_CYCLES)
        for r in range(b0, min(reps, b0 + BATCH)):
            order = (("torch", torch_mm), ("ferrum", ferrum)) if r % 2 else (("ferrum", ferrum), ("torch", torch_mm))
            for name, fn in order:
                e0 = torch.cuda.Event(enable_timing=True)
                e1 = torch.cuda.Event(enable_timing=True)
                e0.record(stream)
                fn(call % sets)
                e1.record(stream)
                times[name].append((e0, e1))
                call += 1
        last = times["torch" if r % 2 == 0 else "ferrum"][-1][1]  # the batch's last event
        if last.query():  # the GPU drained the queue before the host finished it
            starved += 1
        torch.cuda.synchronize()
    med = {name: median_us(ev) for name, ev in times.items()}
    del a, w, out
    gbps = {name: weight_bytes / (us * 1e-6) / 1e9 for name, us in med.items()}
    return {
        "dtype": dtype_name, "m": m, "n": n, "k": k, "shape": f"m={m} n={n} k={k}", "path": path,
        "ferrum_us": med["ferrum"], "torch_us": med["torch"], "torch_over_ferrum": med["torch"] / med["ferrum"],
        "weight_bytes": weight_bytes,
        "ferrum_weight_gbps": gbps["ferrum"], "torch_weight_gbps": gbps["torch"],
        "ferrum_pct_copy": 100.0 * gbps["ferrum"] / copy_gbps, "torch_pct_copy": 100.0 * gbps["torch"] / copy_gbps,
        "ferrum_tflops": 2.0 * m * n * k / med["ferrum"] / 1e6,
        "sets": sets, "reps": reps, "starved_batches": starved,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capi", required=True, help="path to libferrum_bench_capi.so")
    ap.add_argument("--skinny-max-m", type=int, default=-1,
                    help="CudaBackendConfig::gemm_skinny_max_m (-1: library default; 16: skinny for every m <= 16)")
    ap.add_argument("--ms", help="decode suite: only these m (comma-separated), in both dtypes")
    ap.add_argument("--json", help="write results here")
    ap.add_argument("--reps", type=int, default=64)
    ap.add_argument("--suite", choices=("decode", "legacy", "all"), default="all")
    args = ap.parse_args()

    import torch
    if not torch.cuda.is_available():
        print("no GPU: nothing to benchmark")
        return 0
    lib = ctypes.CDLL(args.capi)
    lib.ferrum_bench_init.argtypes = [ctypes.c_int]
    lib.ferrum_bench_init(args.skinny_max_m)
    lib.ferrum_bench_stream.restype = ctypes.c_void_p
    lib.ferrum_bench_gemm.restype = ctypes.c_int
    lib.ferrum_bench_gemm.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_longlong] * 3 + [ctypes.c_int, ctypes.c_char_p,
                                                                                      ctypes.c_int]
    lib.ferrum_bench_gemm_is_skinny.restype = ctypes.c_int
    lib.ferrum_bench_gemm_is_skinny.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_longlong] * 3 + [ctypes.c_int]
    stream = torch.cuda.ExternalStream(lib.ferrum_bench_stream())
    err = ctypes.create_string_buffer(512)

    configs = []
    if args.suite in ("decode", "all"):
        f16_ms = [int(x) for x in args.ms.split(",")] if args.ms else DECODE_MS
        bf16_ms = f16_ms if args.ms else DECODE_BF16_MS
        configs += [("f16", torch.float16, 0, m, n, k) for k, n in DECODE_KN for m in f16_ms]
        configs += [("bf16", torch.bfloat16, 1, m, n, k) for k, n in DECODE_KN for m in bf16_ms]
    if args.suite in ("legacy", "all"):
        configs += [(dt, td, code, m, n, k) for dt, td, code in (("f16", torch.float16, 0), ("bf16", torch.bfloat16, 1))
                    for m, n, k in LEGACY_SHAPES]

    records = []
    t_start = time.time()
    with torch.cuda.stream(stream):
        copy_gbps, copy_us = copy_bandwidth(torch, stream)
        print(f"1 GiB device copy (torch copy_): {copy_us:.1f} us, {copy_gbps:.0f} GB/s (read + write)")
        print(f"{'dtype':5} {'shape':26} {'path':6} {'ferrum us':>10} {'torch us':>10} {'t/f':>6} "
              f"{'ferrum GB/s':>11} {'%copy':>6} {'torch GB/s':>10} {'%copy':>6} {'TFLOP/s':>8}")
        for dt, td, code, m, n, k in configs:
            rec = bench_one(torch, lib, stream, err, dt, td, code, m, n, k, args.reps, copy_gbps)
            records.append(rec)
            note = f"  ({rec['starved_batches']} starved batches)" if rec["starved_batches"] else ""
            print(f"{dt:5} {rec['shape']:26} {rec['path']:6} {rec['ferrum_us']:10.2f} {rec['torch_us']:10.2f} "
                  f"{rec['torch_over_ferrum']:6.3f} {rec['ferrum_weight_gbps']:11.0f} {rec['ferrum_pct_copy']:6.1f} "
                  f"{rec['torch_weight_gbps']:10.0f} {rec['torch_pct_copy']:6.1f} {rec['ferrum_tflops']:8.1f}{note}",
                  flush=True)
            torch.cuda.empty_cache()
    print(f"total {time.time() - t_start:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tool": "gemm_interleaved", "suite": args.suite, "torch_version": torch.__version__,
                       "device": torch.cuda.get_device_name(), "copy_bytes": COPY_BYTES, "copy_us": copy_us,
                       "copy_gbps": copy_gbps, "records": records}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
