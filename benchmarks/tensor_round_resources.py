"""The per-tensor operand kernel's compiled resources, offline: `_tensor_round_kernel`
(`stochround.kernels.tensor_round`) compiled for a GPU target (sm_90: H100/H200) without a
GPU, one row per configuration `fp8()` launches: registers a thread, spill bytes, SASS
instructions and local-memory (STL/LDL) instructions, ``path`` (the instructions before the
first EXIT) and ``/elem``: that path over the elements a thread rounds.

The rows are `fp8()`'s operands (x and W: e4m3 round to nearest, dy: e5m2 round to
nearest, each written with its transpose), as the GEMM's bf16 values and as float8 codes
(``native=True``), and dy's spec with SR (exact and 8-bit variant a; an SR operand is not
transposed: its transpose draws other words).  Each call is prepared as
`stochround.nn.operands.kernel_tensor_round` prepares it, on a CPU tensor of the step's
shape and dtype; the launch's arguments are recorded instead of launched and compiled as
benchmarks/kernel_resources.py compiles the block quantizer.

    python benchmarks/tensor_round_resources.py
    python benchmarks/tensor_round_resources.py --config fp8_x_e4m3_rne_t --sass out.sass

Run it without TRITON_INTERPRET (the compiled tiling; it is unset here)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any, NamedTuple
from unittest import mock

os.environ.pop("TRITON_INTERPRET", None)  # before triton is imported: the compiled route

import torch
from kernel_resources import RESOURCE_HEADER, store_widths
from pair_resources import offline_figures

from stochround.kernels.runtime import Launch
from stochround.kernels.tensor_round import tensor_round
from stochround.nn import QuantSpec, fp8
from stochround.nn.operands import tensor_rounding

SHAPE = (8192, 4096)


class Config(NamedTuple):
    """A row: its name, the operand's spec, codes (``native``) or bf16 values, and whether
    the call writes the transpose."""

    name: str
    spec: QuantSpec
    native: bool
    transpose: bool


def configs() -> list[Config]:
    """`fp8()`'s operands (x and W share one configuration: one row), bf16 values and
    native codes, and its dy spec with SR."""
    recipe = fp8()
    forward, gradient = recipe.fprop_input, recipe.dgrad_grad_output
    assert forward is not None and gradient is not None
    sr_exact = dataclasses.replace(gradient, mode="sr")
    sr_8a = dataclasses.replace(gradient, mode="sr", rbits=8, variant="a")
    return [
        Config("fp8_x_e4m3_rne_t", forward, False, True),
        Config("fp8_dy_e5m2_rne_t", gradient, False, True),
        Config("fp8n_x_e4m3_rne_t", forward, True, True),
        Config("fp8n_dy_e5m2_rne_t", gradient, True, True),
        Config("fp8_dy_e5m2_sr", sr_exact, False, False),
        Config("fp8_dy_e5m2_sr8a", sr_8a, False, False),
    ]


def recorded_launch(config: Config) -> tuple[Any, dict, tuple, int]:
    """The kernel, its constexprs and options, the runtime arguments of ``config``'s call
    and the elements a thread rounds."""
    spec = config.spec
    rounding = tensor_rounding(spec, spec.block_format(), config.native)
    x = torch.empty(SHAPE, dtype=torch.bfloat16)
    multiplier = torch.ones((), dtype=torch.float32)
    words = (None, None)
    if spec.mode == "sr":
        words = (torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64))
    calls: list[tuple[Launch, tuple]] = []

    def record(launch: Launch, device: int, programs: int, *args: object) -> None:
        calls.append((launch, args))

    with mock.patch.object(Launch, "__call__", record):
        tensor_round(x, multiplier, rounding, *words, config.transpose)
    (launch, args), *_ = calls
    constants = dict(launch.constants)
    per_thread = constants["TILE"] ** 2 // (32 * constants["num_warps"])
    return launch.kernel, constants, args, per_thread


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", action="append", help="only these rows (repeatable)")
    parser.add_argument("--capability", type=int, default=90, help="target: 90 (H100/H200)")
    parser.add_argument("--sass", help="write the SASS of the (single) --config row here")
    parsed = parser.parse_args(argv)
    rows = [c for c in configs() if not parsed.config or c.name in parsed.config]
    if not rows:
        parser.error(f"--config must name rows of {[c.name for c in configs()]}")
    header = f"{'config':<20} {'elem/thr':>8} {RESOURCE_HEADER} {'path':>6} {'/elem':>6}"
    print(f"{header} {'STG bits':>8}")
    for row in rows:
        kernel, constants, args, per_thread = recorded_launch(row)
        keep = parsed.sass if len(rows) == 1 else None
        result, opcodes = offline_figures(kernel, constants, args, parsed.capability, keep)
        line = len(opcodes)
        print(
            f"{row.name:<20} {per_thread:>8} {result.columns()} {line:>6} "
            f"{line / per_thread:>6.1f} {store_widths(opcodes):>8}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
