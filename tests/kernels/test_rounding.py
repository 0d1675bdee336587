"""The Triton kernels against the PyTorch path, bit for bit.

Without a GPU the kernels run in Triton's interpreter (conftest sets TRITON_INTERPRET=1);
on the GPU machine the same tests run compiled on CUDA tensors, plus the GPU-only tests
at the end (torch.compile, CUDA graphs, CPU == CUDA).
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Callable

import numpy as np
import pytest
import torch
from helpers import TEST_FORMATS, all_bit_patterns

import stochround as sr
from stochround import reference
from stochround.kernels.grid import cdiv
from stochround.kernels.rounding import (
    CODES_LAYOUT,
    LIST_START,
    KernelPlan,
    codes_supported,
    kernel_plan,
    kernel_supports,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KERNEL_FORMATS = [name for name in TEST_FORMATS if kernel_supports(sr.format(name))]
ON_GPU = DEVICE == "cuda"


def _on_gpu_only(everything: list, representative: list) -> list:
    """Compiling a kernel per (format, mode, sat, ...) takes a second on a GPU, where the
    interpreter takes none: there the tests sweep a representative subset."""
    return representative if ON_GPU else everything


SWEEP_FORMATS = _on_gpu_only(KERNEL_FORMATS, ["bfloat16", "e4m3fn", "e2m1", "p3109_k8p1se"])
SWEEP_SATURATIONS = _on_gpu_only(list(reference.SATURATIONS), ["none", "finite"])


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit patterns (NaN payloads included)."""
    assert a.dtype == b.dtype and a.shape == b.shape
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(width), b.contiguous().view(width))


def _both(x: torch.Tensor, fmt: str, mode: str, **options) -> tuple[torch.Tensor, torch.Tensor]:
    kernel = sr.round(x, fmt, mode, backend="triton", **options)
    torch_path = sr.round(x, fmt, mode, backend="torch", **options)
    return kernel, torch_path


def test_the_formats_the_kernels_cover() -> None:
    """Every registered format but the float64-wide ones and e8m0 (emin below fp32's)."""
    assert set(sr.FORMATS) - set(KERNEL_FORMATS) == {"binary64", "e8m0"}


@pytest.mark.parametrize("fmt_name", SWEEP_FORMATS)
def test_every_bf16_pattern_every_mode_and_sat(fmt_name: str) -> None:
    x = all_bit_patterns(torch.bfloat16).to(DEVICE)
    for mode in reference.MODES:
        for sat in SWEEP_SATURATIONS:
            options = {"seed": 17} if mode == "sr" else {}
            kernel, torch_path = _both(x, fmt_name, mode, sat=sat, **options)
            assert _same_bits(kernel, torch_path), (fmt_name, mode, sat)


def _wide_fp32(count: int, seed: int) -> torch.Tensor:
    """fp32 values over the whole exponent range, subnormals, zeros, infinities, NaN."""
    generator = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(2**31), 2**31, (count,), generator=generator, dtype=torch.int64)
    x = bits.to(torch.int32).view(torch.float32)
    special = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, 1e-45, -3e-39, 448.0])
    return torch.cat([x, special, torch.randn(count, generator=generator) * 100]).to(DEVICE)


@pytest.mark.parametrize("fmt_name", SWEEP_FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fp32_and_fp16_inputs(fmt_name: str, dtype: torch.dtype) -> None:
    x = _wide_fp32(8192, 1).to(dtype)
    for mode in ("rne", "rz", "ro", "sr"):
        options = {"seed": 2**40 + 3, "offset": 5} if mode == "sr" else {}
        kernel, torch_path = _both(x, fmt_name, mode, sat="none", **options)
        assert _same_bits(kernel, torch_path), (fmt_name, mode, dtype)


@pytest.mark.parametrize(
    "fmt_name", _on_gpu_only(["bfloat16", "e4m3fn", "e2m1", "p3109_k8p1se", "int8"], ["e4m3fn"])
)
def test_limited_bit_variants_from_the_stream_from_rand_and_from_data(fmt_name: str) -> None:
    x = _wide_fp32(2048, 3)
    generator = torch.Generator().manual_seed(4)
    for rbits in _on_gpu_only([1, 5, 16, 32], [1, 16, 32]):
        rand = torch.randint(0, 2**rbits, x.shape, generator=generator).to(DEVICE)
        for variant in reference.VARIANTS:
            for source in ({"seed": 9}, {"rand": rand}, {"rand": "data"}):
                kernel, torch_path = _both(
                    x, fmt_name, "sr", rbits=rbits, variant=variant, **source
                )
                assert _same_bits(kernel, torch_path), (rbits, variant, list(source))


@pytest.mark.parametrize(
    ("fmt_name", "output", "out_dtype", "choices", "path"),
    [
        ("bf16", "value", torch.bfloat16, ("sr", 32, "c", "stream"), "bf16"),
        ("bf16", "value", torch.bfloat16, ("sr", 16, "b", "stream"), "bf16"),
        ("bf16", "value", torch.bfloat16, ("sr", 8, "a", "stream"), "bf16"),
        ("bf16", "value", torch.bfloat16, ("sr", 8, "c", "stream"), "round"),
        ("bf16", "value", torch.bfloat16, ("sr", 32, "c", "data"), "round"),
        ("bf16", "value", torch.float32, ("sr", 32, "c", "stream"), "round"),
        ("e4m3fn", "codes", torch.float8_e4m3fn, ("sr", 32, "c", "stream"), "codes"),
        ("e4m3fn", "codes", torch.float8_e4m3fn, ("sr", 5, "a", "stream"), "codes"),
        ("e4m3fn", "codes", torch.float8_e4m3fn, ("sr", 8, "c", "stream"), "round"),
        ("e4m3fn", "codes", torch.float8_e4m3fn, ("sr", 32, "b", "stream"), "round"),
        ("e4m3fn", "codes", torch.float8_e4m3fn, ("rne", 32, "c", "stream"), "round"),
        ("e4m3fn", "codes", torch.float8_e4m3fn, ("sr", 32, "c", "rand"), "round"),
        ("e2m1", "fp4x2", torch.float4_e2m1fn_x2, ("sr", 32, "c", "stream"), "codes"),
        ("binary16", "value", torch.float16, ("sr", 32, "c", "stream"), "codes"),
        ("binary16", "value", torch.float32, ("sr", 32, "c", "stream"), "round"),
        ("p3109_k8p4sf", "codes", torch.uint8, ("sr", 32, "c", "stream"), "codes"),
        ("e5m2", "value", torch.float32, ("sr", 32, "c", "stream"), "round"),
    ],
)
def test_kernel_plans_choose_the_fast_paths_only_where_they_are_exact(
    fmt_name: str, output: str, out_dtype: torch.dtype, choices: tuple, path: str
) -> None:
    mode, n, variant, source = choices
    fmt = sr.format(fmt_name)
    plan = kernel_plan(output, out_dtype, "raise", fmt, mode, "none", n, variant, source)
    assert plan.path == path
    assert plan.check_nan == (output != "value" and not fmt.has_nan)
    assert plan is kernel_plan(output, out_dtype, "raise", fmt, mode, "none", n, variant, source)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_bf16_fast_path_equals_the_generic_path(dtype: torch.dtype) -> None:
    x = _wide_fp32(20000, 5).to(dtype)
    for rbits, variant in ((None, "c"), (16, "b"), (20, "odd"), (8, "a"), (1, "a")):
        for sat in ("none", "finite", "propagate"):
            options = {"rbits": rbits, "variant": variant, "sat": sat, "seed": 12}
            fast = sr.cast(x, torch.bfloat16, "sr", backend="triton", **options)
            reference_path = sr.cast(x, torch.bfloat16, "sr", backend="torch", **options)
            assert _same_bits(fast, reference_path), (rbits, variant, sat)


@pytest.mark.parametrize(
    "fmt_name",
    _on_gpu_only(
        [n for n in KERNEL_FORMATS if codes_supported(sr.format(n))],
        ["e4m3fn", "e5m2", "e2m1", "int8"],
    ),
)
def test_codes_written_by_the_kernel(fmt_name: str) -> None:
    x = _wide_fp32(4096, 6) / 1000
    if not sr.format(fmt_name).has_nan:  # NaN has no code there (encode raises; tested)
        x = x[~torch.isnan(x)]
    for mode, options in (("rne", {}), ("sr", {"seed": 3}), ("rd", {})):
        kernel = sr.encode(x, fmt_name, mode, sat="finite", backend="triton", **options)
        torch_path = sr.encode(x, fmt_name, mode, sat="finite", backend="torch", **options)
        assert torch.equal(kernel, torch_path), (fmt_name, mode)


@pytest.mark.parametrize(
    ("dtype", "sat"),
    [
        (torch.float8_e4m3fn, "none"),
        (torch.float8_e5m2, "none"),
        (torch.float8_e4m3fnuz, "none"),
        (torch.float8_e5m2fnuz, "finite"),
        (torch.float4_e2m1fn_x2, "finite"),
        (torch.float16, "none"),
        (torch.bfloat16, "propagate"),
    ],
)
def test_cast_to_torch_dtypes(dtype: torch.dtype, sat: str) -> None:
    x = _wide_fp32(4096, 7)[:8192] / 100
    x = torch.where(torch.isnan(x), 1.0, x).reshape(64, -1)  # e2m1 has no NaN code
    for options in ({"seed": 1}, {"seed": 2, "rbits": 5, "variant": "a"}):
        kernel = sr.cast(x, dtype, "sr", sat=sat, backend="triton", **options)
        torch_path = sr.cast(x, dtype, "sr", sat=sat, backend="torch", **options)
        assert kernel.dtype == dtype and _same_bits(kernel, torch_path)


@pytest.mark.parametrize("fmt_name", ["e2m1", "int4", "uint4", "e2m3", "e3m2", "p3109_k6p3se"])
def test_packed_codes_by_the_kernel(fmt_name: str) -> None:
    """encode(packed=True): the kernel writes the packed bytes the PyTorch path packs."""
    x = (torch.randn(32, 40, generator=torch.Generator().manual_seed(8)) * 4).to(DEVICE)
    for mode, options in (("sr", {"rbits": 6, "seed": 3}), ("sr", {"seed": 4}), ("rne", {})):
        kernel, torch_path = (
            sr.encode(x, fmt_name, mode, sat="finite", packed=True, backend=backend, **options)
            for backend in ("triton", "torch")
        )
        bits = sr.format(fmt_name).bits
        assert kernel.dtype == torch.uint8 and kernel.shape == (32, 40 * bits // 8)
        assert torch.equal(kernel, torch_path)
        codes = sr.encode(x, fmt_name, mode, sat="finite", backend="triton", **options)
        assert torch.equal(sr.unpack(kernel, bits), codes)


def test_shards_draw_the_words_of_their_global_indices() -> None:
    x = _wide_fp32(3001, 9)
    whole = sr.round(x, "e4m3fn", "sr", seed=21, backend="triton")
    bounds = [0, 1001, 1002, x.numel()]  # uneven, and not multiples of four
    pieces = [
        sr.round(x[a:b], "e4m3fn", "sr", seed=21, index_offset=a, backend="triton")
        for a, b in itertools.pairwise(bounds)
    ]
    assert _same_bits(whole, torch.cat(pieces))
    torch_pieces = [
        sr.round(x[a:b], "e4m3fn", "sr", seed=21, index_offset=a, backend="torch")
        for a, b in itertools.pairwise(bounds)
    ]
    assert _same_bits(whole, torch.cat(torch_pieces))


# (dtype or format, options): one call per kernel path — bf16 SR, the SR-to-codes kernels
# (fp16 value, fp8 codes, packed fp4), the generic kernel (limited bits, RNE codes)
KERNEL_PATHS = [
    (torch.bfloat16, {"rbits": 16}),
    (torch.float16, {}),
    (torch.float8_e4m3fn, {}),
    (torch.float4_e2m1fn_x2, {"sat": "finite"}),
    ("e5m2", {"rbits": 8, "variant": "b"}),
]


@pytest.mark.parametrize("index_offset", [2**31 - 3000, 2**32 + 12345])
@pytest.mark.parametrize(("target", "options"), KERNEL_PATHS)
def test_positions_beyond_int32(target: object, options: dict, index_offset: int) -> None:
    """A shard far into a tensor (global positions straddling 2**31, or past 2**32) draws
    the words of its global indices in every kernel path."""
    x = _wide_fp32(5000, 12)
    x = torch.where(torch.isnan(x), 1.0, x)  # e2m1 has no NaN code
    call = sr.round if isinstance(target, str) else sr.cast
    kernel, torch_path = (
        call(x, target, "sr", seed=5, index_offset=index_offset, backend=backend, **options)
        for backend in ("triton", "torch")
    )
    assert _same_bits(kernel, torch_path)


def test_seeds_and_offsets_as_device_tensors() -> None:
    x = _wide_fp32(1000, 10)
    seed = torch.tensor(2**63 + 5, dtype=torch.uint64).to(torch.int64).to(DEVICE)
    as_tensor = sr.round(
        x, "bf16", "sr", seed=seed, offset=torch.tensor(7, device=DEVICE), backend="triton"
    )
    as_int = sr.round(x, "bf16", "sr", seed=2**63 + 5, offset=7, backend="torch")
    assert _same_bits(as_tensor, as_int)
    assert not _same_bits(as_tensor, sr.round(x, "bf16", "sr", seed=2**63 + 5, offset=8))


def test_backend_triton_refuses_what_it_cannot_do() -> None:
    with pytest.raises(ValueError, match=r"backend='triton' cannot serve this call: .*float64"):
        sr.round(torch.ones(4, dtype=torch.float64, device=DEVICE), "bf16", backend="triton")
    with pytest.raises(ValueError, match="wider than the kernels"):
        sr.round(torch.ones(4, device=DEVICE), "e8m0", backend="triton")


def test_a_route_is_decided_once_per_set_of_choices_and_a_refusal_every_time() -> None:
    from stochround.rounding.route import Route, _call_route

    x = torch.randn(64, device=DEVICE)
    fmt = sr.format("e2m1")
    fp4 = torch.float4_e2m1fn_x2
    choices = (fmt, "sr", None, "c", "none", "raise", "stream")
    args = (*choices, "triton", "fp4x2", fp4, x.dtype, x.is_cuda, False)
    route = _call_route(*args)
    plan = kernel_plan("fp4x2", fp4, "raise", fmt, "sr", "none", 32, "c", "stream")
    assert route == Route(fmt, 32, "fp4x2", fp4, plan, True)
    hits = _call_route.cache_info().hits
    first = sr.cast(x, fp4, "sr", seed=3, backend="triton")
    second = sr.cast(x, fp4, "sr", seed=3, backend="triton")
    assert _call_route.cache_info().hits == hits + 2
    assert _same_bits(first, second)
    # the PyTorch path where asked for, or for "auto" off CUDA; a refusal is not remembered
    assert _call_route(*args[:7], "torch", *args[8:]).plan is None
    assert _call_route(*args[:7], "auto", *args[8:11], False, False).plan is None
    # a call through the custom op is routed again by the op's body: no plan, no refusal
    assert _call_route(*args[:12], True) == route._replace(plan=None)
    wide = (*args[:10], torch.float64, x.is_cuda, False)
    for _ in range(2):
        with pytest.raises(ValueError, match="cannot serve this call"):
            _call_route(*wide)


def test_a_route_resolves_what_the_entry_point_leaves_open() -> None:
    """round's values take x's dtype, encode's codes the integer dtype of the format's
    width, packed=True the packing of that width (a ValueError naming the widths if none)."""
    from stochround.rounding.route import _call_route

    def route(fmt: str, output: str, x_dtype: torch.dtype = torch.bfloat16):
        choices = (fmt, "rne", None, "c", "none", "raise", "stream", "torch")
        return _call_route(*choices, output, None, x_dtype, False, False)

    assert route("e4m3fn", "value")[2:4] == ("value", torch.bfloat16)
    assert route("e4m3fn", "codes")[2:4] == ("codes", torch.uint8)
    assert route("bf16", "codes")[2:4] == ("codes", torch.int16)
    assert route("e2m1", "packed")[2:4] == ("fp4x2", torch.uint8)
    assert route("e3m2", "packed")[2:4] == ("fp6x4", torch.uint8)
    with pytest.raises(ValueError, match="packed=True packs formats of 4 or 6 bits; e4m3fn"):
        route("e4m3fn", "packed")


def test_kernel_calls_trace_under_torch_compile() -> None:
    """fullgraph=True traces calls the kernels round (the interpreter's on the CPU): the
    trace checks the choices but builds no kernel plan, which the op's body finds."""
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(8)).to(DEVICE)
    calls = {
        "bf16": lambda x: sr.cast(x, torch.bfloat16, "sr", seed=2, backend="triton"),
        "fp4 checked": lambda x: sr.cast(x, torch.float4_e2m1fn_x2, "sr", seed=2, backend="triton"),
    }
    for name, call in calls.items():
        compiled = torch.compile(call, fullgraph=True, backend="aot_eager")(x)
        assert compiled.dtype == call(x).dtype and _same_bits(compiled, call(x)), name


def test_straight_through_gradient() -> None:
    x = torch.randn(16, device=DEVICE, requires_grad=True)
    sr.round(x, "e2m1", "sr", seed=1, sat="finite").mul(3).sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 3.0))


# --- GPU only ----------------------------------------------------------------------------


@pytest.mark.gpu
def test_cpu_and_cuda_give_the_same_bits() -> None:
    x = _wide_fp32(100000, 11).cpu()
    for fmt_name, mode, options in (
        ("bf16", "sr", {"seed": 3}),
        ("e4m3fn", "sr", {"rbits": 7}),
        ("e2m1", "rne", {}),
        ("p3109_k8p4se", "ro", {}),
    ):
        if mode == "sr":
            options = {"seed": 3, **options}
        on_cpu = sr.round(x, fmt_name, mode, **options)
        on_cuda = sr.round(x.cuda(), fmt_name, mode, **options)
        cuda_torch = sr.round(x.cuda(), fmt_name, mode, backend="torch", **options)
        assert _same_bits(on_cpu, on_cuda.cpu()) and _same_bits(on_cpu, cuda_torch.cpu())


@pytest.mark.gpu
def test_torch_compile_fullgraph_traces_and_still_rounds_stochastically() -> None:
    x = torch.randn(4096, device="cuda") * 3

    def step(x: torch.Tensor, seed: torch.Tensor) -> torch.Tensor:
        return sr.cast(x * 2, torch.bfloat16, "sr", seed=seed) + 1

    compiled = torch.compile(step, fullgraph=True)
    seed = torch.tensor(5, device="cuda")
    assert _same_bits(compiled(x, seed), step(x, seed))
    other = compiled(x, torch.tensor(6, device="cuda"))
    assert not _same_bits(other, step(x, seed))
    # not fused into a plain cast: the results are bf16 values that differ from rne
    assert not _same_bits(other, (x * 2).to(torch.bfloat16) + 1)


def _graph_replays(step: Callable[[], None], offset: torch.Tensor, out: torch.Tensor) -> list:
    """``out`` after each of three replays of a CUDA graph of ``step`` and ``offset += 1``
    (two warm-up calls on a side stream first compile the kernels outside the capture)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
        offset.add_(1)
    results = []
    for _ in range(3):
        graph.replay()
        results.append(out.clone())
    torch.cuda.synchronize()
    return results


@pytest.mark.gpu
def test_cuda_graph_replay_advances_the_offset() -> None:
    x = torch.randn(8192, device="cuda")
    offset = torch.zeros((), dtype=torch.int64, device="cuda")
    out = torch.empty(8192, dtype=torch.bfloat16, device="cuda")

    def cast() -> None:
        out.copy_(sr.cast(x, torch.bfloat16, "sr", seed=3, offset=offset))

    for step, result in enumerate(_graph_replays(cast, offset, out)):
        expected = sr.cast(x, torch.bfloat16, "sr", seed=3, offset=step, backend="torch")
        assert _same_bits(result, expected), step


@pytest.mark.gpu
def test_cuda_graph_captures_fp4_casts_with_nan_zero_and_refuses_the_nan_check() -> None:
    """e2m1 has no NaN code: nan="zero" launches without reading anything back, so a graph
    captures it (the offset advancing); nan="raise" cannot be captured and says so."""
    x = torch.randn(64, 256, device="cuda") * 4
    x[3, 5] = math.nan
    offset = torch.zeros((), dtype=torch.int64, device="cuda")
    out = torch.empty(64, 128, dtype=torch.float4_e2m1fn_x2, device="cuda")

    def cast() -> None:
        out.copy_(sr.cast(x, torch.float4_e2m1fn_x2, "sr", seed=3, offset=offset, nan="zero"))

    for step, result in enumerate(_graph_replays(cast, offset, out)):
        expected = sr.cast(
            x, torch.float4_e2m1fn_x2, "sr", seed=3, offset=step, nan="zero", backend="torch"
        )
        assert _same_bits(result, expected), step
    for backend in ("triton", "torch"):  # refused on either path, before any work
        graph = torch.cuda.graph(torch.cuda.CUDAGraph())
        with pytest.raises(ValueError, match="nan='zero'"), graph:
            sr.cast(x, torch.float4_e2m1fn_x2, "sr", seed=3, backend=backend)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_formats_without_nan_refuse_nan_on_both_backends(backend: str) -> None:
    x = torch.tensor([1.0, math.nan, 2.0, 3.0], device=DEVICE)
    for mode, options in (("sr", {"seed": 1}), ("rne", {})):
        with pytest.raises(ValueError, match="no NaN code"):
            sr.encode(x, "e2m1", mode, sat="finite", backend=backend, **options)
    with pytest.raises(ValueError, match="no NaN code"):
        sr.cast(x * 100, torch.float4_e2m1fn_x2, "sr", seed=1, backend=backend)


def _scratch_clean(flags: torch.Tensor, note: torch.Tensor, note_view: np.ndarray) -> bool:
    """Whether kept scratch is ready for a call: the NaN flag, the list's length and the
    arrival count zero (the list below the length is all a kernel reads), the note clear
    and read through a view of its own memory."""
    from stochround.kernels.rounding import LIST_START

    aliased = note_view.ctypes.data == note.data_ptr() and note_view.shape == (1,)
    return not flags[: LIST_START.value].any() and not note.any() and aliased


def test_checked_calls_reuse_only_clean_flag_buffers() -> None:
    """The NaN check keeps its clean flag buffer per thread between calls: after a call
    that listed tiles (overflows) or found NaN, the next calls neither raise nor differ from
    the PyTorch path, any buffer kept is clean, one is kept through calls that list tiles,
    and another thread keeps its own."""
    from stochround.kernels.runtime import SCRATCH

    SCRATCH.by_stream.clear()
    fp4 = torch.float4_e2m1fn_x2
    clean = torch.randn(4, 6000, device=DEVICE)
    overflowing = clean * 4  # beyond e2m1's 6: tiles listed for the exact kernel, no NaN
    with_nan = clean.clone()
    with_nan[2, 7] = math.nan

    def check(x: torch.Tensor, seed: int) -> None:
        kernel = sr.cast(x, fp4, "sr", seed=seed, sat="finite", backend="triton")
        expected = sr.cast(x, fp4, "sr", seed=seed, sat="finite", backend="torch")
        assert _same_bits(kernel, expected)
        kept = SCRATCH.by_stream.values()
        assert all(_scratch_clean(*scratch) for scratch in kept)

    for step, x in enumerate([clean, overflowing, clean[:1], overflowing, clean]):
        check(x, seed=step)
        with pytest.raises(ValueError, match="no NaN code"):
            sr.cast(with_nan, fp4, "sr", seed=step, sat="finite", backend="triton")
    check(clean, seed=9)
    first = next(iter(SCRATCH.by_stream.values()))[0]
    check(overflowing, seed=11)  # the exact kernel runs; the call clears the note it set
    kept = dict(SCRATCH.by_stream)
    assert len(kept) == 1, "a checked call without NaN keeps its buffer"
    assert next(iter(kept.values()))[0] is first
    in_thread: dict = {}

    def work() -> None:
        in_thread["before"] = dict(SCRATCH.by_stream)
        check(clean, seed=10)
        in_thread["after"] = dict(SCRATCH.by_stream)

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    assert in_thread["before"] == {} and len(in_thread["after"]) == 1
    (theirs, *_), (ours, *_) = in_thread["after"].popitem()[1], kept.popitem()[1]
    assert theirs.data_ptr() != ours.data_ptr()
    assert next(iter(SCRATCH.by_stream.values()))[0] is ours


@pytest.mark.parametrize(
    ("dtype", "nan"), [(torch.float8_e4m3fn, "raise"), (torch.float4_e2m1fn_x2, "zero")]
)
def test_unchecked_codes_calls_leave_their_scratch_clean(dtype: torch.dtype, nan: str) -> None:
    """Unchecked SR-to-codes calls keep one zeroed scratch buffer per stream: the exact
    kernel clears the list's length and its own arrival count once all its programs have
    read the length, so after calls that list many tiles (a persistent grid of several
    programs walking the list) the same buffer is all zero again and serves the next call,
    bit-identical to the PyTorch path."""
    from stochround.kernels.runtime import SCRATCH, persistent_programs

    tile = CODES_LAYOUT[0] * 4
    tiles = 2 * persistent_programs(torch.device(DEVICE)) + 1  # grid of cdiv(tiles, 4)
    clean = torch.randn(tiles, tile, device=DEVICE)
    mixed = clean.clone()
    mixed[1::2] *= 1000  # every other tile overflows: listed for the exact kernel
    SCRATCH.by_stream.clear()
    kept = None
    for seed, x in enumerate([mixed, clean, mixed, mixed[:3]]):
        result = sr.cast(x, dtype, "sr", seed=seed, sat="finite", nan=nan, backend="triton")
        expected = sr.cast(x, dtype, "sr", seed=seed, sat="finite", nan=nan, backend="torch")
        assert _same_bits(result, expected), seed
        if ON_GPU:
            torch.cuda.synchronize()
        scratch, *others = SCRATCH.by_stream.values()
        assert not others and _scratch_clean(*scratch), seed
        kept = scratch[0] if kept is None else kept
        assert scratch[0] is kept, "the buffer serves every call"


@pytest.mark.gpu
def test_codes_scratch_is_kept_per_stream_and_never_by_a_graph() -> None:
    """Each stream keeps its own scratch (another stream's may still be in use in its
    order); a CUDA-graph capture takes fresh scratch and keeps it to itself, the cache
    untouched, and its replays round right."""
    from stochround.kernels.runtime import SCRATCH

    fp4 = torch.float4_e2m1fn_x2
    x = torch.randn(64, 4096, device="cuda") * 4  # tiles listed

    def cast(seed: int) -> torch.Tensor:
        return sr.cast(x, fp4, "sr", seed=seed, nan="zero", backend="triton")

    SCRATCH.by_stream.clear()
    cast(1)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        cast(2)
    torch.cuda.synchronize()
    kept = {key: flags.data_ptr() for key, (flags, *_) in SCRATCH.by_stream.items()}
    assert len(kept) == 2 and len(set(kept.values())) == 2
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = cast(3)
    assert {key: flags.data_ptr() for key, (flags, *_) in SCRATCH.by_stream.items()} == kept
    for _ in range(2):
        graph.replay()
        assert _same_bits(captured, sr.cast(x, fp4, "sr", seed=3, nan="zero", backend="torch"))
        assert _same_bits(cast(3), captured)


@pytest.mark.gpu
def test_checked_calls_wait_for_the_current_stream() -> None:
    """A checked call reads its host note after its own stream's work: on a side stream
    busy with a long kernel queued first, a NaN is still found (reading the note before
    the stream's work is done would see it clear)."""
    x = torch.randn(4, 6000, device="cuda")
    x[1, 2] = math.nan
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # tens of milliseconds of device time before the cast
        with pytest.raises(ValueError, match="no NaN code"):
            sr.cast(x, torch.float4_e2m1fn_x2, "sr", seed=1, backend="triton")
    torch.cuda.synchronize()


@pytest.mark.parametrize("sat", ["none", "finite"])
@pytest.mark.parametrize("fmt_name", ["e2m1", "e2m3", "e3m2"])
def test_nan_zero_kernels_equal_the_pytorch_path(fmt_name: str, sat: str) -> None:
    """nan="zero": NaN results (NaN inputs, overflows with sat="none") are code 0 on both
    backends, in every kernel (the SR codes kernels, their exact tiles, round to nearest)."""
    x = _wide_fp32(2048, 11)[:4096]
    specials = torch.tensor([math.nan, -math.nan, math.inf, -math.inf, 1e30, -7.0, 0.0, -0.0])
    x = torch.cat([x, specials.to(x.device).repeat(8)]).reshape(32, -1)
    for mode, options in (("sr", {"seed": 4}), ("sr", {"seed": 5, "rbits": 3, "variant": "a"}),
                          ("rne", {})):  # fmt: skip
        kernel = sr.encode(x, fmt_name, mode, sat=sat, nan="zero", backend="triton", **options)
        torch_path = sr.encode(x, fmt_name, mode, sat=sat, nan="zero", backend="torch", **options)
        assert torch.equal(kernel, torch_path)
        assert (kernel[torch.isnan(x)] == 0).all()
    packed = sr.cast(x, torch.float4_e2m1fn_x2, "sr", seed=6, sat=sat, nan="zero", backend="triton")
    expected = sr.cast(
        x, torch.float4_e2m1fn_x2, "sr", seed=6, sat=sat, nan="zero", backend="torch"
    )
    assert _same_bits(packed, expected)


def _clean_block(fmt: sr.Format, count: int, seed: int) -> torch.Tensor:
    """Values the wide multiply-add path rounds by itself: finite, below the largest value,
    zero or at least 2**(emin - 9 - mbits) (at most 32 bits discarded), both signs, with
    the edge cases: exactly 32 and 31 discarded bits, subnormal and normal results, max."""
    generator = torch.Generator().manual_seed(seed)
    smallest = 2.0 ** (fmt.emin - 9 - fmt.mbits)
    magnitude = torch.exp2(
        torch.empty(count).uniform_(math.log2(smallest), math.log2(fmt.max), generator=generator)
    )
    sign = torch.randint(0, 2, (count,), generator=generator) * 2 - 1
    x = (magnitude.clamp(smallest, fmt.max) * sign).float()
    edges = [0.0, -0.0, smallest, -smallest, 3 * smallest, 2 * smallest, fmt.max, -fmt.max]
    edges += [fmt.min_subnormal * 0.75, fmt.min_normal * 1.0625, fmt.min_subnormal * 2.5]
    x[: len(edges)] = torch.tensor(edges)
    x[len(edges) :: 7] = 0.0
    return x


@pytest.mark.parametrize(
    "fmt_name",
    _on_gpu_only(
        [
            n
            for n in KERNEL_FORMATS
            if codes_supported(sr.format(n))
            and sr.format(n).signed
            and not sr.format(n).twos_complement
            and sr.format(n).has_zero
        ],
        ["e4m3fn", "e5m2", "e2m1"],
    ),
)
def test_codes_fast_path_blocks_without_special_values(fmt_name: str) -> None:
    """Blocks of values the fast kernel rounds by itself (`_clean_block`), then blocks each
    holding one value the fast kernel rounds by its second rule (more than 32 bits
    discarded, an fp32 subnormal) or leaves to the exact kernel (an overflow, an infinity).
    Last, 2**14 values with exactly 33 bits discarded (about 24 of them round up)."""
    fmt = sr.format(fmt_name)
    block = 4 * CODES_LAYOUT[0]  # values a kernel program rounds
    x = _clean_block(fmt, 6 * block, 11)
    specials = [2.0 ** (fmt.emin - 10 - fmt.mbits), fmt.max * 1.75, math.inf, 1e-40]
    for where, value in enumerate(specials, start=2):
        x[where * block + 5] = -value
    generator = torch.Generator().manual_seed(12)
    just_below = torch.empty(2**14).uniform_(1, 2, generator=generator)
    x = torch.cat([x, just_below * 2.0 ** (fmt.emin - 10 - fmt.mbits)]).to(DEVICE)
    for options in (
        {"seed": 5},
        {"seed": 6, "rbits": 1, "variant": "a"},
        {"seed": 7, "rbits": 8, "variant": "a"},
    ):
        for sat in ("finite", "none") if fmt.inf or fmt.has_nan else ("finite",):
            kernel = sr.encode(x, fmt_name, "sr", sat=sat, backend="triton", **options)
            torch_path = sr.encode(x, fmt_name, "sr", sat=sat, backend="torch", **options)
            assert torch.equal(kernel, torch_path), (options, sat)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp16_results_through_the_codes_kernels(dtype: torch.dtype) -> None:
    """fp32/bf16 -> fp16 SR stores binary16 codes: clean blocks, then blocks with one
    special each (more than 32 bits discarded, overflow, infinity, NaN)."""
    fmt = sr.format("binary16")
    block = 4 * CODES_LAYOUT[0]  # values a kernel program rounds
    x = _clean_block(fmt, 5 * block, 13)
    for where, value in enumerate([2.0**-40, 7e4, math.inf, math.nan], start=1):
        x[where * block + 3] = -value
    x = x.to(dtype).to(DEVICE)
    for options in ({"seed": 8}, {"seed": 9, "rbits": 3, "variant": "a"}):
        for sat in ("none", "finite"):
            kernel = sr.cast(x, torch.float16, "sr", sat=sat, backend="triton", **options)
            torch_path = sr.cast(x, torch.float16, "sr", sat=sat, backend="torch", **options)
            assert kernel.dtype == torch.float16 and _same_bits(kernel, torch_path)


@pytest.mark.parametrize("fmt_name", ["e4m3fn", "e2m1"])
def test_codes_fast_path_rounds_nu_half_to_even_beyond_32_bits(fmt_name: str) -> None:
    """Exact SR beyond 32 discarded bits rounds nu 2**32 half to even, variant a floors it:
    where the stream's word is 2**32 - k (k < 2**21), x = (k - 1/4 or k - 1/2) 2**-32 ulp
    rounds up under c exactly when k - 1/4 or k is even, and never under a."""
    fmt = sr.format(fmt_name)
    ulp = 2.0 ** (fmt.emin - fmt.mbits)  # the smallest subnormal
    index = torch.arange(2**16)
    words = sr.random.random_words(index, 21, 3)
    k = 2**32 - words
    lucky = (k < 2**21) & (k > 1)
    assert lucky.sum() >= 8  # 2**16 words, each lucky with probability 2**-11
    below = torch.where(index % 2 == 0, 0.25, 0.5)
    x = torch.where(lucky, (k - below) * ulp * 2.0**-32, 3 * ulp).float()
    c = sr.encode(x.to(DEVICE), fmt_name, "sr", seed=21, offset=3, sat="finite", backend="triton")
    a = sr.encode(
        x.to(DEVICE),
        fmt_name,
        "sr",
        rbits=32,
        variant="a",
        seed=21,
        offset=3,
        sat="finite",
        backend="triton",
    )
    up_c = (below == 0.25) | (k % 2 == 0)
    assert torch.equal(c.cpu()[lucky], up_c[lucky].to(torch.uint8))
    assert torch.equal(a.cpu()[lucky], torch.zeros_like(a.cpu()[lucky]))
    for kernel, options in ((c, {}), (a, {"rbits": 32, "variant": "a"})):
        torch_path = sr.encode(x, fmt_name, "sr", seed=21, offset=3, sat="finite", **options)
        assert torch.equal(kernel.cpu(), torch_path)


def test_codes_fast_path_far_below_the_smallest_subnormal() -> None:
    """Values whose discarded fraction spans more than 32 bits: exact SR rounds nu 2**32 to
    even before adding the word; variant a floors it."""
    tiny = torch.tensor([2.0**-40, 3 * 2.0**-45, 2.0**-60, 1e-44, -(2.0**-38)] * 800, device=DEVICE)
    for options in ({"seed": 4}, {"seed": 4, "rbits": 32, "variant": "a"}):
        kernel = sr.encode(tiny, "e4m3fn", "sr", backend="triton", **options)
        torch_path = sr.encode(tiny, "e4m3fn", "sr", backend="torch", **options)
        assert torch.equal(kernel, torch_path)


# formats whose ulp lies within 32 bits of fp32's subnormals (a large bias: mbits - emin >=
# 94), where fp32 subnormal inputs can round up; from mbits - emin = 96 on, the fast
# kernel's power-of-two scale also leaves fp32's range and is split
LARGE_BIAS_FORMATS = [
    sr.Format(ebits=3, mbits=3, bias=110),
    sr.Format(ebits=2, mbits=1, bias=120),
    sr.Format(ebits=3, mbits=0, bias=126),
]


@pytest.mark.parametrize("fmt", LARGE_BIAS_FORMATS, ids=lambda fmt: fmt.name)
def test_codes_kernels_of_formats_with_a_large_bias(fmt: sr.Format) -> None:
    """Both SR-to-codes kernels equal the PyTorch path where the format's smallest values
    lie near fp32's subnormals: a block the fast kernel rounds, then one that overflows
    (the exact kernel's), each with fp32 subnormal inputs among values from 40 bits below
    the smallest subnormal up to the largest value."""
    block = 4 * CODES_LAYOUT[0]
    generator = torch.Generator().manual_seed(14)
    low, high = fmt.emin - fmt.mbits - 40, math.log2(fmt.max)
    x = torch.exp2(torch.empty(2 * block).uniform_(low, high, generator=generator))
    x = x * (torch.randint(0, 2, (2 * block,), generator=generator) * 2 - 1)
    subnormals = torch.randint(1, 2**23, (2 * block,), generator=generator, dtype=torch.int32)
    x = torch.where(torch.arange(2 * block) % 5 == 0, subnormals.view(torch.float32), x)
    x[block + 7] = fmt.max * 1.5
    x = x.float().to(DEVICE)
    assert (
        kernel_plan("codes", torch.uint8, "raise", fmt, "sr", "none", 32, "c", "stream").path
        == "codes"
    )
    for options in ({"seed": 15}, {"seed": 16, "rbits": 4, "variant": "a"}):
        for sat in ("none", "finite"):
            kernel = sr.encode(x, fmt, "sr", sat=sat, backend="triton", **options)
            torch_path = sr.encode(x, fmt, "sr", sat=sat, backend="torch", **options)
            assert torch.equal(kernel, torch_path), (options, sat)


def test_launch_grid_arithmetic_equals_tritons() -> None:
    """The launchers' plain-int cdiv and next_power_of_2 give Triton's values."""
    import triton

    from stochround.kernels.grid import cdiv, next_power_of_2

    sizes = [*range(1, 70), 2**20 - 1, 2**20, 2**20 + 1, 2**28, 2**31 + 5, 2**40 + 3]
    for a, b in itertools.product([0, *sizes], [1, 2, 3, 4, 7, 1024, 4096]):
        assert cdiv(a, b) == triton.cdiv(a, b), (a, b)
    for n in sizes:
        assert next_power_of_2(n) == triton.next_power_of_2(n), n


def _listed_tiles(x: torch.Tensor, plan: KernelPlan, seed: int) -> list[int]:
    """The tiles of x that the SR-to-codes fast kernel leaves to the exact kernel: the fast
    kernel launched alone with fresh scratch, the programs it listed (the list's length at
    word 1, the list from LIST_START)."""
    assert plan.path == "codes" and x.is_contiguous()
    count = x.numel()
    programs = cdiv(count, plan.rows * 4)
    flags = torch.zeros(LIST_START.value + programs, dtype=torch.int32, device=x.device)
    # whole rows of four codes, as `KernelPlan.round` allocates them: 16 bits or less a code
    out = torch.empty(cdiv(count, 4) * 8, dtype=torch.uint8, device=x.device)
    common = (False, True, False)  # seed as an int, aligned, positions within int32
    stream = (None, None, seed, 0, count, 0)
    plan.launch(common)(x.get_device(), programs, x, out, flags, None, *stream)
    length = int(flags[1])
    return sorted(flags[LIST_START.value : LIST_START.value + length].tolist())


# (format, how the codes path writes it): encode's uint8 codes, or cast's float16 values
SATURATING_FORMATS = [
    ("e2m1", "codes", torch.uint8),
    ("e2m3", "codes", torch.uint8),
    ("e3m2", "codes", torch.uint8),
    ("e4m3fn", "codes", torch.uint8),
    ("binary16", "value", torch.float16),
]


def _kernel_and_torch(x: torch.Tensor, fmt_name: str, out_dtype: torch.dtype, **options) -> tuple:
    """The same SR call on both backends: `encode` (codes), or `cast` to fp16."""
    results = []
    for backend in ("triton", "torch"):
        if out_dtype == torch.float16:
            results.append(sr.cast(x, torch.float16, "sr", backend=backend, **options))
        else:
            results.append(sr.encode(x, fmt_name, "sr", backend=backend, **options))
    return tuple(results)


@pytest.mark.parametrize("sat", ["finite", "propagate", "none"])
@pytest.mark.parametrize(("fmt_name", "output", "out_dtype"), SATURATING_FORMATS)
def test_saturating_values_stay_on_the_codes_fast_path(
    fmt_name: str, output: str, out_dtype: torch.dtype, sat: str
) -> None:
    """Finite values beyond the format's max (just above it, between max and the next grid
    value, far beyond, fp32's largest) saturate to max in the fast kernel under "finite"
    and "propagate": their tile is not listed for the exact kernel.  An infinity is listed
    under "propagate" only (it stays infinite, or NaN), NaN always, every value beyond max
    under "none".  Every result equals the PyTorch path bit for bit, with 32 random bits
    and with 3 (variant a)."""
    fmt = sr.format(fmt_name)
    block = 4 * CODES_LAYOUT[0]  # values a kernel program rounds
    generator = torch.Generator().manual_seed(31)
    x = torch.randn(5 * block, generator=generator) * (fmt.max / 2)  # ~4.6% beyond max
    x[:block] = x[:block].clamp(fmt.lowest, fmt.max)  # tile 0: within range
    ulp_at_max = 2.0 ** (math.floor(math.log2(fmt.max)) - fmt.mbits)
    above = [
        fmt.max * (1 + 2.0**-23),  # the next fp32 value
        fmt.max + ulp_at_max / 2,  # between max and the next grid value (beyond max)
        fmt.max + ulp_at_max * 0.999,
        fmt.max * 1.75,
        1e30,
        3.4028234663852886e38,  # fp32's largest
    ]
    for where, value in enumerate(above):  # tile 1: finite overflow
        x[block + 3 * where] = value
        x[block + 3 * where + 1] = -value
    x[2 * block + 5] = math.inf  # tile 2: an infinity
    x[3 * block + 6] = -math.inf
    x[4 * block + 7] = math.nan  # tile 4: NaN
    x = x.to(DEVICE)
    plan = kernel_plan(output, out_dtype, "zero", fmt, "sr", sat, 32, "c", "stream")
    listed = {"finite": [4], "propagate": [2, 3, 4], "none": [1, 2, 3, 4]}[sat]
    assert _listed_tiles(x, plan, seed=3) == listed
    for options in ({"seed": 3}, {"seed": 4, "rbits": 3, "variant": "a"}):
        kernel, torch_path = _kernel_and_torch(
            x, fmt_name, out_dtype, sat=sat, nan="zero", **options
        )
        assert _same_bits(kernel, torch_path), options
    if sat != "none":  # whichever way SR rounds them, the values above max give +-max
        beyond = (x.abs() > fmt.max) & torch.isfinite(x)
        codes = kernel.view(torch.int16) if out_dtype == torch.float16 else kernel
        magnitude = codes.to(torch.int32) & ((1 << (fmt.ebits + fmt.mbits)) - 1)
        assert (magnitude[beyond] == fmt.max_magnitude_code).all()


@pytest.mark.parametrize("fmt_name", ["e2m1", "e2m3", "e3m2"])
def test_the_nan_check_sees_saturation_and_infinities_as_before(fmt_name: str) -> None:
    """nan="raise" (formats without a NaN code): finite values beyond max give +-max under
    "finite" and "propagate", in tiles the fast kernel keeps, and the call neither raises
    nor differs from the PyTorch path; an infinity is NaN under "propagate" (raises) and
    max under "finite"; a NaN input raises under both."""
    fmt = sr.format(fmt_name)
    generator = torch.Generator().manual_seed(32)
    x = (torch.randn(4, 4 * CODES_LAYOUT[0], generator=generator) * fmt.max).to(DEVICE)
    for sat in ("finite", "propagate"):
        kernel = sr.encode(x, fmt_name, "sr", seed=5, sat=sat, backend="triton")
        assert torch.equal(kernel, sr.encode(x, fmt_name, "sr", seed=5, sat=sat, backend="torch"))
    with_infinity = x.clone()
    with_infinity[1, 9] = -math.inf
    for backend in ("triton", "torch"):
        with pytest.raises(ValueError, match="no NaN code"):
            sr.encode(with_infinity, fmt_name, "sr", seed=5, sat="propagate", backend=backend)
    kernel = sr.encode(with_infinity, fmt_name, "sr", seed=5, sat="finite", backend="triton")
    assert int(kernel[1, 9]) == fmt.max_magnitude_code | (1 << (fmt.ebits + fmt.mbits))
    with_nan = x.clone()
    with_nan[2, 1] = math.nan
    for sat in ("finite", "propagate"):
        with pytest.raises(ValueError, match="no NaN code"):
            sr.encode(with_nan, fmt_name, "sr", seed=5, sat=sat, backend="triton")
