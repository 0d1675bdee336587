"""Shared machinery of the SR optimizers: argument checks, rounded stores, random streams.

Random streams. Every store draws the words of stream ``(key, offset)`` at the element
indices ``0 .. numel - 1`` of the tensor (:mod:`stochround.random`), with ``key =
stream_key(seed, StreamDomain.OPTIMIZER)`` (`group_key`: the optimizers' own domain, so a
recipe or a rounding call given the same seed draws other words) and::

    offset = step * 2**32 + param_index * 4 + tensor_slot

``step`` is the parameter's step count after this update (1, 2, ..., below 2**32),
``param_index`` its position in the optimizer's parameters (all groups, in order, fewer
than 2**30) and ``tensor_slot`` 0 for the parameter, 1 and 2 for the states
(``TENSOR_SLOTS``). Distinct offsets fill distinct upper counter halves, so no two stores
of a run share a random word, and the mapping does not move when a parameter group is
added. The step lives in the optimizer state (``state[p]["step"]``, a 0-d int64 tensor on
the parameter's device) and the seed in the parameter group, so a run restored from
``state_dict`` continues bit for bit.

Sharded parameters (torch.distributed: FSDP2's ``fully_shard``, DTensor placements). The
element indices are those of the whole parameter, in row-major order: a rank updates its
shard with the words of its elements' global indices, so a sharded run rounds every
element as the single-device run does, whatever the number of ranks, and its states
(DTensors like their parameters) save and resume through torch.distributed.checkpoint
onto any number of ranks. The fused kernel updates each rank's local shards in place (no
gather) when a shard is one range of the parameter's elements (placements Replicate or
Shard(0): whole rows) starting at a multiple of 4 elements (`shard_refusal`); the
PyTorch path updates any other shard (Shard of another dimension: each element's words
computed at its global index) — with ``backend="triton"`` such a shard raises ValueError
instead. Replicated parameters (DDP) round identically on every rank from the agreed
seed (below).

Parameter storage (``rounding`` and ``master_weights``). The update is always computed in
float32 from the parameter's float32 value ``x``; how ``x`` is kept between steps:

- ``"sr"`` / ``"rne"``: ``x`` is the stored parameter; the new value is rounded once into
  it (stochastically on stream slot 0, or to nearest even).
- ``"kahan"``: compensated summation. A buffer ``c`` in the parameter's dtype (state
  ``"compensation"``) holds what the rounded store lost, ``c = rne(x_new - p)`` with
  ``p = rne(x_new)``; the next step starts from ``x = p + c``, so updates smaller than
  half an ulp of ``p`` accumulate in ``c`` until they move ``p``. +2 B/param for bf16.
- ``"ecc"``: HeavyBall's error correction: ``p = rne(x_new)`` plus an int8 residual
  (state ``"ecc_residual"``) ``q = round(254 (x_new - p) / ulp(p))`` clamped to
  [-127, 127], ``ulp(p)`` the spacing of the parameter's dtype at ``|p|``; the next step
  starts from ``x = p + q ulp(p) / 254``. +1 B/param. The scale is HeavyBall 3.2.1's
  (`_ULPState` with int8: ``ulp / 2`` per 127 units, ulp from the exponent field, the
  subnormal spacing at zero); HeavyBall rounds ``q`` stochastically with an unseeded
  ``torch.rand_like``, this rounds it to nearest (the difference is below ``ulp / 508``).
- ``master_weights=True`` (with "sr" or "rne"): an exact float32 copy of the parameter
  (state ``"master"``); ``x`` is the master, the update is applied to it, and the
  parameter is its rounded copy. +4 B/param. The master is the truth: a parameter written
  from outside the optimizer is overwritten at the next step.

All three extra states exist only for bfloat16/float16 parameters (a float32 parameter
is exact already). States (``exp_avg`` ...) are stored by "sr" when ``rounding="sr"`` and
to nearest even otherwise ("kahan" and "ecc" concern the parameter only).

State dtype. ``state_dtype=None`` (the default) keeps each parameter's states in the
parameter's own dtype, as torch.optim and torchao's low-bit AdamW do: bfloat16 parameters
give the 6-byte AdamW without a flag. Under ``master_weights=True`` the states follow the
float32 master, the value the update advances (a bfloat16 moment beside it would drop
the precision the master keeps).

Default seed. ``seed=None`` takes `generator_seed`: a hash of the state of torch's default
CPU generator, read without drawing from it. Constructing an optimizer therefore moves no
draw of the user's data order, initialization or dropout (swapping ``torch.optim`` for
these optimizers changes nothing else), and a program that calls ``torch.manual_seed``
gets the same seed on every run. When torch.distributed is initialized, the seed is rank
0's, broadcast over the default process group when the optimizer is built (`agreed_seed`),
so replicated parameters round identically on every rank even when each rank seeds torch
differently (for its data order and dropout).

Checkpoints of ``torch.optim`` (`SROptimizer.load_state_dict`). A group key the checkpoint
lacks (``rounding``, ``seed``, ``state_dtype`` ...) keeps the constructor's value; the
states are cast to the group's state dtype, to nearest (a one-time conversion: its error,
at most half an ulp, does not accumulate, and it needs no random stream); ``step``
becomes an int64 tensor.  What cannot continue (``amsgrad=True``, another optimizer's
states) raises ValueError at the load.
"""

from __future__ import annotations

import hashlib
import numbers
from collections.abc import Callable, Iterable, Sequence
from itertools import compress, repeat
from operator import attrgetter, is_not, itemgetter
from typing import Any, overload

import torch
import torch.distributed as dist
from torch import Tensor

from ..kernels.availability import INTERPRETED, check_backend, kernels_refusal
from ..random import StreamDomain, check_seed, stream_key
from ..rounding import cast
from ..shards import first_index, is_dtensor

ROUNDINGS: tuple[str, ...] = ("sr", "rne", "kahan", "ecc")
STATE_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)
PARAM_DTYPES = STATE_DTYPES
MAX_PARAMS = 1 << 30
TENSOR_SLOTS = {"param": 0, "exp_avg": 1, "exp_avg_sq": 2, "momentum_buffer": 1}
# torch.optim's implementation choices: options of the whole optimizer here (``backend``),
# dropped from the groups of a loaded torch checkpoint
IMPLEMENTATION_KEYS: tuple[str, ...] = ("foreach", "fused", "capturable", "differentiable")
# what `generator_seed` hashes with: its seeds are not another hash's outputs
SEED_PERSONALIZATION = b"stochround.optim"
# per-tensor reads of a group's fast path (`SROptimizer.fused_group_step`), each mapped over
# the group's list at C speed (methods unbound: a subclass's __torch_function__ still sees
# them, as it sees a bound call)
GRAD = attrgetter("grad")
DTYPE = attrgetter("dtype")
IS_CUDA = attrgetter("is_cuda")
IS_SPARSE = attrgetter("is_sparse")
IS_CONTIGUOUS = Tensor.is_contiguous
GET_DEVICE = Tensor.get_device
STEP = itemgetter("step")


def state_stream_offset(step: int | Tensor, param_index: int, tensor_slot: int) -> int | Tensor:
    """``step * 2**32 + param_index * 4 + tensor_slot``: the stream of one store.  A tensor
    ``step`` (int64, as the optimizer state holds it) gives an int64 tensor, two's
    complement at and above 2**63 as `stochround.random` reads offsets."""
    if not 0 <= param_index < MAX_PARAMS:
        raise ValueError(f"param_index must be in [0, 2**30), got {param_index}")
    if not 0 <= tensor_slot < 4:
        raise ValueError(f"tensor_slot must be in [0, 4), got {tensor_slot}")
    low = (param_index << 2) | tensor_slot
    if isinstance(step, Tensor):
        return (step << 32) | low
    if not 0 <= step < 1 << 32:
        raise ValueError(f"step must be in [0, 2**32), got {step}")
    return (step << 32) | low


def check_float(value: object, name: str, *, low: float = 0.0, below: float | None = None) -> float:
    """``value`` as a float ``>= low`` (and ``< below`` when given), else a
    ValueError/TypeError naming it ``name``; a one-element tensor is read as its value."""
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a number or a one-element tensor")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not (value >= low and (below is None or value < below)):  # also rejects NaN
        bound = f"in [{low}, {below})" if below is not None else f">= {low}"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


def check_betas(betas: object) -> tuple[float, float]:
    """A pair of floats in [0, 1), else ValueError/TypeError naming ``betas``."""
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"betas must be a pair of floats in [0, 1), got {betas!r}")
    return (
        check_float(betas[0], "betas[0]", below=1.0),
        check_float(betas[1], "betas[1]", below=1.0),
    )


def check_rounding(rounding: object) -> str:
    """``rounding`` if it is one of `ROUNDINGS`, else ValueError."""
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}; got {rounding!r}")
    return str(rounding)


def check_state_dtype(state_dtype: object) -> torch.dtype | None:
    """``state_dtype`` if it is None or one of `STATE_DTYPES`, else TypeError/ValueError."""
    if state_dtype is None:
        return None
    if not isinstance(state_dtype, torch.dtype):
        raise TypeError(
            f"state_dtype must be None or a torch.dtype, got {type(state_dtype).__name__}"
        )
    if state_dtype not in STATE_DTYPES:
        raise ValueError(f"state_dtype must be None or one of {STATE_DTYPES}; got {state_dtype}")
    return state_dtype


def check_seed_argument(seed: object) -> int:
    """An int seed in [0, 2**64), else ValueError/TypeError naming ``seed``."""
    if isinstance(seed, Tensor):
        raise TypeError("seed must be an int in [0, 2**64) (tensor seeds are not supported yet)")
    return int(check_seed(seed, "seed"))


def generator_seed() -> int:
    """A seed in [0, 2**64) read from torch's default CPU generator without drawing from it:
    the first 8 bytes (little-endian) of the BLAKE2b hash of its state.  The state is a
    function of the last ``torch.manual_seed`` and of the draws made since, so the seed is
    as reproducible as the user's own draws, and reading it leaves their sequence as it
    was.  (``torch.initial_seed()`` alone would give every optimizer of a program the same
    seed; the state differs between optimizers built with draws between them.)"""
    state = torch.default_generator.get_state().numpy().tobytes()
    digest = hashlib.blake2b(state, digest_size=8, person=SEED_PERSONALIZATION).digest()
    return int.from_bytes(digest, "little")


def agreed_seed(seed: int) -> int:
    """Rank 0's ``seed`` when torch.distributed's default process group is initialized (a
    broadcast that every rank of the group must join), else ``seed`` itself."""
    if not (dist.is_available() and dist.is_initialized()):
        return seed
    # an object broadcast picks the device the group's backend needs (CPU for gloo, the
    # current CUDA device for NCCL)
    box: list[Any] = [seed]
    dist.broadcast_object_list(box, src=0)
    return int(box[0])


def check_flag(value: object, name: str, *, optional: bool = False) -> bool | None:
    """``value`` if it is a bool (or None when ``optional``), else TypeError naming ``name``."""
    if isinstance(value, bool) or (optional and value is None):
        return value
    allowed = "a bool or None" if optional else "a bool"
    raise TypeError(f"{name} must be {allowed}, got {type(value).__name__}")


def resolve_backend(
    backend: str, foreach: object, fused: object, capturable: object, differentiable: object
) -> str:
    """The backend that ``backend`` and torch.optim's implementation keywords ask for.

    ``foreach`` and ``capturable`` change nothing (every implementation gives the same bits
    and every step can be captured); ``fused=True`` is ``backend="triton"``, ``fused=False``
    ``backend="torch"`` (another explicit backend raises ValueError); ``differentiable=True``
    and ``foreach=fused=True`` raise ValueError."""
    check_backend(backend)
    check_flag(foreach, "foreach", optional=True)
    check_flag(fused, "fused", optional=True)
    check_flag(capturable, "capturable")
    check_flag(differentiable, "differentiable")
    if differentiable:
        raise ValueError(
            "differentiable=True is not supported: the step runs under torch.no_grad and a "
            "rounded store has no useful derivative; pass differentiable=False"
        )
    if foreach and fused:
        raise ValueError("foreach=True and fused=True cannot be set together (as in torch.optim)")
    if fused is None:
        return backend
    wanted = "triton" if fused else "torch"
    if backend not in ("auto", wanted):
        raise ValueError(
            f"fused={fused} asks for backend={wanted!r}, but backend={backend!r} was passed: "
            "pass one of them"
        )
    return wanted


def group_key(group: dict[str, Any]) -> int:
    """The Philox key of ``group``'s streams: its seed in the optimizers' domain,
    ``stream_key(group["seed"], StreamDomain.OPTIMIZER)`` (`stochround.random`).  The group
    (and so ``state_dict``) keeps the seed; the key is derived where a step draws."""
    return int(stream_key(group["seed"], StreamDomain.OPTIMIZER))


def store(
    target: Tensor, value: Tensor, rounding: str, key: int, step: Tensor, index: int, slot: int
) -> None:
    """``target.copy_(rounded value)``: float32 ``value`` rounded to ``target``'s dtype.

    float32 targets take the value as computed; "sr" draws stream
    ``(key, state_stream_offset(step, index, slot))``, ``key`` the group's `group_key`; every
    other mode ("rne", and "kahan" and
    "ecc" for states) is torch's round-to-nearest-even cast (the same as
    ``stochround.cast(value, dtype, "rne")``).
    """
    if target.dtype == torch.float32:
        target.copy_(value)
    elif rounding != "sr":
        target.copy_(value.to(target.dtype))
    else:
        offset = state_stream_offset(step, index, slot)
        target.copy_(cast(value, target.dtype, "sr", seed=key, offset=offset))


MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10}
MIN_NORMAL_EXPONENT = {torch.bfloat16: -126, torch.float16: -14}
ECC_SCALE = 254.0  # |x - rne(x)| <= ulp / 2  ->  |q| <= 127


def param_ulp(param: Tensor) -> Tensor:
    """float32 spacing of ``param``'s dtype (bfloat16/float16) at ``|param|``: ``2**(e - m)``
    with ``|param|`` in ``[2**e, 2**(e+1))`` and ``m`` the mantissa bits; the subnormal
    spacing ``2**(emin - m)`` for subnormals and zero."""
    mantissa, emin = MANTISSA_BITS[param.dtype], MIN_NORMAL_EXPONENT[param.dtype]
    _, exponent = torch.frexp(param.float())  # |p| = f 2**exponent, f in [0.5, 1)
    exponent = torch.where(param == 0, emin + 1, exponent).clamp_(min=emin + 1)
    ones = torch.ones_like(exponent, dtype=torch.float32)
    return torch.ldexp(ones, exponent - 1 - mantissa)


def ecc_encode(value: Tensor, param: Tensor) -> Tensor:
    """int8 ``round(254 (value - param) / param_ulp(param))`` clamped to [-127, 127]."""
    residual = (value - param.float()) / param_ulp(param) * ECC_SCALE
    return residual.round_().clamp_(-127, 127).to(torch.int8)


def ecc_decode(param: Tensor, residual: Tensor) -> Tensor:
    """float32 ``param + residual ulp(param) / 254``."""
    return param.float() + residual.float() * (param_ulp(param) / ECC_SCALE)


# the extra parameter state each rounding keeps beside a low-precision parameter
ROUNDING_STATES = {"kahan": "compensation", "ecc": "ecc_residual"}


def grad_of(param: Tensor) -> Tensor:
    """``param.grad`` of a parameter a step updates: steps update only parameters that have
    a gradient (`SROptimizer.group_entries`)."""
    grad = param.grad
    assert grad is not None  # group_entries yields no parameter without a gradient
    return grad


def local_tensor(tensor: Tensor) -> Tensor:
    """A DTensor's local tensor (this rank's shard, what the fused kernel updates), or the
    tensor itself."""
    return tensor.to_local() if is_dtensor(tensor) else tensor


def holds_dtensors(tensors: list[Tensor]) -> bool:
    """Whether any of ``tensors`` is a DTensor (their types looked at once each: a step
    over plain parameters pays one pass at C speed)."""
    return any(kind.__name__ == "DTensor" for kind in set(map(type, tensors)))


def shard_refusal(param: Tensor) -> str | None:
    """Why the fused kernel cannot update the local shard of DTensor ``param`` (None if it
    can, and for a plain tensor): the kernel draws each row of four elements' words as one
    Philox block, from the block of the shard's first element, so a shard must be one
    range of the whole parameter's elements (`stochround.shards.first_index`: whole rows,
    placements Replicate or Shard(0)) starting at a multiple of 4. The PyTorch path
    updates any other shard on its DTensor, each element with the words of its global
    index."""
    start = first_index(param)
    if start is None:
        return (
            f"its local shard (placements {getattr(param, 'placements', None)}) is not a "
            "range of whole rows of the parameter"
        )
    if start % 4:
        return f"its local shard starts at global element {start}, not a multiple of 4"
    return None


def setup_refusal(param: Tensor, group: dict[str, Any]) -> str | None:
    """Why the fused kernel can never update ``param`` of ``group`` (None if it may): its
    device, a missing Triton, or an extra parameter state."""
    refusal = kernels_refusal("the parameter", param.is_cuda)
    if refusal is not None:
        return refusal
    if SROptimizer.param_state_name(group, param) is not None:
        return "master_weights, 'kahan' and 'ecc' keep an extra parameter state"
    return None


def _triton_refusal(param: Tensor, group: dict[str, Any], compiling: bool) -> str | None:
    """Why the fused kernel cannot update ``param`` (None if it can); ``compiling``: whether
    torch.compile traces the step."""
    refusal = setup_refusal(param, group) or shard_refusal(param)
    if refusal is not None:
        return refusal
    param, grad = local_tensor(param), local_tensor(grad_of(param))
    if not (param.is_contiguous() and grad.is_contiguous()):
        return "the parameter and its gradient must be contiguous"
    # torch.compile cannot trace addresses: compiled, the launch checks them (and raises)
    aligned = compiling or not (param.data_ptr() % 16 or grad.data_ptr() % 16)
    if not aligned:
        return "the parameter and its gradient must start on a multiple of 16 bytes"
    if grad.dtype not in PARAM_DTYPES:
        return f"gradients must be float32, bfloat16 or float16, not {grad.dtype}"
    return None


class SROptimizer(torch.optim.Optimizer):
    """Base class: groups carry ``state_dtype``, ``rounding`` and ``seed``; each parameter's
    step count is ``state[p]["step"]``, a 0-d int64 tensor on the parameter's device, and
    ``lr`` may be a float or a one-element tensor.  Nothing a step reads is a Python value
    that changes from step to step, so ``torch.compile`` compiles a step once and a CUDA
    graph can capture it (with a tensor ``lr`` on the device, replays read its current
    value; the step counts advance on the device).  A float ``lr`` that a scheduler moves
    compiles as torch.optim's does: a second graph reads it as an input.

    ``backend``: "auto" updates CUDA parameters with one fused Triton launch per group
    (per parameter and gradient dtype) and others on the PyTorch path; "torch"
    always takes the PyTorch path; "triton" always the kernel, raising ValueError for a
    parameter it cannot update.  Both give the same bits.

    Arguments every optimizer takes: ``params`` (parameters or parameter groups, as in
    ``torch.optim``) and ``lr``, then, keyword-only:

    - ``maximize``: ascend the objective;
    - ``state_dtype``: the dtype of the optimizer states, float32, bfloat16 or float16, or
      None (the default) for each parameter's own dtype (float32 under
      ``master_weights``; module docstring);
    - ``rounding``: one of `ROUNDINGS`, how low-precision stores round (module docstring);
    - ``seed``: an int in [0, 2**64) naming the random streams, or None (the default) for
      `generator_seed`, agreed across ranks when torch.distributed is initialized before
      the optimizer is built (module docstring; otherwise each process keeps its own);
    - ``master_weights``: keep a float32 master copy of bfloat16/float16 parameters;
    - ``backend``: above;
    - torch.optim's implementation keywords (`resolve_backend`): ``foreach`` (accepted,
      changes nothing), ``fused`` (True: the fused kernel for every parameter, as
      ``backend="triton"``, and a parameter it can never update raises ValueError when
      the optimizer is built; False: ``backend="torch"``), ``capturable`` (accepted: every
      step can be captured) and ``differentiable`` (only False).

    ``defaults``: the subclass's group defaults.

    Subclasses name their ``algorithm`` (the kernel's), their ``state_names`` and
    implement `scalars` (the float32 rows of a step), `constants` (what the kernel computes
    them from) and `update` (one parameter on the PyTorch path).  In the methods, ``group``
    is a parameter group, ``index`` a parameter's global index (the stream's
    ``param_index``) and ``step`` its step count after this update."""

    algorithm: str = ""
    state_names: tuple[str, ...] = ()

    def __init__(
        self,
        params: Iterable[Any],
        defaults: dict[str, Any],
        backend: str = "auto",
        *,
        foreach: bool | None = None,
        fused: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
    ) -> None:
        self.backend = resolve_backend(backend, foreach, fused, capturable, differentiable)
        self.fused_required = fused is True
        self.shared_seed: int | None = None  # `default_seed`, once asked for
        super().__init__(params, defaults)

    def __getstate__(self) -> dict[str, Any]:
        """torch's state (defaults, state, groups) and the options of the whole optimizer,
        which torch's omits: a pickled or deep-copied optimizer keeps its backend."""
        options = ("backend", "fused_required", "shared_seed")
        return {**super().__getstate__(), **{name: getattr(self, name) for name in options}}

    def scalars(self, group: dict[str, Any], steps: Tensor) -> Tensor:
        """float32 rows of the update's scalars, one per int64 step count in ``steps``."""
        raise NotImplementedError

    def constants(self, group: dict[str, Any]) -> list[float]:
        """The group's hyperparameters besides ``lr``, in the kernel's order."""
        raise NotImplementedError

    def update(
        self, group: dict[str, Any], index: int, param: Tensor, scalars: Tensor, step: Tensor
    ) -> None:
        """Update ``param`` and its states on the PyTorch path (``scalars``: its row)."""
        raise NotImplementedError

    def kernel_options(self, group: dict[str, Any], param: Tensor) -> dict[str, Any]:
        """Constexpr options of the fused kernel for ``param`` (called before it runs)."""
        return {}

    def group_kernel_options(
        self, group: dict[str, Any], states: Sequence[dict[str, Any]]
    ) -> dict[str, Any] | None:
        """The constexpr options of the fused kernel shared by every parameter of ``group``,
        whose states are ``states`` (all created), or None where they may differ between
        parameters (`kernel_options` then decides for each).  A subclass that overrides
        `kernel_options` overrides this too."""
        return {}

    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One update of every parameter that has a gradient; returns the closure's loss.

        Eagerly each group first tries `fused_group_step` (one launch for the whole group,
        its checks made over lists); a group it declines takes the general path
        (`group_step`), parameter by parameter."""
        compiling = torch.compiler.is_compiling()
        if compiling and any(is_dtensor(p) for group in self.param_groups for p in group["params"]):
            return self.eager_step(closure)
        loss = self.evaluate(closure)
        if compiling:  # eagerly the loop below creates the states, at no extra cost
            for group in self.param_groups:
                self._init_group(group)
        start = 0  # the global index of the group's first parameter
        for group in self.param_groups:
            params = group["params"]
            if compiling or not self.fused_group_step(group, params, start):
                self.group_step(group, self.group_entries(group, start), compiling)
            start += len(params)
        return loss

    def eager_step(self, closure: Callable[[], float] | None) -> float | None:
        """`step` run eagerly inside a compiled region: a step over DTensor parameters
        (FSDP2) is not compiled, because inductor was seen to compile the sharded PyTorch
        path's stream offsets into float arithmetic; eagerly the fused kernel updates the
        shards (on CUDA) and the bits are the eager step's."""
        # disabled here, where Dynamo traces (so has been imported), not by a decorator,
        # which would import Dynamo with stochround; making it breaks the graph as well
        return torch.compiler.disable(self.step)(closure)

    def group_step(
        self, group: dict[str, Any], entries: list[tuple[int, Tensor]], compiling: bool
    ) -> None:
        """Update the (global index, parameter) ``entries`` of ``group``, each by the fused
        kernel where it can (`fused`, one launch per bucket: `fused_steps`), else on the
        PyTorch path (one scalar computation per device); ``compiling``: whether
        torch.compile traces the step."""
        fused, unfused = [], []
        for index, param in entries:
            state = self.init_states(group, param)
            if self.fused(group, param, compiling):
                fused.append((index, param, state))
            else:
                unfused.append((index, param))
        by_device: dict[torch.device, list[tuple[int, Tensor]]] = {}
        for index, param in unfused:
            by_device.setdefault(param.device, []).append((index, param))
        for members in by_device.values():  # one scalar computation per device
            steps = [self.state[param]["step"].add_(1) for _, param in members]
            rows = self.scalars(group, torch.stack(steps))
            for (index, param), row, step in zip(members, rows, steps, strict=True):
                self.update(group, index, param, row, step)
        self.fused_steps(group, fused)

    def fused_group_step(self, group: dict[str, Any], params: list[Tensor], start: int) -> bool:
        """An eager step of ``group`` (its ``params``, the first of global index ``start``)
        in one launch, when every parameter that has a gradient is one the fused kernel
        updates and they share one launch: one device, one parameter dtype and one
        gradient dtype, contiguous and 16-byte aligned, their states created and their
        kernel options shared (`group_kernel_options`).  The checks are `fused`'s, made
        over the whole list (the alignment by the launch, once for these tensors); a step's
        host time then grows by a few attribute reads a parameter.  Returns whether it stepped;
        when it did not, nothing has changed (beyond the empty state dicts that
        `group_step` creates as well), and `group_step` takes the group, parameter by
        parameter (its errors and fallbacks included)."""
        if self.backend == "torch" or not params:
            return False
        grads = list(map(GRAD, params))
        indices: Sequence[int] = range(start, start + len(params))
        present = list(map(is_not, grads, repeat(None)))
        if not all(present):  # parameters without a gradient are not stepped
            params = list(compress(params, present))
            grads = list(compress(grads, present))
            indices = list(compress(indices, present))
            if not params:
                return True
        if any(map(IS_SPARSE, grads)):  # group_step raises
            return False
        keys = params  # the states are the parameters' (DTensors' for sharded ones)
        first_indices = None
        if holds_dtensors(params):  # the kernel updates each rank's shards
            starts = list(map(first_index, params))
            # `shard_refusal`'s rule: a range of the parameter, from a multiple of 4
            if any(start is None or start % 4 for start in starts):
                return False
            first_indices = [start for start in starts if start is not None]
            params, grads = list(map(local_tensor, params)), list(map(local_tensor, grads))
        # `fused` for each parameter: "auto" takes CUDA parameters, "triton" also those the
        # interpreter runs; the others, and an extra parameter state, go to group_step
        on_cuda = all(map(IS_CUDA, params))
        if not (on_cuda or (self.backend == "triton" and INTERPRETED)):
            return False
        if kernels_refusal("the parameter", on_cuda) is not None:
            return False
        if group.get("master_weights", False) or group["rounding"] in ROUNDING_STATES:
            return False
        dtypes, grad_dtypes = set(map(DTYPE, params)), set(map(DTYPE, grads))
        if len(dtypes) != 1 or len(grad_dtypes) != 1 or not grad_dtypes <= set(PARAM_DTYPES):
            return False
        if len(set(map(GET_DEVICE, params))) != 1:
            return False
        if not (all(map(IS_CONTIGUOUS, params)) and all(map(IS_CONTIGUOUS, grads))):
            return False
        states = list(map(self.state.__getitem__, keys))
        options = self.group_kernel_options(group, states)
        if options is None:
            return False
        names = self.state_names[: self.state_count(group)]
        try:  # the first step creates the states, on group_step
            steps = list(map(STEP, states))
            state_lists = [list(map(itemgetter(name), states)) for name in names]
        except KeyError:
            return False
        if first_indices is not None:
            state_lists = [list(map(local_tensor, column)) for column in state_lists]
        from ..kernels.optim import MisalignedError, fused_step  # needs triton: imported here

        try:  # the alignment is checked there, once for these tensors (their table)
            fused_step(
                self.algorithm,
                params,
                grads,
                state_lists,
                steps,
                list(indices),
                group["lr"],  # as `launch_lr` passes it eagerly
                self.constants(group),
                seed=group_key(group),
                sr=group["rounding"] == "sr",
                maximize=group["maximize"],
                first_indices=first_indices,
                **options,
            )
        except MisalignedError:  # raised before anything changed: group_step decides
            return False
        return True

    def fused(self, group: dict[str, Any], param: Tensor, compiling: bool) -> bool:
        """Whether the fused kernel updates ``param`` (see the class docstring; ``compiling``:
        whether torch.compile traces the step)."""
        if self.backend == "torch" or (self.backend == "auto" and not param.is_cuda):
            return False
        refusal = _triton_refusal(param, group, compiling)
        if refusal is not None and self.backend == "triton":
            raise ValueError(f"backend='triton' cannot update this parameter: {refusal}")
        return refusal is None

    def init_states(self, group: dict[str, Any], param: Tensor) -> dict[str, Any]:
        """The parameter's state, with step 0 and zero states in its `state_dtype` on first
        use."""
        state = self.state[param]
        if "step" not in state:
            state["step"] = torch.zeros((), dtype=torch.int64, device=param.device)
        for name in self.state_names:
            if name not in state:
                state[name] = torch.zeros_like(
                    param, dtype=self.state_dtype(group, param), memory_format=torch.preserve_format
                )
        return state

    def _init_group(self, group: dict[str, Any]) -> None:
        """Create the states of ``group``'s parameters that have a gradient (`init_states`),
        for a compiled step.  The name is torch.optim's: torch.compile runs a method of that
        name eagerly when it traces a step, so a step compiled before the first one sees
        the states and is not compiled again once they exist."""
        for param in group["params"]:
            if param.grad is not None:
                self.init_states(group, param)

    @staticmethod
    def state_dtype(group: dict[str, Any], param: Tensor) -> torch.dtype:
        """The dtype of ``param``'s states: the group's ``state_dtype``, or, when that is
        None, the parameter's own dtype (float32 under ``master_weights``)."""
        dtype: torch.dtype | None = group["state_dtype"]
        if dtype is not None:
            return dtype
        return torch.float32 if group["master_weights"] else param.dtype

    def fused_steps(
        self, group: dict[str, Any], entries: list[tuple[int, Tensor, dict[str, Any]]]
    ) -> None:
        """One launch per (dtypes, kernel options) bucket of ``entries`` (index, param,
        state)."""
        buckets: dict[tuple, list[tuple[int, Tensor, dict[str, Any]]]] = {}
        for entry in entries:
            param = entry[1]
            options = tuple(self.kernel_options(group, param).items())
            # one launch reads every state through one typed pointer: the parameter's dtype
            # fixes its states' within a group (`state_dtype`; init_states and
            # load_state_dict create them so)
            key = (param.dtype, grad_of(param).dtype, param.device, options)
            buckets.setdefault(key, []).append(entry)
        if not buckets:
            return
        from ..kernels.optim import fused_step  # needs triton: imported only when used

        names = self.state_names[: self.state_count(group)]
        for (_, _, device, options), members in buckets.items():
            params = [param for _, param, _ in members]
            sharded = holds_dtensors(params)
            fused_step(
                self.algorithm,
                list(map(local_tensor, params)),
                [local_tensor(grad_of(param)) for param in params],
                [[local_tensor(state[name]) for _, _, state in members] for name in names],
                [state["step"] for _, _, state in members],
                [index for index, _, _ in members],
                self.launch_lr(group["lr"], device),
                self.constants(group),
                seed=group_key(group),
                sr=group["rounding"] == "sr",
                maximize=group["maximize"],
                first_indices=[first_index(param) or 0 for param in params] if sharded else None,
                **dict(options),
            )

    @staticmethod
    def launch_lr(lr: float | Tensor, device: torch.device) -> float | Tensor:
        """``lr`` as the fused launch takes it: a float travels as a kernel argument, but a
        compiled step passes it as a float64 tensor on ``device`` (zeros plus the float, so
        torch.compile reads the float as a graph input instead of a constant that
        recompiles the step when a scheduler moves it)."""
        if isinstance(lr, Tensor) or not torch.compiler.is_compiling():
            return lr
        return torch.zeros((), dtype=torch.float64, device=device) + lr

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if isinstance(param_group, dict):
            for key in IMPLEMENTATION_KEYS:
                if key in param_group:
                    raise ValueError(
                        f"{key} is an option of the whole optimizer, not of a parameter group: "
                        "pass it to the constructor"
                    )
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        self.check_group(group)
        for param in group["params"]:
            if param.dtype not in PARAM_DTYPES:
                raise TypeError(
                    f"params must have a dtype in {PARAM_DTYPES}; got a {param.dtype} parameter"
                )
            refusal = setup_refusal(param, group) if self.fused_required else None
            if refusal is not None:
                raise ValueError(f"fused=True cannot update this parameter: {refusal}")
        if sum(len(g["params"]) for g in self.param_groups) > MAX_PARAMS:
            raise ValueError("at most 2**30 parameters are supported")

    def default_seed(self) -> int:
        """The seed of the groups given ``seed=None``: `generator_seed`, agreed with rank 0
        (`agreed_seed`) when torch.distributed is initialized; derived once per optimizer,
        so it costs one broadcast, made when the first such group is added (in the
        constructor, unless every group there has its own seed)."""
        if self.shared_seed is None:
            self.shared_seed = agreed_seed(generator_seed())
        return self.shared_seed

    def check_group(self, group: dict[str, Any]) -> None:
        group["state_dtype"] = check_state_dtype(group["state_dtype"])
        group["rounding"] = check_rounding(group["rounding"])
        seed = group["seed"]
        group["seed"] = self.default_seed() if seed is None else check_seed_argument(seed)
        group["master_weights"] = bool(group.get("master_weights", False))
        if group["master_weights"] and group["rounding"] not in ("sr", "rne"):
            raise ValueError(
                "master_weights=True needs rounding 'sr' or 'rne' (the master is exact; "
                f"'kahan' and 'ecc' are alternatives to it), got {group['rounding']!r}"
            )
        check_float(group["lr"], "lr")
        group["maximize"] = bool(group["maximize"])

    @staticmethod
    def evaluate(closure: Callable[[], float] | None) -> float | None:
        """The loss of ``closure`` (re-evaluated with gradients enabled), or None."""
        if closure is None:
            return None
        with torch.enable_grad():
            return closure()

    @staticmethod
    def param_state_name(group: dict[str, Any], param: Tensor) -> str | None:
        """The extra state that keeps ``param``'s exact value, if any."""
        if param.dtype == torch.float32:
            return None
        if group.get("master_weights", False):
            return "master"
        return ROUNDING_STATES.get(group["rounding"])

    def load_param(self, group: dict[str, Any], param: Tensor) -> Tensor:
        """A fresh float32 tensor: the parameter's value the update starts from (the master,
        ``p + c`` under "kahan", ``p + q ulp(p) / 254`` under "ecc", else ``p``)."""
        state = self.state[param]
        name = self.param_state_name(group, param)
        if name is not None and name not in state:
            if name == "master":
                state[name] = param.detach().float().clone(memory_format=torch.preserve_format)
            else:
                dtype = torch.int8 if name == "ecc_residual" else param.dtype
                state[name] = torch.zeros_like(
                    param, dtype=dtype, memory_format=torch.preserve_format
                )
        if name == "master":
            return state["master"].clone()
        if name == "compensation":
            return param.float() + state["compensation"].float()
        if name == "ecc_residual":
            return ecc_decode(param, state["ecc_residual"])
        # float() returns the parameter itself when it is float32 already
        return param.float().clone() if param.dtype == torch.float32 else param.float()

    def store_param(
        self, group: dict[str, Any], param: Tensor, value: Tensor, step: Tensor, index: int
    ) -> None:
        """Keep the float32 ``value`` as the parameter (see the module docstring)."""
        state = self.state[param]
        name = self.param_state_name(group, param)
        rounding, key = group["rounding"], group_key(group)
        if name == "master":
            state["master"].copy_(value)
            store(param, value, rounding, key, step, index, TENSOR_SLOTS["param"])
        elif name == "compensation":
            param.copy_(value.to(param.dtype))
            state["compensation"].copy_((value - param.float()).to(param.dtype))
        elif name == "ecc_residual":
            param.copy_(value.to(param.dtype))
            state["ecc_residual"].copy_(ecc_encode(value, param))
        else:
            store(param, value, rounding, key, step, index, TENSOR_SLOTS["param"])

    def group_entries(self, group: dict[str, Any], start: int) -> list[tuple[int, Tensor]]:
        """The (global parameter index, parameter) pairs of ``group`` that have a gradient,
        its first parameter's index being ``start`` (indices count every parameter of every
        group, in order); RuntimeError for a sparse gradient."""
        entries = []
        for index, param in enumerate(group["params"], start):
            if param.grad is not None:
                if param.grad.is_sparse:
                    raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
                entries.append((index, param))
        return entries

    @staticmethod
    def gradient(group: dict[str, Any], param: Tensor) -> Tensor:
        """The float32 gradient, negated under ``maximize``."""
        grad = grad_of(param).float()
        return -grad if group["maximize"] else grad

    def store_states(
        self,
        group: dict[str, Any],
        param: Tensor,
        values: tuple[Tensor, ...],
        step: Tensor,
        index: int,
    ) -> None:
        """Store the float32 ``values`` of the states ``state_names`` (in order), rounded."""
        state = self.state[param]
        rounding, key = group["rounding"], group_key(group)
        for name, value in zip(self.state_names, values, strict=False):
            store(state[name], value, rounding, key, step, index, TENSOR_SLOTS[name])

    def state_count(self, group: dict[str, Any]) -> int:
        """How many state tensors each parameter of ``group`` holds."""
        return len(self.state_names)

    def bytes_per_param(self) -> float:
        """Bytes per parameter element: the parameter, its states and the extra parameter
        state (fp32 master 4, kahan compensation the parameter's size, ecc residual 1),
        averaged."""
        total_bytes = 0
        total_elements = 0
        for group in self.param_groups:
            for param in group["params"]:
                state_size = torch.empty((), dtype=self.state_dtype(group, param)).element_size()
                total_elements += param.numel()
                total_bytes += param.numel() * (
                    param.element_size() + self.state_count(group) * state_size
                )
                name = self.param_state_name(group, param)
                if name is not None:
                    extra = {"master": 4, "compensation": param.element_size(), "ecc_residual": 1}
                    total_bytes += param.numel() * extra[name]
        return total_bytes / total_elements if total_elements else 0.0

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As torch's, with the states cast to their `state_dtype` and copied, not aliased
        (torch's loader casts every floating state to its parameter's dtype), and step
        counts as 0-d int64 tensors on the parameter's device; a checkpoint of the
        ``torch.optim`` counterpart (or of an older version) loads too: a group key it
        lacks keeps the constructor's value (`loaded_group`), and its states are checked
        and cast (`loaded_state`).  Everything is checked before anything changes: a
        checkpoint that cannot continue raises ValueError and leaves the optimizer as it
        was."""
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                f"the state_dict has {len(saved_groups)} parameter groups, this optimizer "
                f"{len(self.param_groups)}"
            )
        groups, states = [], {}
        for current, saved in zip(self.param_groups, saved_groups, strict=True):
            if len(saved["params"]) != len(current["params"]):
                raise ValueError(
                    f"a parameter group of the state_dict has {len(saved['params'])} "
                    f"parameters, this optimizer's {len(current['params'])}"
                )
            group = self.loaded_group(current, saved)
            groups.append(group)
            for saved_id, param in zip(saved["params"], current["params"], strict=True):
                if saved_id in state_dict["state"]:
                    states[param] = self.loaded_state(group, param, state_dict["state"][saved_id])
        super().load_state_dict({**state_dict, "param_groups": groups, "state": {}})
        for param, state in states.items():
            self.state[param] = state

    def loaded_group(self, current: dict[str, Any], saved: dict[str, Any]) -> dict[str, Any]:
        """The group ``saved`` (of a state_dict) over ``current``: the saved keys, except
        torch.optim's `IMPLEMENTATION_KEYS` (options of the whole optimizer here), over the
        constructor's (``current``); checked as a new group is."""
        group = {key: value for key, value in current.items() if key != "params"}
        group.update((k, v) for k, v in saved.items() if k not in IMPLEMENTATION_KEYS)
        self.check_group(group)
        return group

    def loaded_state(
        self, group: dict[str, Any], param: Tensor, saved: dict[str, Any]
    ) -> dict[str, Any]:
        """The state of ``param`` from its ``saved`` state: ``step`` (an int, or a tensor of
        any dtype as torch.optim saves it) as a 0-d int64 tensor, the optimizer's states
        cast to nearest in the `state_dtype`, the extra parameter states as saved, all on
        the parameter's device; None entries (an unused momentum buffer) dropped.
        ValueError for a state this optimizer does not keep."""
        known = ("step", *self.state_names, "master", *ROUNDING_STATES.values())
        unknown = sorted(name for name in saved if name not in known)
        if unknown:
            raise ValueError(
                f"the state_dict holds states {unknown}, which {type(self).__name__} does not "
                f"keep (it keeps {list(known)}): a checkpoint of another optimizer, or of "
                "options it does not support?"
            )
        state = {}
        for name, value in saved.items():
            if value is None:
                continue
            if name == "step":  # an int in checkpoints written before steps were tensors
                step = torch.as_tensor(value)
                if step.numel() != 1 or (step.is_floating_point() and bool(step != step.trunc())):
                    raise ValueError(f"a saved step count must be one integer, got {value!r}")
                value = step.to(device=param.device, dtype=torch.int64, copy=True).reshape(())
            elif name in self.state_names:
                dtype = self.state_dtype(group, param)
                value = value.to(device=param.device, dtype=dtype, copy=True)
            elif isinstance(value, Tensor):
                value = value.to(device=param.device, copy=True)
            state[name] = value
        return state
