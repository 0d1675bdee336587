"""One read, both orientations (issue 42): the two-orientation quantizer
(`stochround.nn.orientations`, kernel `stochround.kernels.two_orientation`) beside the
separate path and the floor, at its default tile and at the tiles given.

Input: a ``tokens x features`` bf16 x drawn from randn (8192 x 4096 by default, the
QuantizedLinear step of bench_nn). Rows of case ``nvfp4_two_orientation``:

- ``floor``: a Triton kernel reading x once and writing it twice in bf16, as it is and
  transposed (bench_blocks' `pair_floor`): 6 bytes an element for every row.
- ``stochround_pair_dy``, ``stochround_pair_x``: both `nvfp4()` operands of dy (SR, the
  column-wise one rotated by RHT-16 along the tokens) or of x (round to nearest) by the
  pair's two launches (the amaxes of both orientations in one read, whose last program
  writes both tensor scales, then both operands),
  at the default tile; ``..._<T>x<F>w<W>``: at ``--tile`` T x F with W warps;
  ``..._amax<K>``: at the default tile, the amax launch's tiles K times its tokens
  (``--amax-tokens``; the default `two_orientation.AMAX_TOKENS`); ``..._unstaged``
  (``--unstaged``): the operands stored from each thread's own blocks, not as the
  tile's matrices (`two_orientation.STAGED_STORES` off). Each is checked bit for bit
  against the separate path before it is timed.
- ``stochround_separate_dy``, ``stochround_separate_x``: the separate path a step takes
  while `orientations.SERVES_STEPS` is off (the row-wise operand, then the transpose kernel
  and the column-wise operand, each with its amax and quantize launches).

The table's last lines give each row as a fraction of the floor's bandwidth and the pair's
time over the separate path's.

    python benchmarks/bench_pair.py                                   # GPU, 8192 x 4096
    python benchmarks/bench_pair.py --tile 16x64 --tile 64x64 --warps 4 --warps 8
    python benchmarks/bench_pair.py --amax-tokens 1 --amax-tokens 4
    python benchmarks/bench_pair.py --unstaged
    python benchmarks/bench_pair.py --device cpu --tokens 48 --features 64  # smoke test
"""

from __future__ import annotations

import json
import re
import sys
from functools import partial
from pathlib import Path

# harness before triton: without a GPU it selects Triton's interpreter
import harness  # noqa: F401
import torch
from bench_blocks import checked_pair, pair_floor, separate_pair, served_pair_roles
from harness import Benchmark, Run
from torch import Tensor

CASE = "nvfp4_two_orientation"


def pair_run(x: Tensor, name: str, **settings: object) -> Run:
    """Both operands of x as ``name``'s roles ("input", "grad_output") by the pair's
    launches (`PreparedPair`), prepared with `stochround.kernels.two_orientation`'s
    ``settings`` in place of its defaults (TILE_TOKENS, TILE_FEATURES, _NUM_WARPS,
    AMAX_TOKENS, STAGED_STORES), checked against the separate path."""
    from stochround.kernels import two_orientation
    from stochround.nn.orientations import PreparedPair

    row, column, plan = served_pair_roles(name)
    defaults = {setting: getattr(two_orientation, setting) for setting in settings}
    for setting, value in settings.items():
        setattr(two_orientation, setting, value)
    try:
        prepared = PreparedPair(row, column, x.shape, x.dtype, x.device, x.shape[0])  # type: ignore[arg-type]
    finally:
        for setting, value in defaults.items():
            setattr(two_orientation, setting, value)
    notes = "amax and tensor scales of both orientations, then both operands: 2 launches"
    return checked_pair(x, name, prepared, plan.seed, notes)  # type: ignore[attr-defined]


def parsed_tiles(tiles: list[str], warps: list[int]) -> list[tuple[int, int, int]]:
    """(tokens, features, warps) of each ``--tile`` TxF and ``--warps`` W."""
    result = []
    for tile in tiles:
        match = re.fullmatch(r"(\d+)x(\d+)", tile)
        if match is None:
            raise ValueError(f"--tile must be TOKENSxFEATURES (e.g. 32x64); got {tile!r}")
        tokens, features = int(match.group(1)), int(match.group(2))
        for side in (tokens, features):
            if side < 16 or side & (side - 1):
                raise ValueError(f"--tile sides must be powers of two >= 16; got {tile!r}")
        result += [(tokens, features, w) for w in warps]
    return result


def print_fractions(path: Path) -> None:
    """Each stochround row's bandwidth over the floor's, and its time over the separate
    path's for the same tensor."""
    rows = json.loads(path.read_text())["rows"]
    found = {row["provider"]: row for row in rows if row["case"] == CASE}
    base = found.get("floor")
    print("fraction of the floor; time over the separate path's:")
    for row in rows:
        if not row["ours"] or not row.get("median_us") or base is None or not base.get("tb_s"):
            continue
        percent = 100 * row["tb_s"] / base["tb_s"]
        tensor = "dy" if "_dy" in row["provider"] else "x"
        separate = found.get(f"stochround_separate_{tensor}")
        ratio = ""
        if separate is not None and separate.get("median_us"):
            ratio = f", {row['median_us'] / separate['median_us']:.2f}x the separate path"
        print(
            f"  {row['provider']}: {percent:.1f}% of the floor ({row['median_us']:.1f} us{ratio})"
        )


def main() -> int:
    bench = Benchmark("bench_pair", __doc__, reference=f"{CASE}/floor")
    add = bench.parser.add_argument
    add("--tokens", type=int, default=8192, help="x's tokens (8192)")
    add("--features", type=int, default=4096, help="x's features, a multiple of 16 (4096)")
    add("--tile", action="append", default=[], help="a TOKENSxFEATURES tile to time too")
    add("--warps", type=int, action="append", help="warps of each --tile (4)")
    add(
        "--amax-tokens",
        type=int,
        action="append",
        default=[],
        help="the amax launch's tile tokens over the quantize launch's, to time too",
    )
    add(
        "--unstaged",
        action="store_true",
        help="time too the operands stored from each thread's blocks (STAGED_STORES off)",
    )
    args = bench.parse_args()
    if args.tokens % 16 or args.features % 16:
        bench.parser.error(
            f"--tokens and --features must be multiples of 16; got {args.tokens}, {args.features}"
        )
    try:
        tiles = parsed_tiles(args.tile, args.warps or [4])
    except ValueError as error:
        bench.parser.error(str(error))
    for factor in args.amax_tokens:
        if factor < 1 or factor & (factor - 1):
            bench.parser.error(f"--amax-tokens must be powers of two >= 1; got {factor}")
    generator = torch.Generator(device=bench.device).manual_seed(0)
    x = torch.randn(args.tokens, args.features, generator=generator, device=bench.device)
    x = x.to(torch.bfloat16)

    bench.add(CASE, "floor", lambda: pair_floor(x), reference=True, cuda_only=True)
    for name, tensor in (("grad_output", "dy"), ("input", "x")):
        bench.add(CASE, f"stochround_pair_{tensor}", partial(pair_run, x, name), ours=True)
        variants: dict[str, dict[str, object]] = {}
        for tokens, features, warps in tiles:
            variants[f"{tokens}x{features}w{warps}"] = {
                "TILE_TOKENS": tokens, "TILE_FEATURES": features, "_NUM_WARPS": warps
            }  # fmt: skip
        for factor in args.amax_tokens:
            variants[f"amax{factor}"] = {"AMAX_TOKENS": factor}
        if args.unstaged:
            variants["unstaged"] = {"STAGED_STORES": False}
        for suffix, settings in variants.items():
            build = partial(pair_run, x, name, **settings)
            bench.add(CASE, f"stochround_pair_{tensor}_{suffix}", build, ours=True)
        build = partial(separate_pair, x, name)
        bench.add(CASE, f"stochround_separate_{tensor}", build, ours=True)
    status = bench.run()
    print_fractions(args.out / f"bench_pair{'_' + args.tag if args.tag else ''}.json")
    return status


if __name__ == "__main__":
    sys.exit(main())
