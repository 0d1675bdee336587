"""The block quantizer's compiled resources, offline: `quantize_blocks_kernel` compiled for a
GPU target (sm_90: H100/H200) without a GPU, one row per configuration a recipe step
launches: registers a thread, spill bytes, SASS instructions and local-memory (STL/LDL)
instructions.  A kernel change that adds registers, spills or instructions to a
configuration shows here before any GPU run.

The configurations are the recipes' own operands (their QuantSpecs), prepared as the layers
prepare them (`PreparedGemmBlocks`, on a CPU tensor of the step's dtype); the launch's
arguments are recorded instead of launched and compiled by Triton for the target, ptxas
(-v) and cuobjdump from Triton's NVIDIA backend read the result.

    python benchmarks/kernel_resources.py                 # the table, default tilings
    (tiling column: elements a program / warps)
    python benchmarks/kernel_resources.py --elements 4096 --warps 4
    python benchmarks/kernel_resources.py --config tseng_dy --sass out.sass

Run it without TRITON_INTERPRET (the compiled tiling; it is unset here)."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

os.environ.pop("TRITON_INTERPRET", None)  # before triton is imported: the compiled route

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import make_backend
from triton.runtime.jit import create_function_from_signature

from stochround.kernels.blocks import PreparedGemmBlocks
from stochround.kernels.runtime import PartialLaunch
from stochround.nn import QuantSpec, mxfp4_tseng, nvfp4

_BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


class Config(NamedTuple):
    """A row: its name, the operand's spec, the input dtype and shape."""

    name: str
    spec: QuantSpec
    dtype: torch.dtype
    shape: tuple[int, int]


class Resources(NamedTuple):
    """What the compiled kernel uses: registers a thread, spill store and load bytes,
    SASS instructions (NOP padding left out), STL and LDL instructions."""

    registers: int
    spill_stores: int
    spill_loads: int
    instructions: int
    stl: int
    ldl: int

    def columns(self) -> str:
        """The table's resource columns (`RESOURCE_HEADER`): registers, spill bytes,
        SASS, STL, LDL."""
        spill = f"{self.spill_stores}/{self.spill_loads}"
        return f"{self.registers:>5} {spill:>14} {self.instructions:>6} {self.stl:>4} {self.ldl:>4}"


# the heading of `Resources.columns`
RESOURCE_HEADER = f"{'regs':>5} {'spill st/ld B':>14} {'SASS':>6} {'STL':>4} {'LDL':>4}"


def configs() -> list[Config]:
    """The recipes' operands that the block quantizer serves: mxfp4_tseng's SR operand with
    its 64-point RHT (variant c, the spec's; and variant a), and nvfp4's five."""
    tseng = mxfp4_tseng().dgrad_grad_output
    assert tseng is not None
    recipe = nvfp4()
    shape = (256, 4096)
    rows = [
        Config("tseng_sr_rht64", tseng, torch.bfloat16, shape),
        Config("tseng_sr_a_rht64", dataclasses.replace(tseng, variant="a"), torch.bfloat16, shape),
    ]
    for name, role in (
        ("nvfp4_x_rn", "fprop_input"),
        ("nvfp4_w16x16_rn", "fprop_weight"),
        ("nvfp4_dy_sr", "dgrad_grad_output"),
        ("nvfp4_dy_sr_rht16", "wgrad_grad_output"),
        ("nvfp4_x_rn_rht16", "wgrad_input"),
    ):
        spec = getattr(recipe, role)
        rows.append(Config(name, spec, torch.bfloat16, shape))
    return rows


class _Recorder:
    """Stands in for a prepared launch's partial launch (`stochround.kernels.runtime.
    PartialLaunch`): keeps the runtime arguments in full of the call it is given."""

    def __init__(self, partial: PartialLaunch) -> None:
        self.partial = partial
        self.args: tuple[object, ...] = ()

    def __call__(self, device: int, programs: int, *varying: object) -> None:
        self.args = self.partial.arguments(varying)


def recorded_launch(config: Config, tiling: tuple[int, int] | None) -> tuple[Any, dict, tuple]:
    """The kernel, its constexprs and options, and the runtime arguments of the launch the
    layers make for ``config`` (``tiling``: (ELEMENTS, WARPS), None: the default)."""
    spec = config.spec
    fmt = spec.block_format()
    x = torch.empty(config.shape, dtype=config.dtype)
    two_d = isinstance(fmt.block, tuple)
    block = fmt.block[1] if two_d else fmt.block
    signs = None if spec.rht is None else torch.ones(spec.rht, dtype=torch.float32)
    tensor_scales = 2 if fmt.tensor_scale and spec.tensor_scale == "amax" else 0
    keywords: dict[str, Any] = {
        "out_dtype": fmt.gemm_dtype,
        "tensor_scales": tensor_scales,
        "amax_given": two_d,
        "rht_signs": signs,
        "mode": spec.mode,
        "n": spec.rbits or 32,
        "variant": spec.variant,
        "rht": spec.rht,
        "rht_bf16": spec.rht_bf16,
    }
    accepted = inspect.signature(PreparedGemmBlocks).parameters
    if tiling is not None:
        if "tiling" not in accepted:
            raise SystemExit("this tree's PreparedGemmBlocks takes no tiling= (its own tiling)")
        from stochround.kernels.blocks import QuantizeTiling

        keywords["tiling"] = QuantizeTiling(*tiling)
    prepared = PreparedGemmBlocks(x, fmt.element.name, block, fmt.scale_rule, **keywords)
    launch = prepared.grid.launch
    recorder = _Recorder(prepared.partial)
    prepared.partial = recorder  # type: ignore[assignment]
    seed = torch.zeros(1, dtype=torch.int64)
    scale = None if tensor_scales == 0 else torch.ones(tensor_scales, dtype=torch.float32)
    amax = torch.empty(x.numel() // block, dtype=torch.float32) if two_d else None
    prepared.launch(x, scale, signs, amax, seed, seed.clone())
    return launch.kernel, dict(launch.constants), recorder.args


def compiled(kernel: Any, constants: dict, args: tuple, capability: int) -> Any:
    """Triton's compiled kernel for the target, specialized as the JIT specializes these
    arguments (CPU tensors stand in for CUDA ones: their pointers are as aligned)."""
    target = GPUTarget("cuda", capability, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **constants)
    options, signature, constexprs, attrs = kernel._pack_args(
        backend, constants, bound, specialization, options
    )
    source = triton.compiler.ASTSource(kernel, signature, constexprs, attrs)
    return triton.compile(source, target=target, options=options.__dict__)


def sass_opcodes(sass: str) -> list[str]:
    """The mnemonic of each instruction of the SASS text, in order (a predicate left out),
    NOPs left out: they pad the code to its alignment and are not executed."""
    opcodes = []
    for line in sass.splitlines():
        match = re.search(r"/\*[0-9a-f]{4,}\*/\s*(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if match is not None and not match.group(2).startswith("NOP"):
            opcodes.append(match.group(2))
    return opcodes


def straight_opcodes(sass: str) -> list[str]:
    """`sass_opcodes` before the first EXIT: the straight line every thread runs."""
    opcodes = sass_opcodes(sass)
    exits = [i for i, opcode in enumerate(opcodes) if opcode.startswith("EXIT")]
    return opcodes[: exits[0]] if exits else opcodes


def store_widths(opcodes: list[str]) -> str:
    """The bits of each global store (STG) among ``opcodes``, distinct and "+"-joined
    ("128": every store moves 16 bytes a thread; a 32-bit store has no width suffix)."""
    widths = {int(op.rsplit(".", 1)[1]) if op.rsplit(".", 1)[1].isdigit() else 32
              for op in opcodes if op.startswith("STG")}  # fmt: skip
    return "+".join(str(width) for width in sorted(widths)) or "-"


def resources(
    kernel: Any, capability: int, sass_path: str | None = None
) -> tuple[Resources, list[str]]:
    """`resources_and_sass`'s figures and the straight path's opcodes
    (`straight_opcodes`), the SASS also written to ``sass_path`` where given."""
    result, sass = resources_and_sass(kernel, capability)
    if sass_path:
        Path(sass_path).write_text(sass)
    return result, straight_opcodes(sass)


def resources_and_sass(kernel: Any, capability: int) -> tuple[Resources, str]:
    """ptxas -v's registers and spill bytes of the kernel's PTX (as Triton assembles it:
    no multiply-add contraction) and its cubin's SASS counts, with the SASS text."""
    arch = f"sm_{capability}a" if capability >= 90 else f"sm_{capability}"
    ptxas = [str(_BIN / "ptxas"), "--fmad=false", "-v", f"--gpu-name={arch}"]
    with tempfile.TemporaryDirectory() as folder:
        ptx, cubin = Path(folder) / "k.ptx", Path(folder) / "k.cubin"
        ptx.write_text(kernel.asm["ptx"])
        cubin.write_bytes(kernel.asm["cubin"])
        log = subprocess.run(
            [*ptxas, str(ptx), "-o", str(Path(folder) / "v.cubin")],
            capture_output=True,
            text=True,
            check=True,
        ).stderr
        sass = subprocess.run(
            [str(_BIN / "cuobjdump"), "-sass", str(cubin)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    registers = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    opcodes = sass_opcodes(sass)
    figures = Resources(
        registers=int(registers.group(1)) if registers else -1,
        spill_stores=int(spills.group(1)) if spills else 0,
        spill_loads=int(spills.group(2)) if spills else 0,
        instructions=len(opcodes),
        stl=sum(op.startswith("STL") for op in opcodes),
        ldl=sum(op.startswith("LDL") for op in opcodes),
    )
    return figures, sass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", action="append", help="only these rows (repeatable)")
    parser.add_argument("--elements", type=int, help="tiling: elements a program")
    parser.add_argument("--warps", type=int, default=4, help="tiling: warps (with --elements)")
    parser.add_argument("--capability", type=int, default=90, help="target: 90 (H100/H200)")
    parser.add_argument("--sass", help="write the SASS of the (single) --config row here")
    parsed = parser.parse_args(argv)
    tiling = None if parsed.elements is None else (parsed.elements, parsed.warps)
    rows = [c for c in configs() if not parsed.config or c.name in parsed.config]
    if not rows:
        parser.error(f"--config must name rows of {[c.name for c in configs()]}")
    header = f"{'config':<20} {'tiling':>7} {RESOURCE_HEADER} {'STG bits':>8}"
    print(header)
    for row in rows:
        kernel, constants, args = recorded_launch(row, tiling)
        binary = compiled(kernel, constants, args, parsed.capability)
        result, opcodes = resources(
            binary, parsed.capability, parsed.sass if len(rows) == 1 else None
        )
        tile = constants["TILING"]
        shape = f"{tile.TILE * tile.GROUPS * 4}/{constants['num_warps']}"
        stores = store_widths(opcodes)
        print(f"{row.name:<20} {shape:>7} {result.columns()} {stores:>8}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
