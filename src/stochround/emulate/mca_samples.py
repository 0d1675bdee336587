"""The samples of a batched MCA run (`stochround.emulate.mca_batched`): the tensor that
carries a program value's n samples (`SampleTensor`), and their streams: run j's counter
starts at ``j * SAMPLE_STRIDE`` (serial and batched alike), so the i-th rounding of run j
draws offset ``j 2**40 + i`` of the seed's stream, and `sample_words` draws every sample's
words of one rounding together.  What the CUDA kernels of a batched run take
(`sample_words_refusal`, `sample_pair_refusal`)."""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor

from .. import random as streams
from ..formats import Format
from ..kernels.availability import on_kernel_device, use_kernel

# the offsets between the starts of two runs' counters: a run makes fewer roundings
SAMPLE_STRIDE = 2**40

# the most samples the words kernel takes: its launch grid's second dimension
_KERNEL_SAMPLES = 65535


class BatchingError(RuntimeError):
    """An op of the program cannot run on the n samples together; the message names the
    op, the program's line and what to do (run the samples one after another)."""


# what a batched run says where the program reads its values outside ATen
_READ = (
    "x.{}() reads the values of a tensor of a batched MCA run, which holds the n samples'. "
    " Run the samples one after another: mca(..., batched=False), stochround mca --serial"
)


class SampleTensor(Tensor):
    """A tensor of the program holding its value in each of the n samples: ``samples``,
    shape ``(n, *shape)``; the tensor itself has the shape, dtype and device of one
    sample's value.  Only `BatchedEmulation` computes with it."""

    samples: Tensor

    @staticmethod
    def __new__(cls, samples: Tensor) -> SampleTensor:
        made = Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
            cls,
            samples.shape[1:],
            strides=samples.stride()[1:],
            dtype=samples.dtype,
            device=samples.device,
        )
        made.samples = samples
        return made

    # torch's own subclasses' idiom (torch functions go straight to ATen); the stubs type
    # these hooks more narrowly than torch calls them
    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls,
        func: torch._ops.OpOverload,
        types: tuple[type, ...],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        raise BatchingError(
            f"{func} on a tensor of a batched MCA run outside the run: read the samples "
            "from the MCAResult"
        )

    def tolist(self) -> Any:  # torch reads a subclass's values without an ATen op here
        raise BatchingError(_READ.format("tolist"))

    def numpy(self, *args: Any, **kwargs: Any) -> Any:
        raise BatchingError(_READ.format("numpy"))

    def __repr__(self) -> str:  # type: ignore[override]  # the default reads the values
        return f"SampleTensor(n={self.samples.shape[0]}, shape={tuple(self.shape)})"


def sample_words_refusal(bases: Tensor) -> str | None:
    """Why the words kernel cannot serve these samples (None if it can): one program
    column a sample, and a launch grid's second dimension holds at most 65535."""
    if bases.shape[0] > _KERNEL_SAMPLES:
        return f"{bases.shape[0]} samples: the words kernel takes at most {_KERNEL_SAMPLES}"
    return None


@functools.cache
def sample_pair_refusal(fmt: Format) -> str | None:
    """Why the kernel cannot round to ``fmt`` (None if it can): it takes the IEEE-like
    formats (signed, infinities, IEEE NaNs, subnormals, max ``(2 - 2**-mbits)
    2**emax``) within float64's (mbits <= 52, emin >= -1022), such as every virtual
    precision of `stochround.emulate.mca`."""
    ieee_like = (
        fmt.signed
        and fmt.inf
        and fmt.nan == "ieee"
        and fmt.subnormals
        and not fmt.twos_complement
        and fmt.ebits > 0
    )
    if not ieee_like:
        return f"{fmt.name or fmt}: the kernel takes IEEE-like formats only"
    if fmt.mbits > 52 or fmt.emin < -1022 or fmt.emax > 1023:
        return f"{fmt.name or fmt}: beyond float64's precision or exponent range"
    if fmt.max != (2 - 2.0**-fmt.mbits) * 2.0**fmt.emax or fmt.lowest != -fmt.max:
        return f"{fmt.name or fmt}: its max is not the top of its grid"
    return None


def sample_words(shape: torch.Size, key: int, bases: Tensor, offset: int = 0) -> Tensor:
    """The words of n tensors of ``shape``, tensor j in stream ``(key, bases[j] +
    offset)``: ``out[j]`` is ``random_words_like(x_j, key, bases[j] + offset)`` (row-major
    flat indices from 0), computed for all j at once: one kernel on CUDA
    (`stochround.kernels.sample_words`), PyTorch's ops elsewhere.  Returns int64, shape
    ``(n, *shape)``."""
    if use_kernel("auto", "bases", on_kernel_device(bases), sample_words_refusal(bases)):
        # the kernel module imports triton: imported where it runs
        from ..kernels.sample_words import sample_words_triton

        return sample_words_triton(shape, key, bases, offset)
    offsets = bases + offset
    n = offsets.shape[0]
    count = shape.numel()
    if count == 0:
        return torch.empty((n, *shape), dtype=torch.int64, device=offsets.device)
    groups = torch.arange((count + 3) >> 2, dtype=torch.int64, device=offsets.device)
    column = offsets.reshape(n, 1)
    words = streams.philox4x32(
        groups & streams.MASK32,
        groups >> 32,
        column & streams.MASK32,
        (column >> 32) & streams.MASK32,
        key & streams.MASK32,
        key >> 32,
    )
    return torch.stack(words, dim=-1).reshape(n, -1)[:, :count].reshape(n, *shape)


def sample_values(value: Tensor, n: int) -> Tensor:
    """A result's ``(n, *shape)`` float64 samples, copied: a `SampleTensor`'s own, a plain
    tensor's (the same in every sample) repeated."""
    if isinstance(value, SampleTensor):
        return value.samples.to(torch.float64, copy=True)
    return value.detach().to(torch.float64, copy=True).expand(n, *value.shape).clone()


__all__ = [
    "SAMPLE_STRIDE",
    "BatchingError",
    "SampleTensor",
    "sample_pair_refusal",
    "sample_values",
    "sample_words",
    "sample_words_refusal",
]
