"""``python -m stochround.cli``: the ``stochround`` command."""

from . import app

app()
