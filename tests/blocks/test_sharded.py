"""Block quantization of DTensors on two ranks, bit for bit against the unsharded call.

Each case quantizes a tensor whole on every rank and as a DTensor (`Shard(0)`, or
`Replicate`): the codes, scales and tensor scale (``full_tensor()``, compared as integer
views), the dequantized values and `fake_quantize` (values and straight-through gradient)
must equal the whole tensor's.  The cases: NVFP4 with its tensor scale from the global
amax (1-D blocks, 16x16 tiles with shard rows on tile boundaries, SR with a 16-point RHT),
MXFP8 and MXFP4 (SR), int8 row-wise, a 3-D tensor quantized along its middle axis, unequal
shards, an empty shard, a NaN in one shard, bf16, replicated, swizzled scales.  Then the
refusals, raised alike on both ranks: tiles straddling a shard boundary, `Shard(1)`, blocks
along the sharded axis, swizzled scales that are no chunks of the whole's, SR without a
seed.

Every case runs in one spawn of the ranks (`ranks.run_ranks`).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from ranks import bits, devices, run_ranks

import stochround as sr

SEED = 11

# name: (shape, dtype, placement ("shard0" or "replicate"), quantize options)
CASES: dict[str, tuple[tuple[int, ...], torch.dtype, str, dict[str, Any]]] = {
    "nvfp4": ((64, 64), torch.float32, "shard0", {"fmt": "nvfp4"}),
    "nvfp4_tiles": ((64, 32), torch.float32, "shard0", {"fmt": "nvfp4", "block": (16, 16)}),
    "nvfp4_sr_rht": (
        (32, 64),
        torch.bfloat16,
        "shard0",
        {"fmt": "nvfp4", "mode": "sr", "seed": SEED, "rht": 16, "rht_bf16": True},
    ),
    "mxfp8": ((16, 64), torch.float32, "shard0", {"fmt": "mxfp8_e4m3"}),
    "mxfp4_sr": ((7, 64), torch.bfloat16, "shard0", {"fmt": "mxfp4", "mode": "sr", "seed": SEED}),
    "int8_rowwise": ((10, 48), torch.float32, "shard0", {"fmt": "int8_rowwise"}),
    "int8_sr_rbits": (
        (6, 40),
        torch.float32,
        "shard0",
        {"fmt": "int8_rowwise", "mode": "sr", "seed": SEED, "rbits": 8},
    ),
    "mxfp4_axis1": ((4, 32, 6), torch.float32, "shard0", {"fmt": "mxfp4", "axis": 1}),
    "nvfp4_3d_tiles": ((2, 32, 16), torch.float32, "shard0", {"fmt": "nvfp4", "block": (16, 16)}),
    "nvfp4_replicate": (
        (16, 32),
        torch.float32,
        "replicate",
        {"fmt": "nvfp4", "mode": "sr", "seed": SEED},
    ),
    "nvfp4_empty_shard": ((1, 32), torch.float32, "shard0", {"fmt": "nvfp4"}),  # rank 1: no rows
    "mxfp8_swizzle": ((256, 64), torch.float32, "shard0", {"fmt": "mxfp8_e4m3", "swizzle": True}),
}

# name: (shape, placement, quantize options, words the message holds)
REFUSALS: dict[str, tuple[tuple[int, ...], str, dict[str, Any], tuple[str, ...]]] = {
    "tiles_straddle": (
        (48, 32),
        "shard0",
        {"fmt": "nvfp4", "block": (16, 16)},
        ("must not straddle shards", "rows 0..24 of 48"),
    ),
    "shard1": ((16, 64), "shard1", {"fmt": "mxfp4"}, ("Replicate or Shard(0)", "Shard(dim=1)")),
    "block_axis": ((64, 16), "shard0", {"fmt": "mxfp4", "axis": 0}, ("axis 0",)),
    "vector": ((64,), "shard0", {"fmt": "mxfp4"}, ("axis 0",)),
    "swizzle": ((64, 64), "shard0", {"fmt": "mxfp8_e4m3", "swizzle": True}, ("scale rows 0..32",)),
    "sr_unseeded": ((16, 32), "shard0", {"fmt": "mxfp4", "mode": "sr"}, ("needs seed=",)),
}


def same(first: torch.Tensor | None, second: torch.Tensor | None) -> bool:
    if first is None or second is None:
        return first is None and second is None
    return first.shape == second.shape and torch.equal(bits(first), bits(second))


def values(shape: tuple[int, ...], dtype: torch.dtype, device: str) -> torch.Tensor:
    """The same values on every rank: normal values spread over 2**±6, with a large one
    in the last row (its shard alone sets the tensor's amax)."""
    generator = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=generator) * 2.0 ** torch.randint(
        -6, 7, shape, generator=generator
    )
    x.view(-1)[-1] = 3000.0
    return x.to(dtype).to(device)


def placed(x: torch.Tensor, placement: str) -> Any:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh(x.device.type, (torch.distributed.get_world_size(),))
    chosen = {"shard0": Shard(0), "shard1": Shard(1), "replicate": Replicate()}[placement]
    return distribute_tensor(x, mesh, [chosen])


def case_outcome(x: torch.Tensor, placement: str, options: dict[str, Any]) -> dict[str, bool]:
    """Whether each output of the sharded call equals the whole call's."""
    options = dict(options)
    fmt = options.pop("fmt")
    whole = sr.blocks.quantize(x, fmt, **options)
    sharded = sr.blocks.quantize(placed(x, placement), fmt, **options)
    outcome = {
        "codes": same(sharded.codes, whole.codes),
        "scales": same(sharded.scales, whole.scales),
        "tensor_scale": same(sharded.tensor_scale, whole.tensor_scale),
        "fields": (sharded.shape, sharded.scale_shape, sharded.axis)
        == (whole.shape, whole.scale_shape, whole.axis),
        "placed": type(sharded.codes).__name__ == "DTensor",
        "dequantize": same(sharded.dequantize(), whole.dequantize()),
    }
    if options.get("rht"):
        outcome["unrotate"] = same(
            sharded.dequantize(unrotate=True), whole.dequantize(unrotate=True)
        )
    if not options.pop("swizzle", False):
        grad = torch.linspace(-1, 1, x.numel(), device=x.device).reshape(x.shape).to(x.dtype)
        leaf = x.clone().requires_grad_()
        fake = sr.blocks.fake_quantize(leaf, fmt, clip_mask=True, **options)
        fake.backward(grad)
        sharded_leaf = placed(x, placement).requires_grad_()
        sharded_fake = sr.blocks.fake_quantize(sharded_leaf, fmt, clip_mask=True, **options)
        sharded_fake.backward(placed(grad, placement))
        assert leaf.grad is not None and sharded_leaf.grad is not None
        outcome["fake_quantize"] = same(sharded_fake, fake)
        outcome["fake_quantize_grad"] = same(sharded_leaf.grad, leaf.grad)
        # the fake-quantized values are the dequantized ones
        outcome["fake_is_dequantized"] = same(fake, whole.dequantize(x.dtype, unrotate=True))
    return outcome


def sharded_body(rank: int, world_size: int, device: str) -> dict[str, Any]:
    outcome: dict[str, Any] = {}
    for name, (shape, dtype, placement, options) in CASES.items():
        x = values(shape, dtype, device)
        for what, ok in case_outcome(x, placement, options).items():
            outcome[f"{name}/{what}"] = ok
    # a NaN in rank 0's shard alone sets the whole's tensor scale (its amax is NaN): rank
    # 1's must be the same
    x = values((32, 32), torch.float32, device)
    clean = sr.blocks.quantize(x, "nvfp4").tensor_scale
    x[3, 5] = float("nan")
    for what, ok in case_outcome(x, "shard0", {"fmt": "nvfp4"}).items():
        outcome[f"nvfp4_nan/{what}"] = ok
    outcome["nvfp4_nan/sets_scale"] = not same(sr.blocks.quantize(x, "nvfp4").tensor_scale, clean)
    for name, (shape, placement, options, _) in REFUSALS.items():
        options = dict(options)
        fmt = options.pop("fmt")
        x = placed(values(shape, torch.float32, device), placement)
        try:
            sr.blocks.quantize(x, fmt, **options)
            outcome[f"refused/{name}"] = "not raised"
        except ValueError as error:
            outcome[f"refused/{name}"] = str(error)
    return outcome


@pytest.mark.parametrize("device", devices())
def test_sharded_quantize_equals_whole(device: str) -> None:
    results = run_ranks(sharded_body, device=device)
    for rank, outcome in enumerate(results):
        failed = [
            key for key, ok in outcome.items() if not key.startswith("refused/") and ok is not True
        ]
        assert not failed, f"rank {rank}: {failed}"
        for name, (_, _, _, words) in REFUSALS.items():
            message = outcome[f"refused/{name}"]
            assert all(word in message for word in words), f"rank {rank} {name}: {message}"
