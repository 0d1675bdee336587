"""torch.compile's on-disk caches keyed by stochround's source (`stochround.compile_cache`):
importing the package joins its source fingerprint to ``cache_key_tag``; the fingerprint
follows every file's path and bytes; a user's tag is kept; and a graph compiled under one
fingerprint is not found under another, where torch's caches would otherwise run an op's
old backward formula (pytorch/pytorch#144344)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import stochround
from stochround import compile_cache
from stochround.kernels import availability


@pytest.mark.skipif(not availability.INTERPRETED, reason="cpu_as_cuda needs the interpreter")
def test_the_cpu_as_cuda_route_keys_the_compile_caches_apart() -> None:
    """Under `cpu_as_cuda` a layer's opaque ops return what a CUDA step keeps, from the
    same graph code and CPU inputs as outside it: its graphs take a tag of their own (a
    graph compiled under the route and found again outside it had run with the route's
    output layouts: tests/nn/test_checkpointing.py's cpu case after its cuda_route case),
    and the tag is restored after it."""
    tag = torch.compiler.config.cache_key_tag
    with availability.cpu_as_cuda():
        assert torch.compiler.config.cache_key_tag == tag + availability.ROUTE_CACHE_TAG
    assert torch.compiler.config.cache_key_tag == tag


def test_importing_stochround_tags_the_compile_caches_with_its_source() -> None:
    """The tag ends with the package's fingerprint, and setting it again adds nothing."""
    assert stochround.__version__  # the package imported, which set the tag
    tag = torch.compiler.config.cache_key_tag
    assert tag.split("+")[-1] == compile_cache.TAG_PREFIX + compile_cache.source_fingerprint()
    compile_cache.key_compile_caches()
    assert torch.compiler.config.cache_key_tag == tag


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        ("", "stochround-ab"),
        ("mine", "mine+stochround-ab"),
        ("mine+stochround-00", "mine+stochround-ab"),
        ("stochround-00", "stochround-ab"),
        ("a+b", "a+b+stochround-ab"),
    ],
)
def test_a_users_tag_is_kept_and_a_former_fingerprint_replaced(user: str, expected: str) -> None:
    assert compile_cache.tagged(user, "ab") == expected


def test_the_fingerprint_follows_each_files_path_and_bytes(tmp_path: Path) -> None:
    """Same files, same digest; a changed byte, a renamed file or a new file, another;
    files that are not Python are not read."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")

    def digest() -> str:
        compile_cache.source_fingerprint.cache_clear()
        return compile_cache.source_fingerprint(tmp_path)

    first = digest()
    assert digest() == first and len(first) == 16
    (tmp_path / "notes.txt").write_text("not source")
    assert digest() == first
    (tmp_path / "a.py").write_text("x = 2\n")
    changed = digest()
    assert changed != first
    (tmp_path / "a.py").rename(tmp_path / "c.py")
    assert digest() not in (first, changed)
    (tmp_path / "a.py").write_text("x = 2\n")
    assert len({first, changed, digest()}) == 3
    compile_cache.source_fingerprint.cache_clear()


# a custom op whose registered backward scales the gradient by SCALE, compiled and
# differentiated under the cache directory of the environment; ``fingerprint`` stands for
# another stochround source (what `key_compile_caches` would join after a change)
_PROGRAM = """
import sys
import torch
import stochround
from stochround import compile_cache

scale, fingerprint = float(sys.argv[1]), sys.argv[2]
if fingerprint:
    config = torch.compiler.config
    config.cache_key_tag = compile_cache.tagged(config.cache_key_tag, fingerprint)

@torch.library.custom_op("srtest::scaled", mutates_args=())
def scaled(x: torch.Tensor) -> torch.Tensor:
    return x.clone()

@scaled.register_fake
def _(x):
    return torch.empty_like(x)

scaled.register_autograd(lambda ctx, grad: grad * scale)
x = torch.ones(4, requires_grad=True)
torch.compile(lambda t: torch.ops.srtest.scaled(t) * 3.0)(x).sum().backward()
print(float(x.grad[0]))
"""


def compiled_gradient(scale: float, fingerprint: str, cache: Path) -> float:
    """The gradient the compiled program gives in a fresh process sharing ``cache``."""
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(cache),
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
    }
    program = textwrap.dedent(_PROGRAM)
    result = subprocess.run(
        [sys.executable, "-c", program, str(scale), fingerprint],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return float(result.stdout.strip().splitlines()[-1])


def test_a_graph_compiled_under_another_source_is_not_found_again(tmp_path: Path) -> None:
    """The first process compiles with the op's backward scaling by 1 and fills the cache;
    the second, whose op scales by 2 under another stochround fingerprint, compiles afresh
    and differentiates by its own formula (3 * 2), not the cached one (3 * 1)."""
    assert compiled_gradient(1.0, "", tmp_path) == 3.0
    assert compiled_gradient(2.0, "0" * 16, tmp_path) == 6.0
