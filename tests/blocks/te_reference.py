"""Transformer Engine's own NVFP4 reference quantizer, loaded from its source file.

``transformer_engine`` (the dev extra's pure-Python package) is not imported: its
``__init__`` loads CUDA libraries.  `load` reads ``pytorch/custom_recipes/reference_nvfp4.py``
and ``reference_utils.py`` from the installed package folder, with minimal stand-ins for
the modules they import (``quantized_tensor``'s ``Quantizer`` and ``QuantizedTensorStorage``
base classes, ``tensor.utils``'s ``is_custom`` for ``custom_recipes/gemm.py``, loaded
from its file too),
placed in ``sys.modules`` only while the files load.  `te_quantize` calls its
``NVFP4QuantizerRef._quantize_blockwise_reference`` (round to nearest).
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from helpers import module_from_file

RECIPES = ("transformer_engine", "pytorch", "custom_recipes")
TE_VERSION = "2.20.2"


def recipes_folder() -> Path | None:
    """The installed ``transformer_engine/pytorch/custom_recipes`` folder, or None."""
    spec = importlib.util.find_spec(RECIPES[0])
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))).joinpath(*RECIPES[1:])
    return folder if (folder / "reference_nvfp4.py").is_file() else None


def _stub(name: str, **attributes: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    return module


class Quantizer:
    """Stand-in for ``transformer_engine.pytorch.quantized_tensor.Quantizer``."""

    def __init__(self, *, rowwise: bool = True, columnwise: bool = True) -> None:
        self.rowwise_usage = rowwise
        self.columnwise_usage = columnwise


class QuantizedTensorStorage:
    """Stand-in for ``transformer_engine.pytorch.quantized_tensor.QuantizedTensorStorage``."""


def _is_custom(tensor: object) -> bool:
    """Stand-in for ``transformer_engine.pytorch.tensor.utils.is_custom`` (``gemm.py``)."""
    return bool(getattr(tensor, "custom", False))


@functools.cache
def load() -> types.ModuleType:
    """TE's ``reference_nvfp4`` module, loaded from its file; skips the test (with the
    reason) where transformer_engine is not installed."""
    folder = recipes_folder()
    if folder is None:
        pytest.skip(f"transformer_engine=={TE_VERSION} (the dev extra) is not installed")
    package = ".".join(RECIPES)
    stubs = {
        RECIPES[0]: _stub(RECIPES[0], __path__=[]),
        ".".join(RECIPES[:2]): _stub(".".join(RECIPES[:2]), __path__=[]),
        package: _stub(package, __path__=[]),
        f"{RECIPES[0]}.pytorch.quantized_tensor": _stub(
            "quantized_tensor", Quantizer=Quantizer, QuantizedTensorStorage=QuantizedTensorStorage
        ),
        f"{RECIPES[0]}.pytorch.tensor": _stub("tensor", __path__=[]),
        f"{RECIPES[0]}.pytorch.tensor.utils": _stub("utils", is_custom=_is_custom),
    }
    # the stand-ins live in sys.modules only while the files load
    with mock.patch.dict(sys.modules, stubs):
        utils = module_from_file(f"{package}.reference_utils", folder / "reference_utils.py")
        stubs[package].reference_utils = utils
        stubs[package].gemm = module_from_file(f"{package}.gemm", folder / "gemm.py")
        return module_from_file(f"{package}.reference_nvfp4", folder / "reference_nvfp4.py")


def te_global_amax(x: torch.Tensor) -> torch.Tensor:
    """The tensor amax TE's reference quantizer passes: ``torch.max(torch.abs(x))`` in
    fp32, shape (1,)."""
    return torch.max(torch.abs(x)).to(torch.float32).view(1)


def te_quantize(
    x: torch.Tensor, tile: tuple[int, int] = (1, 16), global_amax: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """TE's reference NVFP4 quantization (RN) of a 2-D x in ``tile`` (1x16 or 16x16)
    tiles: the packed e2m1 codes (uint8, two a byte, low nibble first) and the E4M3 block
    scales as uint8 codes, one a 1x16 block (16x16 tiles: repeated for each of its rows)."""
    reference = load()
    amax = te_global_amax(x) if global_amax is None else global_amax
    codes, block_scales = reference.NVFP4QuantizerRef._quantize_blockwise_reference(
        x, amax, tile[1], tile[0], pow_2_scales=False, eps=0.0
    )
    return codes, block_scales.view(torch.uint8)
