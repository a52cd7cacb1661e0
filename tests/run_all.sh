#!/usr/bin/env bash
# The whole test suite: serial tests, then the MPI tests at 2, 3 and 4 ranks.
# Exits non-zero if any of the four runs fails.  Extra arguments go to every pytest run.
set -u
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1
failed=()
echo "=== serial: python -m pytest"
python -m pytest -q -m "not mpi" "$@" || failed+=(serial)
for k in 2 3 4; do
  echo "=== mpi: mpirun -n $k python -m pytest --with-mpi"
  timeout 420 ./mpi_run.sh -n "$k" python -m pytest -q --with-mpi -m mpi "$@" || failed+=("mpi-$k")
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "FAILED runs: ${failed[*]}"
  exit 1
fi
echo "all runs passed: serial, mpi-2, mpi-3, mpi-4"
