#!/usr/bin/env python3
"""flash_attention against torch SDPA at large shapes, both against float64.

For each case (random q / k / v from torch.randn with a fixed seed per case,
f16 or bf16, on the GPU) this runs:
  ours(auto)      ferrum flash_attention, PrefillKernel::Auto (the wgmma
                  kernel where it applies);
  ours(mma_sync)  the same with PrefillKernel::MmaSync (prefill only: decode,
                  q_len == 1, runs one kernel either way);
  torch SDPA      F.scaled_dot_product_attention in the same dtype, torch's
                  default backend choice (enable_gqa=True for GQA; is_causal
                  for full causal prefill, an explicit boolean attn_mask for a
                  causal chunk at pos_offset > 0, no mask where every query
                  sees every key: decode and non-causal);
and compares each with a float64 reference computed in torch on the GPU
(softmax(q k^T / sqrt(head_dim), masked) v, per batch, kv-head chunk and
query block to bound memory). GQA: q head h reads kv head h // (heads /
kv_heads). The causal mask is bottom-right aligned: query i sits at position
pos_offset + i and sees keys j <= pos_offset + i, j < kv_len.

Rows of k / v past kv_len (kv_seq_stride > kv_len) hold NaN, as in the GPU
tests: a kernel that lets them into its output fails. Our outputs start as
NaN, so a row the kernel never writes fails too.

PASS when, for each of ours,
    max abs error <= 4 * (torch SDPA's max abs error) + eps * max |ref|,
eps = 2^-10 for f16, 2^-7 for bf16 (errors against the float64 reference).
torch SDPA in the same dtype is the yardstick, not a tolerance we tune: the
eps term only keeps a near-exact torch result from demanding more than the
dtype's rounding of the output.

usage: sdpa_check.py --capi build/bench/libferrum_bench_capi.so [--json FILE] [--only SUBSTR]
"""
import argparse
import ctypes
import json
import math
import sys
import time

# Reference chunk: score elements (float64) per block; ~1 GiB, so a block's
# scores, softmax and mask fit in a few GB.
REF_BLOCK_ELEMS = 2**27
SDPA_FACTOR = 4.0
EPS = {"f16": 2.0**-10, "bf16": 2.0**-7}
DTYPE_CODE = {"f16": 0, "bf16": 1}


def make_cases():
    """One dict per case: batch, q_len, kv_len, pos_offset, heads, kv_heads, head_dim, kv_seq_stride, causal, dtype."""
    cases = []

    def add(name, batch, q_len, kv_len, pos_offset, heads, kv_heads, head_dim, stride, causal, dtype):
        cases.append({"name": name, "batch": batch, "q_len": q_len, "kv_len": kv_len, "pos_offset": pos_offset,
                      "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "kv_seq_stride": stride,
                      "causal": causal, "dtype": dtype, "seed": 1000 + len(cases)})

    for s in (4096, 16384):
        for kvh in (32, 8):
            for dt in ("f16", "bf16"):
                add(f"prefill S={s} h32/{kvh} d128 causal {dt}", 1, s, s, 0, 32, kvh, 128, s, True, dt)
    add("prefill S=4096 h32/8 d64 causal f16", 1, 4096, 4096, 0, 32, 8, 64, 4096, True, "f16")
    add("chunk q=1000 pos=3000 kv=4000 stride=4100 h32/8 d128 causal f16", 1, 1000, 4000, 3000, 32, 8, 128, 4100,
        True, "f16")
    add("prefill S=2048 h32/32 d128 non-causal f16", 1, 2048, 2048, 0, 32, 32, 128, 2048, False, "f16")
    add("decode B=16 L=8192 h32/8 d128 f16", 16, 1, 8192, 8191, 32, 8, 128, 8192, True, "f16")
    add("decode B=1 L=131072 h32/8 d128 f16", 1, 1, 131072, 131071, 32, 8, 128, 131072, True, "f16")
    return cases


def reference(torch, q, k, v, kv_len, pos_offset, causal):
    """float64 attention: q [B, H, Sq, D], k / v [B, KH, stride, D] (rows < kv_len used) -> [B, H, Sq, D]."""
    batch, heads, q_len, head_dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    scale = 1.0 / math.sqrt(head_dim)
    ref = torch.empty(batch, heads, q_len, head_dim, dtype=torch.float64, device=q.device)
    q_block = max(1, min(q_len, REF_BLOCK_ELEMS // (group * kv_len)))
    kh_block = max(1, min(kv_heads, REF_BLOCK_ELEMS // (group * q_block * kv_len)))
    for b in range(batch):
        k64 = k[b, :, :kv_len].double()  # [KH, kv_len, D]
        v64 = v[b, :, :kv_len].double()
        qg = q[b].view(kv_heads, group, q_len, head_dim)  # q head h = g * group + r reads kv head g
        rg = ref[b].view(kv_heads, group, q_len, head_dim)
        for i0 in range(0, q_len, q_block):
            i1 = min(q_len, i0 + q_block)
            n = i1 - i0
            # Keys past the block's last query position are masked for every
            # query of the block: leave them out.
            hi = min(kv_len, pos_offset + i1) if causal else kv_len
            visible = None
            if causal:
                qpos = torch.arange(pos_offset + i0, pos_offset + i1, device=q.device)
                kpos = torch.arange(hi, device=q.device)
                visible = kpos[None, :] <= qpos[:, None]  # [n, hi]
            for g0 in range(0, kv_heads, kh_block):
                g1 = min(kv_heads, g0 + kh_block)
                gc = g1 - g0
                qd = qg[g0:g1, :, i0:i1].double().reshape(gc, group * n, head_dim)
                s = torch.bmm(qd, k64[g0:g1, :hi].transpose(1, 2)).mul_(scale)  # [gc, group * n, hi]
                if visible is not None:
                    s.view(gc, group, n, hi).masked_fill_(~visible, float("-inf"))
                p = torch.softmax(s, dim=-1)
                del s
                o = torch.bmm(p, v64[g0:g1, :hi])  # [gc, group * n, D]
                del p
                rg[g0:g1, :, i0:i1] = o.view(gc, group, n, head_dim)
                del o
        del k64, v64
    return ref


def errors(torch, out, ref):
    d = (out.double() - ref).abs_()
    max_err = d.max().item()  # NaN anywhere makes this NaN
    mean_err = d.mean().item()
    del d
    return max_err, mean_err


def run_case(torch, F, lib, stream, err, case):
    td = {"f16": torch.float16, "bf16": torch.bfloat16}[case["dtype"]]
    B, Sq, L, pos = case["batch"], case["q_len"], case["kv_len"], case["pos_offset"]
    H, KH, D, stride = case["heads"], case["kv_heads"], case["head_dim"], case["kv_seq_stride"]
    causal = case["causal"]
    gen = torch.Generator(device="cuda")
    gen.manual_seed(case["seed"])
    q = torch.randn(B, H, Sq, D, dtype=td, device="cuda", generator=gen)
    k = torch.randn(B, KH, stride, D, dtype=td, device="cuda", generator=gen)
    v = torch.randn(B, KH, stride, D, dtype=td, device="cuda", generator=gen)
    if stride > L:  # cache rows past kv_len: must not reach the output
        k[:, :, L:] = float("nan")
        v[:, :, L:] = float("nan")

    kernels = (("auto", 0), ("mma_sync", 1)) if Sq > 1 else (("auto", 0),)
    ours = {}
    failures = []
    for label, code in kernels:
        out = torch.full((B, H, Sq, D), float("nan"), dtype=td, device="cuda")
        rc = lib.ferrum_bench_flash_attention(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), B, Sq, L, pos,
                                              H, KH, D, stride, 1 if causal else 0, DTYPE_CODE[case["dtype"]], code,
                                              err, len(err))
        if rc != 0:
            failures.append(f"ours({label}): {err.value.decode()}")
            del out
            continue
        ours[label] = out
    torch.cuda.synchronize()

    ks, vs = k[:, :, :L], v[:, :, :L]
    sdpa_kwargs = {"enable_gqa": True} if H != KH else {}
    if not causal or pos >= L - 1:  # every query sees every key
        mask_kind = "none"
        ts = F.scaled_dot_product_attention(q, ks, vs, **sdpa_kwargs)
    elif pos == 0 and Sq == L:
        mask_kind = "is_causal"
        ts = F.scaled_dot_product_attention(q, ks, vs, is_causal=True, **sdpa_kwargs)
    else:
        mask_kind = "bool"
        qpos = torch.arange(pos, pos + Sq, device="cuda")
        kpos = torch.arange(L, device="cuda")
        mask = kpos[None, :] <= qpos[:, None]  # [Sq, L], True: attends
        ts = F.scaled_dot_product_attention(q, ks, vs, attn_mask=mask, **sdpa_kwargs)
        del mask
    torch.cuda.synchronize()

    ref = reference(torch, q, k, v, L, pos, causal)
    ref_max = ref.abs().max().item()
    sdpa_err, sdpa_mean = errors(torch, ts, ref)
    del ts
    bound = SDPA_FACTOR * sdpa_err + EPS[case["dtype"]] * ref_max
    rec = dict(case)
    rec.update({"sdpa_mask": mask_kind, "ref_max_abs": ref_max, "sdpa_max_abs_err": sdpa_err,
                "sdpa_rel_err": sdpa_err / ref_max, "sdpa_mean_abs_err": sdpa_mean, "bound": bound})
    for label, out in ours.items():
        e, m = errors(torch, out, ref)
        rec[f"{label}_max_abs_err"] = e
        rec[f"{label}_rel_err"] = e / ref_max
        rec[f"{label}_mean_abs_err"] = m
        if not (math.isfinite(e) and e <= bound):
            failures.append(f"ours({label}) max abs error {e:.3e} > bound {bound:.3e}")
    if not math.isfinite(sdpa_err):
        failures.append(f"torch SDPA max abs error {sdpa_err}")
    rec["failures"] = failures
    rec["pass"] = not failures
    del q, k, v, ks, vs, ref, ours
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capi", required=True, help="path to libferrum_bench_capi.so")
    ap.add_argument("--json", help="write results here")
    ap.add_argument("--only", help="run only the cases whose name contains this")
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F
    if not torch.cuda.is_available():
        print("no GPU: nothing to check")
        return 0
    lib = ctypes.CDLL(args.capi)
    lib.ferrum_bench_stream.restype = ctypes.c_void_p
    lib.ferrum_bench_flash_attention.restype = ctypes.c_int
    lib.ferrum_bench_flash_attention.argtypes = ([ctypes.c_void_p] * 4 + [ctypes.c_longlong] * 8 +
                                                 [ctypes.c_int] * 3 + [ctypes.c_char_p, ctypes.c_int])
    stream = torch.cuda.ExternalStream(lib.ferrum_bench_stream())
    err = ctypes.create_string_buffer(1024)

    cases = [c for c in make_cases() if not args.only or args.only in c["name"]]
    records = []
    failed = 0
    t_start = time.time()
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}; errors: max abs (/ max|ref|) "
          f"against float64; bound = {SDPA_FACTOR:g} x sdpa + eps x max|ref|")
    with torch.cuda.stream(stream):
        for case in cases:
            t0 = time.time()
            rec = run_case(torch, F, lib, stream, err, case)
            rec["seconds"] = time.time() - t0
            records.append(rec)
            failed += 0 if rec["pass"] else 1
            parts = []
            for label in ("auto", "mma_sync", "sdpa"):
                if f"{label}_max_abs_err" in rec:
                    parts.append(f"{label} {rec[f'{label}_max_abs_err']:.3e} ({rec[f'{label}_rel_err']:.2e})")
            print(f"{'PASS' if rec['pass'] else 'FAIL'} {case['name']:62} max|ref| {rec['ref_max_abs']:.3f}  "
                  f"{'  '.join(parts)}  bound {rec['bound']:.3e}  [{rec['sdpa_mask']}] {rec['seconds']:.1f} s",
                  flush=True)
            for f in rec["failures"]:
                print(f"     {f}")
            torch.cuda.empty_cache()
    elapsed = time.time() - t_start
    print(f"elapsed {elapsed:.1f} s")
    print(f"sdpa_check: {len(records)} cases, {failed} failed")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tool": "sdpa_check", "torch_version": torch.__version__,
                       "device": torch.cuda.get_device_name(), "sdpa_factor": SDPA_FACTOR, "eps": EPS,
                       "elapsed_s": elapsed, "records": records}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
