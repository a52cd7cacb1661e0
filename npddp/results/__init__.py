"""Benchmark dumps, read anywhere npddp is installed: one flat table per HDF5 file.

Layout (``schema_version`` 2)::

    /              attributes: format = "npddp-benchmark", kind, schema_version, world_size, the
                   run's environment (npddp.util.runinfo: MPI library, versions, host, CPU, threads,
                   time_utc, load_average, git_commit), argv, config (JSON) and config.<option>, and what the
                   producer adds (models, lr, ...)
    /table         attribute columns: the column names in order; one 1-D dataset per column, in
                   that order (h5py lists them so), each with attributes doc and unit; ints
                   int64, floats float64, strings variable-length UTF-8
    /raw/<name>    optional raw samples (e.g. every iteration's time), attributes doc and unit

Reading (pandas when installed; a dict of NumPy arrays otherwise; pandas is imported only then)::

    from npddp.results import read_table, read_meta
    df = read_table("ar.h5")    # DataFrame, columns in the declared order, text as str
    meta = read_meta("ar.h5")   # root attributes as plain Python values

The columns of every kind are declared in :mod:`npddp.results.columns`; checking and reading
are :mod:`npddp.results.reading`. The benchmarks write dumps with :mod:`benchmarks.results`.
"""

from npddp.results.columns import KINDS
from npddp.results.reading import (FORMAT, SCHEMA_VERSION, DumpError, check, describe, kind_of, read_meta, read_raw,
                                   read_table)

__all__ = ["FORMAT", "KINDS", "SCHEMA_VERSION", "DumpError", "check", "describe", "kind_of", "read_meta", "read_raw",
           "read_table"]
