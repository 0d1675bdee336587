"""Llama 3's attention on the CPU: torchtitan's document mask, run by SDPA.

torchtitan's language models attend through FlexAttention (each token sees the earlier
tokens of its own document, the mask built from the positions), whose backward PyTorch
does not run on the CPU.  `DenseMaskAttention` is a FlexAttention that evaluates the same
mask (the ``BlockMask``'s ``mask_mod``, element by element) into a boolean matrix and
calls ``scaled_dot_product_attention``: the same attention, slower, with a backward on
every device.  `dense_attention` swaps it into a model config: what ``stochround titan``
does on the CPU, and what the tests train.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, create_mask
from torchtitan.models.common.attention import FlexAttention


class DenseMaskAttention(FlexAttention):
    """FlexAttention's masked attention computed by SDPA on a dense boolean mask."""

    @dataclass(kw_only=True, slots=True)
    class Config(FlexAttention.Config):
        pass

    def forward(  # type: ignore[override]
        self,
        q_BLNH: torch.Tensor,
        k_BLNH: torch.Tensor,
        v_BLNH: torch.Tensor,
        *,
        attention_masks: BlockMask,
        score_mod: Any = None,
        scale: float | None = None,
        enable_gqa: bool = False,
        out_transform: Any = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        if score_mod is not None or out_transform is not None:
            raise ValueError(
                "DenseMaskAttention runs plain masked attention: score_mod and out_transform "
                "must be None"
            )
        q, k, v = (t.transpose(1, 2) for t in (q_BLNH, k_BLNH, v_BLNH))
        batch, _, length, _ = q.shape
        mask = create_mask(
            attention_masks.mask_mod, batch, None, length, k.shape[2], device=q.device
        )
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa
        )
        return out.transpose(1, 2)


def dense_attention(model_config: Any) -> Any:
    """``model_config`` with each ``FlexAttention.Config`` replaced, in place, by a
    `DenseMaskAttention.Config` of the same fields; returns it."""
    for _, config, parent, attr in model_config.traverse(FlexAttention.Config):
        if isinstance(config, DenseMaskAttention.Config):
            continue
        values = {f.name: getattr(config, f.name) for f in fields(config) if f.init}
        new = DenseMaskAttention.Config(**values)
        if parent is None:
            model_config = new
        elif isinstance(parent, list):
            parent[attr] = new  # type: ignore[index]
        else:
            setattr(parent, attr, new)  # type: ignore[arg-type]
    return model_config


__all__ = ["DenseMaskAttention", "dense_attention"]
