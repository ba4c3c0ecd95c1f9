#!/usr/bin/env python3
"""Summarizes gpu_suite.sh decodesweep's log (ferrum_attention_tuning
decode-exp lines, several passes): per B, L the mean over passes of the
default (the 90 %-of-slots rule), the tail-free rule and each explicit
slices-per-block choice, in µs, with the slices per block each took, the
fastest choice, and the tail-free rule against the default and the fastest.
"""
import collections
import re
import sys

LINE = re.compile(r"^(\d+)\s+(\d+)\s+(\S+)\s+([\d.]+)\s+\d+\s+spb (\d+)")


def main(path):
    times = collections.defaultdict(list)  # (B, L, variant) -> [µs]
    spb = {}
    order = []
    with open(path) as f:
        for line in f:
            m = LINE.match(line)
            if not m:
                continue
            b, l, var, us, p = int(m[1]), int(m[2]), m[3], float(m[4]), int(m[5])
            if (b, l) not in order:
                order.append((b, l))
            times[(b, l, var)].append(us)
            spb[(b, l, var)] = p
    explicit = ["spb1", "spb2", "spb4", "spb8", "spb16"]
    print("| B | L | default (spb) | tailfree (spb) | " + " | ".join(explicit) +
          " | fastest | tailfree / default | tailfree / fastest | pass spread |")
    print("|" + "---|" * (9 + len(explicit) - 1))
    ratios = []
    for b, l in sorted(order, key=lambda x: (x[1], x[0])):
        def mean(var):
            t = times.get((b, l, var))
            return sum(t) / len(t) if t else None
        d, tf = mean("default"), mean("tailfree")
        if d is None or tf is None:
            continue
        cells = []
        best_name, best = None, None
        for var in explicit:
            t = mean(var)
            cells.append(f"{t:.1f}" if t is not None else "–")
            if t is not None and spb[(b, l, var)] == int(var[3:]) and (best is None or t < best):
                best_name, best = var, t
        spread = max(
            (max(v) - min(v)) / min(v) for k, v in times.items() if k[0] == b and k[1] == l and len(v) > 1
        ) if any(len(v) > 1 for k, v in times.items() if k[0] == b and k[1] == l) else 0.0
        ratios.append(tf / d)
        print(f"| {b} | {l} | {d:.1f} ({spb[(b, l, 'default')]}) | {tf:.1f} ({spb[(b, l, 'tailfree')]}) | " +
              " | ".join(cells) + f" | {best_name} | {tf / d:.3f} | {tf / best:.3f} | {100 * spread:.1f} % |")
    if ratios:
        prod = 1.0
        for r in ratios:
            prod *= r
        print(f"\ntailfree / default over {len(ratios)} points: geometric mean {prod ** (1 / len(ratios)):.3f}, "
              f"best {min(ratios):.3f}, worst {max(ratios):.3f}")


if __name__ == "__main__":
    main(sys.argv[1])
