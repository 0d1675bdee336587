"""``python -m stochround.cli``: the ``stochround`` command."""

from . import app

if __name__ == "__main__":  # run by ``python -m``; importing the module runs nothing
    app()
