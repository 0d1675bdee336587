"""No module under src is longer than `MAX_LINES` unless one idea needs the length: the
exceptions are listed with their reason, and an exception that no longer needs its place
fails too, so the list stays true."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "stochround"

# a reader holds one file of this length in mind; past it a module has usually grown a
# second concern
MAX_LINES = 600

# module (relative to src/stochround) -> why one idea needs more
EXCEPTIONS = {
    "kernels/matmul.py": (
        "the SR matmul kernel family: the recursive, blocked and compensated reductions share "
        "their tile loads and word draws, and the host launch is their one caller"
    ),
    "kernels/optim.py": (
        "the fused optimizer step kernel: AdamW, SGD and Lion share one kernel body, its "
        "state encodings and the launch that batches a group's parameters"
    ),
}


def line_counts() -> dict[str, int]:
    return {
        str(path.relative_to(PACKAGE)): len(path.read_text().splitlines())
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def test_no_module_exceeds_the_limit_without_a_stated_reason() -> None:
    long = {name: count for name, count in line_counts().items() if count > MAX_LINES}
    assert sorted(set(long) - set(EXCEPTIONS)) == [], long


def test_every_exception_still_needs_its_place() -> None:
    counts = line_counts()
    assert [name for name in EXCEPTIONS if counts.get(name, 0) <= MAX_LINES] == []
