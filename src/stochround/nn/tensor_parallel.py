"""Tensor parallelism for `QuantizedLinear`: a layer whose weight is a DTensor sharded as
torch's `ColwiseParallel` or `RowwiseParallel` shard it runs its three GEMMs on each
rank's local operands, quantized there, and returns the DTensor ``F.linear`` would
(docs/guide/distributed.md, "Tensor parallelism").

Colwise (W ``Shard(0)``, x ``Replicate``): rank r computes ``y_r = Q(x) Q(W_r)^T``, the
columns r of y (``Shard(-1)``); its dx is a partial sum (``Partial``), which DTensor
reduces.  Rowwise (W ``Shard(1)``, x ``Shard(-1)``): ``y_r = Q(x_r) Q(W_r)^T`` is a partial
sum of y (``Partial``) and dx_r the rank's columns of dx.  Each local operand is quantized
with its blocks along the local contraction axis, so a block never spans two ranks; a
shard whose length the blocks do not divide raises ValueError.  The tensor scales come from
each rank's local operand (its own amax), and rank r draws its random words under the
Philox key `rank_key` of the layer's key, so that no two ranks share a word.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import NamedTuple

from torch import Tensor

from ..shards import is_dtensor

# an odd 64-bit constant, not the stream domains' golden-ratio one: rank r's key is the
# layer's key xor r times it
RANK_KEY_STEP = 0xD1B54A32D192ED03


def rank_key(key: int, rank: int) -> int:
    """Rank ``rank``'s Philox key from a layer's key: ``key ^ (rank * RANK_KEY_STEP mod
    2**64)``, the key itself on rank 0 (distinct for distinct ranks below 2**63: the
    constant is odd, so the products differ)."""
    if rank < 0:
        raise ValueError(f"rank must be non-negative; got {rank}")
    return key ^ ((rank * RANK_KEY_STEP) % (1 << 64))


class LocalCall(NamedTuple):
    """A tensor-parallel call resolved to plain tensors: the local x, weight and bias the
    layer's GEMMs take (``bias``: the one added inside the fprop GEMM, colwise only), the
    rank on the tensor-parallel mesh, the style and ``wrap``, which makes the local output
    the DTensor y (adding a rowwise layer's replicated bias once, after the partial
    sums)."""

    x: Tensor
    weight: Tensor
    bias: Tensor | None
    rank: int
    style: str
    wrap: Callable[[Tensor], Tensor]


def placements_text(tensor: object) -> str:
    """A tensor's placements as text, for error messages (``plain`` for a tensor)."""
    if not is_dtensor(tensor):
        return "plain tensor"
    return "(" + ", ".join(str(each) for each in tensor.placements) + ")"


def local_call(x: Tensor, weight: Tensor, bias: Tensor | None) -> LocalCall:
    """The `LocalCall` of a layer called with a DTensor weight or input (module docstring).
    ValueError, naming the placements, unless the weight is a DTensor on a 1-D mesh placed
    ``Shard(0)`` with x ``Replicate`` (colwise) or ``Shard(1)`` with x sharded along its
    last axis (rowwise), the bias (if any) ``Shard(0)`` (colwise) or ``Replicate``
    (rowwise)."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    if not (is_dtensor(weight) and is_dtensor(x)) or weight.device_mesh.ndim != 1:
        raise ValueError(
            "QuantizedLinear under tensor parallelism takes a DTensor weight on a 1-D mesh "
            "placed Shard(0) (ColwiseParallel) or Shard(1) (RowwiseParallel) and a DTensor "
            f"input; got weight {placements_text(weight)}, input {placements_text(x)}"
        )
    x = typing.cast("DTensor", x)
    mesh = weight.device_mesh
    rank = mesh.get_local_rank()
    last = Shard(x.ndim - 1)
    wp, xp = weight.placements[0], x.placements[0]
    bias_placement = tuple(bias.placements) if is_dtensor(bias) else None
    if wp == Shard(0) and xp == Replicate():
        if bias is not None and bias_placement != (Shard(0),):
            raise ValueError(
                f"a colwise layer's bias must be Shard(0); got {placements_text(bias)}"
            )
        local_x = x.to_local(grad_placements=[Partial()])

        def wrap_colwise(y: Tensor) -> Tensor:
            return DTensor.from_local(y, mesh, [Shard(y.ndim - 1)], run_check=False)

        local_bias = bias.to_local() if is_dtensor(bias) else None
        return LocalCall(local_x, weight.to_local(), local_bias, rank, "colwise", wrap_colwise)
    if wp == Shard(1) and xp in (last, Shard(-1)):
        if bias is not None and bias_placement != (Replicate(),):
            raise ValueError(
                f"a rowwise layer's bias must be Replicate; got {placements_text(bias)}"
            )
        local_x = x.to_local(grad_placements=[last])

        def wrap_rowwise(y: Tensor) -> Tensor:
            out = DTensor.from_local(y, mesh, [Partial()], run_check=False)
            return out if bias is None else out + bias

        return LocalCall(local_x, weight.to_local(), None, rank, "rowwise", wrap_rowwise)
    raise ValueError(
        "QuantizedLinear supports ColwiseParallel (weight Shard(0), input Replicate) and "
        "RowwiseParallel (weight Shard(1), input Shard(-1)); got weight "
        f"{placements_text(weight)}, input {placements_text(x)}"
    )


__all__ = ["RANK_KEY_STEP", "LocalCall", "local_call", "placements_text", "rank_key"]
