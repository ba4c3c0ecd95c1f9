#!/usr/bin/env python3
"""When ferrum_bench_l2_residency's stages ran against their GEMMs, from a
CUPTI trace of it (bench/kernel_trace.cpp's CSV, plain or .gz).

Usage: l2_residency_trace.py trace.csv[.gz] --modes a,b,... --window W
(the probe's own --modes and --window; W >= 1).

The probe captures, per shape and window, a baseline graph of the window
alone (W > 0, when a mode measured against it runs), one of the flush and the
window (when a flush mode runs), and
per mode its graph, a serial mode's own baseline first. Graphs are taken in
the order their first kernels ran and labelled by that plan; the baselines
(no GEMM of their own) are skipped. A graph holds `sets` repetitions of
    [stage]  [flush]  W x rms_norm  gemm
and each replay's kernels share the graph launch's correlation id. Within a
replay, in start order, a skinny GEMM is the repetition's GEMM once a norm has
run since the previous one; in self mode, whose stage is also a skinny GEMM,
the stage is told by its stream where the trace's stream ids tell the branch
apart, else by its place in capture order (graph node ids: assumed, not
documented, to follow it). Per mode, over every replay and every repetition
but a replay's first, medians in µs from the end of the previous repetition's
GEMM (t0):
  stage start / end   when the stage kernel ran
  last norm end       when the window ended
  gemm start / dur    when the GEMM was scheduled (under PDL, before the last
                      norm ends) and its duration from there
  slack               max(gemm start, last norm end) minus stage end
                      (> 0: the stage was done when the GEMM could read)
"""
import argparse
import collections
import csv
import gzip
import statistics
import sys

from kernel_trace_summary import demangle, short

STAGED = {"fork", "hint", "lines", "load", "load4", "self", "loadS", "linesS", "selfS"}
SERIAL = {"loadS", "linesS", "selfS"}
FLUSH = {"coldF", "hotF"}


def role(name):
    if "gemm_skinny" in name:
        return "gemm"
    if "norm_rows" in name:
        return "norm"
    if "read_ceiling" in name:
        return "flush"
    return "stage"


def plan(modes, window):
    """(label, has_gemm) per graph of one shape, in capture order."""
    out = []
    if window > 0 and any(m not in FLUSH and m not in SERIAL for m in modes):
        out.append(("window", False))
    if any(m in FLUSH for m in modes):
        out.append(("flush+window", False))
    for m in modes:
        if m in SERIAL:
            out.append((m + " base", False))
        out.append((m, True))
    return out


def repetitions(kernels, mode, main_stream, by_stream):
    """A replay's kernels (start order) -> [(stage kernels, norms, gemm)]."""
    reps, stage, norms = [], [], []
    for k in kernels:
        r = role(k["name"])
        if r == "norm":
            norms.append(k)
        elif r == "flush":
            continue
        elif r == "gemm" and norms and not (mode == "self" and by_stream and k["stream"] != main_stream):
            reps.append((stage, norms, k))
            stage, norms = [], []
        else:
            stage.append(k)
    return reps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--modes", required=True)
    ap.add_argument("--window", type=int, required=True)
    args = ap.parse_args()
    if args.window < 1:
        raise SystemExit("--window must be >= 1: a repetition's GEMM is found after its norms")
    modes = [m for m in args.modes.split(",") if m]
    opener = gzip.open if args.csv.endswith(".gz") else open
    with opener(args.csv, "rt") as f:
        rows = [r for r in csv.DictReader(f) if int(r["graph_id"]) != 0]
    unique = sorted({r["name"] for r in rows})
    readable = dict(zip(unique, (short(n) for n in demangle(unique))))
    graphs = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in rows:
        graphs[int(r["graph_id"])][int(r["correlation_id"])].append(
            {"start": int(r["start_ns"]), "end": int(r["end_ns"]), "node": int(r["graph_node_id"]),
             "stream": int(r.get("stream_id") or 0), "name": readable[r["name"]]})
    order = sorted(graphs, key=lambda g: min(k["start"] for rep in graphs[g].values() for k in rep))
    per_shape = plan(modes, args.window)
    if len(order) % len(per_shape):
        print(f"warning: {len(order)} graphs is not a multiple of the plan's {len(per_shape)} per shape "
              "(another --modes / --window than the probe's?); labels may be off", file=sys.stderr)
    print(f"{'mode':>6} {'kind':>6} {'stage':<22} {'reps':>5} {'st start':>9} {'st end':>8} {'norm end':>9} "
          f"{'gemm start':>10} {'gemm dur':>9} {'slack':>7}")
    printed = 0
    for i, gid in enumerate(order):
        label, has_gemm = per_shape[i % len(per_shape)]
        if not has_gemm:
            continue
        replays = graphs[gid]
        norm_streams = collections.Counter(k["stream"] for rep in replays.values() for k in rep
                                           if role(k["name"]) == "norm")
        main_stream = norm_streams.most_common(1)[0][0] if norm_streams else 0
        by_stream = len({k["stream"] for rep in replays.values() for k in rep}) > 1
        stats = collections.defaultdict(list)
        counts = set()
        stage_name = "-"
        for rep in replays.values():
            kernels = sorted(rep, key=lambda k: (k["start"], k["node"]))
            if label == "self" and not by_stream:
                kernels = sorted(rep, key=lambda k: k["node"])  # capture order (see the docstring)
            reps = repetitions(kernels, label, main_stream, by_stream)
            counts.add(len(reps))
            for j in range(1, len(reps)):
                t0 = reps[j - 1][2]["end"]
                stage, norms, gemm = reps[j]
                stats["gemm_start"].append((gemm["start"] - t0) / 1e3)
                stats["gemm_dur"].append((gemm["end"] - gemm["start"]) / 1e3)
                norm_end = max(k["end"] for k in norms)
                stats["norm_end"].append((norm_end - t0) / 1e3)
                if stage:
                    s_end = max(k["end"] for k in stage)
                    stats["stage_start"].append((min(k["start"] for k in stage) - t0) / 1e3)
                    stats["stage_end"].append((s_end - t0) / 1e3)
                    stats["slack"].append((max(gemm["start"], norm_end) - s_end) / 1e3)
                    stage_name = stage[0]["name"].replace("bench::", "")
        if len(counts) > 1:
            print(f"warning: {label}: replays hold {sorted(counts)} repetitions", file=sys.stderr)
        if label in STAGED and not stats["slack"]:
            print(f"warning: {label}: no stage kernel found", file=sys.stderr)
        kind = "serial" if label in SERIAL else ("branch" if label in STAGED else "-")
        med = {k: statistics.median(v) for k, v in stats.items() if v}
        fmt = lambda k: f"{med[k]:.2f}" if k in med else "-"
        print(f"{label:>6} {kind:>6} {stage_name[:22]:<22} {max(counts, default=0):>5} {fmt('stage_start'):>9} "
              f"{fmt('stage_end'):>8} {fmt('norm_end'):>9} {fmt('gemm_start'):>10} {fmt('gemm_dur'):>9} "
              f"{fmt('slack'):>7}")
        printed += 1
    if not printed:
        raise SystemExit("no graph with a GEMM in the trace")


if __name__ == "__main__":
    main()
