"""The model sizes of the stochround torchtitan configs (both torchtitan APIs).

``debugmodel`` is torchtitan's Llama 3 debug model (dim 256, 6 layers, 16 heads in 0.2.2;
its config in 0.3.0); `SIZES` are the others, as ``(dim, layers, heads)``: ~100M parameters
at GPT-2-small widths, and a tiny one for tests on the CPU.
"""

from __future__ import annotations

SIZES: dict[str, tuple[int, int, int]] = {"100M": (768, 14, 12), "tiny": (64, 2, 4)}
FLAVORS: tuple[str, ...] = ("debugmodel", *SIZES)


def check_flavor(flavor: str) -> str:
    """``flavor`` if it is one of `FLAVORS`, else ValueError naming them."""
    if flavor not in FLAVORS:
        raise ValueError(f"flavor must be one of {', '.join(FLAVORS)}; got {flavor!r}")
    return flavor


__all__ = ["FLAVORS", "SIZES", "check_flavor"]
