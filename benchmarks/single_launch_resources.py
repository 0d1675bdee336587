"""NVFP4's single launch compiled offline (`stochround.kernels.single_launch`): its kernel and
the two kernels it replaces (the ticket-taking amax kernel, then `quantize_blocks_kernel`)
compiled for a GPU target (sm_90: H100/H200) without a GPU, one row per kernel of each
configuration: registers a thread, spill bytes, SASS instructions and local-memory
(STL/LDL) instructions, as benchmarks/kernel_resources.py reports them.  A single launch
runs at the occupancy its registers allow for both roles, which the two-launch rows show
apart.

Each configuration is `sr.blocks.quantize`'s prepared call of a 1024 x 1024 tensor
(`PreparedQuantizeBlocks`, on a CPU tensor), its launches recorded instead of launched.

    python benchmarks/single_launch_resources.py
    python benchmarks/single_launch_resources.py --sass out.sass   # the first row's SASS

Run it without TRITON_INTERPRET (the compiled tiling; it is unset here)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, NamedTuple
from unittest import mock

os.environ.pop("TRITON_INTERPRET", None)  # before triton is imported: the compiled route

import torch
from kernel_resources import RESOURCE_HEADER
from pair_resources import offline_figures

from stochround.kernels.blocks import PreparedQuantizeBlocks
from stochround.kernels.runtime import Launch, PartialLaunch


class Config(NamedTuple):
    """A row pair: its name, the mode, x's dtype and the rotation's size (None: none)."""

    name: str
    mode: str
    dtype: torch.dtype
    rht: int | None


CONFIGS = [
    Config("nvfp4_sr_fp32", "sr", torch.float32, None),
    Config("nvfp4_rne_bf16", "rne", torch.bfloat16, None),
    Config("nvfp4_sr_bf16_rht16", "sr", torch.bfloat16, 16),
]


def recorded_launches(config: Config, single: bool) -> list[tuple[Launch, tuple]]:
    """The launches (bound kernel, runtime arguments) of the configuration's prepared call,
    in one launch (``single``) or two."""
    x = torch.empty(1024, 1024, dtype=config.dtype)
    signs = None if config.rht is None else torch.ones(config.rht)
    prepared = PreparedQuantizeBlocks(
        x, "e2m1", 16, "nvfp4", tensor_scales=True, mode=config.mode, output="fp4x2",
        rht=config.rht, rht_signs=signs, single_launch=single,
    )  # fmt: skip
    calls: list[tuple[Launch, tuple]] = []

    def record(partial: PartialLaunch, device: int, programs: int, *varying: object) -> None:
        calls.append((partial.launch, partial.arguments(varying)))

    with mock.patch.object(PartialLaunch, "__call__", record):
        prepared(x, 0, 0)
    return calls


def rows(config: Config) -> list[tuple[str, Any, dict, tuple]]:
    """(row name, kernel, constexprs and options, runtime arguments) of each launch."""
    found = []
    for single in (True, False):
        for launch, args in recorded_launches(config, single):
            name = f"{config.name}_{launch.kernel.__name__.strip('_')}"
            found.append((name, launch.kernel, dict(launch.constants), args))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capability", type=int, default=90, help="target: 90 (H100/H200)")
    parser.add_argument("--sass", help="write the SASS of the first row here")
    parsed = parser.parse_args(argv)
    print(f"{'kernel':<44} {RESOURCE_HEADER}")
    found = [row for config in CONFIGS for row in rows(config)]
    for index, (name, kernel, constants, args) in enumerate(found):
        keep = parsed.sass if index == 0 else None
        result, _ = offline_figures(kernel, constants, args, parsed.capability, keep)
        print(f"{name:<44} {result.columns()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
