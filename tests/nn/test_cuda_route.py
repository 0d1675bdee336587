"""The route a CUDA tensor takes, on the CPU (`stochround.kernels.availability.cpu_as_cuda`,
under Triton's interpreter): a `QuantizedLinear` step's operands there are the PyTorch
path's bit for bit, and the operations a step and a block quantization dispatch there are
counted exactly (benchmarks/bench_ops.py): on a GPU each costs the host microseconds, so a
change that adds one fails here."""

from __future__ import annotations

import functools
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch import Tensor

import stochround.nn as srnn
from stochround.kernels import availability
from stochround.nn import matmul, operands, orientations

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import bench_ops  # noqa: E402
from helpers import cuda_route, graphed_route  # noqa: E402

# the eager route's own launches and operands: its steps without their CUDA graphs
pytestmark = pytest.mark.usefixtures("no_step_graphs")

# One nvfp4() step of a 64 x 64 layer with bias on 64 fp32 tokens, forward and backward.
# x and dy are each quantized in both orientations at once (`stochround.nn.orientations`,
# the row-wise operand and the wgrad one, transposed and rotated): per tensor one amax launch
# reading it once for both tensor amaxes, whose last program writes both tensor scales, and
# one launch writing both operands, so no transpose launch.  fprop's W in 16 x 16 tiles reads
# its tiles' amaxes and its tensor scales in one launch (the tile-amax kernel) and is quantized
# by the block kernel; dgrad's W^T is fprop's Q(W), read transposed.  Three GEMMs: fprop's,
# which adds the bias, a product and the epilogue launch that scales it (cuBLAS's mm with an
# fp32 output at this size); dgrad's and wgrad's, which take their tensor scales alone,
# cuBLASLt's GEMM scaled in its own epilogue (`stochround.kernels.cublaslt`: no launch of
# ours, no ATen op but the output's allocation and alpha, the tensor scales' product).
NVFP4_LAUNCHES = {
    "two_orientation_amax_kernel": 2,
    "two_orientation_kernel": 2,
    "_tile_amax_kernel": 1,
    "quantize_blocks_kernel": 1,
    "_epilogue_kernel": 1,
}
NVFP4_ATEN = {
    # the step: the offsets of the layer's 16 slots as one column (one add) read from the
    # counter before it advances (no copy of the step), split into one-element views in the
    # forward (the backward takes the forward's)
    "aten::add_.Tensor": 1,
    "aten::add.Tensor": 1,
    # + x's pair's S_dec views (one unbind of its four tensor scales; dy's pair, whose
    # operands the backward reads at once, keeps its scales and their views)
    "aten::unbind.int": 1 + 1,
    # the pairs' outputs (both operands, x's four tensor scales: the partial maxima and
    # ticket counter are kept by the prepared pair) and W's tensor scales (its tiles'
    # amaxes, which its quantize launch alone reads, kept by the prepared tile amax)
    "aten::new_empty": 2 + 1 + 2 + 1,
    "aten::empty_like": 1 + 1,  # + fprop's epilogue's output
    # W's S_dec
    "aten::select.int": 1,
    # fprop's GEMM: b transposed (a view) and cuBLAS's bf16 product with an fp32 output;
    # dgrad's and wgrad's: alpha and the output (cuBLASLt reads b as it lies)
    "aten::permute": 1,
    "aten::mm.dtype": 1,
    "aten::mul.Tensor": 2,
    "aten::empty.memory_format": 2,
    # db, and the autograd engine's detach of each gradient it accumulates
    "aten::sum.dim_IntList": 1,
    "aten::detach": 3,
}


# nvfp4(tensor_scale="pow2"): the operands' values hold their power-of-two tensor scales, so
# no GEMM scales its result but fprop's, which adds the bias (the epilogue launch), and W's
# S_dec is not selected for the GEMM; dgrad's and wgrad's products are cuBLAS's mm to fp32
# (cast: `rounded_matmul`), with b transposed
NVFP4_POW2_LAUNCHES = NVFP4_LAUNCHES
ALPHA_ONLY = ("aten::select.int", "aten::mul.Tensor", "aten::empty.memory_format")
NVFP4_POW2_ATEN = {
    **{name: n for name, n in NVFP4_ATEN.items() if name not in ALPHA_ONLY},
    "aten::permute": 2,
    "aten::mm.dtype": 3,
}


# One fp8() step of the same layer: three tensors quantized per tensor (fprop's x and W,
# dgrad's dy; dgrad's W^T, wgrad's dy^T and x^T are their Q(.) transposed, bit for bit), each
# by two launches (the amax's partial maxima; `stochround.kernels.tensor_round`'s one pass,
# which multiplies, rounds, stores the bf16 values and their transpose: no transpose
# launches); three GEMMs as nvfp4()'s (fprop's product and epilogue, then cuBLASLt's).
FP8_LAUNCHES = {
    "_amax_kernel": 3,
    "_tensor_round_kernel": 3,
    "_epilogue_kernel": 1,
}
FP8_ATEN = {
    # the step: the slots' offsets (one add) read from the counter before it advances,
    # split into one-element views in the forward (the backward takes the forward's)
    "aten::add_.Tensor": 1,
    "aten::add.Tensor": 1,
    "aten::unbind.int": 1,
    # per quantized tensor: the partial maxima, the bf16 values and their transpose
    # (allocations); the amax of the partial maxima (max of the bits, viewed as fp32, a
    # view and its detach); the scale amax / max, its floor and the multiplier 1 / scale
    # (`tensor_scales`).  The kernel reads the 0-d multiplier and x and writes bf16: the
    # product (and its multiplier's 1-element view), the codes' float8 view (and its
    # detach) and their bf16 copy are gone
    "aten::new_empty": 3 * 3,
    "aten::amax": 3,
    "aten::view.dtype": 3,
    "aten::detach": 3 + 3,  # + the autograd engine's detach of each gradient
    "aten::div.Tensor": 3 * 2,
    "aten::maximum": 3,
    # fprop's GEMM: b transposed (a view), cuBLAS's bf16 product with an fp32 output, the
    # epilogue's output; dgrad's and wgrad's: alpha and the output
    "aten::permute": 1,
    "aten::mm.dtype": 1,
    "aten::empty_like": 1,
    "aten::mul.Tensor": 2,
    "aten::empty.memory_format": 2,
    # db
    "aten::sum.dim_IntList": 1,
}


# the library's recipes, and nvfp4() with power-of-two tensor scales
RECIPES = {**srnn.RECIPES, "nvfp4_pow2": functools.partial(srnn.nvfp4, tensor_scale="pow2")}


def quantized_operands(name: str, route: bool, monkeypatch: pytest.MonkeyPatch) -> dict:
    """Each quantized operand of two training steps of a 64 x 64 layer under recipe
    ``name`` (fp32 values on the CPU by role and step), on the CUDA route (``route``) or
    the CPU's."""
    torch.manual_seed(0)
    device, context = cuda_route(route)
    linear_layer = torch.nn.Linear(64, 64).to(device)
    layer = srnn.QuantizedLinear.from_linear(linear_layer, RECIPES[name]())
    x = torch.randn(64, 64).to(device).requires_grad_()
    grad = torch.randn(64, 64).to(device)
    calls: dict = {}
    original = operands.quantize_operand

    def spy(operand: Tensor, entry: operands.Operand, *args: object, **kwargs: object) -> object:
        result = original(operand, entry, *args, **kwargs)  # type: ignore[arg-type]
        values = operands.dequantized_operand(result).cpu()
        calls[entry.role, int(layer.step) - 1] = values
        return result

    monkeypatch.setattr(matmul, "quantize_operand", spy)
    # each operand quantized on its own (the pair, which quantizes x and dy in both
    # orientations at once, equals this path bit for bit: tests/kernels/test_two_orientation)
    monkeypatch.setattr(orientations, "SERVES_STEPS", False)
    with context:
        for _ in range(2):
            layer(x).backward(grad)
    return calls


@pytest.mark.parametrize("name", ["nvfp4", "nvfp4_pow2", "mxfp4_tseng", "mxfp8", "fp8", "int8"])
def test_the_cuda_route_quantizes_every_operand_as_the_cpu_path_does(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernels = quantized_operands(name, True, monkeypatch)
    reference = quantized_operands(name, False, monkeypatch)
    # fp8 quantizes three roles a step (the other three are their transposes)
    assert kernels.keys() == reference.keys() and len(kernels) >= 6
    for key, values in reference.items():
        assert torch.equal(kernels[key], values), key


def test_cpu_as_cuda_needs_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(availability, "INTERPRETED", False)
    route = availability.cpu_as_cuda()
    with pytest.raises(ValueError, match=r"cpu_as_cuda needs Triton's interpreter"):
        route.__enter__()


def counts_of(case: str) -> bench_ops.Counts:
    return bench_ops.counted(bench_ops.cases(64, 64)[case])


@pytest.mark.parametrize(
    ("case", "launches", "aten", "totals"),
    [
        ("linear_nvfp4", NVFP4_LAUNCHES, NVFP4_ATEN, (7, 23, 0)),
        ("linear_nvfp4_pow2", NVFP4_POW2_LAUNCHES, NVFP4_POW2_ATEN, (7, 21, 0)),
        ("linear_fp8", FP8_LAUNCHES, FP8_ATEN, (7, 41, 0)),
    ],
)
def test_a_layer_step_dispatches_its_pinned_launches_and_aten_ops(
    case: str, launches: dict[str, int], aten: dict[str, int], totals: tuple[int, int, int]
) -> None:
    """nvfp4(): seven launches and twenty-three ATen ops (with power-of-two tensor scales,
    seven and twenty-one); fp8(): seven and forty-one."""
    counts = counts_of(case)
    names = Counter(counts.names)
    launched = {name.removeprefix("launch:"): n for name, n in names.items() if "launch:" in name}
    dispatched = {name: n for name, n in names.items() if name.startswith("aten::")}
    assert launched == launches
    assert dispatched == aten
    assert (counts.launches, counts.aten, counts.other) == totals


# The graphed route's step (`stochround.nn.opaque_matmul`'s step functions, which the CUDA
# step graphs capture and torch.compile's two ops run) beside the eager step's.  Where the
# step graphs serve it (an eager graphed step; a compiled step traced with them on) its
# forward keeps nothing, as before the twelfth session: it quantizes x for fprop alone,
# and its backward quantizes x^T for wgrad and W for dgrad again (their amaxes,
# transposes and quantizations): 13 launches, not the kept step's 7 ...
GRAPHED_UNKEPT_LAUNCHES = {
    "linear_nvfp4": {
        "two_orientation_amax_kernel": 1,  # dy's pair alone
        "two_orientation_kernel": 1,
        "_amax_kernel": 2,
        "_transpose_kernel": 2,
        "quantize_blocks_kernel": 4,
        "_tile_amax_kernel": 2,  # W's tiles in the forward and again in the backward
        "_epilogue_kernel": 1,
    },
    "linear_fp8": {
        "_amax_kernel": 5,  # x^T and W^T quantized again: no transposed Q(x), Q(W) kept
        "_tensor_round_kernel": 5,
        "_transpose_kernel": 2,
        "_epilogue_kernel": 1,
    },
}
# ... and dispatches this many ATen ops (the kept step's 25 and 42)
GRAPHED_UNKEPT_ATEN = {"linear_nvfp4": 35, "linear_fp8": 62}
# ... where they will not serve it (a compiled step traced with them off, on the CPU or
# above the work bound: `keeps_operands`), its forward keeps Q(W) and x's wgrad operand
# (from x's pair) for its backward, as the eager forward does, so its backward quantizes
# dy alone: the eager step's launches.  One ATen op more than eager's: the backward splits
# the saved offsets column again (the eager backward takes its forward's views); for
# nvfp4() one more, a clone of its kept scale, which is a view into a buffer beside its
# values (an op output must start its storage: `op_output`)
GRAPHED_ATEN_MORE = {
    "linear_nvfp4": {"aten::unbind.int": 1, "aten::clone": 1},
    "linear_fp8": {"aten::unbind.int": 1},
}


def graphed(case: str, keep: bool, monkeypatch: pytest.MonkeyPatch) -> bench_ops.Counts:
    """``case``'s counts with the layer's steps by `GraphedMatmul` (`graphed_route`: as a
    CUDA step takes them where the step graphs serve it; on the CPU its functions run as
    they are), keeping the backward's operands where ``keep``."""
    with monkeypatch.context() as patched:
        graphed_route(patched, keep)
        return counts_of(case)


@pytest.mark.parametrize(
    ("case", "launches", "aten"),
    [("linear_nvfp4", NVFP4_LAUNCHES, NVFP4_ATEN), ("linear_fp8", FP8_LAUNCHES, FP8_ATEN)],
)
@pytest.mark.parametrize("keep", [True, False])
def test_the_graphed_step_quantizes_x_and_w_again_only_where_it_keeps_nothing(
    case: str,
    launches: dict[str, int],
    aten: dict[str, int],
    keep: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counts = graphed(case, keep, monkeypatch)
    names = Counter(counts.names)
    launched = {name.removeprefix("launch:"): n for name, n in names.items() if "launch:" in name}
    dispatched = Counter({name: n for name, n in names.items() if name.startswith("aten::")})
    if keep:
        assert launched == launches
        assert dispatched == Counter(aten) + Counter(GRAPHED_ATEN_MORE[case])
    else:
        assert launched == GRAPHED_UNKEPT_LAUNCHES[case]
        assert sum(dispatched.values()) == GRAPHED_UNKEPT_ATEN[case]
    assert counts.other == 0


@pytest.mark.parametrize("name", ["nvfp4", "fp8"])
def test_an_inference_forward_on_the_graphed_route_launches_what_eagers_does(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under no_grad the forward op keeps nothing: no pair of x (one orientation), no
    transpose."""
    device = bench_ops.device()
    torch.manual_seed(0)
    layer = srnn.QuantizedLinear(64, 64, recipe=srnn.RECIPES[name](), device=device)
    x = torch.randn(64, 64, device=device)

    def forward() -> None:
        with torch.no_grad():
            layer(x)

    eager = bench_ops.counted(forward)
    with monkeypatch.context() as patched:
        graphed_route(patched, keep=False)
        graphed_counts = bench_ops.counted(forward)
    launched = [n for n in graphed_counts.names if n.startswith("launch:")]
    assert Counter(launched) == Counter(n for n in eager.names if n.startswith("launch:"))
    assert not any("two_orientation" in each for each in launched)


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        # the single launch of the amax and the quantization (`kernels.single_launch`: at
        # this size; above `SINGLE_LAUNCH_MAX_BYTES` two launches, the amax's then the
        # quantization's); tensor scales, codes, scales, the e4m3 view of the scales (and
        # its detach), the 0-d S_dec (the ticket counters, partial maxima and amax are the
        # stream's, kept clean by the launch: `tensor_scales.stream_scratch`)
        ("quantize_nvfp4_sr", (1, 6, 0)),
        # the quantization; codes, scales, the e8m0 view of the scales and the e4m3fn view
        # of the codes (each with its detach)
        ("quantize_mxfp8_e4m3_rne", (1, 6, 0)),
    ],
)
def test_a_block_quantization_dispatches_its_launches_and_allocations_alone(
    case: str, expected: tuple[int, int, int]
) -> None:
    counts = counts_of(case)
    assert (counts.launches, counts.aten, counts.other) == expected, Counter(counts.names)


def fp8_steps(transposes: bool) -> list[Tensor]:
    """y, dx, dW and db of two fp8() steps of a 64 x 96 layer on the CUDA route, with the
    plan's per-tensor transposes (``transposes``) or each role quantized itself."""
    torch.manual_seed(0)
    device, context = cuda_route(True)
    linear_layer = torch.nn.Linear(64, 96).to(device)
    layer = srnn.QuantizedLinear.from_linear(linear_layer, srnn.RECIPES["fp8"]())
    if not transposes:
        layer.plan = layer.plan._replace(tensor_transposes=frozenset())
    x = (torch.randn(48, 64) * 3).to(device).requires_grad_()
    results = []
    with context:
        for _ in range(2):
            x.grad = layer.weight.grad = layer.bias.grad = None
            y = layer(x)
            y.backward(torch.randn(48, 96).to(device))
            results += [y.detach(), x.grad, layer.weight.grad, layer.bias.grad]
    return results


def test_an_fp8_step_with_its_transposed_operands_equals_the_step_quantizing_each_role() -> None:
    plan = srnn.QuantizedLinear(64, 96, recipe=srnn.RECIPES["fp8"]()).plan
    assert plan.tensor_transposes == {"dgrad_weight", "wgrad_input", "wgrad_grad_output"}
    for got, want in zip(fp8_steps(True), fp8_steps(False), strict=True):
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_an_fp8_native_step_dispatches_six_launches_and_forty_seven_aten_ops() -> None:
    # fp8()'s step less its epilogues (3 launches, 3 empty_like) and mm's permutes, with
    # torch._scaled_mm's GEMMs (3 _scaled_mm, b's 3 t, the 6 scales' 0-d views), and
    # fprop's bias added after its fp32 product (cuBLAS adds one in the epilogue of 16-bit
    # outputs).  The kernel writes the float8 codes and their transpose into float8
    # tensors: no views of the codes as bytes and back around transposes
    counts = counts_of("linear_fp8_native")
    assert (counts.launches, counts.aten, counts.other) == (6, 47, 0), Counter(counts.names)
