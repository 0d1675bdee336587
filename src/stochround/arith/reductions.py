"""Reductions with a chosen accumulator format: `sum`, `dot` and `matmul`, every addition
one `add` or `sub` (the exact sum rounded once), in the accumulation order the caller picks.

A reduction is a sequence of *steps*; step t rounds one tensor of partial sums, shaped
(*batch, w_t), once to ``fmt`` (one `add`/`sub`, or the initial rounding of inputs into
the accumulator).  Random bits: step t draws the words of stream
(seed, (offset + t) mod 2**64, flat row-major index in that (*batch, w_t) tensor), so
every (seed, offset + t, index) triple is used once and a call consumes offsets
offset .. offset + steps - 1 (`reduction_rand_shape` gives steps).  With explicit
``rand`` (shape (steps, *batch, width)) step t reads rand[t, ..., :w_t].

Gradients (`stochround.arith.gradients`): the steps run outside autograd, and the result
carries the exact reduction's derivative (torch's sum, sum of products, matmul), whatever
the order, the accumulator and the products' format.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor

from .. import random as streams
from .. import rounding
from ..formats import Format
from ..formats import format as find_format
from ..kernels.availability import check_backend, kernels_refusal, use_kernel
from ..reference import check_choice, check_mode
from .checks import check_operands, eager_only, format_and_mode, operands
from .elementwise import add, finish, round_pair, sub
from .gradients import with_exact_gradient

__all__ = ["ORDERS", "dot", "matmul", "reduction_rand_shape", "sum"]

ORDERS = ("recursive", "pairwise", "blocked", "compensated")
_TWO_POW_64 = 1 << 64


def _check_order(order: str, block: int) -> None:
    check_choice("order", order, ORDERS)
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be an int >= 1; got {block!r}")


def _steps_and_width(length: int, order: str, block: int) -> tuple[int, int]:
    """(number of rounding steps, widest partial-sum tensor) of one reduction."""
    if order == "recursive":
        return length, 1
    if order == "pairwise":
        return 1 + (length - 1).bit_length(), length  # 1 + ceil(log2 length)
    if order == "blocked":
        blocks = -(-length // block)
        return min(block, length) + blocks - 1, blocks
    return 1 + 4 * (length - 1), 1  # compensated: 4 roundings per Kahan step


def reduction_rand_shape(
    batch_shape: tuple[int, ...] | torch.Size,
    length: int,
    order: str = "recursive",
    block: int = 32,
) -> tuple[int, ...]:
    """The shape (steps, *batch_shape, width) of ``rand`` for `sum` of ``length`` terms;
    steps is also the number of stream offsets a `sum` consumes (`dot`: one more)."""
    _check_order(order, block)
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"length must be an int >= 1; got {length!r}")
    steps, width = _steps_and_width(length, order, block)
    return (steps, *tuple(batch_shape), width)


def _check_dim(dim: int, ndim: int) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int) or not -ndim <= dim < ndim:
        raise ValueError(f"dim must be an int in [{-ndim}, {ndim}) for {ndim}-d input; got {dim!r}")
    return dim % ndim


def _check_reduction_rand(
    rand: object, batch: tuple[int, ...], length: int, order: str, block: int, name: str
) -> Tensor | str | None:
    if rand is None or isinstance(rand, str):
        return rand
    if not isinstance(rand, Tensor):
        raise TypeError(f"{name} must be an integer torch.Tensor, 'data' or None")
    shape = reduction_rand_shape(batch, length, order, block)
    try:
        return torch.broadcast_to(rand, shape)
    except RuntimeError:
        raise ValueError(
            f"{name} of shape {tuple(rand.shape)} does not broadcast to (steps, *batch, width) "
            f"= {shape} (order={order!r}, length={length})"
        ) from None


class _Stepper:
    """Rounds step t's partial sums with step t's random bits (see the module docstring)."""

    def __init__(self, fmt: Format, mode: str, options: dict, rand: Tensor | str | None):
        self.fmt, self.mode, self.options, self.rand = fmt, mode, options, rand

    def _options(self, t: int, width: int) -> dict:
        options = dict(self.options)
        offset = options["offset"]
        options["offset"] = offset + t if isinstance(offset, Tensor) else (offset + t) % _TWO_POW_64
        if isinstance(self.rand, Tensor):
            options["rand"] = self.rand[t, ..., :width]
        else:
            options["rand"] = self.rand
        return options

    def round(self, values: Tensor, t: int) -> Tensor:
        options = self._options(t, values.shape[-1])
        return rounding.round_float64(values, self.fmt, self.mode, **options)

    def add(self, a: Tensor, b: Tensor, t: int) -> Tensor:
        return add(a, b, self.fmt, self.mode, **self._options(t, a.shape[-1]))

    def sub(self, a: Tensor, b: Tensor, t: int) -> Tensor:
        return sub(a, b, self.fmt, self.mode, **self._options(t, a.shape[-1]))


def _reduce(values: Tensor, order: str, block: int, step: _Stepper) -> Tensor:
    """Reduce float64 ``values`` (*batch, n) over the last dim; float64 (*batch,)."""
    n = values.shape[-1]
    if order == "recursive":
        total = step.round(values[..., 0:1], 0)
        for i in range(1, n):
            total = step.add(total, values[..., i : i + 1], i)
        return total[..., 0]
    if order == "pairwise":
        level = step.round(values, 0)
        t = 1
        while level.shape[-1] > 1:
            width = level.shape[-1]
            pairs = width // 2
            sums = step.add(level[..., 0 : 2 * pairs : 2], level[..., 1 : 2 * pairs : 2], t)
            level = torch.cat([sums, level[..., -1:]], dim=-1) if width % 2 else sums
            t += 1
        return level[..., 0]
    if order == "blocked":
        blocks = -(-n // block)
        inner = min(block, n)
        padded = torch.nn.functional.pad(values, (0, blocks * block - n))
        terms = padded.reshape(*values.shape[:-1], blocks, block)
        starts = torch.arange(blocks, device=values.device) * block
        partial = step.round(terms[..., 0], 0)
        for j in range(1, inner):
            # lanes past the end of the last block keep their sum (their bits are unused)
            partial = torch.where(starts + j < n, step.add(partial, terms[..., j], j), partial)
        total = partial[..., 0:1]
        for u in range(1, blocks):
            total = step.add(total, partial[..., u : u + 1], inner + u - 1)
        return total[..., 0]
    # compensated (Kahan): y = x_i - c; t = s + y; c = (t - s) - y; s = t
    total = step.round(values[..., 0:1], 0)
    compensation = torch.zeros_like(total)
    for i in range(1, n):
        base = 1 + 4 * (i - 1)
        corrected = step.sub(values[..., i : i + 1], compensation, base)
        new_total = step.add(total, corrected, base + 1)
        compensation = step.sub(step.sub(new_total, total, base + 2), corrected, base + 3)
        total = new_total
    return total[..., 0]


def _sum_options(
    mode: str,
    rbits: int | None,
    variant: str,
    sat: str,
    seed: int | Tensor | None,
    offset: int | Tensor,
) -> dict:
    """The rounding options of every step; in SR, one seed drawn for the whole call."""
    mode = check_mode(mode)
    if mode == "sr" and seed is None:
        seed = streams.default_seed()  # one seed for the whole reduction
    if mode == "sr":
        streams.check_seed(seed, "seed")
    streams.check_seed(offset, "offset")
    return dict(rbits=rbits, variant=variant, sat=sat, seed=seed, offset=offset)


@eager_only
def sum(  # noqa: A001 - the reduction's public name, as torch.sum's
    x: Tensor,
    fmt: Format | str,
    mode: str = "rne",
    *,
    dim: int = -1,
    order: str = "recursive",
    block: int = 32,
    rbits: int | None = None,
    variant: str = "c",
    sat: str = "none",
    seed: int | Tensor | None = None,
    offset: int | Tensor = 0,
    rand: Tensor | str | None = None,
) -> Tensor:
    """Sum ``x`` over ``dim`` with an accumulator in ``fmt``, every addition one `add` (the
    exact sum rounded once); vectorized over the other dims.  Result in x's dtype (exact
    when fmt's values fit it; pass float32/float64 x for accumulators wider than x).

    Orders, for terms x_1..x_n (step 0 rounds the inputs into fmt; a no-op when they are
    fmt values):

    - ``recursive``: s = round(x_1); s = round(s + x_i) for i = 2..n.  n steps.
    - ``pairwise``: leaves round(x_i); each level adds adjacent pairs, round(a + b), an odd
      last element carried to the next level.  1 + ceil(log2 n) steps.
    - ``blocked``: recursive inside blocks of ``block`` terms (all blocks at once), then
      recursive over the block sums.  min(block, n) + ceil(n / block) - 1 steps.
    - ``compensated``: Kahan, s and c both held in fmt: y = round(x_i - c),
      t = round(s + y), c = round(round(t - s) - y), s = t.  1 + 4 (n - 1) steps.

    Random bits (``mode="sr"``): step t rounds a (*batch, w_t) tensor with stream
    (seed, offset + t), element indices row-major in that tensor; seed None draws one seed
    for the whole call.  ``rand``: integers of shape `reduction_rand_shape` (steps, *batch,
    width), step t reading rand[t, ..., :w_t] (w_t = 1 for recursive and compensated, the
    number of pair sums or of blocks otherwise), or ``"data"`` (hashed per step).

    Gradient: torch.sum's over ``dim`` (1 for every term), straight through the roundings.
    """
    rounding.check_input(x)
    fmt, mode = format_and_mode(fmt, mode)
    _check_order(order, block)
    checked_dim = _check_dim(dim, x.ndim) if x.ndim else None  # None: 0-d x, one term
    values = x.detach().to(torch.float64)
    values = values.reshape(1) if checked_dim is None else values.movedim(checked_dim, -1)
    if values.shape[-1] == 0:
        raise ValueError(f"x has no elements along dim {checked_dim}: nothing to sum")
    options = _sum_options(mode, rbits, variant, sat, seed, offset)
    rand = _check_reduction_rand(
        rand, tuple(values.shape[:-1]), values.shape[-1], order, block, "rand"
    )
    total = _reduce(values, order, block, _Stepper(fmt, mode, options, rand))
    exact = torch.sum if checked_dim is None else functools.partial(torch.sum, dim=checked_dim)
    return with_exact_gradient(finish(total, x.dtype), exact, x)


def _split_rand(rand: object) -> tuple[object, object]:
    """dot's ``rand`` as (product rand, sum rand)."""
    if isinstance(rand, str) or rand is None:
        return rand, rand
    if isinstance(rand, tuple) and len(rand) == 2:
        return rand
    raise TypeError("rand must be None, 'data' or a pair (product_rand, sum_rand)")


@eager_only
def dot(
    x: Tensor,
    y: Tensor,
    fmt: Format | str,
    mode: str = "rne",
    *,
    product_fmt: Format | str | None = None,
    dim: int = -1,
    order: str = "recursive",
    block: int = 32,
    rbits: int | None = None,
    variant: str = "c",
    sat: str = "none",
    seed: int | Tensor | None = None,
    offset: int | Tensor = 0,
    rand: tuple[Tensor | None, Tensor | None] | str | None = None,
) -> Tensor:
    """sum_i x_i y_i over ``dim`` (x, y broadcast): each product is `mul`, the exact product
    rounded once to ``product_fmt`` (None: ``fmt``; ``"exact"``: not rounded, so every
    step is a fused multiply-add of the exact product), then `sum` in ``fmt`` with
    ``order``.  Result in the promoted dtype.

    Random bits: the products, a tensor of the broadcast shape, use stream offset
    ``offset``; the sum uses ``offset + 1 ..`` as `sum` describes.  ``rand``: a pair
    (product integers of the broadcast shape or None, sum integers of `sum`'s rand shape),
    or ``"data"``.

    Gradient: that of ``(x * y).sum(dim)`` with torch (d/dx = y, d/dy = x), straight
    through the roundings of the products and the sums.
    """
    fmt, mode = format_and_mode(fmt, mode)
    _check_order(order, block)
    (a, b), dtype = operands("dot", ("x", "y"), (x, y), wide_ok=False)
    dim = _check_dim(dim, max(a.ndim, 1))
    if a.ndim == 0:
        a, b = a.reshape(1), b.reshape(1)
    product_rand, sum_rand = _split_rand(rand)
    options = _sum_options(mode, rbits, variant, sat, seed, offset)
    products = a * b  # exact: at most 48 significand bits
    if product_fmt != "exact":
        pfmt = fmt if product_fmt is None else find_format(product_fmt)
        product_options = dict(options, rand=product_rand)
        products = round_pair(products, torch.zeros_like(products), pfmt, mode, **product_options)
    elif product_rand is not None and not isinstance(product_rand, str):
        raise ValueError("product_fmt='exact' rounds no products: pass rand=(None, sum_rand)")
    products = products.movedim(dim, -1)
    if products.shape[-1] == 0:
        raise ValueError(f"x and y have no elements along dim {dim}: nothing to sum")
    sum_rand = _check_reduction_rand(
        sum_rand, tuple(products.shape[:-1]), products.shape[-1], order, block, "rand[1]"
    )
    offset = options["offset"]
    options["offset"] = offset + 1 if isinstance(offset, Tensor) else (offset + 1) % _TWO_POW_64
    total = _reduce(products, order, block, _Stepper(fmt, mode, options, sum_rand))
    return with_exact_gradient(finish(total, dtype), functools.partial(_dot, dim=dim), x, y)


def _dot(x: Tensor, y: Tensor, dim: int) -> Tensor:
    """sum(x * y) over ``dim`` with torch: the exact operation whose gradient `dot` carries."""
    return (x * y).sum(dim)


@eager_only
def matmul(
    a: Tensor,
    b: Tensor,
    fmt: Format | str,
    mode: str = "rne",
    *,
    product_fmt: Format | str | None = None,
    order: str = "recursive",
    block: int = 32,
    rbits: int | None = None,
    variant: str = "c",
    sat: str = "none",
    seed: int | Tensor | None = None,
    offset: int | Tensor = 0,
    rand: tuple[Tensor | None, Tensor | None] | str | None = None,
    backend: str = "auto",
) -> Tensor:
    """C[..., i, j] = dot(A[..., i, :], B[..., :, j]) with per-operation rounding, as a
    multiply-accumulate unit with a ``fmt`` accumulator computes it; batch dims broadcast.

    Exactly ``dot(a[..., :, None, :], b.mT[..., None, :, :], dim=-1)``: products form a
    (..., M, N, K) tensor (memory M N K doubles), and ``rand`` is a pair of (..., M, N, K)
    product integers and (steps, ..., M, N, width) sum integers.

    ``backend``: ``"torch"`` computes that definition; ``"triton"`` computes the same bits
    with `stochround.kernels.matmul` (no M N K tensor), and raises ValueError naming what it
    cannot do (pairwise order, explicit ``rand``, formats wider than fp32, float64 inputs;
    CPU tensors only under TRITON_INTERPRET=1); ``"auto"`` uses the kernel for CUDA tensors
    where it can and the PyTorch path otherwise.

    Gradient: torch.matmul's (grad @ b.mT for a, a.mT @ grad for b), on every backend.
    """
    for name, value in (("a", a), ("b", b)):
        if not isinstance(value, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
        if value.ndim < 2:
            raise ValueError(f"{name} must have at least 2 dims; got shape {tuple(value.shape)}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(
            f"the shapes of a{tuple(a.shape)} and b{tuple(b.shape)} do not match for matmul: "
            f"a.shape[-1] = {a.shape[-1]} != b.shape[-2] = {b.shape[-2]}"
        )
    check_backend(backend)
    # the values are computed on detached operands; the result carries torch.matmul's gradient
    exact_a, exact_b = a, b
    a, b = a.detach(), b.detach()
    x, y = a.unsqueeze(-2), b.mT.unsqueeze(-3)
    # `dot`'s keyword arguments besides the seed
    arguments: dict[str, Any] = dict(
        product_fmt=product_fmt, dim=-1, order=order, block=block, rbits=rbits
    )
    arguments.update(variant=variant, sat=sat, offset=offset, rand=rand)
    # K = 0 goes to `dot` on every backend, for its error; "torch" has no kernel to ask about
    if backend == "torch" or a.shape[-1] == 0:
        rounded = dot(x, y, fmt, mode, seed=seed, **arguments)
        return with_exact_gradient(rounded, torch.matmul, exact_a, exact_b)
    # Check the arguments as `dot` does, in its order, and draw the default seed once: a
    # fallback to `dot` then gives the bits and errors it gives on its own.
    fmt, mode = format_and_mode(fmt, mode)
    _check_order(order, block)
    check_operands("dot", ("x", "y"), (x, y), wide_ok=True)
    _split_rand(rand)
    seed = _sum_options(mode, rbits, variant, sat, seed, offset)["seed"]
    exact_products = isinstance(product_fmt, str) and product_fmt == "exact"
    pfmt = None if exact_products else find_format(fmt if product_fmt is None else product_fmt)
    request = rounding.check_request(
        a.new_empty(0), fmt, mode, rbits, variant, sat, seed, offset, None, 0
    )
    refusal = _matmul_kernel_refusal(a, b, fmt, pfmt, order, mode, request.n, rand)
    if use_kernel(backend, "a", a.is_cuda, refusal):
        from ..kernels.matmul import matmul_triton

        rounded = matmul_triton(
            a,
            b,
            fmt,
            pfmt,
            mode,
            order=order,
            block=block,
            n=request.n,
            variant=variant,
            sat=sat,
            seed=seed,
            offset=offset,
        )
    else:
        rounded = dot(x, y, fmt, mode, seed=seed, **arguments)
    return with_exact_gradient(rounded, torch.matmul, exact_a, exact_b)


def _matmul_kernel_refusal(
    a: Tensor,
    b: Tensor,
    fmt: Format,
    product_fmt: Format | None,
    order: str,
    mode: str,
    n: int,
    rand: object,
) -> str | None:
    """Why the Triton kernel cannot compute this matmul (None if it can); where no kernel
    runs at all it says so without importing the kernel module, which imports Triton."""
    reason = kernels_refusal("a", a.is_cuda)
    if reason is not None:
        return reason
    # imported here: the kernels import Triton, which CPU-only calls never need
    from ..kernels import matmul as kernels

    return kernels.matmul_refusal((a.dtype, b.dtype), fmt, product_fmt, order, mode, n, rand)
