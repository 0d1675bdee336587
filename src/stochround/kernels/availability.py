"""Whether the Triton kernels can serve a call: the one check that rounding, arithmetic and
the optimizers share, made without importing a kernel module.

The kernels run where Triton is importable and the call's tensors lie on a CUDA device, or
anywhere under Triton's interpreter (``TRITON_INTERPRET=1``, read once, as Triton reads it
when a kernel is defined).  What else a kernel needs (input dtypes, formats, layouts) its
own module says (`kernels.rounding.unsupported`, `kernels.matmul.unsupported`, and the
optimizers' own checks of a parameter).
"""

from __future__ import annotations

import functools
import os

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def triton_missing() -> str | None:
    """Why Triton cannot be imported (None if it can); tried once per process."""
    try:
        import triton  # noqa: F401 - imported only to learn whether it can be
    except ImportError as error:
        return f"triton is not importable ({error})"
    return None


def kernels_refusal(tensor: str, on_cuda: bool) -> str | None:
    """Why no Triton kernel can serve a call whose tensor (named ``tensor`` in the message)
    is on a CUDA device or not (None if the kernels can run there)."""
    if not (on_cuda or INTERPRETED):
        return f"{tensor} is not a CUDA tensor (set TRITON_INTERPRET=1 to run kernels on the CPU)"
    return triton_missing()


__all__ = ["INTERPRETED", "kernels_refusal", "triton_missing"]
