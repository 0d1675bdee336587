"""The check every op an emulation sees passes: no complex or sparse tensor among its
arguments or outputs (`raise_unsupported` says why and what to do instead); which tensors
a prepared rounding takes unchecked (`plain`)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

# (each layout is one object, read by identity; ``dtype.is_complex`` is read rather than
# ``is_complex()``, a method call: these checks run on every op's tensors)
_STRIDED = torch.strided
# whether a tensor is one of torch.func's wrappers (vmap, grad)
_is_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
_PLAIN_TYPES = (Tensor, torch.nn.Parameter)


def check_supported(values: Iterable[object]) -> None:
    """TypeError for a complex or sparse tensor among an ATen op's arguments or outputs
    (`raise_unsupported`): its schema admits tensors, lists and tuples of them (optional ones:
    None) and scalars, never a dict, so a walk of the lists and tuples finds them all (a
    general pytree walk costs every op's dispatch more than the op itself)."""
    for value in values:
        if isinstance(value, Tensor):
            if value.layout is not _STRIDED or value.dtype.is_complex:
                raise_unsupported(value)
        elif isinstance(value, list | tuple):
            check_supported(value)


def plain(x: Tensor) -> bool:
    """Whether x is a plain dense tensor with data, which a prepared rounding's unchecked
    calls take (`stochround.rounding.prepared`): a tensor or a parameter (an optimizer's
    update mutates one), not another subclass such as a DTensor, not sparse, not on the
    meta device, not a transform's wrapper (those take the checked call)."""
    return type(x) in _PLAIN_TYPES and x.layout is _STRIDED and not x.is_meta and not _is_wrapped(x)


def raise_unsupported(value: object) -> None:
    """TypeError for a complex or sparse (any non-strided) tensor: SR of their values is
    not defined here (complex) or would lose their structure (sparse)."""
    if isinstance(value, Tensor):
        if value.is_complex():
            raise TypeError(
                f"emulate does not support complex tensors (got {value.dtype}): round the "
                "real and imaginary parts as real tensors"
            )
        if value.layout != torch.strided:
            raise TypeError(
                f"emulate does not support {value.layout} tensors: only dense (strided) "
                "tensors can be rounded; pass x.to_dense()"
            )


__all__ = ["check_supported", "plain", "raise_unsupported"]
