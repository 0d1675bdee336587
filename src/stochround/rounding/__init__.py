"""The user entry points `round`, `cast`, `encode` and `decode`: their checks (`checks`),
the one dispatch point between the PyTorch path and the Triton kernels (`route`), the
`stochround::round` custom op (`op`), DTensor inputs (`dtensor`), the entry points
themselves (`entry`), and a rounding prepared once for many calls (`prepared`: its choices
checked and routed once, each call's tensor rounded by its path directly).

A call's choices are checked and routed once per set of them (`route.call_route`, cached),
its per-call values (seed, offset, rand, index_offset) on every call.  The route picks the
backend: ``backend="auto"`` uses the Triton kernels (`stochround.kernels.rounding`) for
CUDA tensors they support and the PyTorch path (`stochround.torch_path`) otherwise;
hardware presets (``hardware=``) round on the PyTorch path.  Calls under `torch.compile`,
for autograd or on DTensors go through the custom op, whose body routes them the same way.
"""

from .checks import (
    NAN_POLICIES,
    check_input,
    check_input_state,
    check_rand_values,
    check_request,
)
from .entry import (
    CAST_DTYPES,
    cast,
    decode,
    encode,
    preset_operand,
    round,  # noqa: A004 - the public name users type, shadowing the builtin on purpose
    round_float64,
    round_preset,
)

__all__ = [
    "CAST_DTYPES",
    "NAN_POLICIES",
    "cast",
    "check_input",
    "check_input_state",
    "check_rand_values",
    "check_request",
    "decode",
    "encode",
    "preset_operand",
    "round",
    "round_float64",
    "round_preset",
]
