"""The gradient rule of `stochround.ops`: the exact operation's derivative, straight through
the rounding.

Every operation returns its exact result rounded once, r = round(op(x, y, ...)).  Its
gradient is the gradient of op itself, the rounding taken as the identity (the
straight-through estimator, as `stochround.round` takes it): d add/dx = 1, d mul/dx = y,
d div/dy = -x / y**2, d sqrt/dx = 1 / (2 sqrt x), d sum/dx_i = 1, d dot/dx = y, and matmul's
usual pair.  The reductions' accumulation order, the products' format and the rounding
mode change the value, never the gradient.

The operations compute the rounded values on detached inputs (no graph is recorded for
the error-free transformations or the rounding steps); `with_exact_gradient` then runs op
with torch on the inputs converted to the result dtype, and autograd differentiates that
graph (higher orders too) while the rounded values, bit for bit, stand in for its output.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

__all__ = ["with_exact_gradient"]


class _StraightThroughRounding(torch.autograd.Function):
    """Forward: the rounded values; backward: the incoming gradient, unchanged, to the exact
    result (the rounding as the identity).

    A custom function rather than ``exact + (rounded - exact).detach()``: that sum is itself
    rounded in floating point, turns an infinite result into NaN (inf - inf) and a -0 into
    +0, so it would not return the rounded values bit for bit."""

    @staticmethod
    def forward(ctx: Any, exact: Tensor, rounded: Tensor) -> Tensor:
        # A copy: an input returned as it is comes back as a view that autograd forbids
        # modifying in place, and callers may update a result in place.
        return rounded.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


def with_exact_gradient(
    rounded: Tensor, exact_op: Callable[..., Tensor], *inputs: Tensor
) -> Tensor:
    """``rounded`` carrying the gradient of ``exact_op(*inputs)`` (the module's rule).

    Args:
        rounded: the operation's rounded result, computed on detached inputs; returned as it
            is where autograd records nothing (grad mode off, or no input requires grad).
        exact_op: the exact operation with torch, e.g. ``torch.mul``; called with ``inputs``
            converted to ``rounded``'s dtype (the operations' promoted result dtype, which
            0-d tensors take part in, unlike torch's own promotion), so its result has
            ``rounded``'s dtype and shape, and each input's gradient comes back in the
            input's own dtype.
        inputs: the operation's tensor operands, as the caller passed them (with their
            autograd history).

    Returns:
        ``rounded``'s values bit for bit; where autograd records, a copy whose gradient is
        ``exact_op``'s.
    """
    if not (torch.is_grad_enabled() and any(tensor.requires_grad for tensor in inputs)):
        return rounded
    exact = exact_op(*(tensor.to(rounded.dtype) for tensor in inputs))
    return _StraightThroughRounding.apply(exact, rounded)
