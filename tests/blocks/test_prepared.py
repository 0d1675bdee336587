"""A prepared operand (checks and launch set-up made once for a shape) gives the bits of
the entry point's kernel call, for every block operand of the named recipes."""

from __future__ import annotations

import pytest
import torch

import stochround.nn as srnn
from stochround.blocks.prepared_operand import PreparedGemmOperand
from stochround.blocks.quantize import gemm_operand
from stochround.blocks.request import BlockArguments
from stochround.kernels.availability import INTERPRETED
from stochround.nn import linear, operands
from stochround.nn.amax_history import operand_amax
from stochround.nn.recipes import TENSOR_FORMATS
from stochround.random import seed_tensor

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    not (INTERPRETED or torch.cuda.is_available()),
    reason="the kernel needs CUDA or the interpreter",
)


def block_roles() -> list[tuple[str, str]]:
    """(recipe, role) of every operand the block kernel quantizes with its own scales."""
    found = []
    for name in ("nvfp4", "mxfp4_tseng", "mxfp8"):
        plan = linear.make_plan(srnn.RECIPES[name](), 0)
        for role, entry in plan.operands.items():
            spec = entry.spec
            if entry.fmt is None or spec.format in TENSOR_FORMATS or spec.noise != "element":
                continue
            found.append((name, role))
    return found


def arguments(spec, fmt, signs, seed, offset) -> BlockArguments:  # type: ignore[no-untyped-def]
    return BlockArguments(
        fmt, spec.mode, -1, None, None, False if spec.tensor_scale == "none" else None,
        "te", spec.rht, signs, spec.rht_bf16, spec.rbits, spec.variant, seed, offset, None,
        None, 0, "triton",
    )  # fmt: skip


@pytest.mark.parametrize(("recipe", "role"), block_roles())
@pytest.mark.parametrize("per_step_signs", [False, True])
def test_a_prepared_operand_has_the_entry_points_bits(
    recipe: str, role: str, per_step_signs: bool
) -> None:
    entry = linear.make_plan(srnn.RECIPES[recipe](), 0).operands[role]
    spec, fmt = entry.spec, entry.fmt
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(64, 128, generator=g) * torch.logspace(-3, 3, 128)).to(torch.bfloat16)
    x = x.to(DEVICE)
    signs = None
    if spec.rht is not None and per_step_signs:
        signs = torch.where(torch.rand(spec.rht, generator=g) < 0.5, -1.0, 1.0).to(DEVICE)
    seed, offset = 2**63 + 7, torch.tensor(11, device=DEVICE)
    expected = gemm_operand(x, fmt, spec.mode, **_options(spec, signs, seed, offset))
    prepared = PreparedGemmOperand(x, arguments(spec, fmt, signs, 0, 0))
    got = prepared(x, seed_tensor(seed, "seed", x.device), offset.reshape(1), signs)
    assert got.values.dtype == expected.values.dtype
    integer = torch.int16 if got.values.dtype == torch.bfloat16 else torch.int32
    assert torch.equal(got.values.view(integer).cpu(), expected.values.view(integer).cpu())
    assert got.factor == expected.factor and got.row_scale is None
    if expected.tensor_scale is None:
        assert got.tensor_scale is None
    else:
        assert torch.equal(got.tensor_scale.cpu(), expected.tensor_scale.cpu())  # type: ignore[union-attr]


def _options(spec, signs, seed, offset) -> dict:  # type: ignore[no-untyped-def]
    return {
        **operands.block_options(spec),
        "rht_signs": signs,
        "seed": seed,
        "offset": offset,
        "backend": "triton",
    }


def test_a_prepared_operand_takes_only_its_shape_and_refuses_what_it_cannot_serve() -> None:
    entry = linear.make_plan(srnn.nvfp4(), 0).operands["fprop_input"]
    x = torch.randn(32, 64, device=DEVICE)
    prepared = PreparedGemmOperand(x, arguments(entry.spec, entry.fmt, None, 0, 0))
    seed = seed_tensor(1, "seed", x.device)
    with pytest.raises(
        ValueError, match=r"x must be a contiguous torch.float32 tensor of shape \(32, 64\)"
    ):
        prepared(x[:16].contiguous(), seed, seed)
    row = linear.make_plan(srnn.int8(), 0).operands["fprop_input"]
    with pytest.raises(ValueError, match="blocks with their own scales"):
        PreparedGemmOperand(x, arguments(row.spec, row.fmt, None, 0, 0))


def test_the_layers_cache_prepares_each_shape_once() -> None:
    # the cache is keyed without the route: a CPU entry made under `cpu_as_cuda` by an
    # earlier test (its caller asks only on the kernels' route) would be found here
    operands.prepared_operand.cache_clear()
    entry = linear.make_plan(srnn.nvfp4(), 0).operands["fprop_input"]
    shape = torch.Size((32, 64))
    first = operands.prepared_operand(
        entry.spec, entry.fmt, shape, torch.float32, torch.device(DEVICE)
    )
    again = operands.prepared_operand(
        entry.spec, entry.fmt, shape, torch.float32, torch.device(DEVICE)
    )
    # made once; on the CPU "auto" does not take the kernel, so there is none to prepare
    assert first is again
    assert isinstance(first, PreparedGemmOperand) == (DEVICE == "cuda")
    row = linear.make_plan(srnn.int8(), 0).operands["fprop_input"]
    assert (
        operands.prepared_operand(row.spec, row.fmt, shape, torch.float32, torch.device(DEVICE))
        is None
    )


@pytest.mark.parametrize("role", ["fprop_weight", "fprop_input", "wgrad_grad_output"])
def test_decide_takes_the_current_amax_of_the_pass_the_call_makes(role: str) -> None:
    """``decide`` gets x's current amax from the launch the call makes anyway (the 2-D
    tiles' amax launch for W, the tensor-scale pass, rotated where the role is), the
    spec's `operand_amax` bit for bit, and the operand is quantized with the scales it
    returns, as given scales are; the record it returns is the one the launch raises."""
    entry = linear.make_plan(srnn.nvfp4(), 0).operands[role]
    spec, fmt = entry.spec, entry.fmt
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(64, 128, generator=g) * 3).to(torch.bfloat16).to(DEVICE)
    prepared = PreparedGemmOperand(x, arguments(spec, fmt, None, 0, 0), record=True)
    seed, offset = seed_tensor(9, "seed", x.device), torch.tensor([4], device=DEVICE)
    given = torch.tensor([0.25, 4.0], device=DEVICE)
    seen: list[torch.Tensor] = []

    def decide(current: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        seen.append(current.clone())
        return given, record

    record = torch.zeros(1, device=DEVICE)
    got = prepared(x, seed, offset, decide=decide)
    expected = prepared(x, seed, offset, None, given, torch.zeros(1, device=DEVICE))
    (current,) = seen
    spec_amax = operand_amax(x, spec, prepared.signs).reshape(1)
    assert torch.equal(current.view(torch.int32), spec_amax.view(torch.int32))
    assert torch.equal(got.values.view(torch.int16), expected.values.view(torch.int16))
    assert torch.equal(record, spec_amax)
    with pytest.raises(ValueError, match="decide takes an operand whose scales are computed"):
        prepared(x, seed, offset, None, given, record, decide)
