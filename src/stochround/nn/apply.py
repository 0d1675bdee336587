"""`quantize_`: replace a model's `nn.Linear` layers by `QuantizedLinear` in place.

Two conventions select the layers and their recipes: torchao's ``filter_fn(module, fqn)``
(True: quantize) and Qwix's rules by module path, ``rules=[(regex, recipe_or_None), ...]``,
where the first regex that matches the whole path (``re.fullmatch``) decides, None leaving
the layer as it is.  The recipe's own ``keep`` patterns leave their layers in high
precision as well.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from torch import nn

from .linear import QuantizedLinear
from .recipes import Recipe

Rule = tuple[str, Recipe | None]


def check_rules(rules: Sequence[Rule] | None) -> list[tuple[re.Pattern[str], Recipe | None]]:
    """The rules compiled (TypeError/ValueError naming a malformed one)."""
    if rules is None:
        return []
    compiled = []
    for rule in rules:
        if not isinstance(rule, tuple | list) or len(rule) != 2:
            raise TypeError(f"rules must hold (regex, recipe or None) pairs; got {rule!r}")
        pattern, recipe = rule
        if not isinstance(pattern, str):
            raise TypeError(f"a rule's regex must be a str; got {pattern!r}")
        if recipe is not None and not isinstance(recipe, Recipe):
            raise TypeError(
                f"a rule's recipe must be a Recipe or None; got {type(recipe).__name__}"
            )
        try:
            compiled.append((re.compile(pattern), recipe))
        except re.error as error:
            raise ValueError(f"rules: {pattern!r} is not a regular expression: {error}") from None
    return compiled


def choose_recipe(
    path: str,
    default: Recipe | None,
    rules: list[tuple[re.Pattern[str], Recipe | None]],
) -> Recipe | None:
    """The recipe of the layer at ``path``: the first rule whose regex matches the whole
    path, else ``default``; None if that is None or the recipe keeps the path."""
    recipe = default
    for pattern, ruled in rules:
        if pattern.fullmatch(path):
            recipe = ruled
            break
    if recipe is None or recipe.keeps(path):
        return None
    return recipe


def quantize_(
    model: nn.Module,
    recipe: Recipe | None = None,
    filter_fn: Callable[[nn.Module, str], bool] | None = None,
    *,
    rules: Sequence[Rule] | None = None,
) -> nn.Module:
    """Replace, in place, each `nn.Linear` of ``model`` by a `QuantizedLinear` sharing its
    parameters (`QuantizedLinear.from_linear`), under the recipe that ``rules`` or
    ``recipe`` give it.

    Args:
        model: the model; if it is an `nn.Linear` itself, the replacement is returned.
        recipe: the recipe of every layer no rule matches (None: such layers stay).
        filter_fn: torchao's filter, ``filter_fn(module, fqn) -> bool``; False leaves the
            layer as it is.
        rules: Qwix's rules, ``[(regex, recipe or None), ...]``: the first regex matching
            the layer's whole path (``re.fullmatch``) gives its recipe, None leaving it.

    The replaced layers are numbered 0, 1, ... in ``model.named_modules()`` order (their
    ``layer_index``, which gives each its own random streams).  Layers that are already
    `QuantizedLinear` are left alone.  Returns the model.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if recipe is not None and not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be a Recipe or None, got {type(recipe).__name__}")
    if filter_fn is not None and not callable(filter_fn):
        raise TypeError(f"filter_fn must be callable or None, got {type(filter_fn).__name__}")
    compiled = check_rules(rules)
    chosen: list[tuple[str, nn.Linear, Recipe]] = []
    for path, module in model.named_modules():
        if not isinstance(module, nn.Linear) or isinstance(module, QuantizedLinear):
            continue
        layer_recipe = choose_recipe(path, recipe, compiled)
        if layer_recipe is None or (filter_fn is not None and not filter_fn(module, path)):
            continue
        chosen.append((path, module, layer_recipe))
    # every replacement is built (and its blocks checked) before the first is swapped in,
    # so that a layer that does not fit its recipe leaves the model untouched
    replacements = [
        (path, QuantizedLinear.from_linear(module, layer_recipe, layer_index=index))
        for index, (path, module, layer_recipe) in enumerate(chosen)
    ]
    for path, replacement in replacements:
        if path == "":
            return replacement
        parent_path, _, name = path.rpartition(".")
        parent = model.get_submodule(parent_path)
        setattr(parent, name, replacement)
    return model


__all__ = ["Rule", "check_rules", "choose_recipe", "quantize_"]
