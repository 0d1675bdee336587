"""Which torchtitan is installed, and which of stochround's two torchtitan APIs serves it.

torchtitan changed its extension points between releases: 0.2.2 swaps modules after the
model is built (``ModelConverter`` classes registered by name, a ``JobConfig`` read from
TOML), 0.3.0 converts a config tree before the build.  stochround implements both: the
0.2 API in `stochround.integrations.torchtitan.v0_2` (torch >= 2.10: torchtitan 0.2.2
imports ``torch.nn.attention.varlen``), the 0.3 API beside this module (torch 2.13: 0.3.0
imports ``torch.distributed.fsdp.DataParallelMeshDims``).  This module imports no
torchtitan, so the package picks its API before importing either.
"""

from __future__ import annotations

from importlib import metadata

# torchtitan release -> the API stochround uses with it
SUPPORTED: dict[str, str] = {"0.2.2": "0.2", "0.3.0": "0.3"}


def installed_torchtitan() -> str | None:
    """The installed torchtitan's version (None when it is not installed)."""
    try:
        return metadata.version("torchtitan")
    except metadata.PackageNotFoundError:
        return None


def titan_api(version: str | None) -> str:
    """The API (``"0.2"`` or ``"0.3"``) serving torchtitan ``version``; ImportError naming
    the installed version (or its absence) and the supported ones otherwise."""
    if version is None:
        raise ImportError(
            "stochround.integrations.torchtitan needs torchtitan: pip install "
            "'stochround[torchtitan]' (0.3.0, torch >= 2.13) or 'stochround[torchtitan-0.2]' "
            "(0.2.2, torch 2.10 to 2.12)"
        )
    if version not in SUPPORTED:
        raise ImportError(
            f"stochround.integrations.torchtitan supports torchtitan {', '.join(SUPPORTED)}; "
            f"torchtitan {version} is installed"
        )
    return SUPPORTED[version]


__all__ = ["SUPPORTED", "installed_torchtitan", "titan_api"]
