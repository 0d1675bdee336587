"""The batched samples of `stochround.emulate.mca` (`stochround.emulate.mca_batched`): one
run on the n samples together gives, sample for sample, the serial runs' results bit for
bit (run j draws offsets j 2**40 + i in both), the same digits per site, and a program that
cannot be batched is a `BatchingError` naming its op and line."""

from __future__ import annotations

import contextlib

import pytest
import torch
from helpers import kahan_sum, muller_values

from stochround import random as streams
from stochround.emulate.mca import SAMPLE_STRIDE, BatchingError, mca
from stochround.emulate.mca_samples import SampleTensor, sample_words
from stochround.kernels.availability import cpu_as_cuda


def naive_var(v: torch.Tensor) -> torch.Tensor:
    return (v * v).mean() - v.mean() ** 2


def accumulate(x: torch.Tensor) -> dict[str, object]:
    """In-place ops on a tensor made inside the program, views, integer and tuple results."""
    acc = torch.zeros(3)
    for _ in range(4):
        acc += x[:3] * 1.1
    acc.mul_(0.3)
    return {"acc": acc, "rest": (x.sum(), (x > 1e4).sum(), 3), "matrix": x[:6].reshape(2, 3).T}


def lu_solve(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    lu, pivots = torch.linalg.lu_factor(a)
    return torch.linalg.lu_solve(lu, pivots, b.unsqueeze(-1)).squeeze(-1)


def shifted() -> torch.Tensor:
    return torch.randn(1000, generator=torch.Generator().manual_seed(0)) + 1e4


def hilbert() -> tuple[torch.Tensor, torch.Tensor]:
    indices = torch.arange(5, dtype=torch.float64)
    matrix = 1 / (indices[:, None] + indices[None, :] + 1)
    return matrix.float(), matrix.sum(dim=1).float()


CASES = {
    "naive_rr": (naive_var, (shifted(),), {}),
    "naive_pb": (naive_var, (shifted(),), {"mca_mode": "pb", "precision": 20}),
    "naive_mca_float64": (naive_var, (shifted().double(),), {"mca_mode": "mca"}),
    "kahan": (kahan_sum, (shifted()[:40],), {}),
    "muller": (muller_values, (20,), {}),
    "accumulate_t10": (accumulate, (shifted(),), {"precision": 10}),
    "lu_solve": (lu_solve, hilbert(), {}),
    "bfloat16_rne": (naive_var, (shifted(),), {"fmt": "bfloat16", "mode": "rne"}),
}


@pytest.mark.parametrize("case", CASES)
def test_batched_samples_are_the_serial_runs_bit_for_bit(case):
    fn, args, options = CASES[case]
    serial = mca(fn, *args, n=5, seed=7, trace=True, batched=False, **options)
    batched = mca(fn, *args, n=5, seed=7, trace=True, **options)
    assert batched.labels == serial.labels
    for ours, theirs in zip(batched.samples, serial.samples, strict=True):
        assert ours.shape == theirs.shape and torch.equal(ours, theirs)
    assert batched.no_residual == serial.no_residual
    # the same sites and calls; the digits from the same samples (moments computed in
    # another order: equal to float64's rounding of them)
    assert [(s.site, s.calls) for s in batched.sites] == [(s.site, s.calls) for s in serial.sites]
    for ours, theirs in zip(batched.sites, serial.sites, strict=True):
        assert ours.digits == pytest.approx(theirs.digits, abs=1e-9, nan_ok=True)


def test_sample_j_does_not_depend_on_n():
    """Run j's stream is j 2**40 + i whatever n is: the first samples of a larger n are a
    smaller n's."""
    few = mca(naive_var, shifted(), n=3, seed=2)
    many = mca(naive_var, shifted(), n=6, seed=2)
    assert torch.equal(many.samples[0][:3], few.samples[0])


def kernel_route() -> tuple[torch.device, contextlib.AbstractContextManager]:
    """Where the CUDA route runs: a GPU's CUDA tensors, else CPU tensors under
    `cpu_as_cuda` (Triton's interpreter)."""
    if torch.cuda.is_available():
        return torch.device("cuda"), contextlib.nullcontext()
    return torch.device("cpu"), cpu_as_cuda()


def test_sample_words_are_each_samples_stream_on_both_paths():
    """The PyTorch path and the kernel (TRITON_INTERPRET here): sample j's words are
    random_words_like's at offset bases[j] + offset; a key above 2**63, a shape that is
    not a multiple of four, a 0-d one."""
    key = 2**64 - 12345
    bases = torch.arange(4, dtype=torch.int64) * SAMPLE_STRIDE
    for shape in (torch.Size([7, 3]), torch.Size([]), torch.Size([1029])):
        expected = torch.stack(
            [streams.random_words_like(torch.empty(shape), key, int(b) + 77) for b in bases]
        )
        assert torch.equal(sample_words(shape, key, bases, 77), expected)
        device, route = kernel_route()
        with route:
            assert torch.equal(sample_words(shape, key, bases.to(device), 77).cpu(), expected)


def error_of(fn, *args) -> str:
    with pytest.raises(BatchingError) as raised:
        mca(fn, *args, n=4, precision=12)
    return str(raised.value)


def test_a_value_read_from_the_samples_cannot_be_batched():
    def branches(x: torch.Tensor) -> torch.Tensor:
        y = x * 1.5
        if y.sum() > 0:  # a line of its own: the message names it
            return y
        return -y

    message = error_of(branches, torch.ones(3))
    line = branches.__code__.co_firstlineno + 2
    assert message.startswith(
        f"aten._local_scalar_dense.default (at {__file__}:{line} branches) cannot run on the "
        "4 MCA samples together: its result is a Python value read from the samples' values."
    )
    assert message.endswith(
        "Run the samples one after another: mca(..., batched=False), stochround mca --serial"
    )
    assert error_of(lambda x: (x * 3).tolist(), torch.ones(2)).startswith(
        "x.tolist() reads the values of a tensor of a batched MCA run"
    )
    assert error_of(lambda x: (x * 3).numpy(), torch.ones(2)).startswith("x.numpy() reads")
    # the serial runs take it
    assert mca(branches, torch.ones(3), n=4, precision=12, batched=False).labels == ("result",)


def test_random_draws_and_value_dependent_shapes_cannot_be_batched():
    message = error_of(lambda x: x * torch.randn(3), torch.ones(3))
    assert message.startswith("aten.randn.default (at ")
    assert "random operation" in message
    assert error_of(lambda x: (x * 0.1).nonzero(), torch.ones(3)).startswith(
        "aten.nonzero.default (at "
    )


def test_writing_into_a_tensor_made_outside_the_run_cannot_be_batched():
    outside = torch.zeros(3)

    def writes(x: torch.Tensor) -> torch.Tensor:
        return outside.copy_(x * 1.1)

    assert error_of(writes, torch.ones(3)).startswith("aten.copy_.default (at ")
    assert "it writes into a tensor made outside the run (an argument, a global)" in error_of(
        writes, torch.ones(3)
    )


def test_the_programs_tensors_hold_the_samples_and_stay_inside_the_run():
    kept: list[torch.Tensor] = []

    def program(x: torch.Tensor) -> torch.Tensor:
        y = x * 1.1
        kept.append(y)
        return y

    mca(program, torch.ones(3), n=4, precision=8)
    (y,) = kept
    assert isinstance(y, SampleTensor) and y.shape == (3,) and y.samples.shape == (4, 3)
    assert repr(y) == "SampleTensor(n=4, shape=(3,))"
    with pytest.raises(BatchingError, match=r"^aten\.add\.Tensor on a tensor of a batched MCA"):
        y + 1


def test_batched_samples_carry_no_gradient():
    v = torch.ones(3, requires_grad=True)
    with pytest.raises(ValueError, match=r"^batched=True gives samples without a gradient"):
        mca(lambda t: t * 3, v, n=2)
    with pytest.raises(TypeError, match=r"^batched must be a bool; got 1"):
        mca(lambda t: t * 3, torch.ones(3), n=2, batched=1)


@pytest.mark.parametrize(
    "options", [{}, {"precision": 12}, {"mca_mode": "mca", "precision": 20}], ids=str
)
def test_batched_samples_on_the_kernels_route_are_the_serial_runs(options):
    """The route a CUDA tensor takes (the words kernel, the rounding kernels; run by
    Triton's interpreter here): the same samples as the serial runs on the PyTorch path."""
    x = torch.rand(37, generator=torch.Generator().manual_seed(0))

    def damped(x: torch.Tensor) -> torch.Tensor:
        y = x
        for _ in range(3):
            y = (y * 0.999 + x) / 3.0
        return y.sum()

    expected = mca(damped, x, n=3, seed=0, batched=False, **options)
    device, route = kernel_route()
    with route:
        batched = mca(damped, x.to(device), n=3, seed=0, **options)
    assert torch.equal(batched.samples[0].cpu(), expected.samples[0])
