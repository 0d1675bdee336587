"""The practical floor of an AdamW step's memory traffic on this GPU, beside our step.

A Triton kernel that only streams what an AdamW step with bf16 parameters and states must
move (reads p, g, m, v; writes p, m, v; 14 bytes per element, one trivial add each)
over flat buffers as large as the optimizer benchmark's 16 x 4096**2 parameters, with a
few launch configurations; then stochround's AdamW (bf16 states, "sr" and "rne") over 16
tensors of 4096**2; all against the device copy of the same run (the floor of
`bench_optim.py`: 14 bytes per parameter at the copy bandwidth).  It answers how close to
the floor any step can come, so that a peer ratio at the floor can be judged.

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


def median_us(function, device: torch.device) -> float:
    return time_function(function, device).median_us


def copy_us(device: torch.device) -> float:
    """The device copy of 2**28 fp32 values (8 bytes moved an element)."""
    source = torch.randn(2**28, device=device)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=16, help="tensors (16)")
    parser.add_argument("--dim", type=int, default=4096, help="each dim x dim (4096)")
    args = parser.parse_args()
    device = torch.device("cuda")
    numel = args.count * args.dim * args.dim
    if numel % LAUNCHES[-1][0]:
        parser.error(f"count x dim**2 must be a multiple of {LAUNCHES[-1][0]}")
    copy = copy_us(device)
    floor_us = 14 * numel / (2**28 * 8 / copy)
    rows = stream_rows(numel, device) + adamw_rows(args.count, args.dim, device)
    table = Table(title=f"{device_description(device).get('gpu')}: copy {copy:.1f} us")
    for header in ("what", "median us", "x floor"):
        table.add_column(header)
    table.add_row("floor: 14 B/param at the copy bandwidth", f"{floor_us:.1f}", "1.000")
    for label, time_us in rows:
        table.add_row(label, f"{time_us:.1f}", f"{time_us / floor_us:.3f}")
    Console(width=100).print(table)


if __name__ == "__main__":
    main()
