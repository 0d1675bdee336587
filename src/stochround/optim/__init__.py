"""Optimizers whose parameters and states may live in bf16/fp16, with SR on every store.

The PyTorch path (CPU and CUDA, eager). The update is computed in float32 and each store
into a low-precision tensor (the parameter and each state) is rounded by ``rounding``.
"""

from .base import ROUNDINGS, STATE_DTYPES, stream_offset
from .optimizers import SGD, AdamW

__all__ = ["ROUNDINGS", "SGD", "STATE_DTYPES", "AdamW", "stream_offset"]
