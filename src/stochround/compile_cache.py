"""torch.compile's caches keyed by stochround's source: the package's fingerprint joined
to ``torch.compiler.config.cache_key_tag`` when the package is imported.

Why.  torch.compile's FX graph and AOT autograd caches (on disk, kept across processes)
key a compiled graph by its FX code, which names a custom op
(``torch.ops.stochround.quantized_linear``) but not its body, its fake, its schema or the
backward formula registered for it (pytorch/pytorch#144344, #160472).  A graph compiled
under one stochround and found again under another would run the old backward code
against the new ops: at best a RuntimeError naming the schema, at worst other bits
(docs/guide/recipes.md, "torch.compile").  The tag is part of both caches' keys, so a
changed source misses the cache once and compiles afresh, and an unchanged one hits it.

The fingerprint hashes every ``.py`` file of the package (their paths and contents): a
version number alone would not change between development checkouts.  A tag the user set
(``TORCH_COMPILE_CACHE_KEY_TAG`` or the config) is kept in front of it."""

from __future__ import annotations

import contextlib
import functools
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PACKAGE_ROOT = Path(__file__).resolve().parent
# what the package adds to the user's tag: recognized so a second call adds nothing
TAG_PREFIX = "stochround-"


@functools.lru_cache(maxsize=1)
def source_fingerprint(root: Path = PACKAGE_ROOT) -> str:
    """A hex digest of every ``.py`` file under ``root``: its path relative to ``root``
    and its bytes, in sorted order (16 hex digits: a cache key, not a signature)."""
    digest = hashlib.blake2b(digest_size=8)
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def tagged(user_tag: str, fingerprint: str) -> str:
    """``user_tag`` with the package's fingerprint joined to it (``+`` between them where
    the user's tag is not empty), replacing a fingerprint joined before."""
    kept = [part for part in user_tag.split("+") if part and not part.startswith(TAG_PREFIX)]
    return "+".join([*kept, TAG_PREFIX + fingerprint])


def compile_config() -> Any:
    """``torch.compiler.config``, or None where this torch has no ``cache_key_tag``."""
    try:
        from torch.compiler import config
    except ImportError:  # a torch before the setting
        return None
    return config if hasattr(config, "cache_key_tag") else None


def key_compile_caches() -> None:
    """Sets ``torch.compiler.config.cache_key_tag`` to the user's tag joined with the
    package's fingerprint (`tagged`); nothing where this torch has no such setting."""
    config = compile_config()
    if config is not None:
        config.cache_key_tag = tagged(config.cache_key_tag, source_fingerprint())


@contextlib.contextmanager
def caches_keyed_apart(suffix: str) -> Iterator[None]:
    """``suffix`` joined to ``cache_key_tag`` meanwhile, the tag restored after: graphs
    compiled meanwhile are neither found by nor find the others (a setting that changes
    what an op returns while the traced graph's code stays the same)."""
    config = compile_config()
    if config is None:
        yield
        return
    with config.patch(cache_key_tag=config.cache_key_tag + suffix):
        yield


__all__ = [
    "PACKAGE_ROOT",
    "TAG_PREFIX",
    "caches_keyed_apart",
    "compile_config",
    "key_compile_caches",
    "source_fingerprint",
    "tagged",
]
