"""stochround: stochastic rounding and low-precision number formats on PyTorch."""

from . import arith as ops
from . import blocks, hardware, nn, optim
from .compile_cache import key_compile_caches

# the functions take the subpackage's name: `sr.emulate` is the dispatch mode's entry
# point (import stochround.emulate.mode for the module), and `sr.emulate_backend` its
# torch.compile backend (`stochround.emulate.backend`)
from .emulate import emulate, mca
from .emulate.compiled import backend as emulate_backend
from .formats import FORMATS, Format, format  # noqa: A004 - the public API names
from .packing import pack, unpack
from .random import Stream
from .reference import MODES, SATURATIONS, VARIANTS
from .rounding import cast, decode, encode, round  # noqa: A004
from .version import __version__ as __version__  # re-exported: the package's version

# before any op is compiled: torch.compile's on-disk caches keyed by this source
# (`stochround.compile_cache`: a graph compiled under other ops is not found again)
key_compile_caches()

__all__ = [
    "FORMATS",
    "MODES",
    "SATURATIONS",
    "VARIANTS",
    "Format",
    "Stream",
    "blocks",
    "cast",
    "decode",
    "emulate",
    "emulate_backend",
    "encode",
    "format",
    "hardware",
    "mca",
    "nn",
    "ops",
    "optim",
    "pack",
    "round",
    "unpack",
]
