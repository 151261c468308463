"""l5dask's version, the one place: ``l5dask.__version__`` hands it on, the build reads it
(``pyproject.toml``), and the core's own users of it (the cache's keys) import it from here, below
the package that re-exports it."""

__version__ = "0.1.0"
