"""``python -m stochround``: the ``stochround`` command (the same app, the same options)."""

from .cli import app

if __name__ == "__main__":  # run by ``python -m``; importing the module runs nothing
    app()
