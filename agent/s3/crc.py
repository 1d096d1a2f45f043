"""CRC32 (zlib's, the one Cassandra writes to Digest.crc32) of a file from the CRC32s of its parts.

A file fetched in ranged parts has each part's CRC32 taken as it is written; joining them gives the
file's CRC32 without reading the file back. The standard library has no `crc32_combine`, so it is
done here from the algebra of the CRC:

- CRC32 works on polynomials over GF(2) in reflected bit order: bit 31 of a word is the coefficient
  of x^0 and bit 0 that of x^31. Products are taken modulo the CRC's polynomial P.
- Appending `n` bytes B to data A gives `crc(A + B) = crc(A) * x^(8n) mod P  XOR  crc(B)`: the
  pre- and post-conditioning (the 0xFFFFFFFF zlib applies at both ends) cancel out in that sum.
- x^(8n) mod P is found by repeated squaring: the table holds x^(2^k) mod P for k < 32 (the
  powers repeat with period dividing 2^32 - 1, so k is taken modulo 32 for huge lengths), and
  8n = sum of 2^k over the bits set in 8n.

Cost: a few hundred integer operations per part, whatever its size.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

try:
    # zlib-ng's CRC32 (SIMD carry-less multiplication): the same values as zlib's, about 20 times
    # faster. With zlib's, the CRC32 of every Data.db downloaded took 10-20 % of the download's CPU.
    from zlib_ng.zlib_ng import crc32 as _crc32
except ImportError:  # a dependency, but the standard library's gives the same values
    _crc32 = zlib.crc32

#: `crc32(data, value=0)`: CRC32 of `data` continuing from `value` (zlib's semantics; releases the
#: GIL on large buffers).
crc32: Callable[..., int] = _crc32

#: The CRC32 polynomial, reflected (x^32 is implicit).
_POLY = 0xEDB88320
#: x^0 in reflected order.
_ONE = 1 << 31


def _multiply(a: int, b: int) -> int:
    """a * b mod P (reflected order): for each power of x present in `a`, add `b` times it."""
    product = 0
    bit = _ONE
    while a:
        if a & bit:
            product ^= b
            a ^= bit
        bit >>= 1
        # b *= x: a shift towards higher powers (rightwards when reflected), reduced by P.
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
    return product


def _powers() -> tuple[int, ...]:
    """x^(2^k) mod P for k = 0..31."""
    power = _ONE >> 1  # x^1
    table = []
    for _ in range(32):
        table.append(power)
        power = _multiply(power, power)
    return tuple(table)


_X_POW_2K = _powers()


def _x_to_8n(length: int) -> int:
    """x^(8 * length) mod P."""
    result = _ONE
    exponent = 3  # 8 = 2^3: bit i of `length` stands for x^(2^(i + 3))
    while length:
        if length & 1:
            result = _multiply(_X_POW_2K[exponent % 32], result)
        length >>= 1
        exponent += 1
    return result


def crc32_combine(crc_first: int, crc_second: int, length_second: int) -> int:
    """The CRC32 of two byte strings joined, from the CRC32 of each and the second's length."""
    if length_second < 0:
        raise ValueError(f"length {length_second} < 0")
    return _multiply(_x_to_8n(length_second), crc_first) ^ crc_second


def crc32_of_parts(parts: list[tuple[int, int]]) -> int:
    """The CRC32 of parts laid end to end, given each part's (CRC32, length) in order."""
    crc = 0
    for part_crc, length in parts:
        crc = crc32_combine(crc, part_crc, length)
    return crc
