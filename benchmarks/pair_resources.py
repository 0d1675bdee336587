"""The two-orientation quantizer's compiled resources, offline: its quantize and amax
(with the tensor scales) kernels (`stochround.kernels.two_orientation`) compiled for a GPU
target (sm_90: H100/H200) without a GPU, for `nvfp4()`'s two pairs (x: round to nearest, dy: SR, the
column-wise operand rotated by RHT-16 along the tokens), at the default tile or at the
tiles given: registers a thread, spill bytes, SASS instructions and local-memory (STL/LDL)
instructions, and the elements a thread holds; ``path``: the instructions before the first
EXIT, the straight line every thread runs (what follows is the division's rarely taken
slow path), and ``/elem``: that path over the elements a thread quantizes in both
orientations (the quantize kernel; the amax kernel's over the elements it reads).

The pairs are prepared as `stochround.nn.orientations.PreparedPair` prepares them (on a CPU
tensor of the step's dtype and shape); the launches' arguments are recorded instead of
launched and compiled as benchmarks/kernel_resources.py compiles the block quantizer.

    python benchmarks/pair_resources.py                      # the default tile
    python benchmarks/pair_resources.py --tile 16x64 --tile 32x64 --tile 64x64 --warps 4
    python benchmarks/pair_resources.py --pair dy --sass out.sass

Run it without TRITON_INTERPRET (the compiled tiling; it is unset here)."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any

os.environ.pop("TRITON_INTERPRET", None)  # before triton is imported: the compiled route

import torch
from kernel_resources import (
    RESOURCE_HEADER,
    Resources,
    compiled,
    resources_and_sass,
    store_widths,
    straight_opcodes,
)

import stochround.kernels.two_orientation as two_orientation
import stochround.nn as srnn
from stochround.nn.linear import make_plan
from stochround.nn.orientations import PreparedPair

# pair -> the roles' tensor ("input": x, "grad_output": dy)
PAIRS = {"x": "input", "dy": "grad_output"}
SHAPE = (8192, 4096)


class _Recorder:
    """Stands in for a bound launch: keeps the runtime arguments it is called with."""

    def __init__(self) -> None:
        self.args: tuple[object, ...] = ()

    def __call__(self, device: int, programs: int, *args: object) -> None:
        self.args = args


def recorded_launches(pair: str) -> dict[str, tuple[Any, dict, tuple]]:
    """The quantize and amax launches of ``pair``'s `PreparedPair` (the amax launch's last
    program writes the tensor scales): each kernel, its constexprs and options, and the
    runtime arguments a call gives it."""
    name = PAIRS[pair]
    plan = make_plan(srnn.nvfp4(seed=1), 0)
    row = plan.operands[("fprop_" if name == "input" else "dgrad_") + name]
    column = plan.operands["wgrad_" + name]
    x = torch.empty(SHAPE, dtype=torch.bfloat16)
    prepared = PreparedPair(row, column, x.shape, x.dtype, x.device, SHAPE[0])
    kernel = prepared.kernel
    launches = {"quantize": kernel.quantize, "amax": kernel.amax}
    recorders = {what: _Recorder() for what in launches}
    kernel.quantize, kernel.amax = recorders["quantize"], recorders["amax"]
    offset = torch.zeros((), dtype=torch.int64)
    prepared(x, 1, offset, offset.clone(), None)
    return {
        what: (launch.kernel, dict(launch.constants), recorders[what].args)
        for what, launch in launches.items()
    }


def offline_figures(
    kernel: Any, constants: dict, args: tuple, capability: int, sass_path: str | None = None
) -> tuple[Resources, list[str]]:
    """``kernel`` compiled for ``capability`` offline (`compiled`): its resources and the
    opcodes of its straight path (`straight_opcodes`); the SASS written to ``sass_path``
    where given."""
    result, sass = resources_and_sass(compiled(kernel, constants, args, capability), capability)
    if sass_path:
        Path(sass_path).write_text(sass)
    return result, straight_opcodes(sass)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", action="append", choices=sorted(PAIRS), help="only these")
    parser.add_argument("--tile", action="append", help="TOKENSxFEATURES (repeatable)")
    parser.add_argument("--warps", type=int, help="warps a program (the default's if unset)")
    parser.add_argument("--capability", type=int, default=90, help="target: 90 (H100/H200)")
    parser.add_argument("--sass", help="write the SASS of the (single) pair's quantize here")
    parsed = parser.parse_args(argv)
    tiles = []
    for tile in parsed.tile or [f"{two_orientation.TILE_TOKENS}x{two_orientation.TILE_FEATURES}"]:
        match = re.fullmatch(r"(\d+)x(\d+)", tile)
        if match is None:
            parser.error(f"--tile must be TOKENSxFEATURES (e.g. 32x64); got {tile!r}")
        tiles.append((int(match.group(1)), int(match.group(2))))
    if parsed.warps is not None:
        two_orientation._NUM_WARPS = parsed.warps
    pairs = parsed.pair or sorted(PAIRS)
    header = f"{'pair':<4} {'kernel':<8} {'tile':>7} {'warps':>5} {'elem/thr':>8}"
    print(f"{header} {RESOURCE_HEADER} {'path':>6} {'/elem':>6} {'STG bits':>8}")
    for tokens, features in tiles:
        two_orientation.TILE_TOKENS, two_orientation.TILE_FEATURES = tokens, features
        for pair in pairs:
            for what, (kernel, constants, args) in recorded_launches(pair).items():
                single = parsed.sass and what == "quantize" and len(pairs) == len(tiles) == 1
                result, opcodes = offline_figures(
                    kernel, constants, args, parsed.capability, parsed.sass if single else None
                )
                line = len(opcodes)
                warps = constants.get("num_warps", 4)
                tiling = constants.get("TILING")
                per_thread = (
                    0 if tiling is None else tiling.TOKENS * tiling.FEATURES // (32 * warps)
                )
                shape = "-" if tiling is None else f"{tiling.TOKENS}x{tiling.FEATURES}"
                quantized = per_thread * (2 if what == "quantize" else 1)
                each = f"{line / quantized:.1f}" if quantized else "-"
                print(
                    f"{pair:<4} {what:<8} {shape:>7} {warps:>5} {per_thread:>8} "
                    f"{result.columns()} {line:>6} {each:>6} {store_widths(opcodes):>8}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
