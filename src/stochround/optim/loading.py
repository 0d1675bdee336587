"""Loading a state_dict into an SR optimizer, its own or a ``torch.optim`` counterpart's.

A checkpoint of ``torch.optim`` loads: a group key it lacks (``rounding``, ``seed``,
``state_dtype`` ...) keeps the constructor's value; the states are cast to the group's
state dtype, to nearest (a one-time conversion: its error, at most half an ulp, does not
accumulate, and it needs no random stream); ``step`` becomes an int64 tensor.  What cannot
continue (``amsgrad=True``, another optimizer's states) raises ValueError at the load.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .checks import IMPLEMENTATION_KEYS
from .encodings import ROUNDING_STATES
from .hooks import OptimizerHooks


class StateDictLoading(OptimizerHooks):
    """`load_state_dict` of `SROptimizer`: checked before anything changes, states cast to
    their dtype and copied."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As torch's, with the states cast to their `state_dtype` and copied, not aliased
        (torch's loader casts every floating state to its parameter's dtype), and step
        counts as 0-d int64 tensors on the parameter's device; a checkpoint of the
        ``torch.optim`` counterpart (or of an older version) loads too: a group key it
        lacks keeps the constructor's value (`loaded_group`), and its states are checked
        and cast (`loaded_state`).  Everything is checked before anything changes: a
        checkpoint that cannot continue raises ValueError and leaves the optimizer as it
        was."""
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                f"the state_dict has {len(saved_groups)} parameter groups, this optimizer "
                f"{len(self.param_groups)}"
            )
        groups, states = [], {}
        for current, saved in zip(self.param_groups, saved_groups, strict=True):
            if len(saved["params"]) != len(current["params"]):
                raise ValueError(
                    f"a parameter group of the state_dict has {len(saved['params'])} "
                    f"parameters, this optimizer's {len(current['params'])}"
                )
            group = self.loaded_group(current, saved)
            groups.append(group)
            for saved_id, param in zip(saved["params"], current["params"], strict=True):
                if saved_id in state_dict["state"]:
                    states[param] = self.loaded_state(group, param, state_dict["state"][saved_id])
        super().load_state_dict({**state_dict, "param_groups": groups, "state": {}})
        for param, state in states.items():
            self.state[param] = state

    def loaded_group(self, current: dict[str, Any], saved: dict[str, Any]) -> dict[str, Any]:
        """The group ``saved`` (of a state_dict) over ``current``: the saved keys, except
        torch.optim's `IMPLEMENTATION_KEYS` (options of the whole optimizer here), over the
        constructor's (``current``); checked as a new group is."""
        group = {key: value for key, value in current.items() if key != "params"}
        group.update((k, v) for k, v in saved.items() if k not in IMPLEMENTATION_KEYS)
        self.check_group(group)
        return group

    def loaded_state(
        self, group: dict[str, Any], param: Tensor, saved: dict[str, Any]
    ) -> dict[str, Any]:
        """The state of ``param`` from its ``saved`` state: ``step`` (an int, or a tensor of
        any dtype as torch.optim saves it) as a 0-d int64 tensor, the optimizer's states
        cast to nearest in the `state_dtype`, the extra parameter states as saved, all on
        the parameter's device; None entries (an unused momentum buffer) dropped.
        ValueError for a state this optimizer does not keep."""
        known = ("step", *self.state_names, "master", *ROUNDING_STATES.values())
        unknown = sorted(name for name in saved if name not in known)
        if unknown:
            raise ValueError(
                f"the state_dict holds states {unknown}, which {type(self).__name__} does not "
                f"keep (it keeps {list(known)}): a checkpoint of another optimizer, or of "
                "options it does not support?"
            )
        state = {}
        for name, value in saved.items():
            if value is None:
                continue
            if name == "step":  # an int in checkpoints written before steps were tensors
                step = torch.as_tensor(value)
                if step.numel() != 1 or (step.is_floating_point() and bool(step != step.trunc())):
                    raise ValueError(f"a saved step count must be one integer, got {value!r}")
                value = step.to(device=param.device, dtype=torch.int64, copy=True).reshape(())
            elif name in self.state_names:
                dtype = self.state_dtype(group, param)
                value = value.to(device=param.device, dtype=dtype, copy=True)
            elif isinstance(value, Tensor):
                value = value.to(device=param.device, copy=True)
            state[name] = value
        return state


__all__ = ["StateDictLoading"]
