"""The recipe of each linear of a torchtitan model: a recipe by name with its switches,
per-module rules, ``keep`` and a seed (both torchtitan APIs use these).

The layer at path ``p`` (its module path, as ``model.named_modules()`` writes it) takes the
first rule whose regex matches all of ``p`` (``re.fullmatch``), else the converter's
recipe; a rule's recipe None or ``bf16``, or a ``keep`` regex found in ``p``
(``re.search``), leaves the layer a bf16 linear: the rules of `stochround.nn.quantize_`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ...nn.apply import check_rules, choose_recipe
from ...nn.linear import QuantizedLinear
from ...nn.recipes import RECIPES, Recipe


def make_recipe(
    name: str, switches: dict[str, Any] | None = None, *, seed: int = 0, keep: tuple[str, ...] = ()
) -> Recipe:
    """The named recipe ``RECIPES[name](**switches, seed=seed, keep=keep)`` (``bf16``
    takes no switches and keeps nothing: it quantizes no layer).

    ValueError naming ``recipe`` and the allowed names for an unknown name; the recipe's
    own TypeError for an unknown switch.
    """
    if name not in RECIPES:
        raise ValueError(f"recipe must be one of {', '.join(RECIPES)}; got {name!r}")
    switches = dict(switches or {})
    if name == "bf16":
        if switches:
            raise ValueError(f"recipe 'bf16' takes no switches; got {sorted(switches)}")
        return RECIPES[name](seed=seed)
    named: Callable[..., Recipe] = RECIPES[name]
    return named(**switches, seed=seed, keep=tuple(keep))


class RecipeChoice:
    """A default recipe and rules, as a converter's config names them.

    ``recipe`` is the default recipe (None for ``bf16``: no layer), ``pairs`` the rules as
    `stochround.nn.quantize_` takes them (a rule's ``bf16`` or None: None), and
    `recipe_of` a layer's path its recipe, or None for a layer left in bf16.
    """

    def __init__(
        self,
        recipe: str,
        switches: dict[str, Any] | None = None,
        *,
        rules: Sequence[tuple[str, str | None]] = (),
        keep: Sequence[str] = (),
        seed: int = 0,
    ) -> None:
        kept = tuple(keep)
        default = make_recipe(recipe, switches, seed=seed, keep=kept)
        self.recipe: Recipe | None = None if default.name == "bf16" else default
        self.pairs: list[tuple[str, Recipe | None]] = []
        for pattern, name in rules:
            ruled = None if name in (None, "bf16") else make_recipe(name, seed=seed, keep=kept)
            self.pairs.append((pattern, ruled))
        self.rules = check_rules(self.pairs)

    def recipe_of(self, path: str) -> Recipe | None:
        """The recipe of the layer at ``path`` (None: bf16)."""
        return choose_recipe(path, self.recipe, self.rules)


def check_fits(
    path: str, in_features: int, out_features: int, recipe: Recipe, layer_index: int
) -> None:
    """ValueError, naming ``path``, if the layer's weight does not fit its recipe's blocks
    (checked on the meta device, before any weight is made)."""
    try:
        QuantizedLinear(
            in_features,
            out_features,
            bias=False,
            device="meta",
            recipe=recipe,
            layer_index=layer_index,
        )
    except ValueError as error:
        raise ValueError(f"{path}: {error}; leave it in bf16 with a rule or keep") from None


__all__ = ["RecipeChoice", "check_fits", "make_recipe"]
