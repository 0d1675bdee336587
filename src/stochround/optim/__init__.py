"""Optimizers whose parameters and states may live in bf16/fp16, with SR on every store.

The update is computed in float32 (`updates`) and each store into a low-precision tensor
(the parameter and each state) is rounded by ``rounding``
("sr", "rne", "kahan": compensated summation, "ecc": bf16 + int8 residual);
``master_weights=True`` keeps an fp32 master copy instead. Optimizers: AdamW, Adam, SGD, Lion.
On CUDA one fused Triton launch updates a group's parameters (`stochround.kernels.optim`),
bit-identical to the PyTorch path on CPU or CUDA given the seed.
"""

from .base import ROUNDINGS, STATE_DTYPES, state_stream_offset
from .optimizers import SGD, Adam, AdamW, Lion

__all__ = ["ROUNDINGS", "SGD", "STATE_DTYPES", "Adam", "AdamW", "Lion", "state_stream_offset"]
