"""The amax kernels' speed against a copy of the same tensor (issue 42): `tensor_amax` under
each `AmaxTiling` of a sweep (elements a load, loads a program, warps), the 2-D tiles' amax
with NVFP4's tensor scales in one read (`tile_amax`) against the PyTorch reduction it
replaced, and the tensor scales of the amax launch's last program.  Each row: the device
time a call (the median of Triton's ``do_bench`` on CUDA, wall time on the CPU), the bytes
of x read per second, and that as a fraction of a copy's (read + write of x, per second of
the copy's time: the bandwidth a streaming kernel can reach).  Every tiling's result is
checked against ``x.abs().amax()``, and first the tensor scales against the PyTorch path
on tensors whose largest magnitude sits in a different program each time (on a GPU this
exercises the ticket counter's memory ordering).

GPU:  python benchmarks/bench_amax.py
CPU smoke (interpreter):  TRITON_INTERPRET=1 python benchmarks/bench_amax.py --device cpu \
    --tokens 64 --features 64 --chunks 64 --steps 1 --warps 4
"""

from __future__ import annotations

import argparse
import itertools
import os

import torch
from harness import sweep_seconds


def row(name: str, seconds: float, nbytes: int, copy_rate: float) -> str:
    rate = nbytes / seconds
    return f"{name:<44} {seconds * 1e6:10.1f} {rate / 1e9:9.0f} {rate / copy_rate:8.0%}"


def check_tensor_scales(x: torch.Tensor, rounds: int) -> None:
    """SystemExit unless the one-launch tensor scales (prepared, unprepared, with the 2-D
    tiles' amax) equal `nvfp4_tensor_scales` of ``x.abs().amax()`` over ``rounds`` tensors
    like x, each with its largest magnitude placed at random (a different last program
    and a different program holding the max each time)."""
    from stochround.blocks.scales import nvfp4_tensor_scales
    from stochround.kernels import block_amax

    generator = torch.Generator().manual_seed(0)
    for flavour in ("te", "torchao"):
        prepared = block_amax.PreparedTensorScale(x, flavour)
        tiles = block_amax.PreparedTileAmax(x, (16, 16), flavour)
        for _ in range(rounds):
            case = torch.randn(x.shape, device=x.device).to(x.dtype)
            where = int(torch.randint(case.numel(), (1,), generator=generator))
            case.view(-1)[where] = 1e4
            expected = torch.stack(tuple(nvfp4_tensor_scales(case.abs().amax(), flavour)))
            got = {
                "prepared": prepared(case, None),
                "unprepared": block_amax.nvfp4_tensor_scale(case, flavour)[0],
                "tiles": tiles(case).scales,
            }
            for name, scales in got.items():
                assert scales is not None
                if not torch.equal(scales.view(torch.int32), expected.view(torch.int32)):
                    raise SystemExit(f"{flavour} {name}: scales {scales} != {expected}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (interpreter)")
    parser.add_argument("--tokens", type=int, default=8192, help="x's rows (8192)")
    parser.add_argument("--features", type=int, default=4096, help="x's columns (4096)")
    parser.add_argument("--dtype", default="bfloat16", help="float32, bfloat16 or float16")
    parser.add_argument(
        "--chunks", default="1024,2048,4096", help="AmaxTiling.CHUNK values, comma-separated"
    )
    parser.add_argument("--steps", default="1,2,4,8", help="AmaxTiling.STEPS values")
    parser.add_argument("--warps", default="4,8", help="AmaxTiling.WARPS values")
    parser.add_argument("--tile", default="16,16", help="2-D tile rows,columns (16,16)")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls (20)")
    parser.add_argument(
        "--scale-checks", type=int, default=20, help="tensors whose scales are checked (20)"
    )
    args = parser.parse_args()
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels import triton
    from stochround.kernels import block_amax

    dtype = getattr(torch, args.dtype)
    x = torch.randn(args.tokens, args.features, device=args.device).to(dtype)
    nbytes = x.numel() * x.element_size()
    expected = x.abs().amax().float()
    check_tensor_scales(x, args.scale_checks)
    copy_seconds = sweep_seconds(x.clone, args.device, args.repeats)
    copy_rate = 2 * nbytes / copy_seconds
    print(f"x {args.tokens} x {args.features} {args.dtype} on {args.device}; default tiling")
    print(f"{block_amax.AMAX_TILING}; copy (read + write) {copy_rate / 1e9:.0f} GB/s")
    print(f"{'case':<44} {'us':>10} {'GB/s':>9} {'of copy':>8}")
    print(row("x.clone() (read + write)", copy_seconds, 2 * nbytes, copy_rate))
    print(
        row(
            "torch x.abs().amax()",
            sweep_seconds(lambda: x.abs().amax(), args.device, 5),
            nbytes,
            copy_rate,
        )
    )

    def ints(text: str) -> list[int]:
        return [int(value) for value in text.split(",")]

    for chunk, steps, warps in itertools.product(
        ints(args.chunks), ints(args.steps), ints(args.warps)
    ):
        tiling = block_amax.AmaxTiling(chunk, steps, warps)
        got = block_amax.tensor_amax(x, tiling=tiling)
        if not torch.equal(got, expected):
            raise SystemExit(f"{tiling}: amax {got} != {expected}")
        seconds = sweep_seconds(
            lambda t=tiling: block_amax.tensor_amax(x, tiling=t), args.device, args.repeats
        )
        print(row(f"tensor_amax {chunk} x {steps}, {warps} warps", seconds, nbytes, copy_rate))

    tile = tuple(ints(args.tile))
    assert len(tile) == 2
    rows, cols = tile

    def torch_tiles() -> torch.Tensor:  # the PyTorch reduction the kernel route replaced
        tiles = x.reshape(-1, rows, x.shape[-1] // cols, cols).abs().amax(dim=(1, 3), keepdim=True)
        repeated = tiles.to(torch.float32).expand(-1, rows, -1, -1)
        return repeated.reshape(-1, x.shape[-1] // cols).contiguous()

    got = block_amax.tile_amax(x, (rows, cols), "te")
    if not torch.equal(got.amax, torch_tiles()):
        raise SystemExit("tile_amax differs from the PyTorch reduction")
    prepared = block_amax.PreparedTileAmax(x, (rows, cols), "te")
    print(
        row(
            f"tile_amax {tile} + tensor scales (prepared)",
            sweep_seconds(lambda: prepared(x), args.device, args.repeats),
            nbytes,
            copy_rate,
        )
    )
    print(
        row(
            f"torch {tile} tiles' amax, repeated",
            sweep_seconds(torch_tiles, args.device, 5),
            nbytes,
            copy_rate,
        )
    )
    scale = block_amax.PreparedTensorScale(x, "te")
    print(
        row(
            "tensor scales alone (prepared, default tiling)",
            sweep_seconds(lambda: scale(x, None), args.device, args.repeats),
            nbytes,
            copy_rate,
        )
    )
    print(
        row(
            "tensor scales alone (nvfp4_tensor_scale)",
            sweep_seconds(
                lambda: block_amax.nvfp4_tensor_scale(x, "te"), args.device, args.repeats
            ),
            nbytes,
            copy_rate,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
