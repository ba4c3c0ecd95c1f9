#!/usr/bin/env python3
"""A bit-level model of the GPTQ streaming kernel's folded zero
(kernels/gptq_gemm.cu, gptq_stream_kernel; kernels/gptq_int4.cuh,
Int4Math<T>::dequant_raw; docs/design/gptq_small_m.md §13.7).

    python3 scripts/gptq_zero_fold_model.py [--tiles N] [--seed S]

Pure Python (no numpy). For random weights it builds the repacked words with
the layout of src/quant/gptq_repack.cpp (gptq_nibble_address), and then, per
warp lane (g = lane / 4, t = lane % 4) and per k16 step, does what the kernel
does:
  * dequant_raw on each 32-bit word (the bit operations, decoded as f16 /
    bf16 halves), checked against the A-fragment layout of mma.m16n8k16
    (PTX ISA: a0 row g, k 2t..2t+1; a1 row g + 8; a2 row g, k 2t+8..2t+9;
    a3 row g + 8, those k): every lane's registers must hold raw weights
    kRawLo + q (k 0..7) and kRawHi + q (k 8..15) of the right features;
  * the B fragments of the activation rows (b0 k 2t..2t+1, b1 k 2t+8..2t+9,
    column g), the mma (the 32 lanes' fragments put together, D = A B + C,
    and handed back in the D layout: c0 / c1 row g, columns 2t / 2t + 1;
    c2 / c3 row g + 8), one per 16 features and n8 tile, and the extra mma
    against the constant fragment of ones ({1, 0, 0, 1} for f16, {1, 0, 1, 0}
    for bf16) into the group's activation sums;
  * the fold at each group end (part + base, -z·S for real zeros, times the
    scale into acc), with the kernel's group steps (group_step_mask) for
    groups of 16, 32, 64, 128 rows and -1 (one group: k_pad rows).
Each tile runs twice: in exact arithmetic (Python ints / fractions) and with
every f32 operation rounded to f32 (an mma as one rounding of C + the exact
dot product; fmaf as one rounding). Checks:
  * exact: the fold equals sum_k (q - z)·a per group and the output equals
    sum_k (q - z)·s·a, for both dtypes, with and without zeros, every group
    size, NT = 1 and 2;
  * the tests' data (integer activations in [-4, 4], power-of-two scales):
    the f32 run equals the exact result bit for bit, and every integer that
    the f32 run holds (part, S, the fold's terms) stays below 2^19 (the worst
    case, q = 15, |a| = 4, z = 16, is one of the tiles);
  * random data (activations uniform in [-1, 1] rounded to the dtype, random
    scales): the f32 run's error against the exact result, beside the error
    of the old path (the mma on the exact q - z), for scale.
Exits non-zero on the first failed check.
"""
import argparse
import random
import struct
import sys
from fractions import Fraction

# ── Number formats ─────────────────────────────────────────────────────────


def f16_value(bits):
    return Fraction(struct.unpack("<e", struct.pack("<H", bits))[0])


def bf16_value(bits):
    return Fraction(struct.unpack("<f", struct.pack("<I", bits << 16))[0])


def round_f32(x):
    """x (an int or a Fraction) rounded to the nearest f32, ties to even
    (normal range; an int stays an int)."""
    if isinstance(x, int):
        a = abs(x)
        if a < 2 ** 24:
            return x
        shift = a.bit_length() - 24
        q, r = divmod(a, 1 << shift)
        half = 1 << (shift - 1)
        if r > half or (r == half and q & 1):
            q += 1
        return (q << shift) * (1 if x > 0 else -1)
    x = Fraction(x)
    if x == 0:
        return Fraction(0)
    sign = -1 if x < 0 else 1
    a = abs(x)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    ulp = Fraction(2) ** (e - 23)
    q, r = divmod(a, ulp)
    q = int(q)
    if r > ulp / 2 or (r == ulp / 2 and q % 2 == 1):
        q += 1
    return sign * q * ulp


def round_dtype(x, dtype):
    """x (a float) rounded to f16 / bf16, as a Fraction."""
    if dtype == "f16":
        return Fraction(struct.unpack("<e", struct.pack("<e", x))[0])
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round to nearest even
    return bf16_value(bits)


# ── Int4Math<T>::dequant_raw and its constants ──────────────────────────────

RAW = {"f16": (1024, 64), "bf16": (128, 128)}  # (kRawLo, kRawHi)
ONES = {"f16": 0x3C003C00, "bf16": 0x3F803F80}


def and_or(a, b, c):
    return (a & b) | c


def dequant_raw(w, dtype):
    """One repacked word -> the 4 A registers (u32, two 16-bit halves each)."""
    if dtype == "f16":
        w8 = w >> 8
        return [and_or(w, 0x000F000F, 0x64006400), and_or(w8, 0x000F000F, 0x64006400),
                and_or(w, 0x00F000F0, 0x54005400), and_or(w8, 0x00F000F0, 0x54005400)]
    m = 0x43004300
    return [and_or(w, 0x000F000F, m), and_or(w >> 8, 0x000F000F, m),
            and_or(w >> 4, 0x000F000F, m), and_or(w >> 12, 0x000F000F, m)]


def halves(reg, dtype):
    dec = f16_value if dtype == "f16" else bf16_value
    return dec(reg & 0xFFFF), dec(reg >> 16)


def ones_fragment(dtype):
    one = ONES[dtype]
    return [one, 0, 0, one] if RAW[dtype][0] != RAW[dtype][1] else [one, 0, one, 0]


# ── The repacked layout (src/quant/gptq_repack.cpp) ────────────────────────


def nibble_address(k_pad, row, col):
    nb, within = col // 64, col % 64
    tile, gid = within // 8, within % 8
    kt, r = row // 16, row % 16
    r8 = r % 8
    t = r8 // 2
    slot = (4 if r8 % 2 else 0) + (1 if r >= 8 else 0) + (2 if tile % 2 else 0)
    lane = gid * 4 + t
    word = ((nb * (k_pad // 16) + kt) * 32 + lane) * 4 + tile // 2
    return word, slot


def repack(q, k_pad, n_pad):
    words = [0] * (n_pad // 64 * (k_pad // 16) * 128)
    for row in range(k_pad):
        for col in range(n_pad):
            w, s = nibble_address(k_pad, row, col)
            words[w] |= (q[row][col] & 0xF) << (4 * s)
    return words


# ── mma.m16n8k16 fragments ─────────────────────────────────────────────────


def a_positions(lane):
    """(row, k) of the 8 halves a0.lo, a0.hi, a1.lo, ..., a3.hi of a lane."""
    g, t = lane // 4, lane % 4
    out = []
    for reg in range(4):
        row = g + (8 if reg in (1, 3) else 0)
        k = 2 * t + (8 if reg in (2, 3) else 0)
        out += [(row, k), (row, k + 1)]
    return out


def b_positions(lane):
    """(k, col) of b0.lo, b0.hi, b1.lo, b1.hi."""
    g, t = lane // 4, lane % 4
    return [(2 * t, g), (2 * t + 1, g), (2 * t + 8, g), (2 * t + 9, g)]


def d_positions(lane):
    """(row, col) of c0 .. c3."""
    g, t = lane // 4, lane % 4
    return [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)]


def mma(a_frags, b_frags, c_frags, rounded):
    """a_frags[lane] = 8 A values, b_frags[lane] = 4 B values, c_frags[lane] =
    4 accumulators (updated in place). D = A B + C, rounded once to f32 where
    `rounded`."""
    A = [[None] * 16 for _ in range(16)]
    B = [[None] * 8 for _ in range(16)]
    for lane in range(32):
        for (r, k), v in zip(a_positions(lane), a_frags[lane]):
            A[r][k] = v
        for (k, c), v in zip(b_positions(lane), b_frags[lane]):
            B[k][c] = v
    for lane in range(32):
        for e, (r, c) in enumerate(d_positions(lane)):
            v = c_frags[lane][e] + sum(A[r][k] * B[k][c] for k in range(16))
            c_frags[lane][e] = round_f32(v) if rounded else v


# ── One tile through the kernel ────────────────────────────────────────────


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def run_tile(dtype, k, m, group, zeros, data, rng, worst=False):
    """One column block (64 features) of a weight k x 64 against m activation
    rows through one warp (every chunk in turn). Returns (the largest integer
    the f32 run held on exact data, the f32 run's largest error relative to
    sum_k |(q - z) s a| of its output, the same for the old path)."""
    k_pad = (k + 127) // 128 * 128
    n_pad = 64
    group_rows = k_pad if group == -1 else group
    groups = k_pad // group_rows
    nt_count = 1 if m <= 8 else 2
    raw_lo, raw_hi = RAW[dtype]
    split = raw_lo != raw_hi

    # The weight (padded rows q = 0, as the repack pads), zeros, scales and
    # activations. Activations are held as integers: the exact data's are
    # integers, the random data's are multiples of 2^-24 (|a| >= 2^-10 or 0),
    # held times 2^24 (f32 rounding does not see a power-of-two factor).
    q = [[(15 if worst else rng.randrange(16)) if row < k else 0 for _ in range(n_pad)] for row in range(k_pad)]
    zero_value = 8
    z = [[(16 if worst else rng.randrange(17)) if zeros else zero_value for _ in range(n_pad)] for _ in range(groups)]
    if data == "exact":
        unit = 1
        s = [[Fraction(rng.choice([1, -1]), 2 ** (3 + rng.randrange(6))) for _ in range(n_pad)] for _ in range(groups)]
        act = [[4 if worst else rng.randrange(9) - 4 for _ in range(k)] for _ in range(m)]
    else:
        unit = 2 ** 24
        s = [[round_dtype(rng.uniform(0.001, 0.02), dtype) for _ in range(n_pad)] for _ in range(groups)]
        act = []
        for _ in range(m):
            row = []
            for _ in range(k):
                v = round_dtype(rng.uniform(-1.0, 1.0), dtype)
                v = v if abs(v) >= Fraction(1, 1024) else Fraction(0)
                assert (v * unit).denominator == 1
                row.append(int(v * unit))
            act.append(row)
    words = repack(q, k_pad, n_pad)

    def a_val(row, col):  # rows >= m and columns >= k are zero in the B fragments
        return act[row][col] if row < m and col < k else 0

    k16_per_group = group_rows // 16
    mask = min(k16_per_group, 8) - 1  # StreamParams::group_step_mask
    chunks = k_pad // 128
    ones = [halves(r, dtype) for r in ones_fragment(dtype)]
    a_ones = [[int(v) for pair in ones for v in pair] for _ in range(32)]
    want_ones = [[1 if (r < 8 and (kk < 8 or not split)) or (r >= 8 and kk >= 8 and split) else 0 for kk in range(16)]
                 for r in range(16)]
    for lane in range(32):  # the ones fragment is the intended matrix
        for (r, kk), v in zip(a_positions(lane), a_ones[lane]):
            if v != want_ones[r][kk]:
                fail(f"{dtype}: ones fragment at row {r}, k {kk} is {v}")
    biggest = 0
    out = {}
    for rounded in (False, True):
        R = round_f32 if rounded else (lambda v: v)
        acc = [[Fraction(0)] * (nt_count * 16) for _ in range(32)]
        acc_old = [[Fraction(0)] * (nt_count * 16) for _ in range(32)]
        part = [[0] * (nt_count * 16) for _ in range(32)]
        part_old = [[0] * (nt_count * 16) for _ in range(32)]
        sums = [[[0] * 4 for _ in range(nt_count)] for _ in range(32)]

        def track(v):
            nonlocal biggest
            if rounded and data == "exact":
                biggest = max(biggest, abs(v))

        def fold(grp, kt_first, kt_end):
            for lane in range(32):
                g, t = lane // 4, lane % 4
                zr = 0 if zeros else zero_value
                base, total = [], []
                for nt in range(nt_count):
                    sm = sums[lane][nt]
                    b2, t2 = [], []
                    for r in range(2):
                        if split:  # fmaf(-(kRawHi + zr), S_hi, -(kRawLo + zr) * S_lo)
                            lo_term = R(-(raw_lo + zr) * sm[r])
                            b2.append(R(-(raw_hi + zr) * sm[2 + r] + lo_term))
                            t2.append(R(sm[r] + sm[2 + r]))
                            track(sm[2 + r]), track(lo_term)
                        else:
                            b2.append(R(-(raw_lo + zr) * sm[r]))
                            t2.append(sm[r])
                        track(sm[r]), track(b2[-1]), track(t2[-1])
                    base.append(b2)
                    total.append(t2)
                for i in range(nt_count * 16):
                    nt, j, e = i // 16, (i // 4) % 4, i % 4
                    feature = 16 * j + (8 if e >= 2 else 0) + g
                    row = 8 * nt + 2 * t + (e % 2)
                    zf = z[grp][feature]
                    exact = R(part[lane][i] + base[nt][e % 2])
                    track(part[lane][i]), track(exact)
                    if zeros:
                        exact = R(-zf * total[nt][e % 2] + exact)
                        track(exact)
                    if not rounded:  # the fold is sum over the group's k of (q - z) a
                        want = sum((q[kk][feature] - zf) * a_val(row, kk) for kk in range(16 * kt_first, 16 * kt_end))
                        if exact != want or part_old[lane][i] != want:
                            fail(f"{dtype} zeros={zeros} g={group} m={m}: fold {exact} != {want} "
                                 f"(lane {lane}, feature {feature}, row {row}, group {grp})")
                    sc = s[grp][feature]
                    acc[lane][i] = R(sc * Fraction(exact, unit) + acc[lane][i])
                    acc_old[lane][i] = R(sc * Fraction(part_old[lane][i], unit) + acc_old[lane][i])
                    part[lane][i] = 0
                    part_old[lane][i] = 0
                for nt in range(nt_count):
                    sums[lane][nt] = [0] * 4

        for c in range(chunks):
            grp = c * 8 // k16_per_group
            kt_first = c * 8
            for st in range(8):
                kt = c * 8 + st
                if st > 0 and (st & mask) == 0:
                    fold(grp, kt_first, kt)
                    grp += 1
                    kt_first = kt
                # The B fragments of each n8 tile: activation rows 8 nt + g.
                bfr = [[[a_val(8 * nt + col, 16 * kt + kk) for kk, col in b_positions(lane)] for lane in range(32)]
                       for nt in range(nt_count)]
                # The ones mma (one offset: d2 / d3 start at 0 and are dropped).
                for nt in range(nt_count):
                    c4 = [list(sums[lane][nt]) if split else sums[lane][nt][:2] + [0, 0] for lane in range(32)]
                    mma(a_ones, bfr[nt], c4, rounded)
                    for lane in range(32):
                        sums[lane][nt] = c4[lane] if split else c4[lane][:2] + [0, 0]
                # The weights: word j of each lane -> its raw A fragment.
                for j in range(4):
                    frags, frags_old = [], []
                    for lane in range(32):
                        regs = dequant_raw(words[(kt * 32 + lane) * 4 + j], dtype)
                        vals = [v for r in regs for v in halves(r, dtype)]
                        for (row, kk), v in zip(a_positions(lane), vals):  # the layout
                            want = (raw_lo if kk < 8 else raw_hi) + q[16 * kt + kk][16 * j + row]
                            if v != want:
                                fail(f"{dtype}: lane {lane} word {j} half at row {row}, k {kk} is {v}, want {want}")
                        frags.append([int(v) for v in vals])
                        frags_old.append([q[16 * kt + kk][16 * j + row] - z[grp][16 * j + row]
                                          for row, kk in a_positions(lane)])
                    for nt in range(nt_count):
                        at = (nt * 4 + j) * 4
                        c4 = [part[lane][at:at + 4] for lane in range(32)]
                        mma(frags, bfr[nt], c4, rounded)
                        c4o = [part_old[lane][at:at + 4] for lane in range(32)]
                        mma(frags_old, bfr[nt], c4o, rounded)
                        for lane in range(32):
                            part[lane][at:at + 4] = c4[lane]
                            part_old[lane][at:at + 4] = c4o[lane]
            fold(grp, kt_first, c * 8 + 8)
        out[rounded] = (acc, acc_old)

    # The output against sum_k (q - z) s a.
    err_new = err_old = 0.0
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for i in range(nt_count * 16):
            nt, j, e = i // 16, (i // 4) % 4, i % 4
            feature = 16 * j + (8 if e >= 2 else 0) + g
            row = 8 * nt + 2 * t + (e % 2)
            terms = [(q[kk][feature] - z[kk // group_rows][feature]) * s[kk // group_rows][feature] *
                     Fraction(a_val(row, kk), unit) for kk in range(k_pad)]
            want = sum(terms)
            if out[False][0][lane][i] != want or out[False][1][lane][i] != want:
                fail(f"{dtype} zeros={zeros} g={group} m={m}: exact output {out[False][0][lane][i]} != {want}")
            got_new, got_old = out[True][0][lane][i], out[True][1][lane][i]
            if data == "exact" and (got_new != want or got_old != want):
                fail(f"{dtype} zeros={zeros} g={group} m={m}: f32 output {got_new} != {want} on exact data")
            if row < m:
                scale = float(sum(abs(x) for x in terms)) or 1.0
                err_new = max(err_new, abs(float(got_new - want)) / scale)
                err_old = max(err_old, abs(float(got_old - want)) / scale)
    return biggest, err_new, err_old


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiles", type=int, default=2, help="random tiles per (dtype, zeros, group, data) case")
    ap.add_argument("--seed", type=int, default=28)
    args = ap.parse_args()
    rng = random.Random(args.seed)

    # The bit tricks alone, every nibble.
    for qv in range(16):
        assert f16_value(0x6400 | qv) == 1024 + qv
        assert f16_value(0x5400 | qv << 4) == 64 + qv
        assert bf16_value(0x4300 | qv) == 128 + qv
    print("dequant_raw bit tricks: f16 0x6400|q = 1024+q, 0x5400|q<<4 = 64+q; bf16 0x4300|q = 128+q (q = 0..15)")

    count = 0
    for dtype in ("f16", "bf16"):
        biggest = 0
        worst_new = {}
        worst_old = {}
        for zeros in (False, True):
            for group in (16, 32, 64, 128, -1):
                for data in ("exact", "random"):
                    for tile in range(args.tiles):
                        k = rng.choice([128, 200, 256, 264])
                        m = rng.choice([1, 3, 8, 9, 16]) if tile else (1 if data == "exact" else 16)
                        b, en, eo = run_tile(dtype, k, m, group, zeros, data, rng)
                        biggest = max(biggest, b)
                        worst_new[data] = max(worst_new.get(data, 0.0), en)
                        worst_old[data] = max(worst_old.get(data, 0.0), eo)
                        count += 1
            # The worst case of the bound: q = 15, a = 4, z = 16 (or the fixed zero).
            b, _, _ = run_tile(dtype, 128, 16, -1, zeros, "exact", rng, worst=True)
            biggest = max(biggest, b)
            count += 1
        if biggest >= 2 ** 19:
            fail(f"{dtype}: an integer held in f32 reached {biggest} >= 2^19")
        print(f"{dtype}: fold == sum (q - z) a exactly; exact data bitwise exact in f32; "
              f"largest integer held {biggest} (< 2^19 = {2 ** 19}); random data max rel. error "
              f"new {worst_new['random']:.2e}, old path {worst_old['random']:.2e}")
    print(f"{count} tiles, all checks passed")


if __name__ == "__main__":
    main()
