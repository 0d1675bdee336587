"""Random Hadamard transforms (RHT): the orthonormal Walsh-Hadamard transform of consecutive
groups of ``size`` values along an axis, after a ±1 sign flip per position.

For a group ``x`` of ``n = size`` values and signs ``s`` (±1, length ``n``)::

    y = M · diag(s) · x,        x = diag(s) · M · y,        M = H_n / sqrt(n)

with ``H_n`` the Sylvester-order Hadamard matrix, ``H_n[i, j] = (-1)**popcount(i & j)``
(``H_1 = [1]``, ``H_2m = [[H_m, H_m], [H_m, -H_m]]``). ``M`` is symmetric and orthogonal
(``M M = I``), so the inverse is the same transform with the signs applied last. Block
quantization rotates blocks with it before scaling: the rotation spreads an outlier over
the group, which shrinks the block's amax relative to its typical value (Tseng et al.,
"Training LLMs with MXFP4", 2025).

The arithmetic is fixed, so that the CPU, a GPU and the Triton kernels give the same bits
(a matrix product's summation order is unspecified, so none is used). `hadamard_fp32` is
that definition, on float32 values:

1. multiply by the signs (exact: they are ±1);
2. the fast Walsh-Hadamard butterfly, ``h = 1, 2, 4, ..., n/2`` in this order: within each
   run of ``2h`` consecutive values, the pair ``(a, b) = (v[j], v[j + h])`` for ``j`` in the
   run's first half becomes ``(a + b, a - b)``, each a float32 addition;
3. one float32 multiplication by ``NORMALIZATION[n]``: ``2**(-log2(n)/2)``, exact for
   ``n = 16, 64, 256``; for ``n = 32, 128`` the float32 nearest to ``1/sqrt(n)``, which is
   ``fl32(sqrt(2)) * 2**-3`` and ``* 2**-4`` (one rounding, of ``sqrt(2)``).

The inverse (`inverse_hadamard_fp32`) does steps 2 and 3, then step 1.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

from .. import random as streams
from ..block_constants import HADAMARD_SIZES, SQRT2_FP32
from ..kernels.availability import use_kernel

__all__ = [
    "HADAMARD_DTYPES",
    "NORMALIZATION",
    "check_signs",
    "check_size",
    "hadamard",
    "hadamard_fp32",
    "inverse_hadamard",
    "inverse_hadamard_fp32",
    "random_signs",
]

HADAMARD_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def _normalization(size: int, sqrt2: float) -> float:
    """``2**(-log2(size)/2)``: a power of two for even ``log2(size)``, otherwise ``sqrt2``
    scaled by a power of two (exact, so the only rounding is that of ``sqrt2``)."""
    log_size = size.bit_length() - 1
    if log_size % 2 == 0:
        return math.ldexp(1.0, -log_size // 2)
    return math.ldexp(sqrt2, -(log_size + 1) // 2)


# 1/sqrt(n) as float32 values, and as float64 values for float64 inputs (which `hadamard`
# transforms in float64)
NORMALIZATION: dict[int, float] = {n: _normalization(n, SQRT2_FP32) for n in HADAMARD_SIZES}
NORMALIZATION_FP64: dict[int, float] = {
    n: _normalization(n, math.sqrt(2.0)) for n in HADAMARD_SIZES
}


def check_size(size: object) -> int:
    """``size`` if it is one of `HADAMARD_SIZES` (TypeError if not an int, ValueError if not
    one of them)."""
    if isinstance(size, bool) or not isinstance(size, numbers.Integral):
        raise TypeError(f"size must be an int, got {type(size).__name__}")
    if int(size) not in HADAMARD_SIZES:
        allowed = ", ".join(str(n) for n in HADAMARD_SIZES)
        raise ValueError(f"size must be a power of two in {allowed}; got {size}")
    return int(size)


def check_signs(signs: object, size: int, device: torch.device) -> Tensor:
    """``signs`` as a float32 tensor on ``device``, if it is a 1-D tensor of ``size`` values
    each +1 or -1 (of a floating or integer dtype, on ``device``). The values are checked
    in eager mode only: under `torch.compile` the check would need the data (as the
    rounding functions skip their data checks there). TypeError/ValueError name ``signs``."""
    if not isinstance(signs, Tensor):
        raise TypeError(f"signs must be a torch.Tensor or None, got {type(signs).__name__}")
    if signs.dtype == torch.bool or signs.is_complex():
        raise TypeError(f"signs must be a real tensor of ±1 values, got {signs.dtype}")
    if tuple(signs.shape) != (size,):
        raise ValueError(
            f"signs must have shape ({size},) for size={size}; got {tuple(signs.shape)}"
        )
    if signs.device != device:
        raise ValueError(f"signs must be on x's device ({device}); got {signs.device}")
    if not torch.compiler.is_compiling() and not bool((signs.abs() == 1).all()):
        raise ValueError("signs must hold only +1 and -1 values")
    return signs.to(torch.float32)


def _check_axis(axis: object, ndim: int) -> int:
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"axis must be an int, got {type(axis).__name__}")
    if not -ndim <= int(axis) < ndim:
        raise ValueError(f"axis must be in [{-ndim}, {ndim}) for a {ndim}-d x; got {axis}")
    return int(axis) % ndim


def _butterfly(values: Tensor, size: int) -> Tensor:
    """The unnormalized fast Walsh-Hadamard transform ``H_size`` of each group of ``size``
    consecutive values along the last axis, stages ``h = 1, 2, ..., size/2`` in order, in
    the dtype of ``values``."""
    shape = values.shape
    h = 1
    while h < size:
        # (..., runs, 2, h): [..., r, 0, j] = v[j], [..., r, 1, j] = v[j + h] of run r
        pairs = values.reshape(*shape[:-1], shape[-1] // (2 * h), 2, h)
        first, second = pairs[..., 0, :], pairs[..., 1, :]
        values = torch.stack((first + second, first - second), dim=-2).reshape(shape)
        h *= 2
    return values


def _flip(values: Tensor, size: int, signs: Tensor | None) -> Tensor:
    """``values`` times ``signs`` in each group of ``size`` along the last axis (exact)."""
    if signs is None:
        return values
    groups = values.reshape(*values.shape[:-1], values.shape[-1] // size, size)
    return (groups * signs).reshape(values.shape)


def _rotate(
    values: Tensor, size: int, signs: Tensor | None, normalization: float, *, inverse: bool
) -> Tensor:
    """The forward (signs, butterfly, normalization) or inverse (butterfly, normalization,
    signs) transform in the dtype of ``values`` and ``signs``."""
    if not inverse:
        values = _flip(values, size, signs)
    values = _butterfly(values, size) * normalization
    return _flip(values, size, signs) if inverse else values


def hadamard_fp32(values: Tensor, size: int, signs: Tensor | None = None) -> Tensor:
    """The forward transform ``M · diag(signs) · v`` of each group of ``size`` consecutive
    float32 values along the last axis, by the fixed float32 arithmetic of the module
    docstring (signs, butterfly, normalization): the definition the kernels implement.

    ``values`` is a float32 tensor whose last dimension is a multiple of ``size`` (one of
    `HADAMARD_SIZES`); ``signs`` a float32 tensor of ``size`` ±1 values on its device, or
    None for no sign flip. Unchecked (the callers check): returns a float32 tensor shaped
    like ``values``.
    """
    return _rotate(values, size, signs, NORMALIZATION[size], inverse=False)


def inverse_hadamard_fp32(values: Tensor, size: int, signs: Tensor | None = None) -> Tensor:
    """The inverse transform ``diag(signs) · M · v`` of each group of ``size`` consecutive
    float32 values along the last axis: butterfly, normalization, then the signs (module
    docstring). Arguments and result as `hadamard_fp32`'s."""
    return _rotate(values, size, signs, NORMALIZATION[size], inverse=True)


def _transform(
    x: object, size: object, signs: object, axis: object, *, inverse: bool, name: str
) -> Tensor:
    """The checked body of `hadamard` and `inverse_hadamard` (``name`` is x's argument name
    in errors)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in HADAMARD_DTYPES:
        allowed = ", ".join(str(dtype) for dtype in HADAMARD_DTYPES)
        raise TypeError(f"{name} must have a floating dtype ({allowed}); got {x.dtype}")
    size = check_size(size)
    dim = _check_axis(axis, x.dim())
    length = x.shape[dim]
    if length % size != 0:
        raise ValueError(
            f"size={size} must divide the length of axis {axis} of {name}; got length {length}"
        )
    sign_values = None if signs is None else check_signs(signs, size, x.device)
    moved = x.movedim(dim, -1)
    if x.dtype == torch.float64:  # float64 keeps its precision: the same steps in float64
        sign64 = None if sign_values is None else sign_values.to(torch.float64)
        result = _rotate(moved, size, sign64, NORMALIZATION_FP64[size], inverse=inverse)
    else:
        core = inverse_hadamard_fp32 if inverse else hadamard_fp32
        result = core(moved.to(torch.float32), size, sign_values).to(x.dtype)
    return result.movedim(-1, dim)


def hadamard(x: Tensor, size: int, *, signs: Tensor | None = None, axis: int = -1) -> Tensor:
    """The random Hadamard transform ``y = M · diag(signs) · x`` (``M = H_size / sqrt(size)``,
    Sylvester order) of each group of ``size`` consecutive values of ``x`` along ``axis``.

    Args:
        x: a float64, float32, bfloat16 or float16 tensor (TypeError otherwise). float32,
            bfloat16 and float16 values are transformed in float32 by `hadamard_fp32`'s fixed
            arithmetic and the result is rounded (to nearest-even) back to x's dtype;
            float64 values by the same steps in float64.
        size: the group length, a power of two from 16 to 256 (`HADAMARD_SIZES`); it must
            divide the length of ``axis`` (ValueError otherwise).
        signs: a 1-D tensor of ``size`` values, each +1 or -1, on x's device (for instance
            `random_signs`), or None for all +1 (the plain Walsh-Hadamard transform).
        axis: the axis along which the groups run.

    Returns a tensor of x's shape and dtype. `inverse_hadamard` with the same ``size``,
    ``signs`` and ``axis`` gives x back up to rounding. Traceable by
    ``torch.compile(fullgraph=True)`` (there the sign values are not checked).
    """
    return _transform(x, size, signs, axis, inverse=False, name="x")


def inverse_hadamard(
    y: Tensor, size: int, *, signs: Tensor | None = None, axis: int = -1
) -> Tensor:
    """The inverse of `hadamard`: ``x = diag(signs) · M · y`` for each group of ``size``
    consecutive values of ``y`` along ``axis`` (``M`` is symmetric and orthogonal, so the
    inverse is the same butterfly with the signs applied after it).

    Args:
        y: a float64, float32, bfloat16 or float16 tensor, transformed as in `hadamard`
            (float32 arithmetic for the three narrower dtypes, result in y's dtype).
        size: the group length, one of `HADAMARD_SIZES`, dividing the length of ``axis``.
        signs: the ``size`` ±1 values the forward transform used (on y's device), or None.
        axis: the axis along which the groups run.

    Returns a tensor of y's shape and dtype.
    """
    return _transform(y, size, signs, axis, inverse=True, name="y")


def _signs_kernel_refusal() -> str | None:
    """Why the Philox kernel does not draw the signs' words (None if it may): under
    torch.compile the PyTorch path draws them in the graph."""
    if torch.compiler.is_compiling():
        return "under torch.compile the signs' words are drawn in the graph"
    return None


def random_signs(
    size: int,
    seed: int | Tensor = 0,
    *,
    offset: int | Tensor = 0,
    device: torch.device | str | None = None,
) -> Tensor:
    """``size`` random signs from the core stream: sign ``i`` is ``+1`` when the top bit of
    ``random_words(i, seed, offset)`` (`stochround.random`) is 0 and ``-1`` when it is 1.

    Args:
        size: the number of signs, a positive int (for `hadamard`, one of `HADAMARD_SIZES`).
        seed: the stream's seed, an int in ``[0, 2**64)`` or a 0-d int64 tensor.
        offset: the stream's offset, same kinds as ``seed``.
        device: where the result lives (default: the CPU, or a tensor seed's device).

    Returns a float32 tensor of shape ``(size,)``; the same on every device, since the words
    are a pure function of ``(seed, offset, i)``.
    """
    if isinstance(size, bool) or not isinstance(size, numbers.Integral):
        raise TypeError(f"size must be an int, got {type(size).__name__}")
    if size < 1:
        raise ValueError(f"size must be a positive int, got {size}")
    seed = streams.check_seed(seed, "seed")
    offset = streams.check_seed(offset, "offset")
    if device is None:
        device = seed.device if isinstance(seed, Tensor) else torch.device("cpu")
    index = torch.arange(int(size), dtype=torch.int64, device=device)
    if use_kernel("auto", "index", index.is_cuda, _signs_kernel_refusal()):
        # one launch instead of the PyTorch path's Philox rounds (dozens of small
        # operations): the same words (`stochround.kernels.philox`, tested equal)
        from ..kernels.philox import random_words_triton  # needs triton: imported here

        words = random_words_triton(index, seed, offset)
    else:
        words = streams.random_words(index, seed, offset)
    return (1 - 2 * (words >> 31)).to(torch.float32)
