"""The SR optimizers' parameter numbering under pipeline parallelism (both torchtitan APIs).

An SR optimizer draws each store's words from ``(seed, step, param_index, tensor slot)``
(`stochround.optim.streams`), ``param_index`` being the parameter's position in the
optimizer.  torchtitan builds one optimizer per model part (a pipeline stage) and the
stochround config gives each the run's seed, so the parts' own positions (0, 1, ... in
each) would give the first parameters of every stage the same words: rounding errors
correlated across the model's layers.

The decision (docs/guide/integrations.md): each part's SR optimizer numbers its parameters
as the optimizer of the whole model (one part) numbers them.  torchtitan splits a model by
copying the whole model and deleting the other stages' modules, so before the split the
pipelining function marks the whole model (`record_parameter_order`): each module keeps
the whole-model positions of its trainable parameters, the root their names.  The copies
keep the marks; `number_pipeline_parts` then gives each part's SR optimizer
(`stochround.optim.SROptimizer.set_param_indices`) the index each parameter has in the
one-part build, found by the container's own rule (the configs' patterns in order, first
match wins: `whole_model_numbering`), counted across the run's optimizers, so that two SR
optimizers of one run (one seed, one stream domain) never share an index either.  So a
pipelined run draws the words of the run without pipelining, parameter for parameter,
whatever the stages,
their count or their placement on ranks: distinct parameters draw distinct words, and a
run compares (or resumes) bit for bit across pipeline layouts.  A model the pipelining
function did not mark (no pipeline parallelism) keeps its positions where one optimizer
takes it all (its words as before), and is marked here and numbered across its
optimizers where the rules name two or more.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from torch import nn
from torch.optim import Optimizer

from ...optim.base import SROptimizer
from .sr_optimizers import SR_OPTIMIZERS

# what `record_parameter_order` sets: on each module, its trainable parameters' (direct,
# by local name) positions in the whole model; on the root, the whole model's names
POSITIONS_ATTRIBUTE = "stochround_parameter_positions"
NAMES_ATTRIBUTE = "stochround_parameter_names"


def record_parameter_order(model: nn.Module) -> None:
    """Mark the whole ``model`` (module docstring): its trainable parameters numbered in
    ``named_parameters`` order (each shared parameter once), as torchtitan's optimizer
    container walks them."""
    names: list[str] = []
    seen: set[int] = set()
    for prefix, module in model.named_modules():
        positions: dict[str, int] = {}
        for local_name, param in module.named_parameters(recurse=False):
            if id(param) in seen or not param.requires_grad:
                continue
            seen.add(id(param))
            positions[local_name] = len(names)
            names.append(f"{prefix}.{local_name}" if prefix else local_name)
        setattr(module, POSITIONS_ATTRIBUTE, positions)
    setattr(model, NAMES_ATTRIBUTE, tuple(names))


def recording_pipeline(pipelining_fn: Callable[..., Any]) -> Callable[..., Any]:
    """torchtitan's ``pipelining_fn`` (its model spec's or train spec's) that first marks
    the whole model it splits (`record_parameter_order`)."""

    @functools.wraps(pipelining_fn)
    def pipeline(model: nn.Module, *args: Any, **kwargs: Any) -> Any:
        record_parameter_order(model)
        return pipelining_fn(model, *args, **kwargs)

    return pipeline


def whole_model_numbering(
    names: Sequence[str], rules: Sequence[tuple[str, str]]
) -> list[tuple[str, int] | None]:
    """For each whole-model parameter ``names[i]``: the name of its optimizer and its
    stream index (None: no rule takes it).  ``rules`` are the config's ``(pattern,
    optimizer name)`` in order: a name goes to the first pattern it matches
    (``re.search``), as torchtitan's container builds its groups; the indices count the
    rules' parameters in rule order, each rule's in model order, across every optimizer
    name, so that two optimizers of one run (their words keyed alike: one seed, the
    optimizers' one stream domain) never give two parameters one index, and one
    optimizer's indices are its own parameters' positions (unchanged words)."""
    numbering: list[tuple[str, int] | None] = [None] * len(names)
    count = 0
    for pattern, optimizer_name in rules:
        regex = re.compile(pattern)
        for position, name in enumerate(names):
            if numbering[position] is None and regex.search(name):
                numbering[position] = (optimizer_name, count)
                count += 1
    return numbering


def part_positions(part: nn.Module) -> dict[int, int]:
    """The whole-model position of each of ``part``'s marked parameters, by ``id``: read
    by module and local name, which survive torchtitan's copy of the whole model and the
    wrappers its ``parallelize`` adds (FSDP2, activation checkpointing, compile)."""
    positions: dict[int, int] = {}
    for module in part.modules():
        marks = getattr(module, POSITIONS_ATTRIBUTE, {})
        for local_name, param in module.named_parameters(recurse=False):
            if local_name in marks:
                positions[id(param)] = marks[local_name]
    return positions


def whole_model_names(part: nn.Module) -> tuple[str, ...] | None:
    """The whole model's parameter names that ``part`` carries, None when it has no mark
    (a model the pipelining function did not split)."""
    for module in part.modules():
        names = getattr(module, NAMES_ATTRIBUTE, None)
        if names is not None:
            return tuple(names)
    return None


def number_pipeline_parts(
    model_parts: Sequence[nn.Module],
    optimizers: Iterable[Optimizer],
    rules: Sequence[tuple[str, str]],
) -> None:
    """Give each SR optimizer among ``optimizers`` (built by torchtitan's container over
    ``model_parts`` by ``rules``: `whole_model_numbering`) the one-part build's numbering
    of its parameters, where its part is marked, or where the rules name two optimizers
    (an unmarked part then marked as a whole model: module docstring).  ValueError when a
    parameter has no mark or the whole model's rules give it to another optimizer (a
    pattern that matches the part's wrapped names otherwise): its words would not be the
    one-part run's, and might be another parameter's."""
    for optimizer in optimizers:
        if not isinstance(optimizer, SROptimizer):
            continue
        params = [param for group in optimizer.param_groups for param in group["params"]]
        held = {id(param) for param in params}
        part = next(p for p in model_parts if any(id(q) in held for q in p.parameters()))
        names = whole_model_names(part)
        if names is None:
            if len({name for _, name in rules}) < 2:
                continue  # one optimizer, unsplit: its positions are its indices
            record_parameter_order(part)  # one part, two optimizers: numbered across both
            names = whole_model_names(part)
            assert names is not None
        positions = part_positions(part)
        numbering = whole_model_numbering(names, rules)
        name = next(key for key, cls in SR_OPTIMIZERS.items() if type(optimizer) is cls)
        indices = []
        for param in params:
            position = positions.get(id(param))
            entry = None if position is None else numbering[position]
            if entry is None or entry[0] != name:
                where = "no mark" if position is None else f"{names[position]!r}"
                raise ValueError(
                    f"a parameter of a pipeline stage ({where}) is not the whole model's "
                    f"parameter of {name}: its optimizer words cannot be the one-part run's"
                )
            indices.append(entry[1])
        optimizer.set_param_indices(indices)


__all__ = [
    "NAMES_ATTRIBUTE",
    "POSITIONS_ATTRIBUTE",
    "number_pipeline_parts",
    "part_positions",
    "record_parameter_order",
    "recording_pipeline",
    "whole_model_names",
    "whole_model_numbering",
]
