"""Every Python example in README.md and docs/ runs as written.

Each page's ```python blocks run in order in one namespace (a page's later examples may
use what its earlier ones defined), with the working directory a fresh temporary folder,
so that examples that write files leave nothing behind.  Shell blocks (```bash) are not
run, and neither is a block after a ``<!-- skip: next -->`` comment.  Sybil parses the
pages; README.md sits outside ``testpaths``, so the pages are collected here rather than by
Sybil's pytest plugin.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PAGES_WITH_EXAMPLES = [page for page in PAGES if "```python" in page.read_text("utf-8")]
PARSER = Sybil(parsers=[PythonCodeBlockParser(), SkipParser()], path=str(ROOT))


def test_the_readme_and_every_guide_page_have_examples() -> None:
    """A guard against collecting nothing: the README and each user-guide page teach by
    example, so each has Python examples for the test below to run."""
    guide = sorted((ROOT / "docs" / "guide").glob("*.md"))
    assert guide
    missing = [
        page.name for page in [ROOT / "README.md", *guide] if page not in PAGES_WITH_EXAMPLES
    ]
    assert not missing, f"pages without a python example: {missing}"


@pytest.mark.parametrize(
    "page", PAGES_WITH_EXAMPLES, ids=lambda page: page.relative_to(ROOT).as_posix()
)
def test_every_python_example_on_the_page_runs(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    document = PARSER.parse(page)
    examples = list(document)
    assert examples, f"{page.name} has a python block that Sybil did not parse"
    for example in examples:
        try:
            example.evaluate()
        except Exception as error:
            where = f"{page.relative_to(ROOT).as_posix()}, line {example.line}"
            raise AssertionError(f"the example at {where} failed: {error!r}") from error
