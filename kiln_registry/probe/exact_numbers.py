"""Exact, vectorized number conversion for the fast prompt-logprobs path.

Owns the numeric half of ``probe.candidate_scan``: ``small_ints`` (canonical 1..8
digit ids and ranks, range-checked) and ``exact_logprobs`` (JSON numbers to
float32 exactly as the strict parser's ``float`` would): Clinger's fast path
(mantissa <= 2**53, division by an exact power of ten); otherwise an integer
proof, then a 64-bit-significand long-double bound, that the decimal rounds
(float64) to its float32 candidate; Python's ``float`` per number for what is
left (exponent forms, over 19 significant digits).  Anything it cannot decide
or that breaks a rule raises ``FastPathDeferred`` so the strict parser decides.

Imports numpy, the standard library and nothing from kiln_registry; no
sockets, httpx or database.
"""

from __future__ import annotations

import functools
import math
import re
from array import array

import numpy as np
import numpy.typing as npt

JSON_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
Bytes = npt.NDArray[np.uint8]

_ZEROS = np.uint64(0x3030303030303030)
_SIXES = np.uint64(0x0606060606060606)
_KEEP = np.array([0] + [(1 << 64) - (1 << (8 * (8 - n))) for n in range(1, 9)], dtype=np.uint64)
_LANE_DIGITS = np.array([16, 8, 0, 0], dtype=np.int64)
_POW10 = np.array([10**n for n in range(20)], dtype=np.uint64)
_POW10_F = np.array([10.0**n for n in range(23)], dtype=np.float64)
_POW5 = np.array([5**n for n in range(18)], dtype=np.uint64)


def _clamp(x: I64, low: int, high: int) -> I64:
    """``np.clip`` for int64 index arrays, without its per-call dtype-limit checks."""
    clamped: I64 = np.minimum(np.maximum(x, low), high)
    return clamped


class FastPathDeferred(Exception):
    """The body leaves the fast layout or breaks a rule: the strict parser decides."""


def _swar8(lanes: U64) -> U64:
    """Eight decimal digit values (first digit in the lowest byte) to an integer."""
    v = lanes * np.uint64(10) + (lanes >> np.uint64(8))
    mask = np.uint64(0x000000FF000000FF)
    hi = (v & mask) * np.uint64(100 + (1000000 << 32))
    lo = ((v >> np.uint64(16)) & mask) * np.uint64(1 + (10000 << 32))
    return (hi + lo) >> np.uint64(32)


def small_ints(lanes: U64, length: I64, low: int, high: int) -> npt.NDArray[np.int32]:
    """The 1..8 digits right-aligned in ``lanes[:, 0]``: canonical and in ``low..high``."""
    if length.min() < 1 or length.max() > 8:
        raise FastPathDeferred
    keep = _KEEP[length]
    v = (lanes[:, 0] & keep) | (_ZEROS & ~keep)
    high_nibbles = np.uint64(0xF0F0F0F0F0F0F0F0)
    if (((v & high_nibbles) != _ZEROS) | (((v + _SIXES) & high_nibbles) != _ZEROS)).any():
        raise FastPathDeferred
    leading = (v >> (np.uint64(64) - np.uint64(8) * length.astype(np.uint64))) & np.uint64(0xFF)
    values = _swar8(v - _ZEROS)
    if ((length > 1) & (leading == 0x30)).any() or values.min() < low or values.max() > high:
        raise FastPathDeferred
    return values.astype(np.int32)


def _bit_index(x: U64) -> I64:
    """Index of the lowest set bit (-1 for zero)."""
    low = x & (~x + np.uint64(1))
    return np.frexp(low.astype(np.float64))[1].astype(np.int64) - 1


def _mantissas(
    number: Bytes, values: U64, dot: I64, int_len: I64, frac_len: I64
) -> tuple[U64, npt.NDArray[np.bool_]]:
    """(integer part * 10**frac_len + fraction, fits in 19 digits) for each number.

    ``number`` holds each number right-aligned in its first 32 bytes; the
    integer part is read from the 8 bytes ending at column ``dot`` (>= 8) and
    up to 24 fraction digits from lanes 1..3 of ``values`` (the first four lanes
    XOR ``'0'``: digit values wherever the bytes are digits).  Rows outside the
    fast set come out as garbage and are masked by the caller.
    """
    rows, width = number.shape
    unaligned = np.ndarray((rows * width - 7,), dtype="<u8", buffer=number, strides=(1,))
    lanes = np.empty((rows, 4), dtype=np.uint64)
    lanes[:, :3] = values[:, 1:4]
    lanes[:, 3] = unaligned[np.arange(rows) * width + _clamp(dot, 8, 32) - 8] ^ _ZEROS
    keep = _KEEP[
        _clamp(np.column_stack((frac_len, frac_len, frac_len, int_len)) - _LANE_DIGITS, 0, 8)
    ]
    parts = _swar8(lanes & keep)
    frac = (parts[:, 0] * np.uint64(10**8) + parts[:, 1]) * np.uint64(10**8) + parts[:, 2]
    return parts[:, 3] * _POW10[_clamp(frac_len, 0, 19)] + frac, parts[:, 0] < 1000


def _prove_float32(
    mantissa: U64, frac_len: I64, magnitude: npt.NDArray[np.float32]
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """(decided, exact): whether ``mantissa * 10**-frac_len`` rounds (float64) to ``magnitude``.

    With ``f = F * 2**G`` (float32, ``2**23 <= F < 2**24``) and ``s = -G - frac_len``
    the decimal is within half a float64 ulp of ``f`` iff
    ``|mantissa * 2**s - F * 5**frac_len| <= 5**frac_len / 2**30`` (``2**31`` below a
    power of two); ties round to ``f``, whose float64 significand is even.  Rows
    where the integers could overflow are left undecided.
    """
    wide = magnitude.astype(np.float64)
    mant, exp2 = np.frexp(wide)
    big_f = np.ldexp(mant, 24).astype(np.uint64)
    shift = 24 - exp2.astype(np.int64) - frac_len
    safe_shift = _clamp(shift, 0, 63).astype(np.uint64)
    safe_frac = _clamp(frac_len, 0, 17)
    decided = (wide >= 2.0**-126) & (shift >= 0) & (shift <= 63) & (frac_len <= 17)
    decided &= mantissa <= (np.uint64((1 << 64) - 1) >> safe_shift)
    pow5 = _POW5[safe_frac]
    diff = ((mantissa << safe_shift) - big_f * pow5).view(np.int64)
    below = np.where(big_f == np.uint64(1 << 23), pow5 >> np.uint64(31), pow5 >> np.uint64(30))
    below = below.astype(np.int64)
    within = np.where(diff >= 0, diff <= (pow5 >> np.uint64(30)).astype(np.int64), -diff <= below)
    return decided, decided & within


def _prove_extended(
    mantissa: U64,
    frac_len: I64,
    magnitude: npt.NDArray[np.float32],
    rows: npt.NDArray[np.bool_],
    into: tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]],
) -> None:
    """Decide the rows ``_prove_float32`` could not, in 64-bit-significand long double.

    ``mantissa`` and ``10**frac_len`` (<= 10**24) are exact there, so the quotient
    has one rounding (relative error <= 2**-64) and its distance to ``f`` is
    exact; a row is decided when that distance is 2**-58 * |f| clear of the half-ulp
    bounds (which are >= 2**-54 * |f|).  Platforms without such a long double
    decide nothing here; those rows go to Python's ``float``.
    """
    index = np.flatnonzero(rows)
    if not index.size or np.finfo(np.longdouble).nmant < 63:
        return
    f = magnitude[index]
    quotient = mantissa[index].astype(np.longdouble) / _pow10_ld()[frac_len[index]]
    distance = quotient - f.astype(np.longdouble)
    mant, exp2 = np.frexp(f.astype(np.float64))
    up = np.ldexp(0.5, exp2 - 53).astype(np.longdouble)
    down = np.where(mant == 0.5, up / 2, up)
    slack = quotient * np.longdouble(2.0**-58)
    inside = (distance < up - slack) & (distance > -down + slack)
    outside = (distance > up + slack) | (distance < -down - slack)
    usable = (f > 0) & np.isfinite(f) & (inside | outside)
    into[0][index] = usable
    into[1][index] = usable & inside


@functools.cache
def _pow10_ld() -> npt.NDArray[np.longdouble]:
    """10**0..10**24, all exact in a 64-bit-significand long double."""
    return np.array([np.longdouble(10**n) for n in range(25)], dtype=np.longdouble)


def _nondigit_bits(lanes: U64) -> tuple[U64, U64]:
    """(bit ``c`` set where byte ``c`` of the row's 4 lanes is not an ASCII digit, the
    lanes XOR ``'0'``: the digit values where the bytes are digits)."""
    t = lanes ^ _ZEROS
    high = np.uint64(0x8080808080808080)
    flags = (((t & ~high) + np.uint64(0x7676767676767676)) | t) & high
    packed = ((flags >> np.uint64(7)) * np.uint64(0x0102040810204080)) >> np.uint64(56)
    bits = np.ascontiguousarray(packed.astype(np.uint8)).view("<u4")[:, 0].astype(np.uint64)
    return bits, t


def exact_logprobs(body: bytes, number: Bytes, start: I64, end: I64) -> npt.NDArray[np.float32]:
    """The logprobs in ``[start, end)`` (right-aligned in ``number``), exact, or defer."""
    length = end - start
    if length.min() < 1 or length.max() > 31:
        raise FastPathDeferred
    bits, digit_lanes = _nondigit_bits(number.view(np.uint64)[:, :4])
    bits >>= (32 - length).astype(np.uint64)
    flat, base = number.ravel(), np.arange(length.size) * number.shape[1]
    neg = flat[base + 32 - length] == 0x2D
    rest = bits & ~neg.astype(np.uint64)
    dot_at = _bit_index(rest)
    is_float = rest != 0
    int_len = np.where(is_float, dot_at, length) - neg
    frac_len = np.where(is_float, length - 1 - dot_at, 0)
    first = 32 - length + neg
    fast = ((rest & (rest - np.uint64(1))) == 0) & (int_len >= 1) & (int_len <= 8)
    fast &= ~is_float | ((flat[base + _clamp(first + int_len, 0, 31)] == 0x2E) & (frac_len >= 1))
    zero = flat[base + first] == 0x30
    fast &= ~((int_len > 1) & zero) & (first + int_len >= 8) & (frac_len <= 24)
    fast &= (int_len + frac_len <= 19) | ((int_len == 1) & zero)
    mantissa, fits = _mantissas(
        number, digit_lanes, first + int_len, np.where(fast, int_len, 0), frac_len
    )
    fast &= fits
    approx = mantissa.astype(np.float64) / _POW10_F[np.minimum(frac_len, 22)]
    if frac_len.max() > 22:
        approx /= _POW10_F[_clamp(frac_len - 22, 0, 2)]
    magnitude = approx.astype(np.float32)
    clinger = fast & (mantissa <= np.uint64(1 << 53)) & (frac_len <= 22)
    exact = clinger & (magnitude.astype(np.float64) == approx)
    decided = np.zeros(length.size, dtype=bool)
    proof = np.flatnonzero(fast & ~clinger)  # Clinger decides most of vLLM's numbers
    if proof.size:
        got, proved = _prove_float32(mantissa[proof], frac_len[proof], magnitude[proof])
        decided[proof] = got
        exact[proof] |= got & proved
    if proof.size:
        undecided = fast & ~clinger & ~decided
        _prove_extended(mantissa, frac_len, magnitude, undecided, (decided, exact))
    if (fast & ~exact & (clinger | decided)).any() or (fast & ~neg & (mantissa != 0)).any():
        raise FastPathDeferred
    values: npt.NDArray[np.float32] = np.where(neg, -magnitude, magnitude).astype(np.float32)
    values[~neg] = 0.0  # "-0" stays -0.0: serde_json reads an integer -0 as the float -0.0
    for row in np.flatnonzero(~exact).tolist():
        values[row] = _slow_logprob(body[int(start[row]) : int(end[row])])
    return values


def valid_logprobs(number: Bytes, length: I64) -> I64:
    """The rows whose logprob text is not passed in bulk (``parse.check_logprob``'s rule).

    Validation only (the teacher endpoint relays the teacher's bytes, so it needs no
    float32 column): a JSON number that is ``<= 0`` and finite as float32.  Decided in
    bulk for the forms vLLM writes, all negative: ``-I``, ``-I.F``, ``-I.Fe-X`` and
    ``-Ie-X`` (``I`` at most 30 digits without a leading zero, so the magnitude is below
    ``10**30``, far inside float32); anything else (a zero without a sign, a positive
    exponent, a malformed text) is returned, for the caller to check one by one with
    ``JSON_NUMBER`` and ``parse.check_logprob``'s bounds.  ``number`` holds each number
    right-aligned in its first 32 bytes, ``length`` bytes long.
    """
    if length.min() < 1 or length.max() > 31:
        raise FastPathDeferred
    bits, _ = _nondigit_bits(number.view(np.uint64)[:, :4])
    bits >>= (32 - length).astype(np.uint64)
    flat, first = number.ravel(), np.arange(length.size) * number.shape[1] + 32 - length
    # The common spelling first, in few passes: "-I.F" (the sign and one dot).
    dot = bits & ~np.uint64(1)
    a = _bit_index(dot)  # the dot's offset, when it is the one non-digit after the sign
    plain = (flat[first] == 0x2D) & ((bits & np.uint64(1)) != 0) & ((dot & (dot - 1)) == 0)
    plain &= (a >= 2) & (a <= length - 2) & (flat[first + np.minimum(a, length - 1)] == 0x2E)
    plain &= (a == 2) | (flat[first + 1] != 0x30)
    others = np.flatnonzero(~plain)
    if not others.size:
        return others
    left: I64 = others[_valid_logprobs_general(number[others], length[others], bits[others])]
    return left


def _valid_logprobs_general(number: Bytes, length: I64, bits: U64) -> I64:
    """``valid_logprobs`` for every form it passes in bulk; ``bits`` its non-digit flags."""
    flat, first = number.ravel(), np.arange(length.size) * number.shape[1] + 32 - length
    neg = flat[first] == 0x2D
    one = np.uint64(1)
    rest = bits & ~neg.astype(np.uint64)  # the non-digits after the sign, lowest first
    rest2 = rest & (rest - one)
    rest3 = rest2 & (rest2 - one)
    a, b, c = _bit_index(rest), _bit_index(rest2), _bit_index(rest3)

    def byte_at(offset: I64) -> Bytes:
        picked: Bytes = flat[first + np.minimum(np.maximum(offset, 0), length - 1)]
        return picked

    at_a, at_b = byte_at(a), byte_at(b)
    dot_a, exp_a, exp_b = at_a == 0x2E, (at_a | 0x20) == 0x65, (at_b | 0x20) == 0x65
    int_len = np.where(a >= 0, a, length) - 1
    plain = (rest2 == 0) & ((a < 0) | (dot_a & (a <= length - 2)))
    minus_exponent = (c == b + 1) & (byte_at(c) == 0x2D) & (c <= length - 2)
    fraction_exponent = ((rest3 & (rest3 - one)) == 0) & dot_a & exp_b & (b >= a + 2)
    fraction_exponent &= minus_exponent
    bare_exponent = (rest3 == 0) & exp_a & (b == a + 1) & (at_b == 0x2D) & (b <= length - 2)
    ok = neg & (int_len >= 1) & (plain | fraction_exponent | bare_exponent)
    ok &= (int_len == 1) | (byte_at(np.ones_like(a)) != 0x30)  # no leading zero
    left: I64 = np.flatnonzero(~ok)
    return left


def _slow_logprob(text: bytes) -> float:
    """One number the vectorized path left undecided, with Python's exact ``float``."""
    match = JSON_NUMBER.fullmatch(text)
    if match is None:
        raise FastPathDeferred
    try:
        value = float(text)  # an integer literal too: "-0" is -0.0, as serde_json reads it
    except ValueError as exc:
        raise FastPathDeferred from exc
    if not (-math.inf < value <= 0.0) or array("f", [value])[0] != value:
        raise FastPathDeferred
    return value
