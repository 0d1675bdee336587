"""Which torchtitan a test module's API targets (each stochround torchtitan API has its own
test module; an environment holds one release)."""

from __future__ import annotations

from importlib import metadata


def torchtitan_mismatch(version: str, extra: str) -> str | None:
    """None if torchtitan ``version`` is installed, else the reason to skip the module (the
    installed release, or none, and ``extra``: the stochround extra installing ``version``)."""
    try:
        installed = metadata.version("torchtitan")
    except metadata.PackageNotFoundError:
        return f"torchtitan is not installed (pip install 'stochround[{extra}]')"
    if installed != version:
        return (
            f"tests torchtitan {version}'s API; torchtitan {installed} is installed "
            f"(pip install 'stochround[{extra}]' in an environment of its own)"
        )
    return None
