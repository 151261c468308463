"""Builds the compiled modules (one a job: each .pyx says at its top what it beats); everything else is in pyproject.toml."""

from Cython.Build import cythonize
from setuptools import Extension, setup

setup(
    ext_modules=cythonize(
        # prediction: one module a job (the report's loops, the compressed gather, the aggregate's
        # columns, the scene catalog's); sums as numpy's: no fused multiply-adds; sqrt without
        # errno, so that its loops are vector loops: the same values
        [Extension("l5dask.prediction._report", ["l5dask/prediction/_report.pyx"], include_dirs=["l5dask/prediction"],
                   depends=["l5dask/prediction/_agents.h", "l5dask/prediction/_argmax.h"],
                   extra_compile_args=["-O3", "-ffp-contract=off", "-fno-math-errno"]),
         # (LZ4's symbols stay inside the module)
         Extension("l5dask.prediction._gather", ["l5dask/prediction/_gather.pyx", "l5dask/prediction/_vendor/lz4/lz4.c"],
                   include_dirs=["l5dask/prediction", "l5dask/prediction/_vendor/lz4"],
                   depends=["l5dask/prediction/_argmax.h", "l5dask/prediction/_blosc.h", "l5dask/prediction/_distinct.h", "l5dask/prediction/_vendor/lz4/lz4.h"],
                   define_macros=[("LZ4LIB_VISIBILITY", "")],
                   extra_compile_args=["-O3", "-ffp-contract=off", "-fno-math-errno", "-fvisibility=hidden"]),
         Extension("l5dask.prediction._columns", ["l5dask/prediction/_columns.pyx"],
                   extra_compile_args=["-O3", "-ffp-contract=off", "-fno-math-errno"]),
         Extension("l5dask.prediction._catalog", ["l5dask/prediction/_catalog.pyx"], include_dirs=["l5dask/prediction"],
                   depends=["l5dask/prediction/_agents.h", "l5dask/prediction/_distinct.h"],
                   extra_compile_args=["-O3", "-ffp-contract=off", "-fno-math-errno"]),
         # core: a local file's range read around the page cache, the GIL released (l5dask.core.diskread)
         Extension("l5dask.core._pread", ["l5dask/core/_pread.pyx"], extra_compile_args=["-O3"]),
         # core: the identities of a local folder's files (a listing and a stat each, without the GIL)
         Extension("l5dask.core._stat", ["l5dask/core/_stat.pyx"], extra_compile_args=["-O3"]),
         # perception: one module a job (token lookups and chains, lidar points in boxes, JSON scans,
         # detection's matching, box geometry's pairs)
         Extension("l5dask.perception._links", ["l5dask/perception/_links.pyx"], extra_compile_args=["-O3"]),
         Extension("l5dask.perception._lidar", ["l5dask/perception/_lidar.pyx"], extra_compile_args=["-O3"]),
         Extension("l5dask.perception._jsonscan", ["l5dask/perception/_jsonscan.pyx"], include_dirs=["l5dask/perception"],
                   depends=["l5dask/perception/_jsontypes.h"], extra_compile_args=["-O3"]),
         Extension("l5dask.perception._matching", ["l5dask/perception/_matching.pyx"], extra_compile_args=["-O3"]),
         Extension("l5dask.perception._geometry", ["l5dask/perception/_geometry.pyx"], extra_compile_args=["-O3"]),
         # evaluation: one module a job (the agents mask's pass, L5Kit's CSV rows, the metrics)
         Extension("l5dask.evaluation._mask", ["l5dask/evaluation/_mask.pyx"], depends=["l5dask/core/_records.pxd"],
                   extra_compile_args=["-O3"]),
         Extension("l5dask.evaluation._csvrows", ["l5dask/evaluation/_csvrows.pyx"], include_dirs=["l5dask/evaluation"],
                   depends=["l5dask/evaluation/_cnumber.h"], extra_compile_args=["-O3"]),
         Extension("l5dask.evaluation._metrics", ["l5dask/evaluation/_metrics.pyx"], extra_compile_args=["-O3"])],
        compiler_directives={"language_level": 3},
    )
)
