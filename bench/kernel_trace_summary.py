#!/usr/bin/env python3
"""Where a decode step's time goes, from bench/kernel_trace.cpp's CSV.

Steps are cut at the step's last kernel (--step-end, default the argmax
kernel). Over the last --steps complete steps, each kernel (by name and
grid) gets:
  dur       its own start-to-end time on the GPU (overlaps included),
  marginal  how far it pushed the end of the step's timeline past every
            kernel before it, idle time before it included (the marginals
            sum to the step's span; a guide to what speeding the kernel up
            can win, not a bound),
  gap       start minus the previous kernel's end (negative: PDL overlap;
            the first kernel of a step shows 0: the time between steps is
            the period minus the span).
Usage: kernel_trace_summary.py trace.csv [--steps N] [--step-end argmax]
"""
import argparse
import csv
import collections
import re
import shutil
import statistics
import subprocess


def demangle(names):
    """CUPTI gives C++ kernel names mangled."""
    if not shutil.which("c++filt"):
        return names
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout
    lines = out.split("\n")
    return lines[:len(names)] if len(lines) >= len(names) else names


def short(name):
    name = name.replace("(anonymous namespace)::", "").replace("ferrum::", "").replace("kernels::", "")
    name = re.sub(r"<.*", "", name)  # the template arguments (the grid tells launches apart)
    name = re.sub(r"\(.*", "", name)  # the parameter list
    return re.sub(r"^void ", "", name)[:60]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--step-end", default="argmax")
    args = ap.parse_args()
    rows = list(csv.DictReader(open(args.csv)))
    unique = sorted({r["name"] for r in rows})
    readable = dict(zip(unique, (short(n) for n in demangle(unique))))
    ks = sorted((int(r["start_ns"]), int(r["end_ns"]), readable[r["name"]], r["grid"], int(r["graph_id"]))
                for r in rows)
    ends = [i for i, k in enumerate(ks) if args.step_end in k[2]]
    if len(ends) < 2:
        raise SystemExit(f"fewer than two '{args.step_end}' kernels: no complete step")
    first = max(0, len(ends) - 1 - args.steps)
    steps = [ks[ends[i] + 1:ends[i + 1] + 1] for i in range(first, len(ends) - 1)]
    agg = collections.OrderedDict()
    spans, periods = [], []
    for s_i, step in enumerate(steps):
        horizon = step[0][0]
        prev_end = step[0][0]
        for start, end, name, grid, _ in step:
            key = (name, grid)
            a = agg.setdefault(key, {"n": 0, "dur": 0.0, "marg": 0.0, "gap": 0.0})
            a["n"] += 1
            a["dur"] += end - start
            a["marg"] += max(0, end - max(horizon, start)) + max(0, start - horizon)
            a["gap"] += start - prev_end
            horizon = max(horizon, end)
            prev_end = end
        spans.append(horizon - step[0][0])
    for i in range(first + 1, len(ends)):
        periods.append(ks[ends[i]][1] - ks[ends[i - 1]][1])
    nsteps = len(steps)
    print(f"{nsteps} steps, {len(steps[-1])} kernels per step, graph ids {sorted({k[4] for k in steps[-1]})}")
    print(f"step span (first start to last end) median {statistics.median(spans) / 1e3:.1f} us;"
          f" step period (argmax end to argmax end) median {statistics.median(periods[-nsteps:]) / 1e3:.1f} us")
    print(f"{'marginal us/step':>16} {'/step':>6} {'dur us':>8} {'marg us':>8} {'gap us':>7}  kernel grid")
    total = 0.0
    for (name, grid), a in sorted(agg.items(), key=lambda kv: -kv[1]["marg"]):
        n = a["n"]
        per_step = a["marg"] / nsteps / 1e3
        total += per_step
        print(f"{per_step:16.1f} {n / nsteps:6.1f} {a['dur'] / n / 1e3:8.2f} {a['marg'] / n / 1e3:8.2f}"
              f" {a['gap'] / n / 1e3:7.2f}  {name} {grid}")
    print(f"{total:16.1f} total marginal per step (the mean span; the line above gives the median)")


if __name__ == "__main__":
    main()
