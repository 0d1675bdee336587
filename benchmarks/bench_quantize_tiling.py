"""The block-quantize kernel's tiling sweep (issue 42): each configuration a recipe's
`QuantizedLinear` step launches (`PreparedGemmBlocks`: NVFP4's x RN, W in 16x16 tiles, dy
SR, wgrad's operands with the 16-point RHT; MXFP8's rceil RN with its fp32 output;
MXFP4-Tseng's floor-3/4 SR with the 64-point RHT) under each `QuantizeTiling` of a sweep
(elements a program, warps), against a copy.  Each row: the device time a call (the median
of Triton's ``do_bench`` on CUDA, wall time on the CPU), the bytes read and written per
second (x once, the operand once) and that as a fraction of a copy's (read + write of x per
second of ``x.clone()``).  Every tiling's output is checked bit for bit against the default
tiling's; the fastest tiling of each configuration is printed last (the defaults to set in
`stochround.kernels.block_kernel.quantize_tiling`).

GPU:  python benchmarks/bench_quantize_tiling.py
CPU smoke (interpreter):  python benchmarks/bench_quantize_tiling.py --device cpu \
    --tokens 64 --features 128 --elements 1024 --warps 4 --repeats 1
"""

from __future__ import annotations

import argparse
import itertools
import os
from functools import partial

import torch
from harness import sweep_seconds

# name: (element, block, scale rule, mode, rht, tensor scales, amax given, out dtype)
CONFIGURATIONS: dict[str, tuple] = {
    "nvfp4 x rne": ("e2m1", 16, "nvfp4", "rne", None, 2, False, torch.bfloat16),
    "nvfp4 W 16x16 rne": ("e2m1", 16, "nvfp4", "rne", None, 2, True, torch.bfloat16),
    "nvfp4 dy sr": ("e2m1", 16, "nvfp4", "sr", None, 2, False, torch.bfloat16),
    "nvfp4 wgrad sr rht16": ("e2m1", 16, "nvfp4", "sr", 16, 2, False, torch.bfloat16),
    "nvfp4 wgrad rne rht16": ("e2m1", 16, "nvfp4", "rne", 16, 2, False, torch.bfloat16),
    "mxfp8 rceil rne (fp32 out)": ("e4m3fn", 32, "rceil", "rne", None, 0, False, torch.float32),
    "mxfp4_tseng sr rht64": ("e2m1", 32, "floor-3/4", "sr", 64, 0, False, torch.bfloat16),
}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit patterns (NaN payloads included)."""
    width = torch.int16 if a.element_size() == 2 else torch.int32
    return a.dtype == b.dtype and torch.equal(a.view(width), b.view(width))


class Operand:
    """One configuration's prepared launches (one a tiling) and their arguments."""

    def __init__(self, x: torch.Tensor, configuration: tuple, device: str) -> None:
        from stochround.kernels import blocks

        element, block, rule, mode, rht, scales, given, out_dtype = configuration
        self.signs = None if rht is None else torch.ones(rht, device=device)
        self.options = {
            "element": element, "block": block, "scale_rule": rule, "out_dtype": out_dtype,
            "tensor_scales": scales, "amax_given": given, "rht_signs": self.signs,
            "mode": mode, "rht": rht, "rht_bf16": rht is not None,
        }  # fmt: skip
        self.x = x
        self.tensor_scale = torch.tensor([0.01, 100.0][:scales], device=device) if scales else None
        magnitude = x.abs().float()
        self.amax = magnitude.amax(dim=1).repeat_interleave(x.shape[1] // block) if given else None
        self.seed = torch.tensor([1], device=device)
        self.offset = torch.tensor([0], device=device)
        self.prepared: dict[object, blocks.PreparedGemmBlocks] = {}
        self.blocks = blocks

    def run(self, tiling: object) -> torch.Tensor:
        """The operand under ``tiling`` (None: the default), its launch prepared once."""
        prepared = self.prepared.get(tiling)
        if prepared is None:
            prepared = self.prepared[tiling] = self.blocks.PreparedGemmBlocks(
                self.x, tiling=tiling, **self.options
            )
        return prepared(self.x, self.tensor_scale, self.signs, self.amax, self.seed, self.offset)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (interpreter)")
    parser.add_argument("--tokens", type=int, default=8192, help="x's rows (8192)")
    parser.add_argument("--features", type=int, default=4096, help="x's columns (4096)")
    parser.add_argument(
        "--elements", default="1024,2048,4096,8192,16384", help="QuantizeTiling.ELEMENTS values"
    )
    parser.add_argument("--warps", default="2,4,8,16", help="QuantizeTiling.WARPS values")
    parser.add_argument("--case", action="append", help="only these configurations (repeatable)")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls (20)")
    args = parser.parse_args()
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels import triton
    from stochround.kernels import blocks

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(args.tokens, args.features, generator=generator).to(args.device)
    x = x.to(torch.bfloat16)
    copy_seconds = sweep_seconds(x.clone, args.device, args.repeats)
    copy_rate = 2 * x.numel() * x.element_size() / copy_seconds
    print(f"x {args.tokens} x {args.features} bfloat16 on {args.device}")
    print(f"copy (read + write) {copy_rate / 1e9:.0f} GB/s, {copy_seconds * 1e6:.1f} us")
    print(
        f"{'configuration':<28} {'elements':>8} {'warps':>5} {'us':>9} {'GB/s':>7} {'of copy':>8}"
    )
    elements = [int(value) for value in args.elements.split(",")]
    warps = [int(value) for value in args.warps.split(",")]
    best: dict[str, tuple[float, object]] = {}
    for name, configuration in CONFIGURATIONS.items():
        if args.case and name not in args.case:
            continue
        block, rht = configuration[1], configuration[4]
        operand = Operand(x, configuration, args.device)
        expected = operand.run(None)
        nbytes = x.numel() * x.element_size() + expected.numel() * expected.element_size()
        for count, warp in itertools.product(elements, warps):
            if count < max(block, rht or 0):
                continue
            tiling = blocks.QuantizeTiling(ELEMENTS=count, WARPS=warp)
            if not same_bits(operand.run(tiling), expected):
                raise SystemExit(f"{name} {tiling}: differs from the default tiling's bits")
            seconds = sweep_seconds(partial(operand.run, tiling), args.device, args.repeats)
            rate = nbytes / seconds
            print(
                f"{name:<28} {count:>8} {warp:>5} {seconds * 1e6:>9.1f} {rate / 1e9:>7.0f} "
                f"{rate / copy_rate:>8.0%}"
            )
            if name not in best or seconds < best[name][0]:
                best[name] = (seconds, tiling)
    print("fastest tiling per configuration:")
    for name, (seconds, tiling) in best.items():
        print(f"  {name:<28} {tiling}  {seconds * 1e6:.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
