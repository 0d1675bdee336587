"""Host time of one small call: what a rounding call costs the CPU before any GPU work.

For a few thousand values the device work takes microseconds and the Python side decides
a call's cost (argument checks, output allocation, the kernel launch, and for e2m1 with
the default ``nan="raise"`` the wait for the kernel's NaN flag). Each row calls one entry
point on the same 2**log2n fp32 values ``--calls`` times back to back and reports the wall
time a call, the median of ``--repeats`` such runs, after warm-up calls; PyTorch's own
cast to bf16 (``x.to``) is the yardstick. Outputs are checked first, as in bench_cast.

Case ``blocks_1024x1024``: `stochround.blocks.quantize` of a 1024 x 1024 fp32 tensor (the
issue-42 host target: at most 25 us a call), NVFP4 with SR and MXFP8 round-to-nearest,
checked against the PyTorch path (``backend="torch"``) code for code.  A planned call runs
its prepared launch (`stochround.blocks.quantize_plan`); the rows ``launches_<format>_<mode>``
(CUDA only) time that launch alone (`stochround.kernels.blocks.PreparedQuantizeBlocks`: the
same allocations and launches, without the entry point's look-up and its `BlockTensor`), so
that the two rows' difference is the Python around them; ``two_launches_nvfp4_sr`` (CUDA
only) times NVFP4's prepared launch in two launches (amax, then quantization) where the
size rule gives this size one (`stochround.kernels.single_launch`).

    python benchmarks/bench_host.py --only blocks_1024x1024          # GPU: issue 42's rows

    python benchmarks/bench_host.py                                  # GPU
    python benchmarks/bench_host.py --device cpu --calls 3 --repeats 2   # smoke test
"""

from __future__ import annotations

import sys
from functools import partial

import torch
from harness import Benchmark, CheckFailed, Run, rounding_check, stochround_run

import stochround as sr

FP4 = torch.float4_e2m1fn_x2
# case, provider, then `harness.stochround_run`'s function, arguments after x, keywords and
# the check's format
OURS = [
    ("bf16", "stochround", "cast", (torch.bfloat16, "sr"), {}, "bfloat16"),
    ("e4m3fn", "stochround", "cast", (torch.float8_e4m3fn, "sr"), {}, "e4m3fn"),
    ("e2m1", "stochround", "cast", (FP4, "sr"), {"nan": "zero"}, "e2m1"),
    ("e2m1", "stochround_checked", "cast", (FP4, "sr"), {}, "e2m1"),
    ("e5m2_sr8_a", "stochround", "round", ("e5m2", "sr"), {"rbits": 8, "variant": "a"}, "e5m2"),
]


def main() -> int:
    bench = Benchmark("bench_host", __doc__, timer="host")
    bench.parser.add_argument("--log2n", type=int, default=12, help="elements 2**log2n (12)")
    args = bench.parse_args()
    generator = torch.Generator(device=bench.device).manual_seed(0)
    x = torch.randn(2**args.log2n, generator=generator, device=bench.device)

    def torch_cast() -> Run:
        check = rounding_check(x, "bfloat16", "rn", count=args.check_count)
        return Run(lambda: x.to(torch.bfloat16), check, x.numel(), notes="x.to(bf16), RNE")

    bench.add("bf16", "torch_rne", torch_cast, reference=True)
    for case, provider, *spec in OURS:
        build = partial(stochround_run, x, *spec, count=args.check_count)
        bench.add(case, provider, build, ours=True)
    square = torch.randn(1024, 1024, generator=generator, device=bench.device)
    for fmt, mode in BLOCK_ROWS:
        build = partial(block_quantize, square, fmt, mode)
        bench.add("blocks_1024x1024", f"stochround_{fmt}_{mode}", build, ours=True)
        launches = partial(block_launches, square, fmt, mode)
        bench.add("blocks_1024x1024", f"launches_{fmt}_{mode}", launches, ours=True, cuda_only=True)
    # NVFP4's prepared launch in two launches (amax, then quantization), beside its single
    # launch (`stochround.kernels.single_launch`), which 1024 x 1024 takes by default
    two = partial(block_launches, square, "nvfp4", "sr", single=False)
    bench.add("blocks_1024x1024", "two_launches_nvfp4_sr", two, ours=True, cuda_only=True)
    return bench.run()


# sr.blocks.quantize's rows: format, mode
BLOCK_ROWS = [("nvfp4", "sr"), ("mxfp8_e4m3", "rne")]


def block_quantize(x: torch.Tensor, fmt: str, mode: str) -> Run:
    """``sr.blocks.quantize(x, fmt, mode, seed=0, offset=0)`` on the default backend, checked
    against the PyTorch path's codes and scales."""
    options = {"seed": 0, "offset": 0} if mode == "sr" else {}
    reference = sr.blocks.quantize(x, fmt, mode, backend="torch", **options)

    def check(output: object) -> str:
        for name in ("codes", "scales"):
            ours, theirs = getattr(output, name), getattr(reference, name)
            if not torch.equal(ours.view(torch.uint8), theirs.view(torch.uint8)):
                raise CheckFailed(f"{name} differ from the PyTorch path's")
        return "ok equal to the PyTorch path"

    call = partial(sr.blocks.quantize, x, fmt, mode, **options)
    return Run(call, check, x.numel(), notes=f"sr.blocks.quantize {fmt} {mode}")


def block_launches(x: torch.Tensor, fmt: str, mode: str, single: bool | None = None) -> Run:
    """The prepared launch of ``block_quantize``'s planned call alone (its allocations and
    launches), checked against that call's codes and scales; ``single``: NVFP4's computed
    tensor scales in one launch (True), in two (False), or as the size rule picks (None:
    `stochround.kernels.single_launch.takes_single_launch`)."""
    from unittest import mock

    from stochround.blocks import dispatch
    from stochround.kernels import blocks as kernel_blocks

    options = {"seed": 0, "offset": 0} if mode == "sr" else {}
    dispatch._PLANS.clear()  # then this call's plan alone (the others re-plan once)
    expected = sr.blocks.quantize(x, fmt, mode, **options)
    dispatch._PLANS.clear()
    rule = kernel_blocks.takes_single_launch if single is None else lambda _: single
    with mock.patch.object(kernel_blocks, "takes_single_launch", rule):  # the plan's choice
        sr.blocks.quantize(x, fmt, mode, **options)
    (plan,) = dispatch._PLANS.values()
    if plan.prepared is None:
        raise CheckFailed("the call has no prepared launch")
    kernel = plan.prepared.kernel

    def check(output: object) -> str:
        codes, scales, _ = output  # type: ignore[misc]
        for name, ours in (("codes", codes), ("scales", scales)):
            if not torch.equal(ours.view(torch.uint8), getattr(expected, name).view(torch.uint8)):
                raise CheckFailed(f"{name} differ from sr.blocks.quantize's")
        return "ok equal to sr.blocks.quantize"

    call = partial(kernel, x, 0, 0)
    launches = "one launch" if getattr(kernel, "single", None) else "its launches"
    return Run(call, check, x.numel(), notes=f"PreparedQuantizeBlocks {fmt} {mode}, {launches}")


if __name__ == "__main__":
    sys.exit(main())
