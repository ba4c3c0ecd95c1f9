#!/usr/bin/env python3
"""torch reference numbers for the ferrum benchmark (bench/bench_ops.cpp).

Same method as ferrum_bench, so that bench/compare.py can pair the rows:
  * torch.cuda.Event timing on the current stream, warm-up first, MEDIANS of
    many repetitions;
  * inputs/outputs rotate over sets = max(2, ceil(256 MiB / bytes_per_call))
    copies so every call sees data that is not in the ~60 MB L2;
  * large shapes: one call per event pair (mode "stream"); tiny shapes: graphs
    of 100 back-to-back calls under torch.cuda.CUDAGraph, several graphs when
    the sets need more than one, time per op = replay time / 100 (mode "graph");
  * GB/s counts bytes minimally (each input once, each output once), against a
    1 GiB device-to-device copy measured in the same run (2x bytes, median of
    20); GEMM reports TFLOP/s = 2mnk / time.
Each op runs eagerly ("torch_eager") and, where it makes sense, through
torch.compile ("torch_compile"); a compile failure is recorded, not fatal.

Usage (on the GPU machine, no network needed):
  python3 bench/torch_reference.py --json torch.json [--quick] [--filter S]
      [--compile all|large|none] [--reps N] [--pause-ms MS] [--settle-gbps R]
"""

import argparse
import gc
import json
import math
import statistics
import sys
import time
import traceback

ROTATE_BYTES = 256 * 1024 * 1024
MAX_SETS = 1 << 16
GRAPH_OPS = 100
MAX_GRAPHS = 512
COPY_BYTES = 1 << 30
COPY_REPS = 20
HIDDEN = 4096
INTERMEDIATE = 14336
VOCAB = 128256
EPS = 1e-6

torch = None  # imported in main() so that --help works without torch
F = None


def sets_for(bytes_per_call):
    n = math.ceil(ROTATE_BYTES / max(float(bytes_per_call), 1.0))
    return max(2, min(MAX_SETS, n))


def esize(dt):
    return 2  # f16 / bf16


def shape_td(t, d):
    return f"[{t} x {d}]"


def shape_gemm(m, n, k):
    return f"m={m} n={n} k={k}"


def torch_dtype(name):
    return {"f16": torch.float16, "bf16": torch.bfloat16}[name]


def rand(shape, dtype):
    """Uniform magnitude in [1/64, 1] with a random sign (never zero). Made in
    chunks, so a 34 GB KV cache needs no 68 GB fp32 temporary."""
    out = torch.empty(shape, device="cuda", dtype=dtype)
    flat = out.view(-1)
    chunk = 1 << 28
    for start in range(0, flat.numel(), chunk):
        n = min(chunk, flat.numel() - start)
        u = torch.empty(n, device="cuda", dtype=torch.float32).uniform_(-1.0, 1.0)
        mag = u.abs().mul_(63.0 / 64.0).add_(1.0 / 64.0)
        flat[start:start + n] = torch.where(u >= 0, mag, -mag).to(dtype)
        del u, mag
    return out


def rotated(sets, shape, dtype):
    """`sets` random tensors of `shape`, as views of one allocation."""
    big = rand((sets,) + tuple(shape), dtype)
    return list(big.unbind(0))


class Ctx:
    def __init__(self, args):
        self.args = args
        self.records = []
        self.copy_gbps = None
        self.copy_us = None
        self.released = 0  # bytes the last case handed back to the driver (settle)
        self.filters = [f for f in (args.filter or "").split(",") if f]

    def want(self, op, dt, shape, mode):
        if not self.filters:
            return True
        key = f"{op} {dt} {shape} {mode}"
        return any(f in key for f in self.filters)

    def stream_reps(self):
        return self.args.reps or (20 if self.args.quick else 100)

    def graph_reps(self):
        return self.args.reps or (10 if self.args.quick else 50)

    def compile_enabled(self, graph):
        c = self.args.compile
        return c == "all" or (c == "large" and not graph)


def median_us(starts, ends):
    return statistics.median(s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends))


def time_stream(ctx, fn, sets):
    warm = max(sets, 3 if ctx.args.quick else 10)
    for i in range(warm):
        fn(i % sets)
    torch.cuda.synchronize()
    reps = ctx.stream_reps()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for r in range(reps):
        starts[r].record()
        fn((warm + r) % sets)
        ends[r].record()
    torch.cuda.synchronize()
    return median_us(starts, ends), reps, 0


def time_graph(ctx, fn, sets):
    # Warm-up on a side stream (what torch asks for before capture; also
    # triggers torch.compile for the compiled variant).
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(min(sets, 3)):
            fn(i)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    ngraphs = max(1, min(MAX_GRAPHS, math.ceil(sets / GRAPH_OPS)))
    pool = torch.cuda.graph_pool_handle()
    graphs, keep = [], []
    for g in range(ngraphs):
        graph = torch.cuda.CUDAGraph()
        outs = []  # keep outputs alive so every captured call writes its own memory
        with torch.cuda.graph(graph, pool=pool):
            for i in range(GRAPH_OPS):
                outs.append(fn((g * GRAPH_OPS + i) % sets))
        graphs.append(graph)
        keep.append(outs)
    for _ in range(2):
        for graph in graphs:
            graph.replay()
    torch.cuda.synchronize()
    reps = max(ctx.graph_reps(), ngraphs)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for r in range(reps):
        starts[r].record()
        graphs[r % ngraphs].replay()
        ends[r].record()
    torch.cuda.synchronize()
    us = median_us(starts, ends) / GRAPH_OPS
    del graphs, keep
    return us, reps, ngraphs


def measure_copy(ctx):
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda").fill_(0x5A)
    dst = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda").fill_(0xA5)
    for _ in range(3):
        dst.copy_(src)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(COPY_REPS)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(COPY_REPS)]
    for r in range(COPY_REPS):
        starts[r].record()
        dst.copy_(src)
        ends[r].record()
    torch.cuda.synchronize()
    ctx.copy_us = median_us(starts, ends)
    ctx.copy_gbps = 2.0 * COPY_BYTES / ctx.copy_us / 1e3
    del src, dst
    torch.cuda.empty_cache()


def fmt(v, f):
    return "-" if v is None else format(v, f)


def print_header():
    print(f"{'op':<28} {'dtype':<5} {'shape':<34} {'mode':<6} {'impl':<13} {'median_us':>11} "
          f"{'GB/s':>9} {'TFLOP/s':>8} {'%copy':>7} {'sets':>6}")
    print("-" * 136)


def print_row(r):
    if r.get("error"):
        print(f"{r['op']:<28} {r['dtype']:<5} {r['shape']:<34} {r['mode']:<6} {r['impl']:<13} "
              f"ERROR: {r['error'].splitlines()[-1] if r['error'] else ''}")
    else:
        print(f"{r['op']:<28} {r['dtype']:<5} {r['shape']:<34} {r['mode']:<6} {r['impl']:<13} "
              f"{fmt(r['us'], '.2f'):>11} {fmt(r['gbps'], '.0f'):>9} {fmt(r['tflops'], '.1f'):>8} "
              f"{fmt(r['pct_of_copy'], '.1f'):>7} {r['sets']:>6}")
    sys.stdout.flush()


def run_case(ctx, op, dt, shape, graph, nbytes, setup, flops=0.0, compile_ok=True, note="", impls=None):
    """setup(sets) -> (core, argsets): core(*tensors) is the torch code for one
    call, argsets[s] the tensors of set s. With `impls` (names), core is a
    dict impl -> function instead, each timed under its own name."""
    mode = "graph" if graph else "stream"
    if not ctx.want(op, dt, shape, mode):
        return
    settle(ctx)
    if impls is None:
        impls = ["torch_eager"]
        if compile_ok and ctx.compile_enabled(graph):
            impls.append("torch_compile")
    sets = sets_for(nbytes)
    state = None
    setup_error = None
    try:
        state = setup(sets)
    except Exception as e:  # noqa: BLE001 - record and go on
        setup_error = f"setup: {type(e).__name__}: {e}"
    if setup_error is not None:
        # Out of the except block: its traceback no longer holds setup's
        # frame, so cleanup() can free the tensors it had made.
        for impl in impls:
            rec = base_record(op, dt, shape, mode, impl, nbytes, flops, sets)
            rec["error"] = setup_error
            print_row(rec)
            ctx.records.append(rec)
        ctx.released = cleanup()
        return
    core, argsets = state
    for impl in impls:
        rec = base_record(op, dt, shape, mode, impl, nbytes, flops, sets)
        if note:
            rec["note"] = note
        try:
            if impl == "torch_compile":
                torch._dynamo.reset()
                t0 = time.time()
                fcore = torch.compile(core, dynamic=False)
                fcore(*argsets[0])  # compile now, so a failure names the compile
                torch.cuda.synchronize()
                rec["compile_s"] = round(time.time() - t0, 2)
            elif isinstance(core, dict):
                fcore = core[impl]
            else:
                fcore = core

            def fn(s, fcore=fcore):
                return fcore(*argsets[s])

            us, reps, ngraphs = (time_graph if graph else time_stream)(ctx, fn, sets)
            rec["us"] = us
            rec["reps"] = reps
            rec["graphs"] = ngraphs
            if nbytes:
                rec["gbps"] = nbytes / us / 1e3
                rec["pct_of_copy"] = 100.0 * rec["gbps"] / ctx.copy_gbps
            if flops:
                rec["tflops"] = flops / us / 1e6
        except Exception as e:  # noqa: BLE001 - record and go on
            rec["error"] = f"{type(e).__name__}: {e}"
            rec["traceback"] = traceback.format_exc(limit=6)
            try:
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001
                pass
        print_row(rec)
        ctx.records.append(rec)
    del core, argsets, state
    ctx.released = cleanup()


def cleanup():
    """Frees the case's tensors and hands torch's cached blocks back to the
    driver; returns the bytes handed back."""
    gc.collect()
    torch.cuda.synchronize()
    reserved = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    return max(0, reserved - torch.cuda.memory_reserved())


def settle(ctx):
    """The idle ferrum_bench takes before each case (--pause-ms plus the bytes
    the case before handed back / --settle-gbps): a case whose memory comes
    from the driver within ~50-100 ms of tens of GB freed runs up to 16 %
    slow (session 62, H100), and cleanup() frees every case's memory."""
    idle_s = ctx.args.pause_ms / 1e3
    if ctx.args.settle_gbps > 0:
        idle_s += ctx.released / (ctx.args.settle_gbps * 1e9)
    ctx.released = 0
    if idle_s > 0:
        torch.cuda.synchronize()
        time.sleep(idle_s)


def base_record(op, dt, shape, mode, impl, nbytes, flops, sets):
    return {"op": op, "dtype": dt, "shape": shape, "impl": impl, "mode": mode, "us": None,
            "gbps": None, "tflops": None, "pct_of_copy": None, "bytes": float(nbytes),
            "flops": float(flops), "sets": sets, "reps": 0, "graphs": 0}


# ── cases ───────────────────────────────────────────────────────────────────

def case_rms_norm(ctx, dt, T, D, graph):
    td = torch_dtype(dt)
    nbytes = 2 * T * D * esize(dt) + D * esize(dt)

    def setup(sets):
        x, w = rotated(sets, (T, D), td), rotated(sets, (D,), td)

        def core(x, w):
            return F.rms_norm(x, (D,), w, EPS)
        return core, [(x[s], w[s]) for s in range(sets)]
    run_case(ctx, "rms_norm", dt, shape_td(T, D), graph, nbytes, setup)


def case_fused_add_rms_norm(ctx, dt, T, D, graph):
    td = torch_dtype(dt)
    nbytes = 4 * T * D * esize(dt) + D * esize(dt)

    def setup(sets):
        r, x, w = rotated(sets, (T, D), td), rotated(sets, (T, D), td), rotated(sets, (D,), td)

        def core(r, x, w):
            r.add_(x)
            return F.rms_norm(r, (D,), w, EPS)
        return core, [(r[s], x[s], w[s]) for s in range(sets)]
    run_case(ctx, "fused_add_rms_norm", dt, shape_td(T, D), graph, nbytes, setup,
             note="residual.add_(x); F.rms_norm(residual)")


def case_layer_norm(ctx, dt, T, D, graph):
    td = torch_dtype(dt)
    nbytes = 2 * T * D * esize(dt) + 2 * D * esize(dt)

    def setup(sets):
        x, g, b = rotated(sets, (T, D), td), rotated(sets, (D,), td), rotated(sets, (D,), td)

        def core(x, g, b):
            return F.layer_norm(x, (D,), g, b, EPS)
        return core, [(x[s], g[s], b[s]) for s in range(sets)]
    run_case(ctx, "layer_norm", dt, shape_td(T, D), graph, nbytes, setup)


def case_gelu(ctx, dt, T, D, graph):
    td = torch_dtype(dt)
    nbytes = 2 * T * D * esize(dt)

    def setup(sets):
        x = rotated(sets, (T * D,), td)

        def core(x):
            return F.gelu(x)  # erf
        return core, [(x[s],) for s in range(sets)]
    run_case(ctx, "gelu", dt, shape_td(T, D), graph, nbytes, setup, note="erf")


def case_add_inplace(ctx, dt, T, D, graph):
    td = torch_dtype(dt)
    nbytes = 3 * T * D * esize(dt)

    def setup(sets):
        r, x = rotated(sets, (T * D,), td), rotated(sets, (T * D,), td)

        def core(r, x):
            r.add_(x)
        return core, [(r[s], x[s]) for s in range(sets)]
    run_case(ctx, "add_inplace", dt, shape_td(T, D), graph, nbytes, setup)


def case_argmax(ctx, dt, rows, vocab, graph):
    td = torch_dtype(dt)
    nbytes = rows * vocab * esize(dt) + 4 * rows

    def setup(sets):
        x = rotated(sets, (rows, vocab), td)

        def core(x):
            return torch.argmax(x, dim=-1)
        return core, [(x[s],) for s in range(sets)]
    run_case(ctx, "argmax", dt, shape_td(rows, vocab), graph, nbytes, setup)


def case_add_bias(ctx, dt, rows, cols, graph):
    td = torch_dtype(dt)
    nbytes = 2 * rows * cols * esize(dt) + cols * esize(dt)

    def setup(sets):
        d, b = rotated(sets, (rows, cols), td), rotated(sets, (cols,), td)

        def core(d, b):
            d.add_(b)
        return core, [(d[s], b[s]) for s in range(sets)]
    run_case(ctx, "add_bias", dt, shape_td(rows, cols), graph, nbytes, setup)


def case_silu_mul(ctx, dt, T, im, graph):
    td = torch_dtype(dt)
    nbytes = 3 * T * im * esize(dt)

    def setup(sets):
        gu = rotated(sets, (T, 2 * im), td)

        def core(gu):
            return F.silu(gu[:, :im]) * gu[:, im:]
        return core, [(gu[s],) for s in range(sets)]
    run_case(ctx, "fused_silu_mul_split", dt, shape_td(T, im), graph, nbytes, setup,
             note="F.silu(gate) * up")


def case_split_qkv(ctx, dt, T, qd, kvd, graph):
    td = torch_dtype(dt)
    nbytes = 2 * T * (qd + 2 * kvd) * esize(dt)

    def setup(sets):
        qkv = rotated(sets, (T, qd + 2 * kvd), td)
        q, k, v = rotated(sets, (T, qd), td), rotated(sets, (T, kvd), td), rotated(sets, (T, kvd), td)

        def core(qkv, q, k, v):
            q.copy_(qkv[:, :qd])
            k.copy_(qkv[:, qd:qd + kvd])
            v.copy_(qkv[:, qd + kvd:])
        return core, [(qkv[s], q[s], k[s], v[s]) for s in range(sets)]
    run_case(ctx, "split_qkv", dt, f"T={T} q={qd} kv={kvd}", graph, nbytes, setup,
             note="3x copy_ of column slices")


def case_transpose(ctx, dt, H, T, dim, graph):
    td = torch_dtype(dt)
    nbytes = 2 * H * T * dim * esize(dt)

    def setup(sets):
        src, dst = rotated(sets, (H, T, dim), td), rotated(sets, (T, H, dim), td)

        def core(src, dst):
            dst.copy_(src.transpose(0, 1))
        return core, [(src[s], dst[s]) for s in range(sets)]
    run_case(ctx, "transpose_head_to_token", dt, f"[{H} x {T} x {dim}]", graph, nbytes, setup)


def case_embedding(ctx, dt, T, vocab, dim, graph):
    td = torch_dtype(dt)
    nbytes = 2 * T * dim * esize(dt) + 4 * T

    def setup(sets):
        table = rand((vocab, dim), td)
        tp = (T + 63) // 64 * 64  # 256-byte aligned rows, as the C++ side
        ids = torch.randint(0, vocab, (sets, tp), device="cuda", dtype=torch.int32)
        idl = [ids[s, :T] for s in range(sets)]

        def core(ids, table):
            return F.embedding(ids, table)
        return core, [(idl[s], table) for s in range(sets)]
    run_case(ctx, "embedding_lookup", dt, f"T={T} vocab={vocab} dim={dim}", graph, nbytes, setup,
             note="F.embedding, int32 ids")


def case_qk_norm_rope(ctx, dt, T, H, hd, graph):
    td = torch_dtype(dt)
    half = hd // 2
    nbytes = 2 * T * H * hd * esize(dt) + hd * esize(dt) + 2 * T * half * 4

    def setup(sets):
        max_pos = max(T, 4096)
        inv_freq = 1e6 ** (-torch.arange(0, half, device="cuda", dtype=torch.float64) * 2.0 / hd)
        ang = torch.arange(max_pos, device="cuda", dtype=torch.float64)[:, None] * inv_freq[None, :]
        cos_t, sin_t = ang.cos().float(), ang.sin().float()
        x, w = rotated(sets, (T, H * hd), td), rotated(sets, (hd,), td)
        span = max_pos - T + 1

        def core(x, w, c, s_):
            xh = F.rms_norm(x.view(T, H, hd), (hd,), w, EPS)
            x1, x2 = xh.float().chunk(2, dim=-1)
            c, s_ = c.unsqueeze(1), s_.unsqueeze(1)
            o = torch.cat((x1 * c - x2 * s_, x2 * c + x1 * s_), dim=-1).to(x.dtype)
            return o.transpose(0, 1).contiguous()  # head-major [H, T, hd]

        args = []
        for s in range(sets):
            pos = (s * 131) % span
            args.append((x[s], w[s], cos_t[pos:pos + T], sin_t[pos:pos + T]))
        return core, args
    run_case(ctx, "qk_norm_rope", dt, f"T={T} H={H} hd={hd}", graph, nbytes, setup,
             note="rms_norm per head + NeoX rope + head-major copy")


def case_kv_append(ctx, dt, T, nkv, hd, cap, graph):
    td = torch_dtype(dt)
    nbytes = 4 * nkv * T * hd * esize(dt)

    def setup(sets):
        nk, nv = rotated(sets, (nkv, T, hd), td), rotated(sets, (nkv, T, hd), td)
        pairs = sets if not graph else min(sets, 4)
        ck, cv = rotated(pairs, (nkv, cap, hd), td), rotated(pairs, (nkv, cap, hd), td)
        slots = cap // T

        def core(dk, dv, k, v):
            dk.copy_(k)
            dv.copy_(v)
        args = []
        for s in range(sets):
            p = s % pairs
            L = cap - T if not graph else ((s // pairs) % slots) * T
            args.append((ck[p][:, L:L + T], cv[p][:, L:L + T], nk[s], nv[s]))
        return core, args
    run_case(ctx, "kv_cache_append_head_major", dt, f"T={T} nkv={nkv} hd={hd} cap={cap}", graph,
             nbytes, setup, note="cache[:, L:L+T].copy_(new) for K and V")


def case_gemm(ctx, dt, m, n, k):
    td = torch_dtype(dt)
    nbytes = (m * k + n * k + m * n) * esize(dt)
    flops = 2.0 * m * n * k

    def setup(sets):
        a, w = rotated(sets, (m, k), td), rotated(sets, (n, k), td)

        def core(a, w):
            return torch.matmul(a, w.t())
        return core, [(a[s], w[s]) for s in range(sets)]
    run_case(ctx, "gemm", dt, shape_gemm(m, n, k), False, nbytes, setup, flops=flops,
             compile_ok=False, note="torch.matmul(a, w.t())")


SDPA_IMPLS = ["torch_flash", "torch_cudnn"]


def sdpa_cores(is_causal):
    """SDPA pinned to one backend each; GQA through enable_gqa (no K/V copy)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    pins = {"torch_flash": SDPBackend.FLASH_ATTENTION, "torch_cudnn": SDPBackend.CUDNN_ATTENTION}

    def make(backend):
        def core(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal,
                                                      enable_gqa=k.shape[1] != q.shape[1])
        return core
    return {name: make(b) for name, b in pins.items()}


def case_attention_decode(ctx, dt, B, L):
    td = torch_dtype(dt)
    nh, nkv, hd = 32, 8, 128
    graph = B == 1 and L <= 8192
    nbytes = 2 * B * nkv * L * hd * esize(dt)

    def setup(sets):
        q = rotated(sets, (B, nh, 1, hd), td)
        k, v = rotated(sets, (B, nkv, L, hd), td), rotated(sets, (B, nkv, L, hd), td)
        return sdpa_cores(False), [(q[s], k[s], v[s]) for s in range(sets)]
    run_case(ctx, "attention_decode", dt, f"B={B} L={L} h=32/8 hd=128", graph, nbytes, setup,
             impls=SDPA_IMPLS, note="SDPA q_len 1, enable_gqa")


def case_attention_prefill(ctx, dt, S, nkv):
    td = torch_dtype(dt)
    nh, hd = 32, 128
    nbytes = (2 * nh + 2 * nkv) * S * hd * esize(dt)
    flops = 4.0 * nh * S * S * hd / 2.0

    def setup(sets):
        q = rotated(sets, (1, nh, S, hd), td)
        k, v = rotated(sets, (1, nkv, S, hd), td), rotated(sets, (1, nkv, S, hd), td)
        return sdpa_cores(True), [(q[s], k[s], v[s]) for s in range(sets)]
    run_case(ctx, "attention_prefill", dt, f"S={S} h=32/{nkv} hd=128 causal", False, nbytes, setup,
             flops=flops, impls=SDPA_IMPLS, note="SDPA causal")


# ── main ────────────────────────────────────────────────────────────────────

def main():
    global torch, F
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write results here")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--filter", help="only cases whose 'op dtype shape mode' contains this (comma: any of)")
    ap.add_argument("--compile", choices=["all", "large", "none"], default="all",
                    help="which cases also run through torch.compile (default: all)")
    ap.add_argument("--reps", type=int, default=0, help="timed repetitions per case")
    ap.add_argument("--pause-ms", type=float, default=50.0,
                    help="idle before each case, the device synchronized first (default 50, as ferrum_bench)")
    ap.add_argument("--settle-gbps", type=float, default=50.0,
                    help="also idle the bytes the case before handed back / this rate (default 50 GB/s, "
                         "as ferrum_bench; 0: none)")
    args = ap.parse_args()
    if not (args.pause_ms >= 0 and (args.settle_gbps == 0 or args.settle_gbps >= 1)):
        ap.error("--pause-ms must not be negative, --settle-gbps must be 0 or at least 1")

    import torch as _torch
    import torch.nn.functional as _F
    torch, F = _torch, _F

    if not torch.cuda.is_available():
        print("no GPU: nothing to benchmark")
        return 0
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    try:  # one compiled function object per case, many shapes: lift the recompile limits
        import torch._dynamo
        for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                     "accumulated_recompile_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 4096)
    except Exception as e:  # noqa: BLE001
        print(f"note: could not configure torch._dynamo: {e}")

    ctx = Ctx(args)
    device = torch.cuda.get_device_name()
    measure_copy(ctx)
    print(f"device: {device}; torch {torch.__version__}")
    print(f"device-to-device copy (1 GiB, median of {COPY_REPS}): {ctx.copy_us:.1f} us, "
          f"{ctx.copy_gbps:.0f} GB/s (read + write)")
    print(f"rotation: sets = max(2, ceil(256 MiB / bytes_per_call)); graph mode: {GRAPH_OPS} ops per graph\n")
    print_header()

    for dt in ("f16", "bf16"):
        for T in (32768, 4096):
            case_rms_norm(ctx, dt, T, HIDDEN, False)
            case_fused_add_rms_norm(ctx, dt, T, HIDDEN, False)
        case_layer_norm(ctx, dt, 32768, HIDDEN, False)
        case_gelu(ctx, dt, 32768, HIDDEN, False)
        case_add_inplace(ctx, dt, 32768, HIDDEN, False)
        case_add_bias(ctx, dt, 32768, HIDDEN, False)
        case_silu_mul(ctx, dt, 8192, INTERMEDIATE, False)
        case_split_qkv(ctx, dt, 16384, 4096, 1024, False)
        case_transpose(ctx, dt, 32, 16384, 128, False)
        for T in (8192, 32768):  # as bench_ops.cpp: the earlier size and 4x
            case_embedding(ctx, dt, T, VOCAB, HIDDEN, False)
            case_qk_norm_rope(ctx, dt, T, 32, 128, False)
            case_kv_append(ctx, dt, T, 8, 128, 2 * T, False)

    for dt in ("f16", "bf16"):
        for T in (1, 2, 4, 8, 16):
            case_rms_norm(ctx, dt, T, HIDDEN, True)
            case_fused_add_rms_norm(ctx, dt, T, HIDDEN, True)
            case_add_inplace(ctx, dt, T, HIDDEN, True)
            case_gelu(ctx, dt, T, HIDDEN, True)
            case_silu_mul(ctx, dt, T, INTERMEDIATE, True)
            case_qk_norm_rope(ctx, dt, T, 32, 128, True)
            case_kv_append(ctx, dt, T, 8, 128, 16384, True)
            case_embedding(ctx, dt, T, VOCAB, HIDDEN, True)
            case_argmax(ctx, dt, T, VOCAB, True)

    for dt in ("f16", "bf16"):
        case_gemm(ctx, dt, 8192, 8192, 8192)
        for n in (8192, 28672):
            for m in (1, 16, 64):
                case_gemm(ctx, dt, m, n, 8192)

    for B in (1, 16, 64):
        for L in (1024, 4096, 8192, 32768, 131072):
            if L == 4096 and B != 1:
                continue
            case_attention_decode(ctx, "f16", B, L)
    for nkv in (32, 8):
        for S in (1024, 4096, 16384):
            case_attention_prefill(ctx, "f16", S, nkv)

    errors = sum(1 for r in ctx.records if r.get("error"))
    print(f"\n{len(ctx.records)} records, {errors} errors; copy {ctx.copy_gbps:.0f} GB/s")
    if args.json:
        out = {"tool": "torch_reference", "torch_version": torch.__version__, "device": device,
               "copy_gbps": ctx.copy_gbps, "copy_us": ctx.copy_us, "copy_bytes": COPY_BYTES,
               "quick": args.quick, "graph_ops": GRAPH_OPS, "compile": args.compile,
               "records": ctx.records}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
