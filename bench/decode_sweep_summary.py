#!/usr/bin/env python3
"""Summarizes gpu_suite.sh decodesweep's log (ferrum_attention_tuning
decode-exp lines, several passes): per B, L the mean over passes, in µs, of
the default, the other slices-per-block rule ("oldrules": the rules the
tail-free default replaced in session 32; "slots90" in that session's second
sweep, where only long slices had changed; "tailfree" in its first, when the
old rules were the default) and each explicit slices per
block, with the slices per block each took, the fastest explicit choice, and
the ratios of the two rules to each other and to the fastest; with
--versus VARIANT also the default against that variant at every point.
With --builds NAME=LOG ..., the default's µs (and its slices per block) of
each build side by side per point instead (gpu_suite.sh slicegeom: one
build per decode slice size).
"""
import collections
import math
import re
import sys

LINE = re.compile(r"^(\d+)\s+(\d+)\s+(\S+)\s+([\d.]+)\s+\d+\s+spb (\d+)")
EXPLICIT = ["spb1", "spb2", "spb4", "spb8", "spb16"]


def read_log(path):
    """A decode-exp log: per (B, L) the mean µs over passes of each variant,
    each variant's slices per block, and each point's spread between passes."""
    times = collections.defaultdict(list)  # (B, L, variant) -> [µs]
    spb = {}
    with open(path) as f:
        for line in f:
            m = LINE.match(line)
            if m:
                key = (int(m[1]), int(m[2]), m[3])
                times[key].append(float(m[4]))
                spb[key] = int(m[5])
    means = collections.defaultdict(dict)  # (B, L) -> {variant: mean µs}
    spread = collections.defaultdict(float)  # (B, L) -> largest (max - min) / min
    for (b, l, v), t in times.items():
        means[(b, l)][v] = sum(t) / len(t)
        spread[(b, l)] = max(spread[(b, l)], (max(t) - min(t)) / min(t))
    return means, spb, spread


def by_cache_then_batch(points):
    return sorted(points, key=lambda p: (p[1], p[0]))


def geo(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs))


def main(path, versus=None):
    means, spb, spread = read_log(path)
    names = {v for mean in means.values() for v in mean}
    other = next((n for n in ("oldrules", "slots90", "tailfree") if n in names), "oldrules")
    print(f"| B | L | default (spb) | {other} (spb) | " + " | ".join(EXPLICIT) +
          f" | fastest | default / {other} | default / fastest | {other} / fastest | pass spread |")
    print("|" + "---|" * (9 + len(EXPLICIT)))
    vs_other, vs_best = [], []
    for b, l in by_cache_then_batch(means):
        mean = means[(b, l)]
        if "default" not in mean or other not in mean:
            continue
        d, o = mean["default"], mean[other]
        # The fastest explicit choice that ran as asked (spb16 on an 8-slice row runs 8).
        ran = {v: mean[v] for v in EXPLICIT if v in mean and spb[(b, l, v)] == int(v[3:])}
        if not ran:  # every explicit run failed or timed out
            continue
        best_name = min(ran, key=ran.get)
        best = ran[best_name]
        vs_other.append(d / o)
        vs_best.append(d / best)
        cells = " | ".join(f"{mean[v]:.1f}" if v in mean else "–" for v in EXPLICIT)
        print(f"| {b} | {l} | {d:.1f} ({spb[(b, l, 'default')]}) | {o:.1f} ({spb[(b, l, other)]}) | {cells} | "
              f"{best_name} | {d / o:.3f} | {d / best:.3f} | {o / best:.3f} | {100 * spread[(b, l)]:.1f} % |")
    if vs_other:
        print(f"\ndefault / {other} over {len(vs_other)} points: geometric mean {geo(vs_other):.3f}, "
              f"best {min(vs_other):.3f}, worst {max(vs_other):.3f}; default / fastest: geometric mean "
              f"{geo(vs_best):.3f}, worst {max(vs_best):.3f}")

    # --versus NAME: the default against one other variant at every point.
    if versus is None or versus not in names:
        return
    print(f"\n| B | L | default (spb) | {versus} (spb) | default / {versus} |")
    print("|---|---|---|---|---|")
    ratios = []
    for b, l in by_cache_then_batch(means):
        mean = means[(b, l)]
        if "default" not in mean or versus not in mean:
            continue
        d, x = mean["default"], mean[versus]
        ratios.append(d / x)
        print(f"| {b} | {l} | {d:.1f} ({spb[(b, l, 'default')]}) | {x:.1f} ({spb[(b, l, versus)]}) | {d / x:.3f} |")
    if ratios:
        print(f"\ndefault / {versus} over {len(ratios)} points: geometric mean {geo(ratios):.3f}, "
              f"best {min(ratios):.3f}, worst {max(ratios):.3f}")


def builds(pairs):
    """The default of each build's log (NAME=LOG), side by side per point."""
    logs = [(name, read_log(path)) for name, path in (pair.split("=", 1) for pair in pairs)]
    names = [name for name, _ in logs]
    points = {p for _, (means, _, _) in logs for p, mean in means.items() if "default" in mean}
    print("| B | L | " + " | ".join(names) + " | " + " | ".join(f"{n} / {names[0]}" for n in names[1:]) + " |")
    print("|" + "---|" * (2 + 2 * len(names) - 1))
    for b, l in by_cache_then_batch(points):
        defaults = [means.get((b, l), {}).get("default") for _, (means, _, _) in logs]
        cells = [f"{x:.1f} ({spb[(b, l, 'default')]})" if x is not None else "–"
                 for x, (_, (_, spb, _)) in zip(defaults, logs)]
        base = defaults[0]
        ratios = [f"{x / base:.3f}" if x is not None and base else "–" for x in defaults[1:]]
        print(f"| {b} | {l} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "--builds":
        builds(args[1:])
        sys.exit(0)
    versus = None
    if len(args) == 3 and args[1] == "--versus":
        versus = args[2]
        args = args[:1]
    if len(args) != 1:
        sys.exit("usage: decode_sweep_summary.py LOG [--versus VARIANT]")
    main(args[0], versus)
