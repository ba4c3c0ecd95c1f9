#!/usr/bin/env python3
"""One table of several builds' ferrum_bench runs (gpu_suite.sh ab with AB_OPS_FILTER).

Usage:
  python3 bench/ab_table.py NAME=run.json [NAME=run.json ...]

A NAME given more than once is one build run several times (alternated with the
others). Rows pair on (op, dtype, shape, mode); each build's column lists its
runs' median us, "/"-separated ("err": the case failed, "-": not run), and the
last column is the first build's best run over the second's (< 1: the first
build is faster). Prints a Markdown table.
"""

import json
import sys


def main(argv):
    if len(argv) < 2 or any("=" not in a for a in argv[1:]):
        print(__doc__.strip())
        return 2
    builds = []  # names in first-seen order
    runs = {}    # (row key, name) -> [us, ...]
    rows = []    # row keys in first-seen order
    for arg in argv[1:]:
        name, path = arg.split("=", 1)
        if name not in builds:
            builds.append(name)
        try:
            with open(path) as f:
                records = json.load(f)["records"]
        except (OSError, ValueError, KeyError) as e:
            print(f"ab_table: {name}: {path} unreadable ({e}); left out", file=sys.stderr)
            continue
        for r in records:
            key = (r["op"], r["dtype"], r["shape"], r["mode"])
            if key not in rows:
                rows.append(key)
            cell = runs.setdefault((key, name), [])
            if r.get("us") is not None:  # else the case failed: shown as "err"
                cell.append(float(r["us"]))
    header = ["op", "dtype", "shape", "mode"] + builds
    if len(builds) >= 2:
        header.append(f"{builds[0]} / {builds[1]}")
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for key in rows:
        cells = list(key)
        for name in builds:
            times = runs.get((key, name))
            cells.append("-" if times is None else " / ".join(f"{us:.2f}" for us in times) or "err")
        if len(builds) >= 2:
            a, b = runs.get((key, builds[0])), runs.get((key, builds[1]))
            cells.append(f"{min(a) / min(b):.3f}" if a and b else "-")
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
