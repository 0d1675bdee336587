"""The two-orientation quantizer (`stochround.kernels.two_orientation`) equals two separate
quantizations bit for bit: `gemm_blocks` of x and of the zero-padded x^T (rotated along the
tokens), each with its own stream, rounding and tensor scales (the separate amaxes)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import triton
from torch.nn import functional

import stochround.nn as srnn
from stochround.blocks.hadamard import random_signs
from stochround.formats import format as find_format
from stochround.kernels import two_orientation
from stochround.kernels.blocks import gemm_blocks, nvfp4_tensor_scale
from stochround.kernels.pair_records import orientation
from stochround.kernels.two_orientation import PreparedTwoOrientations
from stochround.nn import orientations
from stochround.nn.amax_history import operand_amax

E2M1 = find_format("e2m1")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def separate(
    x: torch.Tensor,
    padded: int,
    mode: str,
    offset: int,
    rht: int | None,
    signs,
    rotate: bool,
    n: int = 32,
    variant: str = "c",
    flavour: str = "te",
) -> tuple[torch.Tensor, torch.Tensor]:
    """gemm_blocks of ``x`` (if not ``rotate``) or of its padded transpose (rotated), SR
    with ``n`` bits of ``variant``, the tensor scales of the ``flavour``."""
    operand = x if not rotate else functional.pad(x.T.contiguous(), (0, padded - x.shape[0]))
    rotation = rht if rotate else None
    rotation_signs = signs if rotation else None
    scales, _ = nvfp4_tensor_scale(
        operand, flavour, rht=rotation, rht_signs=rotation_signs, rht_bf16=rotation is not None
    )
    values = gemm_blocks(
        operand, E2M1, 16, "nvfp4", out_dtype=torch.bfloat16, tensor_scale=scales, mode=mode,
        n=n, variant=variant, nvfp4_flavour=flavour,
        seed=torch.tensor([7], device=DEVICE), offset=torch.tensor([offset], device=DEVICE),
        rht=rotation,
        rht_signs=rotation_signs, rht_bf16=rotation is not None,
    )  # fmt: skip
    return values, scales


@pytest.mark.parametrize("tokens, features", [(40, 32), (16, 48), (150, 16)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("mode", ["rne", "sr"])
@pytest.mark.parametrize("rht", [None, 16])
@pytest.mark.parametrize("flavour", ["te", "pow2"])
def test_both_orientations_equal_separate_quantizations(
    tokens, features, dtype, mode, rht, flavour
):
    """pow2: the operands' values hold their power-of-two tensor scales (no decodes), as
    the separate path's do."""
    generator = torch.Generator().manual_seed(tokens * features)
    x = (torch.randn(tokens, features, generator=generator) * 3).to(DEVICE, dtype)
    x[0, :3] = 0.0  # zero blocks' scales
    padded = -(-tokens // 16) * 16
    signs = None if rht is None else random_signs(16, 3, offset=5, device=DEVICE)
    row, column = (orientation(E2M1, mode, 32, "c", 2, flavour=flavour) for _ in range(2))
    prepared = PreparedTwoOrientations(
        x, padded, row, column, rht=rht, rht_signs=signs, rht_bf16=rht is not None
    )
    seed, row_offset, column_offset = (torch.tensor([v], device=DEVICE) for v in (7, 11, 13))
    result = prepared(x, seed, row_offset, column_offset, signs)
    separately = {"rht": rht, "signs": signs, "flavour": flavour}
    expected_row, row_scales = separate(x, padded, mode, 11, rotate=False, **separately)
    expected_column, column_scales = separate(x, padded, mode, 13, rotate=True, **separately)
    assert (result.decodes is None) == (flavour == "pow2")
    assert result.scales is not None
    assert torch.equal(result.scales[:2], row_scales)
    assert torch.equal(result.scales[2:], column_scales)
    assert torch.equal(result.row.view(torch.int16), expected_row.view(torch.int16))
    assert torch.equal(result.column.view(torch.int16), expected_column.view(torch.int16))


@pytest.mark.parametrize("mode", ["rne", "sr"])
@pytest.mark.parametrize("rht, tile_tokens", [(None, 16), (16, 16), (16, 32), (32, 32)])
@pytest.mark.parametrize("dtype, flavour", [(torch.bfloat16, "te"), (torch.float16, "te"),
                                           (torch.bfloat16, "pow2")])  # fmt: skip
@pytest.mark.parametrize("staged", [True, False])
def test_many_tiles_equal_separate_quantizations(
    mode, rht, tile_tokens, dtype, flavour, staged, monkeypatch
):
    """Tiles smaller than x (as the compiled kernel's): 70 tokens (padded to 80, the last
    token tile partly padding) by 80 features (the last 32-feature tile partly outside
    x), a zero block, tiny values (scales near fp32's subnormals) and the two roles'
    streams at different offsets give the separate path's bits in every tile; RHT-32
    (signs by the token's place in its 32) pads to 96 tokens.  Both stores: the tiles as
    matrices (`STAGED_STORES`, masked at x's and the padding's ends) and each thread's
    blocks."""
    monkeypatch.setattr(two_orientation, "STAGED_STORES", staged)
    monkeypatch.setattr(two_orientation, "TILE_TOKENS", tile_tokens)
    monkeypatch.setattr(two_orientation, "TILE_FEATURES", 32)
    tokens, features, padded = 70, 80, 96 if rht == 32 else 80
    generator = torch.Generator().manual_seed(70)
    x = (torch.randn(tokens, features, generator=generator) * 3).to(DEVICE, dtype)
    x[16:32, 16:32] = 0.0  # a zero block in both orientations
    # tiny blocks: their scales near fp32's subnormals (fp16: its own subnormals)
    x[40:50, 48:] *= 2.0**-120 if dtype == torch.bfloat16 else 2.0**-20
    signs = None if rht is None else random_signs(rht, 3, offset=5, device=DEVICE)
    row, column = (orientation(E2M1, mode, 32, "c", 2, flavour=flavour) for _ in range(2))
    prepared = PreparedTwoOrientations(
        x, padded, row, column, rht=rht, rht_signs=signs, rht_bf16=rht is not None
    )
    assert prepared.programs == -(-padded // tile_tokens) * 3
    seed, row_offset, column_offset = (torch.tensor([v], device=DEVICE) for v in (7, 11, 13))
    result = prepared(x, seed, row_offset, column_offset, signs)
    separately = {"rht": rht, "signs": signs, "flavour": flavour}
    expected_row, row_scales = separate(x, padded, mode, 11, rotate=False, **separately)
    expected_column, column_scales = separate(x, padded, mode, 13, rotate=True, **separately)
    assert result.scales is not None
    assert torch.equal(result.scales[:2], row_scales)
    assert torch.equal(result.scales[2:], column_scales)
    assert torch.equal(result.row.view(torch.int16), expected_row.view(torch.int16))
    assert torch.equal(result.column.view(torch.int16), expected_column.view(torch.int16))


@pytest.mark.parametrize("special", [float("inf"), float("nan"), 65504.0])
def test_special_values_give_the_separate_tensor_scales(special):
    """An infinity, a NaN or fp16's largest finite value in x: the amax launch rounds each
    block's largest rotated magnitude instead of every element (the rounding is monotone),
    which gives the separate path's tensor scales and operands bit for bit (NaN patterns
    included); 65504 rotated overflows fp16."""
    tokens, features, padded = 40, 32, 48
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(tokens, features, generator=generator).to(DEVICE, torch.float16)
    x[5, 7] = special
    x[21, 7] = special  # two in one column block: a rotated sum of them
    signs = random_signs(16, 3, offset=5, device=DEVICE)
    row, column = (orientation(E2M1, "sr", 32, "c", 2) for _ in range(2))
    prepared = PreparedTwoOrientations(
        x, padded, row, column, rht=16, rht_signs=signs, rht_bf16=True
    )
    seed, row_offset, column_offset = (torch.tensor([v], device=DEVICE) for v in (7, 11, 13))
    result = prepared(x, seed, row_offset, column_offset, signs)
    expected_row, row_scales = separate(x, padded, "sr", 11, 16, signs, rotate=False)
    expected_column, column_scales = separate(x, padded, "sr", 13, 16, signs, rotate=True)
    assert result.scales is not None
    assert torch.equal(result.scales[:2].view(torch.int32), row_scales.view(torch.int32))
    assert torch.equal(result.scales[2:].view(torch.int32), column_scales.view(torch.int32))
    assert torch.equal(result.row.view(torch.int16), expected_row.view(torch.int16))
    assert torch.equal(result.column.view(torch.int16), expected_column.view(torch.int16))


def assert_pair_equals_separate(
    x: torch.Tensor,
    padded: int,
    mode: str,
    rht: int | None,
    signs,
    n: int = 32,
    variant: str = "c",
    even: bool | None = None,
) -> None:
    """The pair of x (rounded by ``mode``, SR with ``n`` bits of ``variant``) equals the
    separate path bit for bit, tensor scales (NaN patterns too) and operands; ``even``:
    whether the launch's tiling is the mask-free one (None: not checked)."""
    row, column = (orientation(E2M1, mode, n, variant, 2) for _ in range(2))
    prepared = PreparedTwoOrientations(
        x, padded, row, column, rht=rht, rht_signs=signs, rht_bf16=rht is not None
    )
    if even is not None:
        assert prepared.quantize.constants["TILING"].EVEN is even
    seed, row_offset, column_offset = (torch.tensor([v], device=DEVICE) for v in (7, 11, 13))
    result = prepared(x, seed, row_offset, column_offset, signs)
    expected_row, row_scales = separate(x, padded, mode, 11, rht, signs, False, n, variant)
    expected_column, column_scales = separate(x, padded, mode, 13, rht, signs, True, n, variant)
    assert result.scales is not None
    assert torch.equal(result.scales[:2].view(torch.int32), row_scales.view(torch.int32))
    assert torch.equal(result.scales[2:].view(torch.int32), column_scales.view(torch.int32))
    assert torch.equal(result.row.view(torch.int16), expected_row.view(torch.int16))
    assert torch.equal(result.column.view(torch.int16), expected_column.view(torch.int16))
    # each operand's S_dec a view of the scales; the last program reset the counter, so a
    # second call gives the same bits
    assert result.decodes is not None
    places = [decode.data_ptr() for decode in result.decodes]
    assert places == [result.scales[0].data_ptr(), result.scales[2].data_ptr()]
    assert int(prepared.tickets.counter) == 0
    again = prepared(x, seed, row_offset, column_offset, signs)
    assert torch.equal(again.scales.view(torch.int32), result.scales.view(torch.int32))
    assert torch.equal(again.column.view(torch.int16), result.column.view(torch.int16))


@pytest.mark.parametrize("mode", ["rne", "sr"])
@pytest.mark.parametrize("special", [None, float("inf"), float("nan")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("staged", [True, False])
def test_whole_tiles_equal_separate_quantizations(mode, special, dtype, staged, monkeypatch):
    """x's tokens and features filling whole tiles (no padding tokens) take the mask-free
    launch, which gives the separate path's bits: 32 x 64 in tiles of 16 x 32, a zero
    block, tiny blocks, and an infinity or a NaN (its blocks' products bf16's canonical
    NaN, an infinity's blocks saturated); both stores (`STAGED_STORES`)."""
    monkeypatch.setattr(two_orientation, "STAGED_STORES", staged)
    monkeypatch.setattr(two_orientation, "TILE_TOKENS", 16)
    monkeypatch.setattr(two_orientation, "TILE_FEATURES", 32)
    generator = torch.Generator().manual_seed(32)
    x = (torch.randn(32, 64, generator=generator) * 3).to(DEVICE, dtype)
    x[16:32, 32:48] = 0.0
    x[0:16, 48:] *= 2.0**-120
    if special is not None:
        x[5, 7] = special
        x[21, 40] = -special
    signs = random_signs(16, 3, offset=5, device=DEVICE)
    assert_pair_equals_separate(x, 32, mode, 16, signs, even=True)
    assert_pair_equals_separate(x, 48, mode, 16, signs, even=False)  # padding tokens


@pytest.mark.parametrize(
    "mode, n, variant", [("sr", 8, "a"), ("sr", 32, "a"), ("sr", 8, "c"), ("sr", 16, "b"),
                         ("rz", 32, "c"), ("rna", 32, "c")]
)  # fmt: skip
def test_other_roundings_equal_separate_quantizations(mode, n, variant, monkeypatch):
    """SR variants a and c with fewer bits (`e2m1_value`), variant b (`general_round`)
    and the directed modes (`fast_round`) give the separate path's bits, whole tiles and
    not."""
    monkeypatch.setattr(two_orientation, "TILE_TOKENS", 16)
    monkeypatch.setattr(two_orientation, "TILE_FEATURES", 32)
    generator = torch.Generator().manual_seed(5)
    x = (torch.randn(32, 64, generator=generator) * 3).to(DEVICE, torch.bfloat16)
    x[3, 40:48] = -0.0  # -0 kept
    signs = random_signs(16, 3, offset=5, device=DEVICE)
    assert_pair_equals_separate(x, 32, mode, 16, signs, n, variant, even=True)
    assert_pair_equals_separate(x[:30], 32, mode, None, None, n, variant, even=False)


@pytest.mark.parametrize("transient", [False, True])
def test_transient_pairs_rewrite_their_own_scales(transient):
    """A transient pair (dy's) writes each call's tensor scales into one buffer of its
    own, with the S_dec views made once; another (x's) makes them new at each call: the
    same bits either way, each call its own x's scales."""
    generator = torch.Generator().manual_seed(9)
    xs = [(torch.randn(32, 32, generator=generator) * scale).to(DEVICE) for scale in (1, 5)]
    row, column = (orientation(E2M1, "sr", 32, "c", 2) for _ in range(2))
    prepared = PreparedTwoOrientations(xs[0], 32, row, column, transient=transient)
    seed, row_offset, column_offset = (torch.tensor([v], device=DEVICE) for v in (7, 11, 13))
    results = []
    for x in xs:
        result = prepared(x, seed, row_offset, column_offset, None)
        _, row_scales = separate(x, 32, "sr", 11, None, None, rotate=False)
        _, column_scales = separate(x, 32, "sr", 13, None, None, rotate=True)
        assert result.scales is not None and result.decodes is not None
        assert torch.equal(result.scales[:2], row_scales)
        assert torch.equal(result.scales[2:], column_scales)
        assert torch.equal(torch.stack(result.decodes), result.scales[0::2])
        results.append(result)
    first, second = results
    assert (first.scales.data_ptr() == second.scales.data_ptr()) is transient
    assert (first.decodes[0] is second.decodes[0]) is transient  # type: ignore[index]


def test_orientation_takes_te_or_pow2_scales_and_pow2_no_records():
    with pytest.raises(ValueError, match="flavour must be 'te' or 'pow2'"):
        orientation(E2M1, "rne", 32, "c", 2, flavour="torchao")
    with pytest.raises(ValueError, match="no record"):
        orientation(E2M1, "rne", 32, "c", 2, record=True, flavour="pow2")
    with pytest.raises(ValueError, match="one flavour"):
        PreparedTwoOrientations(
            torch.zeros(16, 16, device=DEVICE), 16, orientation(E2M1, "rne", 32, "c", 2),
            orientation(E2M1, "rne", 32, "c", 2, flavour="pow2"),
        )  # fmt: skip


def test_orientation_takes_e2m1_elements_only():
    """The pair stores each element times its E4M3 scale as the bf16 holding it exactly,
    which e2m1's products are: another element format is refused by name."""
    with pytest.raises(ValueError, match=r"fmt must be e2m1 .*'e4m3fn'"):
        orientation(find_format("e4m3fn"), "rne", 32, "c", 2)


def per_step_nvfp4() -> srnn.Recipe:
    """nvfp4() with fresh RHT signs at each step (the wgrad GEMM's own stream)."""
    recipe = srnn.nvfp4(seed=5)
    return dataclasses.replace(
        recipe,
        wgrad_grad_output=dataclasses.replace(recipe.wgrad_grad_output, rht_signs="per_step"),
        wgrad_input=dataclasses.replace(recipe.wgrad_input, rht_signs="per_step"),
    )


RECIPES = {
    "nvfp4": lambda: srnn.nvfp4(seed=1),
    "nvfp4_rn": lambda: srnn.nvfp4(stochastic_rounding=False, seed=2),
    "nvfp4_no_rht": lambda: srnn.nvfp4(rht=False, seed=3),
    "nvfp4_1d_weights": lambda: srnn.nvfp4(weight_2d=False, seed=4),
    "nvfp4_per_step": per_step_nvfp4,
    "nvfp4_pow2": lambda: srnn.nvfp4(tensor_scale="pow2", seed=6),
}


def training_steps(recipe: srnn.Recipe, tokens: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """y, dx, dW and db of two steps of a QuantizedLinear(32 -> 48) on ``tokens`` tokens."""
    generator = torch.Generator().manual_seed(tokens)
    layer = srnn.QuantizedLinear(32, 48, dtype=dtype, device=DEVICE, recipe=recipe, layer_index=3)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(48, 32, generator=generator).to(dtype))
        layer.bias.copy_(torch.randn(48, generator=generator).to(dtype))
    results = []
    for _ in range(2):
        x = torch.randn(tokens, 32, generator=generator).to(DEVICE, dtype).requires_grad_()
        y = layer(x)
        y.backward(torch.randn(y.shape, generator=generator).to(DEVICE, dtype))
        assert x.grad is not None and layer.weight.grad is not None and layer.bias.grad is not None
        results += [y.detach(), x.grad, layer.weight.grad.clone(), layer.bias.grad.clone()]
        layer.zero_grad()
    return results


@pytest.mark.usefixtures("no_step_graphs")  # counts the eager route's prepared pairs
@pytest.mark.parametrize("name", sorted(RECIPES))
@pytest.mark.parametrize("tokens", [40, 32])
def test_a_step_with_both_orientations_equals_the_separate_path(name, tokens, monkeypatch, request):
    """The pair path (routed here on the CPU, under the interpreter) gives the separate
    path's y, dx, dW and db bit for bit, and serves x in the forward and dy in the
    backward of each step (made once: the step plan keeps them); 40 tokens pad to 48.
    Tiles of 16 tokens by 32 features, as the compiled kernel's are smaller than its
    tensors: several programs, dy's 48 features ending in a partial tile."""
    dtype = torch.bfloat16
    monkeypatch.setattr(two_orientation, "TILE_TOKENS", 16)
    monkeypatch.setattr(two_orientation, "TILE_FEATURES", 32)
    # pairs prepared at other tiles are not reused, nor these small-tile ones after the test
    orientations.prepared_pair.cache_clear()
    request.addfinalizer(orientations.prepared_pair.cache_clear)
    monkeypatch.setattr(orientations, "SERVES_STEPS", True)
    monkeypatch.setattr(orientations, "use_kernel", lambda *args: False)
    expected = training_steps(RECIPES[name](), tokens, dtype)
    calls = []
    real = orientations.prepared_pair

    def counted(*args):
        calls.append(args[0].role)
        return real(*args)

    served: list[object] = []
    call = orientations.PreparedPair.__call__

    def serving(self, *args):
        served.append(self)
        return call(self, *args)

    monkeypatch.setattr(orientations, "use_kernel", lambda b, n, c, refusal: refusal is None)
    monkeypatch.setattr(orientations, "prepared_pair", counted)
    monkeypatch.setattr(orientations.PreparedPair, "__call__", serving)
    result = training_steps(RECIPES[name](), tokens, dtype)
    # prepared once, for the layer's call signature (its step plan); each serves both steps
    assert calls == ["fprop_input", "dgrad_grad_output"]
    assert len(served) == 4 and len({id(pair) for pair in served}) == 2
    # dy's pair (read within its backward) keeps its tensor scales; x's makes new ones
    kernels = [pair.kernel for pair in served[:2]]  # type: ignore[attr-defined]
    assert [kernel.own_scales is not None for kernel in kernels] == [False, True]
    for got, want in zip(result, expected, strict=True):
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))


# (pair, kernel): (registers, SASS instructions) compiled for sm_90 by Triton 3.6 at the
# default tile (16 elements a thread); before issue 42's rewrite (64 x 64 tiles, 32
# elements a thread, the tile transposed in registers) the dy pair's quantize kernel took
# 252 registers and 6804 instructions, x's 197 and 4371, the amax 64 and 1544; before the
# specialised e2m1 path (the generic rounding, narrowing and masks) dy's took 56 and
# 1973, x's 40 and 1394, the amax 38 and 423
PAIR_BUDGETS = {
    # the staged stores' shared-memory round trip: 71 and 51 instructions more
    ("dy", "quantize"): (56, 1406),
    ("x", "quantize"): (54, 842),
    # the amax launch's last program writes the tensor scales (its partial maxima read in
    # a loop, not unrolled: unrolled, they took 120 registers); its own launch took (32, 501);
    # a program's tiles in a loop (`amax_steps`; unrolled over eight, 177 registers): 56
    # registers, where one tile took 53, the same nine programs a multiprocessor
    ("dy", "amax"): (56, 876),
    ("x", "amax"): (56, 876),
}
# each kernel's tile at the default: the amax launch's takes twice the tokens
PAIR_TILES = {"quantize": "32x64", "amax": "64x64"}
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


@pytest.mark.skipif(
    not triton.__version__.startswith("3.6") or not PTXAS.exists(),
    reason="budgets of Triton 3.6's NVIDIA backend (ptxas, cuobjdump)",
)
def test_pair_kernels_compile_within_their_budgets() -> None:
    """benchmarks/pair_resources.py's offline compile for sm_90: the pair's kernels at the
    default tiles within their registers and SASS instructions, without spills."""
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(root / "src")
    command = [sys.executable, str(root / "benchmarks" / "pair_resources.py")]
    table = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    rows = {tuple(line.split()[:2]): line.split() for line in table.splitlines()[1:]}
    assert sorted(rows) == sorted(PAIR_BUDGETS)
    for key, (registers, instructions) in PAIR_BUDGETS.items():
        _, _, tile, warps, _, regs, spills, sass, stl, ldl, _, _, stores = rows[key]
        assert (tile, warps) == (PAIR_TILES[key[1]], "4"), key
        # the operands' stores coalesced: 16 bytes a thread, neighbouring threads'
        # neighbouring (the staged tiles), not a quarter of a sector an instruction
        assert stores == ("128" if key[1] == "quantize" else "32"), (key, stores)
        assert int(regs) <= registers, (key, regs)
        assert int(sass) <= instructions, (key, sass)
        assert (spills, stl, ldl) == ("0/0", "0", "0"), key


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_given_scales_and_records_give_the_separate_bits_and_the_amaxes(
    dtype: torch.dtype,
) -> None:
    """Orientations that record (a delayed tensor scale's pair): without given scales, the
    bits of the pair that records nothing and its amaxes recorded (the first step's current
    scaling); given both operands' tensor scales, no amax launch and each operand
    `gemm_blocks`' with its scales, the same amaxes recorded, or none (no record given:
    the launch without the atomic maxima), the same bits."""
    x = (torch.randn(40, 32, generator=torch.Generator().manual_seed(3)) * 3).to(dtype)
    x = x.to(DEVICE)
    signs = random_signs(16, 3, device=DEVICE)
    row = orientation(E2M1, "rne", 32, "c", 2, record=True)
    column = orientation(E2M1, "sr", 32, "c", 2, record=True)
    rotation = {"rht": 16, "rht_signs": signs, "rht_bf16": True}
    plain = PreparedTwoOrientations(
        x, 48, row._replace(RECORD=False), column._replace(RECORD=False), **rotation
    )
    recording = PreparedTwoOrientations(x, 48, row, column, **rotation)
    stream = [torch.tensor([value], device=DEVICE) for value in (7, 1, 2)]
    expected = plain(x, *stream, signs)
    record = torch.zeros(2, device=DEVICE)
    first = recording(x, *stream, signs, None, record)
    assert torch.equal(first.row, expected.row) and torch.equal(first.column, expected.column)
    assert torch.equal(record, recording.amax_sink)
    given = torch.tensor([0.5, 2.0, 0.25, 4.0], device=DEVICE)
    again = torch.zeros(2, device=DEVICE)
    pair = recording(x, *stream, signs, given, again)
    assert torch.equal(again, record)
    seed, row_offset, column_offset = stream
    row_values = gemm_blocks(
        x, E2M1, 16, "nvfp4", out_dtype=torch.bfloat16, tensor_scale=given[:2], seed=seed,
        offset=row_offset,
    )  # fmt: skip
    x_t = functional.pad(x.T.contiguous(), (0, 48 - x.shape[0]))
    column_values = gemm_blocks(
        x_t, E2M1, 16, "nvfp4", out_dtype=torch.bfloat16, tensor_scale=given[2:], mode="sr",
        seed=seed, offset=column_offset, **rotation,
    )  # fmt: skip
    assert torch.equal(pair.row, row_values) and torch.equal(pair.column, column_values)
    assert torch.equal(pair.decodes[0], given[0]) and torch.equal(pair.decodes[1], given[2])
    # given scales and no record (the device route's amaxes had already): the same bits
    bare = recording(x, *stream, signs, given, None)
    assert torch.equal(bare.row, row_values) and torch.equal(bare.column, column_values)
    with pytest.raises(ValueError, match="take a record unless scales are given"):
        recording(x, *stream, signs)
    with pytest.raises(ValueError, match=r"record \(scales\) given where"):
        plain(x, *stream, signs, None, record)


@pytest.mark.parametrize("dtype, rht_bf16", [(torch.bfloat16, False), (torch.float16, True)])
@pytest.mark.parametrize("special", [None, float("inf"), float("nan")])
def test_the_amax_launch_alone_gives_the_specs_amaxes(dtype, rht_bf16, special):
    """`PreparedTwoOrientations.amaxes` (the amax launch alone, as a delayed layer's device
    route takes it): x's max |x| and the rotated, padded x^T's, bit for bit the spec's
    pass over each orientation (`amax_history.operand_amax`), infinity included, a NaN
    as a NaN; refused where the orientations have no tensor scales."""
    tokens, features, padded = 40, 32, 48
    generator = torch.Generator().manual_seed(5)
    x = (torch.randn(tokens, features, generator=generator) * 3).to(DEVICE, dtype)
    if special is not None:
        x[9, 3] = special
    signs = random_signs(16, 4, offset=2, device=DEVICE)
    row = orientation(E2M1, "rne", 32, "c", 2, record=True)
    column = orientation(E2M1, "sr", 32, "c", 2, record=True)
    prepared = PreparedTwoOrientations(
        x, padded, row, column, rht=16, rht_signs=signs, rht_bf16=rht_bf16
    )
    got = prepared.amaxes(x, signs)
    plain = SimpleNamespace(rht=None, rht_bf16=False)
    rotated = SimpleNamespace(rht=16, rht_bf16=rht_bf16)
    x_t = functional.pad(x.T.contiguous(), (0, padded - tokens))
    expected = torch.stack([operand_amax(x, plain, None), operand_amax(x_t, rotated, signs)])
    # a NaN amax is NaN (its payload the kernels' canonical one: the spec's fp16 amax
    # reduction leaves another), every other amax bit for bit
    both_nan = got.isnan() & expected.isnan()
    assert torch.equal(got.isnan(), expected.isnan())
    assert torch.equal(got[~both_nan].view(torch.int32), expected[~both_nan].view(torch.int32))
    bare = (orientation(E2M1, "rne", 32, "c", 0) for _ in range(2))
    with pytest.raises(ValueError, match="without tensor scales"):
        PreparedTwoOrientations(x, padded, *bare).amaxes(x, None)
