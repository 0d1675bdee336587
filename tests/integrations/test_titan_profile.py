"""benchmarks/titan_profile.py: where a torchtitan step's time goes, from a Chrome trace
with known numbers (the summary of a real trace from torchtitan's profiler on the CPU is in
test_torchtitan_profile.py)."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from titan_profile import (  # noqa: E402
    KERNEL_NAME_CHARS,
    collective,
    load_trace,
    rank_profile,
    report,
    self_times,
    short_name,
    union_length,
)

ALL_GATHER = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
REDUCE_SCATTER = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def event(cat: str, name: str, ts: float, dur: float, tid: int = 1, pid: int = 100) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid}


def gpu(cat: str, name: str, start: float, end: float, stream: int = 7) -> dict:
    return event(cat, name, start, end - start, tid=stream, pid=0)


# two recorded steps of 1000 µs each, on rank 1
TRACE = {
    "distributedInfo": {"backend": "nccl", "rank": 1, "world_size": 2},
    "traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}},
        event("user_annotation", "ProfilerStep#3", 0, 1000),
        event("user_annotation", "ProfilerStep#4", 1000, 1000),
        # the GPU's copy of a step annotation: not a step, not work
        gpu("gpu_user_annotation", "ProfilerStep#3", 0, 2000),
        # the CPU: an op with a launch in it, a hook with an op in it, another thread
        event("cpu_op", "aten::mm", 100, 300),
        event("cuda_runtime", "cudaLaunchKernel", 150, 50),
        event("user_annotation", "FSDP::pre_forward (layers.0)", 500, 200),
        event("cpu_op", "aten::copy_", 520, 100),
        event("user_annotation", "FSDP::pre_forward (layers.1)", 1100, 400),
        event("cpu_op", "aten::mm", 1200, 100),
        event("cpu_op", "aten::mm", 1500, 200, tid=2),
        {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 1, "pid": 0, "tid": 7, "ts": 100},
        # the GPU: compute on one stream, NCCL on another, a copy and a memset
        gpu("kernel", "sm90_xmma_gemm_bf16", 100, 400),
        gpu("kernel", ALL_GATHER, 300, 600, stream=20),
        gpu("gpu_memcpy", "Memcpy DtoD (Device -> Device)", 650, 700),
        gpu("kernel", "sm90_xmma_gemm_bf16", 1200, 1500),
        gpu("kernel", REDUCE_SCATTER, 1600, 1700, stream=20),
        gpu("gpu_memset", "Memset (Device)", 1650, 1660),
    ],
}


def test_a_trace_with_known_numbers_gives_them_per_step() -> None:
    profile = rank_profile(TRACE)
    ms = pytest.approx
    assert (profile.rank, profile.steps, profile.kernels) == (1, 2, 2.0)
    assert profile.wall == ms(1.0)
    # union over streams: [100, 600] + [650, 700] + [1200, 1500] + [1600, 1700] = 950 µs
    assert profile.busy == ms(0.475)
    assert profile.compute == ms(0.3)
    assert profile.nccl == {"all_gather": ms(0.15), "reduce_scatter": ms(0.05)}
    # NCCL alone: [400, 600] and [1600, 1700] less the memset's [1650, 1660] = 290 µs
    assert profile.exposed_nccl == ms(0.145)
    assert profile.idle == ms(0.525)
    assert profile.cpu_self == [
        ("aten::mm", ms(0.275)),  # 250 + 100 + 200 µs (the launch is not its own)
        ("FSDP::pre_forward", ms(0.2)),  # 100 + 300 µs: the hooks less their ops
        ("aten::copy_", ms(0.05)),
        ("cudaLaunchKernel", ms(0.025)),
    ]
    assert profile.annotations == [("FSDP::pre_forward", ms(0.3))]
    # by name over the launches: the GEMM's two 300 µs, then NCCL's (names cut at 80)
    assert profile.gpu_kernels == [
        ("sm90_xmma_gemm_bf16", ms(0.3)),
        (ALL_GATHER[:KERNEL_NAME_CHARS], ms(0.15)),
        (REDUCE_SCATTER[:KERNEL_NAME_CHARS], ms(0.05)),
    ]


def test_the_lists_keep_the_largest_names() -> None:
    profile = rank_profile(TRACE, count=1)
    assert [name for name, _ in profile.cpu_self] == ["aten::mm"]


def test_the_report_names_each_time() -> None:
    lines = report(rank_profile(TRACE)).splitlines()
    assert lines[0].startswith("rank 1 (2 steps), ms a step: wall 1.00, GPU busy ")
    assert "compute 0.30, NCCL [all_gather 0.15, reduce_scatter 0.05] exposed " in lines[0]
    assert lines[0].endswith("; 2 kernels") and "GPU idle " in lines[0]
    assert lines[1].startswith("  CPU self: aten::mm ")
    assert lines[2] == "  annotations: FSDP::pre_forward 0.30"
    assert lines[3].startswith("  GPU kernels: sm90_xmma_gemm_bf16 0.30, ncclDevKernel_AllGather")


def test_a_trace_without_a_recorded_step_is_refused() -> None:
    with pytest.raises(ValueError, match="no ProfilerStep# span"):
        rank_profile({"traceEvents": [event("cpu_op", "aten::mm", 0, 10)]})


def test_gzipped_and_plain_traces_load_alike(tmp_path) -> None:
    plain, zipped = tmp_path / "rank0_trace.json", tmp_path / "rank0_trace.json.gz"
    plain.write_text(json.dumps(TRACE))
    with gzip.open(zipped, "wt") as file:
        json.dump(TRACE, file)
    assert load_trace(plain) == load_trace(zipped) == TRACE


@pytest.mark.parametrize(
    ("spans", "length"),
    [([], 0.0), ([(0, 2), (1, 3)], 3.0), ([(5, 6), (0, 1)], 2.0), ([(0, 4), (1, 2)], 4.0)],
)
def test_union_length(spans, length) -> None:
    assert union_length(spans) == length


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        (ALL_GATHER, "all_gather"),
        (REDUCE_SCATTER, "reduce_scatter"),
        ("ncclKernel_AllReduce_RING_LL_Sum_float", "all_reduce"),
        ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "other"),
        ("triton_poi_fused_add_0", None),
    ],
)
def test_nccl_kernels_by_collective(name, kind) -> None:
    assert collective(name) == kind


@pytest.mark.parametrize(
    ("name", "short"),
    [
        ("FSDP::post_backward_reduce (norm, lm_head)", "FSDP::post_backward_reduce"),
        ("FSDP::backward_prefetch for layers.1", "FSDP::backward_prefetch"),
        ("## Call CompiledFxGraph fo67ia53fmujgylsrc ##", "## Call CompiledFxGraph ##"),
        ("Optimizer.step#AdamW.step", "Optimizer.step#AdamW.step"),
    ],
)
def test_annotation_names_lose_their_module(name, short) -> None:
    assert short_name(name) == short


def test_self_times_nest_by_thread() -> None:
    events = [
        event("cpu_op", "outer", 0, 10),
        event("cpu_op", "inner", 2, 3),
        event("cpu_op", "elsewhere", 2, 3, tid=2),
    ]
    assert self_times(events) == {"outer": 7, "inner": 3, "elsewhere": 3}
