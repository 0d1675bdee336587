"""`stochround.kernels.runtime`: a bound launch picks the kernel Triton's JIT would pick.

On the GPU: the key of every runtime argument equals the specialization Triton's own binder
computes (pointers aligned or not, counts divisible by 16 or not, integers of every width
the kernels take, seeds in device tensors); a launch after the first reuses the JIT's
compiled kernel and gives the JIT's result, a partial launch (some arguments fixed) too;
registered launch hooks route launches through the JIT, which calls them.  On the CPU: the
launch's checks and hook detection, and a partial launch's key, template and fixed
arguments against a stand-in JIT.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch
import triton
from triton import knobs

import stochround as sr
from stochround.kernels import rounding as kernels
from stochround.kernels import runtime, stream_sr
from stochround.kernels.runtime import Launch, PartialLaunch, Varying, _hooks_registered

E2M1 = sr.format("e2m1")
COMMON = (False, True, False)  # FROM_TENSORS, ALIGNED, WIDE
DEVICE = 0  # the GPU tests' device, current


def _fp4_plan() -> kernels.KernelPlan:
    """The plan of `sr.cast(x, torch.float4_e2m1fn_x2, "sr")`."""
    return kernels.kernel_plan(
        "fp4x2", torch.float4_e2m1fn_x2, "raise", E2M1, "sr", "none", 32, "c", "stream"
    )


def _codes_arguments(
    x: torch.Tensor,
    seed: int,
    offset: int,
    index_offset: int,
    seed_tensors: bool = False,
    note: bool = False,
) -> tuple:
    """Runtime arguments of `_sr_codes_kernel` for fp4 codes of x (seed and offset as
    values, with device tensors beside them or none; a page-locked host note or none, as
    `KernelPlan.round` passes them)."""
    buffer = torch.empty((x.numel() + 3) // 4 * 2, dtype=torch.uint8, device=x.device)
    flag = torch.zeros(2 + x.numel(), dtype=torch.int32, device=x.device)
    host_word = torch.zeros(1, dtype=torch.int32, pin_memory=True) if note else None
    seed_tensor = torch.zeros((), dtype=torch.int64, device=x.device) if seed_tensors else None
    pointers = (seed_tensor, seed_tensor)
    return (x, buffer, flag, host_word, *pointers, seed, offset, x.numel(), index_offset)


def _binder_specialization(launch: Launch, args: tuple) -> tuple:
    """The specialization of the runtime arguments by the JIT's binder itself."""
    binder = launch.kernel.device_caches[DEVICE][4]
    _, specialization, _ = binder(*args, **launch.constants)
    return tuple(specialization[: len(args)])


@pytest.mark.gpu
@pytest.mark.parametrize("start", [0, 1, 4])  # x's pointer 16-byte aligned or not
@pytest.mark.parametrize("count", [4096, 4099])  # divisible by 16 or not
@pytest.mark.parametrize("seed", [7, 2**31 + 5, 2**40, -(2**62)])  # i32, u32, i64 widths
def test_keys_are_the_binder_specialization(start: int, count: int, seed: int) -> None:
    x = torch.randn(count + start, device="cuda")[start:]
    launch = _fp4_plan().launch(COMMON)
    for index_offset in (0, 16, 2**31 - 2**20):
        for seed_tensors, note in itertools.product((False, True), repeat=2):
            args = _codes_arguments(x, seed, seed // 3, index_offset, seed_tensors, note)
            key = launch.key(DEVICE, args)
            assert key[3:] == _binder_specialization(launch, args)


@pytest.mark.gpu
def test_a_bound_launch_reuses_the_jit_kernel_and_matches_it() -> None:
    x = torch.randn(10_000, device="cuda")
    launch = _fp4_plan().launch(COMMON)
    programs = triton.cdiv(x.numel(), _fp4_plan().rows * 4)
    args = _codes_arguments(x, 11, 3, 0)
    launch(DEVICE, programs, *args)  # a first launch of this specialization: through the JIT
    key = launch.key(DEVICE, args)
    device_cache = launch.kernel.device_caches[DEVICE][0]
    assert any(kernel is launch.compiled[key][0] for kernel in device_cache.values())
    ours = _codes_arguments(x, 11, 3, 0)
    launch(DEVICE, programs, *ours)  # the compiled kernel's native launch function
    jit = _codes_arguments(x, 11, 3, 0)
    launch.kernel[(programs,)](*jit, **launch.constants)
    torch.cuda.synchronize()
    assert torch.equal(ours[1], jit[1]) and torch.equal(ours[2], jit[2])
    expected = sr.cast(x, torch.float4_e2m1fn_x2, "sr", seed=11, offset=3, backend="torch")
    assert torch.equal(ours[1][: x.numel() // 2], expected.view(torch.uint8))


def _in_place_plan() -> kernels.KernelPlan:
    """The plan of an emulation's bfloat16 SR rounding of fp32 values in place (the
    general kernel, `InPlaceRounding`'s)."""
    bf16 = sr.format("bfloat16")
    return kernels.kernel_plan(
        "value", torch.float32, "raise", bf16, "sr", "none", 32, "c", "stream"
    )


def _placed(x: torch.Tensor, start: int) -> torch.Tensor:
    """A copy of x that starts ``start`` elements into a fresh buffer (aligned as x's
    view of its own buffer is where ``start`` is the same)."""
    return torch.empty(x.numel() + start, device=x.device)[start:].copy_(x)


@pytest.mark.gpu
@pytest.mark.parametrize("start", [0, 1, 4])  # x's pointer 16-byte aligned or not
@pytest.mark.parametrize("count", [4096, 4099, 4104])  # divisible by 16, by neither, by 8
def test_a_partial_launch_launches_the_jit_kernel_and_gives_its_bits(
    start: int, count: int
) -> None:
    """`InPlaceRounding`'s partial launch (x at two positions, the seed fixed): its key's
    varying part is the binder's specialization of x, the offset and the count; its first
    launch of a key and the next (the compiled launcher) give the bits of ``kernel[grid]``
    and of the PyTorch path, and it keeps the kernel ``kernel[grid]`` launches."""
    plan, seed = _in_place_plan(), 11
    launch = plan.launch(COMMON)
    x_slot, offset_slot, count_slot = Varying(0), Varying(1), Varying(2)
    partial = launch.partial(
        (x_slot, x_slot, None, None, None, None, seed, offset_slot, count_slot, 0)
    )
    programs = triton.cdiv(count, plan.rows * 4)
    x = torch.randn(count, device="cuda")
    for offset in (0, 3, 16, 2**31 + 5, 2**40 + 1):
        for _ in range(2):  # the key's first launch (through the JIT), then the launcher
            ours = _placed(x, start)
            partial(DEVICE, programs, ours, offset, count)
        jit = _placed(x, start)
        args = (jit, jit, None, None, None, None, seed, offset, count, 0)
        compiled = launch.kernel[(programs,)](*args, **launch.constants)
        compiled = compiled.result() if hasattr(compiled, "result") else compiled
        torch.cuda.synchronize()
        key = partial.key(DEVICE, (ours, offset, count))
        binder = _binder_specialization(launch, args)
        assert key[3:] == (binder[0], binder[7], binder[8]) and binder[0] == binder[1]
        assert partial.compiled[key][0] is compiled
        assert torch.equal(ours.view(torch.int32), jit.view(torch.int32))
        expected = sr.round(x, "bfloat16", "sr", seed=seed, offset=offset, backend="torch")
        assert torch.equal(ours.view(torch.int32), expected.view(torch.int32))


@pytest.mark.gpu
def test_the_codes_kernel_notes_listed_tiles_in_a_host_word() -> None:
    """The page-locked note of a checked call: set to 1 by the codes kernel when it lists a
    tile (an overflow here), untouched otherwise, read on the host after the stream's
    synchronization with no copy."""
    x = torch.randn(10_000, device="cuda")
    launch = _fp4_plan().launch(COMMON)
    programs = triton.cdiv(x.numel(), _fp4_plan().rows * 4)
    for overflow, _ in itertools.product((False, True), range(2)):  # JIT, then launcher
        y = x.clone()
        if overflow:
            y[5_000] = 100.0  # beyond e2m1's 6: its tile is listed for the exact kernel
        args = _codes_arguments(y, 5, 0, 0, note=True)
        launch(DEVICE, programs, *args)
        torch.cuda.current_stream().synchronize()
        flag, note = args[2], args[3]
        assert note.item() == int(overflow) and flag[1].item() == int(overflow)


@pytest.mark.gpu
def test_registered_launch_hooks_see_every_launch() -> None:
    x = torch.randn(4096, device="cuda")
    seen: list[str] = []

    def hook(metadata: object) -> None:
        seen.append(metadata.get()["name"])

    sr.cast(x, torch.float4_e2m1fn_x2, "sr", seed=1)  # compiled, and cached by the launch
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        sr.cast(x, torch.float4_e2m1fn_x2, "sr", seed=1)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    sr.cast(x, torch.float4_e2m1fn_x2, "sr", seed=1)
    assert seen == ["_sr_codes_kernel"]


def _jit_function(kernel: object) -> triton.JITFunction:
    """A compilable JIT function of a kernel (the interpreter's kernels wrap one's source)."""
    if isinstance(kernel, triton.JITFunction):
        return kernel
    return triton.runtime.jit.JITFunction(kernel.fn)


def test_hooks_registered_reads_triton_hook_chains_and_pre_run_hooks() -> None:
    kernel = _jit_function(stream_sr._sr_codes_kernel)
    assert not _hooks_registered(kernel)

    def hook(*_: object) -> None:
        pass

    for chain in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook):
        chain.add(hook)
        try:
            assert _hooks_registered(kernel)
        finally:
            chain.remove(hook)
    kernel.pre_run_hooks.append(hook)
    try:
        assert _hooks_registered(kernel)
    finally:
        kernel.pre_run_hooks.remove(hook)
    assert not _hooks_registered(kernel)


def test_a_launch_needs_every_constexpr_and_runtime_parameters_first() -> None:
    kernel = _jit_function(stream_sr._sr_codes_kernel)
    with pytest.raises(ValueError, match=r"every constexpr of _sr_codes_kernel.*'NBITS'"):
        Launch(kernel, {"ROWS": 512}, fast=True)

    def constexpr_first(COUNT: triton.language.constexpr, x_ptr):
        pass

    with pytest.raises(ValueError, match="runtime parameters first"):
        Launch(triton.runtime.jit.JITFunction(constexpr_first), {}, fast=True)
    assert not Launch(kernel, {}, fast=False).fast  # no checks where it does not launch itself
    constants = {param.name: 0 for param in kernel.params if param.is_constexpr}
    with pytest.raises(TypeError, match="takes 10 runtime arguments, got 2"):
        Launch(kernel, constants, fast=True).key(0, (1, 2))


NATIVE_PREFIX = (1234, False, True, None, None, (2, 1, 0), None, None, None)  # `_stand_in_jit`'s


def _stand_in_jit(
    monkeypatch: pytest.MonkeyPatch, kernel: triton.JITFunction, scratch: int = 0
) -> tuple[list[tuple], list[tuple]]:
    """Triton's JIT and driver stood in for, so that a fast launch of ``kernel`` runs
    without a GPU: (the JIT's calls, (grid, runtime arguments) each; the native launch
    function's, its arguments each: programs, 1, 1, stream 77, then `NATIVE_PREFIX`, then
    the runtime arguments and the constexprs).  The compiled kernel needs ``scratch``
    bytes of global scratch."""
    native_calls: list[tuple] = []
    run = SimpleNamespace(
        global_scratch_size=scratch,
        profile_scratch_size=0,
        launch_cooperative_grid=False,
        launch_pdl=True,
        launch=lambda *arguments: native_calls.append(arguments),
    )
    compiled = SimpleNamespace(run=run, function=1234, packed_metadata=(2, 1, 0))
    jit_calls: list[tuple] = []

    def jit_run(*arguments: object, grid: tuple, warmup: bool, **constants: object) -> object:
        jit_calls.append((grid, arguments))
        return compiled

    monkeypatch.setattr(kernel, "run", jit_run)
    monkeypatch.setattr(kernel, "device_caches", {0: (None, None, None, "backend", None)})
    active = SimpleNamespace(get_current_stream=lambda device: 77)
    monkeypatch.setattr(runtime, "driver", SimpleNamespace(active=active))
    return jit_calls, native_calls


@pytest.mark.parametrize("scratch", [0, 64])
def test_a_launch_binds_the_native_launch_only_of_kernels_without_scratch(
    monkeypatch: pytest.MonkeyPatch, scratch: int
) -> None:
    """After the JIT's first launch, a kernel needing no scratch memory is launched through
    its native launch function with the arguments the JIT's launcher would pass; one that
    needs scratch (allocated by Triton's launcher wrapper) goes through the JIT every time.
    Triton's JIT and driver are stood in for, so this runs without a GPU."""

    def kernel_source(a, b, N: triton.language.constexpr):
        pass

    kernel = triton.runtime.jit.JITFunction(kernel_source)
    jit_calls, native_calls = _stand_in_jit(monkeypatch, kernel, scratch)
    launch = Launch(kernel, {"N": 8}, fast=True)
    monkeypatch.setattr(launch, "key", lambda device, arguments: (device, "key"))
    for programs in (3, 5, 6):
        launch(0, programs, "a", "b")
    if scratch:
        assert [grid for grid, _ in jit_calls] == [(3,), (5,), (6,)] and not native_calls
        assert launch.compiled == {}
    else:
        assert jit_calls == [((3,), ("a", "b"))]
        prefix = (*NATIVE_PREFIX, "a", "b", 8)
        assert native_calls == [(programs, 1, 1, 77, *prefix) for programs in (5, 6)]


def _four_argument_kernel() -> triton.JITFunction:
    """A JIT function of four runtime arguments, ``c`` not specialized, and one constexpr."""

    def kernel_source(a, b, c, d, N: triton.language.constexpr):
        pass

    return triton.runtime.jit.JITFunction(kernel_source, do_not_specialize=["c"])


def _recording_specialization(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Triton's specialization function stood in for by one that records (value,
    specialize, align) of each argument it is asked about: an int specializes as its
    divisibility by 16 (where specialized), a tensor as its pointer, anything else as its
    type."""
    asked: list[tuple] = []

    def specialize(backend: object, value: object, is_const: bool, spec: bool, align: bool):
        assert backend == "backend"
        asked.append((value, spec, align))
        if isinstance(value, torch.Tensor):
            return ("tensor", value.data_ptr())
        if isinstance(value, int):
            return ("int", spec and value % 16 == 0)
        return (type(value).__name__, None)

    monkeypatch.setattr(runtime, "native_specialize_impl", specialize)
    return asked


def test_a_partial_launch_specializes_its_varying_arguments_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only the varying arguments are specialized per call (a slot at two positions once);
    calls whose varying arguments specialize alike share a key and its compiled kernel,
    others go through the JIT again; every launch gets the arguments in full, in order."""
    kernel = _four_argument_kernel()
    jit_calls, native_calls = _stand_in_jit(monkeypatch, kernel)
    asked = _recording_specialization(monkeypatch)
    partial = Launch(kernel, {"N": 8}, fast=True).partial((Varying(0), Varying(0), 7, Varying(1)))
    partial(0, 3, 16, None)  # the key's first launch: the fixed 7 specialized once, recorded
    assert asked == [(16, True, True), (None, True, True), (7, False, True)]
    assert jit_calls == [((3,), (16, 16, 7, None))] and not native_calls
    asked.clear()
    partial(0, 4, 32, None)  # 32 specializes as 16 does: the same key
    assert asked == [(32, True, True), (None, True, True)]
    assert native_calls == [(4, 1, 1, 77, *NATIVE_PREFIX, 32, 32, 7, None, 8)]
    assert len(partial.compiled) == 1
    partial(0, 5, 17, None)  # not divisible by 16: a key of its own, through the JIT
    assert jit_calls[1:] == [((5,), (17, 17, 7, None))] and len(partial.compiled) == 2
    keys = list(partial.compiled)
    assert keys[0][3:] == (("int", True), ("NoneType", None))
    assert keys[1][3:] == (("int", False), ("NoneType", None))
    with pytest.raises(TypeError, match="takes 2 arguments, got 3"):
        partial(0, 5, 17, None, 1)


def test_a_partial_launch_checks_its_template(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = _four_argument_kernel()
    launch = Launch(kernel, {"N": 8}, fast=True)
    with pytest.raises(ValueError, match=r"with none left out; got \[0, 2\]"):
        launch.partial((Varying(0), Varying(2), 1, 2))
    with pytest.raises(TypeError, match=r"None, a number or a tensor; got \['str'\]"):
        launch.partial((Varying(0), "seed", 1, 2))
    with pytest.raises(TypeError, match="takes 4 runtime arguments, the template gives 3"):
        launch.partial((Varying(0), 1, 2))
    with pytest.raises(ValueError, match="slot 0 stands at positions specialized differently"):
        launch.partial((Varying(0), 1, Varying(0), 2))  # c is not specialized, a is
    partial = Launch(kernel, {"N": 8}, fast=False).partial((Varying(0), 1, 2, 3))
    assert isinstance(partial, PartialLaunch) and partial.arguments((5,)) == (5, 1, 2, 3)

    def one_argument(a, N: triton.language.constexpr):
        pass

    alone = Launch(triton.runtime.jit.JITFunction(one_argument), {"N": 8}, fast=True)
    assert alone.partial((Varying(0),)).arguments((5,)) == (5,)
    assert alone.partial((None,)).arguments(()) == (None,)


def test_under_the_debug_knob_a_partial_launch_finds_a_replaced_fixed_tensor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fixed tensor whose storage is replaced breaks the partial launch's contract (its
    pointer's specialization was the first launch's): unchecked without Triton's debug
    knob (the documented contract), a RuntimeError with it."""
    kernel = _four_argument_kernel()
    jit_calls, native_calls = _stand_in_jit(monkeypatch, kernel)
    _recording_specialization(monkeypatch)
    fixed = torch.zeros(4)
    partial = Launch(kernel, {"N": 8}, fast=True).partial((Varying(0), fixed, 7, 0))
    partial(0, 3, 16)
    partial(0, 3, 16)
    fixed.set_(torch.zeros(8))
    partial(0, 3, 16)  # not checked: the caller's contract
    assert len(jit_calls) == 1 and len(native_calls) == 2
    monkeypatch.setattr(knobs.runtime, "debug", True)
    partial(0, 3, 16)  # a key of its own (the knob is in it): through the JIT
    with pytest.raises(RuntimeError, match=r"fixed argument .* changed its specialization"):
        partial(0, 3, 16)
    assert len(jit_calls) == 2 and len(native_calls) == 2


def test_a_partial_launch_goes_through_the_jit_where_a_launch_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the fast path (the interpreter, another Triton), while a hook is registered,
    and for a kernel that needs scratch, every call goes through ``kernel[grid]`` with the
    arguments in full."""
    kernel = _four_argument_kernel()
    jit_calls, native_calls = _stand_in_jit(monkeypatch, kernel, scratch=64)
    _recording_specialization(monkeypatch)
    template = (Varying(1), 5, Varying(0), None)
    for partial in (
        Launch(kernel, {"N": 8}, fast=False).partial(template),
        Launch(kernel, {"N": 8}, fast=True).partial(template),  # needs scratch
    ):
        jit_calls.clear()
        partial(0, 3, 1, 2)
        partial(0, 4, 1, 2)
        assert jit_calls == [((3,), (2, 5, 1, None)), ((4,), (2, 5, 1, None))]
    _, native_calls = _stand_in_jit(monkeypatch, kernel, scratch=0)
    partial = Launch(kernel, {"N": 8}, fast=True).partial(template)

    def hook(*_: object) -> None:
        pass

    kernel.pre_run_hooks.append(hook)
    try:
        partial(0, 3, 1, 2)
        partial(0, 3, 1, 2)
    finally:
        kernel.pre_run_hooks.remove(hook)
    assert not native_calls
    partial(0, 3, 1, 2)  # the first launch of the key, through the JIT
    partial(0, 3, 1, 2)
    assert len(native_calls) == 1


def test_other_triton_releases_and_the_interpreter_launch_through_the_jit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The shortcut is taken only on the Triton release it was written against, compiled;
    a launch without it goes through ``kernel[grid]`` on every call."""
    assert not runtime.fast_launch_supported("3.7.0", interpreted=False)
    assert not runtime.fast_launch_supported("3.5.1", interpreted=False)
    assert not runtime.fast_launch_supported(runtime.TESTED_TRITON + "0", interpreted=True)
    assert runtime.fast_launch_supported(runtime.TESTED_TRITON + "0", interpreted=False) == (
        runtime.native_specialize_impl is not None
    )
    jit_calls: list[tuple] = []

    def kernel_source(a, b, N: triton.language.constexpr):
        pass

    kernel = triton.runtime.jit.JITFunction(kernel_source)

    def jit_run(*arguments: object, grid: tuple, warmup: bool, **constants: object) -> None:
        jit_calls.append((grid, arguments, constants))

    monkeypatch.setattr(kernel, "run", jit_run)
    launch = Launch(kernel, {"N": 8}, fast=False)
    for programs in (3, 5):
        launch(0, programs, "a", "b")
    assert jit_calls == [((3,), ("a", "b"), {"N": 8}), ((5,), ("a", "b"), {"N": 8})]
