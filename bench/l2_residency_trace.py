#!/usr/bin/env python3
"""When ferrum_bench_l2_residency's stages ran against their GEMMs, from a
CUPTI trace of it (bench/kernel_trace.cpp's CSV).

Each graph the probe captures holds `sets` repetitions of
    [stage]  [flush]  W x rms_norm  gemm
and is replayed several times. Graph nodes are numbered in capture order, so a
node's role follows from its place: a repetition ends at a skinny GEMM that
comes right after a norm (the probe must run with --window >= 1), and the
kernels before its first norm, other than the flush, are its stage (a
prefetch kernel, an empty kernel, or, in self mode, a skinny GEMM). Per graph,
over every replay and every repetition but the first of a replay, the medians
in µs from the end of the previous repetition's GEMM (t0):
  stage start / end   when the stage kernel ran
  gemm start / dur    when the GEMM started, and its own duration
  slack               GEMM start minus stage end (> 0: the stage was done)
"serial" when the window's first norm starts after the stage ends (the stage
was on the main stream), "branch" otherwise.
Usage: l2_residency_trace.py trace.csv
"""
import argparse
import collections
import csv
import statistics

from kernel_trace_summary import demangle, short


def role(name):
    if "gemm_skinny" in name:
        return "gemm"
    if "norm_rows" in name:
        return "norm"
    if "read_ceiling" in name:
        return "flush"
    return "stage"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    args = ap.parse_args()
    rows = [r for r in csv.DictReader(open(args.csv)) if int(r["graph_id"]) != 0]
    unique = sorted({r["name"] for r in rows})
    readable = dict(zip(unique, (short(n) for n in demangle(unique))))
    graphs = collections.OrderedDict()
    for r in sorted(rows, key=lambda r: int(r["start_ns"])):
        g = graphs.setdefault(int(r["graph_id"]), collections.defaultdict(list))
        g[int(r["graph_node_id"])].append((int(r["start_ns"]), int(r["end_ns"]), readable[r["name"]]))
    print(f"{'graph':>6} {'kind':>6} {'stage':<24} {'reps':>5} {'st start':>9} {'st end':>8} "
          f"{'gemm start':>10} {'gemm dur':>9} {'slack':>7}")
    for gid, nodes in graphs.items():
        order = sorted(nodes)
        roles = [role(nodes[n][0][2]) for n in order]
        # Repetitions in capture order: (stage nodes, first norm node, gemm node).
        reps, current = [], []
        for i, n in enumerate(order):
            if roles[i] == "gemm" and i > 0 and roles[i - 1] == "norm":
                stage_nodes = []
                for m in current:
                    if role(nodes[m][0][2]) == "norm":
                        break
                    if role(nodes[m][0][2]) != "flush":
                        stage_nodes.append(m)
                first_norm = next((m for m in current if role(nodes[m][0][2]) == "norm"), None)
                reps.append((stage_nodes, first_norm, n))
                current = []
            else:
                current.append(n)
        if len(reps) < 2:
            continue  # a baseline graph (no GEMM) or too short
        replays = min(len(nodes[n]) for n in order)
        stats = collections.defaultdict(list)
        serial_votes = 0
        for r in range(replays):
            for i in range(1, len(reps)):
                t0 = nodes[reps[i - 1][2]][r][1]
                stage_nodes, first_norm, gemm = reps[i]
                g_start, g_end, _ = nodes[gemm][r]
                stats["gemm_start"].append((g_start - t0) / 1e3)
                stats["gemm_dur"].append((g_end - g_start) / 1e3)
                if stage_nodes:
                    s_start = min(nodes[m][r][0] for m in stage_nodes)
                    s_end = max(nodes[m][r][1] for m in stage_nodes)
                    stats["stage_start"].append((s_start - t0) / 1e3)
                    stats["stage_end"].append((s_end - t0) / 1e3)
                    stats["slack"].append((g_start - s_end) / 1e3)
                    if first_norm is not None and nodes[first_norm][r][0] >= s_end:
                        serial_votes += 1
        med = {k: statistics.median(v) for k, v in stats.items()}
        stage_name = nodes[reps[1][0][0]][0][2].replace("bench::", "") if reps[1][0] else "-"
        kind = "-" if not reps[1][0] else ("serial" if serial_votes * 2 > len(stats["slack"]) else "branch")
        fmt = lambda k: f"{med[k]:.2f}" if k in med else "-"
        print(f"{gid:>6} {kind:>6} {stage_name[:24]:<24} {len(reps):>5} {fmt('stage_start'):>9} {fmt('stage_end'):>8} "
              f"{fmt('gemm_start'):>10} {fmt('gemm_dur'):>9} {fmt('slack'):>7}")


if __name__ == "__main__":
    main()
