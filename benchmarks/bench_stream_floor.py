"""The practical floor of our kernels' memory traffic on this GPU, beside our kernels.

Optimizer: a Triton kernel that only streams what an AdamW step with bf16 parameters and
states must move (reads p, g, m, v; writes p, m, v; 14 bytes per element, one trivial add
each) over flat buffers as large as the optimizer benchmark's 16 x 4096**2 parameters,
with a few launch configurations; then stochround's AdamW (bf16 states, "sr" and "rne")
over 16 tensors of 4096**2; against the device copy of the same run (the floor of
`bench_optim.py`: 14 bytes per parameter at the copy bandwidth).

Casts: a Triton kernel that reads 2**28 fp32 values and writes what a cast to bf16 (2
bytes a value), to fp8 codes (1 byte) or to packed fp4 (1 byte per 2 values) writes, the
output bits cut from the input's with one shift (no rounding, no random bits), with a few
launch configurations; then stochround's SR casts of the same values to those formats.

Both answer how close to the bytes any kernel can come, so that a peer ratio or a
percentage of the copy bandwidth can be judged against what the memory allows.

    python benchmarks/bench_stream_floor.py        # on the GPU (CUDA only)
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl
from gpu_timing import device_description, time_function
from rich.console import Console
from rich.table import Table

import stochround

# (elements a program, warps)
LAUNCHES = ((1024, 4), (2048, 4), (2048, 8), (4096, 8))
CAST_LAUNCHES = ((2048, 2), (2048, 4), (4096, 4), (4096, 8), (8192, 8))
CAST_LOG2N = 28
COPY_LOG2N = 28
COPY_BYTES = 8 * 2**COPY_LOG2N  # what the device copy moves: fp32 read and written
# (label, values per output element, what the stream kernel writes, stochround's target
# dtype, its further keywords)
CASTS = (
    ("bf16", 1, torch.bfloat16, torch.bfloat16, {}),
    ("fp8 e4m3fn codes", 1, torch.uint8, torch.float8_e4m3fn, {}),
    ("fp4 e2m1 packed", 2, torch.uint8, torch.float4_e2m1fn_x2, {"nan": "zero"}),
)


@triton.jit
def _stream_kernel(p_ptr, g_ptr, m_ptr, v_ptr, BLOCK: tl.constexpr):
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
def _cast_stream_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr, PAIRS: tl.constexpr):
    """Read BLOCK fp32 values a program and write a cast's bytes: the top bits of each
    value (16 for a bf16 output, 8 for a byte), or with PAIRS the top 4 bits of two
    neighbours in one byte (packed fp4)."""
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


def median_us(function, device: torch.device) -> float:
    return time_function(function, device).median_us


def copy_us(device: torch.device) -> float:
    """The device copy of 2**COPY_LOG2N fp32 values (COPY_BYTES moved)."""
    source = torch.randn(2**COPY_LOG2N, device=device)
    destination = torch.empty_like(source)
    return median_us(lambda: destination.copy_(source), device)


def stream_rows(numel: int, device: torch.device) -> list[tuple[str, float]]:
    """The stream kernel over four flat bf16 buffers of ``numel`` values, each launch."""
    buffers = [torch.randn(numel, device=device).to(torch.bfloat16) for _ in range(4)]
    rows = []
    for block, warps in LAUNCHES:
        grid = (numel // block,)
        time_us = median_us(
            lambda b=block, w=warps, n=grid: _stream_kernel[n](*buffers, BLOCK=b, num_warps=w),
            device,
        )
        rows.append((f"stream 4 reads + 3 writes, {block} a program, {warps} warps", time_us))
    return rows


def adamw_rows(count: int, dim: int, device: torch.device) -> list[tuple[str, float]]:
    """stochround's AdamW over ``count`` bf16 tensors of dim x dim, "sr" and "rne"."""
    generator = torch.Generator(device=device).manual_seed(0)
    params = []
    for _ in range(count):
        param = torch.randn((dim, dim), generator=generator, device=device).to(torch.bfloat16)
        param.grad = torch.randn_like(param)
        params.append(param)
    rows = []
    for rounding in ("sr", "rne"):
        optimizer = stochround.optim.AdamW(
            params, lr=1e-3, state_dtype=torch.bfloat16, rounding=rounding, seed=0
        )
        label = f"stochround AdamW bf16, bf16 states, {rounding}"
        rows.append((label, median_us(optimizer.step, device)))
    return rows


def cast_rows(device: torch.device) -> list[tuple[str, float, float]]:
    """(label, median us, bytes moved) of the cast stream kernel for each cast and launch,
    then of stochround's SR cast (triton backend, fixed seed) of the same values."""
    x = torch.randn(2**CAST_LOG2N, device=device)
    rows = []
    for label, per_output, dtype, target, options in CASTS:
        out = torch.empty(x.numel() // per_output, dtype=dtype, device=device)
        moved = x.numel() * (4 + out.element_size() / per_output)
        for block, warps in CAST_LAUNCHES:
            grid = (x.numel() // block,)
            time_us = median_us(
                lambda b=block, w=warps, n=grid, o=out, p=per_output: _cast_stream_kernel[n](
                    x, o, BLOCK=b, PAIRS=p == 2, num_warps=w
                ),
                device,
            )
            rows.append((f"stream to {label}, {block} a program, {warps} warps", time_us, moved))
        time_us = median_us(
            lambda t=target, o=options: stochround.cast(x, t, "sr", seed=1, backend="triton", **o),
            device,
        )
        notes = "".join(f", {key}={value!r}" for key, value in options.items())
        rows.append((f"stochround cast to {label}, SR{notes}", time_us, moved))
    return rows


def optim_table(count: int, dim: int, copy: float, device: torch.device) -> Table:
    """The optimizer's stream rows and our steps against 14 B/param at the copy bandwidth."""
    numel = count * dim * dim
    floor_us = 14 * numel / (COPY_BYTES / copy)
    table = Table(title=f"{device_description(device).get('gpu')}: copy {copy:.1f} us")
    for header in ("what", "median us", "x floor"):
        table.add_column(header)
    table.add_row("floor: 14 B/param at the copy bandwidth", f"{floor_us:.1f}", "1.000")
    for label, time_us in stream_rows(numel, device) + adamw_rows(count, dim, device):
        table.add_row(label, f"{time_us:.1f}", f"{time_us / floor_us:.3f}")
    return table


def cast_table(copy: float, device: torch.device) -> Table:
    """The casts' stream rows and our SR casts against their bytes at the copy bandwidth."""
    table = Table(title=f"casts of 2**{CAST_LOG2N} fp32 values: copy {copy:.1f} us")
    for header in ("what", "median us", "bytes at copy bw, us", "% of copy bw"):
        table.add_column(header)
    for label, time_us, moved in cast_rows(device):
        at_copy = moved / (COPY_BYTES / copy)
        table.add_row(label, f"{time_us:.1f}", f"{at_copy:.1f}", f"{100 * at_copy / time_us:.1f}")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=16, help="tensors (16)")
    parser.add_argument("--dim", type=int, default=4096, help="each dim x dim (4096)")
    parser.add_argument(
        "--part", choices=("all", "optim", "casts"), default="all", help="what to run (all)"
    )
    args = parser.parse_args()
    device = torch.device("cuda")
    if args.count * args.dim * args.dim % LAUNCHES[-1][0]:
        parser.error(f"count x dim**2 must be a multiple of {LAUNCHES[-1][0]}")
    copy = copy_us(device)
    console = Console(width=100)
    if args.part != "casts":
        console.print(optim_table(args.count, args.dim, copy, device))
    if args.part != "optim":
        console.print(cast_table(copy, device))


if __name__ == "__main__":
    main()
