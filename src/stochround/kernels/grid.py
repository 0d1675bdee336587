"""Launch-grid arithmetic on the host, in plain ints.

Triton 3.6 makes ``triton.cdiv`` and ``triton.next_power_of_2`` constexpr functions,
whose every host call unwraps its arguments; a rounding call computes several grid sizes
on its host path, so the launchers use these plain-int versions instead.
"""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for integers a >= 0, b > 0."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The least power of two >= n, for integers n >= 1."""
    return 1 << (n - 1).bit_length()
