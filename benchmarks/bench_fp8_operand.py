"""The fp8() recipe's per-tensor operand of one tensor and its transpose (issue 42): the
fused pass (`stochround.kernels.tensor_round`) beside the separate route it replaces and
the memory floor, in one run.

Input: a ``tokens x features`` bf16 x from randn (8192 x 4096 by default: a layer's x or
dy). Each row computes the e4m3 per-tensor operand of x as `QuantizedLinear` takes it, the
tensor amax and scale included, with the transposed copy the backward reuses:

- ``stochround_fused``: `stochround.nn.operands.tensor_scaled_operand` with ``transposes``
  (on CUDA: the amax launch, then one pass that multiplies, rounds and writes the bf16
  values and their transpose); ``stochround_fused_native``: the same writing float8 codes
  (``fp8(native=True)``'s operand).
- ``stochround_separate``: the route before the fused pass: the amax launch, the product
  ``x * multiplier``, the core's `cast` into float8, the bf16 copy, the transpose kernel.
- ``floor``: a Triton kernel reading x once and writing it and its transpose in bf16
  (`bench_blocks.pair_floor`), plus ``torch.amax(x)``'s read.

The fused rows are checked bit for bit against the separate route before they are timed.

    python benchmarks/bench_fp8_operand.py                                # GPU
    python benchmarks/bench_fp8_operand.py --device cpu --tokens 64 --features 96  # smoke
"""

from __future__ import annotations

import sys

import harness  # noqa: F401 - before triton: it selects the interpreter without a GPU
import torch
from bench_blocks import pair_floor
from harness import Benchmark, CheckFailed, Run, same_bytes
from torch import Tensor

import stochround as sr
from stochround.kernels.blocks import tensor_amax
from stochround.nn import operands
from stochround.nn.recipes import QuantSpec
from stochround.nn.step_ops import transposed

SPEC = QuantSpec("fp8_e4m3_tensor")
FMT = SPEC.block_format()


def fused(x: Tensor, native: bool) -> Run:
    """`tensor_scaled_operand` with its transpose, checked against `separate`'s bytes."""

    def call() -> tuple[Tensor, Tensor]:
        pair: list = []
        operand = operands.tensor_scaled_operand(x, FMT, SPEC, 0, 0, native, pair)
        return operand.values, pair[0].values

    def check(output: object) -> str:
        for got, want in zip(output, separate(x, native).call(), strict=True):  # type: ignore[call-overload]
            if got.shape != want.shape or not same_bytes(got, want):
                raise CheckFailed("differs from the separate route")
        return "ok = separate route"

    written = 1 + 1 if native else 2 + 2
    notes = "amax launch + one fused pass" + (" (float8 codes)" if native else " (bf16)")
    return Run(call, check, x.numel(), (2 + 2 + written) * x.numel(), notes)


def separate(x: Tensor, native: bool) -> Run:
    """The route before the fused pass: amax, product, cast, bf16 copy, transpose."""

    def call() -> tuple[Tensor, Tensor]:
        amax = tensor_amax(x)  # the fused rows' amax launch
        _, multiplier = operands.tensor_scales(amax, FMT.element_max)
        codes = sr.cast(x * multiplier.reshape(1), torch.float8_e4m3fn, "rne", sat="finite")
        if native:
            return codes, transposed(codes.view(torch.uint8)).view(codes.dtype)
        values = codes.to(torch.bfloat16)
        return values, transposed(values)

    written = 1 + 1 if native else 2 + 2
    return Run(call, None, x.numel(), (2 + 2 + written) * x.numel(), "amax, mul, cast, to, T")


def floor(x: Tensor) -> Run:
    """`pair_floor` after ``torch.amax(x)``: the bytes the bf16 rows move."""
    pair = pair_floor(x)

    def call() -> object:
        torch.amax(x)
        return pair.call()

    return Run(call, None, x.numel(), 8 * x.numel(), "torch.amax + read x, write x and x^T")


def main() -> int:
    bench = Benchmark("bench_fp8_operand", __doc__, reference="fp8_tensor_operand/floor")
    bench.parser.add_argument("--tokens", type=int, default=8192, help="x's rows (8192)")
    bench.parser.add_argument("--features", type=int, default=4096, help="x's columns (4096)")
    args = bench.parse_args()
    generator = torch.Generator(device=bench.device).manual_seed(0)
    shape = (args.tokens, args.features)
    x = torch.randn(shape, generator=generator, device=bench.device).to(torch.bfloat16)
    case = "fp8_tensor_operand"
    bench.add(case, "floor", lambda: floor(x), reference=True)
    bench.add(case, "stochround_fused", lambda: fused(x, False), ours=True)
    bench.add(case, "stochround_fused_native", lambda: fused(x, True), ours=True)
    bench.add(case, "stochround_separate", lambda: separate(x, False), ours=True)
    return bench.run()


if __name__ == "__main__":
    sys.exit(main())
