"""`BlockTensor` as a user handles it: a short repr, == as bitwise equality, no hash,
``to(device)``, and torch.save / torch.load(weights_only=True)."""

from __future__ import annotations

import io
import math
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from stochround import blocks
from stochround import format as find_format

ALL = list(blocks.BLOCK_FORMATS)
E8M0 = find_format("e8m0")
# a format of the caller's own: e3m2 elements in blocks of 8 under a ceil E8M0 scale
OWN = blocks.BlockFormat("own", find_format("e3m2"), 8, E8M0, "ceil")


def _x(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_repr_is_one_short_line_whatever_the_tensors_size() -> None:
    q = blocks.quantize(_x(512, 1024), "nvfp4")
    text = repr(q)
    assert "\n" not in text and len(text) < 200
    assert text.startswith("BlockTensor(nvfp4, shape=[512, 1024], dtype=float32, axis=1, ")
    assert "codes=uint8[512, 512]" in text and "scales=float8_e4m3fn[512, 64]" in text
    assert "tensor_scale=" in text and text.endswith("device=cpu)")
    assert str(q) == text
    rotated = blocks.quantize(_x(4, 256), "mxfp4", rht=32, swizzle=True)
    assert "rht=32" in repr(rotated) and "swizzled" in repr(rotated)


def test_equality_is_bitwise_and_a_block_tensor_is_not_hashable() -> None:
    x = _x(4, 64)
    q = blocks.quantize(x, "mxfp4", "sr", seed=1)
    assert q == blocks.quantize(x, "mxfp4", "sr", seed=1)
    assert (q != blocks.quantize(x, "mxfp4", "sr", seed=1)) is False
    assert q != blocks.quantize(x, "mxfp4", "sr", seed=2)
    assert q != blocks.quantize(x, "mxfp4", "sr", seed=1, scale_rule="floor-3/4")
    assert q != "q" and q != x
    with pytest.raises(TypeError, match="unhashable"):
        hash(q)
    # NaN codes compare equal bit for bit (tensor == would say no), -0.0 differs from 0.0
    nan = x.clone()
    nan[0, 0] = math.nan
    assert blocks.quantize(nan, "mxfp8_e4m3") == blocks.quantize(nan, "mxfp8_e4m3")
    signed = torch.zeros(1, 32)
    negative = blocks.quantize(-signed, "mxfp8_e4m3")
    assert negative.codes.view(torch.uint8)[0, 0].item() == 0x80
    assert negative != blocks.quantize(signed, "mxfp8_e4m3")
    assert blocks.quantize(x, "nvfp4") != blocks.quantize(x, "nvfp4", tensor_scale=0.5)


def test_to_moves_every_tensor_and_refuses_a_dtype() -> None:
    q = blocks.quantize(_x(4, 64), "nvfp4", rht=16)
    moved = q.to("meta")
    assert moved.device == torch.device("meta")
    for tensor in (moved.codes, moved.scales, moved.tensor_scale, moved.rht_signs):
        assert tensor is not None and tensor.device.type == "meta"
    assert (moved.format, moved.shape, moved.axis, moved.rht) == (q.format, q.shape, q.axis, 16)
    assert q.to(torch.device("cpu")) == q
    with pytest.raises(TypeError, match=r"BlockTensor.to takes a device .* dequantize\(dtype\)"):
        q.to(torch.float16)  # type: ignore[arg-type]


CASES = {
    **{name: {"fmt": name} for name in ALL},
    "own": {"fmt": OWN},
    "nvfp4-tiles": {"fmt": "nvfp4", "block": (16, 16)},
    "mxfp4-rht-swizzled": {"fmt": "mxfp4", "rht": 32, "swizzle": True, "mode": "sr", "seed": 3},
    "mxint8-axis0": {"fmt": "mxint8", "axis": 0},
    "bf16-int8": {"fmt": "int8_rowwise", "dtype": torch.bfloat16},
}


@pytest.mark.parametrize("case", list(CASES))
def test_torch_save_and_a_weights_only_load_round_trip(case: str) -> None:
    options = dict(CASES[case])
    dtype = options.pop("dtype", torch.float32)
    q = blocks.quantize(_x(32, 64).to(dtype), **options)
    buffer = io.BytesIO()
    torch.save(q, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    assert isinstance(loaded, blocks.BlockTensor) and loaded == q
    assert loaded.format == q.format and loaded.format.name == q.format.name
    assert torch.equal(loaded.dequantize(), q.dequantize())


def test_a_fresh_process_loads_a_saved_block_tensor_with_weights_only(tmp_path: Path) -> None:
    """Importing stochround registers the one function the pickle calls as a safe global:
    torch.load's default (weights_only=True) reads the file in a new process."""
    q = blocks.quantize(_x(4, 64), "nvfp4", "sr", seed=5)
    path = tmp_path / "q.pt"
    torch.save({"q": q, "step": 3}, path)
    script = (
        "import sys, torch, stochround\n"
        f"state = torch.load({str(path)!r})\n"
        "q = state['q']\n"
        "print(type(q).__name__, q.format.name, state['step'], float(q.dequantize().sum()))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=300
    )
    name, fmt, step, total = done.stdout.split()
    assert (name, fmt, step) == ("BlockTensor", "nvfp4", "3")
    assert float(total) == float(q.dequantize().sum())


@pytest.mark.parametrize("weights_only", [True, False])
def test_a_file_that_names_the_rebuild_in_its_old_module_still_loads(weights_only: bool) -> None:
    """Files saved before `rebuild_block_tensor` moved to `blocks.tensor` name it in
    `blocks.quantize`: both names load."""
    q = blocks.quantize(_x(4, 64), "nvfp4", "sr", seed=5)
    buffer = io.BytesIO()
    torch.save(q, buffer)
    new = b"stochround.blocks.tensor\nrebuild_block_tensor"
    old = b"stochround.blocks.quantize\nrebuild_block_tensor"
    saved = io.BytesIO()
    with zipfile.ZipFile(buffer) as source, zipfile.ZipFile(saved, "w") as target:
        for entry in source.infolist():
            data = source.read(entry)
            if entry.filename.endswith("data.pkl"):
                assert new in data
                data = data.replace(new, old)
            target.writestr(entry, data)
    saved.seek(0)
    assert torch.load(saved, weights_only=weights_only) == q
