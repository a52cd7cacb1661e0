"""The job's processes: the launcher, exit codes and abort on failure, BLAS threads, leftover shared-memory cleanup."""
