"""The practical floor of the kernels' memory traffic, beside stochround's kernels.

Triton kernels that only move the bytes an operation must move, at a few launch
configurations (provider ``stream_<elements a program>x<warps>``), against stochround doing
the operation and the device copy (the reference):

- adamw_stream: read four bf16 arrays and write three (an AdamW step's p, g, m, v read and
  p, m, v written: 14 bytes a parameter, one add each) over ``--count`` x ``--dim``**2
  elements (268M); stochround's AdamW step (bf16 states, "sr" and "rne") on as many
  parameters. Every row counts 14 bytes a parameter, so % of the copy is 1 / (x floor).
- cast_bf16, cast_e4m3fn, cast_e2m1: read 2**log2n fp32 values and write what the cast
  writes (2 bytes, 1 byte, or 4 bits a value), the output bits cut from the input's top
  bits with one shift (no rounding, no random bits); stochround's SR cast of the same values
  (e2m1 with ``nan="zero"``).

The stream kernels' outputs are checked against the same shifts in PyTorch, stochround's as
in bench_cast. How close to the bytes any kernel comes judges a percentage of the copy.

    python benchmarks/bench_stream_floor.py                                        # GPU
    python benchmarks/bench_stream_floor.py --device cpu --log2n 13 --count 1 --dim 64 \\
        --repeats 1                                                                # smoke test
"""

from __future__ import annotations

import sys
from functools import partial

# harness first: without a GPU it sets TRITON_INTERPRET, which must precede importing Triton
import harness
import torch
import triton
import triton.language as tl
from torch import Tensor

import stochround

LAUNCHES = ((1024, 4), (2048, 4), (2048, 8), (4096, 8))  # (elements a program, warps)
CAST_LAUNCHES = ((2048, 2), (2048, 4), (4096, 4), (4096, 8), (8192, 8))
# case: (stochround's dtype and keywords, bytes an element, values an output element)
CASTS = {
    "cast_bf16": (torch.bfloat16, {}, "bfloat16", 6, 1),
    "cast_e4m3fn": (torch.float8_e4m3fn, {}, "e4m3fn", 5, 1),
    "cast_e2m1": (torch.float4_e2m1fn_x2, {"nan": "zero"}, "e2m1", 4.5, 2),
}


@triton.jit
def stream_kernel(p_ptr, g_ptr, m_ptr, v_ptr, BLOCK: tl.constexpr):
    """Read four bf16 arrays and write three: an AdamW step's traffic, no update math."""
    position = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    p = tl.load(p_ptr + position).to(tl.float32)
    g = tl.load(g_ptr + position).to(tl.float32)
    m = tl.load(m_ptr + position).to(tl.float32)
    v = tl.load(v_ptr + position).to(tl.float32)
    tl.store(m_ptr + position, (m + g).to(tl.bfloat16))
    tl.store(v_ptr + position, (v + g).to(tl.bfloat16))
    tl.store(p_ptr + position, (p + g).to(tl.bfloat16))


@triton.jit
def cast_stream_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr, PAIRS: tl.constexpr):
    """Read BLOCK fp32 values a program and write a cast's bytes: the top bits of each value
    (16 for a bf16 output, 8 for a byte), or with PAIRS the top 4 bits of two neighbours in
    one byte (packed fp4, the first value in the low half)."""
    position = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    bits = tl.load(x_ptr + position).to(tl.uint32, bitcast=True)
    if PAIRS:
        low, high = tl.split(tl.reshape(bits, (BLOCK // 2, 2)))
        byte = (low >> 28) | ((high >> 24) & 0xF0)
        pair = tl.program_id(0).to(tl.int64) * (BLOCK // 2) + tl.arange(0, BLOCK // 2)
        tl.store(out_ptr + pair, byte.to(tl.uint8))
    elif out_ptr.dtype.element_ty == tl.uint8:
        tl.store(out_ptr + position, (bits >> 24).to(tl.uint8))
    else:
        tl.store(out_ptr + position, (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True))


def cut_bits(x: Tensor, pairs: int, dtype: torch.dtype) -> Tensor:
    """What the cast stream kernel writes, computed by PyTorch."""
    bits = x.view(torch.int32)
    if pairs == 2:
        low, high = bits[0::2], bits[1::2]
        return (((low >> 28) & 0xF) | ((high >> 24) & 0xF0)).to(torch.uint8)
    if dtype == torch.bfloat16:
        return (bits >> 16).to(torch.int16).view(torch.bfloat16)
    return ((bits >> 24) & 0xFF).to(torch.uint8)


def cast_stream(x: Tensor, case: str, block: int, warps: int) -> harness.Run:
    dtype, _, _, nbytes, pairs = CASTS[case]
    out_dtype = torch.bfloat16 if dtype == torch.bfloat16 else torch.uint8
    out = torch.empty(x.numel() // pairs, dtype=out_dtype, device=x.device)
    grid = (x.numel() // block,)

    def call() -> Tensor:
        cast_stream_kernel[grid](x, out, BLOCK=block, PAIRS=pairs == 2, num_warps=warps)
        return out

    return harness.Run(
        call, harness.equal_check(cut_bits(x, pairs, dtype)), x.numel(), nbytes * x.numel()
    )


def adamw_stream(numel: int, block: int, warps: int, device: torch.device) -> harness.Run:
    p, g, m, v = (torch.randn(numel, device=device).to(torch.bfloat16) for _ in range(4))
    expected = m.float() + g.float()

    def call() -> Tensor:
        stream_kernel[(numel // block,)](p, g, m, v, BLOCK=block, num_warps=warps)
        return m

    def check(output: Tensor) -> str:
        # within a bf16 ulp: Triton's interpreter converts to bf16 toward zero, GPUs to nearest
        if not torch.allclose(output.float(), expected, rtol=2**-7, atol=0):
            raise harness.CheckFailed("m != m + g after one call")
        return "ok m = m + g in bf16"

    return harness.Run(call, check, numel, 14 * numel)


def adamw(count: int, dim: int, rounding: str, device: torch.device) -> harness.Run:
    generator = torch.Generator(device=device).manual_seed(0)
    params = []
    for _ in range(count):
        param = torch.randn((dim, dim), generator=generator, device=device).to(torch.bfloat16)
        param.grad = torch.randn_like(param)
        params.append(param)
    optimizer = stochround.optim.AdamW(
        params, lr=1e-3, state_dtype=torch.bfloat16, rounding=rounding, seed=0
    )
    numel = count * dim * dim
    return harness.Run(optimizer.step, None, numel, 14 * numel, "checks: bench_optim")


def main() -> int:
    bench = harness.Benchmark("bench_stream_floor", __doc__, reference="copy/torch")
    bench.parser.add_argument("--log2n", type=int, default=28, help="cast elements (2**28)")
    bench.parser.add_argument("--count", type=int, default=16, help="AdamW tensors (16)")
    bench.parser.add_argument("--dim", type=int, default=4096, help="each dim x dim (4096)")
    args = bench.parse_args()
    device, numel = bench.device, args.count * args.dim**2
    if numel % LAUNCHES[-1][0] or args.log2n < 13:
        bench.parser.error("count x dim**2 must be a multiple of 4096, and log2n >= 13")
    x = torch.randn(2**args.log2n, device=device)

    def copy() -> harness.Run:
        destination = torch.empty_like(x)
        return harness.Run(
            lambda: destination.copy_(x), harness.equal_check(x), x.numel(), 8 * x.numel()
        )

    bench.add("copy", "torch", copy, reference=True)
    for block, warps in LAUNCHES:
        build = partial(adamw_stream, numel, block, warps, device)
        bench.add("adamw_stream", f"stream_{block}x{warps}", build)
    for rounding in ("sr", "rne"):
        build = partial(adamw, args.count, args.dim, rounding, device)
        bench.add("adamw_stream", f"stochround_{rounding}", build, ours=True)
    for case, (dtype, keywords, fmt, nbytes, _) in CASTS.items():
        for block, warps in CAST_LAUNCHES:
            build = partial(cast_stream, x, case, block, warps)
            bench.add(case, f"stream_{block}x{warps}", build)
        spec = ("cast", (dtype, "sr"), keywords, fmt, nbytes)
        build = partial(harness.stochround_run, x, *spec, backend="triton", count=args.check_count)
        bench.add(case, "stochround", build, ours=True)
    return bench.run()


if __name__ == "__main__":
    sys.exit(main())
