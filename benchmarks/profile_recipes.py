"""Where a `QuantizedLinear` step spends its time, per recipe (issue 42's profile): the
eager step's device time and host time beside bf16, the top device kernels and the top
host functions, at one shape.

    python benchmarks/profile_recipes.py --tokens 2048 --features 1024 --out DIR
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

import stochround.nn as srnn


def make_layer(recipe: str, features: int) -> nn.Module:
    if recipe == "bf16_linear":
        return nn.Linear(features, features, bias=False, device="cuda", dtype=torch.bfloat16)
    return srnn.QuantizedLinear(
        features,
        features,
        bias=False,
        device="cuda",
        dtype=torch.bfloat16,
        recipe=srnn.RECIPES[recipe](),
    )


def step_of(layer: nn.Module, x: torch.Tensor, dy: torch.Tensor):
    def step() -> None:
        x.grad = None
        layer.weight.grad = None
        layer(x).backward(dy)

    return step


def timed(step, repeats: int) -> tuple[float, float]:
    """(device ms per step by CUDA events, host ms per step with the GPU never waited for
    inside the loop: the time the Python side takes to issue a step)."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        step()
    end.record()
    torch.cuda.synchronize()
    device = start.elapsed_time(end) / repeats
    t0 = time.perf_counter()
    for _ in range(repeats):
        step()
    host = (time.perf_counter() - t0) * 1e3 / repeats
    torch.cuda.synchronize()
    return device, host


def graphed(step) -> tuple[float | None, str]:
    """The step captured as one CUDA graph (after warm-up on a side stream) and its replay
    time in ms, or None and why capture failed."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            step()
    except Exception as error:  # noqa: BLE001 - the reason is the result
        torch.cuda.synchronize()
        return None, f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 20, ""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--features", type=int, default=1024)
    parser.add_argument("--recipes", default="bf16_linear,nvfp4,mxfp8,int8,mxfp4_tseng,fp8")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default="/tmp/profile")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    x = torch.randn(args.tokens, args.features, device="cuda", dtype=torch.bfloat16)
    x.requires_grad_(True)
    dy = torch.randn(args.tokens, args.features, device="cuda", dtype=torch.bfloat16)
    rows = []
    for recipe in args.recipes.split(","):
        layer = make_layer(recipe, args.features)
        step = step_of(layer, x, dy)
        device, host = timed(step, args.repeats)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
        kernels = sorted(
            (e for e in prof.key_averages() if e.device_time_total > 0),
            key=lambda e: -e.device_time_total,
        )
        launches = sum(e.count for e in kernels) / 3
        top = [(e.key[:70], round(e.device_time_total / 3 / 1e3, 3), e.count // 3) for e in kernels[:8]]
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(5):
            step()
        profiler.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(18)
        (out / f"host_{recipe}_{args.tokens}.txt").write_text(text.getvalue())
        graph_ms, why = graphed(step_of(make_layer(recipe, args.features), x, dy))
        if why:
            print(f"   capture failed: {why}")
        rows.append({"recipe": recipe, "device_ms": device, "host_ms": host, "launches": launches, "top": top, "graph_ms": graph_ms})
        print(f"== {recipe}: step {device:.3f} ms (device), host {host:.3f} ms, launches {launches:.0f}")
        for name, ms, count in top:
            print(f"   {ms:8.3f} ms  x{count:<4} {name}")
        print("\n".join(text.getvalue().splitlines()[6:30]))
    (out / f"profile_{args.tokens}.json").write_text(json.dumps(rows, indent=1))
    base = rows[0]["device_ms"]
    gbase = rows[0]["graph_ms"] or float("nan")
    print(f"\n{'recipe':14} {'step ms':>8} {'x bf16':>7} {'host ms':>8} {'launches':>8} {'graph ms':>8} {'x bf16':>7}")
    for row in rows:
        g = row["graph_ms"] if row["graph_ms"] is not None else float("nan")
        print(
            f"{row['recipe']:14} {row['device_ms']:8.3f} {row['device_ms'] / base:7.2f} "
            f"{row['host_ms']:8.3f} {row['launches']:8.0f} {g:8.3f} {g / gbase:7.2f}"
        )


if __name__ == "__main__":
    main()
