"""Which path computes a rounding call: the Triton kernels, the compiled CPU path or the
PyTorch path, decided once per set of a call's choices (`call_route`) and acted on by the
one dispatch point (`dispatch`)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor

from .. import cpu_path
from ..formats import Format
from ..kernels.availability import check_backend, kernels_refusal, on_kernel_device, use_kernel
from ..packing import PACKINGS
from ..shards import is_dtensor
from ..torch_path import Request, checks_nan, code_dtype, refuse_capture, round_tensor
from .checks import check_choices

if TYPE_CHECKING:  # for annotations only: the kernels import Triton
    from ..kernels.rounding import KernelPlan


class Route(NamedTuple):
    """What a call's choices decide (`call_route`, once per set of them)."""

    fmt: Format
    n: int  # random bits
    output: str  # torch_path.OUTPUTS
    out_dtype: torch.dtype  # the result's: values' dtype, codes' integer dtype, or cast's
    plan: KernelPlan | None  # the Triton kernels' plan; None: the PyTorch path rounds
    checked: bool  # whether the call checks for NaN results (`checks_nan`)
    cpu: bool = False  # the compiled CPU path rounds it where x is large enough (`dispatch`)


def _output_of(
    fmt: Format, output: str, out_dtype: torch.dtype | None, x_dtype: torch.dtype
) -> tuple[str, torch.dtype]:
    """The output and result dtype an entry point asks for: ``output`` "packed" (`encode`'s
    packed=True) is the packing of the format's width, in bytes; ``out_dtype`` None is x's
    dtype for values and the integer dtype of the format's width for codes."""
    if output == "packed":
        if fmt.bits not in PACKINGS:
            raise ValueError(
                f"packed=True packs formats of {' or '.join(map(str, PACKINGS))} bits; "
                f"{fmt.name} has {fmt.bits}"
            )
        return PACKINGS[fmt.bits][0], torch.uint8
    if out_dtype is not None:
        return output, out_dtype
    return output, x_dtype if output == "value" else code_dtype(fmt.bits)


@functools.lru_cache(maxsize=512, typed=True)  # typed: rbits=True is no rbits=1
def _call_route(
    fmt: Format | str | torch.dtype,
    mode: str,
    rbits: int | None,
    variant: str,
    sat: str,
    nan: str,
    source: str,
    backend: str,
    output: str,
    out_dtype: torch.dtype | None,
    x_dtype: torch.dtype,
    on_cuda: bool,
    through_op: bool,
) -> Route:
    """The route of a call's choices (``output`` and ``out_dtype`` as `_output_of` takes
    them) for x of ``x_dtype`` on a CUDA device or not, each choice checked (an error naming
    it).  Decided once per set of choices: calls repeat them, and checking them and finding
    the kernels' plan per call is a large part of a small call's host time.  ValueError
    where ``backend="triton"`` cannot round them (`use_kernel`; an error is not cached).

    ``through_op`` (`through_op`): the call goes through the custom op, whose body routes
    it again; its route has no plan (no backend decided), so that `torch.compile`, which
    traces this function (`call_route`), never builds one (a `KernelPlan` cannot be traced)."""
    fmt, n = check_choices(fmt, mode, rbits, variant, sat, nan)
    check_backend(backend)
    output, out_dtype = _output_of(fmt, output, out_dtype, x_dtype)
    route = Route(fmt, n, output, out_dtype, None, checks_nan(fmt, nan, output))
    if through_op or backend == "torch":
        return route
    if backend == "auto" and not on_cuda:
        refusal = _cpu_path_refusal(fmt, mode, source, output, out_dtype, x_dtype, n, variant)
        return route._replace(cpu=refusal is None)
    refusal = _kernel_refusal(x_dtype, fmt, output, on_cuda)
    if use_kernel(backend, "x", on_cuda, refusal):
        # imported here: the kernels import Triton, which CPU-only calls never need
        from ..kernels.rounding import kernel_plan

        plan = kernel_plan(output, out_dtype, nan, fmt, mode, sat, n, variant, source)
        return route._replace(plan=plan)
    return route  # auto: what the kernels cannot do


def _kernel_refusal(x_dtype: torch.dtype, fmt: Format, output: str, on_cuda: bool) -> str | None:
    """Why the rounding kernels cannot round x of ``x_dtype`` to ``fmt``'s ``output`` (None
    if they can): where they cannot run (checked first: their module imports Triton), then
    what they cannot compute (`stochround.kernels.rounding.rounding_refusal`)."""
    refusal = kernels_refusal("x", on_cuda)
    if refusal is not None:
        return refusal
    from ..kernels.rounding import rounding_refusal

    return rounding_refusal(x_dtype, fmt, output)


def _cpu_path_refusal(
    fmt: Format,
    mode: str,
    source: str,
    output: str,
    out_dtype: torch.dtype,
    x_dtype: torch.dtype,
    n: int,
    variant: str,
) -> str | None:
    """Why the compiled CPU path (`stochround.cpu_path`) does not take a CPU call of these
    choices (None if it does): it computes SR from the stream to bfloat16 values (a bf16
    result, or fp32 values), with the random bits and variants it takes (`dispatch` sends
    it there where x is large enough and `torch.compile` can build the path)."""
    if mode != "sr" or source != "stream":
        return "the compiled CPU path computes SR from the random stream only"
    if output != "value" or fmt.name != "bfloat16":
        return "the compiled CPU path computes bfloat16 values only"
    if out_dtype not in (torch.bfloat16, torch.float32):
        return "the compiled CPU path returns bfloat16 or float32 values only"
    if not cpu_path.supports(x_dtype, n, variant):
        return "the compiled CPU path does not take this input dtype, rbits or variant"
    return None


def call_route(choices: tuple, x_dtype: torch.dtype, on_cuda: bool, through_op: bool) -> Route:
    """The route of a call's ``choices`` (`_call_route`'s first arguments): from its cache,
    except under `torch.compile`, which traces the function itself (calling the cached
    wrapper there makes Dynamo warn at every compiled call) and folds it to constants, and
    for unhashable choices, which are routed uncached for the error naming them."""
    if torch.compiler.is_compiling():
        return _call_route.__wrapped__(*choices, x_dtype, on_cuda, through_op)
    try:
        return _call_route(*choices, x_dtype, on_cuda, through_op)
    except TypeError:  # an unhashable choice
        return _call_route.__wrapped__(*choices, x_dtype, on_cuda, through_op)


def through_op(x: Tensor) -> bool:
    """Whether a call goes through the `stochround::round` custom op: under
    `torch.compile`, for autograd, or for a DTensor (shard by shard)."""
    return (
        torch.compiler.is_compiling()
        or (x.requires_grad and torch.is_grad_enabled())
        or is_dtensor(x)
    )


def dispatch(
    x: Tensor, request: Request, backend: str, output: str, out_dtype: torch.dtype
) -> Tensor:
    """The one dispatch point between the PyTorch path and the Triton kernels, for a
    checked request (``output`` and ``out_dtype`` decided).  A hardware unit's request
    (``request.operand`` set) rounds on the PyTorch path."""
    route = _call_route(
        request.fmt,
        request.mode,
        request.n,
        request.variant,
        request.sat,
        request.nan,
        request.source,
        "torch" if request.operand is not None else backend,
        output,
        out_dtype,
        x.dtype,
        on_kernel_device(x),
        False,
    )
    return routed(x, request, route)


def routed(x: Tensor, request: Request, route: Route) -> Tensor:
    """x rounded as a checked request says, by the path its ``route`` (`call_route` of the
    request's choices for x's dtype and device, no custom op) picks: the kernels' plan,
    the compiled CPU path where x is large enough, else the PyTorch path.  `dispatch`
    routes a request first; a caller that resolved the route once (`stochround.rounding.
    prepared`) calls this directly."""
    if route.plan is not None:
        return route.plan.round(x, request.seed, request.offset, request.index_offset, request.rand)
    out_dtype = route.out_dtype
    if route.cpu and cpu_path.worth_compiling(x.numel()) and cpu_path.compile_refusal() is None:
        stream = (request.seed, request.offset, request.index_offset)
        rounded = cpu_path.bf16_sr_cpu(x, *stream, request.n, request.variant, request.sat)
        return rounded if out_dtype == torch.bfloat16 else rounded.to(out_dtype)
    refuse_capture(route.checked, x, request.fmt)
    return round_tensor(x, request, route.output, out_dtype)


__all__ = ["Route", "call_route", "dispatch", "routed", "through_op"]
