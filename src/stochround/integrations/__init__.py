"""stochround inside other frameworks' trainers.

`stochround.integrations.torchtitan` (``pip install stochround[torchtitan]``) makes the
recipes and the SR optimizers torchtitan components: a model converter, an optimizers
container and an offline dataset of the Python standard library's source.  Importing this
package imports no framework; each subpackage imports its framework when it is imported
and raises ImportError naming the extra to install when it is missing.
"""

from __future__ import annotations

__all__: list[str] = []
