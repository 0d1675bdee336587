"""The language-model experiment's model: a byte-level decoder-only transformer of
nanoGPT's shape (`GPT`), its size (`parameter_count`) and its initial weights
(`build_model`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .lm_data import VOCAB
from .lm_rows import Sizes


class SelfAttention(nn.Module):
    """Causal multi-head self-attention: one qkv Linear, `F.scaled_dot_product_attention`
    with ``is_causal=True``, one output projection Linear."""

    def __init__(self, d_model: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=-1)
        q, k, v = (t.view(batch, length, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, length, width))


class TransformerBlock(nn.Module):
    """A pre-LayerNorm transformer block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``
    with the MLP ``fc2(gelu(fc(x)))``, 4 d_model wide."""

    def __init__(self, d_model: int, n_head: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, n_head)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model, bias=False)
        self.fc2 = nn.Linear(4 * d_model, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """The byte-level decoder-only transformer: ``forward(idx)`` maps int64 bytes ``(batch,
    length)``, length <= context, to logits ``(batch, length, 256)``."""

    def __init__(self, d_model: int, n_layer: int, n_head: int, context: int) -> None:
        super().__init__()
        if d_model % n_head:
            raise ValueError(f"n_head must divide d_model; got {n_head} and {d_model}")
        self.context = context
        self.tok = nn.Embedding(VOCAB, d_model)
        self.pos = nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList(TransformerBlock(d_model, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, VOCAB, bias=False)

    def forward(self, idx: Tensor) -> Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def parameter_count(d_model: int, n_layer: int, context: int) -> int:
    """The parameters of `GPT`: ``2 V d + C d`` (token embedding, lm_head, positions; V =
    256, C the context) ``+ n_layer (12 d^2 + 4 d)`` (qkv 3 d^2, projection d^2, MLP 8 d^2,
    two LayerNorms 4 d) ``+ 2 d`` (the final LayerNorm)."""
    d = d_model
    return 2 * VOCAB * d + context * d + n_layer * (12 * d * d + 4 * d) + 2 * d


def build_model(sizes: Sizes, generator: torch.Generator) -> GPT:
    """A `GPT` of ``sizes`` with weights N(0, 0.02) drawn from ``generator`` in fp32 (the
    residual projections' 0.02 / sqrt(2 n_layer); LayerNorms 1 and 0), on the CPU, in
    fp32."""
    with torch.device("meta"):
        model = GPT(sizes.d_model, sizes.n_layer, sizes.n_head, sizes.context)
    model = model.to_empty(device="cpu")
    residual_std = 0.02 / math.sqrt(2 * sizes.n_layer)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.ndim == 1:  # LayerNorm: weight 1, bias 0
                parameter.fill_(1.0 if name.endswith("weight") else 0.0)
                continue
            residual = name.endswith("proj.weight") or name.endswith("fc2.weight")
            std = residual_std if residual else 0.02
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * std)
    return model


__all__ = ["GPT", "build_model", "parameter_count"]
