#!/usr/bin/env python3
"""Where a kernel's warps stall, from one `ncu --section SourceCounters
--page source --print-source sass --csv` run (one profiled launch).

Prints the total warp-stall samples, the share of the instructions after the
kernel's last backward branch (the code past its main loop: for the decode
kernels, the slice's and the row's merge, the stores and the exit), a
histogram over ten equal spans of the instruction addresses, and the top
instructions by samples with their neighbours' opcodes. Where the CSV has not
the expected columns it prints its header and first rows instead, so the
next run can be fixed from the log.

Usage: ncu_source_summary.py CSV [--top N]
"""

import argparse
import csv
import re
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
ADDRESS = "Address"
SOURCE = "Source"


def rows_of(path):
    """The CSV's rows from its header on (ncu prints ==PROF== lines and the
    program's own output before it)."""
    with open(path, newline="", errors="replace") as f:
        lines = f.readlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"') and ADDRESS in line), None)
    if start is None:
        return None, lines
    return list(csv.DictReader(lines[start:])), lines


def number(text):
    text = (text or "").replace(",", "").strip()
    try:
        return float(text)
    except ValueError:
        return 0.0


def address(text):
    """An instruction's address (hex, with or without 0x); None for other rows."""
    try:
        return int((text or "").strip(), 16)
    except ValueError:
        return None


def opcode(src):
    """The instruction's opcode, past a predicate (@P0, @!P1)."""
    words = [w for w in src.split() if not w.startswith("@")]
    return words[0] if words else ""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()

    rows, lines = rows_of(args.csv)
    if not rows or SAMPLES not in rows[0] or SOURCE not in rows[0]:
        print(f"{args.csv}: no '{ADDRESS}' / '{SOURCE}' / '{SAMPLES}' columns; its first lines:")
        for line in lines[:40]:
            print("  " + line.rstrip()[:300])
        return 1
    insts = []
    for r in rows:
        a = address(r.get(ADDRESS))
        if a is None:
            continue
        insts.append((a, r[SOURCE].strip(), number(r.get(SAMPLES))))
    if not insts:
        print(f"{args.csv}: no instruction rows")
        return 1
    insts.sort()
    total = sum(s for _, _, s in insts)
    print(f"{args.csv}: {len(insts)} instructions, {total:.0f} stall samples")

    # The last backward branch: a BRA whose target lies before it (not at it:
    # every kernel ends with EXIT and a BRA to itself). A target below the
    # first address is taken as relative to the function's start.
    base = insts[0][0]
    last_back = None
    for i, (a, src, _) in enumerate(insts):
        m = re.search(r"\bBRA\b.*?(0x[0-9a-fA-F]+)", src)
        if m:
            target = int(m.group(1), 16)
            if target < base:
                target += base
            if target < a:
                last_back = i
    if last_back is not None:
        tail = sum(s for _, _, s in insts[last_back + 1:])
        print(f"after the last backward branch (at 0x{insts[last_back][0]:x}, instruction {last_back}): "
              f"{len(insts) - last_back - 1} instructions, {tail:.0f} samples = {100.0 * tail / max(total, 1):.1f} %")
    else:
        print("no backward branch found")

    lo, hi = insts[0][0], insts[-1][0] + 1
    print("samples by tenth of the address range:")
    for k in range(10):
        a0 = lo + (hi - lo) * k // 10
        a1 = lo + (hi - lo) * (k + 1) // 10
        s = sum(x for a, _, x in insts if a0 <= a < a1)
        print(f"  0x{a0:06x}-0x{a1:06x} {s:8.0f} {100.0 * s / max(total, 1):5.1f} %")

    print(f"top {args.top} instructions:")
    order = sorted(range(len(insts)), key=lambda i: -insts[i][2])[: args.top]
    for i in sorted(order):
        a, src, s = insts[i]
        before = opcode(insts[i - 1][1]) if i > 0 else ""
        print(f"  #{i:5d} 0x{a:06x} {s:8.0f} {100.0 * s / max(total, 1):5.1f} %  {src[:70]:<70} (after {before})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
