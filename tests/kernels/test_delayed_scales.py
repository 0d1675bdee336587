"""A delayed layer's window scales and amax record in one launch
(`stochround.kernels.delayed_scales`) against their spec, the PyTorch route of
`stochround.nn.amax_history` (``window_scales``: ``window_amax`` then
``nvfp4_tensor_scales``; ``record_amax``), bit for bit: over random histories whose
amaxes hold every special value the scales treat apart (0, -0, NaN, inf, subnormals,
-1, FLT_MAX) and whose steps hold empty columns, the step itself, steps after it and steps
outside the window."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from stochround.kernels.delayed_scales import HistoryRoles, record_amaxes, window_tensor_scales
from stochround.nn.amax_history import (
    EMPTY,
    AmaxHistory,
    delayed_tensor_scale,
    record_amax,
    window_scales,
)
from stochround.nn.recipes import ROLES

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SPECIAL = [0.0, -0.0, float("nan"), float("inf"), 1e-40, 1e-45, -1.0, 3.4028234663852886e38]


def bits(x: Tensor) -> Tensor:
    """fp32 bit patterns (NaN payloads included)."""
    return x.contiguous().view(torch.int32)


def random_history(width: int, step: int, seed: int) -> AmaxHistory:
    """A history of ``width`` columns at ``step``: amaxes random magnitudes with special
    values mixed in, steps drawn around the step (EMPTY, the window, the step, later)."""
    generator = torch.Generator().manual_seed(seed)
    shape = (len(ROLES), width)
    amaxes = torch.rand(shape, generator=generator) * 10.0 ** torch.randint(-30, 30, shape)
    special = torch.randint(0, 3 * len(SPECIAL), shape, generator=generator)
    for index, value in enumerate(SPECIAL):
        amaxes = torch.where(special == index, value, amaxes)
    steps = step + torch.randint(-width - 2, 3, shape, generator=generator)
    steps = torch.where(torch.rand(shape, generator=generator) < 0.2, EMPTY, steps)
    history = AmaxHistory(
        amaxes.float().to(DEVICE),
        steps.to(DEVICE),
        torch.tensor(step, device=DEVICE),
        True,
    )
    return history


@pytest.mark.parametrize("seed", range(40))
def test_window_scales_launch_gives_the_pytorch_routes_bits(seed: int) -> None:
    """Each role's S_dec, S_enc from one launch equal `window_scales`' (the largest amax
    in the window, -1 where none, NaN where one is NaN, through TE's scales), and the
    record slots are zeroed."""
    width = 2 + seed % 17
    history = random_history(width, step=seed % 5 * 7, seed=seed)
    # every length from 1 to width - 1 (the longest the width serves) over the seeds
    lengths = tuple(1 + (seed + 5 * row) % (width - 1) for row in range(len(ROLES)))
    roles = HistoryRoles(tuple(range(len(ROLES))), lengths)
    out = window_tensor_scales(history.amaxes, history.steps, history.step, roles)
    for index, (role, length) in enumerate(zip(ROLES, lengths, strict=True)):
        spec = window_scales(history, role, length)
        assert torch.equal(bits(out[2 * index : 2 * index + 2]), bits(spec)), (role, length)
    assert torch.equal(bits(out[2 * len(ROLES) :]), bits(torch.zeros(len(ROLES), device=DEVICE)))


def test_window_scales_launch_serves_any_two_roles_in_their_order() -> None:
    """A launch of two roles (a pair's) gives each role's scales in the order given."""
    history = random_history(9, step=20, seed=7)
    roles = HistoryRoles((2, 0), (8, 3))
    out = window_tensor_scales(history.amaxes, history.steps, history.step, roles)
    assert torch.equal(bits(out[:2]), bits(window_scales(history, ROLES[2], 8)))
    assert torch.equal(bits(out[2:4]), bits(window_scales(history, ROLES[0], 3)))


@pytest.mark.parametrize("seed", range(20))
def test_record_launch_gives_the_pytorch_routes_buffers(seed: int) -> None:
    """One record launch leaves the buffers `record_amax` leaves for each role: the amax
    in column ``step mod width`` with the step, unless that column holds the step
    already (kept: a recomputation's record)."""
    width = 2 + seed % 9
    step = seed * 3
    history = random_history(width, step, seed)
    # the step's own column holds the step itself in some rows: the kept case
    column = step % width
    history.steps[1, column] = step
    values = [1.5, float("nan"), 2.0**-140, 0.0, float("inf"), 3.0]
    record = torch.tensor(values[: len(ROLES)], device=DEVICE)
    spec = AmaxHistory(history.amaxes.clone(), history.steps.clone(), history.step, True)
    for role, amax in zip(ROLES, record.unbind(), strict=True):
        record_amax(spec, role, amax)
    roles = HistoryRoles(tuple(range(len(ROLES))), (0,) * len(ROLES))
    record_amaxes(history.amaxes, history.steps, history.step, roles, record)
    assert torch.equal(bits(history.amaxes), bits(spec.amaxes))
    assert torch.equal(history.steps, spec.steps)


@pytest.mark.parametrize("record", [True, False], ids=["records", "records_nothing"])
@pytest.mark.parametrize("seed", range(24))
def test_decided_launch_gives_the_device_routes_scales_and_buffers(seed: int, record: bool) -> None:
    """Given each role's current amax (a launch's magnitudes: 0, subnormals, inf, NaN
    among them), one launch gives `delayed_tensor_scale`'s S_dec, S_enc of each role (its
    window's, the current amax's where the window is empty: some rows have no step in
    it) and zeroed records, and leaves the buffers `record_amax` of each role leaves
    (nothing where the history records nothing; the step's column kept where it holds the
    step already)."""
    width = 2 + seed % 11
    step = 5 + seed * 3
    history = random_history(width, step, seed)
    history = history._replace(record=record)
    history.steps[seed % len(ROLES)] = EMPTY  # an empty window
    history.steps[(seed + 1) % len(ROLES), step % width] = step  # recorded this step already
    lengths = tuple(1 + (seed + 3 * row) % (width - 1) for row in range(len(ROLES)))
    values = [3.5, 0.0, 2.0**-140, float("inf"), float("nan"), 7e30, 1.0, 2.0**-126]
    current = torch.tensor([values[(seed + i) % len(values)] for i in range(len(ROLES))])
    current = current.to(DEVICE)
    spec = history._replace(amaxes=history.amaxes.clone(), steps=history.steps.clone())
    expected = []
    for role, length, amax in zip(ROLES, lengths, current.unbind(), strict=True):
        expected += list(delayed_tensor_scale(spec, role, length, amax))
    for role, amax in zip(ROLES, current.unbind(), strict=True):
        record_amax(spec, role, amax)
    roles = HistoryRoles(tuple(range(len(ROLES))), lengths)
    out = window_tensor_scales(history.amaxes, history.steps, history.step, roles, current, record)
    assert torch.equal(bits(out[: 2 * len(ROLES)]), bits(torch.stack(expected)))
    assert torch.equal(bits(out[2 * len(ROLES) :]), bits(torch.zeros(len(ROLES), device=DEVICE)))
    assert torch.equal(bits(history.amaxes), bits(spec.amaxes))
    assert torch.equal(history.steps, spec.steps)


def test_the_decided_launch_refuses_current_amaxes_it_cannot_read() -> None:
    """ValueError naming what the current amaxes must be (one fp32 a role, contiguous), and
    that a record needs them."""
    history = random_history(5, step=3, seed=0)
    roles = HistoryRoles((0, 1), (2, 2))
    for bad in (torch.zeros(3, device=DEVICE), torch.zeros(2, device=DEVICE).double()):
        with pytest.raises(ValueError, match="current must hold 2 contiguous fp32 values"):
            window_tensor_scales(history.amaxes, history.steps, history.step, roles, bad)
    with pytest.raises(ValueError, match="record needs the current amaxes"):
        window_tensor_scales(history.amaxes, history.steps, history.step, roles, record=True)


def test_the_launches_refuse_a_history_of_another_layout() -> None:
    """ValueError naming what the history must be: (roles, width) fp32 amaxes and int64
    steps alike and contiguous, a one-value int64 step."""
    history = random_history(5, step=3, seed=0)
    roles = HistoryRoles((0,), (2,))
    with pytest.raises(ValueError, match="fp32 amaxes, int64 steps"):
        window_tensor_scales(history.amaxes.double(), history.steps, history.step, roles)
    with pytest.raises(ValueError, match="contiguous"):
        window_tensor_scales(history.amaxes.t(), history.steps.t(), history.step, roles)
    with pytest.raises(ValueError, match="must hold 1 fp32 values"):
        record_amaxes(history.amaxes, history.steps, history.step, roles, torch.empty(0))
