"""A mutation fuzzer for l5dask's parsers of untrusted bytes (see ``python -m tests.fuzz --help``)."""
