#!/usr/bin/env bash
# The whole test suite: serial tests, the DDP tests on one rank, then the MPI tests at 2, 3 and 4 ranks.
# Exits non-zero if any of the five runs fails.  Extra arguments go to every pytest run.
set -u
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1
failed=()
echo "=== serial: python -m pytest"
python -m pytest -q -m "not mpi" "$@" || failed+=(serial)
echo "=== mpi, one rank: DDP equivalence tests (those needing 2+ ranks run below)"
python -m pytest -q --with-mpi -m mpi tests/test_ddp.py -k "not overlap_starts and not mismatched" "$@" \
  || failed+=(mpi-1)
for k in 2 3 4; do
  echo "=== mpi: mpirun -n $k python -m pytest --with-mpi"
  timeout 420 ./mpi_run.sh -n "$k" python -m pytest -q --with-mpi -m mpi "$@" || failed+=("mpi-$k")
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "FAILED runs: ${failed[*]}"
  exit 1
fi
echo "all runs passed: serial, mpi-1 (DDP), mpi-2, mpi-3, mpi-4"
