#!/usr/bin/env python3
"""Exact check of `rescale_e4m3x4_pow2` (kernels/sparse_mla_prefill.cu): four e4m3 bytes times
2^k, rounded back to e4m3 with integer and f16 arithmetic only, against the library's encoder
(`e4m3_from_f32` in src/dtype.rs: nearest even, saturating at 448, a NaN to 0x7f) applied to the
exact product, for every byte (NaN patterns included) at every k the kernel admits ([-22, 7],
`scale_for_pow2_path`), in every byte position of a word and in words of mixed bytes.

The model follows the kernel's instructions one by one on 32-bit words: the shifts and masks
bit for bit, each `fma.rn.f16x2` / `min.f16x2` / `max.f16x2` per half as IEEE binary16 with one
rounding to nearest even (exact rational arithmetic, then rounded). Run it with no arguments;
it exits non-zero on any difference, or when a deliberately broken variant passes.

One property of the hardware it assumes rather than checks: f16 subnormals are kept (the PTX
instructions without `.ftz`). They occur on both sides: |x| * 2^-8 is an f16 subnormal for every
e4m3 subnormal byte, and so is the result for every e4m3 subnormal output. The broken variant
"f16 subnormals flushed" shows what flushing would change; on the GPU,
`the_paged_prefill_reads_the_gathers_values_at_the_stores_scales` (tests/gpu_mla_decode.rs)
would see it.
"""
import random
import sys
from fractions import Fraction as F
from functools import lru_cache

def f16_value(bits):
    """The value of binary16 bits (no NaN arises in the kernel's arithmetic)."""
    s = -1 if bits & 0x8000 else 1
    e, m = (bits >> 10) & 31, bits & 1023
    if e == 31:
        assert m == 0, "a NaN in the f16 arithmetic"
        return s * F(10**12)  # infinity, larger than anything that matters here
    return s * (F(m, 1024) * F(2) ** -14 if e == 0 else (1 + F(m, 1024)) * F(2) ** (e - 15))


def f16_bits(x):
    """x rounded to binary16, nearest even (overflow to infinity), as bits."""
    sign = 0x8000 if x < 0 else 0
    a = abs(x)
    if a == 0:
        return sign
    e = a.numerator.bit_length() - a.denominator.bit_length()
    while F(2) ** e > a:
        e -= 1
    while F(2) ** (e + 1) <= a:
        e += 1
    q = F(2) ** (max(e, -14) - 10)  # the step at a's binade (subnormal below 2^-14)
    n = a / q
    whole = n.numerator // n.denominator
    rest = n - whole
    if rest > F(1, 2) or (rest == F(1, 2) and whole % 2 == 1):
        whole += 1
    v = whole * q
    if v >= 65520:
        return sign | 0x7C00
    if v < F(2) ** -14:
        return sign | int(v / F(2) ** -24)
    e = v.numerator.bit_length() - v.denominator.bit_length()
    while F(2) ** e > v:
        e -= 1
    while F(2) ** (e + 1) <= v:
        e += 1
    return sign | ((e + 15) << 10) | int((v / F(2) ** e - 1) * 1024)


def flush(bits):
    """An f16 subnormal flushed to a zero of its sign (what `.ftz` would do)."""
    return bits & 0x8000 if (bits >> 10) & 31 == 0 else bits


@lru_cache(maxsize=None)
def fma_ftz(a, b, c):
    return flush(f16_bits(f16_value(flush(a)) * f16_value(flush(b)) + f16_value(flush(c))))


def halves(op, *words):
    """An f16x2 instruction: `op` on each 16-bit half of the operand words."""
    lo = op(*(w & 0xFFFF for w in words))
    hi = op(*(w >> 16 for w in words))
    return lo | (hi << 16)


@lru_cache(maxsize=None)
def fma_kept(a, b, c):
    return f16_bits(f16_value(a) * f16_value(b) + f16_value(c))


@lru_cache(maxsize=None)
def fmin(a, b):
    return a if f16_value(a) <= f16_value(b) else b


@lru_cache(maxsize=None)
def fmax(a, b):
    return a if f16_value(a) >= f16_value(b) else b


def pow2_multiplier(k):
    """pow2_path_multiplier: 2^(k + 8) as f16 in both halves, from the scale's f32 exponent."""
    e32 = k + 127
    e16 = e32 - 104
    return ((e16 << 10) * 0x10001) & 0xFFFFFFFF


def rescale(w, m2, broken=None):
    """rescale_e4m3x4_pow2, instruction by instruction."""
    fma = fma_ftz if broken == "f16 subnormals flushed" else fma_kept
    even = ((w << 7) & 0xFFFFFFFF) & 0x3F803F80
    odd = (w >> 1) & 0x3F803F80
    two = 0x40004000 if broken != "magic 1 instead of 2" else 0x3C003C00
    e = halves(fma, even, m2, two)
    o = halves(fma, odd, m2, two)
    cap = 0x5F085F08 if broken != "no saturation" else 0x7BFF7BFF
    e = halves(fmin, e, cap)
    o = halves(fmin, o, cap)
    e = halves(fma, e, 0x1C001C00, 0xA000A000 if broken != "magic 1 instead of 2" else 0x9C009C00)
    o = halves(fma, o, 0x1C001C00, 0xA000A000 if broken != "magic 1 instead of 2" else 0x9C009C00)
    if broken != "NaN not handled":
        e = halves(fmax, e, halves(fma, even, 0x4B804B80, 0xCE90CE90))
        o = halves(fmax, o, halves(fma, odd, 0x4B804B80, 0xCE90CE90))
    mag = ((e >> 7) + ((o << 1) & 0xFFFFFFFF)) & 0xFFFFFFFF
    if broken == "sign kept on a NaN":
        return mag | (w & 0x80808080)
    return mag | (w & ~((mag + 0x01010101) & 0xFFFFFFFF) & 0x80808080)


def e4m3_value(b):
    e, m = (b >> 3) & 15, b & 7
    if e == 15 and m == 7:
        return None  # NaN
    v = F(m, 8) * F(2) ** -6 if e == 0 else (1 + F(m, 8)) * F(2) ** (e - 7)
    return -v if b & 0x80 else v


MAGNITUDES = sorted((e4m3_value(b), b) for b in range(0x7F))


def encode(x, negative):
    """The library's e4m3 encoder on an exact value (nearest even, saturating)."""
    sign = 0x80 if negative else 0
    a = abs(x)
    if a >= 448:
        return sign | 0x7E
    lo = max(c for c in MAGNITUDES if c[0] <= a)
    hi = min(c for c in MAGNITUDES if c[0] >= a)
    if lo[0] == a:
        return sign | lo[1]
    d_lo, d_hi = a - lo[0], hi[0] - a
    if d_lo != d_hi:
        return sign | (lo[1] if d_lo < d_hi else hi[1])
    return sign | (lo[1] if lo[1] % 2 == 0 else hi[1])


@lru_cache(maxsize=None)
def expected_byte(b, k):
    v = e4m3_value(b)
    if v is None:
        return 0x7F
    return encode(v * F(2) ** k, bool(b & 0x80))


def failures(broken=None):
    rng = random.Random(2026)
    bad, first = 0, None
    for k in range(-22, 8):
        m2 = pow2_multiplier(k)
        words = [b * 0x01010101 for b in range(256)]  # every byte in every position
        words += [rng.getrandbits(32) for _ in range(300)]  # mixed bytes
        for w in words:
            got = rescale(w, m2, broken)
            want = sum(expected_byte((w >> (8 * i)) & 0xFF, k) << (8 * i) for i in range(4))
            if got != want:
                bad += 1
                first = first or f"k {k}, word {w:#010x}: {got:#010x}, expected {want:#010x}"
    return bad, first


def main():
    bad, first = failures()
    print(f"e4m3 rescale without conversions: {'ok' if bad == 0 else f'{bad} words differ, e.g. {first}'}")
    status = 0 if bad == 0 else 1
    for broken in ("magic 1 instead of 2", "no saturation", "NaN not handled", "sign kept on a NaN",
                   "f16 subnormals flushed"):
        bad, first = failures(broken)
        print(f"broken on purpose ({broken}): {'caught: ' + first if bad else 'NOT caught'}")
        status |= 0 if bad else 1
    return status


if __name__ == "__main__":
    sys.exit(main())
