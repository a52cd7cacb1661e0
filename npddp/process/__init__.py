"""The job's processes: the launcher, exit codes and abort on failure, leftover shared-memory cleanup.

What one process knows of itself (its rank and launcher, its cores and BLAS threads, the guard that ends
the job when it fails) is below comm, in :mod:`npddp.util` (env, threads, guard), so comm may use it.
"""
