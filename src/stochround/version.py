"""The package's version, in one place: pyproject.toml reads it, and the package and the
command line import it."""

__version__ = "0.1.0"
