"""What importing stochround costs and needs: every module but the Triton kernels imports
without Triton (an optional extra), and the quantized-training recipes run on the CPU
without it; ``import stochround`` leaves ``torch._dynamo`` (a second or so) unimported.

Each check runs in a fresh interpreter, so that what this test session has imported
already does not hide an import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

import stochround as sr

SRC = Path(__file__).resolve().parents[1] / "src"

# the kernel modules hold `@triton.jit` functions, so they import Triton: they are imported
# only where a kernel runs; every other module must import without it
NEEDS_TRITON = {
    "stochround.kernels.block_amax",
    "stochround.kernels.block_kernel",
    "stochround.kernels.block_launch",
    "stochround.kernels.block_math",
    "stochround.kernels.block_rotation",
    "stochround.kernels.blocks",
    "stochround.kernels.common",
    "stochround.kernels.delayed_scales",
    "stochround.kernels.e2m1_operand",
    "stochround.kernels.gaussws",
    "stochround.kernels.matmul",
    "stochround.kernels.operand_bf16",
    "stochround.kernels.optim",
    "stochround.kernels.pair_records",
    "stochround.kernels.pair_tiles",
    "stochround.kernels.philox",
    "stochround.kernels.round_kernel",
    "stochround.kernels.row_operand",
    "stochround.kernels.rounding",
    "stochround.kernels.row_tiles",
    "stochround.kernels.runtime",
    "stochround.kernels.sample_pair",
    "stochround.kernels.sample_words",
    "stochround.kernels.scaled_gemm",
    "stochround.kernels.single_launch",
    "stochround.kernels.stream_sr",
    "stochround.kernels.tensor_round",
    "stochround.kernels.tensor_scales",
    "stochround.kernels.transpose",
    "stochround.kernels.two_orientation",
}

# packages of an optional extra: they need their package (torchtitan, which itself imports
# triton), so they fail without it whatever triton's presence
OPTIONAL_EXTRAS = {"stochround.integrations.torchtitan"}

# Triton made unimportable, as where it is not installed: `import triton` raises
# ModuleNotFoundError and `importlib.util.find_spec("triton")` (which torch asks on CUDA)
# answers None; a meta-path finder that raised would make find_spec raise instead
BLOCK_TRITON = """
import sys
sys.modules["triton"] = None
"""

IMPORT_EVERY_MODULE = """
import importlib, json, pkgutil
import stochround
failures = {}
for module in pkgutil.walk_packages(stochround.__path__, "stochround."):
    try:
        importlib.import_module(module.name)
    except ImportError as error:  # an optional extra's own ImportError names no module
        failures[module.name] = error.name or "ImportError"
print(json.dumps(failures))
"""

# a two-layer model under the NVFP4 recipe (RHT and SR included): one step's bits
TRAIN_STEP = """
import json, torch
import stochround as sr
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 16))
sr.nn.quantize_(model, sr.nn.recipes.nvfp4(seed=3))
x = torch.randn(16, 32)
model(x).square().sum().backward()
bits = [p.grad.view(torch.int32).flatten().tolist() for p in model.parameters()]
print(json.dumps(bits))
"""


def python(code: str) -> str:
    """Run ``code`` in a fresh interpreter that imports stochround from this checkout (and
    not under Triton's interpreter, as on a machine without Triton); return its stdout."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    env.pop("TRITON_INTERPRET", None)
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_every_module_but_the_triton_kernels_imports_without_triton() -> None:
    failures = json.loads(python(BLOCK_TRITON + IMPORT_EVERY_MODULE).splitlines()[-1])
    failures = {
        name: missing
        for name, missing in failures.items()
        if not any(name == extra or name.startswith(extra + ".") for extra in OPTIONAL_EXTRAS)
    }
    assert failures == dict.fromkeys(NEEDS_TRITON, "triton")


def test_a_quantized_recipe_trains_without_triton_with_the_same_bits() -> None:
    without = json.loads(python(BLOCK_TRITON + TRAIN_STEP).splitlines()[-1])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 16))
    sr.nn.quantize_(model, sr.nn.recipes.nvfp4(seed=3))
    x = torch.randn(16, 32)
    model(x).square().sum().backward()
    assert without == [p.grad.view(torch.int32).flatten().tolist() for p in model.parameters()]


def test_importing_stochround_leaves_torch_dynamo_unimported() -> None:
    probe = "import sys, stochround\nprint('torch._dynamo' in sys.modules)"
    assert python(probe).split() == ["False"]
