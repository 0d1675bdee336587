"""`quantize_`: replace a model's `nn.Linear` layers by `QuantizedLinear` in place;
`unquantize_`: the way back, from `quantize_` and `stochround.nn.gaussws_`.

Two conventions select the layers and their recipes: torchao's ``filter_fn(module, fqn)``
(True: quantize) and Qwix's rules by module path, ``rules=[(regex, recipe_or_None), ...]``,
where the first regex that matches the whole path (``re.fullmatch``) decides, None leaving
the layer as it is.  The recipe's own ``keep`` patterns leave their layers in high
precision as well.

Two kinds of layer are never swapped:

* a layer whose parent reads its weight directly instead of calling it (torch's
  ``NonDynamicallyQuantizableLinear``, the ``out_proj`` of ``nn.MultiheadAttention``,
  which ``F.multi_head_attention_forward`` multiplies by ``out_proj.weight``): swapped, it
  would print as quantized and never run quantized.  It is left as it is, whatever the
  filter or rules say, and logged (logger ``stochround.nn.apply``), as torchao's default
  filter skips it;
* a layer whose weight is parametrized (`stochround.nn.gaussws_` or another
  ``torch.nn.utils.parametrize`` parametrization): `quantize_` raises ValueError, as the
  swap would drop the parametrization; quantize first, then sample (`gaussws_`
  parametrizes `QuantizedLinear` layers too).
"""

from __future__ import annotations

import logging
import re
import typing
from collections.abc import Callable, Sequence

from torch import nn
from torch.nn.modules.linear import NonDynamicallyQuantizableLinear
from torch.nn.utils import parametrize

from .gaussws import GaussWS, sampling_of
from .linear import QuantizedLinear, next_layer_index
from .recipes import Recipe
from .streams import check_data_parallel_rank

Rule = tuple[str, Recipe | None]

LOGGER = logging.getLogger(__name__)

# layers whose parents multiply by their weight without calling them (torch's own marker
# class, which torchao's default filter skips for the same reason)
WEIGHT_ONLY_LINEARS: tuple[type[nn.Linear], ...] = (NonDynamicallyQuantizableLinear,)


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
    data_parallel_rank: int = 0,
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
        data_parallel_rank: this process's rank among those that hold other tokens (DDP,
            FSDP2 and context-parallel ranks; e.g. ``torch.distributed.get_rank()`` under
            plain DDP or FSDP2), in [0, 2**32): the words of the layers' x and dy are keyed
            by it, so that the ranks' rounding errors on their own data are independent,
            while every rank quantizes the (all-gathered) weight with the same words.  0
            by default: every rank draws rank 0's words (`stochround.nn.streams`).

    The replaced layers are numbered 0, 1, ... in ``model.named_modules()`` order (their
    ``layer_index``, which gives each its own random streams), after those an earlier
    call numbered.  Layers that are already
    `QuantizedLinear` are left alone, and so are layers whose parent uses their weight
    without calling them (`WEIGHT_ONLY_LINEARS`: the ``out_proj`` of
    ``nn.MultiheadAttention``), which would never run quantized: their paths are logged
    at INFO level (logger ``stochround.nn.apply``).  A layer whose weight is parametrized
    (`stochround.nn.gaussws_`) raises ValueError: call `quantize_` first.  Returns the
    model.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if recipe is not None and not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be a Recipe or None, got {type(recipe).__name__}")
    if filter_fn is not None and not callable(filter_fn):
        raise TypeError(f"filter_fn must be callable or None, got {type(filter_fn).__name__}")
    compiled = check_rules(rules)
    check_data_parallel_rank(data_parallel_rank)
    chosen: list[tuple[str, nn.Linear, Recipe]] = []
    weight_only = []
    for path, module in model.named_modules():
        if not isinstance(module, nn.Linear) or isinstance(module, QuantizedLinear):
            continue
        if isinstance(module, WEIGHT_ONLY_LINEARS):
            weight_only.append(path)
            continue
        layer_recipe = choose_recipe(path, recipe, compiled)
        if layer_recipe is None or (filter_fn is not None and not filter_fn(module, path)):
            continue
        chosen.append((path, module, layer_recipe))
    if weight_only:
        LOGGER.info(
            "quantize_ left %d layer(s) whose parent uses their weight without calling "
            "them (they would never run quantized): %s",
            len(weight_only),
            ", ".join(weight_only),
        )
    # every replacement is built (and its blocks checked) before the first is swapped in,
    # so that a layer that does not fit its recipe leaves the model untouched
    # numbered after the layers an earlier call replaced, whose streams they must not share
    first = next_layer_index(model, QuantizedLinear)
    replacements: list[tuple[str, nn.Module]] = []
    for index, (path, module, layer_recipe) in enumerate(chosen, start=first):
        try:
            replacement = QuantizedLinear.from_linear(
                module, layer_recipe, layer_index=index, data_parallel_rank=data_parallel_rank
            )
        except ValueError as error:
            raise ValueError(f"{path or 'model'}: {error}") from None
        replacements.append((path, replacement))
    return swapped(model, replacements)


def swapped(model: nn.Module, replacements: list[tuple[str, nn.Module]]) -> nn.Module:
    """``model`` with each submodule at a path replaced in place by its replacement; the
    replacement itself where the path is "" (the model)."""
    for path, replacement in replacements:
        if path == "":
            return replacement
        parent_path, _, name = path.rpartition(".")
        setattr(model.get_submodule(parent_path), name, replacement)
    return model


def remove_sampling(module: nn.Module) -> None:
    """``module``'s weight without its `GaussWS` parametrization: the original Parameter
    object back in place (other parametrizations stay)."""
    parametrizations = typing.cast(nn.ModuleList, module.parametrizations["weight"])  # type: ignore[index]
    if len(parametrizations) == 1:
        parametrize.remove_parametrizations(module, "weight", leave_parametrized=False)
        return
    for index, each in enumerate(parametrizations):
        if isinstance(each, GaussWS):
            del parametrizations[index]
            return


def plain_linear(layer: QuantizedLinear) -> nn.Linear:
    """An `nn.Linear` holding ``layer``'s weight and bias (the same Parameter objects, so
    their dtype, device and optimizer state stay) in its training mode, hooks dropped."""
    if parametrize.is_parametrized(layer, "weight"):
        raise ValueError(
            "unquantize_: a QuantizedLinear whose weight has a parametrization other than "
            "GaussWS cannot become an nn.Linear; remove it first "
            "(torch.nn.utils.parametrize.remove_parametrizations)"
        )
    plain = nn.Linear(layer.in_features, layer.out_features, bias=False, device="meta")
    plain.weight = layer.weight
    plain.bias = layer.bias
    plain.train(layer.training)
    return plain


def unquantize_(model: nn.Module) -> nn.Module:
    """Undo `quantize_` and `stochround.nn.gaussws_` in place: each `GaussWS`
    parametrization is removed (the weight is the original Parameter again, not a sample)
    and each `QuantizedLinear` replaced by an `nn.Linear` holding the same Parameter
    objects.  The step counters go with them, so the model's ``state_dict`` is a plain
    model's, which ``plain.load_state_dict(...)`` loads strictly.  ``model``: an
    `nn.Module`; if it is a `QuantizedLinear` itself, the replacement is returned.
    Returns the model."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    for _, module in list(model.named_modules()):
        if sampling_of(module) is not None:
            remove_sampling(module)
    swaps: list[tuple[str, nn.Module]] = [
        (path, plain_linear(module))
        for path, module in model.named_modules()
        if isinstance(module, QuantizedLinear)
    ]
    return swapped(model, swaps)


__all__ = [
    "WEIGHT_ONLY_LINEARS",
    "Rule",
    "check_rules",
    "choose_recipe",
    "plain_linear",
    "quantize_",
    "remove_sampling",
    "unquantize_",
]
