"""A training step of one linear layer: `stochround.nn.QuantizedLinear` under the NVFP4
recipe beside the bf16 `nn.Linear` and the NVFP4 emulation a Hopper user can build from
torchao, in one run (issue 31's performance targets).

Shape: ``x`` of ``tokens x features`` (8192 x 4096 by default) in bf16 with
``requires_grad``, a bf16 weight ``W`` of ``features x features`` (``out = in``), no bias,
and an output gradient ``dy`` from randn. One step is the forward and the backward,
``y = layer(x); y.backward(dy)``, with the gradients of x and W set to None first (as
``zero_grad(set_to_none=True)``), so each step computes the three GEMMs::

    fprop   y  = x W^T      dgrad   dx = dy W      wgrad   dW = dy^T x

Rows (case ``linear_step``):

- ``bf16_linear``: ``torch.nn.Linear(bias=False)`` in bf16 (the reference row).
- ``stochround_nvfp4``: ``QuantizedLinear(..., recipe=stochround.nn.nvfp4(), bias=False)``
  in bf16, eager, on the default backend (the Triton kernels on CUDA): x 1x16 blocks and W
  16x16 tiles rounded to nearest, dy rounded stochastically, a 16-point random Hadamard
  transform on both wgrad operands, two-level scales (e4m3 block scales under an fp32
  tensor scale from the amax).
- ``torchao_nvfp4_emulated``: what a Hopper user assembles from torchao's round-to-nearest
  NVFP4 quantizer (``nvfp4_quantize`` with block 16 and the per-tensor scale from the
  tensor's amax, as torchao's NVFP4 linear computes it), a dequantize written here and bf16
  matmuls, as an autograd function: ``y = Q(x) Q(W)^T``, ``dx = Q(dy) Q(W^T)^T``,
  ``dW = Q(dy^T) Q(x^T)^T``, each operand quantized along its GEMM's contraction axis, each
  quantize-dequantize (with the transpose and the amax) one ``torch.compile`` call. It does
  less than the recipe: no SR, no RHT, 1x16 blocks for W.
- ``stochround_<recipe>`` for the other recipes (mxfp8, mxfp4_tseng, int8, fp8), and
  ``stochround_fp8_native`` (``fp8(native=True)``) and ``stochround_nvfp4_pow2``
  (``nvfp4(tensor_scale="pow2")``: the operands hold power-of-two tensor scales, so no GEMM
  scales its result).

The recipes' rows run with the library's defaults, the layer's CUDA step graphs on
(`stochround.nn.step_graphs`); ``stochround_<recipe>_no_step_graphs`` (CUDA): the eager
step with them off (``use_step_graphs(False)``).

The same rows in case ``linear_step_graphed`` (CUDA: the step captured as one CUDA graph
and replayed, what is left without host time) and ``linear_step_compiled`` (the layer
compiled by ``torch.compile``, inductor's default mode; the bf16 row compiled alike).

Checks, before timing (relative Frobenius errors against the fp32 products of the same
bf16 x, W and dy; `step_check`): the bf16 row's y, dx and dW within ``2**-6`` (bf16 output
rounding, accumulation order); stochround's y within ``2**-6`` of the fprop computed from
the recipe's own fprop rules through stochround's PyTorch path (both operands round to
nearest, so y is determined up to accumulation order and bf16 roundings); every quantized
row's dx and dW (and the emulation's y) within ``1/2`` of the exact product, a sanity
bound (`SANITY_BOUND` says why) that a zero, transposed or mis-scaled result fails.

Breakdown (CUDA): after the timed rows, ``torch.profiler`` records ``--profile-steps``
steps of each row that ran (the bf16 row: its GEMMs alone); each kernel's device time is
counted as GEMM (a name holding gemm, matmul, cutlass, sm90 or nvjet) or the rest (quantize,
dequantize, elementwise); the table and the JSON (key ``breakdown``) give both per step,
the GEMM share, and the kernels that took most.

    python benchmarks/bench_nn.py                                          # GPU
    python benchmarks/bench_nn.py --device cpu --tokens 256 --features 256 --no-compile
"""

from __future__ import annotations

import json
import math
import sys
import typing
from collections import defaultdict
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

# harness before stochround: without a GPU it selects Triton's interpreter
import harness
import torch
from harness import Benchmark, CheckFailed, Run, synchronize
from torch import Tensor, nn

if TYPE_CHECKING:
    from stochround.nn import Recipe

CASE = "linear_step"
BLOCK = 16  # NVFP4's block: the contraction lengths must be multiples of it
# The bf16 row's y, dx and dW and stochround's y differ from their references by bf16
# roundings (each at most 2**-9 relative: the output's, and any bf16 copy of an operand)
# and the order of fp32 accumulation: a few times 2**-9, well inside this bound, while a
# wrong value (a rounding rule, a scale, a block axis) moves the result by far more
EXACT_BOUND = 2.0**-6
# A quantized operand's RMS error: round to nearest errs by at most half the gap between
# its two e2m1 neighbours, SR with variance nu (1 - nu) gap**2 <= gap**2 / 4, so either
# way by at most gap / 2 in RMS; e2m1's gap at |v| (in units of the block scale s) is at
# most max(s / 2, |v| / 2), so the RMS error is at most sqrt(s**2 + E v**2) / 4. For randn
# data of standard deviation sigma, s = block amax / 6 <= 0.6 sigma unless a block holds
# a value beyond 3.6 sigma (rare: 16 draws), which bounds the relative RMS error of an
# operand by sqrt(1.36) / 4 < 0.3 (an RHT is orthogonal: the rotated copy's error has the
# same norm). A GEMM of two such operands, independent of each other, errs by
# sqrt(ra**2 + rb**2 + ra**2 rb**2) < 0.45 relative; a zero result errs by 1, a transposed
# or mis-scaled one by more: the bound catches those, not a subtle rounding bug (the
# tests under tests/nn check the rounding)
SANITY_BOUND = 0.5
GEMM_NAMES = ("gemm", "matmul", "cutlass", "sm90", "nvjet")
# e2m1 values by code: sign in bit 3, then 0, 0.5, 1, 1.5, 2, 3, 4, 6
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
TOP_KERNELS = 8  # kernels listed per breakdown


class Inputs:
    """The step's tensors: bf16 x (requires_grad), W and dy from randn (seed 0), the fp32
    products they give exactly (up to fp32 accumulation): y, dx, dW, and x's elements
    (every row's ``elements``)."""

    def __init__(self, tokens: int, features: int, device: torch.device) -> None:
        generator = torch.Generator(device=device).manual_seed(0)

        def draw(rows: int, cols: int, std: float) -> Tensor:
            values = torch.randn(rows, cols, generator=generator, device=device)
            return (values * std).to(torch.bfloat16)

        self.x = draw(tokens, features, 1.0).requires_grad_()
        # nn.Linear's initial weights have standard deviation about in_features**-1/2
        self.weight = draw(features, features, features**-0.5)
        self.dy = draw(tokens, features, 1.0)
        x, w, dy = (t.detach().float() for t in (self.x, self.weight, self.dy))
        self.exact = {"y": x @ w.T, "dx": dy @ w, "dW": dy.T @ x}
        # every row's elements (x's): per-element times compare as the times themselves
        self.elements = tokens * features


def relative_error(value: Tensor, reference: Tensor) -> float:
    """``||value - reference||_F / ||reference||_F`` in fp32 (inf where not finite)."""
    value = value.float()
    if not bool(torch.isfinite(value).all()):
        return math.inf
    return float(torch.linalg.vector_norm(value - reference) / torch.linalg.vector_norm(reference))


def step_check(
    exact: dict[str, Tensor], bounds: dict[str, float], references: dict[str, Tensor]
) -> Callable[[object], str]:
    """A `Run.check` of a step's output ``(y, dx, dW)``: each within its bound (``bounds``,
    by name) of its reference, ``references[name]`` where given, else the exact product."""

    def check(output: object) -> str:
        results = dict(zip(("y", "dx", "dW"), output, strict=True))  # type: ignore[call-overload]
        words = []
        for name, value in results.items():
            reference = references.get(name, exact[name])
            error = relative_error(value, reference)
            against = "recipe fprop" if name in references else "fp32"
            if not error <= bounds[name]:
                raise CheckFailed(
                    f"{name} relative error {error:.2e} to {against} > {bounds[name]:g}"
                )
            words.append(f"{name} {error:.1e}")
        return "ok rel. err " + ", ".join(words)

    return check


def training_step(layer: nn.Module, inputs: Inputs) -> Callable[[], tuple[Tensor, ...]]:
    """The step: gradients set to None, ``y = layer(x)``, ``y.backward(dy)``; returns
    ``(y, dx, dW)``."""
    x, dy = inputs.x, inputs.dy

    def step() -> tuple[Tensor, ...]:
        x.grad = None
        layer.zero_grad(set_to_none=True)
        y = layer(x)
        y.backward(dy)
        return y.detach(), x.grad, layer.weight.grad  # type: ignore[return-value]

    return step


def bf16_linear(inputs: Inputs, how: str = "eager") -> Run:
    """``nn.Linear(bias=False)`` in bf16 with the inputs' weight, run ``how`` (`HOWS`)."""
    features = inputs.weight.shape[0]
    layer = nn.Linear(features, features, bias=False, device=inputs.x.device, dtype=torch.bfloat16)
    layer.weight.data.copy_(inputs.weight)
    bounds = dict.fromkeys(("y", "dx", "dW"), EXACT_BOUND)
    check = step_check(inputs.exact, bounds, {})
    return Run(run_as(layer, inputs, how), check, inputs.elements, notes=HOW_NOTES[how])


def recipe_fprop(inputs: Inputs, recipe: Recipe) -> Tensor:
    """``Q(x) Q(W)^T`` in fp32 with the recipe's fprop rules through stochround's PyTorch
    path (``backend="torch"``): the operands round deterministically (ValueError for a
    recipe whose fprop draws random bits or rotates)."""
    import stochround.blocks as blocks

    values = []
    for spec, operand in ((recipe.fprop_input, inputs.x), (recipe.fprop_weight, inputs.weight)):
        if spec.mode == "sr" or spec.rht is not None or spec.noise != "element":
            raise ValueError(f"recipe_fprop needs round-to-nearest fprop operands; got {spec}")
        tensor_scale = False if spec.tensor_scale == "none" else None
        quantized = blocks.quantize(
            operand.detach(), spec.block_format(), spec.mode, tensor_scale=tensor_scale,
            nvfp4_flavour=spec.nvfp4_flavour, backend="torch",
        )  # fmt: skip
        values.append(quantized.dequantize(torch.float32))
    return values[0] @ values[1].T


# what each recipe row runs (stochround.nn.RECIPES), and the words its notes give
RECIPE_NOTES = {
    "nvfp4": "SR dy, RHT-16 wgrad, 16x16 W, two-level scales",
    "nvfp4_pow2": "nvfp4() with tensor_scale='pow2': power-of-two tensor scales held in the "
    "operands' values, no GEMM scales its result",
    "mxfp8": "e4m3 1x32 blocks, E8M0 scales, RN; bf16 GEMMs under a per-row power of two",
    "mxfp4_tseng": "MXFP4 fwd RN, bwd SR with RHT-64",
    "int8": "int8 row-wise (Qwix), SR gradients",
    "fp8": "per-tensor current scaling, e4m3 fwd / e5m2 bwd, RN, exact emulated GEMMs",
    "fp8_native": "fp8() with gemm='native': the GEMMs on the FP8 tensor cores (_scaled_mm)",
}


# how a row runs its step: as it is, captured as one CUDA graph and replayed, or its layer
# compiled by torch.compile (inductor, default mode)
HOWS = ("eager", "graphed", "compiled")
HOW_NOTES = {"eager": "eager", "graphed": "one CUDA graph", "compiled": "torch.compile"}


def recipe_named(name: str) -> Recipe:
    """The recipe of a row's name (`RECIPE_NOTES`): a named recipe with its defaults, or
    ``fp8_native`` / ``nvfp4_pow2``, fp8() and nvfp4() with one switch."""
    import stochround.nn as srnn

    if name == "fp8_native":
        return srnn.fp8(native=True)
    if name == "nvfp4_pow2":
        return srnn.nvfp4(tensor_scale="pow2")
    return srnn.RECIPES[name]()


def stochround_recipe(
    inputs: Inputs, name: str, how: str = "eager", step_graphs: bool = True
) -> Run:
    """``QuantizedLinear`` under ``stochround.nn.RECIPES[name]()`` in bf16 with the inputs'
    weight, run ``how`` (`HOWS`), with the layer's CUDA step graphs on where
    ``step_graphs`` (the default), else off."""
    import stochround.nn as srnn

    features = inputs.weight.shape[0]
    recipe = recipe_named(name)
    layer = srnn.QuantizedLinear(
        features, features, bias=False, device=inputs.x.device, dtype=torch.bfloat16,
        recipe=recipe,
    )  # fmt: skip
    layer.weight.data.copy_(inputs.weight)
    deterministic_fprop = all(
        spec.mode != "sr" and spec.rht is None and spec.noise == "element"
        and spec.format in ("nvfp4", "mxfp8_e4m3", "mxfp4")
        for spec in (recipe.fprop_input, recipe.fprop_weight)
    )  # fmt: skip
    bounds = {"y": EXACT_BOUND if deterministic_fprop else SANITY_BOUND}
    bounds.update(dx=SANITY_BOUND, dW=SANITY_BOUND)
    exact = {"y": recipe_fprop(inputs, recipe)} if deterministic_fprop else {}
    check = step_check(inputs.exact, bounds, exact)
    step = run_as(layer, inputs, how)
    step = harness.with_step_graphs(step, step_graphs)
    graphs = "" if step_graphs else ", step graphs off"
    notes = f"{HOW_NOTES[how]}{graphs}, default backend; {name}(): {RECIPE_NOTES[name]}"
    return Run(step, check, inputs.elements, notes=notes)


def run_as(layer: nn.Module, inputs: Inputs, how: str) -> Callable[[], tuple[Tensor, ...]]:
    """`training_step` of ``layer`` run ``how`` (`HOWS`): the compiled row's step calls the
    compiled module, whose parameters are the layer's."""
    if how == "compiled":
        step = training_step(typing.cast(nn.Module, torch.compile(layer)), inputs)
    else:
        step = training_step(layer, inputs)
    return harness.graph_of(step) if how == "graphed" else step


def torchao_float8(inputs: Inputs) -> Run:
    """torchao's float8 training (``convert_to_float8_training``, tensorwise dynamic
    scaling, the default config) of an ``nn.Linear`` with the inputs' weight, compiled:
    fp8 GEMMs on the tensor cores (sm89+), no SR."""
    from torchao.float8 import convert_to_float8_training

    features = inputs.weight.shape[0]
    model = nn.Sequential(
        nn.Linear(features, features, bias=False, device=inputs.x.device, dtype=torch.bfloat16)
    )
    model[0].weight.data.copy_(inputs.weight)
    convert_to_float8_training(model)
    compiled = torch.compile(model)
    x, dy = inputs.x, inputs.dy

    def step() -> tuple[Tensor, ...]:
        x.grad = None
        model.zero_grad(set_to_none=True)
        y = compiled(x)
        y.backward(dy)
        return y.detach(), x.grad, model[0].weight.grad  # type: ignore[return-value]

    bounds = dict.fromkeys(("y", "dx", "dW"), SANITY_BOUND)
    notes = "torch.compile; torchao 0.18 float8 tensorwise (fp8 GEMMs, RN)"
    return Run(step, step_check(inputs.exact, bounds, {}), inputs.elements, notes=notes)


# --------------------------------------------------------------------------------------
# the emulation from torchao's quantizer
# --------------------------------------------------------------------------------------


def e2m1_table(device: torch.device) -> Tensor:
    """The 16 e2m1 values in fp32, indexed by code (sign in bit 3)."""
    magnitudes = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)
    return torch.cat((magnitudes, -magnitudes))


def nvfp4_dequantize(
    packed: Tensor, block_scales: Tensor, tensor_scale: Tensor, table: Tensor
) -> Tensor:
    """The bf16 values of torchao's NVFP4 layout: ``packed`` ``(rows, cols / 2)`` uint8
    codes, two a byte with the even column in the low nibble; ``block_scales``
    ``(rows, cols / 16)`` e4m3; value = ``table[code] * fp32(block scale) * tensor_scale``,
    computed in fp32 and rounded to bf16 once (the bf16 GEMM's operand)."""
    rows = packed.shape[0]
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(rows, -1, BLOCK)
    scales = block_scales.to(torch.float32) * tensor_scale
    values = table[codes.to(torch.int64)] * scales.unsqueeze(-1)
    return values.reshape(rows, -1).to(torch.bfloat16)


def torchao_round_trip(operand: Tensor, table: Tensor, transpose: bool) -> Tensor:
    """Q(operand) (of ``operand.T`` where ``transpose``) in bf16: torchao's
    ``nvfp4_quantize`` (round to nearest, blocks of 16 along the last axis) with the
    per-tensor scale from the amax as its NVFP4 linear computes it, then
    `nvfp4_dequantize`."""
    from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize, per_tensor_amax_to_scale

    data = operand.T.contiguous() if transpose else operand
    tensor_scale = per_tensor_amax_to_scale(torch.amax(torch.abs(data)))
    block_scales, packed = nvfp4_quantize(data, BLOCK, per_tensor_scale=tensor_scale)
    return nvfp4_dequantize(packed, block_scales, tensor_scale, table)


class EmulatedNVFP4Matmul(torch.autograd.Function):
    """``x W^T`` with each GEMM's operands round-tripped through NVFP4 along its
    contraction axis (``plain`` and ``transposed``: the round trips of a tensor and of its
    transpose) and multiplied in bf16 (fp32 accumulation)."""

    @staticmethod
    def forward(
        ctx: Any,
        x: Tensor,
        weight: Tensor,
        plain: Callable[[Tensor], Tensor],
        transposed: Callable[[Tensor], Tensor],
    ) -> Tensor:
        # detached plain tensors, so that a compiled round trip sees one kind of input
        # (not a Parameter, not requiring grad) and compiles once per shape
        x, weight = x.detach(), weight.detach()
        ctx.save_for_backward(x, weight)
        ctx.round_trips = (plain, transposed)
        return plain(x) @ plain(weight).T

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple[Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        plain, transposed = ctx.round_trips
        dy = dy.detach().contiguous()
        dx = plain(dy) @ transposed(weight).T
        dw = transposed(dy) @ transposed(x).T
        return dx, dw, None, None


class EmulatedNVFP4Linear(nn.Module):
    """A bias-free linear layer on `EmulatedNVFP4Matmul`, its round trips compiled by
    ``torch.compile`` (static shapes) where ``compiled``."""

    def __init__(self, weight: Tensor, compiled: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone())
        table = e2m1_table(weight.device)

        def plain(operand: Tensor) -> Tensor:
            return torchao_round_trip(operand, table, transpose=False)

        def transposed(operand: Tensor) -> Tensor:
            return torchao_round_trip(operand, table, transpose=True)

        self.round_trips: tuple[Callable[[Tensor], Tensor], ...] = (plain, transposed)
        if compiled:
            self.round_trips = tuple(torch.compile(f, dynamic=False) for f in self.round_trips)

    def forward(self, x: Tensor) -> Tensor:
        out = EmulatedNVFP4Matmul.apply(x, self.weight, *self.round_trips)
        return out  # type: ignore[no-any-return]


def torchao_nvfp4_emulated(inputs: Inputs, compiled: bool) -> Run:
    """`EmulatedNVFP4Linear` with the inputs' weight."""
    layer = EmulatedNVFP4Linear(inputs.weight, compiled)
    bounds = dict.fromkeys(("y", "dx", "dW"), SANITY_BOUND)
    notes = ("torch.compile" if compiled else "eager") + " round trips, bf16 matmuls, RN"
    check = step_check(inputs.exact, bounds, {})
    return Run(training_step(layer, inputs), check, inputs.elements, notes=notes)


# --------------------------------------------------------------------------------------
# the breakdown
# --------------------------------------------------------------------------------------


def is_gemm(name: str) -> bool:
    """Whether a kernel's name marks it as a GEMM (`GEMM_NAMES`)."""
    lowered = name.lower()
    return any(word in lowered for word in GEMM_NAMES)


def kernel_breakdown(
    step: Callable[[], object],
    steps: int,
    device: torch.device,
    device_type: torch.autograd.DeviceType = torch.autograd.DeviceType.CUDA,
) -> dict[str, object]:
    """Device time per step of ``steps`` steps under ``torch.profiler`` (after two
    unrecorded steps): in total, in GEMM kernels (`is_gemm`) and in the rest, the GEMM
    share, the kernel launches per step, and the `TOP_KERNELS` kernels that took most
    (name, microseconds and calls per step). ``device_type``: the events counted."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        step()
    synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as recorded:
        for _ in range(steps):
            step()
        synchronize(device)
    times: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for event in recorded.events():
        if event.device_type == device_type:
            times[event.name] += event.time_range.elapsed_us()
            calls[event.name] += 1
    total = sum(times.values()) / steps
    gemm = sum(t for name, t in times.items() if is_gemm(name)) / steps
    top = sorted(times, key=times.__getitem__, reverse=True)[:TOP_KERNELS]
    return {
        "steps": steps,
        "total_us": total,
        "gemm_us": gemm,
        "other_us": total - gemm,
        "gemm_share": gemm / total if total else None,
        "kernels_per_step": sum(calls.values()) / steps,
        "top": [[name, times[name] / steps, calls[name] / steps] for name in top],
    }


def print_breakdown(breakdown: dict[str, dict[str, Any]], flops: float) -> None:
    """The breakdown as a small table, and the top kernels of each row."""
    print(f"device time per step (torch.profiler); TFLOP/s: {flops:.3g} FLOP (6 T in out) / total")
    headers = ("total us", "GEMM us", "rest us", "GEMM %", "TFLOP/s")
    print(f"  {'row':<24} " + " ".join(f"{header:>10}" for header in headers))
    for name, row in breakdown.items():
        if "error" in row:
            print(f"  {name:<24} failed: {row['error']}")
            continue
        share = 100 * row["gemm_share"] if row["gemm_share"] is not None else math.nan
        rate = flops / row["total_us"] / 1e6 if row["total_us"] else math.nan
        print(
            f"  {name:<24} {row['total_us']:>10.1f} {row['gemm_us']:>10.1f} "
            f"{row['other_us']:>10.1f} {share:>10.1f} {rate:>10.1f}"
        )
    for name, row in breakdown.items():
        for kernel, microseconds, count in row.get("top", []):
            kind = "GEMM" if is_gemm(kernel) else "rest"
            print(f"  {name}: {microseconds:9.1f} us {count:5.1f}x {kind} {kernel[:110]}")


def add_breakdown(
    path: Path, builds: dict[str, Callable[[], Run]], steps: int, device: torch.device, flops: float
) -> None:
    """Profile each row of ``builds`` that ran (status ok in the JSON at ``path``), print
    the breakdown and store it in the JSON under ``breakdown``. A row whose profile fails
    gets its error there instead (the timed results stand)."""
    data = json.loads(path.read_text())
    ran = {row["provider"] for row in data["rows"] if row["status"] == "ok"}
    breakdown: dict[str, dict[str, Any]] = {}
    for name, build in builds.items():
        if name not in ran:
            continue
        try:
            breakdown[name] = kernel_breakdown(build().call, steps, device)
        except Exception as error:  # the timed rows stand without it
            breakdown[name] = {"error": f"{type(error).__name__}: {error}"[:300]}
        harness.free(device)
    data["breakdown"] = breakdown
    path.write_text(json.dumps(data, indent=1))
    print_breakdown(breakdown, flops)


def main() -> int:
    bench = Benchmark("bench_nn", __doc__, reference=f"{CASE}/bf16_linear")
    add = bench.parser.add_argument
    add("--tokens", type=int, default=8192, help="rows of x (8192)")
    add("--features", type=int, default=4096, help="in = out features (4096)")
    add("--no-compile", action="store_true", help="the emulation's round trips eager")
    add("--profile-steps", type=int, default=10, help="steps profiled per row, CUDA (10)")
    args = bench.parse_args()
    for name in ("tokens", "features"):
        value = getattr(args, name)
        if value <= 0 or value % BLOCK:
            bench.parser.error(f"--{name} must be a positive multiple of {BLOCK}; got {value}")
    if args.profile_steps < 1:
        bench.parser.error(f"--profile-steps must be at least 1; got {args.profile_steps}")
    inputs = Inputs(args.tokens, args.features, bench.device)
    builds: dict[str, Callable[[], Run]] = {
        "bf16_linear": partial(bf16_linear, inputs),
        "torchao_nvfp4_emulated": partial(torchao_nvfp4_emulated, inputs, not args.no_compile),
    }
    for name in RECIPE_NOTES:
        builds[f"stochround_{name}"] = partial(stochround_recipe, inputs, name)
    bench.add(CASE, "bf16_linear", builds["bf16_linear"], reference=True)
    for name in RECIPE_NOTES:
        cuda_only = name == "fp8_native"  # FP8 tensor cores
        build = builds[f"stochround_{name}"]
        bench.add(CASE, f"stochround_{name}", build, ours=True, cuda_only=cuda_only)
        # the same step with the layer's CUDA step graphs off
        eager = partial(stochround_recipe, inputs, name, "eager", False)
        bench.add(CASE, f"stochround_{name}_no_step_graphs", eager, ours=True, cuda_only=True)
    bench.add(
        CASE, "torchao_nvfp4_emulated", builds["torchao_nvfp4_emulated"], requires=("torchao",)
    )
    bench.add(
        CASE, "torchao_float8", partial(torchao_float8, inputs), requires=("torchao",),
        cuda_only=True,
    )  # fmt: skip
    # the same steps captured as CUDA graphs (what is left without host time) and compiled
    for how in HOWS[1:]:
        case, graphed = f"{CASE}_{how}", how == "graphed"
        bench.add(case, "bf16_linear", partial(bf16_linear, inputs, how), cuda_only=graphed)
        for name in RECIPE_NOTES:
            run = partial(stochround_recipe, inputs, name, how)
            cuda_only = graphed or name == "fp8_native"
            bench.add(case, f"stochround_{name}", run, ours=True, cuda_only=cuda_only)
    status = bench.run()
    if bench.device.type == "cuda":
        path = args.out / f"bench_nn{'_' + args.tag if args.tag else ''}.json"
        flops = 6.0 * args.tokens * args.features**2
        add_breakdown(path, builds, args.profile_steps, bench.device, flops)
    return status


if __name__ == "__main__":
    sys.exit(main())
