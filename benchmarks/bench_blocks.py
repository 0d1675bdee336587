"""Block-scaled quantization: stochround's `blocks.quantize` and `blocks.fake_quantize` with
SR beside torchao's round-to-nearest quantizers and the memory floors, in one run.

Input: a ``size x size`` bf16 tensor drawn from randn (8192 x 8192 by default, issue 30's
size). Each case is one operation; its rows are stochround (``sr``, seed 1, the default
backend: the Triton kernel on CUDA), the peers where they exist, and the case's floor:

- ``nvfp4_1level``: NVFP4 SR with ``tensor_scale=False`` (single-level scaling); torchao's
  compiled ``nvfp4_quantize(x, 16)`` (round to nearest, no per-tensor scale).
- ``nvfp4_2level``: NVFP4 SR with the tensor scale computed from the tensor's amax;
  torchao's compiled ``nvfp4_quantize(x, 16, per_tensor_scale)`` with the scale computed
  from ``max(|x|)`` in the same compiled call (as its NVFP4 linear does).
- ``nvfp4_2level_rht16``, ``nvfp4_1level_rht16``: the same with the 16-point random
  Hadamard transform fused (``rht=16``).
- ``mxfp8_e4m3``: MXFP8 (e4m3 elements) SR; torchao's compiled
  ``to_mx(x, torch.float8_e4m3fn, 32)`` with the scale modes ``floor`` and ``rceil``.
- ``mxfp4``: MXFP4 SR (torchao 0.18's ``to_mx`` takes no fp4 element dtype name).
- ``fake_mxfp8_e4m3``, ``fake_nvfp4``: `fake_quantize` (quantize and dequantize in one
  pass, bf16 out).
- ``int8_rowwise_gemm``: `gemm_operand` of int8 row-wise (the ``int8()`` recipe's operand:
  bf16 values and fp32 row scales, one launch of the row operand kernel).

- ``nvfp4_two_orientation``: both GEMM operands of a ``size x size/2`` bf16 x (8192 x
  4096: tokens x features) as `QuantizedLinear` quantizes them under ``nvfp4()``: dy's
  (dgrad's row-wise SR operand and wgrad's column-wise SR operand after the RHT-16 along
  the tokens, each with its tensor scale) and x's (round to nearest). Rows
  ``stochround_pair_dy`` and ``stochround_pair_x``: one amax launch and one quantize
  launch (`stochround.nn.orientations`); ``stochround_separate_dy``: the separate path
  (the transpose kernel, then each operand's amax and quantize launches). Its floor: a
  Triton kernel reading x once and writing it twice in bf16, as it is and transposed
  (the operands' values are bf16): 6 bytes an element for every row.

Floors (provider ``floor``), measured in the same run: a Triton kernel that reads the bf16
input once and writes the case's output bytes (the codes: one byte an element for fp8, one
a pair for fp4; one scale byte a block), and for the two-level cases one more read of the
input (``torch.amax``) before it; for ``fake_quantize`` and the int8 row-wise operand (bf16
values), a bf16 copy (plus the amax read for NVFP4). A case's floor moves the bytes its
stochround row moves, so a row's bandwidth over its floor's is the fraction of the floor
it reaches (``check.py``'s ``percent_of``); the table printed last lists it for every
stochround row.

Every stochround output is checked before it is timed: codes, scales and tensor scale
(or the fake-quantized values) bit for bit against the same call on stochround's PyTorch
path (``backend="torch"``). Peers are timed unchecked (they round to nearest).

    python benchmarks/bench_blocks.py                                  # GPU, 8192 x 8192
    python benchmarks/bench_blocks.py --device cpu --size 256 --no-compile   # smoke test
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

# harness before triton: without a GPU it selects Triton's interpreter, which Triton reads
# when it is imported and when a kernel is decorated
import harness  # noqa: F401
import torch
import triton
import triton.language as tl
from harness import Benchmark, CheckFailed, Run, same_bytes
from torch import Tensor

SEED = 1
# stochround's rows: case -> (function, block format, keywords, bytes an element: bf16 read,
# codes and scales written (fake: bf16 written), plus one bf16 read of x for the amax)
OURS: dict[str, tuple[str, str, dict[str, object], float]] = {
    "nvfp4_1level": ("quantize", "nvfp4", {"tensor_scale": False}, 2 + 0.5 + 1 / 16),
    "nvfp4_2level": ("quantize", "nvfp4", {}, 2 + 2 + 0.5 + 1 / 16),
    "nvfp4_1level_rht16": ("quantize", "nvfp4", {"tensor_scale": False, "rht": 16}, 2.5625),
    "nvfp4_2level_rht16": ("quantize", "nvfp4", {"rht": 16}, 4.5625),
    "mxfp8_e4m3": ("quantize", "mxfp8_e4m3", {}, 2 + 1 + 1 / 32),
    "mxfp4": ("quantize", "mxfp4", {}, 2 + 0.5 + 1 / 32),
    "fake_mxfp8_e4m3": ("fake_quantize", "mxfp8_e4m3", {}, 2 + 2),
    "fake_nvfp4": ("fake_quantize", "nvfp4", {}, 2 + 2 + 2),
    "int8_rowwise_gemm": ("gemm_operand", "int8_rowwise", {}, 2 + 2),
}
# each case's floor: (elements a block, elements a code byte, one more read of x) for the
# quantize cases; None for fake_quantize (a bf16 copy, with the amax read for NVFP4)
FLOORS: dict[str, tuple[int, int, bool] | None] = {
    "nvfp4_1level": (16, 2, False),
    "nvfp4_2level": (16, 2, True),
    "nvfp4_1level_rht16": (16, 2, False),
    "nvfp4_2level_rht16": (16, 2, True),
    "mxfp8_e4m3": (32, 1, False),
    "mxfp4": (32, 2, False),
    "fake_mxfp8_e4m3": None,
    "fake_nvfp4": None,
    "int8_rowwise_gemm": None,
}
TILE = 4096  # elements a program of the floor kernel handles


@triton.jit
def floor_kernel(
    x_ptr,
    codes_ptr,
    scales_ptr,
    words,
    BLOCK: tl.constexpr,
    PAIRS: tl.constexpr,
    TILE: tl.constexpr,
):
    """Read TILE bf16 values as int32 words (two values a word, the first in the low half)
    and write the bytes a block quantizer writes, with no arithmetic to speak of: per word,
    one code byte of the two values' top nibbles (``PAIRS``, fp4) or their two top bytes
    (fp8), and per block of BLOCK values one scale byte from its largest magnitude bits."""
    HALF: tl.constexpr = BLOCK // 2
    rows = tl.program_id(0).to(tl.int64) * (TILE // BLOCK) + tl.arange(0, TILE // BLOCK)
    columns = tl.arange(0, HALF)
    index = rows[:, None] * HALF + columns[None, :]
    inside = index < words
    word = tl.load(x_ptr + index, mask=inside, other=0)
    magnitude = tl.maximum(word & 0x7FFF, (word >> 16) & 0x7FFF)
    scale = (tl.max(magnitude, axis=1) >> 7).to(tl.uint8)
    tl.store(scales_ptr + rows, scale, mask=rows * HALF < words)
    if PAIRS:
        code = ((word >> 12) & 0xF) | ((word >> 24) & 0xF0)
        tl.store(codes_ptr + index, code.to(tl.uint8), mask=inside)
    else:
        code = ((word >> 8) & 0xFF) | ((word >> 16) & 0xFF00)
        tl.store(codes_ptr + index, code.to(tl.int16), mask=inside)


PAIR_TILE = 64  # the side of a tile of the two-orientation floor kernel
PAIR_BYTES = 2 + 2 + 2  # one bf16 read of x, a bf16 write of each orientation


@triton.jit
def pair_floor_kernel(x_ptr, row_ptr, column_ptr, tokens, features, TILE: tl.constexpr):
    """Read a TILE x TILE tile of x (tokens x features) once; write it to ``row`` as it is
    and to ``column`` transposed: the bytes the two-orientation quantizer moves."""
    tiles = tl.cdiv(features, TILE)
    program = tl.program_id(0).to(tl.int64)
    token = (program // tiles) * TILE + tl.arange(0, TILE)[:, None]
    feature = (program % tiles) * TILE + tl.arange(0, TILE)[None, :]
    inside = (token < tokens) & (feature < features)
    tile = tl.load(x_ptr + token * features + feature, mask=inside)
    tl.store(row_ptr + token * features + feature, tile, mask=inside)
    t_feature = (program % tiles) * TILE + tl.arange(0, TILE)[:, None]
    t_token = (program // tiles) * TILE + tl.arange(0, TILE)[None, :]
    t_inside = (t_feature < features) & (t_token < tokens)
    tl.store(column_ptr + t_feature * tokens + t_token, tl.trans(tile), mask=t_inside)


def pair_floor(x: Tensor) -> Run:
    """The floor of the two-orientation case: `pair_floor_kernel`."""
    tokens, features = x.shape
    row, column = torch.empty_like(x), x.new_empty((features, tokens))
    grid = (triton.cdiv(tokens, PAIR_TILE) * triton.cdiv(features, PAIR_TILE),)

    def call() -> Tensor:
        pair_floor_kernel[grid](x, row, column, tokens, features, PAIR_TILE)
        return column

    notes = "Triton: read x once, write it and its transpose (bf16)"
    return Run(call, None, x.numel(), PAIR_BYTES * x.numel(), notes)


def pair_roles(name: str) -> tuple[object, object, object]:
    """nvfp4()'s row-wise and column-wise `Operand`s of ``name`` ("input": x's,
    "grad_output": dy's), and the layer's plan."""
    import stochround.nn as srnn
    from stochround.nn.linear import make_plan

    plan = make_plan(srnn.nvfp4(seed=SEED), 0)
    row = plan.operands[("fprop_" if name == "input" else "dgrad_") + name]
    return row, plan.operands["wgrad_" + name], plan


def pair_parts(operands: object) -> list[Tensor]:
    """The bytes a pair of GemmOperands is judged by: values and tensor scales."""
    parts = []
    for operand in operands:  # type: ignore[attr-defined]
        parts += [operand.values, operand.tensor_scale.reshape(1)]
    return parts


def served_pair_roles(name: str) -> tuple[object, object, object]:
    """`pair_roles` of ``name``; CheckFailed where the pair path refuses them."""
    from stochround.nn.orientations import pair_refusal

    row, column, plan = pair_roles(name)
    refusal = pair_refusal(row, column, True)  # type: ignore[arg-type]
    if refusal is not None:
        raise CheckFailed(f"the pair path refuses the call: {refusal}")
    return row, column, plan


def checked_pair(x: Tensor, name: str, prepared: object, seed: int, notes: str) -> Run:
    """The run of a prepared pair of ``name``'s roles on x under the layer's ``seed``,
    checked against the separate path (`separate_pair`)."""
    offsets = torch.tensor([3, 5], dtype=torch.int64, device=x.device)

    def call() -> object:
        return prepared(x, seed, offsets[0], offsets[1], None)  # type: ignore[operator]

    def check(output: object) -> str:
        expected = separate_pair(x, name).call()
        for part, reference in zip(pair_parts(output), pair_parts(expected), strict=True):
            if part.shape != reference.shape or not same_bytes(part, reference):
                raise CheckFailed("an operand differs from the separate path")
        return "ok = separate path"

    return Run(call, check, x.numel(), PAIR_BYTES * x.numel(), notes)


def ours_pair(x: Tensor, name: str) -> Run:
    """Both operands of x as ``name``'s roles by one read (`prepared_pair`, as
    `both_orientations` routes a CUDA tensor), checked against the separate path
    (`separate_pair`)."""
    from stochround.nn.orientations import prepared_pair

    row, column, plan = served_pair_roles(name)
    prepared = prepared_pair(row, column, x.shape, x.dtype, x.device, x.shape[0])  # type: ignore[arg-type]
    return checked_pair(x, name, prepared, plan.seed, "one amax + one quantize launch")  # type: ignore[attr-defined]


def separate_pair(x: Tensor, name: str) -> Run:
    """Both operands of x as ``name``'s roles quantized separately, as `QuantizedMatmul`
    does without the pair: the row-wise operand, then x's transpose (the transpose kernel)
    quantized with the RHT."""
    from stochround.nn.operands import quantize_operand
    from stochround.nn.step_ops import transposed

    row, column, plan = pair_roles(name)
    offsets = torch.tensor([3, 5], dtype=torch.int64, device=x.device)

    def call() -> object:
        first = quantize_operand(x, row, plan.seed, offsets[0], None, True)  # type: ignore[arg-type]
        second = quantize_operand(transposed(x), column, plan.seed, offsets[1], None, True)  # type: ignore[arg-type]
        return first, second

    return Run(call, None, x.numel(), PAIR_BYTES * x.numel(), "transpose + 2 x (amax, quantize)")


def floor(x: Tensor, block: int, pack: int, amax: bool, nbytes: float) -> Run:
    """The floor of a quantize case: `floor_kernel` writing one code byte per ``pack``
    elements and one scale byte per ``block``, after ``torch.amax(x)`` where ``amax``."""
    words = x.reshape(-1).view(torch.int32)
    codes = torch.empty(x.numel() // pack, dtype=torch.uint8, device=x.device)
    target = codes if pack == 2 else codes.view(torch.int16)
    scales = torch.empty(x.numel() // block, dtype=torch.uint8, device=x.device)
    grid = (triton.cdiv(x.numel(), TILE),)

    def call() -> Tensor:
        if amax:
            torch.amax(x)
        floor_kernel[grid](words, target, scales, words.numel(), block, pack == 2, TILE)
        return codes

    notes = "Triton: read x, write codes and scales" + (" (+ torch.amax(x))" if amax else "")
    return Run(call, None, x.numel(), nbytes * x.numel(), notes)


def copy_floor(x: Tensor, amax: bool, nbytes: float) -> Run:
    """The floor of a fake_quantize case: a bf16 copy, after ``torch.amax(x)`` where
    ``amax``."""
    destination = torch.empty_like(x)

    def call() -> Tensor:
        if amax:
            torch.amax(x)
        return destination.copy_(x)

    notes = "dst.copy_(x)" + (" (+ torch.amax(x))" if amax else "")
    return Run(call, None, x.numel(), nbytes * x.numel(), notes)


def output_bytes(output: object) -> list[Tensor]:
    """The tensors whose bytes a row's output is judged by: a BlockTensor's codes, scales
    and tensor scale (where it has one), a GemmOperand's values and row scales, or the
    fake-quantized tensor."""
    if isinstance(output, Tensor):
        return [output]
    if isinstance(output, tuple):  # a GemmOperand
        return [part for part in (output.values, output.row_scale) if part is not None]  # type: ignore[attr-defined]
    parts = [output.codes, output.scales]  # type: ignore[attr-defined]
    tensor_scale = output.tensor_scale  # type: ignore[attr-defined]
    if isinstance(tensor_scale, Tensor):
        parts.append(tensor_scale)
    return parts


def twin_check(twin: Callable[[], object]) -> Callable[[object], str]:
    """A `Run.check`: the output's codes, scales and tensor scale (or values) equal, byte
    for byte, those of ``twin()``, the same call on stochround's PyTorch path."""

    def check(output: object) -> str:
        mine, expected = output_bytes(output), output_bytes(twin())
        if len(mine) != len(expected):
            raise CheckFailed("parts differ from the PyTorch path")
        for index, (part, reference) in enumerate(zip(mine, expected, strict=True)):
            if part.shape != reference.shape or not same_bytes(part, reference):
                raise CheckFailed(f"part {index} differs from the PyTorch path")
        return "ok = torch path"

    return check


def ours(x: Tensor, case: str) -> Run:
    """stochround's row of ``case`` (`OURS`), checked against its PyTorch path."""
    import stochround.blocks as blocks

    name, fmt, keywords, nbytes = OURS[case]
    function = getattr(blocks, name)
    options = {"seed": SEED, **keywords}
    check = twin_check(lambda: function(x, fmt, "sr", backend="torch", **options))
    return Run(lambda: function(x, fmt, "sr", **options), check, x.numel(), nbytes * x.numel())


def torchao_nvfp4(x: Tensor, two_level: bool, compiled: bool) -> Run:
    """torchao's ``nvfp4_quantize(x, 16)`` (round to nearest); ``two_level``: with the
    per-tensor scale from ``max(|x|)``, computed in the same (compiled) call."""
    from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize, per_tensor_amax_to_scale

    def single(data: Tensor) -> tuple[Tensor, Tensor]:
        return nvfp4_quantize(data, 16)

    def double(data: Tensor) -> tuple[Tensor, Tensor]:
        scale = per_tensor_amax_to_scale(torch.max(torch.abs(data)))
        return nvfp4_quantize(data, 16, per_tensor_scale=scale)

    function = double if two_level else single
    if compiled:
        function = torch.compile(function)
    nbytes = (4.5625 if two_level else 2.5625) * x.numel()
    notes = ("torch.compile" if compiled else "eager") + ", round to nearest"
    return Run(lambda: function(x), None, x.numel(), nbytes, notes)


def torchao_mx(x: Tensor, mode: str, compiled: bool) -> Run:
    """torchao's ``to_mx(x, torch.float8_e4m3fn, 32)`` with scale mode ``mode``."""
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import to_mx

    scaling = ScaleCalculationMode(mode)

    def call(data: Tensor) -> tuple[Tensor, Tensor]:
        return to_mx(data, torch.float8_e4m3fn, 32, scaling_mode=scaling)

    function = torch.compile(call) if compiled else call
    notes = ("torch.compile" if compiled else "eager") + f", scale {mode}, round to nearest"
    return Run(lambda: function(x), None, x.numel(), (2 + 1 + 1 / 32) * x.numel(), notes)


def bf16_copy(x: Tensor) -> Run:
    destination = torch.empty_like(x)
    return Run(lambda: destination.copy_(x), None, x.numel(), 4 * x.numel(), "dst.copy_(x)")


def print_floor_fractions(path: Path) -> None:
    """Each stochround row's bandwidth as a percentage of its case's floor row."""
    rows = json.loads(path.read_text())["rows"]
    found = {(row["case"], row["provider"]): row for row in rows}
    print("fraction of the floor (stochround rows):")
    for row in rows:
        base = found.get((row["case"], "floor"))
        if not row["ours"] or base is None or not row.get("tb_s") or not base.get("tb_s"):
            continue
        percent = 100 * row["tb_s"] / base["tb_s"]
        print(f"  {row['case']}/{row['provider']}: {percent:.1f}% ({row['median_us']:.1f} us)")


def main() -> int:
    bench = Benchmark("bench_blocks", __doc__, reference="copy/torch")
    bench.parser.add_argument("--size", type=int, default=8192, help="x is size x size (8192)")
    bench.parser.add_argument("--no-compile", action="store_true", help="eager peers")
    args = bench.parse_args()
    if args.size % 32:
        bench.parser.error(f"--size must be a multiple of 32 (the MX block); got {args.size}")
    generator = torch.Generator(device=bench.device).manual_seed(0)
    x = torch.randn(args.size, args.size, generator=generator, device=bench.device)
    x = x.to(torch.bfloat16)
    compiled = not args.no_compile

    bench.add("copy", "torch", lambda: bf16_copy(x), reference=True)
    for case, spec in FLOORS.items():
        nbytes = OURS[case][3]
        if spec is None:
            build = partial(copy_floor, x, case == "fake_nvfp4", nbytes)
        else:
            build = partial(floor, x, *spec, nbytes)
        bench.add(case, "floor", build, reference=True)
        bench.add(case, "stochround_sr", partial(ours, x, case), ours=True)
    pair_x = x[:, : args.size // 2].contiguous()  # tokens x features
    bench.add("nvfp4_two_orientation", "floor", lambda: pair_floor(pair_x), reference=True)
    for name, provider in (("grad_output", "dy"), ("input", "x")):
        build = partial(ours_pair, pair_x, name)
        bench.add("nvfp4_two_orientation", f"stochround_pair_{provider}", build, ours=True)
    build = partial(separate_pair, pair_x, "grad_output")
    bench.add("nvfp4_two_orientation", "stochround_separate_dy", build, ours=True)
    for case, two_level in (("nvfp4_1level", False), ("nvfp4_2level", True)):
        build = partial(torchao_nvfp4, x, two_level, compiled)
        bench.add(case, "torchao_rn", build, requires=("torchao",))
    for mode in ("floor", "rceil"):
        build = partial(torchao_mx, x, mode, compiled)
        bench.add("mxfp8_e4m3", f"torchao_rn_{mode}", build, requires=("torchao",))
    status = bench.run()
    name = f"bench_blocks{'_' + args.tag if args.tag else ''}.json"
    print_floor_fractions(args.out / name)
    return status


if __name__ == "__main__":
    sys.exit(main())
