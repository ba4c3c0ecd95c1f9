#!/usr/bin/env python3
"""Side-by-side table of ferrum_bench and bench/torch_reference.py results.

Usage:
  python3 bench/compare.py ferrum.json torch.json [--markdown-out FILE] [--strict]

Rows pair on (op, dtype, shape, mode). Columns: ferrum median us, ferrum GB/s
(TFLOP/s for gemm), ferrum % of its own run's device copy bandwidth, torch
eager us, torch compiled us, and speedup = (faster torch us) / (ferrum us),
so > 1 means ferrum is faster.

Acceptance bars (a row that misses one is flagged with "MISS"):
  * norms (rms_norm, fused_add_rms_norm, layer_norm), large shapes: >= 90% of copy
  * other elementwise ops, large shapes: >= 80% of copy
  * tiny shapes (graph replay): <= 4 us per op
  * gemm: no more than 3% slower than torch.matmul (eager)
  * attention (torch columns: SDPA flash / cuDNN backends): never slower than
    the faster one; decode >= 85% of copy at B=1 L>=32k and B=16 L>=8k, and
    <= 10 us at B=1 L<=4k; causal prefill >= 330 TFLOP/s at S=16k
--strict exits 1 when any bar is missed or a ferrum case errored.
"""

import argparse
import json
import sys

NORM_OPS = {"rms_norm", "fused_add_rms_norm", "layer_norm"}
NORM_PCT = 90.0
ELEMWISE_PCT = 80.0
SMALL_US = 4.0
GEMM_SLACK = 1.03
DECODE_PCT = 85.0        # decode attention at B=1 L>=32k and B=16 L>=8k, % of copy
DECODE_SMALL_US = 10.0   # decode attention at B=1, L<=4k, graph replay
PREFILL_TFLOPS = 330.0   # causal prefill at S=16k


def load(path):
    with open(path) as f:
        return json.load(f)


def key(r):
    return (r.get("op"), r.get("dtype"), r.get("shape"), r.get("mode"))


def num(v, f):
    return "-" if v is None else format(v, f)


def ok_us(r):
    return r is not None and not r.get("error") and r.get("us") is not None


def shape_fields(shape):
    """'B=1 L=1024 h=32/8 hd=128' -> {'B': '1', 'L': '1024', ...}"""
    return dict(part.split("=", 1) for part in shape.split() if "=" in part)


def judge(fr, eager, comp=None):
    """(misses, infos) for one ferrum record."""
    misses, infos = [], []
    if fr.get("error"):
        return [f"ERROR: {short(fr['error'])}"], infos
    op, mode, pct, us = fr.get("op"), fr.get("mode"), fr.get("pct_of_copy"), fr.get("us")
    if op in ("attention_decode", "attention_prefill"):
        best = min((r["us"] for r in (eager, comp) if ok_us(r)), default=None)
        if best is None:
            infos.append("no torch SDPA to compare")
        elif us > best:
            misses.append(f"{100.0 * (us / best - 1.0):.1f}% slower than the faster torch backend")
        f = shape_fields(fr.get("shape", ""))
        if op == "attention_decode":
            b, l = int(f.get("B", 0)), int(f.get("L", 0))
            if ((b == 1 and l >= 32768) or (b == 16 and l >= 8192)) and pct is not None and pct < DECODE_PCT:
                misses.append(f"< {DECODE_PCT:g}% of copy")
            if b == 1 and l <= 4096 and us > DECODE_SMALL_US:
                misses.append(f"> {DECODE_SMALL_US:g} us")
        elif int(f.get("S", 0)) >= 16384 and (fr.get("tflops") or 0.0) < PREFILL_TFLOPS:
            misses.append(f"< {PREFILL_TFLOPS:g} TFLOP/s")
        return misses, infos
    if op == "gemm":
        if ok_us(eager):
            if us > GEMM_SLACK * eager["us"]:
                misses.append(f"gemm {100.0 * (us / eager['us'] - 1.0):.1f}% slower than torch")
        else:
            infos.append("no torch gemm to compare")
    elif mode == "graph":
        if us is not None and us > SMALL_US:
            misses.append(f"> {SMALL_US:g} us")
    elif pct is not None:
        bar = NORM_PCT if op in NORM_OPS else ELEMWISE_PCT
        if pct < bar:
            misses.append(f"< {bar:g}% of copy")
    note = fr.get("note") or ""
    if "backend graph API" in note:
        infos.append("L2-warm (backend graph API)")
    if "raw capture failed" in note:
        infos.append("raw capture failed")
    return misses, infos


def short(s, n=80):
    s = " ".join(str(s).split())
    return s if len(s) <= n else s[: n - 3] + "..."


def cell(s):
    return str(s).replace("|", "\\|")


def torch_cell(r):
    if r is None:
        return "-"
    if r.get("error"):
        return "error"
    return num(r.get("us"), ".2f")


def build(ferrum, torch_doc):
    trecs = {}
    for r in (torch_doc or {}).get("records", []):
        trecs[key(r) + (r.get("impl"),)] = r

    lines = []
    lines.append("# ferrum vs torch")
    lines.append("")
    dev_f = ferrum.get("device", "?")
    dev_t = (torch_doc or {}).get("device", "-")
    lines.append(f"- device: ferrum run on **{dev_f}**, torch run on **{dev_t}**"
                 + (f" (torch {torch_doc.get('torch_version')})" if torch_doc else ""))
    lines.append(f"- device-to-device copy (1 GiB, read + write): ferrum run "
                 f"{num(ferrum.get('copy_gbps'), '.0f')} GB/s, torch run "
                 f"{num((torch_doc or {}).get('copy_gbps'), '.0f')} GB/s")
    lines.append("- us = median per call; graph mode = per op inside a 100-op CUDA graph; "
                 "speedup = faster torch / ferrum (> 1: ferrum faster)")
    lines.append("")
    header = ["op", "dtype", "shape", "mode", "ferrum us", "ferrum GB/s (TFLOP/s)", "% of copy",
              "torch eager us", "torch compiled us", "speedup", "flags"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join(["---"] * 4 + ["---:"] * 6 + ["---"]) + "|")

    n_miss = n_err = 0
    seen = set()
    for fr in ferrum.get("records", []):
        k = key(fr)
        seen.add(k)
        eager = trecs.get(k + ("torch_eager",))
        comp = trecs.get(k + ("torch_compile",))
        # SDPA rows: flash backend in the first torch column, cuDNN in the second.
        if eager is None and comp is None:
            eager = trecs.get(k + ("torch_flash",))
            comp = trecs.get(k + ("torch_cudnn",))
        misses, infos = judge(fr, eager, comp)
        if fr.get("error"):
            n_err += 1
        elif misses:
            n_miss += 1
        if fr.get("op") == "attention_prefill":
            rate = f"{num(fr.get('tflops'), '.1f')} TFLOP/s"
        elif fr.get("op") == "gemm":
            rate = f"{num(fr.get('tflops'), '.1f')} TFLOP/s"
            if fr.get("gbps") is not None and fr.get("mode") == "stream" and (fr.get("shape", "").startswith(
                    ("m=1 ", "m=16 ", "m=64 "))):
                rate += f" ({num(fr.get('gbps'), '.0f')} GB/s)"
        else:
            rate = num(fr.get("gbps"), ".0f")
        best = min((r["us"] for r in (eager, comp) if ok_us(r)), default=None)
        speed = "-"
        if best is not None and ok_us(fr) and fr["us"] > 0:
            speed = f"{best / fr['us']:.2f}x"
        flags = ["**MISS** " + m for m in misses if not m.startswith("ERROR")]
        flags += ["**" + m + "**" for m in misses if m.startswith("ERROR")]
        flags += infos
        row = [fr.get("op"), fr.get("dtype"), fr.get("shape"), fr.get("mode"),
               num(fr.get("us"), ".2f") if not fr.get("error") else "error", rate,
               num(fr.get("pct_of_copy"), ".1f"), torch_cell(eager), torch_cell(comp), speed,
               "; ".join(flags)]
        lines.append("| " + " | ".join(cell(c) for c in row) + " |")

    extra = sorted({key(r) for r in (torch_doc or {}).get("records", [])} - seen, key=str)
    lines.append("")
    lines.append(f"**{n_miss} rows miss an acceptance bar; {n_err} ferrum cases errored** "
                 f"(bars: norms >= {NORM_PCT:g}% of copy, other large elementwise >= {ELEMWISE_PCT:g}% "
                 f"of copy, tiny shapes <= {SMALL_US:g} us, gemm <= {100 * (GEMM_SLACK - 1):.0f}% slower "
                 f"than torch).")
    if extra:
        lines.append("")
        lines.append(f"torch rows with no ferrum counterpart: {len(extra)} "
                     f"({', '.join(' '.join(map(str, e)) for e in extra[:8])}{' ...' if len(extra) > 8 else ''})")
    terrs = [r for r in (torch_doc or {}).get("records", []) if r.get("error")]
    if terrs:
        lines.append("")
        lines.append(f"torch errors ({len(terrs)}):")
        for r in terrs[:20]:
            lines.append(f"- {r.get('op')} {r.get('dtype')} {r.get('shape')} {r.get('mode')} "
                         f"{r.get('impl')}: {cell(short(r.get('error'), 160))}")
    return "\n".join(lines) + "\n", n_miss, n_err


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ferrum_json")
    ap.add_argument("torch_json", nargs="?", help="torch_reference.py output (optional)")
    ap.add_argument("--markdown-out", help="also write the table to this file")
    ap.add_argument("--strict", action="store_true", help="exit 1 if any bar is missed or a case errored")
    args = ap.parse_args()

    ferrum = load(args.ferrum_json)
    torch_doc = load(args.torch_json) if args.torch_json else None
    text, n_miss, n_err = build(ferrum, torch_doc)
    sys.stdout.write(text)
    if args.markdown_out:
        with open(args.markdown_out, "w") as f:
            f.write(text)
    return 1 if args.strict and (n_miss or n_err) else 0


if __name__ == "__main__":
    sys.exit(main())
