"""Gaussian weight sampling (GaussWS) applied to a model: `sample_weight` with its
straight-through gradient and kernel routing, the `GaussWS` parametrization, and
`gaussws_`, which registers it on a model's `nn.Linear` weights.

`GaussWS` draws with the key ``stream_key(seed, StreamDomain.GAUSSWS)`` (its own domain, so
a layer both quantized and sampled, or an optimizer given the same seed, draws distinct
words) at ``stream_offset(step, layer_index, GAUSSWS_SLOT)``: each training step draws
fresh words, and torch's global generator is never used.  The noise itself is
`stochround.nn.gaussws_noise`'s.
"""

from __future__ import annotations

import numbers
import typing
from collections import deque
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from ..blocks.quantize import fake_quantize
from ..formats import Format
from ..kernels.availability import check_backend, use_kernel
from ..random import StreamDomain, check_seed, seed_tensor, stream_key
from .gaussws_noise import (
    Sampler,
    block_length,
    check_stream,
    check_weight,
    make_sampler,
    sample_resolved,
)
from .linear import MAX_LAYERS, next_layer_index, stream_offset
from .recompute import read_step
from .streams import step_column

# the stream slot of the sampled weight (`stream_offset`); the domain (`StreamDomain.GAUSSWS`)
# is what keeps its words apart from QuantizedLinear's, the slot only keeps the offsets of
# earlier releases
GAUSSWS_SLOT = 12


def gaussws_kernel_refusal(sampler: Sampler) -> str | None:
    """Why the GaussWS Triton kernel cannot serve a sampling (None if it can): it draws
    noise "gaussws" only."""
    if sampler.noise != "gaussws":
        return f"noise={sampler.noise!r} runs on the PyTorch path (the kernel draws 'gaussws')"
    return None


def _sample_with_backend(
    w: Tensor,
    sampler: Sampler,
    seed: int | Tensor,
    offset: int | Tensor,
    index_offset: int,
    backend: str,
) -> Tensor:
    """`sample_resolved` or the Triton kernel, as ``backend`` routes it: "auto" takes the
    kernel for CUDA tensors it serves where Triton runs, "triton" takes it or raises
    ValueError saying why not, "torch" never.  Traced by torch.compile, "auto" takes
    `sample_resolved`, whose operations Inductor fuses into one kernel of its own (the
    kernel would be an opaque op: a Python call, a launch and a seed tensor's fill per
    layer and step, on the host); "triton" keeps the kernel."""
    if sampler.noise == "sr":  # fake_quantize routes its own kernel
        assert sampler.block_format is not None
        return fake_quantize(
            w.detach(),
            sampler.block_format,
            "sr",
            seed=seed,
            offset=offset,
            index_offset=index_offset,
            backend=backend,
        )
    fused = backend == "auto" and torch.compiler.is_compiling()
    if fused or not use_kernel(backend, "w", w.is_cuda, gaussws_kernel_refusal(sampler)):
        return sample_resolved(w, sampler, seed, offset, index_offset)
    from ..kernels.gaussws import gaussws_blocks  # the kernel module imports Triton

    length = block_length(w, sampler.block)
    rows = w.detach().reshape(-1, w.shape[-1]).contiguous()
    sampled = gaussws_blocks(
        rows,
        sampler.target.format,
        length,
        sampler.thresholds,
        sampler.noise_bits,
        seed,
        offset,
        index_offset,
    )
    return typing.cast(Tensor, sampled).reshape(w.shape)


class _StraightThroughSample(torch.autograd.Function):
    """The sampled weight forward, the identity backward (d w~ / d w := 1)."""

    @staticmethod
    def forward(
        ctx: Any,
        w: Tensor,
        sampler: Sampler,
        seed: int | Tensor,
        offset: int | Tensor,
        index_offset: int,
        backend: str,
    ) -> Tensor:
        return _sample_with_backend(w, sampler, seed, offset, index_offset, backend)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        return grad, None, None, None, None, None


class _PreparedStraightThrough(torch.autograd.Function):
    """A prepared kernel launch's sample with a straight-through gradient (`GaussWS`'s
    eager kernel path)."""

    @staticmethod
    def forward(ctx: Any, w: Tensor, prepared: Any, seed: Tensor, offset: Tensor) -> Tensor:
        return typing.cast(Tensor, prepared(w, seed, offset))

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        return grad, None, None, None


def sample_weight(
    w: Tensor,
    fmt: str | Format,
    *,
    block: int | None = 32,
    noise: str = "gaussws",
    noise_bits: int = 32,
    seed: int | Tensor,
    offset: int | Tensor,
    index_offset: int = 0,
    backend: str = "auto",
) -> Tensor:
    """`sample_weight_torch`'s sampled weight with a straight-through gradient (dL/dw :=
    dL/dw~), computed by the Triton kernel (`stochround.kernels.gaussws`) or the PyTorch
    path, bit for bit alike.  The arguments as in `sample_weight_torch`; ``backend``:
    "auto" (the kernel for CUDA tensors with ``noise="gaussws"``, where Triton runs; under
    torch.compile, Inductor's fused code), "torch" or "triton" (the kernel, or ValueError
    saying why it cannot run).  ``noise="sr"``
    passes ``backend`` to `stochround.blocks.fake_quantize`."""
    w = check_weight(w)
    index_offset = check_stream(seed, offset, index_offset)
    check_backend(backend)
    sampler = make_sampler(fmt, block, noise, noise_bits)
    block_length(w, sampler.block)
    out = _StraightThroughSample.apply(w, sampler, seed, offset, index_offset, backend)
    return typing.cast(Tensor, out)


class GaussWS(nn.Module):
    """A parametrization (`torch.nn.utils.parametrize`) that samples a weight at every
    training forward: ``w -> sample_weight(w, fmt, ..., seed=key, offset=...)`` with the key
    ``stream_key(seed, StreamDomain.GAUSSWS)`` and the stream offset
    ``stream_offset(step, layer_index, GAUSSWS_SLOT)`` (module docstring).

    Args:
        fmt: the target element format (`stochround.Format` or its name), default "e3m2".
        block: the block length along the weight's last axis (None: the whole axis).
        noise: "gaussws", "diffq" or "sr" (`sample_weight_torch`).
        noise_bits: 1..32, R's random bits.
        seed: the stream's seed, an int in [0, 2**64).
        layer_index: the layer's number in its model, in [0, 2**28): its stream.
        backend: "auto", "torch" or "triton" (`sample_weight`).

    The buffer ``step`` (0-d int64, in the ``state_dict``) counts the training forwards
    made under grad mode and advances by one at each, so every step draws fresh words and a
    run resumes bit-exactly from a checkpoint.  In eval mode or under ``torch.no_grad`` the
    weight is returned unchanged and the step stays: inference uses the weights themselves.
    An activation checkpoint's recomputation reads its forward's step again (and a reentrant
    checkpoint's forward, under ``no_grad``, samples): `stochround.nn.recompute`.
    """

    step: Tensor
    sampler: Sampler
    seed: int
    key: int
    layer_index: int
    backend: str

    def __init__(
        self,
        fmt: str | Format = "e3m2",
        block: int | None = 32,
        noise: str = "gaussws",
        noise_bits: int = 32,
        seed: int = 0,
        layer_index: int = 0,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        self.sampler = make_sampler(fmt, block, noise, noise_bits)
        if isinstance(seed, Tensor):
            raise TypeError("seed must be an int in [0, 2**64), got a tensor")
        self.seed = int(check_seed(seed, "seed"))
        # the Philox key the samples draw with (the seed in GaussWS's domain), mixed once
        self.key = int(stream_key(self.seed, StreamDomain.GAUSSWS))
        if isinstance(layer_index, bool) or not isinstance(layer_index, numbers.Integral):
            raise TypeError(f"layer_index must be an int, got {type(layer_index).__name__}")
        if not 0 <= layer_index < MAX_LAYERS:
            raise ValueError(f"layer_index must be in [0, 2**28), got {layer_index}")
        self.layer_index = int(layer_index)
        self.backend = check_backend(backend)
        self.register_buffer("step", torch.zeros((), dtype=torch.int64))
        self.step_reads: deque[Tensor] = deque()  # for recomputations (`read_step`)
        # the eager kernel path's launch and seed tensors (not state: remade on demand)
        self.prepared: Any = None
        self.seeds: dict[torch.device, Tensor] = {}

    def _settings(self) -> tuple[Sampler, int, str]:
        """What the sampling draws, all but the layer's stream: the `Sampler` (target,
        block, noise, its bits), the seed and the backend; `gaussws_` compares them."""
        return self.sampler, self.seed, self.backend

    def _check_weight(self, w: Tensor) -> None:
        """ValueError/TypeError unless ``w`` can be sampled (dtype, blocks fitting)."""
        block_length(check_weight(w), self.sampler.block)

    def forward(self, w: Tensor) -> Tensor:
        if not self.training:
            return w
        # one draw a training forward, which a checkpoint's recomputation reads again:
        # eagerly its stream offset, made from the step before the step advances (one add,
        # no copy of the step: `_offset_at`); traced, from the step op's value
        if torch.compiler.is_compiling():
            step = read_step(self.step, self.step_reads)
            offset = None if step is None else stream_offset(step, self.layer_index, GAUSSWS_SLOT)
        else:
            offset = read_step(self.step, self.step_reads, derive=self._offset_at)
        if offset is None:
            return w
        prepared = None if torch.compiler.is_compiling() else self._prepared_for(w)
        if prepared is not None:
            seed = self._seed_on(w.device)
            out = _PreparedStraightThrough.apply(w, prepared, seed, typing.cast(Tensor, offset))
        else:
            out = _StraightThroughSample.apply(w, self.sampler, self.key, offset, 0, self.backend)
        return typing.cast(Tensor, out)

    def _offset_at(self, step: Tensor) -> Tensor:
        """``stream_offset(step, layer_index, GAUSSWS_SLOT)`` of the 0-d int64 ``step``: the
        layer's row of `streams.step_column`, one add from its slot bases (made once per
        layer and device), where the step's copy and the offset's shift and ``or`` were
        three launches."""
        return step_column(step, self.layer_index)[GAUSSWS_SLOT, 0]

    def _prepared_for(self, w: Tensor) -> Any:
        """The kernel's launch prepared for ``w`` (`stochround.kernels.gaussws.
        PreparedSample`, made at the first call and again when w's shape, dtype or device
        changes), where an eager call takes the kernel: noise "gaussws", a contiguous 2-D
        weight, on CUDA with backend "auto" or "triton" (or on the CPU under Triton's
        interpreter with "triton"); else None.  It skips the functional path's checks and
        launch set-up, a host cost every sampled layer would pay at every step; the bits
        are the same."""
        if self.sampler.noise != "gaussws" or w.dim() != 2 or not w.is_contiguous():
            return None
        if not use_kernel(self.backend, "w", w.is_cuda, gaussws_kernel_refusal(self.sampler)):
            return None
        if self.prepared is None or not self.prepared.matches(w):
            from ..kernels.gaussws import PreparedSample  # the kernel module imports Triton

            sampler = self.sampler
            block = w.shape[-1] if sampler.block is None else sampler.block
            self.prepared = PreparedSample(
                w, sampler.target.format, block, sampler.thresholds, sampler.noise_bits
            )
        return self.prepared

    def __getstate__(self) -> dict[str, Any]:
        """The module's state without the prepared launch and seed tensors (remade on
        demand): copies and pickles carry no compiled kernel."""
        state = dict(self.__dict__)
        state["prepared"] = None
        state["seeds"] = {}
        return state

    def _seed_on(self, device: torch.device) -> Tensor:
        """The key (`GaussWS.key`) as the one-element int64 tensor the kernel reads, made
        once a device."""
        if device not in self.seeds:
            self.seeds[device] = seed_tensor(self.key, "seed", device)
        return self.seeds[device]

    def extra_repr(self) -> str:
        sampler = self.sampler
        return (
            f"fmt={sampler.target.format.name}, block={sampler.block}, noise={sampler.noise}, "
            f"noise_bits={sampler.noise_bits}, seed={self.seed}, layer_index={self.layer_index}"
        )


def sampling_of(module: nn.Module) -> GaussWS | None:
    """The `GaussWS` parametrization of ``module``'s weight, or None."""
    if not parametrize.is_parametrized(module, "weight"):
        return None
    parametrizations = module.parametrizations["weight"]  # type: ignore[index, union-attr]
    found = [each for each in parametrizations if isinstance(each, GaussWS)]
    return found[0] if found else None


def _check_resampling(path: str, module: nn.Module, wanted: tuple[Sampler, int, str]) -> None:
    """ValueError if ``module``'s weight is sampled by a `GaussWS` whose settings are not
    ``wanted`` (a second `gaussws_` call asking for other ones), or has a parametrization
    of another kind (which sampling would silently skip or stack on)."""
    sampling = sampling_of(module)
    if sampling is None:
        kinds = [type(each).__name__ for each in module.parametrizations["weight"]]  # type: ignore[index, union-attr]
        raise ValueError(
            f"gaussws_: {path or 'model'}'s weight has another parametrization "
            f"({', '.join(kinds)}); GaussWS samples plain weights: remove it first, or leave "
            "the layer out with filter_fn"
        )
    if sampling._settings() == wanted:
        return
    sampler, seed, backend = wanted
    asked = (
        f"fmt={sampler.target.format.name}, block={sampler.block}, noise={sampler.noise}, "
        f"noise_bits={sampler.noise_bits}, seed={seed}, backend={backend}"
    )
    raise ValueError(
        f"gaussws_: {path or 'model'} is already sampled by GaussWS({sampling.extra_repr()}, "
        f"backend={sampling.backend}), not the {asked} asked for; remove it first "
        "(stochround.nn.unquantize_) to sample with other settings"
    )


def gaussws_(
    model: nn.Module,
    fmt: str | Format = "e3m2",
    filter_fn: Callable[[nn.Module, str], bool] | None = None,
    *,
    block: int | None = 32,
    noise: str = "gaussws",
    noise_bits: int = 32,
    seed: int = 0,
    backend: str = "auto",
) -> nn.Module:
    """Register, in place, a `GaussWS` parametrization on the ``weight`` of each `nn.Linear`
    of ``model`` (`QuantizedLinear` included) that ``filter_fn`` keeps.

    Args:
        model: the model (an `nn.Linear` itself is parametrized too).
        fmt, block, noise, noise_bits, seed, backend: as `GaussWS`.
        filter_fn: torchao's filter, ``filter_fn(module, fqn) -> bool``; False leaves the
            layer as it is (None: every layer).

    The parametrized layers are numbered 0, 1, ... in ``model.named_modules()`` order (their
    ``layer_index``, which gives each its own stream), after those an earlier call
    numbered.  A layer already sampled by a
    `GaussWS` of the same settings (target, block, noise, noise bits, seed, backend) is
    left alone, so that a second call is harmless; one sampled with other settings raises
    ValueError naming both (`unquantize_` removes the first, to start again).  A layer whose
    weight has another parametrization raises ValueError naming it (``filter_fn`` can leave
    it out).  The ``out_proj`` of
    ``nn.MultiheadAttention``, whose weight the attention reads without calling the layer,
    is sampled all the same: a parametrization runs when the weight is read.  Every layer
    is checked (its weight's dtype and blocks) before the first is parametrized, so a layer
    that does not fit leaves the model untouched.  Returns the model.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if filter_fn is not None and not callable(filter_fn):
        raise TypeError(f"filter_fn must be callable or None, got {type(filter_fn).__name__}")
    wanted = GaussWS(fmt, block, noise, noise_bits, seed, 0, backend)._settings()
    chosen = []
    for path, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        if filter_fn is not None and not filter_fn(module, path):
            continue
        if parametrize.is_parametrized(module, "weight"):
            _check_resampling(path, module, wanted)
            continue
        chosen.append((path, module))
    # numbered after the layers an earlier call sampled, whose streams they must not share
    first = next_layer_index(model, GaussWS)
    parametrizations = []
    for index, (path, module) in enumerate(chosen, start=first):
        sampling = GaussWS(fmt, block, noise, noise_bits, seed, index, backend)
        try:
            sampling._check_weight(module.weight)
        except (TypeError, ValueError) as error:
            raise type(error)(f"{path or 'model'}: {error}") from None
        parametrizations.append((module, sampling.to(module.weight.device)))
    # registration evaluates the parametrization once: under no_grad it neither samples nor
    # advances the step
    with torch.no_grad():
        for module, sampling in parametrizations:
            parametrize.register_parametrization(module, "weight", sampling)
    return model


__all__ = ["GaussWS", "gaussws_", "sample_weight", "sampling_of"]
