"""The block quantizer's SR configurations compiled offline for sm_90 (H100/H200) by
benchmarks/kernel_resources.py: no more registers and SASS instructions than before the
fast_round rewrite (2d6f3be), no spills (issue 42: variant c's 32-bit integer path took
tseng's kernel from 128 to 197 registers); and the per-tensor operand kernel's `fp8()`
round-to-nearest configurations (benchmarks/tensor_round_resources.py) within their float8
arithmetic's resources; and NVFP4's single launch (benchmarks/single_launch_resources.py)
compiled, within the quantize kernel's registers.  The budgets are Triton 3.6's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"

# config: (registers, SASS instructions) at 2d6f3be, 4096 elements and 4 warps a program,
# and the instructions the coalesced ("staged") stores of the GEMM operands add: a
# shared-memory round trip of each thread's 32 values (fp32 for tseng's, bf16 for nvfp4's)
BUDGETS = {"tseng_sr_rht64": (128, 2735 + 183), "nvfp4_dy_sr": (105, 1519 + 48)}
# config: (registers, SASS instructions) of the float8 round-to-nearest arithmetic
TENSOR_BUDGETS = {"fp8_x_e4m3_rne_t": (58, 1178), "fp8n_dy_e5m2_rne_t": (35, 1155)}

pytestmark = pytest.mark.skipif(
    not triton.__version__.startswith("3.6") or not (BIN / "ptxas").exists(),
    reason="budgets of Triton 3.6's NVIDIA backend (ptxas, cuobjdump)",
)


def compiled_rows(script: str, names: list[str], *options: str) -> dict[str, list[str]]:
    """The table rows of benchmarks/``script`` for the configurations ``names``, compiled
    without TRITON_INTERPRET (the compiled tiling)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT / "src")
    command = [sys.executable, str(ROOT / "benchmarks" / script), *options]
    for name in names:
        command += ["--config", name]
    table = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    return {line.split()[0]: line.split() for line in table.splitlines()[1:]}


def test_sr_configurations_within_their_2d6f3be_resources() -> None:
    rows = compiled_rows("kernel_resources.py", list(BUDGETS), "--elements", "4096", "--warps", "4")
    for name, (registers, instructions) in BUDGETS.items():
        _, _, regs, spills, sass, stl, ldl, stores = rows[name]
        assert int(regs) <= registers, (name, regs)
        assert int(sass) <= instructions, (name, sass)
        assert (spills, stl, ldl) == ("0/0", "0", "0"), name
        # the operand coalesced (`kernels.common.store_block_tile`): 16 bytes a thread, the
        # neighbouring thread's next; a thread's own block took 8-byte stores
        assert stores == "128", (name, stores)


def test_fp8_round_to_nearest_configurations_within_their_float8_arithmetics_resources() -> None:
    rows = compiled_rows("tensor_round_resources.py", list(TENSOR_BUDGETS))
    for name, (registers, instructions) in TENSOR_BUDGETS.items():
        _, _, regs, spills, sass, stl, ldl, _, _, stores = rows[name]
        assert int(regs) <= registers, (name, regs)
        assert int(sass) <= instructions, (name, sass)
        assert (spills, stl, ldl) == ("0/0", "0", "0"), name
        assert stores == "128", (name, stores)  # coalesced: 16 bytes a thread


def test_the_single_launch_compiles_with_the_quantize_kernels_registers_and_no_spills() -> None:
    """NVFP4's single launch (benchmarks/single_launch_resources.py) compiles for sm_90, and
    its registers, as a multiprocessor allocates them (eight a thread at a time), are no
    more than the quantize kernel's of the same configuration: a program of either role
    then fits as many times a multiprocessor as the quantize kernel's do.  (The
    interpreter's tests do not compile it: Triton's compiler refuses what the interpreter
    takes.)"""
    rows = compiled_rows("single_launch_resources.py", [])
    configs = {name.split("_single_launch")[0] for name in rows if "single_launch" in name}
    assert len(configs) == 3, rows
    for config in configs:
        single = rows[f"{config}_single_launch_kernel"]
        quantize = rows[f"{config}_quantize_blocks_kernel"]
        allocated = [-(-int(row[1]) // 8) * 8 for row in (single, quantize)]
        assert allocated[0] <= allocated[1], (config, single, quantize)
        assert (single[2], single[4], single[5]) == ("0/0", "0", "0"), config
